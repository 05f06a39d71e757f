"""Market risk of a small portfolio: historical VaR, stress scenarios and a P&L chart.

A portfolio is a mapping of risk factor to position (its market value, in USD). The factors
and their daily returns come from `returns.csv` (two years of illustrative data, not market
data); the stress scenarios from `scenarios.csv`.
"""
