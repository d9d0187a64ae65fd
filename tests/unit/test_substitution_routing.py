"""The substitution policy end to end: through the gateway's RoutingClient on the shipped
gateway.toml (canary ratio 0.1, holysheep serves all models, direct serves gpt-4.1 and gemini).

Before the policy, ~90 % of model="auto" coding prompts landed on direct and were answered by
gpt-4.1 at 14x deepseek's price, and an explicit deepseek request did the same."""

from __future__ import annotations

import httpx2
import pytest
from sqlalchemy import select

from app import catalog
from app.routing import AllRoutesFailed
from app.routing.canary import assign_side
from app.routing.substitution import SubstitutionRefused
from db.models import RequestLog
from tests.configs import one_sided_toml

DS, GPT = "deepseek-chat-v3.2", "gpt-4.1"
SESSIONS = [f"s-{i}" for i in range(200)]
CODING = "Write a python function that merges two sorted lists"


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


ONE_SIDED = one_sided_toml()  # coding and math pick deepseek, which only the primary serves


def policy_toml(body: str) -> str:
    text = ONE_SIDED
    start = text.index("[routing.substitution]")
    end = text.index("\n\n", start)
    return text[:start] + "[routing.substitution]\n" + body + text[end:]


def rows(client) -> list:
    client.flush()
    with client.engine.connect() as conn:
        return list(
            conn.execute(
                select(
                    RequestLog.side,
                    RequestLog.provider,
                    RequestLog.model,
                    RequestLog.requested_model,
                    RequestLog.substituted,
                    RequestLog.fallback,
                )
            )
        )


def refusal_classes(client) -> list:
    client.flush()
    with client.engine.connect() as conn:
        return [r.error_class for r in conn.execute(select(RequestLog.error_class))]


def test_auto_coding_prompts_are_answered_by_deepseek_on_every_side(client_factory, sqlite_url):
    client = client_factory(sqlite_url, toml=ONE_SIDED)
    assert client.current_ratio() == pytest.approx(0.1)
    results = [client.chat(user(CODING), session_id=s) for s in SESSIONS]
    sides = [r.side for r in results]
    # Both canary sides are exercised, the fallback side carrying most sessions.
    assert sides.count("fallback") > sides.count("primary") > 0
    assert sides == [assign_side(0.1, s) for s in SESSIONS]
    for r in results:
        assert (r.intent, r.provider, r.model, r.substituted_model) == ("coding", "holysheep", DS, False)
        assert r.cost_usd == catalog.cost_usd(
            DS, r.usage.prompt_tokens, r.usage.cached_tokens, r.usage.completion_tokens
        )
    logged = rows(client)
    assert len(logged) == len(SESSIONS)
    assert {(side, provider, model, sub) for side, provider, model, _req, sub, _fb in logged} == {
        ("primary", "holysheep", DS, False),
        ("fallback", "holysheep", DS, False),  # moved to the side that serves deepseek
    }


def test_the_old_behaviour_needs_an_explicit_unlimited_factor_and_costs_more(client_factory, sqlite_url, tmp_path):
    safe = client_factory(sqlite_url, toml=ONE_SIDED)
    unlimited = client_factory(
        f"sqlite:///{tmp_path / 'other.db'}", toml=policy_toml('mode = "substitute"\nmax_price_factor = inf')
    )
    fallback_sessions = [s for s in SESSIONS if assign_side(0.1, s) == "fallback"][:20]
    cheap = [safe.chat(user(CODING), session_id=s) for s in fallback_sessions]
    dear = [unlimited.chat(user(CODING), session_id=s) for s in fallback_sessions]
    assert {(r.provider, r.model, r.substituted_model) for r in dear} == {("direct", GPT, True)}
    assert {(r.provider, r.model, r.substituted_model) for r in cheap} == {("holysheep", DS, False)}
    assert sum(r.cost_usd for r in dear) > 5 * sum(r.cost_usd for r in cheap)


def test_substitute_mode_refuses_instead_of_leaving_the_side(client_factory, sqlite_url):
    client = client_factory(sqlite_url, toml=policy_toml('mode = "substitute"\nmax_price_factor = 1.5'))
    fallback_session = next(s for s in SESSIONS if assign_side(0.1, s) == "fallback")
    primary_session = next(s for s in SESSIONS if assign_side(0.1, s) == "primary")
    with pytest.raises(SubstitutionRefused) as info:
        client.chat(user(CODING), session_id=fallback_session)
    assert 'routing.substitution (mode = "substitute")' in str(info.value)
    assert client.chat(user(CODING), session_id=primary_session).model == DS
    assert client.chat(user("Tell me a joke"), session_id=fallback_session).provider == "direct"


