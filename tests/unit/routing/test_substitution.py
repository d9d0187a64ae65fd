"""The cost-safe substitution policy (app.routing.substitution): prices from the catalog, the
per-provider verdict for every model pair, and the route decision for every side and mode."""

from __future__ import annotations

import itertools
from decimal import Decimal

import httpx2
import pytest
from sqlalchemy import select

from app import catalog
from app.config import ConfigError, load_settings
from app.routing import AllRoutesFailed
from app.routing.canary import assign_side
from app.routing.substitution import (
    MODES,
    Offer,
    Policy,
    SubstitutionRefused,
    blended_price,
    chat_offers,
    decide,
    model_on,
    price_factor,
    served,
)
from db.models import RequestLog
from tests.configs import one_sided_toml

MODELS = catalog.model_names()
SETTINGS = load_settings("gateway.toml", env={})
OFFERS = chat_offers(SETTINGS.providers)
P, F = SETTINGS.routing.primary, SETTINGS.routing.fallback
DEFAULT = Policy()
DS, GEM, CLAUDE, GPT = "deepseek-chat-v3.2", "gemini-2.5-flash", "claude-sonnet-4-20250514", "gpt-4.1"


def test_blended_price_is_input_plus_output_per_million_from_the_catalog():
    for name in MODELS:
        info = catalog.get(name)
        assert blended_price(name) == info.input + info.output
    assert blended_price(DS) == Decimal("0.70") and blended_price(GPT) == Decimal("10.00")


@pytest.mark.parametrize(
    ("chosen", "substitute", "factor"),
    [
        (DS, GPT, Decimal("10.00") / Decimal("0.70")),  # the incident: 14.29x
        (DS, GEM, Decimal("4")),
        (GEM, GPT, Decimal("10.00") / Decimal("2.80")),
        (GPT, CLAUDE, Decimal("1.8")),
        (CLAUDE, GPT, Decimal("10.00") / Decimal("18.00")),
        (GPT, GPT, Decimal(1)),
    ],
)
def test_price_factor_is_exact(chosen, substitute, factor):
    assert price_factor(chosen, substitute) == factor


def test_a_free_chosen_model_makes_any_paid_substitute_infinitely_dearer():
    prices = {"free": Decimal(0), "also-free": Decimal(0), "paid": Decimal("0.01")}
    assert price_factor("free", "paid", prices.__getitem__) == Decimal("Infinity")
    assert price_factor("free", "also-free", prices.__getitem__) == 1
    verdict = served(
        "p", Offer(frozenset({"paid"}), "paid"), "free", Policy("route", Decimal(1000)), prices.__getitem__
    )
    assert verdict.substituted and not verdict.allowed


@pytest.mark.parametrize(("chosen", "default"), list(itertools.product(MODELS, MODELS)))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("factor", [Decimal(1), Decimal("1.5"), Decimal(20), Decimal("Infinity")])
def test_verdict_for_every_model_pair_follows_the_price_table(chosen, default, mode, factor):
    offer = Offer(frozenset({default}), default)
    v = served("p", offer, chosen, Policy(mode, factor))
    if chosen == default:
        assert (v.model, v.substituted, v.allowed) == (chosen, False, True)
        return
    info_c, info_d = catalog.get(chosen), catalog.get(default)
    within = info_d.input + info_d.output <= factor * (info_c.input + info_c.output)
    assert (v.model, v.substituted) == (default, True)
    assert v.allowed == (mode != "refuse" and within)


def test_model_on_keeps_a_served_model_and_otherwise_names_the_default():
    assert model_on(OFFERS[F], GEM) == (GEM, False)
    assert model_on(OFFERS[F], DS) == (GPT, True)


def _routes(side: str) -> list[tuple[str, bool]]:
    return [(P, False), (F, True)] if side == "primary" else [(F, False)]


def _alternatives(side: str) -> list[str]:
    return [F] if side == "primary" else [P]


# The decision table on the default gateway.toml: (chosen model, canary side, mode) -> the routes
# taken, or "refuse". holysheep (primary) serves all four models; direct (fallback) serves gpt-4.1
# and gemini-2.5-flash and substitutes gpt-4.1 for the others.
TABLE = [
    # deepseek: direct's gpt-4.1 would cost 14.29x; the primary serves it.
    (DS, "primary", "route", [(P, False)]),
    (DS, "primary", "substitute", [(P, False)]),
    (DS, "primary", "refuse", [(P, False)]),
    (DS, "fallback", "route", [(P, False)]),  # moved to the side that serves it
    (DS, "fallback", "substitute", "refuse"),
    (DS, "fallback", "refuse", "refuse"),
    # gemini and gpt-4.1: served on both sides, nothing to decide.
    (GEM, "primary", "route", [(P, False), (F, True)]),
    (GEM, "fallback", "refuse", [(F, False)]),
    (GPT, "primary", "refuse", [(P, False), (F, True)]),
    (GPT, "fallback", "substitute", [(F, False)]),
    # claude: direct's gpt-4.1 is cheaper (0.56x), a substitution within the factor.
    (CLAUDE, "primary", "route", [(P, False), (F, True)]),
    (CLAUDE, "primary", "refuse", [(P, False)]),
    (CLAUDE, "fallback", "route", [(F, False)]),
    (CLAUDE, "fallback", "substitute", [(F, False)]),
    (CLAUDE, "fallback", "refuse", "refuse"),
]


