"""The quality of an answer as a canary analysis counts it, read cheaply from a chat completion
body (a streamed one as assembled): did the model refuse, how many tool calls carry ``arguments``
that are not valid JSON, and, when the caller asked for ``response_format: json_schema``, does the
answer parse and validate against the schema (:mod:`jsonschema`, one compiled validator per schema,
kept in a small cache).

Nothing here raises on a hostile answer: what cannot be judged (no schema, an invalid schema, a body
of another shape) is ``None`` or 0, never an exception on the request path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

VALIDATORS_KEPT = 256
MAX_SCHEMA_TEXT = 256 * 1024  # a schema larger than this is not judged (its key alone is big)


@dataclass(frozen=True, slots=True)
class AnswerQuality:
    refused: bool = False
    tool_json_bad: int = 0
    schema_bad: bool | None = None  # None: no json_schema asked for, or it could not be judged


NONE = AnswerQuality()


def requested_schema(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The JSON schema of the request's ``response_format: {type: json_schema, json_schema: {schema}}``."""
    fmt = body.get("response_format")
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
        return None
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    return schema if isinstance(schema, Mapping) else None


def _validator(schema: Mapping[str, Any]) -> Any | None:
    try:
        key = json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return _compiled(key) if len(key) <= MAX_SCHEMA_TEXT else None


@lru_cache(maxsize=VALIDATORS_KEPT)  # thread-safe; keyed by the schema's canonical text
def _compiled(key: str) -> Any | None:
    from jsonschema import validators

    schema = json.loads(key)
    try:
        cls = validators.validator_for(schema)
        cls.check_schema(schema)
        return cls(schema)
    except Exception:  # noqa: BLE001 - a schema we cannot use (SchemaError, a bad $ref) is not judged
        return None


def schema_violated(text: str | None, schema: Mapping[str, Any]) -> bool | None:
    """Whether ``text`` fails ``schema``: not JSON, or not valid; None when the schema is unusable."""
    validator = _validator(schema)
    if validator is None:
        return None
    try:
        value = json.loads(text or "")
    except (ValueError, RecursionError):
        return True
    try:
        return not validator.is_valid(value)
    except RecursionError:
        return True


def bad_tool_json(tool_calls: object) -> int:
    """Tool calls whose ``function.arguments`` is not a JSON object or value."""
    if not isinstance(tool_calls, list):
        return 0
    bad = 0
    for call in tool_calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        args = fn.get("arguments") if isinstance(fn, Mapping) else None
        if not isinstance(args, str):
            continue
        try:
            json.loads(args)
        except (ValueError, RecursionError):
            bad += 1
    return bad


def chat_quality(answer: Mapping[str, Any], request: Mapping[str, Any], *, refused: bool = False) -> AnswerQuality:
    """The quality of choice 0 of a chat completion ``answer`` to ``request``; ``refused``: a
    refusal already seen (a stream's refusal deltas)."""
    choices = answer.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else {}
    message = first.get("message")
    message = message if isinstance(message, Mapping) else {}
    refused = refused or bool(message.get("refusal")) or first.get("finish_reason") == "content_filter"
    schema = requested_schema(request)
    content = message.get("content")
    violated = None
    answered_with_tools = content is None and bool(message.get("tool_calls"))
    if schema is not None and not refused and not answered_with_tools:
        violated = schema_violated(content if isinstance(content, str) else None, schema)
    return AnswerQuality(refused=refused, tool_json_bad=bad_tool_json(message.get("tool_calls")), schema_bad=violated)
