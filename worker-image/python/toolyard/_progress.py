"""`toolyard.progress(fraction, message)`: tell the caller how far the running call is.

The runner that started the function says where reports go: a file named by
`TOOLYARD_PROGRESS_FILE` (one process per call), or the jsonl protocol's output (a reused
worker; `toolyard.run` sets the current call). Either way a report is one JSON line
`{"progress": 0.5, "message": "..."}`, read by the runner while the function runs.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import IO, Any, Callable

# Reports closer together than this are dropped (except the last one, fraction 1): a function
# reporting in a tight loop costs a clock read, not a write.
MIN_INTERVAL_S = 0.1
MAX_MESSAGE_CHARS = 200

_lock = threading.Lock()
# The jsonl worker's current call: writes one report line to the protocol output.
_send: Callable[[dict[str, Any]], None] | None = None
_file: IO[str] | None = None
_last_sent = -math.inf
# The call this process ran (or the jsonl worker's last call) has returned: a report now comes
# from a thread the function left running, for a call that is over.
_ended = False
# Threads that were running when the jsonl worker's current call began: left over from earlier
# calls (or the worker's own), so their reports cannot be told to belong to this call.
_foreign: frozenset[int] = frozenset()


def progress(fraction: float, message: str | None = None) -> bool:
    """Report that the running call is `fraction` done (a number from 0 to 1), with an
    optional short message (cut to 200 characters).

    A caller that asked for progress gets it as an MCP `notifications/progress`, and the report
    is kept in the call's events. Reports less than 0.1 s after the previous one are dropped
    (a report of 1 never is), so calling this in a loop is cheap. Outside a Toolyard call it
    does nothing. Returns True when the report was passed on.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"fraction must be a number from 0 to 1, got {type(fraction).__name__}")
    if not (math.isfinite(fraction) and 0 <= fraction <= 1):
        raise ValueError(f"fraction must be a number from 0 to 1, got {fraction!r}")
    if message is not None and not isinstance(message, str):
        raise TypeError(f"message must be a string, got {type(message).__name__}")
    report: dict[str, Any] = {"progress": float(fraction)}
    if message:
        report["message"] = message[:MAX_MESSAGE_CHARS]
    global _last_sent, _file
    with _lock:
        if _ended or threading.get_ident() in _foreign:
            raise RuntimeError(
                "toolyard.progress() from a thread that outlived its call: the call is over and the report "
                "is dropped (report from the call's own thread, or from threads it starts)"
            )
        now = time.monotonic()
        if fraction < 1 and now - _last_sent < MIN_INTERVAL_S:
            return False
        if _send is not None:
            _send(report)
        else:
            path = os.environ.get("TOOLYARD_PROGRESS_FILE")
            if not path:
                return False
            try:
                if _file is None:
                    _file = open(path, "a", encoding="utf-8")
                _file.write(json.dumps(report, ensure_ascii=False, allow_nan=False) + "\n")
                _file.flush()
            except OSError:
                return False
        _last_sent = now
        return True


def begin_call(send: Callable[[dict[str, Any]], None]) -> None:
    """A jsonl worker's call starts: its reports go to `send` (which adds the call's id), from
    the calling thread or threads started from now on; older threads' reports raise."""
    global _send, _last_sent, _ended, _foreign
    current = threading.get_ident()
    running = frozenset(t.ident for t in threading.enumerate() if t.ident is not None and t.ident != current)
    with _lock:
        _send, _last_sent, _ended, _foreign = send, -math.inf, False, running


def end_call() -> None:
    """The call is over (a jsonl worker's, or the one call of a fresh process): a later report,
    from a thread left behind, raises RuntimeError and reaches nobody."""
    global _send, _file, _ended
    with _lock:
        _send, _ended = None, True
        if _file is not None:
            _file.close()
            _file = None
