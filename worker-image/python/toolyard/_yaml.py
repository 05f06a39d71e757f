"""A minimal, deterministic YAML writer for generated manifests.

Mappings are written in block style in insertion order; lists of scalars in flow style
(`["a", "b"]`); every string as a JSON double-quoted string, which YAML 1.1 and 1.2
parsers read back identically. Only JSON data (dict, list, str, int, float, bool,
None) is accepted.
"""

from __future__ import annotations

import json
import re
from typing import Any

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_RESERVED_KEYS = {"y", "yes", "n", "no", "true", "false", "on", "off", "null"}
# Characters YAML forbids in a stream or treats as line breaks (YAML 1.1): escape them.
_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")


def dump_documents(documents: list[dict[str, Any]]) -> str:
    """A multi-document stream, each document starting with `---`."""
    return "".join("---\n" + dump(doc) for doc in documents)


def dump(value: dict[str, Any]) -> str:
    """One document whose top level is a mapping."""
    return "".join(line + "\n" for line in _mapping(value, 0))


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = json.dumps(value, allow_nan=False)
        if "e" in text and "." not in text:  # YAML 1.1 floats need a dot: 1e-05 -> 1.0e-05
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    if isinstance(value, str):
        return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))
    if value == {}:
        return "{}"
    if value == []:
        return "[]"
    if isinstance(value, list) and not any(isinstance(v, (dict, list)) for v in value):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    raise TypeError(f"cannot write a {type(value).__name__} as a YAML scalar")


def _is_block(value: Any) -> bool:
    if isinstance(value, dict):
        return bool(value)
    return isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"mapping keys must be strings, got {key!r}")
    if _PLAIN_KEY.match(key) and key.lower() not in _RESERVED_KEYS:
        return key
    return _scalar(key)


def _mapping(mapping: dict[str, Any], indent: int) -> list[str]:
    pad, lines = " " * indent, []
    for key, value in mapping.items():
        if _is_block(value):
            lines.append(f"{pad}{_key(key)}:")
            lines.extend(_block(value, indent + 2))
        else:
            lines.append(f"{pad}{_key(key)}: {_scalar(value)}")
    return lines


def _block(value: Any, indent: int) -> list[str]:
    if isinstance(value, dict):
        return _mapping(value, indent)
    pad, lines = " " * indent, []
    for item in value:
        if isinstance(item, dict) and item:
            inner = _mapping(item, indent + 2)
            lines.append(f"{pad}- {inner[0].lstrip()}")
            lines.extend(inner[1:])
        elif _is_block(item):
            lines.append(f"{pad}-")
            lines.extend(_block(item, indent + 2))
        else:
            lines.append(f"{pad}- {_scalar(item)}")
    return lines
