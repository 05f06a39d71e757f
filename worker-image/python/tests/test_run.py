"""The function runner as toolyard-runner starts it: stdin, env files, exit codes, JSON lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from runner_support import subprocess_env

# --- file mode -------------------------------------------------------------------------


def test_success_writes_only_the_result_file(run_tool):
    out = run_tool("sample_tools:add", {"a": 2})
    assert (out.code, out.result, out.error) == (0, 2.5, None)
    assert out.stdout == ""


def test_dataclass_result_and_nested_arguments(run_tool):
    out = run_tool("sample_tools:quote", {"legs": [{"strike": 10, "quantity": 2}, {"strike": 1.5}], "side": "sell"})
    assert out.code == 0, out.stderr
    assert out.result == {
        "total": 21.5,
        "side": "sell",
        "legs": [{"strike": 10.0, "quantity": 2}, {"strike": 1.5, "quantity": 1}],
    }


def test_prints_go_to_the_logs_not_the_result(run_tool):
    out = run_tool("sample_tools:talk", {"text": "hi"})
    assert (out.code, out.result) == (0, {"text": "hi"})
    assert '"result": "from print"' in out.stdout and "from fd 1" in out.stdout
    assert '{"ready": true}' in out.stderr


def test_function_exception_exits_1_with_type_and_message(run_tool):
    out = run_tool("sample_tools:boom", {"message": "spot must be positive"})
    assert (out.code, out.result) == (1, None)
    assert out.error == "ValueError: spot must be positive"
    assert "Traceback (most recent call last)" in out.stderr


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"a": "2"}, "argument 'a': expected integer, got string"),
        ({"a": True}, "argument 'a': expected integer, got boolean"),
        ({}, "missing required argument 'a'"),
        ({"a": 1, "c": 3}, "unknown argument 'c' (accepted: a, b)"),
        ([1, 2], "arguments must be a JSON object, got array"),
    ],
)
def test_invalid_arguments_exit_2_before_the_call(run_tool, arguments, message):
    out = run_tool("sample_tools:add", arguments)
    assert (out.code, out.error, out.result) == (2, message, None)


@pytest.mark.parametrize(
    ("stdin", "fragment"),
    [
        (b"", "no arguments on stdin"),
        (b"{not json", "arguments on stdin are not valid JSON"),
        (b'{"a": NaN}', "NaN is not valid JSON"),
        (b'{"a": "\xff"}', "not valid JSON"),
    ],
)
def test_unreadable_stdin_exits_2(run_tool, stdin, fragment):
    out = run_tool("sample_tools:add", stdin=stdin)
    assert out.code == 2 and fragment in out.error


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("sample_tools", "expected 'module:function', got 'sample_tools'"),
        ("no_such_module:f", "cannot import module 'no_such_module': No module named 'no_such_module'"),
        ("broken_module:f", "importing module 'broken_module' failed: RuntimeError: import-time failure"),
        ("sample_tools:nope", "module 'sample_tools' has no attribute 'nope'"),
        ("sample_tools:CALLS", "'sample_tools:CALLS' is not callable"),
        ("sample_tools:bad_type", "function 'bad_type': parameter 'values': set[int] has no JSON equivalent"),
    ],
)
def test_bad_invocations_exit_2_naming_the_problem(run_tool, target, message):
    out = run_tool(target, {})
    assert (out.code, out.error) == (2, message)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("sample_tools:nan_result", "result.items[1].price is NaN"),
        ("sample_tools:unserializable", "result.when is not JSON-serializable (a object)"),
    ],
)
def test_bad_results_exit_3(run_tool, target, message):
    out = run_tool(target, {})
    assert (out.code, out.error, out.result) == (3, message, None)


def test_async_functions_are_awaited(run_tool):
    assert run_tool("sample_tools:async_add", {"a": 1, "b": 2}).result == 3


def test_long_error_messages_are_cut_to_4_kib(run_tool):
    out = run_tool("sample_tools:boom", {"message": "é" * 5000})
    assert out.code == 1 and len(out.error.encode()) <= 4096 and out.error.endswith("...")


def test_generator_based_coroutines_are_awaited_like_inspect_says():
    import asyncio
    import inspect
    import types as pytypes

    from toolyard.run import _is_awaitable

    @pytypes.coroutine
    def legacy():
        yield from asyncio.sleep(0).__await__()

    class Custom:
        def __await__(self):
            return iter(())

    def plain_generator():
        yield 1

    async def native():
        return 1

    coroutine = native()
    for value in [coroutine, legacy(), Custom(), plain_generator(), 1, None, {"a": 1}]:
        assert _is_awaitable(value) == inspect.isawaitable(value), value
    coroutine.close()


def test_a_plain_function_runs_without_importing_inspect_or_dataclasses(tmp_path):
    """A fresh process per call pays for every import: a function that needs neither module
    (no dataclasses, a signature its code object tells) does not import them."""
    (tmp_path / "lean_tool.py").write_text("def add(a: int, b: float = 0.5) -> float:\n    return a + b\n")
    driver = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from toolyard import run\n"
        "code = run.main(['lean_tool:add'])\n"
        "heavy = ('inspect', 'dataclasses', 'asyncio', 'traceback')\n"
        "print(','.join(m for m in heavy if m in sys.modules and m not in before))\n"
        "sys.exit(code)\n"
    )
    result, error = tmp_path / "result.json", tmp_path / "error.txt"
    env = subprocess_env(TOOLYARD_RESULT_FILE=str(result), TOOLYARD_ERROR_FILE=str(error))
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", driver], input=b'{"a": 2}', capture_output=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(result.read_text()) == 2.5
    assert proc.stdout.decode().strip() == "", "imported for a plain function: " + proc.stdout.decode()


def test_missing_environment_exits_2_with_a_message():
    proc = subprocess.run(
        [sys.executable, "-m", "toolyard.run", "sample_tools:add"],
        input=b"{}",
        capture_output=True,
        env=subprocess_env(),
    )
    assert proc.returncode == 2 and proc.stdout == b""
    assert b"TOOLYARD_RESULT_FILE and TOOLYARD_ERROR_FILE not set" in proc.stderr


# --- jsonl mode ------------------------------------------------------------------------


def jsonl(target: str, *lines: str | dict) -> tuple[int, list[dict], str]:
    """Run a jsonl worker over the given request lines; return exit code, answers, stderr."""
    data = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    proc = subprocess.run(
        [sys.executable, "-m", "toolyard.run", target],
        input=data.encode(),
        capture_output=True,
        timeout=30,
        env=subprocess_env(TOOLYARD_PROTOCOL="jsonl"),
    )
    answers = [json.loads(line) for line in proc.stdout.decode().splitlines()]  # every line is protocol
    return proc.returncode, answers, proc.stderr.decode()


def request(request_id: str, **arguments) -> dict:
    return {"id": request_id, "arguments": arguments}


def test_jsonl_worker_serves_many_calls_from_one_process():
    code, answers, _ = jsonl("sample_tools:count", request("a"), request("b"), request("c"))
    assert code == 0
    assert answers == [
        {"ready": True},
        {"id": "a", "ok": True, "result": 1},
        {"id": "b", "ok": True, "result": 2},
        {"id": "c", "ok": True, "result": 3},
    ]


def test_jsonl_user_output_never_reaches_the_protocol():
    code, answers, stderr = jsonl("sample_tools:talk", request("1", text="x"), request("2", text="y"))
    assert code == 0
    assert answers[1:] == [
        {"id": "1", "ok": True, "result": {"text": "x"}},
        {"id": "2", "ok": True, "result": {"text": "y"}},
    ]
    assert "from print" in stderr and "from fd 1" in stderr


def test_jsonl_function_cannot_read_the_requests():
    code, answers, _ = jsonl("sample_tools:read_stdin", request("1"), request("2"))
    assert answers[1:] == [{"id": "1", "ok": True, "result": ""}, {"id": "2", "ok": True, "result": ""}]


def test_jsonl_failures_are_answered_and_the_loop_continues():
    code, answers, stderr = jsonl(
        "sample_tools:add",
        "this is not json",
        '{"id": "x", "arguments": {"a": NaN}}',
        "[1, 2]",
        {"id": 7, "arguments": {}},
        {"id": "no-args"},
        "",
        request("bad", a="1"),
        request("good", a=1, b=2),
    )
    assert code == 0
    protocol = [a for a in answers[1:] if a.get("kind") == "protocol"]
    assert [a["id"] for a in protocol] == [None, None, None, None, "no-args"]
    assert protocol[0]["error"].startswith("request is not valid JSON")
    assert protocol[1]["error"] == "request is not valid JSON: NaN is not valid JSON"
    assert protocol[2]["error"] == "request must be a JSON object, got array"
    assert protocol[3]["error"] == "request 'id' must be a string"
    assert protocol[4]["error"] == "request 'arguments' must be a JSON object"
    assert answers[-2:] == [
        {"id": "bad", "ok": False, "kind": "invalid_arguments", "error": "argument 'a': expected integer, got string"},
        {"id": "good", "ok": True, "result": 3.0},
    ]


@pytest.mark.parametrize(
    ("target", "kind", "error"),
    [
        ("sample_tools:boom", "error", "ValueError: bad things"),
        ("sample_tools:nan_result", "bad_result", "result.items[1].price is NaN"),
        ("sample_tools:unserializable", "bad_result", "result.when is not JSON-serializable (a object)"),
    ],
)
def test_jsonl_call_failures_have_a_kind(target, kind, error):
    code, answers, stderr = jsonl(target, request("1"), request("2"))
    assert code == 0
    assert answers[1:] == [{"id": i, "ok": False, "kind": kind, "error": error} for i in ("1", "2")]


def test_jsonl_import_failure_is_reported_instead_of_ready():
    code, answers, stderr = jsonl("no_such_module:f", request("1"))
    assert code == 2
    message = "cannot import module 'no_such_module': No module named 'no_such_module'"
    assert answers == [{"ready": False, "error": message}]


def test_jsonl_answers_each_request_before_the_next_arrives():
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolyard.run", "sample_tools:count"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=subprocess_env(TOOLYARD_PROTOCOL="jsonl"),
    )
    try:
        assert json.loads(proc.stdout.readline()) == {"ready": True}
        for n in (1, 2):
            proc.stdin.write(json.dumps(request(str(n))).encode() + b"\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline()) == {"id": str(n), "ok": True, "result": n}
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- progress ---------------------------------------------------------------------------


def run_with_progress(tmp_path, target: str, arguments: dict, progress_file: bool = True):
    result, error, progress = tmp_path / "result.json", tmp_path / "error.txt", tmp_path / "progress.jsonl"
    extra = {"TOOLYARD_RESULT_FILE": str(result), "TOOLYARD_ERROR_FILE": str(error)}
    if progress_file:
        extra["TOOLYARD_PROGRESS_FILE"] = str(progress)
    proc = subprocess.run(
        [sys.executable, "-m", "toolyard.run", target],
        input=json.dumps(arguments).encode(),
        capture_output=True,
        timeout=30,
        env=subprocess_env(**extra),
    )
    reports = [json.loads(line) for line in progress.read_text().splitlines()] if progress.exists() else []
    return proc, json.loads(result.read_text()) if result.exists() else None, reports


def test_progress_reports_are_appended_to_the_progress_file(tmp_path):
    proc, result, reports = run_with_progress(tmp_path, "sample_tools:steps", {"n": 3, "pause": 0.12})
    assert proc.returncode == 0, proc.stderr
    assert result == {"passed_on": 3}
    assert reports == [
        {"progress": 1 / 3, "message": "step 1 of 3"},
        {"progress": 2 / 3, "message": "step 2 of 3"},
        {"progress": 1.0, "message": "step 3 of 3"},
    ]


def test_progress_in_a_tight_loop_is_thinned_but_the_last_report_kept(tmp_path):
    proc, result, reports = run_with_progress(tmp_path, "sample_tools:steps", {"n": 100000})
    assert proc.returncode == 0, proc.stderr
    # At most one report per 0.1 s: a loop that runs for seconds (longer on a loaded machine)
    # keeps a few dozen of its 100000 reports, far from all of them.
    assert 1 <= len(reports) <= 1000, len(reports)
    assert result["passed_on"] == len(reports)
    assert reports[-1] == {"progress": 1.0, "message": "step 100000 of 100000"}


def test_progress_outside_a_call_with_reports_does_nothing(tmp_path):
    proc, result, reports = run_with_progress(tmp_path, "sample_tools:steps", {"n": 2}, progress_file=False)
    assert (proc.returncode, result, reports) == (0, {"passed_on": 0}, [])


@pytest.mark.parametrize("fraction", [1.5, -0.5, "half", True])
def test_a_fraction_outside_0_to_1_is_refused(tmp_path, fraction):
    proc, result, reports = run_with_progress(tmp_path, "sample_tools:anything_progress", {"value": fraction})
    assert proc.returncode == 1 and reports == []
    assert "fraction must be a number from 0 to 1" in (tmp_path / "error.txt").read_text()


LATE = "LATE: toolyard.progress() from a thread that outlived its call: the call is over"


def test_progress_after_the_call_returned_is_an_error_and_reaches_nobody(tmp_path):
    proc, result, reports = run_with_progress(tmp_path, "sample_tools:late_progress", {"pause": 0.2})
    assert (proc.returncode, result, reports) == (0, True, [])
    assert LATE in proc.stderr.decode(), proc.stderr


def test_jsonl_progress_from_an_earlier_calls_thread_is_an_error_and_not_the_next_calls():
    # a returns at once; its thread reports while b runs (b's own thread reports too).
    code, lines, stderr = jsonl(
        "sample_tools:late_progress", request("a", pause=0.1), request("b", pause=0.3, hold=0.8)
    )
    assert code == 0, stderr
    assert lines[1:] == [
        {"id": "a", "ok": True, "result": True},
        {"id": "b", "progress": 0.5, "message": "late"},
        {"id": "b", "ok": True, "result": True},
    ]
    assert stderr.count(LATE) == 1 and stderr.count("LATE: passed on") == 1, stderr


def test_jsonl_progress_lines_carry_the_call_id_and_come_before_the_answer():
    code, lines, stderr = jsonl("sample_tools:steps", request("a", n=2, pause=0.12), request("b", n=1))
    assert code == 0, stderr
    assert lines[1:] == [
        {"id": "a", "progress": 0.5, "message": "step 1 of 2"},
        {"id": "a", "progress": 1.0, "message": "step 2 of 2"},
        {"id": "a", "ok": True, "result": {"passed_on": 2}},
        {"id": "b", "progress": 1.0, "message": "step 1 of 1"},
        {"id": "b", "ok": True, "result": {"passed_on": 1}},
    ]
