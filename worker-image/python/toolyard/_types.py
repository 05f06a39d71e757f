"""Python type hints as JSON types, shared by the function runner and the manifest generator.

`inspect_function` reads a function's signature once; each parameter's `JsonType`
both checks and converts a JSON argument (`convert`) and describes it as JSON Schema
(`schema`), so what the runner accepts and what the manifest advertises cannot drift
apart. `to_json` turns a function's result into a JSON value and rejects what JSON
cannot carry (NaN, Infinity, arbitrary objects), naming the offending path.

A tool in Job mode starts a fresh interpreter per call, which pays for every import and
class definition here: `inspect` and `dataclasses` are imported only when the function
needs them (a signature `__code__` cannot tell, a dataclass it uses), and the records below
are plain classes (a `@dataclass` costs most of a millisecond to define).
"""

from __future__ import annotations

import collections.abc
import enum
import importlib
import json
import math
import sys
import types
import typing
from typing import Any, Callable


ALL_KINDS = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})
_SCALAR_KIND = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string"}


class _Empty:
    """The marker for "no annotation" and "no default"."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EMPTY"


EMPTY: Any = _Empty()


class _Record:
    """A small immutable record: what a frozen dataclass gives, without its start-up cost.

    Subclasses name their attributes in `__slots__` (in constructor order) and their
    defaults in `_defaults`.
    """

    __slots__ = ()
    _defaults: dict[str, Any] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} arguments")
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names or key in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated argument {key!r}")
            values[key] = value
        for name in names:
            if name not in values:
                if name not in self._defaults:
                    raise TypeError(f"{type(self).__name__}: missing argument {name!r}")
                values[name] = self._defaults[name]
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def replace(self, **changes: Any) -> Any:
        """A copy with some attributes changed."""
        values = {name: getattr(self, name) for name in self.__slots__}
        values.update(changes)
        return type(self)(**values)


def _dataclasses() -> Any:
    """The `dataclasses` module if anything imported it, else None: without it no class can
    be a dataclass, and a fresh process need not import it (and `inspect` with it)."""
    return sys.modules.get("dataclasses")


def _is_dataclass(value: Any) -> bool:
    dataclasses = _dataclasses()
    return dataclasses is not None and dataclasses.is_dataclass(value)


class InvocationError(Exception):
    """The function cannot be loaded or called as a tool (bad target, import error, ...)."""


class UnsupportedType(Exception):
    """An annotation has no JSON equivalent."""


class Mismatch(Exception):
    """A JSON value does not fit a type; `problems` holds (path, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{path}: {message}" for path, message in problems))
        self.problems = problems


class InvalidArguments(Exception):
    """The arguments do not fit the signature; `messages` holds one line per problem."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages


class BadResult(Exception):
    """A result cannot be represented as JSON."""


def kind_of(value: Any) -> str:
    """The JSON kind of a value decoded by `json.loads`."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return _SCALAR_KIND.get(type(value), type(value).__name__)


def join_path(path: str, key: str | int) -> str:
    """Extend a value path: `a.b`, `a[0]`, `a["not an identifier"]`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _mismatch(path: str, expected: str, value: Any) -> Mismatch:
    return Mismatch([(path, f"expected {expected}, got {kind_of(value)}")])


def _value_text(value: Any) -> str:
    """A scalar as JSON text (shortened), anything else as its JSON kind."""
    if isinstance(value, (list, dict)):
        return kind_of(value)
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


class JsonType:
    """A Python type seen as a set of JSON values."""

    kinds: frozenset[str] = ALL_KINDS

    def describe(self) -> str:
        """A short phrase for error messages: `number`, `array`, `one of "a", "b"`."""
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        """The JSON Schema (draft 2020-12) of the accepted values."""
        raise NotImplementedError

    def convert(self, value: Any, path: str) -> Any:
        """Check a JSON value and return the Python value to pass; raise `Mismatch`."""
        raise NotImplementedError


class AnyType(JsonType):
    """`typing.Any`, `object` or no annotation: any JSON value, passed as decoded."""

    def describe(self) -> str:
        return "any value"

    def schema(self) -> dict[str, Any]:
        return {}

    def convert(self, value: Any, path: str) -> Any:
        return value


class ScalarType(JsonType):
    """str, int, float, bool and None.

    An integer is accepted for float (converted); a number with no fraction (3.0) for int,
    as JSON Schema's "integer" does; a bool is never a number.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.kinds = frozenset({"integer", "number"} if kind == "number" else {kind})

    def describe(self) -> str:
        return self.kind

    def schema(self) -> dict[str, Any]:
        return {"type": self.kind}

    def convert(self, value: Any, path: str) -> Any:
        got = kind_of(value)
        if got == self.kind:
            return value
        if self.kind == "number" and got == "integer":
            try:
                return float(value)
            except OverflowError:
                raise Mismatch([(path, "number is too large")]) from None
        if self.kind == "integer" and got == "number" and value.is_integer():
            return int(value)
        raise _mismatch(path, self.kind, value)


class ArrayType(JsonType):
    """list[T] and Sequence[T]: a JSON array, passed as a list."""

    kinds = frozenset({"array"})

    def __init__(self, items: JsonType) -> None:
        self.items = items

    def describe(self) -> str:
        return "array"

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "items": self.items.schema()}

    def convert(self, value: Any, path: str) -> Any:
        if not isinstance(value, list):
            raise _mismatch(path, "array", value)
        return _convert_items([(i, v, self.items) for i, v in enumerate(value)], path)


