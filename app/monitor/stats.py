"""Glanceable figures built from :mod:`db.monitor` sums: the Overview's headline KPIs, each
provider's recent health, and the canary page's observed split per bucket."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from app.monitor.series import bucket_axis, choose_step, ratio
from core.canary import ROUTE_SIDES
from core.histogram import percentile
from db.monitor import cost_between, minute_floor, provider_side_sums, provider_sums, side_counts, window_cell
from db.raw_log import last_error


@dataclass(frozen=True)
class OverviewStats:
    """Headline numbers for the last ``window_s`` seconds (rounded out to whole rollup minutes).

    ``errors`` / ``error_rate`` are request-level (failed final attempts / requests): what callers
    saw. ``p50_ms`` / ``p95_ms`` are per-attempt latency over every provider, because the rollup
    histograms hold attempts; most requests succeed on their first attempt, where the two agree.
    ``tokens`` = prompt + completion tokens in the window. ``cost_today_usd`` covers the UTC day so
    far (since 00:00 UTC), independent of the window.
    """

    window_s: int
    requests: int
    attempts: int
    errors: int
    error_rate: float | None
    fallbacks: int
    fallback_rate: float | None
    p50_ms: float | None
    p95_ms: float | None
    ttft_p50_ms: float | None
    tokens: int
    cached_ratio: float | None
    cost_window_usd: float
    cost_today_usd: float


def _utc_midnight(now: float) -> int:
    return int(now // 86400) * 86400


def overview_stats(engine: Engine, *, now: float, window_s: int = 900) -> OverviewStats:
    """Headline KPIs from the rollups: one window query plus one for today's cost."""
    cell = window_cell(engine, since=now - window_s, until=now)
    cost_today = cost_between(engine, since=_utc_midnight(now), until=now)
    lat, ttft = cell.lat or (), cell.ttft or ()
    requests, req_err, fallbacks = cell.count("requests"), cell.count("request_errors"), cell.count("fallbacks")
    prompt = cell.count("prompt_tokens")
    return OverviewStats(
        window_s=int(window_s),
        requests=requests,
        attempts=cell.count("attempts"),
        errors=req_err,
        error_rate=ratio(req_err, requests),
        fallbacks=fallbacks,
        fallback_rate=ratio(fallbacks, requests),
        p50_ms=percentile(lat, 0.5),
        p95_ms=percentile(lat, 0.95),
        ttft_p50_ms=percentile(ttft, 0.5),
        tokens=prompt + cell.count("completion_tokens"),
        cached_ratio=ratio(cell.count("cached_tokens"), prompt),
        cost_window_usd=cell.cost,
        cost_today_usd=cost_today,
    )


@dataclass(frozen=True)
class ProviderHealth:
    """A provider's attempts in the last ``window_s`` seconds (whole rollup minutes).

    ``error_rate`` = failed attempts / attempts (``None`` with no attempts). ``last_error_class`` and
    ``last_error_at`` describe its newest failed attempt within the window, if any.
    """

    provider: str
    attempts: int
    errors: int
    error_rate: float | None
    requests: int
    p50_ms: float | None
    p95_ms: float | None
    last_error_class: str | None = None
    last_error_at: float | None = None


def provider_health(
    engine: Engine, *, providers: list[str], now: float, window_s: int = 300
) -> dict[str, ProviderHealth]:
    """Health of each named provider (every name gets an entry, zeros when idle).

    One grouped rollup query; then, only for providers that had errors, one ``ts``-indexed lookup of
    their newest failed attempt, bounded to the window.
    """
    since = now - window_s
    sums = provider_sums(engine, providers=providers, since=since, until=now)
    out: dict[str, ProviderHealth] = {}
    for name in providers:
        s = sums.get(name)
        if s is None:
            out[name] = ProviderHealth(name, 0, 0, None, 0, None, None)
            continue
        lat = s.lat or ()
        last = last_error(engine, provider=name, since=minute_floor(since), until=now) if s.errors else None
        out[name] = ProviderHealth(
            name,
            s.attempts,
            s.errors,
            ratio(s.errors, s.attempts),
            s.requests,
            percentile(lat, 0.5),
            percentile(lat, 0.95),
            last_error_class=last[0] if last else None,
            last_error_at=last[1] if last else None,
        )
    return out


@dataclass(frozen=True)
class SplitPoint:
    """Final requests in one bucket by the canary side they were assigned to.

    ``ts`` is the bucket start (epoch seconds), ``step_s`` its width; ``primary_share`` =
    primary / (primary + fallback), ``None`` when the bucket had no requests.
    """

    ts: int
    step_s: int
    primary: int
    fallback: int

    @property
    def total(self) -> int:
        return self.primary + self.fallback

    @property
    def primary_share(self) -> float | None:
        return ratio(self.primary, self.total)


