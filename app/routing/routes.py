"""Routes as data: a model name callers send, served by several deployments, with a strategy,
ordered fallbacks to other routes and health per deployment. Sans I/O: clock readings, randomness
and upstream outcomes come in as plain values.

A route (``[routes."NAME"]`` in the configuration) lists deployments: a provider and the model
name sent to it, a weight, and its rate limits when known. For one request, :meth:`RouteTable.order`
puts the route's deployments in the order to try them, each with the reason it is where it is:

- ``weighted``: the first by smooth weighted round-robin, so the split is exact (3:1 weights give
  3 of every 4 requests), the rest drawn by weight; a session's order is a hash of its id, so a
  session stays on one deployment while that one is healthy;
- ``ordered``: as configured, the first healthy one takes all;
- ``least_busy``: fewest attempts in flight first;
- ``lowest_latency``: lowest moving average of latency first (a deployment never measured first,
  and with probability ``EXPLORE`` a random one, so a recovered deployment is noticed);
- ``cheapest``: lowest catalog price first.

Whatever the strategy, a deployment cooling down (``allowed_fails`` health failures in a row, then
``cooldown_s`` out) is left out, one whose prompt does not fit its context window is left out, and
one at its known ``rpm``/``tpm`` (counted here over the last minute, or told by the upstream's
``x-ratelimit-remaining-*`` headers) goes last, so it is steered around before it answers 429.

Fallbacks: when every deployment failed, the route's ``fallbacks`` in order; when the prompt fits no
deployment's window or an upstream says so, ``context_window_fallbacks``; when an upstream refuses
on content policy, ``content_policy_fallbacks`` (:func:`fallback_kind` reads which).

State (in flight, moving averages, failures in a row, the last minute's use) is per deployment and
per process. Updates are plain attribute writes: exact on the server's one event loop; from several
threads (the dashboard's sync client) a count may be off by one at worst, which only shifts a
choice.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from app import catalog
from app.config import DeploymentConfig, RouteConfig, deployment_catalog_model, deployment_model

EXPLORE = 0.05  # lowest_latency: the share of requests that try a deployment at random first
EWMA_ALPHA = 0.3  # weight of the newest latency in the moving average
MINUTE_S = 60.0

#: Where a failure sends a route's request next: the matching kind of fallbacks.
CONTEXT_WINDOW = "context_window"
CONTENT_POLICY = "content_policy"

# Lower-case text in a 4xx error (message, code, type) that says the prompt is too long for the
# model's window, or that the upstream refused on content policy (OpenAI, Azure, Anthropic's and
# Gemini's OpenAI-compatible endpoints, vLLM).
CONTEXT_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "context window",
    "prompt is too long",
    "input is too long",
    "too many tokens",
)
CONTENT_MARKERS = (
    "content_policy_violation",
    "content_filter",
    "content management policy",
    "responsibleaipolicyviolation",
    "safety system",
    "prohibited_content",
)


def fallback_kind(error_class: str, http_status: int | None, text: str) -> str | None:
    """:data:`CONTEXT_WINDOW` or :data:`CONTENT_POLICY` for a refusal of the request that another
    route may well serve (a 4xx the failure table calls the request's own fault), else None."""
    if error_class != "bad_request" or http_status is None or not 400 <= http_status < 500:
        return None
    low = text.lower()
    if any(m in low for m in CONTEXT_MARKERS):
        return CONTEXT_WINDOW
    if any(m in low for m in CONTENT_MARKERS):
        return CONTENT_POLICY
    return None


@dataclass(frozen=True)
class Deployment:
    """A route's deployment, resolved: the provider, the model sent, the catalog model it is priced
    as, its context window and blended price (USD per million input + output tokens)."""

    provider: str
    model: str
    priced_as: str
    weight: float = 1.0
    rpm: int | None = None
    tpm: int | None = None
    context_tokens: int = 1 << 30
    price: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.provider}/{self.model}"

    @property
    def limited(self) -> bool:
        """Whether it has a known rpm or tpm: only then is its last minute's use kept and read."""
        return self.rpm is not None or self.tpm is not None


@dataclass(frozen=True)
class Route:
    name: str
    strategy: str
    deployments: tuple[Deployment, ...]
    fallbacks: tuple[str, ...] = ()
    context_window_fallbacks: tuple[str, ...] = ()
    content_policy_fallbacks: tuple[str, ...] = ()
    allowed_fails: int = 3
    cooldown_s: float = 30.0
    canary: Deployment | None = None

    @property
    def every_deployment(self) -> tuple[Deployment, ...]:
        """Its deployments and its canary deployment, if it has one."""
        return (*self.deployments, *((self.canary,) if self.canary else ()))


