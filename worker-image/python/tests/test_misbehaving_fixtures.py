"""The misbehaving fixture tools used by end-to-end tests behave as those tests expect."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from runner_support import PACKAGE_ROOT, subprocess_env

FIXTURES = PACKAGE_ROOT.parents[1] / "tests" / "fixtures" / "misbehaving"


def fixture_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = subprocess_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), str(FIXTURES)])
    env.setdefault("TOOLYARD_RESULT_FILE", str(tmp_path / "result.json"))
    env.setdefault("TOOLYARD_ERROR_FILE", str(tmp_path / "error.txt"))
    return env


def run(tmp_path: Path, target: str, arguments: dict) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "toolyard.run", f"misbehaving:{target}"],
        input=json.dumps(arguments).encode(),
        capture_output=True,
        timeout=30,
        env=fixture_env(tmp_path),
    )
    written = tmp_path / ("result.json" if proc.returncode == 0 else "error.txt")
    return proc.returncode, written.read_text()


def test_fail_nan_echo_and_noisy(tmp_path):
    assert run(tmp_path, "fail", {"message": "boom"}) == (1, "RuntimeError: boom")
    assert run(tmp_path, "nan", {}) == (3, "result.value is NaN")
    assert run(tmp_path, "echo", {"value": [1, {"a": None}]}) == (0, '{"value":[1,{"a":null}]}')
    assert run(tmp_path, "noisy", {"n": 50}) == (0, '{"n":50}')


def test_noisy_in_a_reused_worker_keeps_the_protocol_clean(tmp_path):
    lines = "".join(json.dumps({"id": str(i), "arguments": {"n": 20}}) + "\n" for i in range(3))
    proc = subprocess.run(
        [sys.executable, "-m", "toolyard.run", "misbehaving:noisy"],
        input=lines.encode(),
        capture_output=True,
        timeout=30,
        env=fixture_env(tmp_path, TOOLYARD_PROTOCOL="jsonl"),
    )
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [{"ready": True}] + [
        {"id": str(i), "ok": True, "result": {"n": 20}} for i in range(3)
    ]


def test_hang_can_be_killed_with_its_process_group(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolyard.run", "misbehaving:hang"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=fixture_env(tmp_path),
        start_new_session=True,  # as the local executor does: its own process group
    )
    proc.stdin.write(b"{}")
    proc.stdin.close()
    line = proc.stderr.readline().decode()
    child = int(re.search(r"child sleep pid (\d+)", line).group(1))
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    proc.stderr.close()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_committed_fixture_manifests_match_the_code(tmp_path):
    proc = subprocess.run(["bash", str(FIXTURES / "generate.sh"), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for name in ("tools.yaml", "probes.yaml"):
        committed = (FIXTURES / name).read_text()
        assert (tmp_path / name).read_text() == committed, f"stale {name}: run tests/fixtures/misbehaving/generate.sh"
