"""app.routing.answers: a stream's accounting, and which chunks it may pass on unparsed.

A chunk passes as bytes only when reading it would change nothing the gateway keeps: these tests
hold every key the accounting reads to the slow path, however it is spelled, and check against
the parser that a passed chunk is the upstream's chunk with only ``model`` changed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.routing.answers import StreamAccount, chunk_text
from app.routing.errors import BadResponse
from app.routing.policy import AttemptDeadline
from core import fastjson

ROUTED = "gpt-4.1"


def _deadline() -> AttemptDeadline:
    return AttemptDeadline(lambda: 0.0, 100.0, first_token_by=50.0, idle_s=10.0)


def _chunk(content: str = "hi", **extra: object) -> dict:
    chunk: dict = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": ROUTED,
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
        "usage": None,
    }
    chunk.update(extra)
    return chunk


def _compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _started(api: str = "chat") -> StreamAccount:
    """An account past its first output (the only state in which a chunk may pass)."""
    acc = StreamAccount(api, ROUTED, 0.0, 0.0, lambda: 1.0)
    first = _chunk("") if api == "chat" else {"id": "c", "model": ROUTED, "choices": [{"index": 0, "text": "a"}]}
    if api == "chat":
        first["choices"][0]["delta"] = {"role": "assistant", "content": "a"}
    assert acc.take(first, _deadline())
    return acc


def test_nothing_passes_before_the_first_output() -> None:
    acc = StreamAccount("chat", ROUTED, 0.0, 0.0, lambda: 1.0)
    assert acc.pass_raw(_compact(_chunk("x"))) is None
    assert acc.released == 0


def test_a_plain_content_chunk_passes_as_it_is_and_counts_its_text() -> None:
    acc = _started()
    data = _compact(_chunk("wor"))
    assert acc.pass_raw(data) is data
    assert acc.pass_raw(_compact(_chunk("ld"))) is not None
    assert acc.released == 3
    assert acc.text() == "aworld"


def test_model_is_rewritten_in_place_and_nothing_else_changes() -> None:
    acc = _started()
    data = _compact(_chunk("x", model="gpt-4.1-2025-04-14"))
    out = acc.pass_raw(data)
    assert out is not None
    assert json.loads(out) == _chunk("x")
    assert out == data.replace(b'"gpt-4.1-2025-04-14"', b'"gpt-4.1"')


@pytest.mark.parametrize(
    "data",
    [
        _compact(_chunk("x", choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])),
        _compact(_chunk("x", usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3})),
        _compact(
            _chunk(
                "x",
                choices=[{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}],
            )
        ),
        _compact(_chunk("x", choices=[{"index": 0, "delta": {"refusal": "no"}, "finish_reason": None}])),
        _compact(_chunk("x", choices=[{"index": 0, "delta": {"function_call": {"name": "f"}}}])),
        _compact(_chunk("x", choices=[{"index": 0, "delta": {"audio": {"id": "a"}}, "finish_reason": None}])),
        _compact({"error": {"message": "overloaded"}}),
        # a key spelled with an escape would hide from a byte match
        _compact(_chunk("x")).replace(b'"usage"', b'"\\u0075sage"'),
        # not one JSON object, or not UTF-8
        b"[1,2]",
        b'{"choices":[]',
        _compact(_chunk("x")).replace(b'"x"', b'"\xff\xfe"'),
        # a model nested before the top-level one, or one the parser must read
        b'{"meta":{"model":"a"},"model":"b","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}',
        _compact(_chunk("x", model='a"b')),
        _compact(_chunk("x")).replace(b'"model":"gpt-4.1"', b'"model": "other"'),
    ],
    ids=[
        "finish",
        "usage",
        "tool_calls",
        "refusal",
        "function_call",
        "audio",
        "error",
        "escaped-key",
        "array",
        "unterminated",
        "not-utf8",
        "nested-model",
        "escaped-model",
        "spaced-model",
    ],
)
def test_a_chunk_the_accounting_reads_never_passes(data: bytes) -> None:
    acc = _started()
    assert acc.pass_raw(data) is None
    assert acc.released == 1


@pytest.mark.parametrize(
    "data",
    [
        json.dumps(_chunk("x")).encode(),  # spaced, as Python's json writes it
        # a finish reason at the top level, which no chunk of the API has and nothing reads
        _compact(_chunk("x"))[:-1] + b',"finish_reason":"stop"}',
        # a key twice: the last one is the value, for orjson, the slow path and the caller's parser
        _compact(_chunk("x")).replace(b'"finish_reason":null', b'"finish_reason":"stop","finish_reason":null'),
    ],
    ids=["spaced", "top-level-finish", "duplicate-key"],
)
def test_a_chunk_is_judged_by_what_the_parser_reads_not_by_its_spelling(data: bytes) -> None:
    fast, slow = _started(), _started()
    out = fast.pass_raw(data)
    assert out is data
    taken = slow.take(json.loads(data), _deadline())
    assert (slow.finish, slow.usage, slow.tool_calls) == (None, None, 0)
    assert json.loads(out) == taken[0]
    assert fast.text() == slow.text() == "ax"


def test_a_key_name_inside_the_text_does_not_stop_a_chunk_nor_change_its_text() -> None:
    acc = _started()
    text = 'say "tool_calls" and "finish_reason":"stop" or \\ "model":"x"'
    out = acc.pass_raw(_compact(_chunk(text)))
    assert out is not None
    assert json.loads(out) == _chunk(text)
    assert acc.text() == "a" + text


def test_a_chunk_that_is_not_json_goes_the_slow_way_where_it_fails() -> None:
    acc = _started()
    bad = b'{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}],}'
    assert acc.pass_raw(bad) is None
    with pytest.raises(ValueError):
        fastjson.loads(bad)  # what the slow path reads it with
    assert acc.text() == "a"


def test_a_chunk_whose_content_is_not_text_fails_before_it_is_handed_on() -> None:
    acc = _started()
    with pytest.raises(BadResponse, match="content is int"):
        acc.pass_raw(_compact(_chunk("x")).replace(b'"content":"x"', b'"content":5'))
    assert acc.text() == "a"


@pytest.mark.parametrize("delta", [b"5", b'"x"', b"[]"])
def test_a_delta_that_is_not_an_object_fails_the_same_whether_passed_or_parsed(delta: bytes) -> None:
    raw = _compact(_chunk("x")).replace(b'{"content":"x"}', delta)
    assert raw != _compact(_chunk("x"))
    passed = _started()
    with pytest.raises(BadResponse, match="delta is"):
        passed.pass_raw(raw)
    parsed = _started()
    with pytest.raises(BadResponse, match="delta is"):
        parsed.take(json.loads(raw), _deadline())
    assert passed.text() == parsed.text() == "a"


def test_a_json_value_that_is_not_a_chunk_fails_before_it_is_handed_on() -> None:
    acc = _started()
    with pytest.raises(BadResponse, match="malformed stream chunk"):
        acc.pass_raw(b'{"choices":{"index":0},"finish_reason":null}')


def test_a_number_orjson_refuses_goes_the_slow_way() -> None:
    acc = _started()
    assert acc.pass_raw(b'{"choices":[{"index":0,"delta":{"content":"x"},"logprob":NaN}]}') is None
    assert acc.pass_raw(b'{"choices":[{"index":0,"delta":{"content":"x"},"logprob":1e400}]}') is None


def test_the_text_is_joined_once_and_grows_with_the_stream() -> None:
    acc = _started()
    assert acc.pass_raw(_compact(_chunk("b"))) is not None
    assert acc.text() == "ab"
    assert acc.pieces == ["ab"]
    assert acc.pass_raw(_compact(_chunk("c"))) is not None
    assert acc.text() == "abc"


def test_completions_chunks_pass_and_responses_events_never_do() -> None:
    acc = _started("completions")
    chunk = {"id": "c", "model": ROUTED, "choices": [{"index": 0, "text": "b", "finish_reason": None}]}
    assert acc.pass_raw(_compact(chunk)) is not None
    assert acc.text() == "ab"
    responses = StreamAccount("responses", ROUTED, 0.0, 0.0, lambda: 1.0)
    assert responses.take({"type": "response.output_text.delta", "delta": "a"}, _deadline())
    assert responses.pass_raw(b'{"type":"response.output_text.delta","delta":"b"}') is None


def test_only_choice_zero_counts_as_the_text() -> None:
    acc = _started()
    chunk = _chunk("x")
    chunk["choices"].append({"index": 1, "delta": {"content": "other"}, "finish_reason": None})
    assert acc.pass_raw(_compact(chunk)) is not None
    assert acc.text() == "ax"


# -- the pass-through agrees with the parser on any chunk ------------------------------------------
_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ['"', "\\", '"usage":null', '"tool_calls"', "}", "{", '"model":"', "\\u0041"]
)
_finish = st.sampled_from([None, "stop", "length", "tool_calls"])
_delta = st.fixed_dictionaries(
    {},
    optional={
        "content": st.none() | _text,
        "refusal": st.none() | _text,
        "role": st.just("assistant"),
        "tool_calls": st.just([{"index": 0, "function": {"arguments": "{}"}}]),
    },
)
_choice = st.fixed_dictionaries({"index": st.integers(0, 1), "delta": _delta, "finish_reason": _finish})
_chunks = st.fixed_dictionaries(
    {"choices": st.lists(_choice, max_size=2)},
    optional={
        "id": _text,
        "model": st.sampled_from([ROUTED, "gpt-4.1-2025-04-14", 'we"ird', "\u00e9"]),
        "usage": st.none() | st.just({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}),
        "error": st.just({"message": "x"}),
    },
)


@settings(max_examples=300)
@given(chunk=_chunks, ascii_only=st.booleans(), spaced=st.booleans())
def test_a_passed_chunk_is_what_the_parser_would_hand_on(chunk: dict, ascii_only: bool, spaced: bool) -> None:
    data = json.dumps(chunk, ensure_ascii=ascii_only, separators=(", ", ": ") if spaced else (",", ":")).encode()
    fast, slow = _started(), _started()
    out = fast.pass_raw(data)
    taken = slow.take(json.loads(data), _deadline())
    if out is None:
        return
    # Nothing the accounting keeps was in it: the slow path learns nothing from it either.
    assert (slow.finish, slow.usage, slow.tool_calls) == (None, None, 0)
    assert "error" not in chunk
    assert all(not c["delta"].get("refusal") for c in chunk["choices"])
    # What the caller gets is the parser's chunk (model routed), and the text is the same.
    assert json.loads(out) == taken[0]
    assert fast.text() == slow.text() == "a" + chunk_text("chat", chunk)


_plain_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\\", exclude_categories=("Cc", "Cs")), max_size=12
)  # no character json writes as a \\u escape
_KEY_NAMES = {"tool_calls", "function_call", "audio", "error", "finish_reason", "usage", "refusal", "model"}
_plain_choices = st.lists(
    st.builds(
        lambda i, t: {"index": i, "delta": {"content": t}, "finish_reason": None},
        st.integers(0, 1),
        _plain_text.filter(lambda t: t not in _KEY_NAMES),  # a value spelled like a key goes the slow way
    ),
    min_size=1,
    max_size=2,
)
# In the order upstreams write a chunk's keys (model before any nested value).
_plain_chunks = st.builds(
    lambda i, m, c: {"id": i, "object": "chat.completion.chunk", "model": m, "choices": c, "usage": None},
    st.text(alphabet="abcXYZ019-_", max_size=12),
    st.sampled_from([ROUTED, "gpt-4.1-2025-04-14", "\u00e9"]),
    _plain_choices,
)


@given(chunk=_plain_chunks)
def test_a_plain_chunk_always_passes_with_the_parsers_meaning(chunk: dict) -> None:
    fast, slow = _started(), _started()
    out = fast.pass_raw(_compact(chunk))
    assert out is not None
    assert json.loads(out) == slow.take(chunk, _deadline())[0]
    assert fast.text() == slow.text()


def test_passed_chunks_count_for_the_time_between_chunks() -> None:
    ticks = iter(range(1, 100))
    acc = StreamAccount("chat", ROUTED, 0.0, 0.0, lambda: float(next(ticks)))
    first = _chunk("a")
    assert acc.take(first, _deadline())
    for word in ("b", "c", "d"):
        assert acc.pass_raw(_compact(_chunk(word))) is not None
    assert acc.pass_raw(_compact(_chunk(""))) is not None  # no output: not a chunk of the answer's pace
    assert acc.outputs == 4 and acc.chunk_gap_ms == pytest.approx(1000.0)
