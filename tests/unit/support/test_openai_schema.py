"""The official-schema validator of the client tests (tests/support/openai_schema.py): known-good
bodies pass, wrong types and missing required fields fail with a readable JSON path, OpenAPI's
``nullable: true`` reads as "or null", Responses stream events are checked by their type, and the
vendored schemas name the spec commit they come from."""

from __future__ import annotations

import copy
import json
import re

import pytest

from tests.support.openai_schema import SCHEMAS_FILE, SchemaError, schema_names, source, validate

GOOD_COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1764547200,
    "model": "gpt-4.1",
    "system_fingerprint": "fp_1",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def test_known_good_completion_passes():
    validate("CreateChatCompletionResponse", GOOD_COMPLETION)


def test_wrong_typed_system_fingerprint_fails_with_its_path():
    bad = {**GOOD_COMPLETION, "system_fingerprint": 12345}
    with pytest.raises(SchemaError, match=re.escape("$.system_fingerprint: 12345 is not of type 'string'")):
        validate("CreateChatCompletionResponse", bad)


def test_null_system_fingerprint_fails():
    """The schema has no null for it: a gateway that writes ``"system_fingerprint": null`` is caught."""
    with pytest.raises(SchemaError, match=r"system_fingerprint"):
        validate("CreateChatCompletionResponse", {**GOOD_COMPLETION, "system_fingerprint": None})


def test_missing_required_field_fails_with_its_path():
    bad = copy.deepcopy(GOOD_COMPLETION)
    del bad["choices"][0]["message"]["refusal"]
    with pytest.raises(SchemaError, match=re.escape("$.choices[0].message: 'refusal' is a required property")):
        validate("CreateChatCompletionResponse", bad)
    with pytest.raises(SchemaError, match="'created' is a required property"):
        validate("CreateChatCompletionResponse", {k: v for k, v in GOOD_COMPLETION.items() if k != "created"})


def test_wrong_enum_fails():
    bad = copy.deepcopy(GOOD_COMPLETION)
    bad["choices"][0]["finish_reason"] = "done"
    with pytest.raises(SchemaError, match=re.escape("$.choices[0].finish_reason")):
        validate("CreateChatCompletionResponse", bad)


def _chunk(**choice):
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "x"}, **choice}],
    }


def test_nullable_true_reads_as_or_null():
    raw = json.loads(SCHEMAS_FILE.read_text())["schemas"]["CreateChatCompletionStreamResponse"]
    assert raw["properties"]["choices"]["items"]["properties"]["finish_reason"]["nullable"] is True
    validate("CreateChatCompletionStreamResponse", _chunk(finish_reason=None))
    validate("CreateChatCompletionStreamResponse", _chunk(finish_reason="stop", logprobs=None))
    with pytest.raises(SchemaError, match="finish_reason"):
        validate("CreateChatCompletionStreamResponse", _chunk(finish_reason=7))
    with pytest.raises(SchemaError, match="'finish_reason' is a required property"):
        validate("CreateChatCompletionStreamResponse", _chunk())


def test_stream_event_checked_against_its_own_type():
    delta = {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "delta": "Hi",
        "logprobs": [],
        "sequence_number": 3,
    }
    validate("ResponseStreamEvent", delta)
    with pytest.raises(SchemaError, match=r"ResponseTextDeltaEvent: \$: 'sequence_number' is a required property"):
        validate("ResponseStreamEvent", {k: v for k, v in delta.items() if k != "sequence_number"})
    with pytest.raises(SchemaError, match="is not a Responses stream event"):
        validate("ResponseStreamEvent", {**delta, "type": "response.made_up"})


def test_error_and_model_objects():
    validate("ErrorResponse", {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}})
    with pytest.raises(SchemaError, match="'param' is a required property"):
        validate("ErrorResponse", {"error": {"message": "m", "type": "t", "code": None}})
    validate("Model", {"id": "gpt-4.1", "object": "model", "created": 1, "owned_by": "openai"})
    with pytest.raises(SchemaError, match="'owned_by' is a required property"):
        validate("Model", {"id": "gpt-4.1", "object": "model", "created": 1})


def test_vendored_schemas_name_their_source_and_cover_the_endpoints():
    src = source()
    assert src["repo"] == "openai/openai-openapi" and src["file"] == "openapi.yaml"
    assert re.fullmatch(r"[0-9a-f]{40}", src["commit"])
    needed = {
        "CreateChatCompletionResponse",
        "CreateChatCompletionStreamResponse",
        "CreateCompletionResponse",
        "CreateEmbeddingResponse",
        "Response",
        "ResponseStreamEvent",
        "Model",
        "ListModelsResponse",
        "ErrorResponse",
    }
    assert needed <= set(schema_names())
    with pytest.raises(KeyError, match="no vendored schema"):
        validate("NoSuchSchema", {})
