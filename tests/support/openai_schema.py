"""Validation of what the gateway returns against the official OpenAI OpenAPI schemas.

    from tests.support.openai_schema import validate
    validate("CreateChatCompletionResponse", resp.json())      # raises SchemaError with the path
    for chunk in chunks: validate("CreateChatCompletionStreamResponse", chunk)

The schemas are the component schemas of ``openai/openai-openapi``'s ``openapi.yaml``, vendored in
``openai_openapi/schemas.json`` by ``openai_openapi/extract.py`` (which records the commit). The
document is OpenAPI 3.1, i.e. JSON Schema 2020-12, but a few schemas still write the 3.0 keyword
``nullable: true``; it is read as "or null" here. ``discriminator`` is an OpenAPI annotation that
JSON Schema ignores; the ``anyOf`` beside it decides alone. A ``ResponseStreamEvent`` is checked
against the one event schema its ``type`` names, so a mismatch reports that event's fields rather
than "matches none of 60 alternatives".
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

__all__ = ["SchemaError", "schema_names", "source", "validate"]

SCHEMAS_FILE = Path(__file__).with_name("openai_openapi") / "schemas.json"
REF_PREFIX = "#/components/schemas/"


class SchemaError(AssertionError):
    """A body that the official schema refuses; the message names the schema, the JSON path and why."""


def _nullable_as_null(node: Any) -> Any:
    """OpenAPI 3.0's ``nullable: true`` rewritten to JSON Schema: the schema, or null."""
    if isinstance(node, dict):
        out = {k: _nullable_as_null(v) for k, v in node.items() if k != "nullable"}
        if node.get("nullable") is True:
            return {"anyOf": [out, {"type": "null"}]}
        return out
    if isinstance(node, list):
        return [_nullable_as_null(v) for v in node]
    return node


@cache
def _document() -> dict[str, Any]:
    raw = json.loads(SCHEMAS_FILE.read_text())
    return {"source": raw["source"], "components": {"schemas": _nullable_as_null(raw["schemas"])}}


def source() -> dict[str, str]:
    """Where the vendored schemas come from: ``{"repo", "file", "commit", "openapi"}``."""
    return dict(_document()["source"])


def schema_names() -> list[str]:
    return sorted(_document()["components"]["schemas"])


@cache
def _validator(name: str) -> Draft202012Validator:
    schemas = _document()["components"]["schemas"]
    if name not in schemas:
        raise KeyError(f"no vendored schema {name!r} (rerun openai_openapi/extract.py with it among ROOTS)")
    root = {"$ref": REF_PREFIX + name, "components": _document()["components"]}
    return Draft202012Validator(root)


@cache
def _stream_event_schemas() -> dict[str, str]:
    """``ResponseStreamEvent``'s members by the event ``type`` each one fixes."""
    schemas = _document()["components"]["schemas"]
    by_type: dict[str, str] = {}
    for member in schemas["ResponseStreamEvent"]["anyOf"]:
        name = member["$ref"].removeprefix(REF_PREFIX)
        enum = schemas[name].get("properties", {}).get("type", {}).get("enum") or []
        for value in enum:
            by_type[value] = name
    return by_type


def _describe(error: ValidationError) -> str:
    where = error.json_path
    return f"{where}: {error.message}"


def validate(schema_name: str, obj: Any) -> None:
    """Raise :class:`SchemaError` unless ``obj`` is valid under the official schema ``schema_name``."""
    name = schema_name
    if schema_name == "ResponseStreamEvent" and isinstance(obj, dict):
        member = _stream_event_schemas().get(obj.get("type"))  # type: ignore[arg-type]
        if member is None:
            raise SchemaError(f"ResponseStreamEvent: $.type: {obj.get('type')!r} is not a Responses stream event")
        name = member
    errors = list(_validator(name).iter_errors(obj))
    if not errors:
        return
    best = best_match(errors)
    # best_match descends into anyOf/oneOf branches; the deepest relevant error is the readable one.
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    label = name if name == schema_name else f"{schema_name}/{name}"
    raise SchemaError(f"{label}: {_describe(best)}{more}")
