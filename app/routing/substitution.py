"""Cost-safe model substitution: which providers may answer a request for a model, and with what.

A provider that does not serve the chosen model (picked by an intent rule or by the caller) would
answer with its ``default_model``. Left unchecked that silently multiplies cost: a coding prompt
picks deepseek-chat-v3.2 ($0.70 per M blended), the fallback side serves only gpt-4.1 and
gemini-2.5-flash, and gpt-4.1 ($10 per M blended, 14x) answers. ``[routing.substitution]`` in
``gateway.toml`` makes the choice explicit:

* ``mode = "route"`` (default): a substitute costing at most ``max_price_factor`` times the chosen
  model's price may answer (the request is flagged ``substituted``); a dearer one is not used: the
  request moves to the other configured provider when that one serves the model within the factor,
  and is refused otherwise.
* ``mode = "substitute"``: the same price limit, but a request never leaves its canary side's
  providers; what cannot be served within the factor there is refused.
* ``mode = "refuse"``: no substitution at all; a provider that does not serve the model is not used.

Prices are "blended": USD per million input tokens plus USD per million output tokens, from the
catalog (``app/data/models.toml``), compared exactly in :class:`~decimal.Decimal`. The same rule
drops a failure-fallback route whose substitute is too dear: the request then fails on its own side
rather than being answered at many times the price.

Everything here is a plain function of its inputs (the model, the planned routes, what each provider
serves, the policy); :class:`app.routing.io.client.RoutingClient` performs what it decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from app import catalog
from app.config import ProviderConfig
from core.errors import InvalidRequest

Mode = Literal["route", "substitute", "refuse"]
MODES: tuple[Mode, ...] = ("route", "substitute", "refuse")
POLICY_KEY = "routing.substitution"
INFINITE = Decimal("Infinity")


class SubstitutionRefused(InvalidRequest):
    """No configured provider can answer the chosen model within the substitution policy; raised
    while planning, before any network call."""

    def __init__(self, model: str, message: str):
        self.model = model
        super().__init__(message)


@dataclass(frozen=True)
class Offer:
    """What one provider serves (the part of its configuration this policy reads)."""

    models: frozenset[str]
    default_model: str


def chat_offers(providers: Mapping[str, ProviderConfig]) -> dict[str, Offer]:
    """What each provider offers a chat request: its chat models (an embedding model never
    substitutes for chat) and its default model."""
    known = catalog.models()
    return {
        name: Offer(frozenset(m for m in p.models if m in known and known[m].kind == "chat"), p.default_model)
        for name, p in providers.items()
    }


@dataclass(frozen=True)
class Policy:
    mode: Mode = "route"
    max_price_factor: Decimal = Decimal("1.5")

    @classmethod
    def of(cls, mode: Mode, max_price_factor: float) -> Policy:
        """From the configuration's float (``inf`` allowed), exactly as written in the file."""
        return cls(mode, Decimal(str(max_price_factor)))


@dataclass(frozen=True)
class Served:
    """How one provider would answer the chosen model, and whether the policy lets it."""

    provider: str
    model: str  # the model it would answer with
    substituted: bool
    factor: Decimal  # price of ``model`` over the chosen model's (1 when not substituted)
    allowed: bool


@dataclass(frozen=True)
class RouteDecision:
    routes: list[tuple[str, bool]]  # (provider, is a failure-fallback route), in order
    rerouted: bool  # the first route is not the canary side's own provider
    dropped: list[Served]  # planned routes left out because the policy forbids them


def blended_price(model: str) -> Decimal:
    """USD per million input tokens plus per million output tokens, from the catalog."""
    info = catalog.get(model)
    return info.input + info.output


def price_factor(chosen: str, substitute: str, price: Callable[[str], Decimal] = blended_price) -> Decimal:
    """How many times the chosen model's price the substitute costs (exact; a free chosen model
    makes any paid substitute infinitely dearer)."""
    base, other = price(chosen), price(substitute)
    if base == 0:
        return Decimal(1) if other == 0 else INFINITE
    return other / base


def model_on(offer: Offer, model: str) -> tuple[str, bool]:
    """The model a provider answers with, and whether that is a substitution."""
    return (model, False) if model in offer.models else (offer.default_model, True)