def observed_split(engine: Engine, *, now: float, minutes: int) -> list[SplitPoint]:
    """Requests per bucket and canary side over the last ``minutes`` minutes, oldest first.

    Buckets are one minute wide unless that would exceed the monitor's point budget; every bucket of
    the window is present (zeros when idle), the last one being the minute in progress.
    """
    since = now - max(int(minutes), 1) * 60 + 60  # ``minutes`` minutes including the current one
    step = choose_step(now - since)
    buckets, _ = bucket_axis(since, now, step)
    counts = side_counts(engine, since=since, until=now, step=step)
    return [SplitPoint(b, step, *counts.get(b, (0, 0))) for b in buckets]


@dataclass(frozen=True)
class SplitByCause:
    """Where a window's requests went and why: the canary ratio assigned a side; a
    request then reached the other provider by fail-over (a primary request failed) or because
    its model is served by that provider only; the gateway refused some itself."""

    primary: str
    fallback: str
    by_ratio: dict[str, int]  # provider -> requests it got as the ratio assigned them
    fail_over: int  # primary-side requests answered (or failed last) on the fallback route
    moved: dict[str, int]  # provider -> requests moved to it for their model
    refused: int  # refused before any upstream (the gateway's own refusals, no side)
    total: int
    failed: dict[str, int] | None = None  # provider -> of its requests, how many failed or were refused

    def share(self, provider: str) -> float | None:
        got = self.by_ratio.get(provider, 0) + self.moved.get(provider, 0)
        if provider == self.fallback:
            got += self.fail_over
        return ratio(got, self.total - self.refused)

    def exposure(self, minutes: int) -> str:
        """The primary's real share of requests next to the ratio, by cause: the ratio bounds only
        what it assigns; models only the primary serves, and fail-over, add to it."""
        share = self.share(self.primary)
        if share is None:
            return f"Real exposure, last {minutes} min: no requests."
        moved = self.moved.get(self.primary, 0)
        return (
            f"Real exposure, last {minutes} min: {self.primary} got {share:.0%} of requests "
            f"({self.by_ratio.get(self.primary, 0):,} by the ratio, {moved:,} moved for a model only it serves)"
        )

    def sentences(self) -> list[str]:
        """One line per provider: its share and the causes, in words."""
        out = []
        for p in (self.primary, self.fallback):
            share = self.share(p)
            if share is None:
                continue
            parts = [f"{self.by_ratio.get(p, 0):,} by the ratio"]
            if p == self.fallback:
                parts.append(f"{self.fail_over:,} by fail-over")
            parts.append(f"{self.moved.get(p, 0):,} moved for a model only it serves")
            failed = (self.failed or {}).get(p, 0)
            tail = f"; {failed:,} of them failed or were refused" if failed else ""
            out.append(f"{p} got {share:.0%} of requests: " + ", ".join(parts) + tail + ".")
        if self.refused:
            out.append(
                f"{self.refused:,} refused by the gateway itself before any attempt "
                "(key, limit, budget, substitution policy, every breaker open)."
            )
        return out


GATEWAY = "gateway"  # the provider of the rows of requests refused before any attempt (app.routing.core)


def split_by_cause(engine: Engine, *, primary: str, fallback: str, now: float, minutes: int) -> SplitByCause:
    """The observed split of the last ``minutes`` minutes by cause, from the minute rollups."""
    since = now - max(int(minutes), 1) * 60 + 60
    sums = provider_side_sums(engine, since=since, until=now)
    by_ratio: dict[str, int] = {}
    moved: dict[str, int] = {}
    failed: dict[str, int] = {}
    fail_over = refused = total = 0
    for (provider, side), (requests, fb, errs) in sums.items():
        if side in ROUTE_SIDES:  # a route's requests: its own canary, not the global split
            continue
        total += requests
        failed[provider] = failed.get(provider, 0) + errs
        own = primary if side == "primary" else fallback if side == "fallback" else None
        if own is None or provider == GATEWAY:  # refused before any attempt: nobody got it
            refused += requests
        elif provider == own:
            by_ratio[provider] = by_ratio.get(provider, 0) + requests
        elif side == "primary" and provider == fallback:
            fail_over += fb
            if requests > fb:
                moved[provider] = moved.get(provider, 0) + requests - fb
        else:
            moved[provider] = moved.get(provider, 0) + requests
    return SplitByCause(primary, fallback, by_ratio, fail_over, moved, refused, total, failed)
