"""The simulator's pure generators: values for JSON schemas (property-tested against the
``jsonschema`` validator), which tools a prompt asks for, and their arguments."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.simulator.schema_values import NO_HINT, SchemaError, value_for_schema
from app.simulator.tools import FunctionTool, arguments_for, choose_tools
from tests.support.examples import examples

VALIDATOR = jsonschema.Draft202012Validator


def assert_valid(value: Any, schema: dict) -> None:
    VALIDATOR(schema, format_checker=VALIDATOR.FORMAT_CHECKER).validate(value)


# ---- strategies: small satisfiable schemas --------------------------------------------------------

PATTERNS = [
    "^[a-z]+$",
    "^[A-Z]{3}-[0-9]{2}$",
    r"^\d{4}-\d{2}$",
    "^(foo|bar)baz$",
    "abc",
    "^[^@]+@[^@]+$",
    "^x*y?z+$",
    r"^\w{2,5}$",
    "^[0-9a-f]{8}$",
]
FORMATS = ["date-time", "date", "email", "uuid", "ipv4", "ipv6", "uri", "hostname"]
NAMES = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(alphabet="xyz", max_size=3))


@st.composite
def string_schemas(draw: st.DrawFn) -> dict:
    kind = draw(st.sampled_from(["plain", "pattern", "format"]))
    if kind == "pattern":
        return {"type": "string", "pattern": draw(st.sampled_from(PATTERNS))}
    if kind == "format":
        return {"type": "string", "format": draw(st.sampled_from(FORMATS))}
    schema: dict = {"type": "string"}
    low = draw(st.integers(0, 6))
    if draw(st.booleans()):
        schema["minLength"] = low
    if draw(st.booleans()):
        schema["maxLength"] = low + draw(st.integers(0, 4))
    return schema


@st.composite
def number_schemas(draw: st.DrawFn) -> dict:
    integer = draw(st.booleans())
    schema: dict = {"type": "integer" if integer else "number"}
    low = draw(st.integers(-50, 50))
    step = draw(st.sampled_from([None, 1, 2, 5] if integer else [None, 0.5, 0.25, 2]))
    gap = draw(st.integers(2, 20)) + (2 * step if step else 0)
    if draw(st.booleans()):
        schema["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
    if draw(st.booleans()):
        schema["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = low + gap
    if step is not None:
        schema["multipleOf"] = step
    return schema


LEAVES = st.one_of(
    string_schemas(),
    number_schemas(),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.just({"type": ["string", "null"]}),
    st.lists(SCALARS, min_size=1, max_size=4, unique_by=lambda v: json.dumps(v)).map(lambda e: {"enum": e}),
    SCALARS.map(lambda c: {"const": c}),
)


def composites(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    @st.composite
    def objects(draw: st.DrawFn) -> dict:
        properties = draw(st.dictionaries(NAMES, children, max_size=4))
        required = draw(st.lists(st.sampled_from(sorted(properties)), unique=True)) if properties else []
        schema: dict = {"type": "object", "properties": properties, "required": required}
        closed = draw(st.sampled_from([None, False, True]))
        if closed is not None:
            schema["additionalProperties"] = closed
        if properties and draw(st.booleans()):
            schema["minProperties"] = draw(st.integers(0, len(properties)))
        return schema

    @st.composite
    def arrays(draw: st.DrawFn) -> dict:
        unique = draw(st.booleans())
        items = draw(st.sampled_from([{"type": "string"}, {"type": "integer"}])) if unique else draw(children)
        low = draw(st.integers(0, 3))
        schema: dict = {"type": "array", "items": items, "minItems": low}
        if draw(st.booleans()):
            schema["maxItems"] = low + draw(st.integers(0, 2))
        if unique:
            schema["uniqueItems"] = True
        return schema

    one_of = st.tuples(string_schemas(), st.just({"type": "integer"})).map(lambda b: {"oneOf": list(b)})
    any_of = st.lists(children, min_size=1, max_size=3).map(lambda b: {"anyOf": b})
    return st.one_of(objects(), arrays(), one_of, any_of)


SCHEMAS = st.recursive(LEAVES, composites, max_leaves=12)


@st.composite
def rooted_schemas(draw: st.DrawFn) -> dict:
    """A schema, sometimes reached through ``$defs``/``$ref`` or split over ``allOf``."""
    body = draw(SCHEMAS)
    shape = draw(st.sampled_from(["plain", "ref", "all_of"]))
    if shape == "ref":
        return {
            "type": "object",
            "properties": {"item": {"$ref": "#/$defs/item"}},
            "required": ["item"],
            "additionalProperties": False,
            "$defs": {"item": body},
        }
    if shape == "all_of":
        return {
            "allOf": [
                {"type": "object", "properties": {"a": body}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]},
            ]
        }
    return body


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rooted_schemas())
def test_generated_values_validate_against_their_schema(schema: dict) -> None:
    value = value_for_schema(schema)
    assert_valid(value, schema)
    assert value_for_schema(schema) == value  # deterministic


@settings(max_examples=examples(100), deadline=None)
@given(st.dictionaries(NAMES, LEAVES, min_size=1, max_size=5), st.text(max_size=60))
def test_hinted_values_still_validate(properties: dict, prompt: str) -> None:
    schema = {"type": "object", "properties": properties, "required": sorted(properties)}
    tool = FunctionTool("tool", "", schema)
    assert_valid(json.loads(arguments_for(tool, prompt)), schema)


# ---- generator details ----------------------------------------------------------------------------


def test_recursive_refs_end() -> None:
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["name", "children"],
            }
        },
        "$ref": "#/$defs/node",
    }
    value = value_for_schema(schema)
    assert_valid(value, schema)
    assert value["children"]  # expanded while shallow, then stopped


def test_all_properties_are_filled_when_shallow_and_defaults_are_used() -> None:
    schema = {
        "type": "object",
        "properties": {"mode": {"type": "string", "default": "fast"}, "count": {"type": "integer"}},
    }
    assert value_for_schema(schema) == {"mode": "fast", "count": 0}


@pytest.mark.parametrize(
    "schema",
    [
        False,
        {"enum": []},
        {"type": "array", "minItems": 10**6},
        {"type": "string", "minLength": 10**6},
        {"type": "string", "minLength": 5, "maxLength": 2},
        {"$ref": "#/$defs/missing"},
        {"$ref": "https://example.com/schema"},
        {"type": "integer", "minimum": 3, "maximum": 4, "multipleOf": 10},
        {"$defs": {"loop": {"$ref": "#/$defs/loop"}}, "$ref": "#/$defs/loop"},
        # Bounded output: 100 x 100 strings of 4000 characters would be 40 MB.
        {
            "type": "array",
            "minItems": 100,
            "items": {"type": "array", "minItems": 100, "items": {"type": "string", "minLength": 4000}},
        },
    ],
)
def test_schemas_that_cannot_be_served_are_schema_errors(schema: Any) -> None:
    with pytest.raises(SchemaError):
        value_for_schema(schema)


def test_a_hint_is_used_only_when_it_fits() -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 4}, "size": {"type": "integer", "maximum": 3}},
        "required": ["city", "size"],
    }

    def hint(name: str, _schema: Any) -> Any:
        return {"city": "Paris", "size": 2}.get(name, NO_HINT)

    value = value_for_schema(schema, hint=hint)
    assert value["size"] == 2
    assert value["city"] != "Paris"  # too long for maxLength 4
    assert_valid(value, schema)


# ---- tool choice ----------------------------------------------------------------------------------

WEATHER = FunctionTool(
    "get_weather",
    "Current weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
STOCKS = FunctionTool("lookupStockPrice", "Latest share price of a listed company", {"type": "object"})
SEARCH = FunctionTool("search", "", {"type": "object"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("what's the weather like in Rome?", ["get_weather"]),
        ("please get weather for me", ["get_weather"]),
        ("lookup stock price of ACME and the weather", ["lookupStockPrice", "get_weather"]),
        ("what is the latest share price of ACME?", ["lookupStockPrice"]),
        ("write a poem about the sea", []),
        ("call one of your tools", ["get_weather"]),
        ("do some research on it", []),  # "search" inside another word is no mention
        ("search for canaries", ["search"]),
    ],
)
def test_auto_calls_what_the_message_asks_for(text: str, expected: list[str]) -> None:
    chosen = choose_tools([WEATHER, STOCKS, SEARCH], "auto", parallel=True, last_user_text=text)
    assert [t.name for t in chosen] == expected


def test_modes_and_tool_results() -> None:
    tools = [WEATHER, STOCKS]
    asked = "weather and stock price please"
    assert choose_tools(tools, "none", parallel=True, last_user_text=asked) == []
    assert choose_tools(tools, "auto", parallel=False, last_user_text=asked) == [WEATHER]
    assert choose_tools(tools, "required", parallel=True, last_user_text="a poem") == [WEATHER]
    assert choose_tools(tools, "lookupStockPrice", parallel=True, last_user_text=asked) == [STOCKS]
    # After tool results (no new user turn) auto answers instead of calling again.
    assert choose_tools(tools, "auto", parallel=True, last_user_text=None) == []


def test_arguments_take_values_from_the_prompt() -> None:
    assert json.loads(arguments_for(WEATHER, "What's the weather in New York today?")) == {"city": "New York"}
    assert json.loads(arguments_for(WEATHER, 'city: "Lisbon"')) == {"city": "Lisbon"}
    tool = FunctionTool(
        "book",
        "",
        {
            "type": "object",
            "properties": {"seats": {"type": "integer", "minimum": 1}, "cabin": {"enum": ["economy", "business"]}},
            "required": ["seats", "cabin"],
        },
    )
    assert json.loads(arguments_for(tool, "book 3 seats in business class")) == {"seats": 3, "cabin": "business"}


def test_a_pattern_too_large_to_spell_out_falls_back_quickly() -> None:
    value = value_for_schema({"type": "string", "pattern": "^(a{1000}){1000}$"})
    assert isinstance(value, str) and len(value) < 10_000


def test_prompt_values_lose_their_markup() -> None:
    arguments = json.loads(arguments_for(WEATHER, 'city: "<img src=x onerror=alert(1)>[Paris](https://x)"'))
    assert not set("<>[]()") & set(arguments["city"])
    assert "Paris" in arguments["city"]
