//! The MCP server: tools/list, tools/call, built-in tools, resources.
