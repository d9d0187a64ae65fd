"""The SDK's shapes of the core's plain data (app.routing.io.sdk): an UpstreamRequest as the SDK's
request options, answers and chunks as the SDK's types, and ChatResult's SDK view."""

from __future__ import annotations

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from app.routing.core import UpstreamRequest
from app.routing.io.sdk import sdk_answer, sdk_chunk, sdk_options
from app.routing.result import ChatResult, Usage


def test_request_options_carry_the_timeout_the_bearer_key_and_only_headers_sent() -> None:
    bare = sdk_options(UpstreamRequest("POST", "/chat/completions", {}, {"model": "m"}, 2.5))
    assert bare == {"timeout": 2.5, "security": {"bearer_auth": True}}
    hinted = sdk_options(UpstreamRequest("POST", "/chat/completions", {"x-session-id": "s"}, {}, 1.0))
    assert hinted["headers"] == {"x-session-id": "s"}


def test_an_answer_the_schema_refuses_is_still_built() -> None:
    good = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": []}
    assert isinstance(sdk_answer("chat", good), ChatCompletion)
    odd = sdk_answer("chat", {"id": "c", "choices": "not a list"})
    assert isinstance(odd, ChatCompletion) and odd.choices == "not a list"


def test_a_chunk_is_the_sdks_chunk_type() -> None:
    chunk = sdk_chunk("chat", {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}}]})
    assert isinstance(chunk, ChatCompletionChunk)


def test_a_result_built_by_the_core_gets_its_sdk_view() -> None:
    raw = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": []}
    result = ChatResult("", "p", "m", "m", "explicit", "primary", False, 1, 1.0, None, Usage(), 0.0, "r", raw=raw)
    assert isinstance(result.completion, ChatCompletion) and result.completion.id == "c"
