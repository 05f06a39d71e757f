"""`toolyard.caller()`: the caller of a tool that asked for it, in file mode and per jsonl request."""

from __future__ import annotations

import json
import subprocess
import sys

from runner_support import subprocess_env

import toolyard
from toolyard import _caller
from toolyard.run import _load, serve_line

WHO = "import json, os, toolyard; c = toolyard.caller(); json.dump(None if c is None else [c.issuer, c.user, list(c.groups)], open(os.environ['TOOLYARD_RESULT_FILE'], 'w'))"


def run(tmp_path, **env):
    result = tmp_path / "result.json"
    subprocess.run([sys.executable, "-c", WHO], check=True, env=subprocess_env(TOOLYARD_RESULT_FILE=str(result), **env))
    return json.loads(result.read_text())


def test_file_mode_reads_the_caller_from_the_environment(tmp_path):
    caller = {"issuer": "kubernetes", "user": "system:serviceaccount:team-a:quant", "groups": ["quants"]}
    assert run(tmp_path, TOOLYARD_CALLER=json.dumps(caller)) == ["kubernetes", "system:serviceaccount:team-a:quant", ["quants"]]
    assert run(tmp_path) is None, "a tool that did not ask gets nothing"
    assert run(tmp_path, TOOLYARD_CALLER="not json") is None


def test_a_jsonl_worker_has_each_requests_caller_only_during_that_request(monkeypatch):
    monkeypatch.delenv("TOOLYARD_CALLER", raising=False)
    spec = _load("sample_tools:who")
    alice = {"issuer": "apikey", "user": "alice", "groups": ["quants", "viewers"]}
    first = serve_line(spec, json.dumps({"id": "c1", "arguments": {}, "caller": alice}).encode())
    assert first == {"id": "c1", "ok": True, "result": alice}
    second = serve_line(spec, json.dumps({"id": "c2", "arguments": {}}).encode())
    assert second == {"id": "c2", "ok": True, "result": None}, "a request without a caller has none"
    assert toolyard.caller() is None, "nothing is left after the call"
    assert _caller._parse({"issuer": 1, "user": "x"}) is None
