"""A deterministic value that satisfies a JSON schema: the simulator's structured output and tool
arguments.

Covers what structured outputs and function parameters use: ``type`` (one or a list), ``enum``,
``const``, ``default``, objects (``properties``, ``required``, ``additionalProperties``,
``minProperties``), arrays (``items``, ``prefixItems``, ``minItems``/``maxItems``,
``uniqueItems``), string lengths, formats and simple ``pattern``s, number bounds and
``multipleOf``, ``anyOf``/``oneOf`` (the first branch), ``allOf`` (merged), and ``$ref`` into
``$defs``/``definitions``. The same schema always gives the same value. A ``hint`` callback can
supply a property's value (e.g. taken from the prompt); it is used only when it fits the schema.
Sizes are bounded so a hostile schema cannot make a huge answer: :class:`SchemaError` instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeGuard

__all__ = ["NO_HINT", "Hint", "SchemaError", "value_for_schema"]

MAX_ITEMS = 100
MAX_STRING = 4096
MAX_NODES = 20_000
MAX_TOTAL_CHARS = 1_000_000  # of all generated strings together
# Deeper than this, only required properties are generated and arrays stay at their minimum, so
# recursive schemas ($ref cycles) end.
_OPTIONAL_DEPTH = 4
_MAX_DEPTH = 64

NO_HINT = object()
Hint = Callable[[str, Mapping[str, Any]], Any]

_FORMATS = {
    "date-time": "2025-01-01T00:00:00Z",
    "date": "2025-01-01",
    "time": "00:00:00Z",
    "duration": "P1D",
    "email": "sim@example.com",
    "idn-email": "sim@example.com",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uri": "https://example.com/sim",
    "iri": "https://example.com/sim",
    "uri-reference": "https://example.com/sim",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "regex": "sim",
    "json-pointer": "/sim",
}
_TYPE_ORDER = ("object", "array", "string", "integer", "number", "boolean", "null")


class SchemaError(ValueError):
    """The schema cannot be served: malformed, unsatisfiable here, or too large."""


def value_for_schema(schema: Any, *, hint: Hint | None = None) -> Any:
    """A value valid under ``schema`` (a JSON schema as parsed JSON)."""
    if not isinstance(schema, (Mapping, bool)):
        raise SchemaError("a schema must be an object")
    return _Generator(schema, hint).value(schema, depth=0, variant=0)


class _Generator:
    def __init__(self, root: Any, hint: Hint | None) -> None:
        self.root = root
        self.hint = hint
        self.nodes = 0
        self.chars = 0

    # ---- dispatch -----------------------------------------------------------------------

    def value(self, schema: Any, *, depth: int, variant: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > _MAX_DEPTH:
            raise SchemaError("the schema is too large or too deeply nested")
        if schema is True:
            return "sim"
        if schema is False:
            raise SchemaError("the schema 'false' accepts no value")
        if not isinstance(schema, Mapping):
            raise SchemaError("a schema must be an object")
        schema = self.resolve(schema, depth)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list):
            if not enum:
                raise SchemaError("an empty 'enum' accepts no value")
            return enum[variant % len(enum)]
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                merged = {k: v for k, v in schema.items() if k != key}
                return self.value(_merge(merged, branches[0]), depth=depth + 1, variant=variant)
        if "default" in schema and variant == 0:
            return schema["default"]
        kind = self.kind(schema)
        if kind == "object":
            return self.object_value(schema, depth, variant)
        if kind == "array":
            return self.array_value(schema, depth, variant)
        if kind == "string":
            return self.string_value(schema, variant)
        if kind == "integer":
            return self.number_value(schema, variant, integer=True)
        if kind == "number":
            return self.number_value(schema, variant, integer=False)
        if kind == "boolean":
            return variant % 2 == 0
        return None

    def resolve(self, schema: Mapping[str, Any], depth: int) -> Mapping[str, Any]:
        """``schema`` with its ``$ref`` and ``allOf`` folded in."""
        for _ in range(_MAX_DEPTH):
            ref = schema.get("$ref")
            all_of = schema.get("allOf")
            if isinstance(ref, str):
                target = self.lookup(ref)
                rest = {k: v for k, v in schema.items() if k != "$ref"}
                schema = _merge(rest, target) if rest else target
            elif isinstance(all_of, list) and all_of:
                merged: Mapping[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
                for part in all_of:
                    if isinstance(part, Mapping):
                        merged = _merge(merged, self.resolve(part, depth + 1))
                schema = merged
            else:
                return schema
        raise SchemaError("the schema's $ref chain does not end")

    def lookup(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#"):
            raise SchemaError(f"only local $ref targets are supported, not {ref!r}")
        node: Any = self.root
        for raw in ref[1:].split("/")[1:] if ref != "#" else []:
            key = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                raise SchemaError(f"$ref {ref!r} points nowhere")
        if node is True:
            return {}
        if not isinstance(node, Mapping):
            raise SchemaError(f"$ref {ref!r} is not a schema")
        return node

    def kind(self, schema: Mapping[str, Any]) -> str:
        declared = schema.get("type")
        if isinstance(declared, str):
            return declared
        if isinstance(declared, list) and declared:
            names = [t for t in declared if isinstance(t, str)]
            non_null = [t for t in names if t != "null"]
            ranked = sorted(non_null or names, key=lambda t: _TYPE_ORDER.index(t) if t in _TYPE_ORDER else 99)
            if ranked:
                return ranked[0]
        if any(k in schema for k in ("properties", "required", "additionalProperties", "minProperties")):
            return "object"
        if any(k in schema for k in ("items", "prefixItems", "minItems", "maxItems")):
            return "array"
        if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
            return "number"
        return "string"

    # ---- containers ---------------------------------------------------------------------

    def object_value(self, schema: Mapping[str, Any], depth: int, variant: int) -> dict[str, Any]:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = [r for r in schema.get("required") or [] if isinstance(r, str)]
        names = list(required)
        if depth < _OPTIONAL_DEPTH:
            names += [name for name in properties if name not in names]
        minimum = _count(schema.get("minProperties"), 0)
        if len(names) < minimum:
            names += [name for name in properties if name not in names][: minimum - len(names)]
        out: dict[str, Any] = {}
        for name in names:
            sub = properties.get(name, schema.get("additionalProperties", True))
            if sub is False:
                sub = True  # a required name that is not declared: any value
            out[name] = self.property_value(name, sub if isinstance(sub, (Mapping, bool)) else {}, depth, variant)
        extra = 0
        while len(out) < minimum and schema.get("additionalProperties", True) is not False:
            extra_schema = schema.get("additionalProperties", True)
            out[f"extra_{extra}"] = self.value(
                extra_schema if isinstance(extra_schema, (Mapping, bool)) else True, depth=depth + 1, variant=extra
            )
            extra += 1
            if extra > MAX_ITEMS:
                raise SchemaError("'minProperties' is too large")
        return out

    def property_value(self, name: str, schema: Mapping[str, Any] | bool, depth: int, variant: int) -> Any:
        if self.hint is not None and isinstance(schema, Mapping):
            resolved = self.resolve(schema, depth)
            hinted = self.hint(name, resolved)
            if hinted is not NO_HINT and _fits(hinted, resolved):
                return hinted
        return self.value(schema, depth=depth + 1, variant=variant)

    def array_value(self, schema: Mapping[str, Any], depth: int, variant: int) -> list[Any]:
        low = _count(schema.get("minItems"), 0)
        high = _count(schema.get("maxItems"), MAX_ITEMS)
        if low > MAX_ITEMS:
            raise SchemaError("'minItems' is too large")
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = schema.get("items", True)
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        length = max(low, len(prefix) if depth < _OPTIONAL_DEPTH else 0, 1 if depth < _OPTIONAL_DEPTH else 0)
        if items is False:
            length = min(length, len(prefix))
        length = min(length, high)
        unique = schema.get("uniqueItems") is True
        out: list[Any] = []
        for index in range(length):
            sub = prefix[index] if index < len(prefix) else items
            offset = index if unique else 0
            out.append(self.value(sub if isinstance(sub, (Mapping, bool)) else True, depth=depth + 1, variant=offset))
        return out

    # ---- scalars ------------------------------------------------------------------------

    def string_value(self, schema: Mapping[str, Any], variant: int) -> str:
        text = self._string_value(schema, variant)
        self.chars += len(text)
        if self.chars > MAX_TOTAL_CHARS:
            raise SchemaError("the schema asks for too much text")
        return text

    def _string_value(self, schema: Mapping[str, Any], variant: int) -> str:
        low = _count(schema.get("minLength"), 0)
        high = _count(schema.get("maxLength"), MAX_STRING)
        if low > MAX_STRING:
            raise SchemaError("'minLength' is too large")
        if low > high:
            raise SchemaError("'minLength' is above 'maxLength'")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            made = _from_pattern(pattern, low, variant)
            if made is not None and low <= len(made) <= high:
                return made
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in _FORMATS and variant == 0:
            text = _FORMATS[fmt]
            if low <= len(text) <= high:
                return text
        base = "sim" if variant == 0 else f"sim{variant}"
        if len(base) < low:
            base += "x" * (low - len(base))
        return base[:high] if len(base) > high else base

    def number_value(self, schema: Mapping[str, Any], variant: int, *, integer: bool) -> int | float:
        low, low_open = _bound(schema, "minimum", "exclusiveMinimum", lower=True)
        high, high_open = _bound(schema, "maximum", "exclusiveMaximum", lower=False)
        raw_step = schema.get("multipleOf")
        step: float | None = float(raw_step) if _is_number(raw_step) and raw_step > 0 else None
        if integer:
            step = step if step is not None else 1
            if step != int(step):
                # An integer multiple of a fractional step: the smallest integer multiple of it.
                step = _integer_step(step)
        candidates: list[float] = [0.0 + variant]
        if low is not None:
            candidates.append(low)
        if high is not None:
            candidates.append(high)
        for start in candidates:
            value = _fit(start, low, low_open, high, high_open, step)
            if value is not None:
                return int(value) if integer or float(value).is_integer() else value
        raise SchemaError("no number satisfies the schema's bounds")


def _merge(base: Mapping[str, Any], extra: Any) -> dict[str, Any]:
    out = dict(base)
    if not isinstance(extra, Mapping):
        return out
    for key, value in extra.items():
        if key == "properties" and isinstance(out.get(key), Mapping) and isinstance(value, Mapping):
            out[key] = {**out[key], **value}
        elif key == "required" and isinstance(out.get(key), list) and isinstance(value, list):
            out[key] = [*out[key], *(v for v in value if v not in out[key])]
        else:
            out[key] = value
    return out


def _count(value: Any, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return default
    return int(value) if value < 10**9 else 10**9


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bound(schema: Mapping[str, Any], inclusive: str, exclusive: str, *, lower: bool) -> tuple[float | None, bool]:
    bound: float | None = None
    is_open = False
    if _is_number(schema.get(inclusive)):
        bound = float(schema[inclusive])
    value = schema.get(exclusive)
    if _is_number(value):
        strict = float(value)
        if bound is None or (strict >= bound if lower else strict <= bound):
            bound, is_open = strict, True
    elif value is True and bound is not None:  # draft 4 boolean form
        is_open = True
    return bound, is_open


def _integer_step(step: float) -> int:
    for k in range(1, 1001):
        if float(step * k).is_integer():
            return int(step * k)
    raise SchemaError("'multipleOf' has no integer multiple")


def _fit(
    start: float, low: float | None, low_open: bool, high: float | None, high_open: bool, step: float | None
) -> float | None:
    def ok(v: float) -> bool:
        if low is not None and (v < low or (low_open and v == low)):
            return False
        if high is not None and (v > high or (high_open and v == high)):
            return False
        return step is None or (v / step).is_integer()

    if step is None:
        value = start
        if low is not None and (value < low or (low_open and value == low)):
            value = math.floor(low) + 1 if low_open or not float(low).is_integer() else low
            if low_open and value <= low:
                value = low + 1
        if high is not None and (value > high or (high_open and value == high)):
            value = math.ceil(high) - 1 if high_open or not float(high).is_integer() else high
        if not ok(value):
            # A narrow open interval: its midpoint.
            if low is not None and high is not None and low < high:
                value = (low + high) / 2
        return value if ok(value) else None
    # The multiples nearest ``start``, upwards then downwards (an open upper bound at ``start``).
    up, down = math.ceil(start / step), math.floor(start / step)
    for candidate in [*range(up, up + 64), *range(down, down - 64, -1)]:
        value = candidate * step
        if ok(value):
            return value
    return None


def _fits(value: Any, schema: Mapping[str, Any]) -> bool:
    """Whether a hinted value obviously satisfies ``schema`` (simple scalars only)."""
    enum = schema.get("enum")
    if isinstance(enum, list):
        return value in enum
    if "const" in schema or "anyOf" in schema or "oneOf" in schema:
        return False
    kind = schema.get("type")
    if isinstance(value, str):
        if kind != "string" or any(k in schema for k in ("pattern", "format")):
            return False
        return _count(schema.get("minLength"), 0) <= len(value) <= _count(schema.get("maxLength"), MAX_STRING)
    if isinstance(value, bool) or not _is_number(value):
        return False
    if kind == "integer" and not isinstance(value, int):
        return False
    if kind not in ("integer", "number") or "multipleOf" in schema:
        return False
    low, low_open = _bound(schema, "minimum", "exclusiveMinimum", lower=True)
    high, high_open = _bound(schema, "maximum", "exclusiveMaximum", lower=False)
    return _fit(value, low, low_open, high, high_open, None) == value


# ---- patterns: the shortest string of a simple regular expression ----------------------------

# The regular expression parser behind ``re`` (Python 3.11+), to read a pattern's structure.
from re import _parser as _sre_parse  # type: ignore[attr-defined]  # noqa: E402

_CATEGORY_CHARS = {
    "CATEGORY_DIGIT": "0",
    "CATEGORY_NOT_DIGIT": "a",
    "CATEGORY_SPACE": " ",
    "CATEGORY_NOT_SPACE": "a",
    "CATEGORY_WORD": "a",
    "CATEGORY_NOT_WORD": "-",
}


def _from_pattern(pattern: str, min_length: int, variant: int) -> str | None:
    """A string matching ``pattern`` (searched, as JSON schema does), or None when the pattern is
    beyond this small generator; the result is checked with ``re`` before it is used."""
    try:
        parsed = _sre_parse.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    for repeat_bonus in (0, 1, 2, 4, 8, 16):
        try:
            text = _emit(list(parsed), repeat_bonus + (min_length if repeat_bonus else 0), variant)
        except (_Unsupported, RecursionError):
            return None
        if compiled.search(text) and len(text) >= min_length:
            return text
    return None


class _Unsupported(Exception):
    pass


def _emit(items: Sequence[Any], bonus: int, variant: int) -> str:
    out: list[str] = []
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "NOT_LITERAL":
            out.append("a" if chr(arg) != "a" else "b")
        elif name == "ANY":
            out.append("a")
        elif name == "IN":
            out.append(_from_set(arg))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = arg
            count = low if bonus == 0 else min(max(low, bonus), high if high != _sre_parse.MAXREPEAT else low + bonus)
            piece = _emit(list(sub), bonus, variant)
            if count > MAX_STRING or len(piece) * count > MAX_STRING:
                raise _Unsupported
            out.append(piece * count)
        elif name == "SUBPATTERN":
            out.append(_emit(list(arg[-1]), bonus, variant))
        elif name == "ATOMIC_GROUP":
            out.append(_emit(list(arg), bonus, variant))
        elif name == "BRANCH":
            branches = arg[1]
            out.append(_emit(list(branches[variant % len(branches)]), bonus, variant))
        elif name == "AT":
            continue
        elif name == "CATEGORY":
            out.append(_CATEGORY_CHARS.get(str(arg), "a"))
        else:
            raise _Unsupported
    return "".join(out)


def _from_set(items: Sequence[Any]) -> str:
    negate = False
    for op, arg in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
            continue
        if negate:
            break
        if name == "LITERAL":
            return chr(arg)
        if name == "RANGE":
            return chr(arg[0])
        if name == "CATEGORY":
            return _CATEGORY_CHARS.get(str(arg), "a")
    if negate:
        excluded = "".join(chr(a) for op, a in items if str(op) == "LITERAL")
        for candidate in "aZ0_- x":
            if candidate not in excluded and re.fullmatch(_set_regex(items), candidate):
                return candidate
    raise _Unsupported


def _set_regex(items: Sequence[Any]) -> str:
    parts = []
    for op, arg in items:
        name = str(op)
        if name == "NEGATE":
            parts.append("^")
        elif name == "LITERAL":
            parts.append(re.escape(chr(arg)))
        elif name == "RANGE":
            parts.append(f"{re.escape(chr(arg[0]))}-{re.escape(chr(arg[1]))}")
        elif name == "CATEGORY":
            parts.append({"CATEGORY_DIGIT": r"\d", "CATEGORY_SPACE": r"\s", "CATEGORY_WORD": r"\w"}.get(str(arg), ""))
    return "[" + "".join(parts) + "]"
