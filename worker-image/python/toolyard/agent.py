"""`python -m toolyard.agent`: the code-execution harness of the coding agent.

One process per coding task, started by `toolyard-runner agent`. It executes the model's
Python code step by step in one persistent namespace (variables survive between steps),
where every registered tool is a Python function whose call goes back to the runner, which
forwards it to the gateway as the task's owner. The harness never imports tool modules:
tools are reachable only through these stubs.

Protocol (JSON lines; the harness owns the original stdin/stdout, user code sees stderr
as fd 1 and /dev/null as fd 0):

runner -> harness
  {"type": "init", "tools": [{"name", "description", "input_schema", "params"}...],
   "max_artifact_bytes": N, "max_output_chars": N}
  {"type": "exec", "step": n, "code": "..."}
  {"type": "reply", "id": k, "ok": true, "result": ..., "notes": [...]}  (answer to a request;
   `notes`, printed into the step's output, say what files a tool returned)
  {"type": "reply", "id": k, "ok": false, "error": "..."}

harness -> runner
  {"type": "ready"}
  {"type": "request", "id": k, "op": "call_tool", "name": ..., "arguments": {...}}
  {"type": "request", "id": k, "op": "write_artifact", "filename": ..., "content_base64": ...}
  {"type": "request", "id": k, "op": "read_artifact", "filename": ...}
  {"type": "done", "step": n, "output": "...", "error": null | "traceback text",
   "final_answer": null | {...}}

Helpers in the namespace: every tool, `tool_search(query)`, `write_artifact(filename,
content, encoding="text"|"base64")`, `read_written_artifact(filename)`,
`final_answer(answer)`. A tool that fails raises `ToolError` with the tool's message.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from typing import IO, Any, Callable

DEFAULT_MAX_OUTPUT_CHARS = 20_000


class ToolError(Exception):
    """A tool call failed; the message is the tool's own."""


class _FinalAnswer(BaseException):
    """Raised by final_answer() to end the step (BaseException: user `except Exception` won't catch it)."""

    def __init__(self, answer: Any) -> None:
        super().__init__("final_answer")
        self.answer = answer


class Channel:
    """The private JSON-lines channel to the runner."""

    def __init__(self, reader: IO[str], writer: IO[str]) -> None:
        self.reader, self.writer = reader, writer
        self.next_id = 0

    def send(self, message: dict[str, Any]) -> None:
        self.writer.write(json.dumps(message, ensure_ascii=False, allow_nan=False) + "\n")
        self.writer.flush()

    def receive(self) -> dict[str, Any] | None:
        line = self.reader.readline()
        if not line:
            return None
        return json.loads(line)

    def request(self, op: str, **fields: Any) -> Any:
        """Sends a request and waits for its reply; raises ToolError on failure."""
        self.next_id += 1
        request_id = self.next_id
        self.send({"type": "request", "id": request_id, "op": op, **fields})
        reply = self.receive()
        if reply is None:
            raise SystemExit(0)
        if reply.get("type") != "reply" or reply.get("id") != request_id:
            raise RuntimeError(f"protocol error: expected reply {request_id}, got {reply!r}")
        if not reply.get("ok"):
            raise ToolError(reply.get("error") or "failed")
        for note in reply.get("notes") or ():
            print(note)
        return reply.get("result")


def _tool_stub(channel: Channel, spec: dict[str, Any]) -> Callable[..., Any]:
    name = spec["name"]
    params = spec.get("params") or list((spec.get("input_schema") or {}).get("properties", {}).keys())

    def stub(*args: Any, **kwargs: Any) -> Any:
        if len(args) > len(params):
            raise TypeError(f"{name}() takes at most {len(params)} positional arguments ({len(args)} given)")
        arguments = dict(zip(params, args))
        for key, value in kwargs.items():
            if key in arguments:
                raise TypeError(f"{name}() got multiple values for argument '{key}'")
            arguments[key] = value
        return channel.request("call_tool", name=name, arguments=arguments)

    stub.__name__ = name
    stub.__doc__ = spec.get("description", "")
    return stub


