"""The comparison server of the gateway benchmark: the official Python SDK's MCPServer
(FastMCP) serving a function of the same shape as the benchmark's gateway tool, over
stateless Streamable HTTP with JSON responses (the gateway's own mode).

Usage: fastmcp_server.py PORT
"""

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench", log_level="WARNING")


@server.tool()
def price_option(x: float) -> dict:
    """Echo the argument back at once (the same shape as the gateway benchmark's tool)."""
    return {"echo": {"x": x}}


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]), json_response=True, stateless_http=True)