@dataclass(frozen=True)
class Target:
    """One deployment to try for a request: where, by which route and strategy, and why there."""

    route: str
    deployment: Deployment
    strategy: str
    why: str
    is_fallback: bool = False  # reached through the route's fallbacks (of any kind)
    canary: bool = False  # the route's canary deployment

    @property
    def provider(self) -> str:
        return self.deployment.provider

    @property
    def model(self) -> str:
        return self.deployment.model


@dataclass
class Stats:
    """What this process knows of one deployment's health and load."""

    in_flight: int = 0
    fails_in_row: int = 0
    cooling_until: float = 0.0
    latency_ms: float | None = None  # moving average of successful attempts
    ttft_ms: float | None = None
    # (start, tokens) of the last minute's requests, kept only for a deployment with an rpm or tpm,
    # and their tokens' sum, kept as they come and go: reading the window is O(1), not a pass over
    # every request of the last minute (at 1,000 requests a second, 60,000 of them per request).
    used: deque[tuple[float, int]] = field(default_factory=deque)
    used_tokens: int = 0
    # What the upstream said is left (x-ratelimit-remaining-requests / -tokens) and until when.
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    limits_until: float = 0.0

    def minute(self, now: float) -> tuple[int, int]:
        """Requests started in the last minute and their tokens."""
        used, edge = self.used, now - MINUTE_S
        while used and used[0][0] <= edge:
            self.used_tokens -= used.popleft()[1]
        return len(used), self.used_tokens

    def use(self, now: float, tokens: int) -> None:
        self.used.append((now, tokens))
        self.used_tokens += tokens


def _reset_seconds(value: str | None) -> float | None:
    """An ``x-ratelimit-reset-*`` value: ``1s``, ``6m0s``, ``20ms``, ``0.5`` (seconds)."""
    if not value:
        return None
    text, total, num = value.strip().lower(), 0.0, ""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    i = 0
    try:
        if all(c.isdigit() or c == "." for c in text):
            return float(text)
        while i < len(text):
            c = text[i]
            if c.isdigit() or c == ".":
                num += c
                i += 1
                continue
            unit = "ms" if text.startswith("ms", i) else c
            if unit not in units or not num:
                return None
            total += float(num) * units[unit]
            num, i = "", i + len(unit)
    except ValueError:
        return None
    return total if not num else None


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    v = headers.get(name)
    if v is None:
        return None
    try:
        n = int(v.strip())
    except ValueError:
        return None
    return n if n >= 0 else None


