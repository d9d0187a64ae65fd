"""The playground's tool and structured-output modes: a sample tool to offer, the response formats
an operator can ask for, and how an answer that is a tool call or JSON is shown (as data, never as
HTML or markdown).

Plain data in and out, so the page stays a description of the UI and this is tested without
Streamlit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: A tool the playground can offer the model: ask "what's the weather in Paris?" to see a call.
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}

#: A JSON schema the playground can ask the answer to follow.
TRIAGE_SCHEMA: dict[str, Any] = {
    "name": "incident_triage",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {
            "summary": {"type": "string"},
            "severity": {"type": "string", "enum": ["low", "medium", "high", "critical"]},
            "actions": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["summary", "severity", "actions"],
        "additionalProperties": False,
    },
}

FORMATS = ("Text", "JSON object", "JSON schema (incident triage)")


def chat_params(*, offer_tool: bool, response_format: str) -> dict[str, Any]:
    """The chat parameters for the playground's choices (sent as given, through the router)."""
    if response_format not in FORMATS:
        raise ValueError(f"unknown response format {response_format!r}; choose one of {', '.join(FORMATS)}")
    params: dict[str, Any] = {}
    if offer_tool:
        params["tools"] = [WEATHER_TOOL]
        params["tool_choice"] = "auto"
    if response_format == FORMATS[1]:
        params["response_format"] = {"type": "json_object"}
    elif response_format == FORMATS[2]:
        params["response_format"] = {"type": "json_schema", "json_schema": TRIAGE_SCHEMA}
    return params


@dataclass(frozen=True)
class ToolCallView:
    name: str
    arguments: Any  # the parsed JSON arguments, or the raw text when they are not JSON
    valid_json: bool


@dataclass(frozen=True)
class StructuredView:
    """What of an answer to show as data: its tool calls, and its text parsed as JSON when the
    caller asked for JSON (``json_error`` says why it is not, when it is not)."""

    tool_calls: list[ToolCallView]
    data: Any = None
    json_error: str | None = None


def structured_view(result: dict, *, wanted_json: bool) -> StructuredView:
    """From a result's ``to_dict()``: its tool calls, and its JSON when ``wanted_json``."""
    calls = []
    for call in result.get("tool_calls") or []:
        fn = call.get("function") or {}
        raw = fn.get("arguments") or ""
        try:
            args, ok = json.loads(raw), True
        except ValueError:
            args, ok = raw, False
        calls.append(ToolCallView(str(fn.get("name") or "?"), args, ok))
    if not wanted_json or calls:
        return StructuredView(calls)
    text = result.get("text") or ""
    try:
        return StructuredView(calls, data=json.loads(text))
    except json.JSONDecodeError as exc:
        return StructuredView(calls, json_error=f"the answer is not valid JSON ({exc.msg} at character {exc.pos})")
