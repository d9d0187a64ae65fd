"""Intent routing, model validation and per-provider model substitution."""

from __future__ import annotations

import httpx2
import pytest

from app.catalog import UnknownModelError
from app.config import IntentConfig, load_settings
from app.routing.intent import classify

CFG = load_settings("gateway.toml", env={}).intents


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize(
    "text",
    [
        "Write a python script",
        "Can you debug this?",
        "Explain the algorithm",
        "a math question",
        "What does this function return?",
        "Review my code please",
        "Debugging a segfault",
        "이 코드를 설명해 주세요",
        "함수가 무엇인가요",
        "알고리즘 문제",
        "수학 숙제",
        "계산해 줘",
    ],
)
def test_coding_and_math_words_route_to_deepseek(text):
    d = classify(user(text), CFG)
    assert (d.intent, d.model) == ("coding", "deepseek-chat-v3.2")


@pytest.mark.parametrize("text", ["Tell me a joke", "barcode scanner tips", "오늘 날씨 어때요?"])
def test_general_prompts_route_to_gemini(text):
    d = classify(user(text), CFG)
    assert (d.intent, d.model) == ("general", "gemini-2.5-flash")


def test_long_context_threshold_is_8000_estimated_tokens():
    at = "a" * (8000 * 4)  # exactly 8,000 tokens: not over the threshold
    over = "a" * (8000 * 4 + 4)  # 8,001 tokens
    assert classify(user(at), CFG).intent == "general"
    d = classify(user(over), CFG)
    assert (d.intent, d.model) == ("long_context", "claude-sonnet-4-20250514")
    assert d.estimated_tokens == 8001


def test_long_context_wins_over_keywords():
    assert classify(user("python " * 5000), CFG).intent == "long_context"


def test_system_prompt_does_not_decide_intent():
    msgs = [{"role": "system", "content": "You are a python tutor"}, {"role": "user", "content": "hello"}]
    assert classify(msgs, CFG).intent == "general"


def test_rules_are_data_in_the_config(tmp_path):
    toml = (
        open("gateway.toml").read()
        + """
[intents]
long_context_tokens = 100
default_model = "gpt-4.1"
[[intents.rules]]
intent = "translation"
model = "gemini-2.5-flash"
keywords = ["translate", "번역"]
"""
    )
    p = tmp_path / "g.toml"
    p.write_text(toml)
    cfg = load_settings(p, env={}).intents
    assert classify(user("please translate this"), cfg).intent == "translation"
    assert classify(user("번역해 주세요"), cfg).model == "gemini-2.5-flash"
    assert classify(user("python"), cfg).model == "gpt-4.1"  # default rules replaced
    assert classify(user("x" * 404), cfg).intent == "long_context"


def test_unknown_model_refused_before_any_network_call(client_factory, sqlite_url):
    calls = []
    transport = httpx2.MockTransport(lambda r: calls.append(r) or httpx2.Response(500))
    client = client_factory(sqlite_url, transports={"holysheep": transport, "direct": transport})
    with pytest.raises(UnknownModelError) as info:
        client.chat(user("hi"), model="gpt-9")
    assert calls == []
    for name in ("deepseek-chat-v3.2", "gemini-2.5-flash", "claude-sonnet-4-20250514", "gpt-4.1"):
        assert name in str(info.value)


def test_provider_without_the_model_uses_its_default_and_records_it(client_factory, sqlite_url):
    # direct does not serve Claude; its default gpt-4.1 costs less (0.56x blended), which the
    # default substitution policy allows, flagged. (deepseek on direct, at 14x, is refused: see
    # tests/unit/test_substitution_routing.py.)
    client = client_factory(sqlite_url)
    r = client.chat(user("hi"), model="claude-sonnet-4-20250514", route="fallback")
    assert r.provider == "direct" and r.model == "gpt-4.1" and r.substituted_model
    client.flush()
    from sqlalchemy import select

    from db.models import RequestLog

    with client.engine.connect() as conn:
        row = conn.execute(select(RequestLog.model, RequestLog.requested_model, RequestLog.substituted)).one()
    assert tuple(row) == ("gpt-4.1", "claude-sonnet-4-20250514", True)


def test_intent_config_rejects_unknown_model():
    with pytest.raises(ValueError):
        IntentConfig(default_model="nope")


def test_message_text_reads_strings_and_text_parts_only():
    from core.messages import content_text, messages_text

    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {}}]},
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "here"}, {"type": "text", "text": 3}]},
    ]
    assert messages_text(msgs) == "be brief\nlook\nhere"
    assert content_text(msgs[1]["content"], sep=" ") == "look"
    assert content_text(b"raw") == "" and content_text({"text": "a mapping is not a part list"}) == ""