def build_namespace(channel: Channel, tools: list[dict[str, Any]], max_artifact_bytes: int) -> dict[str, Any]:
    """The persistent globals of the task: tool stubs and helpers."""
    namespace: dict[str, Any] = {"__name__": "__agent__", "ToolError": ToolError}
    for spec in tools:
        namespace[spec["name"]] = _tool_stub(channel, spec)

    def tool_search(query: str) -> list[dict[str, str]]:
        """The tools you may call matching the words of `query`, best first (the gateway ranks them)."""
        return channel.request("tool_search", query=str(query))

    def write_artifact(filename: str, content: str | bytes, encoding: str = "text") -> str:
        """Saves a file under the task's outputs/; returns its name."""
        if encoding == "text":
            if not isinstance(content, str):
                raise TypeError("write_artifact(encoding='text') needs a str")
            data = content.encode("utf-8")
        elif encoding == "base64":
            data = base64.b64decode(content, validate=True) if isinstance(content, str) else bytes(content)
        else:
            raise ValueError("encoding must be 'text' or 'base64'")
        if len(data) > max_artifact_bytes:
            raise ValueError(f"artifact {filename!r} has {len(data)} bytes; the limit is {max_artifact_bytes}")
        channel.request("write_artifact", filename=filename, content_base64=base64.b64encode(data).decode("ascii"))
        return filename

    def read_written_artifact(filename: str) -> str:
        """Reads back a file this task wrote (text)."""
        data = channel.request("read_artifact", filename=filename)
        return base64.b64decode(data).decode("utf-8", "replace")

    def final_answer(answer: Any) -> None:
        """Ends the task with `answer` (a dict following the result contract)."""
        raise _FinalAnswer(answer)

    namespace.update(
        tool_search=tool_search,
        write_artifact=write_artifact,
        read_written_artifact=read_written_artifact,
        final_answer=final_answer,
    )
    return namespace


def execute(code: str, namespace: dict[str, Any], max_output: int) -> dict[str, Any]:
    """Runs one step; returns its output (with the value of a last bare expression, as a REPL
    shows it), error traceback and final answer (if any)."""
    buffer = io.StringIO()
    error = None
    answer = None
    with redirect_stdout(buffer), redirect_stderr(buffer):
        try:
            tree = ast.parse(code, "<step>", "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, "<step>", "exec"), namespace)  # noqa: S102 - running the agent's code is the point
            if last is not None:
                value = eval(compile(last, "<step>", "eval"), namespace)  # noqa: S307 - the same code, its last line
                if value is not None:
                    print(repr(value))
        except _FinalAnswer as final:
            answer = final.answer
        except SystemExit as exit_:
            error = f"SystemExit: {exit_.code} (the task cannot exit the interpreter; call final_answer instead)"
        except BaseException:  # noqa: BLE001 - every error becomes an observation
            error = _traceback_without_harness()
    output = buffer.getvalue()
    if len(output) > max_output:
        output = output[:max_output] + f"\n... [output cut at {max_output} characters]"
    return {"output": output, "error": error, "final_answer": _jsonable(answer)}


def _traceback_without_harness() -> str:
    etype, value, tb = sys.exc_info()
    frames = [f for f in traceback.extract_tb(tb) if f.filename == "<step>" or "toolyard" not in f.filename]
    lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames)
    lines += traceback.format_exception_only(etype, value)
    return "".join(lines)


def _jsonable(value: Any) -> Any:
    if value is None:
        return None
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError) as exc:
        return {"__invalid__": f"final_answer needs JSON data: {exc}"}


def main() -> int:
    protocol_out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    protocol_in = os.fdopen(os.dup(0), "r", encoding="utf-8")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdout = sys.stderr
    channel = Channel(protocol_in, protocol_out)

    init = channel.receive()
    if not init or init.get("type") != "init":
        print(f"toolyard.agent: expected an init message, got {init!r}", file=sys.stderr)
        return 2
    namespace = build_namespace(channel, init.get("tools", []), int(init.get("max_artifact_bytes", 10 << 20)))
    max_output = int(init.get("max_output_chars", DEFAULT_MAX_OUTPUT_CHARS))
    channel.send({"type": "ready"})
    while True:
        message = channel.receive()
        if message is None:
            return 0
        if message.get("type") != "exec":
            print(f"toolyard.agent: unexpected message {message.get('type')!r}", file=sys.stderr)
            continue
        result = execute(message.get("code", ""), namespace, max_output)
        channel.send({"type": "done", "step": message.get("step"), **result})


if __name__ == "__main__":
    sys.exit(main())
