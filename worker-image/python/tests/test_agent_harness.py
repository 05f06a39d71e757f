"""The coding agent's code-execution harness, driven over its protocol as the runner does."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1]
TOOLS = [
    {"name": "price_option", "description": "Price an option", "input_schema": {"type": "object", "properties": {"spot": {}, "strike": {}}}},
    {"name": "get_quote", "description": "Quote lookup by symbol", "input_schema": {"type": "object", "properties": {"symbol": {}}}},
]


class Harness:
    def __init__(self, max_artifact_bytes: int = 1000) -> None:
        env = {**os.environ, "PYTHONPATH": str(PACKAGE_DIR)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolyard.agent"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env,
        )
        self.send({"type": "init", "tools": TOOLS, "max_artifact_bytes": max_artifact_bytes, "max_output_chars": 200})
        assert self.receive() == {"type": "ready"}

    def send(self, message: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"harness exited: {self.proc.stderr.read() if self.proc.stderr else ''}"
        return json.loads(line)

    def run(self, code: str, step: int = 1, replies=None) -> dict:
        """Executes a step, answering requests with `replies(request) -> reply fields`."""
        self.send({"type": "exec", "step": step, "code": code})
        while True:
            message = self.receive()
            if message["type"] == "done":
                return message
            assert message["type"] == "request", message
            assert replies is not None, f"unexpected request {message}"
            self.send({"type": "reply", "id": message["id"], **replies(message)})

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=10) == 0


@pytest.fixture()
def harness():
    h = Harness()
    yield h
    h.close()


def test_variables_persist_between_steps_and_output_is_captured(harness):
    first = harness.run("x = 41\nprint('set x')")
    assert first["output"] == "set x\n" and first["error"] is None and first["final_answer"] is None
    second = harness.run("print(x + 1)", step=2)
    assert second["output"] == "42\n"


def test_the_value_of_a_last_bare_expression_is_shown_as_in_a_repl(harness):
    assert harness.run("x = 6\nx * 7")["output"] == "42\n"
    assert harness.run("print('a')\n{'k': [1, 2]}", step=2)["output"] == "a\n{'k': [1, 2]}\n"
    assert harness.run("None\nprint('b')", step=3)["output"] == "b\n", "None is not shown"
    assert harness.run("print('c')", step=4)["output"] == "c\n", "print's None is not shown"
    syntax = harness.run("x = (", step=5)
    assert "SyntaxError" in syntax["error"] and "<step>" in syntax["error"], syntax["error"]


def test_errors_come_back_as_tracebacks_and_the_next_step_can_repair(harness):
    broken = harness.run("y = undefined_name + 1")
    assert "NameError" in broken["error"] and "undefined_name" in broken["error"]
    assert "toolyard/agent.py" not in broken["error"], "harness frames are hidden"
    fixed = harness.run("y = 2\nprint(y)", step=2)
    assert fixed["error"] is None and fixed["output"] == "2\n"


def test_tool_stubs_call_back_through_the_runner(harness):
    seen = []

    def replies(request):
        seen.append(request)
        if request["arguments"].get("symbol") == "NOPE":
            return {"ok": False, "error": "LookupError: unknown symbol 'NOPE'"}
        return {"ok": True, "result": {"price": 10.45}}

    out = harness.run(
        "r = price_option(100, strike=95)\nprint(r['price'])\n"
        "try:\n    get_quote('NOPE')\nexcept ToolError as e:\n    print('failed:', e)\n",
        replies=replies,
    )
    assert out["error"] is None, out["error"]
    assert out["output"] == "10.45\nfailed: LookupError: unknown symbol 'NOPE'\n"
    assert seen[0]["op"] == "call_tool" and seen[0]["name"] == "price_option"
    assert seen[0]["arguments"] == {"spot": 100, "strike": 95}


def test_notes_of_a_tool_reply_show_in_the_steps_output(harness):
    note = '[risk_chart returned var.png (image/png, 12 bytes), saved as the artifact "c1/var.png"]'

    def replies(request):
        return {"ok": True, "result": {"var": 1.5}, "notes": [note]}

    out = harness.run("r = price_option(1)\nprint(r['var'])", replies=replies)
    assert out["error"] is None, out["error"]
    assert out["output"] == f"{note}\n1.5\n"


def test_bad_stub_calls_fail_in_python_without_a_request(harness):
    out = harness.run("price_option(1, 2, 3)")
    assert "TypeError" in out["error"]


def test_artifacts_are_written_and_read_back_through_the_runner(harness):
    store = {}

    def replies(request):
        if request["op"] == "write_artifact":
            store[request["filename"]] = request["content_base64"]
            return {"ok": True, "result": None}
        return {"ok": True, "result": store[request["filename"]]}

    out = harness.run(
        "write_artifact('scenarios.csv', 'spot,price\\n90,1.2\\n')\nprint(read_written_artifact('scenarios.csv'))",
        replies=replies,
    )
    assert out["error"] is None, out["error"]
    assert base64.b64decode(store["scenarios.csv"]) == b"spot,price\n90,1.2\n"
    assert "90,1.2" in out["output"]
    too_big = harness.run("write_artifact('big.txt', 'x' * 5000)", step=2)
    assert "limit is 1000" in too_big["error"]


def test_final_answer_ends_the_step(harness):
    out = harness.run("final_answer({'task_type': 'answer', 'summary': 'done'})\nprint('not reached')")
    assert out["final_answer"] == {"task_type": "answer", "summary": "done"}
    assert "not reached" not in out["output"]
    caught = harness.run("try:\n    final_answer({'a': 1})\nexcept Exception:\n    print('swallowed')", step=2)
    assert caught["final_answer"] == {"a": 1}


def test_user_output_on_fd_1_does_not_corrupt_the_protocol(harness):
    out = harness.run("import os\nos.write(1, b'{\"type\": \"done\"}\\n')\nprint('after')")
    assert out["type"] == "done" and out["output"] == "after\n"


def test_long_output_is_cut(harness):
    out = harness.run("print('z' * 1000)")
    assert len(out["output"]) < 300 and "output cut at 200 characters" in out["output"]


def test_non_json_final_answers_are_reported(harness):
    out = harness.run("final_answer({'x': float('nan')})")
    assert "__invalid__" in out["final_answer"]


def test_tool_search_asks_the_gateway_and_returns_its_ranking(harness):
    seen = []

    def replies(request):
        seen.append(request)
        return {"ok": True, "result": [{"name": "get_quote", "description": "Quote of a symbol"}]}

    out = harness.run("print([t['name'] for t in tool_search('quote symbol')])", replies=replies)
    assert out["output"] == "['get_quote']\n"
    assert seen and seen[0]["op"] == "tool_search" and seen[0]["query"] == "quote symbol"


def test_base64_artifacts_are_saved_as_their_bytes_and_bad_encodings_are_refused(harness):
    store = {}

    def replies(request):
        store[request["filename"]] = request["content_base64"]
        return {"ok": True, "result": None}

    data = bytes(range(256))
    out = harness.run(
        f"import base64\nwrite_artifact('blob.bin', base64.b64encode({data!r}).decode(), encoding='base64')",
        replies=replies,
    )
    assert out["error"] is None, out["error"]
    assert base64.b64decode(store["blob.bin"]) == data
    for code, message in [
        ("write_artifact('x.bin', 'not base64!', encoding='base64')", "Error"),
        ("write_artifact('x.txt', 'a', encoding='hex')", "encoding must be 'text' or 'base64'"),
        ("write_artifact('x.txt', b'bytes')", "needs a str"),
        ("write_artifact('big.bin', base64.b64encode(b'x' * 1001).decode(), encoding='base64')", "limit is 1000"),
    ]:
        refused = harness.run(code, step=2)
        assert refused["error"] and message in refused["error"], (code, refused["error"])
    assert set(store) == {"blob.bin"}, "nothing refused reached the runner"

