"""`python -m toolyard.verify`: does each manifest still match its function?

`toolyard check DIR` runs this in the tools' folder. It reads a JSON list on stdin, one
entry per tool: `{"tool", "target" ("module:function"), "inputSchema", "outputSchema"}`.
For each it imports the function and generates its schemas from the type hints and
docstring, as `python -m toolyard.manifest` does. It writes one JSON list to stdout:
`{"tool", "status", "detail"}`, where status is:

- "pass": the schemas match;
- "warn": only descriptions differ (the docstrings changed; regenerate the manifests);
- "fail": the function cannot be imported or described, or its parameters or result
  differ from the schema.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any

from .manifest import ManifestError, Options, tool_document


def _without_descriptions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_descriptions(v) for k, v in schema.items() if k not in ("description", "title")}
    if isinstance(schema, list):
        return [_without_descriptions(v) for v in schema]
    return schema


def _differences(label: str, declared: Any, generated: Any) -> list[str]:
    """What differs between two schemas, property by property where both are objects."""
    if declared == generated:
        return []
    if declared is None or generated is None:
        has = "declares" if declared is not None else "does not declare"
        return [f"the manifest {has} an {label} but the function's return annotation says otherwise"]
    out: list[str] = []
    d_props = declared.get("properties", {}) if isinstance(declared, dict) else {}
    g_props = generated.get("properties", {}) if isinstance(generated, dict) else {}
    for name in sorted(set(g_props) - set(d_props)):
        out.append(f"{label}: the function has '{name}', the manifest does not")
    for name in sorted(set(d_props) - set(g_props)):
        out.append(f"{label}: the manifest has '{name}', the function does not")
    for name in sorted(set(d_props) & set(g_props)):
        if d_props[name] != g_props[name]:
            out.append(f"{label}: '{name}' is {json.dumps(d_props[name])} in the manifest, "
                       f"{json.dumps(g_props[name])} from the function")
    if isinstance(declared, dict) and isinstance(generated, dict):
        d_req, g_req = sorted(declared.get("required", [])), sorted(generated.get("required", []))
        if d_req != g_req:
            out.append(f"{label}: required is {d_req} in the manifest, {g_req} from the function")
    return out or [f"{label} differs from the function's"]


def verify(entry: dict[str, Any]) -> dict[str, str]:
    tool, target = entry["tool"], entry["target"]
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # manifest warnings are not check results
            doc = tool_document(target, Options(image="-"))
    except ManifestError as e:
        return {"tool": tool, "status": "fail", "detail": str(e)}
    except BaseException as e:  # an import that raises anything, even SystemExit
        return {"tool": tool, "status": "fail", "detail": f"{target}: importing it raised {type(e).__name__}: {e}"}
    spec = doc["spec"]
    generated = {"inputSchema": spec["inputSchema"], "outputSchema": spec.get("outputSchema")}
    declared = {"inputSchema": entry.get("inputSchema"), "outputSchema": entry.get("outputSchema")}
    problems: list[str] = []
    for label in ("inputSchema", "outputSchema"):
        problems += _differences(label, _without_descriptions(declared[label]), _without_descriptions(generated[label]))
    if problems:
        return {"tool": tool, "status": "fail", "detail": "; ".join(problems)}
    if declared != generated:
        return {"tool": tool, "status": "warn", "detail": f"{target}: descriptions differ from the docstrings"}
    return {"tool": tool, "status": "pass", "detail": f"{target} matches its schemas"}


def main() -> int:
    entries = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):  # an import that prints must not corrupt the answer
        results = [verify(e) for e in entries]
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
