"""What a new canary ratio would do, before it is applied, from the last hour of traffic: per
model chosen and intent, the share of requests that moves to the other side, and how many would
be refused or answered by a substitute there under ``[routing.substitution]``.

The decision per (model, side) is the router's own (:func:`app.routing.substitution.decide`, with
the ratio's rule that a side given no traffic is never where a request is moved to); the traffic
is the last hour's final requests by model asked for, intent and side (:func:`db.monitor.request_mix`).
The split assigns sessions uniformly, so under a ratio ``r`` a share ``r`` of a group's requests
lands on the primary side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Engine

from app.config import Settings
from app.monitor.levels import chosen_model, intent_models
from app.routing.substitution import Policy, SubstitutionRefused, chat_offers, decide
from db.raw_log import request_mix

PREVIEW_WINDOW_S = 3600


@dataclass(frozen=True)
class SideOutcome:
    """What a request for one model assigned to one side gets: ``served`` by its provider,
    ``moved`` to the other provider (only it serves the model), ``substituted`` (another model
    answers), or ``refused``."""

    kind: str
    provider: str | None = None

    def text(self) -> str:
        return {
            "served": f"served by {self.provider}",
            "moved": f"moved to {self.provider} (only it serves the model)",
            "substituted": f"answered by a substitute on {self.provider}",
        }.get(self.kind, "refused by the substitution policy")


def side_outcome(settings: Settings, model: str, side: str, ratio: float, *, by_intent: bool) -> SideOutcome:
    """The router's decision for ``model`` on ``side`` at canary ``ratio``."""
    r = settings.routing
    own = r.primary if side == "primary" else r.fallback
    routes = [(own, False)]
    if side == "primary" and r.fallback_enabled and r.fallback != r.primary:
        routes.append((r.fallback, True))
    closed = {r.primary} if ratio <= 0 else {r.fallback} if ratio >= 1 else set()
    alternatives = [a for a in (r.primary, r.fallback) if a not in closed or a == own]
    offers = chat_offers(settings.providers)
    policy = Policy.of(r.substitution.mode, r.substitution.max_price_factor)
    try:
        decision = decide(model, routes, offers, policy, alternatives=alternatives, by_intent=by_intent)
    except SubstitutionRefused:
        return SideOutcome("refused")
    provider = decision.routes[0][0]
    if model not in offers[provider].models:
        return SideOutcome("substituted", provider)
    return SideOutcome("moved" if decision.rerouted else "served", provider)


def one_sided_intents(settings: Settings) -> list[tuple[str, str, str]]:
    """``(intent, model, the one side's provider)`` for each intent whose model only the primary or
    only the fallback serves: at a ratio that gives that side no traffic, its ``model: "auto"``
    requests are refused or answered by a substitute, and at any other ratio they all go there."""
    r = settings.routing
    offers = chat_offers(settings.providers)
    out = []
    for intent, model in sorted(intent_models(settings.intents).items()):
        on = [p for p in (r.primary, r.fallback) if model in offers[p].models]
        if len(on) == 1:
            out.append((intent, model, on[0]))
    return out


@dataclass(frozen=True)
class PreviewRow:
    model: str  # the model chosen (the caller's, or the intent rule's for "auto")
    intent: str
    requests: int  # final requests in the window
    moves: float  # expected requests that change side under the new ratio
    refused_now: float
    refused_after: float
    substituted_after: float
    primary: SideOutcome
    fallback: SideOutcome