def test_explicit_deepseek_is_answered_by_deepseek(client_factory, sqlite_url):
    client = client_factory(sqlite_url, toml=ONE_SIDED)
    results = [client.chat(user("hi"), model=DS, session_id=s) for s in SESSIONS[:40]]
    assert {r.side for r in results} == {"primary", "fallback"}
    assert {(r.intent, r.provider, r.model, r.substituted_model) for r in results} == {
        ("explicit", "holysheep", DS, False)
    }
    assert {(req, model) for _s, _p, model, req, _sub, _fb in rows(client)} == {(DS, DS)}


def test_explicit_deepseek_pinned_to_the_fallback_side_is_refused_before_any_call(client_factory, sqlite_url):
    calls = []
    transport = httpx2.MockTransport(lambda r: calls.append(r) or httpx2.Response(500))
    client = client_factory(sqlite_url, toml=ONE_SIDED, transports={"holysheep": transport, "direct": transport})
    with pytest.raises(SubstitutionRefused) as info:
        client.chat(user("hi"), model=DS, route="fallback")
    # No call, and the request is in the log once, as the policy's refusal (issue 17): the
    # gateway's row, since no provider was asked (issue 28).
    assert calls == [] and [r[:2] for r in rows(client)] == [("fallback", "gateway")]
    assert refusal_classes(client) == ["refused_by_policy"]
    msg = str(info.value)
    assert "direct would answer with gpt-4.1 at 14.29x the price" in msg
    assert "routing.substitution" in msg and "Fix:" in msg


def test_a_primary_failure_does_not_fall_back_to_a_model_fourteen_times_the_price(client_factory, sqlite_url):
    calls = []

    def direct(request):
        calls.append(request)
        return httpx2.Response(500)

    client = client_factory(
        sqlite_url,
        toml=ONE_SIDED.replace("[routing]\n", "[routing]\ninitial_ratio = 1.0\n", 1),
        transports={
            "holysheep": httpx2.MockTransport(lambda r: httpx2.Response(503, json={"error": {"message": "down"}})),
            "direct": httpx2.MockTransport(direct),
        },
    )
    with pytest.raises(AllRoutesFailed) as info:
        client.chat(user(CODING), session_id="s-1")
    assert calls == []
    assert {a.provider for a in info.value.attempts} == {"holysheep"}
    # gemini is served by direct: a general prompt still falls back.
    with pytest.raises(AllRoutesFailed) as info:
        client.chat(user("Tell me a joke"), session_id="s-1")
    assert [a.provider for a in info.value.attempts][-1] == "direct" and calls


def test_a_cheaper_substitute_within_the_factor_still_answers_on_the_fallback_side(client_factory, sqlite_url):
    client = client_factory(sqlite_url, toml=ONE_SIDED)
    session = next(s for s in SESSIONS if assign_side(0.1, s) == "fallback")
    r = client.chat(user("x" * 40_000), session_id=session)  # long context -> claude; direct has gpt-4.1
    assert (r.intent, r.side, r.provider, r.model, r.substituted_model) == (
        "long_context",
        "fallback",
        "direct",
        GPT,
        True,
    )
    # requested_model keeps what the caller asked for ("auto"); the intent picked Claude.
    assert [(req, model, sub) for _s, _p, model, req, sub, _fb in rows(client)] == [("auto", GPT, True)]


def test_the_korean_equation_prompt_is_math_answered_by_deepseek_on_every_side(client_factory, sqlite_url):
    client = client_factory(sqlite_url, toml=ONE_SIDED)
    results = [client.chat(user("이 방정식을 풀어줘: x^2-5x+6=0"), session_id=s) for s in SESSIONS[:40]]
    assert {r.side for r in results} == {"primary", "fallback"}
    assert {(r.intent, r.provider, r.model, r.substituted_model) for r in results} == {("math", "holysheep", DS, False)}


def test_a_refused_stream_raises_before_any_chunk(client_factory, sqlite_url):
    client = client_factory(sqlite_url, toml=ONE_SIDED)
    with pytest.raises(SubstitutionRefused):
        client.chat(user(CODING), stream=True, route="fallback")
    assert refusal_classes(client) == ["refused_by_policy"]