class TupleType(JsonType):
    """tuple[A, B] (fixed length) and tuple[T, ...]: a JSON array, passed as a tuple."""

    kinds = frozenset({"array"})

    def __init__(self, items: list[JsonType] | None, rest: JsonType | None = None) -> None:
        self.items, self.rest = items, rest

    def describe(self) -> str:
        return "array"

    def schema(self) -> dict[str, Any]:
        if self.items is None:
            return {"type": "array", "items": self.rest.schema()}
        n = len(self.items)
        if n == 0:
            return {"type": "array", "maxItems": 0}
        return {"type": "array", "prefixItems": [t.schema() for t in self.items], "minItems": n, "maxItems": n}

    def convert(self, value: Any, path: str) -> Any:
        if not isinstance(value, list):
            raise _mismatch(path, "array", value)
        if self.items is None:
            return tuple(_convert_items([(i, v, self.rest) for i, v in enumerate(value)], path))
        if len(value) != len(self.items):
            raise Mismatch([(path, f"expected an array of {len(self.items)} items, got {len(value)} items")])
        return tuple(_convert_items([(i, v, t) for i, (v, t) in enumerate(zip(value, self.items))], path))


def _convert_items(items: list[tuple[str | int, Any, JsonType]], path: str) -> list[Any]:
    """Convert (key, value, type) triples, collecting every problem before raising."""
    out, problems = [], []
    for key, item, item_type in items:
        try:
            out.append(item_type.convert(item, join_path(path, key)))
        except Mismatch as m:
            problems.extend(m.problems)
    if problems:
        raise Mismatch(problems)
    return out


class MapType(JsonType):
    """dict[str, T] and Mapping[str, T]: a JSON object with arbitrary keys."""

    kinds = frozenset({"object"})

    def __init__(self, values: JsonType) -> None:
        self.values = values

    def describe(self) -> str:
        return "object"

    def schema(self) -> dict[str, Any]:
        if isinstance(self.values, AnyType):
            return {"type": "object"}
        return {"type": "object", "additionalProperties": self.values.schema()}

    def convert(self, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _mismatch(path, "object", value)
        return dict(zip(value, _convert_items([(k, v, self.values) for k, v in value.items()], path)))


class UnionType(JsonType):
    """Union[...] and Optional[...]: the first member that accepts the value wins."""

    def __init__(self, options: list[JsonType]) -> None:
        self.options = options
        self.kinds = frozenset().union(*(o.kinds for o in options))

    def describe(self) -> str:
        return " or ".join(dict.fromkeys(o.describe() for o in self.options))

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [o.schema() for o in self.options]}

    def convert(self, value: Any, path: str) -> Any:
        failures = []
        for option in self.options:
            try:
                return option.convert(value, path)
            except Mismatch as m:
                failures.append((option, m))
        # When only one member takes this kind of value, its complaint is the precise one.
        same_kind = [m for option, m in failures if kind_of(value) in option.kinds]
        if len(same_kind) == 1:
            raise same_kind[0]
        raise _mismatch(path, self.describe(), value)