@dataclass(frozen=True)
class Preview:
    old_ratio: float
    new_ratio: float
    window_s: int
    rows: tuple[PreviewRow, ...]
    one_sided: tuple[tuple[str, str, str], ...] = ()

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.rows)

    def share(self, name: str) -> float | None:
        total = self.requests
        return sum(getattr(r, name) for r in self.rows) / total if total else None

    def warning(self) -> str | None:
        """The configuration's intents that route to a model only one side serves, in words."""
        if not self.one_sided:
            return None
        listed = ", ".join(f"{i} -> {m} (only {p})" for i, m, p in self.one_sided)
        return (
            f"The intent rules choose models only one side serves: {listed}. Their requests go to that "
            "side whatever the ratio, and are refused or substituted when it gets no traffic."
        )

    def lines(self) -> list[str]:
        """The preview in words: the totals, then one line per model and intent (and the
        configuration's one-sided intents, when any)."""
        said = self.warning()
        warning = [said] if said else []
        if not self.requests:
            return [f"No requests in the last {self.window_s // 60} minutes: nothing to preview from.", *warning]
        pct = lambda v: f"{(v or 0.0) * 100:.1f} %"  # noqa: E731
        out = [
            f"From the last {self.window_s // 60} minutes ({self.requests:,} requests), "
            f"{self.old_ratio * 100:g} % -> {self.new_ratio * 100:g} %: {pct(self.share('moves'))} move to the "
            f"other side; refused {pct(self.share('refused_now'))} now -> {pct(self.share('refused_after'))}, "
            f"answered by a substitute {pct(self.share('substituted_after'))}."
        ]
        for r in self.rows:
            out.append(
                f"{r.model} ({r.intent}): {r.requests:,} requests, {r.moves:,.0f} move; "
                f"primary side: {r.primary.text()}; fallback side: {r.fallback.text()}; "
                f"refused {r.refused_now:,.0f} -> {r.refused_after:,.0f}"
            )
        return out + warning

    def table(self) -> list[dict]:
        return [
            {
                "model": r.model,
                "intent": r.intent,
                "requests": r.requests,
                "move": round(r.moves),
                "refused now": round(r.refused_now),
                "refused after": round(r.refused_after),
                "substituted after": round(r.substituted_after),
                "primary side": r.primary.text(),
                "fallback side": r.fallback.text(),
            }
            for r in self.rows
        ]


def preview(
    settings: Settings,
    mix: Mapping[tuple[str, str, str], int],
    old_ratio: float,
    new_ratio: float,
    window_s: int = PREVIEW_WINDOW_S,
) -> Preview:
    """Pure: ``mix`` is ``{(requested model, intent, side): final requests}``."""
    by_intent = intent_models(settings.intents)
    groups: dict[tuple[str, str], dict[str, int]] = {}
    auto: dict[tuple[str, str], bool] = {}
    for (requested, intent, side), n in mix.items():
        if side not in ("primary", "fallback"):
            continue  # refused at admission: no side, no ratio
        model = chosen_model(requested, intent, by_intent)
        if model is None:
            continue
        key = (model, intent)
        groups.setdefault(key, {"primary": 0, "fallback": 0})[side] += n
        auto[key] = auto.get(key, False) or requested in ("", "auto")
    rows = []
    for (model, intent), sides in sorted(groups.items()):
        n = sides["primary"] + sides["fallback"]
        now_p, now_f = (
            side_outcome(settings, model, s, old_ratio, by_intent=auto[(model, intent)])
            for s in ("primary", "fallback")
        )
        new_p, new_f = (
            side_outcome(settings, model, s, new_ratio, by_intent=auto[(model, intent)])
            for s in ("primary", "fallback")
        )
        after_p, after_f = n * new_ratio, n * (1 - new_ratio)
        rows.append(
            PreviewRow(
                model=model,
                intent=intent,
                requests=n,
                moves=abs(after_p - sides["primary"]),
                refused_now=sides["primary"] * (now_p.kind == "refused")
                + sides["fallback"] * (now_f.kind == "refused"),
                refused_after=after_p * (new_p.kind == "refused") + after_f * (new_f.kind == "refused"),
                substituted_after=after_p * (new_p.kind == "substituted") + after_f * (new_f.kind == "substituted"),
                primary=new_p,
                fallback=new_f,
            )
        )
    return Preview(old_ratio, new_ratio, window_s, tuple(rows), tuple(one_sided_intents(settings)))


def ratio_preview(engine: Engine, settings: Settings, new_ratio: float, *, now: float) -> Preview:
    """:func:`preview` of the last hour's traffic at the current ratio."""
    from db.canary import get_state

    mix = request_mix(engine, since=now - PREVIEW_WINDOW_S, until=now)
    return preview(settings, mix, get_state(engine).ratio, new_ratio)
