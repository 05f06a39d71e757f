"""Example pricing library exposed as Toolyard tools: Black-Scholes prices and Greeks, CSV quotes."""
