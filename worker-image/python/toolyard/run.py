"""`python -m toolyard.run module:function`: run a Python function as a tool.

File mode (default), one call per process, as started by `toolyard-runner call`:
the arguments arrive as one JSON object on stdin; the JSON result is written to
`$TOOLYARD_RESULT_FILE`; on failure a short message (at most 4 KiB) is written to
`$TOOLYARD_ERROR_FILE`. Exit codes: 0 success, 1 the function raised, 2 invalid
arguments or bad invocation, 3 the result is not JSON (or holds NaN/Infinity).

JSON-lines mode (`TOOLYARD_PROTOCOL=jsonl`), a long-lived worker for pools with
process reuse: after `{"ready": true}`, each stdin line `{"id": "...", "arguments":
{...}}` is answered by one stdout line `{"id": ..., "ok": true, "result": ...}` or
`{"id": ..., "ok": false, "kind": ..., "error": "..."}`, after any progress lines
`{"id": ..., "progress": 0.5, "message": "..."}` of the call (file mode appends those to
`$TOOLYARD_PROGRESS_FILE`). A request may carry the call's `"traceparent"` (file mode reads
`$TRACEPARENT`). The protocol owns the
original stdout and stdin; the function sees stderr as fd 1 and /dev/null as fd 0.

Whatever the function prints goes to the process's stdout/stderr (the call's logs),
never into the result.
"""

from __future__ import annotations

import collections.abc
import json
import os
import sys
import types
from typing import IO, Any, NoReturn

from . import _caller, _outputs, _progress, _tracing
from ._types import (
    BadResult,
    FunctionSpec,
    InvalidArguments,
    InvocationError,
    UnsupportedType,
    bind_arguments,
    inspect_function,
    kind_of,
    load_function,
    to_json,
)

USAGE = "usage: python -m toolyard.run module:function"
MAX_ERROR_BYTES = 4096
# Failure kind -> exit code of file mode. The kinds are also the jsonl `kind` values.
EXIT_CODES = {"error": 1, "invalid_arguments": 2, "bad_result": 3}
# One event loop per process, kept across calls. `asyncio`, `inspect` and `traceback` are
# imported only when needed: a fresh process per call pays for every import at start-up.
_loop: Any = None
_CO_ITERABLE_COROUTINE = 0x100  # a generator-based coroutine (`types.coroutine`)


class CallFailed(Exception):
    """A call did not produce a result; `kind` is a key of `EXIT_CODES`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(data: bytes) -> Any:
    """Strict JSON from UTF-8 bytes: NaN and Infinity literals are refused."""
    return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)


def dump_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def shorten(message: str, limit: int = MAX_ERROR_BYTES) -> str:
    """Cut a message to at most `limit` UTF-8 bytes without splitting a character."""
    data = message.encode("utf-8", "replace")
    if len(data) <= limit:
        return message
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


def call(spec: FunctionSpec, arguments: Any, traceparent: str | None = None) -> Any:
    """Check the arguments, call the function and return its result as JSON data. The function
    runs in its own span of the call's trace when OpenTelemetry is installed (`_tracing`)."""
    if not isinstance(arguments, dict):
        raise CallFailed("invalid_arguments", f"arguments must be a JSON object, got {kind_of(arguments)}")
    try:
        kwargs = bind_arguments(spec, arguments)
    except InvalidArguments as e:
        raise CallFailed("invalid_arguments", str(e)) from None
    try:
        with _tracing.function_span(_span_name(spec), traceparent):
            try:
                value = spec.func(**kwargs)
                if _is_awaitable(value):
                    value = _await(value)
            except (Exception, SystemExit) as e:
                _print_exception(e)
                text = str(e)
                raise CallFailed("error", f"{type(e).__qualname__}: {text}" if text else type(e).__qualname__) from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        return to_json(value)
    except BadResult as e:
        raise CallFailed("bad_result", str(e)) from None
    except RecursionError:
        raise CallFailed("bad_result", "result is nested too deeply (or contains itself)") from None


def _span_name(spec: FunctionSpec) -> str:
    module = getattr(spec.func, "__module__", None)
    qualname = getattr(spec.func, "__qualname__", None) or spec.name
    return f"{module}.{qualname}" if module else qualname


def _is_awaitable(value: Any) -> bool:
    """`inspect.isawaitable`, without importing `inspect`."""
    if isinstance(value, types.GeneratorType):
        return bool(value.gi_code.co_flags & _CO_ITERABLE_COROUTINE)
    return isinstance(value, (types.CoroutineType, collections.abc.Awaitable))


def _print_exception(e: BaseException) -> None:
    import traceback

    traceback.print_exception(e, file=sys.stderr)


def _await(awaitable: Any) -> Any:
    """Run an `async def` tool on this process's event loop, kept across calls (pooled clients)."""
    global _loop
    if _loop is None:
        import asyncio

        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(awaitable)


def _load(target: str) -> FunctionSpec:
    """Import and inspect the function; raise `InvocationError` with a message for the user."""
    try:
        return inspect_function(load_function(target))
    except InvocationError as e:
        if e.__cause__ is not None:
            _print_exception(e.__cause__)
        raise
    except UnsupportedType as e:
        raise InvocationError(str(e)) from None


