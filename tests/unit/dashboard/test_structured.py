"""The playground's tool and JSON modes (app/dashboard/structured.py), without Streamlit."""

from __future__ import annotations

import pytest

from app.dashboard.structured import FORMATS, TRIAGE_SCHEMA, WEATHER_TOOL, chat_params, structured_view


def test_chat_params_for_each_choice():
    assert chat_params(offer_tool=False, response_format="Text") == {}
    assert chat_params(offer_tool=True, response_format="Text") == {"tools": [WEATHER_TOOL], "tool_choice": "auto"}
    assert chat_params(offer_tool=False, response_format=FORMATS[1]) == {"response_format": {"type": "json_object"}}
    schema = chat_params(offer_tool=False, response_format=FORMATS[2])["response_format"]
    assert schema == {"type": "json_schema", "json_schema": TRIAGE_SCHEMA}
    with pytest.raises(ValueError, match="unknown response format"):
        chat_params(offer_tool=False, response_format="<b>xml</b>")


def test_tool_calls_are_parsed_and_bad_arguments_kept_as_text():
    result = {
        "text": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "x", "arguments": "{not json"}},
        ],
    }
    view = structured_view(result, wanted_json=True)
    assert [(c.name, c.arguments, c.valid_json) for c in view.tool_calls] == [
        ("get_weather", {"city": "Paris"}, True),
        ("x", "{not json", False),
    ]
    assert view.data is None and view.json_error is None  # a tool call is not a JSON answer


def test_json_answers_parse_and_a_broken_one_says_where():
    assert structured_view({"text": '{"severity": "high"}'}, wanted_json=True).data == {"severity": "high"}
    assert structured_view({"text": '{"a": 1}'}, wanted_json=False).data is None
    bad = structured_view({"text": '{"a": '}, wanted_json=True)
    assert bad.data is None and "not valid JSON" in (bad.json_error or "") and "character 6" in bad.json_error