@pytest.mark.parametrize(("model", "side", "mode", "expected"), TABLE)
def test_decision_table_on_the_default_config(model, side, mode, expected):
    policy = Policy(mode, Decimal("1.5"))
    if expected == "refuse":
        with pytest.raises(SubstitutionRefused):
            decide(model, _routes(side), OFFERS, policy, alternatives=_alternatives(side))
        return
    d = decide(model, _routes(side), OFFERS, policy, alternatives=_alternatives(side))
    assert d.routes == expected
    assert d.rerouted == (expected[0][0] != _routes(side)[0][0])


@pytest.mark.parametrize(
    ("model", "side", "mode", "forced"), list(itertools.product(MODELS, ("primary", "fallback"), MODES, (False, True)))
)
@pytest.mark.parametrize("factor", [Decimal(1), Decimal("1.5"), Decimal(5), Decimal("Infinity")])
def test_no_decision_ever_answers_above_the_factor(model, side, mode, forced, factor):
    policy = Policy(mode, factor)
    routes = [(P, False)] if forced and side == "primary" else _routes(side)
    try:
        d = decide(model, routes, OFFERS, policy, alternatives=_alternatives(side), forced=forced)
    except SubstitutionRefused as exc:
        assert "routing.substitution" in str(exc) and "Fix:" in str(exc) and model in str(exc)
        return
    assert d.routes and not d.routes[0][1]  # the request's own route is never a failure fallback
    for provider, _ in d.routes:
        v = served(provider, OFFERS[provider], model, policy)
        assert v.allowed and v.factor <= factor
        assert not (mode == "refuse" and v.substituted)
    if d.rerouted:
        assert mode == "route" and not forced
    dropped = {v.provider for v in d.dropped}
    assert dropped.isdisjoint(p for p, _ in d.routes)


def test_substitution_within_the_factor_is_kept_and_named():
    d = decide(CLAUDE, [(F, False)], OFFERS, DEFAULT, alternatives=[P])
    assert d.routes == [(F, False)] and not d.rerouted
    v = served(F, OFFERS[F], CLAUDE, DEFAULT)
    assert (v.model, v.substituted, v.allowed) == (GPT, True, True)


def test_a_too_dear_failure_fallback_is_dropped_and_reported():
    d = decide(DS, [(P, False), (F, True)], OFFERS, DEFAULT, alternatives=[F])
    assert d.routes == [(P, False)] and not d.rerouted
    assert [(v.provider, v.model) for v in d.dropped] == [(F, GPT)]


def test_a_raised_factor_allows_the_old_substitution():
    anything = Policy("route", Decimal("Infinity"))
    d = decide(DS, [(F, False)], OFFERS, anything, alternatives=[P])
    assert d.routes == [(F, False)] and not d.rerouted


def test_a_pinned_route_is_refused_with_a_message_naming_the_policy_and_the_fix():
    with pytest.raises(SubstitutionRefused) as info:
        decide(DS, [(F, False)], OFFERS, DEFAULT, alternatives=[P], forced=True)
    msg = str(info.value)
    assert info.value.model == DS and isinstance(info.value, ValueError)
    assert "pinned by the caller" in msg
    assert f"{F} would answer with {GPT} at 14.29x the price" in msg
    assert 'routing.substitution (mode = "route") allows a substitute at most 1.5x the price' in msg
    assert f"Fix: choose a model {F} serves (gemini-2.5-flash, gpt-4.1)" in msg


def test_refuse_mode_message_says_no_substitute():
    with pytest.raises(SubstitutionRefused) as info:
        decide(DS, [(F, False)], OFFERS, Policy("refuse"), alternatives=[P])
    assert f"{F} does not serve it" in str(info.value)
    assert 'routing.substitution.mode = "refuse" allows no substitute' in str(info.value)


def test_decide_needs_a_route():
    with pytest.raises(ValueError):
        decide(DS, [], OFFERS, DEFAULT)


def test_default_policy_in_the_shipped_config_is_route_at_1_5():
    sub = SETTINGS.routing.substitution
    assert (sub.mode, sub.max_price_factor) == ("route", 1.5)
    assert Policy.of(sub.mode, sub.max_price_factor) == Policy("route", Decimal("1.5"))


def _with_policy(tmp_path, body: str):
    text = one_sided_toml()
    start = text.index("[routing.substitution]")
    end = text.index("\n\n", start)
    p = tmp_path / "g.toml"
    p.write_text(text[:start] + "[routing.substitution]\n" + body + text[end:])
    return p


