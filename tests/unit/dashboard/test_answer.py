"""Playground answer metadata and failure messages (with the fix), from real routed requests."""

from __future__ import annotations

import pytest

from app.catalog import UnknownModelError
from app.config import ProviderNotConfigured
from app.dashboard.answer import answer_meta, build_messages, explain_failure
from app.display.fmt import ago, ms, pct, ratio_pct, usd
from app.routing import AllRoutesFailed, AttemptInfo, StreamBrokenError
from tests.configs import two_providers

REAL_ONLY = two_providers(primary="real", fallback="real")


def test_meta_of_a_streamed_answer(client_factory, sqlite_url):
    client = client_factory(sqlite_url)
    stream = client.chat([{"role": "user", "content": "write a python function"}], stream=True, session_id="s1")
    text = "".join(stream)
    r = stream.result
    assert text == r.text
    for meta in (answer_meta(r), answer_meta(r.to_dict())):
        assert f"{r.provider} / {r.model}" in meta.headline
        assert f"intent {r.intent}" in meta.headline and f"canary side {r.side}" in meta.headline
        assert "TTFT" in meta.timing and "total" in meta.timing
        assert (
            f"{r.usage.prompt_tokens} prompt / {r.usage.cached_tokens} cached / "
            f"{r.usage.completion_tokens} completion" in meta.tokens
        )
        assert meta.attempts[0]["status"] == "ok" and meta.request_id == r.request_id


def test_all_routes_failed_names_attempts_and_the_env_var(client_factory, sqlite_url, settings_factory, monkeypatch):
    monkeypatch.delenv("HOLYSHEEP_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    client = client_factory(sqlite_url, toml=REAL_ONLY, env={})
    with pytest.raises(AllRoutesFailed) as info:
        client.chat([{"role": "user", "content": "hi"}], route="primary")
    view = explain_failure(info.value, client.settings)
    assert view.title.startswith("All routes failed")
    assert any("holysheep" in line and "not_configured" in line for line in view.lines)
    assert "set HOLYSHEEP_API_KEY" in view.fix


def test_other_failures_have_a_fix():
    assert "one of" in explain_failure(UnknownModelError("gpt-9")).fix
    assert "OPENAI_API_KEY" in explain_failure(ProviderNotConfigured("direct", "OPENAI_API_KEY")).fix
    assert "again" in explain_failure(StreamBrokenError("cut")).fix
    assert explain_failure(ValueError("temperature must be between 0 and 2")).lines == [
        "temperature must be between 0 and 2"
    ]
    rl = AllRoutesFailed(
        "r1", [AttemptInfo(1, "direct", "gpt-4.1", "error", 5.0, "rate_limited", 429, "rate_limited 429: slow down")]
    )
    assert "429" in explain_failure(rl).fix
    odd = explain_failure(RuntimeError("boom"))
    assert "Traceback" not in odd.title + " ".join(odd.lines)


def test_build_messages_skips_empty_system_prompt():
    hist = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "meta": {}}]
    assert build_messages("  ", hist, "c") == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert build_messages("be brief", [], "c")[0] == {"role": "system", "content": "be brief"}


def test_formatting():
    assert (pct(None), pct(0.1234), ratio_pct(0.125), ratio_pct(1.0)) == ("-", "12.3 %", "12.5 %", "100 %")
    assert (ms(None), ms(12.4), ms(12_345)) == ("-", "12 ms", "12.3 s")
    assert (usd(0), usd(0.000123), usd(1.5)) == ("$0", "$0.000123", "$1.5000")
    assert ago(None, 100) == "never" and ago(50, 100) == "50 s ago" and ago(100, 1300) == "20 min ago"
