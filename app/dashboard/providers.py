"""What the overview says about each provider: simulated, configured, key missing, failing recently.

The key itself never leaves :func:`app.config.key_state`; this module only sees ``set`` / ``missing``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.config import Settings, key_state
from app.display.fmt import pct, ratio_pct, utc_time
from app.monitor.figures import ATTEMPT_ERROR_RATE, LAST_MINUTE_S, LiveFigures, figure_label
from app.monitor.incidents import FAILING_ERROR_RATE, FAILING_MIN_ATTEMPTS
from core.faults import FaultSettings, effective_faults

# A provider is "failing recently" with at least FAILING_MIN_ATTEMPTS attempts in the last minute
# and at least FAILING_ERROR_RATE of them failed (the incident banner's rule): one unlucky request
# does not paint it red.
__all__ = ["FAILING_ERROR_RATE", "FAILING_MIN_ATTEMPTS", "ProviderStatus", "provider_statuses", "status_rows"]


def live_breaker_states(engine: Any, *, now: float) -> dict[str, tuple[str, float]]:
    """``{provider: (state, since)}``: the worst breaker state a live gateway process holds for
    each provider whose breaker some live process holds open or half-open
    (:func:`db.breakers.live_breakers`), and since when (``now`` when unknown); closed ones absent."""
    from db.breakers import live_breakers

    return {
        p: (b.state, b.since if b.since is not None else now)
        for p, b in live_breakers(engine, now=now).items()
        if b.state != "closed"
    }


def provider_role(settings: Settings, name: str) -> str:
    """``primary``, ``fallback``, ``routes only`` (a deployment of some route) or ``spare``."""
    if name == settings.routing.primary:
        return "primary"
    if name == settings.routing.fallback:
        return "fallback"
    for r in settings.routes.values():
        if any(d.provider == name for d in r.every_deployment):
            return "routes only"
    return "spare"


class HealthLike(Protocol):
    attempts: int
    errors: int
    error_rate: float
    last_error_class: str | None


@dataclass(frozen=True)
class ProviderStatus:
    name: str
    role: str  # primary | fallback | routes only (a [routes] deployment) | spare
    base: str  # "simulated" or the upstream host, never a key
    key: str  # simulated | set | missing
    state: str  # simulated | configured | key missing | failing recently
    detail: str
    attempts: int = 0
    error_rate: float | None = None
    faults: str | None = None  # active fault injection, described
    breaker: str | None = None  # the newest circuit-breaker transition, described
    window_error_rate: float | None = None  # attempt error rate over the page's window

    @property
    def ok(self) -> bool:
        return self.state in ("simulated", "configured")


def describe_faults(f: FaultSettings | None) -> str | None:
    if f is None or f == FaultSettings():
        return None
    parts = []
    if f.error_rate:
        parts.append(f"{ratio_pct(f.error_rate)} errors")
    if f.rate_limit_rate:
        parts.append(f"{ratio_pct(f.rate_limit_rate)} 429s")
    if f.timeout_rate:
        parts.append(f"{ratio_pct(f.timeout_rate)} timeouts")
    if f.latency_multiplier != 1.0:
        parts.append(f"latency x{f.latency_multiplier:g}")
    if f.stream_break_rate:
        parts.append(f"{ratio_pct(f.stream_break_rate)} broken streams")
    if f.reject_cache_hints:
        parts.append("rejects cache hints")
    from app.dashboard.canary_form import quality_faults_text

    if bad := quality_faults_text(f):
        parts.append(bad)
    return ", ".join(parts) or "custom faults"


def _host(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]


def provider_statuses(
    settings: Settings,
    health: Mapping[str, HealthLike] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    secrets: Mapping[str, Any] | None = None,
    faults: Mapping[str, FaultSettings] | None = None,
    breakers: Mapping[str, tuple[str, float]] | None = None,
    figures: LiveFigures | None = None,
) -> list[ProviderStatus]:
    """One status per configured provider, primary first, then fallback, then the rest.

    ``figures`` (the page's :func:`app.monitor.figures.live_figures`) gives each provider's attempt
    error rate over the last minute (which decides "failing recently") and over the window; without
    it the rate is ``health``'s. ``breakers`` is each provider's circuit breaker across the live
    gateway processes (state, since: :func:`live_breaker_states`); an open or half-open breaker is
    the provider's state."""
    health = health or {}
    breakers = breakers or {}
    faults = faults or {}
    str_secrets = {k: v for k, v in (secrets or {}).items() if isinstance(v, str)}
    order = [settings.routing.primary, settings.routing.fallback]
    order += [n for n in settings.providers if n not in order]
    out = []
    for name in dict.fromkeys(order):
        p = settings.providers[name]
        role = provider_role(settings, name)
        key = key_state(p, env=env, secrets=str_secrets)
        h = health.get(name)
        window_rate = None
        if figures is not None:
            minute = figures.provider(name, last_minute=True)
            attempts, rate = minute.attempts, minute.attempt_error_rate
            window_rate = figures.provider(name, last_minute=False).attempt_error_rate
        else:
            attempts = int(getattr(h, "attempts", 0) or 0)
            rate = float(h.error_rate) if h is not None and attempts else None
        active_faults = describe_faults(effective_faults(faults.get(name), p.faults)) if p.is_simulated else None
        breaker_state, breaker_ts = breakers.get(name, (None, 0.0))
        breaker = f"{breaker_state.replace('_', '-')} since {utc_time(breaker_ts)}" if breaker_state else None
        if key == "missing":
            state, detail = "key missing", f"set {p.api_key_env} (environment or .streamlit/secrets.toml)"
        elif breaker_state in ("open", "half_open"):
            state = "breaker open" if breaker_state == "open" else "breaker half-open"
            detail = f"circuit breaker {breaker}: requests fail over without trying it"
            if breaker_state == "half_open":
                detail = f"circuit breaker {breaker}: one probe request is let through"
        elif rate is not None and attempts >= FAILING_MIN_ATTEMPTS and rate >= FAILING_ERROR_RATE:
            last = getattr(h, "last_error_class", None)
            state = "failing recently"
            detail = f"{pct(rate, digits=0)} of {attempts} attempts failed" + (f" (last: {last})" if last else "")
        elif p.is_simulated:
            state, detail = "simulated", "built-in simulator, no key needed"
        else:
            state, detail = "configured", f"key {p.api_key_env} is set"
        out.append(
            ProviderStatus(
                name=name,
                role=role,
                base="simulated" if p.is_simulated else _host(p.base_url),
                key=key,
                state=state,
                detail=detail,
                attempts=attempts,
                error_rate=rate,
                faults=active_faults,
                breaker=breaker,
                window_error_rate=window_rate,
            )
        )
    return out


def status_rows(statuses: list[ProviderStatus], window_s: float | None = None) -> list[dict]:
    """Rows for a table: no key value anywhere, only its state. The incident columns come first
    (provider, attempt error rate, breaker, state): on a phone only the first few columns fit, and
    those are the ones an operator mid-incident looks for. The rates are labelled with their span
    (``Attempt error rate, last 1 min``); ``window_s`` adds the window's rate beside it."""
    minute = figure_label(ATTEMPT_ERROR_RATE, LAST_MINUTE_S)
    window = figure_label(ATTEMPT_ERROR_RATE, window_s) if window_s else None
    return [
        {
            "provider": s.name,
            minute: pct(s.error_rate),
            "breaker": s.breaker or "closed",
            "state": s.state,
            **({window: pct(s.window_error_rate)} if window else {}),
            "attempts, last 1 min": s.attempts,
            "role": s.role,
            "upstream": s.base,
            "key": s.key,
            "detail": s.detail + (f"; fault injection: {s.faults}" if s.faults else ""),
        }
        for s in statuses
    ]
