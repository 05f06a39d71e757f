"""Docstring reading: the description and the per-name texts of Google or Sphinx docstrings.

Google style::

    Summary line.

    Body paragraph.

    Args:
        spot: Price of the underlying.
        rate (float): Risk-free rate,
            continuously compounded.

    Returns:
        The option price.

Sphinx style uses ``:param spot: ...``, ``:returns: ...`` and ``:ivar name: ...`` fields.
Everything before the first section or field is the description.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

# Google section headers, mapped to the part they fill (None: recognised, not used).
_SECTIONS = {
    "args": "params", "arguments": "params", "parameters": "params", "params": "params",
    "keyword args": "params", "keyword arguments": "params",
    "returns": "returns", "return": "returns",
    "attributes": "attributes",
    "yields": None, "raises": None, "examples": None, "example": None, "note": None,
    "notes": None, "see also": None, "warning": None, "warnings": None, "todo": None,
    "references": None,
}  # fmt: skip
_SPHINX_FIELD = re.compile(r"^:(\w+)((?:\s+[^:]+?)?)\s*:\s*(.*)$")
_SPHINX_PARTS = {
    "param": "params", "parameter": "params", "arg": "params", "argument": "params",
    "key": "params", "keyword": "params", "returns": "returns", "return": "returns",
    "ivar": "attributes", "var": "attributes", "cvar": "attributes",
}  # fmt: skip
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:(?:\s+(.*))?$")
_LIST_ITEM = re.compile(r"^([-*•]|\d+[.)])\s")
_RETURN_TYPE_PREFIX = re.compile(r"^[\w.\[\], |]+:\s+")


@dataclass
class Docstring:
    """The parts of a docstring a tool description needs."""

    description: str = ""
    params: dict[str, str] = field(default_factory=dict)
    returns: str | None = None
    attributes: dict[str, str] = field(default_factory=dict)


def parse(doc: str | None) -> Docstring:
    """Parse a docstring; unknown layouts simply yield everything as the description."""
    lines = inspect.cleandoc(doc or "").splitlines()
    result = Docstring()
    i = 0
    while i < len(lines) and not _is_section(lines[i]) and not _SPHINX_FIELD.match(lines[i]):
        i += 1
    result.description = _join(lines[:i])
    while i < len(lines):
        line = lines[i]
        if _is_section(line):
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or lines[end][0].isspace()):
                end += 1
            _google_section(result, _SECTIONS[line.strip()[:-1].lower()], lines[i + 1 : end])
            i = end
        elif match := _SPHINX_FIELD.match(line):
            end = i + 1
            while end < len(lines) and lines[end][:1].isspace():
                end += 1
            _sphinx_field(result, match, lines[i + 1 : end])
            i = end
        else:
            i += 1
    return result


def _is_section(line: str) -> bool:
    return line.endswith(":") and not line[:1].isspace() and line[:-1].strip().lower() in _SECTIONS


def _join(lines: list[str]) -> str:
    """Unwrap hard-wrapped lines; keep blank-line paragraphs and list items apart."""
    paragraphs, current = [], ""
    for line in lines + [""]:
        text = line.strip()
        if not text:
            if current:
                paragraphs.append(current)
            current = ""
        elif current and _LIST_ITEM.match(text):
            current += "\n" + text
        else:
            current = f"{current} {text}" if current else text
    return "\n\n".join(paragraphs)


def _google_section(result: Docstring, part: str | None, body: list[str]) -> None:
    if part == "returns":
        result.returns = _RETURN_TYPE_PREFIX.sub("", _join(body), count=1) or None
        return
    if part is None:
        return
    target = result.params if part == "params" else result.attributes
    indent = min((len(b) - len(b.lstrip()) for b in body if b.strip()), default=0)
    name, text = None, []
    for line in body + ["<end>"]:
        entry = _GOOGLE_ENTRY.match(line[indent:]) if line[indent:indent + 1].strip() else None
        if entry or line == "<end>":
            if name:
                target[name] = _join(text)
            name, text = (entry.group(1), [entry.group(2) or ""]) if entry else (None, [])
        elif name:
            text.append(line)


def _sphinx_field(result: Docstring, match: re.Match[str], continuation: list[str]) -> None:
    kind, argument, first = match.group(1).lower(), match.group(2).split(), match.group(3)
    part = _SPHINX_PARTS.get(kind)
    text = _join([first] + continuation)
    if part == "returns":
        result.returns = text or None
    elif part and argument:
        (result.params if part == "params" else result.attributes)[argument[-1]] = text