class RouteTable:
    """The routes and what this process knows of their deployments. ``rng`` draws the weighted
    order and the exploration share (inject a seeded one in tests)."""

    def __init__(self, routes: Mapping[str, Route], rng: random.Random):
        self.routes = dict(routes)
        self.rng = rng
        self.stats: dict[str, Stats] = {}
        self._current: dict[str, dict[str, float]] = {}  # smooth weighted round-robin, per route
        for r in self.routes.values():
            for d in r.every_deployment:
                self.stats.setdefault(d.key, Stats())

    def __contains__(self, name: object) -> bool:
        return name in self.routes

    def stat(self, d: Deployment) -> Stats:
        return self.stats.setdefault(d.key, Stats())

    # -- choice -----------------------------------------------------------------------------------
    def cooling(self, d: Deployment, now: float) -> bool:
        return self.stat(d).cooling_until > now

    def cooling_left(self, now: float) -> dict[str, float]:
        """Each deployment cooling down at ``now`` (by :attr:`Deployment.key`) and the seconds it
        has left: what this process reports to the others (:mod:`app.breaker_report`)."""
        return {key: s.cooling_until - now for key, s in self.stats.items() if s.cooling_until > now}

    def at_limit(self, d: Deployment, now: float, tokens: int) -> str | None:
        """Why ``d`` would answer 429 to one more request of ``tokens`` now, or None."""
        s = self.stat(d)
        if d.limited:
            n, used = s.minute(now)
            if d.rpm is not None and n + 1 > d.rpm:
                return f"at its rpm {d.rpm} ({n} in the last minute)"
            if d.tpm is not None and used + tokens > d.tpm:
                return f"at its tpm {d.tpm:,} ({used:,} in the last minute)"
        if s.limits_until > now:
            if s.remaining_requests == 0:
                return "the upstream says 0 requests remain"
            if s.remaining_tokens is not None and s.remaining_tokens < tokens:
                return f"the upstream says {s.remaining_tokens:,} tokens remain"
        return None

    def order(
        self,
        name: str,
        *,
        now: float,
        prompt_tokens: int,
        session_id: str | None = None,
        canary_ratio: float = 0.0,
        draw: float | None = None,
        is_fallback: bool = False,
        providers: Iterable[str] | None = None,
    ) -> tuple[list[Target], list[str]]:
        """The route's deployments in the order to try them, and why each left-out one was left out.

        ``providers``: only deployments on these providers (those serving the request's API).
        ``canary_ratio``: the route's canary share; ``draw`` (in [0, 1), from the session's id or
        the rng) below it puts the canary deployment first, else the canary is not tried."""
        route = self.routes[name]
        allowed = set(providers) if providers is not None else None
        skipped: list[str] = []
        candidates: list[Deployment] = []
        for d in route.deployments:
            if allowed is not None and d.provider not in allowed:
                continue
            if d.context_tokens < prompt_tokens:
                skipped.append(f"{d.key}: context window {d.context_tokens:,} < prompt ~{prompt_tokens:,} tokens")
            elif self.cooling(d, now):
                left = self.stat(d).cooling_until - now
                skipped.append(f"{d.key}: cooling down ({left:.0f} s left)")
            else:
                candidates.append(d)
        targets = self._strategy_order(route, candidates, now, session_id, is_fallback)
        # Known limits last, in the strategy's order among themselves.
        free = [t for t in targets if self.at_limit(t.deployment, now, prompt_tokens) is None]
        full = [
            Target(name, t.deployment, t.strategy, f"{t.why}; steered last: {why}", is_fallback)
            for t in targets
            if (why := self.at_limit(t.deployment, now, prompt_tokens)) is not None
        ]
        out = free + full
        c = route.canary
        if c is not None and (allowed is None or c.provider in allowed) and canary_ratio > 0:
            pick = draw if draw is not None else self.rng.random()
            if pick < canary_ratio:
                if c.context_tokens < prompt_tokens:
                    skipped.append(f"{c.key}: context window {c.context_tokens:,} < prompt ~{prompt_tokens:,} tokens")
                elif self.cooling(c, now):
                    skipped.append(f"{c.key}: canary cooling down")
                else:
                    why = f"canary: {canary_ratio:.0%} of {name}"
                    out.insert(0, Target(name, c, route.strategy, why, is_fallback, canary=True))
        return out, skipped

    def _strategy_order(
        self, route: Route, ds: Sequence[Deployment], now: float, session_id: str | None, is_fallback: bool
    ) -> list[Target]:
        name, strategy = route.name, route.strategy

        def t(d: Deployment, why: str) -> Target:
            return Target(name, d, strategy, why, is_fallback)

        if not ds:
            return []
        if strategy == "ordered":
            return [t(d, f"ordered: priority {route.deployments.index(d) + 1}") for d in ds]
        if strategy == "least_busy":
            ranked = sorted(ds, key=lambda d: self.stat(d).in_flight)
            counts = ", ".join(f"{d.provider} {self.stat(d).in_flight}" for d in ranked)
            return [t(d, f"least_busy: in flight {counts}") for d in ranked]
        if strategy == "lowest_latency":
            unknown = [d for d in ds if self.stat(d).latency_ms is None]
            measured = {d.key: ms for d in ds if (ms := self.stat(d).latency_ms) is not None}
            known = sorted((d for d in ds if d.key in measured), key=lambda d: measured[d.key])
            ranked = unknown + known
            if len(ranked) > 1 and self.rng.random() < EXPLORE:
                first = ranked.pop(self.rng.randrange(len(ranked)))
                ranked.insert(0, first)
                return [t(first, "lowest_latency: exploring")] + [t(d, "lowest_latency") for d in ranked[1:]]
            shown = " < ".join(
                f"{d.provider} {'unmeasured' if (ms := self.stat(d).latency_ms) is None else f'{ms:.0f} ms'}"
                for d in ranked
            )
            return [t(d, f"lowest_latency: {shown}") for d in ranked]
        if strategy == "cheapest":
            ranked = sorted(ds, key=lambda d: d.price)
            shown = " < ".join(f"{d.provider} ${d.price:g}/M" for d in ranked)
            return [t(d, f"cheapest: {shown}") for d in ranked]
        # weighted: an order drawn without replacement by weight (Efraimidis-Spirakis keys u^(1/w)).
        # With a session, each deployment's u is a hash of (route, session, deployment): the same
        # order on every request, and a deployment leaving (cooling) moves only its own sessions.
        weighted = [d for d in ds if d.weight > 0]
        draws = {d.key: self.rng.random() if session_id is None else _unit(name, session_id, d.key) for d in weighted}
        keyed = sorted(weighted, key=lambda d: draws[d.key] ** (1.0 / d.weight), reverse=True)
        if session_id is None and len(weighted) > 1:
            # Without a session the first pick is smooth weighted round-robin (nginx's): the split
            # is exact over every sum-of-weights requests, not only on average.
            head = self._round_robin(name, weighted)
            keyed.remove(head)
            keyed.insert(0, head)
        total = sum(d.weight for d in weighted)
        sticky = " (session)" if session_id is not None else ""
        out = [t(d, f"weighted{sticky}: {d.weight:g} of {total:g}") for d in keyed]
        out += [t(d, "weighted: weight 0, only when the others failed") for d in ds if d.weight <= 0]
        return out

    def _round_robin(self, route: str, ds: Sequence[Deployment]) -> Deployment:
        current = self._current.setdefault(route, {})
        total = sum(d.weight for d in ds)
        for d in ds:
            current[d.key] = current.get(d.key, 0.0) + d.weight
        best = max(ds, key=lambda d: current[d.key])
        current[best.key] -= total
        return best

    # -- outcomes ---------------------------------------------------------------------------------
    def started(self, d: Deployment, now: float, tokens: int) -> None:
        s = self.stat(d)
        s.in_flight += 1
        if d.limited:
            s.use(now, max(0, tokens))

    def finished(
        self,
        d: Deployment,
        now: float,
        *,
        health: bool | None,
        cooldown_s: float,
        allowed_fails: int,
        latency_ms: float | None = None,
        ttft_ms: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> str | None:
        """An attempt on ``d`` ended: ``health`` True (answered), False (a provider-health failure)
        or None (says nothing of the deployment). Returns a message when it starts cooling down.
        (The in-flight count is the caller's: it went up in :meth:`started`.)"""
        s = self.stat(d)
        if headers:
            self._read_limits(s, now, headers)
        if health is True:
            s.fails_in_row = 0
            if latency_ms is not None:
                s.latency_ms = (
                    latency_ms if s.latency_ms is None else s.latency_ms + EWMA_ALPHA * (latency_ms - s.latency_ms)
                )
            if ttft_ms is not None:
                s.ttft_ms = ttft_ms if s.ttft_ms is None else s.ttft_ms + EWMA_ALPHA * (ttft_ms - s.ttft_ms)
        elif health is False:
            s.fails_in_row += 1
            if s.fails_in_row >= allowed_fails:
                s.fails_in_row = 0
                s.cooling_until = now + cooldown_s
                return f"{d.key}: {allowed_fails} failures in a row, out for {cooldown_s:g} s"
        return None

    def learn_limits(self, d: Deployment, now: float, headers: Mapping[str, str]) -> None:
        """What an answer's ``x-ratelimit-remaining-*`` headers say is left of ``d``'s limits."""
        self._read_limits(self.stat(d), now, headers)

    def _read_limits(self, s: Stats, now: float, headers: Mapping[str, str]) -> None:
        low = {k.lower(): v for k, v in headers.items()}
        req = _header_int(low, "x-ratelimit-remaining-requests")
        tok = _header_int(low, "x-ratelimit-remaining-tokens")
        if req is None and tok is None:
            return
        resets = [
            r
            for r in (
                _reset_seconds(low.get("x-ratelimit-reset-requests")),
                _reset_seconds(low.get("x-ratelimit-reset-tokens")),
            )
            if r is not None
        ]
        s.remaining_requests, s.remaining_tokens = req, tok
        s.limits_until = now + (min(max(resets), MINUTE_S) if resets else MINUTE_S)


def _unit(*parts: str) -> float:
    """A uniform number in (0, 1) fixed by ``parts`` (a session's draws)."""
    data = "\0".join(parts).encode("utf-8", "surrogatepass")
    return (int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") + 1) / (2**64 + 2)


def session_draw(route: str, session_id: str) -> float:
    """A session's fixed draw for a route's canary share (the same session, the same side)."""
    return _unit(route, session_id, "canary")


def build(routes: Mapping[str, RouteConfig], rng: random.Random) -> RouteTable:
    """The table of ``[routes]`` (:class:`app.config.RouteConfig` values), priced from the catalog."""

    def resolve(name: str, d: DeploymentConfig) -> Deployment:
        priced = deployment_catalog_model(name, d)
        assert priced is not None  # the configuration refuses a deployment the catalog cannot price
        info = catalog.get(priced)
        return Deployment(
            provider=d.provider,
            model=deployment_model(name, d),
            priced_as=priced,
            weight=d.weight,
            rpm=d.rpm,
            tpm=d.tpm,
            context_tokens=info.context_tokens,
            price=float(info.input + info.output),
        )

    table = {
        name: Route(
            name=name,
            strategy=r.strategy,
            deployments=tuple(resolve(name, d) for d in r.deployments),
            fallbacks=tuple(r.fallbacks),
            context_window_fallbacks=tuple(r.context_window_fallbacks),
            content_policy_fallbacks=tuple(r.content_policy_fallbacks),
            allowed_fails=r.allowed_fails,
            cooldown_s=r.cooldown_s,
            canary=resolve(name, r.canary) if r.canary is not None else None,
        )
        for name, r in routes.items()
    }
    return RouteTable(table, rng)
