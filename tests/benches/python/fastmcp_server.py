"""The comparison server of the gateway benchmark: the official Python SDK's MCPServer
(FastMCP) serving a function of the same shape as the benchmark's gateway tool, over
stateless Streamable HTTP with JSON responses (the gateway's own mode).

Usage: fastmcp_server.py PORT [TOOLS]

With TOOLS, it serves that many more tools, `tool_00000` and on, each taking a number `x` and
an optional `label` (the catalog bench's tools).

The server exits when its standard input closes: the bench holds the other end, so the server
ends with the bench however the bench ends.
"""

import os
import sys
import threading

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench", log_level="WARNING")


@server.tool()
def price_option(x: float) -> dict:
    """Echo the argument back at once (the same shape as the gateway benchmark's tool)."""
    return {"echo": {"x": x}}


def add_catalog_tools(count: int) -> None:
    for k in range(count):

        def echo(x: float, label: str = "") -> dict:
            return {"echo": {"x": x, "label": label}}

        server.add_tool(
            echo,
            name=f"tool_{k:05}",
            description=f"Catalog tool {k}: echoes its arguments (the catalog benchmark's tools).",
        )


def exit_when_stdin_closes() -> None:
    sys.stdin.buffer.read()
    os._exit(0)


if __name__ == "__main__":
    threading.Thread(target=exit_when_stdin_closes, daemon=True).start()
    if len(sys.argv) > 2:
        add_catalog_tools(int(sys.argv[2]))
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]), json_response=True, stateless_http=True)
