"""Functions the runner and manifest tests call as tools."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import toolyard

CALLS = 0  # module state: proves a jsonl worker serves many calls from one process


@dataclass
class Leg:
    """One leg of a trade.

    Attributes:
        strike: Strike price.
        quantity: Number of contracts.
    """

    strike: float
    quantity: int = 1


@dataclass
class Quote:
    """A priced trade.

    Attributes:
        total: Sum of strike times quantity.
        side: Trade direction.
    """

    total: float
    side: Literal["buy", "sell"]
    legs: list[Leg] = field(default_factory=list)


def count() -> int:
    """Count calls in this process."""
    global CALLS
    CALLS += 1
    return CALLS


def add(a: int, b: float = 0.5) -> float:
    """Add two numbers.

    Args:
        a: First addend.
        b: Second addend.

    Returns:
        The sum.
    """
    return a + b


def quote(legs: list[Leg], side: Literal["buy", "sell"] = "buy", note: Optional[str] = None) -> Quote:
    """Price a multi-leg trade.

    The total is a plain sum, good enough for tests.

    Args:
        legs: The legs to price,
            in order.
        side: Whether we buy or sell.
        note: Free text, ignored.
    """
    return Quote(total=sum(leg.strike * leg.quantity for leg in legs), side=side, legs=legs)


def describe(name: str, tags: tuple[str, int] = ("x", 1)) -> str:
    """Describe something (Sphinx style).

    :param name: What to describe.
    :param tags: A label and a weight.
    :returns: A sentence.
    """
    return f"{name} {tags}"


def talk(text: str) -> dict[str, str]:
    """Print protocol-looking lines on every channel, then return the text."""
    print('{"id": "fake", "ok": true, "result": "from print"}')
    print('{"ready": true}', file=sys.stderr)
    sys.stdout.flush()
    os.write(1, b'{"id": "fake2", "ok": true, "result": "from fd 1"}\n')
    return {"text": text}


def boom(message: str = "bad things") -> dict:
    """Raise ValueError."""
    raise ValueError(message)


def nan_result() -> dict:
    """Return NaN deep inside the result."""
    return {"items": [{"price": 1.0}, {"price": float("nan")}]}


def unserializable() -> dict:
    """Return something JSON cannot hold."""
    return {"when": object()}


def read_stdin() -> str:
    """Read stdin inside the function (must not steal protocol input)."""
    return sys.stdin.read()


def anything(value: Any = None) -> Any:
    """Echo any value."""
    return value


async def async_add(a: int, b: int) -> int:
    """Add asynchronously."""
    await asyncio.sleep(0)
    return a + b


def maybe(flag: bool) -> Optional[dict]:
    """May return an object or null."""
    return {"flag": flag} if flag else None


def undocumented(x: int):
    return x


def varargs(*values: int) -> int:
    """Not expressible as a tool."""
    return sum(values)


def bad_type(values: set[int]) -> int:
    """A set has no JSON form."""
    return len(values)


def steps(n: int, pause: float = 0.0) -> dict:
    """Report progress n times, each after `pause` seconds."""
    passed_on = 0
    for i in range(1, n + 1):
        time.sleep(pause)
        passed_on += toolyard.progress(i / n, f"step {i} of {n}")
    return {"passed_on": passed_on}


def late_progress(pause: float = 0.2, hold: float = 0.0) -> bool:
    """Start a thread that reports progress `pause` seconds later and prints what that report
    did to stderr; return after `hold` seconds."""
    import sys
    import threading

    def late() -> None:
        time.sleep(pause)
        try:
            toolyard.progress(0.5, "late")
            print("LATE: passed on", file=sys.stderr, flush=True)
        except RuntimeError as e:
            print(f"LATE: {e}", file=sys.stderr, flush=True)

    threading.Thread(target=late).start()
    time.sleep(hold)
    return True


def anything_progress(value: Any = None) -> bool:
    """Report `value` as the fraction, whatever it is."""
    return toolyard.progress(value)


def who() -> Any:
    """The caller, as `toolyard.caller()` says."""
    import toolyard

    who = toolyard.caller()
    return None if who is None else who._asdict()


def attach(text: str) -> Optional[str]:
    """Return `text` as a file `note.txt`."""
    import toolyard

    return toolyard.file("note.txt", text, "text/plain")