def served(
    provider: str, offer: Offer, model: str, policy: Policy, price: Callable[[str], Decimal] = blended_price
) -> Served:
    answer, substituted = model_on(offer, model)
    if not substituted:
        return Served(provider, answer, False, Decimal(1), True)
    factor = price_factor(model, answer, price)
    allowed = policy.mode != "refuse" and factor <= policy.max_price_factor
    return Served(provider, answer, True, factor, allowed)


def decide(
    model: str,
    routes: Sequence[tuple[str, bool]],
    offers: Mapping[str, Offer],
    policy: Policy,
    *,
    alternatives: Sequence[str] = (),
    forced: bool = False,
    by_intent: bool = False,
    price: Callable[[str], Decimal] = blended_price,
) -> RouteDecision:
    """The routes a request for ``model`` may take under ``policy``.

    ``routes`` is the canary plan (the side's provider first, then any failure fallback);
    ``alternatives`` are the other configured providers a ``"route"`` policy may move the request
    to when the side's provider cannot answer within the policy; ``forced`` (a caller pinned the
    side) forbids moving. ``by_intent``: an intent rule picked the model, not the caller; when no
    provider in ``offers`` serves it at all, the rule's choice cannot be honoured anywhere and the
    planned routes answer with their defaults (flagged), except under ``"refuse"``. Raises
    :class:`SubstitutionRefused` when no route is left.
    """
    if not routes:
        raise ValueError("decide() needs at least one planned route")
    if by_intent and policy.mode != "refuse" and not any(model in o.models for o in offers.values()):
        return RouteDecision(list(routes), rerouted=False, dropped=[])
    verdicts = [served(p, offers[p], model, policy, price) for p, _ in routes]
    kept = [route for route, v in zip(routes, verdicts, strict=True) if v.allowed]
    dropped = [v for v in verdicts if not v.allowed]
    if verdicts[0].allowed:
        return RouteDecision(kept, rerouted=False, dropped=dropped)
    if policy.mode == "route" and not forced:
        planned = {p for p, _ in routes}
        extra = [served(a, offers[a], model, policy, price) for a in alternatives if a not in planned]
        dropped += [v for v in extra if not v.allowed]
        able = [v.provider for v in (*verdicts[1:], *extra) if v.allowed]
        if able:
            # The provider that can answer becomes the request's own route, not a failure fallback;
            # planned fallbacks that are still allowed stay behind it.
            rest = [(p, True) for p, _ in kept if p != able[0]]
            return RouteDecision([(able[0], False), *rest], rerouted=True, dropped=dropped)
    raise SubstitutionRefused(model, _refusal(model, verdicts[0], dropped, policy, forced, offers))


def _refusal(
    model: str, first: Served, dropped: Sequence[Served], policy: Policy, forced: bool, offers: Mapping[str, Offer]
) -> str:
    def why(v: Served) -> str:
        if policy.mode == "refuse":
            return f"{v.provider} does not serve it"
        return f"{v.provider} would answer with {v.model} at {_factor_text(v.factor)} the price"

    seen: dict[str, Served] = {first.provider: first}
    for v in dropped:
        seen.setdefault(v.provider, v)
    reasons = "; ".join(why(v) for v in seen.values())
    if policy.mode == "refuse":
        rule = f'{POLICY_KEY}.mode = "refuse" allows no substitute'
    else:
        rule = (
            f'{POLICY_KEY} (mode = "{policy.mode}") allows a substitute at most '
            f"{_factor_text(policy.max_price_factor)} the price of {model}"
        )
    where = " (the route was pinned by the caller)" if forced else ""
    own = offers[first.provider]
    fix = (
        f"Fix: choose a model {first.provider} serves ({', '.join(sorted(own.models))}), "
        f"add {model} to providers.{first.provider}.models, or change {POLICY_KEY}"
    )
    return f"model {model} refused by the substitution policy{where}: {reasons}; {rule}. {fix}."


def _factor_text(factor: Decimal) -> str:
    if factor == INFINITE:
        return "any multiple of"
    return f"{factor:.2f}".rstrip("0").rstrip(".") + "x"
