"""Helpers for the runner tests: the environment toolyard-runner gives a tool process."""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE_ROOT = TESTS.parent


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment the Rust runner gives a tool: PYTHONPATH with toolyard and the tool code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLYARD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), str(TESTS)])
    env.update(extra)
    return env
