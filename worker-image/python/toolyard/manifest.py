"""`python -m toolyard.manifest`: McpTool manifests from functions' type hints and docstrings.

    python -m toolyard.manifest pricing.options:price_option pricing.options:calc_greeks \\
        --image ghcr.io/toolyard/pricing:0.1.0 --toolset pricing --read-only --timeout 30

"Register once": the signature gives the input schema, the return annotation the
output schema, the docstring the descriptions (Google `Args:` or Sphinx `:param x:`).
The output is deterministic so committed manifests can be checked for drift.
Errors go to stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from dataclasses import dataclass
from typing import Any

from . import _docstring, _yaml
from ._types import (
    EMPTY,
    AnyType,
    FunctionSpec,
    InvocationError,
    UnsupportedType,
    inspect_function,
    load_function,
    object_schema,
    parse_type,
    type_name,
)

API_VERSION = "toolyard.dev/v1alpha1"
MAX_DESCRIPTION = 4096
_TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ManifestError(Exception):
    """A function cannot be described as an McpTool."""


@dataclass(frozen=True)
class Options:
    """Everything the manifest needs besides the function itself."""

    image: str
    namespace: str | None = None
    toolset: str | None = None
    mode: str = "Job"
    reuse: bool = False
    replicas: int = 1
    queue: int | None = None  # Pool only: waiting calls per pod (default: 8 per slot)
    timeout: int = 60
    read_only: bool = False
    caller_identity: bool = False
    name: str | None = None  # tool name override, for a single function


def _warn(message: str) -> None:
    print(f"toolyard.manifest: warning: {message}", file=sys.stderr)


def humanise(name: str) -> str:
    """`price_option` -> `Price option`."""
    words = " ".join(name.replace("_", " ").split())
    return words[:1].upper() + words[1:]


def output_schema(spec: FunctionSpec, returns_doc: str | None) -> dict[str, Any] | None:
    """The outputSchema: object results as they are, anything else wrapped as `{"result": ...}`.

    The gateway wraps a non-object result value `v` as `{"result": v}` at run time, so a
    return type that may or may not be an object has no single schema and gets none.
    """
    if spec.return_annotation is EMPTY:
        return None
    try:
        result = parse_type(spec.return_annotation)
    except UnsupportedType as e:
        raise ManifestError(f"function '{spec.name}': return type: {e}") from None
    if isinstance(result, AnyType):
        return None
    if result.kinds == {"object"}:
        schema = result.schema()
        head = {"description": returns_doc} if returns_doc else {}
        return {**head, "type": "object", **schema} if schema.get("type") != "object" else {**head, **schema}
    if "object" in result.kinds:
        _warn(f"function '{spec.name}': return type {type_name(spec.return_annotation)} may or may not "
              "be an object; outputSchema omitted")
        return None
    inner = {"description": returns_doc} if returns_doc else {}
    inner.update(result.schema())
    return {"type": "object", "properties": {"result": inner}, "required": ["result"]}


def tool_document(target: str, options: Options) -> dict[str, Any]:
    """The McpTool document for one `module:function`."""
    with contextlib.redirect_stdout(sys.stderr):  # an import that prints must not corrupt the YAML
        try:
            spec = inspect_function(load_function(target))
        except (InvocationError, UnsupportedType) as e:
            raise ManifestError(f"{target}: {e}") from None
    name = options.name or spec.name
    if not _TOOL_NAME.match(name):
        raise ManifestError(f"{target}: tool name {name!r} must match {_TOOL_NAME.pattern}")
    k8s_name = name.replace("_", "-").lower()
    if not _K8S_NAME.match(k8s_name):
        raise ManifestError(f"{target}: {k8s_name!r} (from {name!r}) is not a valid Kubernetes name: "
                            "it must start and end with a letter or digit")

    docs = _docstring.parse(spec.func.__doc__)
    for documented in sorted(set(docs.params) - {p.name for p in spec.params}):
        _warn(f"{target}: docstring documents '{documented}', which is not a parameter")
    description = docs.description
    if not description:
        _warn(f"{target}: no docstring; the description falls back to the title")
        description = humanise(name)
    if len(description) > MAX_DESCRIPTION:
        _warn(f"{target}: description cut to {MAX_DESCRIPTION} characters")
        description = description[: MAX_DESCRIPTION - 3] + "..."
    params = [p.replace(description=docs.params.get(p.name)) for p in spec.params]

    metadata: dict[str, Any] = {"name": k8s_name}
    if options.namespace:
        metadata["namespace"] = options.namespace
    tool: dict[str, Any] = {"name": name, "title": humanise(name), "description": description}
    if options.toolset:
        tool["toolset"] = options.toolset
    tool["inputSchema"] = object_schema(params)
    if (schema := output_schema(spec, docs.returns)) is not None:
        tool["outputSchema"] = schema
    hints = {"readOnlyHint": True, "idempotentHint": True, "destructiveHint": False} if options.read_only else {}
    tool["annotations"] = {**hints, "openWorldHint": False}
    tool["runtime"] = {"image": options.image, "command": ["python3", "-m", "toolyard.run", target]}
    execution: dict[str, Any] = {"mode": options.mode, "timeoutSeconds": options.timeout}
    if options.mode == "Pool":
        execution["pool"] = {"replicas": options.replicas, "reuseProcess": options.reuse}
        if options.queue is not None:
            execution["pool"]["queue"] = options.queue
    tool["execution"] = execution
    if options.caller_identity:
        tool["callerIdentity"] = True
    return {"apiVersion": API_VERSION, "kind": "McpTool", "metadata": metadata, "spec": tool}


def generate(targets: list[str], options: Options) -> str:
    """The YAML stream for several functions; tool names must be unique."""
    if options.name and len(targets) != 1:
        raise ManifestError("--name can only be used with a single function")
    documents = [tool_document(t, options) for t in targets]
    seen: dict[str, str] = {}
    for target, doc in zip(targets, documents):
        name = doc["metadata"]["name"]
        if name in seen:
            raise ManifestError(f"{target} and {seen[name]} both become McpTool '{name}'")
        seen[name] = target
    return _yaml.dump_documents(documents)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _queue(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"must be from 0 to 4096, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolyard.manifest", description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="+", metavar="module:function")
    p.add_argument("--image", required=True, help="container image that has the function and toolyard")
    p.add_argument("--namespace", help="metadata.namespace of every McpTool")
    p.add_argument("--toolset", help="toolset the tools belong to")
    p.add_argument("--mode", choices=["Job", "Pool"], default="Job")
    p.add_argument("--reuse", action="store_true", help="Pool only: one worker process serves many calls")
    p.add_argument("--replicas", type=_positive, help="Pool only: warm pods (default 1)")
    p.add_argument("--queue", type=_queue,
                   help="Pool only: calls a pod keeps waiting for a free slot (default 8 per slot)")
    p.add_argument("--timeout", type=_positive, default=60, help="seconds per call (default 60)")
    p.add_argument("--read-only", action="store_true", help="the tools change nothing (MCP hints)")
    p.add_argument("--caller-identity", action="store_true",
                   help="give the functions the caller's identity (toolyard.caller())")
    p.add_argument("--name", help="tool name instead of the function name (single function only)")
    p.add_argument("--output", help="write to this file instead of stdout")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.mode != "Pool" and (args.reuse or args.replicas is not None or args.queue is not None):
        parser.error("--reuse, --replicas and --queue need --mode Pool")
    options = Options(
        image=args.image, namespace=args.namespace, toolset=args.toolset, mode=args.mode,
        reuse=args.reuse, replicas=args.replicas or 1, queue=args.queue, timeout=args.timeout,
        read_only=args.read_only, name=args.name, caller_identity=args.caller_identity,
    )  # fmt: skip
    try:
        text = generate(args.targets, options)
    except ManifestError as e:
        print(f"toolyard.manifest: error: {e}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
