"""A routed chat's result: a stream's text and assembled answer are computed when first read."""

from __future__ import annotations

import dataclasses

from app.routing.result import ChatResult, Deferred, Usage


def _result(text, raw=None) -> ChatResult:
    return ChatResult(text, "p", "m", "m", "explicit", "primary", False, 1, 1.0, None, Usage(), 0.0, "r", raw=raw)


def test_a_deferred_text_and_answer_are_computed_once_when_first_read() -> None:
    calls: list[str] = []

    def text() -> str:
        calls.append("text")
        return "hello"

    def raw() -> dict:
        calls.append("raw")
        return {"id": "x"}

    result = _result(Deferred(text), Deferred(raw))
    assert calls == []
    assert result.text == "hello" and result.text == "hello"
    assert result.raw == {"id": "x"} and result.raw == {"id": "x"}
    assert calls == ["text", "raw"]


def test_plain_values_read_as_before_and_the_result_stays_frozen() -> None:
    result = _result("hi", {"a": 1})
    assert (result.text, result.raw) == ("hi", {"a": 1})
    assert _result("hi").raw is None
    try:
        result.text = "other"  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a ChatResult must stay frozen")
    assert dataclasses.replace(result, text="x").text == "x"
    assert result.to_dict()["text"] == "hi"


def test_a_deferred_result_equals_and_prints_as_its_values() -> None:
    lazy = _result(Deferred(lambda: "hi"))
    assert lazy == _result("hi")
    assert "text='hi'" in repr(lazy)