def test_policy_section_is_read(tmp_path):
    sub = load_settings(
        _with_policy(tmp_path, 'mode = "substitute"\nmax_price_factor = inf'), env={}
    ).routing.substitution
    assert sub.mode == "substitute"
    assert Policy.of(sub.mode, sub.max_price_factor).max_price_factor == Decimal("Infinity")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('mode = "cheapest"', "routing.substitution.mode"),
        ("max_price_factor = 0.5", "routing.substitution.max_price_factor"),
        ("max_price_factor = nan", "routing.substitution.max_price_factor"),
        ("factor = 2", "unknown key; allowed: mode, max_price_factor"),
    ],
)
def test_bad_policy_values_are_refused_at_load(tmp_path, body, needle):
    with pytest.raises(ConfigError) as info:
        load_settings(_with_policy(tmp_path, body), env={})
    assert needle in str(info.value)


GPT_ONLY = {name: Offer(frozenset({GPT}), GPT) for name in (P, F)}


def test_an_intent_model_no_provider_serves_answers_with_the_defaults():
    # A config whose providers all serve only gpt-4.1: an intent rule's gemini cannot be honoured
    # anywhere, so auto requests keep their canary routes (each answer flagged as substituted).
    d = decide(GEM, [(P, False), (F, True)], GPT_ONLY, DEFAULT, alternatives=[F], by_intent=True)
    assert d.routes == [(P, False), (F, True)] and not d.rerouted and not d.dropped
    assert served(P, GPT_ONLY[P], GEM, DEFAULT).substituted


@pytest.mark.parametrize(("by_intent", "mode"), [(False, "route"), (True, "refuse")])
def test_an_unserved_model_is_refused_when_the_caller_chose_it_or_the_mode_is_refuse(by_intent, mode):
    with pytest.raises(SubstitutionRefused):
        decide(GEM, [(P, False), (F, True)], GPT_ONLY, Policy(mode), alternatives=[F], by_intent=by_intent)


def test_an_intent_model_served_somewhere_is_held_to_the_policy():
    with pytest.raises(SubstitutionRefused):
        decide(DS, [(F, False)], OFFERS, Policy("substitute"), alternatives=[P], by_intent=True)


# -- substitution routing --------------------------------------------------------------------------
# The substitution policy end to end: through the gateway's RoutingClient on the shipped
# gateway.toml (canary ratio 0.1, holysheep serves all models, direct serves gpt-4.1 and gemini).
#
# Before the policy, ~90 % of model="auto" coding prompts landed on direct and were answered by
# gpt-4.1 at 14x deepseek's price, and an explicit deepseek request did the same.


DS, GPT = "deepseek-chat-v3.2", "gpt-4.1"
SESSIONS = [f"s-{i}" for i in range(200)]
CODING = "Write a python function that merges two sorted lists"


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def policy_toml(body: str) -> str:
    text = one_sided_toml()
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
    client = client_factory(sqlite_url, toml=one_sided_toml())
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
    safe = client_factory(sqlite_url, toml=one_sided_toml())
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
    client = client_factory(sqlite_url, toml=one_sided_toml())
    results = [client.chat(user("hi"), model=DS, session_id=s) for s in SESSIONS[:40]]
    assert {r.side for r in results} == {"primary", "fallback"}
    assert {(r.intent, r.provider, r.model, r.substituted_model) for r in results} == {
        ("explicit", "holysheep", DS, False)
    }
    assert {(req, model) for _s, _p, model, req, _sub, _fb in rows(client)} == {(DS, DS)}


def test_explicit_deepseek_pinned_to_the_fallback_side_is_refused_before_any_call(client_factory, sqlite_url):
    calls = []
    transport = httpx2.MockTransport(lambda r: calls.append(r) or httpx2.Response(500))
    client = client_factory(sqlite_url, toml=one_sided_toml(), transports={"holysheep": transport, "direct": transport})
    with pytest.raises(SubstitutionRefused) as info:
        client.chat(user("hi"), model=DS, route="fallback")
    # No call, and the request is in the log once, as the policy's refusal: the gateway's row,
    # since no provider was asked.
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
        toml=one_sided_toml().replace("[routing]\n", "[routing]\ninitial_ratio = 1.0\n", 1),
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
    client = client_factory(sqlite_url, toml=one_sided_toml())
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
    client = client_factory(sqlite_url, toml=one_sided_toml())
    results = [client.chat(user("이 방정식을 풀어줘: x^2-5x+6=0"), session_id=s) for s in SESSIONS[:40]]
    assert {r.side for r in results} == {"primary", "fallback"}
    assert {(r.intent, r.provider, r.model, r.substituted_model) for r in results} == {("math", "holysheep", DS, False)}


def test_a_refused_stream_raises_before_any_chunk(client_factory, sqlite_url):
    client = client_factory(sqlite_url, toml=one_sided_toml())
    with pytest.raises(SubstitutionRefused):
        client.chat(user(CODING), stream=True, route="fallback")
    assert refusal_classes(client) == ["refused_by_policy"]
