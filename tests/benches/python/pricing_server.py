"""The comparison server of the local-mode benchmark: the official Python SDK's MCPServer
(FastMCP) calling the pricing example's `price_option` in-process, over stateless Streamable
HTTP with JSON responses (what the benchmark's client speaks to both servers).

Usage: PYTHONPATH=examples/pricing pricing_server.py PORT [HOST]   (HOST: 127.0.0.1 unless given;
the node_pool bench's pod gives 0.0.0.0)
"""

import sys
from typing import Literal

from mcp.server.mcpserver import MCPServer
from pricing import options

server = MCPServer("pricing-bench", log_level="WARNING")


@server.tool()
def price_option(
    spot: float,
    strike: float,
    time_to_expiry: float,
    volatility: float,
    rate: float,
    dividend_yield: float = 0.0,
    option_type: Literal["call", "put"] = "call",
) -> dict:
    """Price a European option (Black-Scholes-Merton), the same function the Toolyard tool runs."""
    result = options.price_option(spot, strike, time_to_expiry, volatility, rate, dividend_yield, option_type)
    return {"price": result.price, "option_type": result.option_type}


if __name__ == "__main__":
    host = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
    server.run("streamable-http", host=host, port=int(sys.argv[1]), json_response=True, stateless_http=True)
