"""Toolyard's Python side: run functions as MCP tools and describe them as McpTool manifests.

- `python -m toolyard.run module:function` runs one function under the runner protocol.
- `python -m toolyard.manifest module:function ... --image IMAGE` writes McpTool YAML
  from the functions' type hints and docstrings.
"""

__version__ = "0.1.0"
