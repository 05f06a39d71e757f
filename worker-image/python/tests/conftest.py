"""Make `toolyard` and the sample modules importable; the `run_tool` fixture runs the runner in file mode."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PACKAGE_ROOT = TESTS.parent
sys.path[:0] = [str(PACKAGE_ROOT), str(TESTS)]

from runner_support import subprocess_env  # noqa: E402  (needs the path above)


@dataclass
class Outcome:
    """What one file-mode run left behind."""

    code: int
    stdout: str
    stderr: str
    result: object  # parsed result file, or None when absent
    error: str | None  # error file text, or None when absent


@pytest.fixture
def run_tool(tmp_path):
    """Run `python -m toolyard.run TARGET` exactly as toolyard-runner does in file mode."""

    def run(target: str, arguments: object = None, *, stdin: bytes | None = None, timeout: float = 30) -> Outcome:
        result_file, error_file = tmp_path / "result.json", tmp_path / "error.txt"
        for f in (result_file, error_file):
            f.unlink(missing_ok=True)
        data = stdin if stdin is not None else json.dumps(arguments if arguments is not None else {}).encode()
        proc = subprocess.run(
            [sys.executable, "-m", "toolyard.run", target],
            input=data,
            capture_output=True,
            timeout=timeout,
            env=subprocess_env(TOOLYARD_RESULT_FILE=str(result_file), TOOLYARD_ERROR_FILE=str(error_file)),
        )
        result = json.loads(result_file.read_text(encoding="utf-8")) if result_file.exists() else None
        error = error_file.read_text(encoding="utf-8") if error_file.exists() else None
        return Outcome(proc.returncode, proc.stdout.decode(), proc.stderr.decode(), result, error)

    return run