class EnumType(JsonType):
    """Literal[...] and Enum subclasses: one of a fixed set of JSON scalars."""

    def __init__(self, values: list[Any], members: list[Any] | None = None) -> None:
        self.values = values
        self.members = members if members is not None else values
        self.kinds = frozenset(kind_of(v) for v in values)

    def describe(self) -> str:
        return "one of " + ", ".join(_value_text(v) for v in self.values)

    def schema(self) -> dict[str, Any]:
        types_ = list(dict.fromkeys(kind_of(v) for v in self.values))
        return {"type": types_[0] if len(types_) == 1 else types_, "enum": list(self.values)}

    def convert(self, value: Any, path: str) -> Any:
        for candidate, member in zip(self.values, self.members):
            if kind_of(candidate) == kind_of(value) and candidate == value:
                return member
        raise Mismatch([(path, f"expected {self.describe()}, got {_value_text(value)}")])


class Field(_Record):
    """One property of an object type (or one parameter of a function):
    `Field(name, type, required, default=EMPTY, description=None)`."""

    __slots__ = ("name", "type", "required", "default", "description")
    _defaults = {"default": EMPTY, "description": None}
    name: str
    type: JsonType
    required: bool
    default: Any
    description: str | None


class ObjectType(JsonType):
    """Dataclasses and TypedDicts: a JSON object with known properties and nothing else."""

    kinds = frozenset({"object"})

    def __init__(self, name: str, fields: list[Field], build: Callable[..., Any]) -> None:
        self.name, self.fields, self.build = name, fields, build

    def describe(self) -> str:
        return "object"

    def schema(self) -> dict[str, Any]:
        return object_schema(self.fields)

    def convert(self, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _mismatch(path, "object", value)
        known = {f.name: f for f in self.fields}
        problems = [
            (join_path(path, key), f"unknown field (accepted: {', '.join(known) or 'none'})")
            for key in value
            if key not in known
        ]
        kwargs = {}
        for f in self.fields:
            if f.name not in value:
                if f.required:
                    problems.append((join_path(path, f.name), "missing required field"))
                continue
            try:
                kwargs[f.name] = f.type.convert(value[f.name], join_path(path, f.name))
            except Mismatch as m:
                problems.extend(m.problems)
        if problems:
            raise Mismatch(problems)
        return self.build(**kwargs)


def object_schema(fields: list[Field]) -> dict[str, Any]:
    """`{"type": "object", "properties", "required", "additionalProperties": false}` for fields."""
    properties = {}
    for f in fields:
        prop: dict[str, Any] = {"description": f.description} if f.description else {}
        prop.update(f.type.schema())
        if f.default is not EMPTY:
            try:
                prop["default"] = to_json(f.default, f.name)
            except BadResult:
                pass  # a default JSON cannot show is simply not advertised
        properties[f.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    required = [f.name for f in fields if f.required]
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    return schema


def type_name(tp: Any) -> str:
    """How an annotation reads in an error message."""
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__qualname__
    return repr(tp).replace("typing.", "")


def parse_type(tp: Any, _stack: tuple[type, ...] = ()) -> JsonType:
    """Map an annotation to a `JsonType`; raise `UnsupportedType` naming what has no JSON form."""
    if tp is Any or tp is object or tp is EMPTY:
        return AnyType()
    if tp is None or (isinstance(tp, type) and tp in _SCALAR_KIND):
        return ScalarType(_SCALAR_KIND[type(None) if tp is None else tp])
    if hasattr(tp, "__supertype__"):  # typing.NewType
        return parse_type(tp.__supertype__, _stack)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return parse_type(args[0], _stack)
    if origin in (typing.Union, types.UnionType):
        return UnionType([parse_type(a, _stack) for a in args])
    if origin is typing.Literal:
        if not all(isinstance(a, (str, int, bool, type(None))) and not isinstance(a, enum.Enum) for a in args):
            raise UnsupportedType(f"{type_name(tp)}: Literal values must be str, int, bool or None")
        return EnumType(list(args))
    if tp in (list, collections.abc.Sequence) or origin in (list, collections.abc.Sequence):
        return ArrayType(parse_type(args[0], _stack) if args else AnyType())
    if tp is tuple or origin is tuple:
        if tp == tuple[()]:
            return TupleType([])
        if not args or (len(args) == 2 and args[1] is Ellipsis):
            return TupleType(None, parse_type(args[0], _stack) if args else AnyType())
        return TupleType([parse_type(a, _stack) for a in args])
    if tp in (dict, collections.abc.Mapping) or origin in (dict, collections.abc.Mapping):
        if args and args[0] is not str:
            raise UnsupportedType(f"{type_name(tp)}: JSON object keys are strings, use dict[str, ...]")
        return MapType(parse_type(args[1], _stack) if args else AnyType())
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_type(tp)
    if isinstance(tp, type) and (_is_dataclass(tp) or typing.is_typeddict(tp)):
        if tp in _stack:
            raise UnsupportedType(f"{type_name(tp)}: recursive types are not supported")
        return _object_type(tp, _stack + (tp,))
    raise UnsupportedType(f"{type_name(tp)} has no JSON equivalent")


def _enum_type(cls: type[enum.Enum]) -> EnumType:
    members = list(cls)
    values = [m.value for m in members]
    if not values or not all(isinstance(v, (str, int, float, bool)) for v in values):
        raise UnsupportedType(f"{cls.__qualname__}: enum values must be str, int, float or bool")
    return EnumType(values, members)


def _object_type(cls: type, stack: tuple[type, ...]) -> ObjectType:
    try:
        hints = typing.get_type_hints(cls)
    except Exception as e:
        raise UnsupportedType(f"{cls.__qualname__}: cannot resolve type hints: {e}") from None
    from . import _docstring  # only object types need it; a fresh process per call skips the import

    docs = _docstring.parse(cls.__doc__).attributes
    fields = []
    if typing.is_typeddict(cls):
        for name in hints:
            fields.append(_field(cls, name, hints[name], name in cls.__required_keys__, EMPTY, docs, stack))
        return ObjectType(cls.__qualname__, fields, dict)
    import dataclasses  # already imported: `cls` is a dataclass

    for f in dataclasses.fields(cls):
        if not f.init:
            raise UnsupportedType(f"{cls.__qualname__}.{f.name}: init=False fields are not supported")
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = EMPTY if f.default is dataclasses.MISSING else f.default
        fields.append(_field(cls, f.name, hints[f.name], required, default, docs, stack))
    return ObjectType(cls.__qualname__, fields, cls)


def _field(cls: type, name: str, tp: Any, required: bool, default: Any, docs: dict[str, str], stack) -> Field:
    try:
        json_type = parse_type(tp, stack)
    except UnsupportedType as e:
        raise UnsupportedType(f"{cls.__qualname__}.{name}: {e}") from None
    return Field(name, json_type, required, default, docs.get(name))


class FunctionSpec(_Record):
    """What the runner and the manifest generator need to know about a function:
    `FunctionSpec(func, name, params, return_annotation)` (`EMPTY` when not annotated)."""

    __slots__ = ("func", "name", "params", "return_annotation")
    func: Callable[..., Any]
    name: str
    params: list[Field]
    return_annotation: Any


def load_function(target: str) -> Callable[..., Any]:
    """Import `module:function` (the function may be a dotted attribute path)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise InvocationError(f"expected 'module:function', got {target!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise InvocationError(f"cannot import module '{module_name}': {e}") from None
    except Exception as e:
        raise InvocationError(f"importing module '{module_name}' failed: {type(e).__name__}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvocationError(f"module '{module_name}' has no attribute '{attr}'") from None
    if not callable(obj):
        raise InvocationError(f"'{target}' is not callable")
    return obj


_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08  # code object flags: *args, **kwargs


def _plain_parameters(func: Any) -> list[tuple[str, Any, str | None]] | None:
    """(name, default, None) for each parameter of a plain Python function, read from its code
    object; None when only `inspect.signature` can tell (wrapped or partial functions,
    callable objects, builtins, `*args`, `**kwargs`, positional-only parameters)."""
    code = getattr(func, "__code__", None)
    if (
        type(func) is not types.FunctionType
        or code is None
        or not func.__dict__.keys().isdisjoint(("__wrapped__", "__signature__", "_partialmethod", "__partialmethod__"))
        or code.co_flags & (_CO_VARARGS | _CO_VARKEYWORDS)
        or code.co_posonlyargcount
    ):
        return None
    positional = code.co_argcount
    defaults = func.__defaults__ or ()
    kwdefaults = func.__kwdefaults__ or {}
    first_default = positional - len(defaults)
    params = []
    for i, name in enumerate(code.co_varnames[: positional + code.co_kwonlyargcount]):
        if i < positional:
            default = defaults[i - first_default] if i >= first_default else EMPTY
        else:
            default = kwdefaults.get(name, EMPTY)
        params.append((name, default, None))
    return params


def _signature_parameters(func: Any) -> list[tuple[str, Any, str | None]]:
    """(name, default, problem) from `inspect.signature`; the problem names a kind of
    parameter a tool cannot have (`variadic positional`, ...)."""
    import inspect

    params = []
    for p in inspect.signature(func).parameters.values():
        problem = p.kind.description if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY) else None
        params.append((p.name, EMPTY if p.default is inspect.Parameter.empty else p.default, problem))
    return params


def inspect_function(func: Callable[..., Any]) -> FunctionSpec:
    """Read the signature and type hints; raise `UnsupportedType` naming the parameter."""
    name = getattr(func, "__name__", repr(func))
    try:
        hints = typing.get_type_hints(func)
        parameters = _plain_parameters(func)
        if parameters is None:
            parameters = _signature_parameters(func)
    except Exception as e:
        raise UnsupportedType(f"function '{name}': cannot read its signature or type hints: {e}") from None
    params = []
    for param, default, problem in parameters:
        if problem is not None:
            raise UnsupportedType(
                f"function '{name}': parameter '{param}' is {problem}; tool parameters must be passable by keyword"
            )
        try:
            json_type = parse_type(hints.get(param, EMPTY))
        except UnsupportedType as e:
            raise UnsupportedType(f"function '{name}': parameter '{param}': {e}") from None
        params.append(Field(param, json_type, default is EMPTY, default))
    return FunctionSpec(func, name, params, hints.get("return", EMPTY))


def bind_arguments(spec: FunctionSpec, arguments: dict[str, Any]) -> dict[str, Any]:
    """Check JSON arguments against the signature; return keyword arguments for the call."""
    known = {p.name: p for p in spec.params}
    messages, kwargs = [], {}
    for p in spec.params:
        if p.name not in arguments:
            if p.required:
                messages.append(f"missing required argument '{p.name}'")
            continue
        try:
            kwargs[p.name] = p.type.convert(arguments[p.name], p.name)
        except Mismatch as m:
            messages.extend(f"argument '{path}': {message}" for path, message in m.problems)
    accepted = ", ".join(known) or "none"
    messages.extend(f"unknown argument '{n}' (accepted: {accepted})" for n in arguments if n not in known)
    if messages:
        raise InvalidArguments(messages)
    return kwargs


def to_json(value: Any, path: str = "result") -> Any:
    """Convert a result to plain JSON data: dataclasses to dicts, tuples to lists, enums to values."""
    if isinstance(value, enum.Enum):
        return to_json(value.value, path)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            raise BadResult(f"{path} is NaN")
        if math.isinf(value):
            raise BadResult(f"{path} is {'Infinity' if value > 0 else '-Infinity'}")
        return float(value)
    if not isinstance(value, type) and _is_dataclass(value):
        fields = _dataclasses().fields(value)
        return {f.name: to_json(getattr(value, f.name), join_path(path, f.name)) for f in fields}
    if isinstance(value, collections.abc.Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadResult(f"{path} has a non-string key {key!r}; JSON object keys are strings")
            out[key] = to_json(item, join_path(path, key))
        return out
    if isinstance(value, (list, tuple)):
        return [to_json(item, join_path(path, i)) for i, item in enumerate(value)]
    raise BadResult(f"{path} is not JSON-serializable (a {type(value).__qualname__})")