def run_file_mode(target: str | None, usage_error: str | None = None) -> int:
    """One call: stdin -> function -> result file. Returns the exit code."""
    result_path = os.environ.get("TOOLYARD_RESULT_FILE")
    error_path = os.environ.get("TOOLYARD_ERROR_FILE")

    def fail(code: int, message: str, echo: bool = True) -> int:
        message = shorten(message)
        if echo:
            print(f"toolyard.run: {message}", file=sys.stderr)
        if error_path:
            try:
                with open(error_path, "w", encoding="utf-8") as f:
                    f.write(message)
            except OSError as e:
                print(f"toolyard.run: cannot write the error file: {e}", file=sys.stderr)
        return code

    missing = [n for n, v in (("TOOLYARD_RESULT_FILE", result_path), ("TOOLYARD_ERROR_FILE", error_path)) if not v]
    if missing:
        return fail(2, f"{' and '.join(missing)} not set; this command is started by toolyard-runner "
                    "(or set TOOLYARD_PROTOCOL=jsonl for a long-lived worker)")
    if target is None:
        return fail(2, usage_error or USAGE)
    try:
        spec = _load(target)
    except InvocationError as e:
        return fail(2, str(e))
    data = sys.stdin.buffer.read()
    if not data.strip():
        return fail(2, "no arguments on stdin: expected one JSON object")
    try:
        arguments = parse_json(data)
    except ValueError as e:  # also UnicodeDecodeError and json.JSONDecodeError
        return fail(2, f"arguments on stdin are not valid JSON: {e}")
    try:
        result = call(spec, arguments, os.environ.get("TRACEPARENT"))
    except CallFailed as e:
        return fail(EXIT_CODES[e.kind], e.message, echo=e.kind != "error")  # tracebacks are already out
    finally:
        _progress.end_call()
        _tracing.flush()
    try:
        with open(result_path, "w", encoding="utf-8") as f:
            f.write(dump_json(result))
    except OSError as e:
        return fail(2, f"cannot write the result file: {e}")
    return 0


def _send(out: IO[bytes], message: dict[str, Any]) -> None:
    out.write(dump_json(message).encode("utf-8") + b"\n")
    out.flush()


def serve_line(spec: FunctionSpec, line: bytes, out: IO[bytes] | None = None) -> dict[str, Any]:
    """Answer one request line of the jsonl protocol; the function's progress reports go to
    `out` as lines with the request's id, before the answer."""
    try:
        request = parse_json(line)
    except ValueError as e:
        return {"id": None, "ok": False, "kind": "protocol", "error": shorten(f"request is not valid JSON: {e}")}
    request_id = request.get("id") if isinstance(request, dict) else None
    request_id = request_id if isinstance(request_id, str) else None

    def refuse(message: str) -> dict[str, Any]:
        return {"id": request_id, "ok": False, "kind": "protocol", "error": message}

    if not isinstance(request, dict):
        return refuse(f"request must be a JSON object, got {kind_of(request)}")
    if request_id is None:
        return refuse("request 'id' must be a string")
    if not isinstance(request.get("arguments"), dict):
        return refuse("request 'arguments' must be a JSON object")
    traceparent = request.get("traceparent")
    if out is not None:
        _progress.begin_call(lambda report: _send(out, {"id": request_id, **report}))
    caller_token = _caller.begin_call(request.get("caller"))
    outputs_token = _outputs.begin_call(request.get("outputDir"))
    try:
        result = call(spec, request["arguments"], traceparent if isinstance(traceparent, str) else None)
        return {"id": request_id, "ok": True, "result": result}
    except CallFailed as e:
        return {"id": request_id, "ok": False, "kind": e.kind, "error": shorten(e.message)}
    finally:
        _outputs.end_call(outputs_token)
        _caller.end_call(caller_token)
        _progress.end_call()


def run_jsonl_mode(target: str | None, usage_error: str | None = None) -> int:
    """Long-lived worker: import once, then answer request lines until EOF."""
    # Keep the real stdin/stdout for the protocol; the function gets stderr as fd 1 and
    # /dev/null as fd 0, so neither print() nor C-level writes nor input() can touch it.
    sys.stdout.flush()
    out = open(os.dup(1), "wb")
    requests = open(os.dup(0), "rb")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout.reconfigure(line_buffering=True)

    try:
        if target is None:
            raise InvocationError(usage_error or USAGE)
        spec = _load(target)
    except InvocationError as e:
        print(f"toolyard.run: {e}", file=sys.stderr)
        _send(out, {"ready": False, "error": shorten(str(e))})
        return 2
    _send(out, {"ready": True})
    for line in requests:
        if line.strip():
            _send(out, serve_line(spec, line, out))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    target, usage_error = None, None
    if len(args) == 1 and not args[0].startswith("-"):
        target = args[0]
    else:
        usage_error = f"expected exactly one 'module:function' argument, got {len(args)}; {USAGE}"
    protocol = os.environ.get("TOOLYARD_PROTOCOL", "file")
    if protocol == "jsonl":
        return run_jsonl_mode(target, usage_error)
    if protocol != "file":
        print(f"toolyard.run: unknown TOOLYARD_PROTOCOL {protocol!r} (expected 'file' or 'jsonl')", file=sys.stderr)
        return 2
    return run_file_mode(target, usage_error)


if __name__ == "__main__":
    sys.exit(main())
