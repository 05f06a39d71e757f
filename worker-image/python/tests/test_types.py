"""In-process tests of argument checking, conversion and schemas (toolyard._types)."""

from __future__ import annotations

import enum
import functools
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Sequence, TypedDict, Union

import pytest

from toolyard._types import (
    EMPTY,
    BadResult,
    Field,
    InvalidArguments,
    UnsupportedType,
    bind_arguments,
    inspect_function,
    parse_type,
    to_json,
)


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


@dataclass
class Inner:
    x: float
    label: str = "none"


@dataclass
class Outer:
    inner: Inner
    tags: list[str] = field(default_factory=list)


class Point(TypedDict):
    x: int
    y: int


def bind(annotation: Any, value: Any) -> Any:
    """Check one argument `v` of the given type; return the converted value."""

    def f(v): ...

    f.__annotations__ = {"v": annotation}
    return bind_arguments(inspect_function(f), {"v": value})["v"]


def problems(annotation: Any, value: Any) -> str:
    with pytest.raises(InvalidArguments) as info:
        bind(annotation, value)
    return str(info.value)


ACCEPTED = [
    (str, "x", "x"),
    (int, 3, 3),
    (int, 3.0, 3),
    (float, 1.5, 1.5),
    (bool, False, False),
    (None, None, None),
    (type(None), None, None),
    (list[int], [1, 2], [1, 2]),
    (Sequence[float], [1, 2.5], [1.0, 2.5]),
    (list, [1, "a"], [1, "a"]),
    (tuple[int, str], [1, "a"], (1, "a")),
    (tuple[float, ...], [1, 2], (1.0, 2.0)),
    (dict[str, float], {"a": 1}, {"a": 1.0}),
    (dict, {"a": [1]}, {"a": [1]}),
    (Optional[int], None, None),
    (Optional[int], 4, 4),
    (int | None, 4, 4),
    (Union[int, str], "s", "s"),
    (Literal["call", "put"], "put", "put"),
    (Literal[1, 2], 2, 2),
    (Color, "green", Color.GREEN),
    (Any, {"anything": [1, None]}, {"anything": [1, None]}),
    (Outer, {"inner": {"x": 1}}, Outer(Inner(1.0))),
    (Outer, {"inner": {"x": 2.5, "label": "a"}, "tags": ["t"]}, Outer(Inner(2.5, "a"), ["t"])),
    (Point, {"x": 1, "y": 2}, {"x": 1, "y": 2}),
]


@pytest.mark.parametrize(("annotation", "value", "expected"), ACCEPTED)
def test_accepted_values_are_converted(annotation, value, expected):
    converted = bind(annotation, value)
    assert converted == expected
    assert type(converted) is type(expected)


REJECTED = [
    (str, 1, "argument 'v': expected string, got integer"),
    (int, True, "argument 'v': expected integer, got boolean"),
    (int, 2.5, "argument 'v': expected integer, got number"),
    (float, "1.0", "argument 'v': expected number, got string"),
    (float, False, "argument 'v': expected number, got boolean"),
    (bool, 1, "argument 'v': expected boolean, got integer"),
    (None, 0, "argument 'v': expected null, got integer"),
    (list[int], {"a": 1}, "argument 'v': expected array, got object"),
    (list[int], [1, "a", 2.5],
     "argument 'v[1]': expected integer, got string; argument 'v[2]': expected integer, got number"),
    (tuple[int, str], [1], "argument 'v': expected an array of 2 items, got 1 items"),
    (tuple[int, str], [1, 2], "argument 'v[1]': expected string, got integer"),
    (dict[str, float], {"a": "x"}, "argument 'v.a': expected number, got string"),
    (dict[str, float], {"a b": None}, "argument 'v[\"a b\"]': expected number, got null"),
    (Optional[int], "a", "argument 'v': expected integer or null, got string"),
    (int | None, [], "argument 'v': expected integer or null, got array"),
    (Union[int, str], 1.5, "argument 'v': expected integer or string, got number"),
    (Literal["call", "put"], "straddle", "argument 'v': expected one of \"call\", \"put\", got \"straddle\""),
    (Literal[1, 2], True, "argument 'v': expected one of 1, 2, got true"),
    (Color, "blue", "argument 'v': expected one of \"red\", \"green\", got \"blue\""),
    (Outer, [], "argument 'v': expected object, got array"),
    (Outer, {}, "argument 'v.inner': missing required field"),
    (Outer, {"inner": {"x": "1"}, "extra": 1},
     "argument 'v.extra': unknown field (accepted: inner, tags); argument 'v.inner.x': expected number, got string"),
    (Optional[Outer], {"inner": {}}, "argument 'v.inner.x': missing required field"),
    (Point, {"x": 1}, "argument 'v.y': missing required field"),
]  # fmt: skip


@pytest.mark.parametrize(("annotation", "value", "message"), REJECTED)
def test_rejected_values_name_the_path_and_the_problem(annotation, value, message):
    assert problems(annotation, value) == message


