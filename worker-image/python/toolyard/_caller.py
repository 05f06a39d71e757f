"""`toolyard.caller()`: who called the running function, for tools that ask.

A tool whose McpTool says `callerIdentity: true` gets the caller as the gateway authenticated
it: in `TOOLYARD_CALLER` (one process per call) or with each request of the jsonl protocol (a
reused worker; `toolyard.run` sets the current call's). Other tools get nothing.
"""

from __future__ import annotations

import contextvars
import json
import os
from typing import NamedTuple

_UNSET = object()
# The jsonl worker's current call: its caller (None when the tool did not ask).
_current: contextvars.ContextVar[object] = contextvars.ContextVar("toolyard_caller", default=_UNSET)


class Caller(NamedTuple):
    """The identity a call was made with (`caller._asdict()` gives a dict)."""

    #: Who vouched for it: `kubernetes`, `apikey`, an OIDC issuer URL, or `local`.
    issuer: str
    #: The user name as that issuer knows it (e.g. `system:serviceaccount:team-a:quant`).
    user: str
    #: The user's groups at the time of the call.
    groups: tuple[str, ...]


def _parse(value: object) -> Caller | None:
    if not isinstance(value, dict):
        return None
    issuer, user, groups = value.get("issuer"), value.get("user"), value.get("groups", [])
    if not isinstance(issuer, str) or not isinstance(user, str) or not isinstance(groups, list):
        return None
    return Caller(issuer=issuer, user=user, groups=tuple(g for g in groups if isinstance(g, str)))


def caller() -> Caller | None:
    """Who called the running function: issuer, user and groups, for entitlements and audit.

    Only for a tool whose McpTool has `callerIdentity: true` (`python -m toolyard.manifest
    --caller-identity`); otherwise, and outside a Toolyard call, None.
    """
    current = _current.get()
    if current is not _UNSET:
        return current  # type: ignore[return-value]
    text = os.environ.get("TOOLYARD_CALLER")
    if not text:
        return None
    try:
        return _parse(json.loads(text))
    except ValueError:
        return None


def begin_call(value: object) -> contextvars.Token[object]:
    """Sets the jsonl worker's current caller (from the request's `caller`, or none)."""
    return _current.set(_parse(value))


def end_call(token: contextvars.Token[object]) -> None:
    _current.reset(token)
