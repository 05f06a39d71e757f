"""Toolyard's Python side: run functions as MCP tools and describe them as McpTool manifests.

- `python -m toolyard.run module:function` runs one function under the runner protocol.
- `python -m toolyard.manifest module:function ... --image IMAGE` writes McpTool YAML
  from the functions' type hints and docstrings.
- `toolyard.progress(fraction, message)`, called by a running function, tells the caller how
  far it is.
- `toolyard.caller()` says who called, for tools whose McpTool has `callerIdentity: true`.
- `toolyard.image(png_bytes)` and `toolyard.file(name, data, mime_type)` return images and
  files with the call's result.
"""

from ._caller import Caller, caller
from ._outputs import file, image
from ._progress import progress

__all__ = ["Caller", "caller", "file", "image", "progress"]
__version__ = "0.1.0"