def test_missing_and_unknown_arguments_are_all_reported():
    def f(spot: float, strike: float, kind: str = "call"): ...

    with pytest.raises(InvalidArguments) as info:
        bind_arguments(inspect_function(f), {"spot": "100", "bogus": 1})
    assert info.value.messages == [
        "argument 'spot': expected number, got string",
        "missing required argument 'strike'",
        "unknown argument 'bogus' (accepted: spot, strike, kind)",
    ]


def test_defaults_are_left_to_the_function():
    def f(a: int, b: float = 0.5): ...

    assert bind_arguments(inspect_function(f), {"a": 1}) == {"a": 1}


@pytest.mark.parametrize(
    ("annotation", "fragment"),
    [
        (set[int], "set[int] has no JSON equivalent"),
        (dict[int, str], "use dict[str, ...]"),
        (complex, "complex has no JSON equivalent"),
        (list[bytes], "bytes has no JSON equivalent"),
    ],
)
def test_unsupported_annotations_name_function_and_parameter(annotation, fragment):
    def tool(x): ...

    tool.__annotations__ = {"x": annotation}
    with pytest.raises(UnsupportedType) as info:
        inspect_function(tool)
    assert str(info.value).startswith("function 'tool': parameter 'x': ")
    assert fragment in str(info.value)


def test_var_arguments_are_unsupported():
    def tool(*values: int): ...

    with pytest.raises(UnsupportedType, match="parameter 'values' is variadic positional"):
        inspect_function(tool)


def test_recursive_dataclass_is_unsupported():
    @dataclass
    class Node:
        children: list["Node"]

    with pytest.raises(UnsupportedType, match="recursive"):
        parse_type(Node)


SCHEMAS = [
    (str, {"type": "string"}),
    (float, {"type": "number"}),
    (list[int], {"type": "array", "items": {"type": "integer"}}),
    (tuple[int, str], {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                       "minItems": 2, "maxItems": 2}),
    (dict[str, bool], {"type": "object", "additionalProperties": {"type": "boolean"}}),
    (Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
    (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
    (Color, {"type": "string", "enum": ["red", "green"]}),
    (Inner, {"type": "object", "properties": {"x": {"type": "number"}, "label": {"type": "string", "default": "none"}},
             "required": ["x"], "additionalProperties": False}),
    (Point, {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
             "required": ["x", "y"], "additionalProperties": False}),
    (Any, {}),
]  # fmt: skip


@pytest.mark.parametrize(("annotation", "schema"), SCHEMAS)
def test_schemas(annotation, schema):
    assert parse_type(annotation).schema() == schema


def test_result_conversion():
    value = {"outer": Outer(Inner(1.0), ["a"]), "pair": (1, "b"), "color": Color.RED}
    assert to_json(value) == {
        "outer": {"inner": {"x": 1.0, "label": "none"}, "tags": ["a"]},
        "pair": [1, "b"],
        "color": "red",
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (Inner(math.nan), "result.x is NaN"),
        ({"items": [1.0, math.inf]}, "result.items[1] is Infinity"),
        ([-math.inf], "result[0] is -Infinity"),
        ({"a b": {"when": object()}}, 'result["a b"].when is not JSON-serializable (a object)'),
        ({1: "x"}, "result has a non-string key 1; JSON object keys are strings"),
    ],
)
def test_bad_results_name_the_path(value, message):
    with pytest.raises(BadResult) as info:
        to_json(value)
    assert str(info.value) == message


# --- reading signatures without `inspect` -----------------------------------------------


def _kw_only(a: int, b: float = 1.5, *, c: str, d: bool = True) -> None: ...


def _no_hints(x, y=None): ...


@pytest.mark.parametrize(
    "func",
    [
        _kw_only,
        _no_hints,
        functools.wraps(_kw_only)(lambda *args, **kwargs: None),
        lambda: None,
    ],
)
def test_the_fast_signature_path_agrees_with_inspect(func):
    """Plain functions are read from their code object; what they report is what
    `inspect.signature` reports, and anything else goes through `inspect`."""
    spec = inspect_function(func)
    expected = [
        (p.name, p.default is inspect.Parameter.empty, None if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(func).parameters.values()
    ]
    got = [(p.name, p.required, None if p.default is EMPTY else p.default) for p in spec.params]
    assert got == expected


def test_positional_only_parameters_are_still_refused():
    def f(a: int, /, b: int) -> int:
        return a + b

    with pytest.raises(UnsupportedType) as info:
        inspect_function(f)
    assert str(info.value) == (
        "function 'f': parameter 'a' is positional-only; tool parameters must be passable by keyword"
    )


def test_records_are_immutable_comparable_and_replaceable():
    number = parse_type(float)
    field_ = Field("spot", number, True)
    assert (field_.default, field_.description) == (EMPTY, None)
    assert field_ == Field("spot", number, True, EMPTY, None)
    assert field_.replace(description="Spot price.") == Field("spot", number, True, description="Spot price.")
    assert field_.description is None, "replace makes a copy"
    with pytest.raises(AttributeError):
        field_.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Field("spot")
    assert "name='spot'" in repr(field_)
