"""What the overview says about each provider: simulated, configured, key missing, failing recently.

The key itself never leaves :func:`app.config.key_state`; this module only sees ``set`` / ``missing``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.config import Settings, key_state
from app.dashboard.fmt import pct, ratio_pct, utc_time
from core.faults import FaultSettings, effective_faults

# A provider is "failing recently" with at least this many attempts in the health window and at
# least this share of them failed: one unlucky request does not paint it red.
FAILING_MIN_ATTEMPTS = 3
FAILING_ERROR_RATE = 0.2


class HealthLike(Protocol):
    attempts: int
    errors: int
    error_rate: float
    last_error_class: str | None


@dataclass(frozen=True)
class ProviderStatus:
    name: str
    role: str  # primary | fallback | spare
    base: str  # "simulated" or the upstream host, never a key
    key: str  # simulated | set | missing
    state: str  # simulated | configured | key missing | failing recently
    detail: str
    attempts: int = 0
    error_rate: float | None = None
    faults: str | None = None  # active fault injection, described
    breaker: str | None = None  # the newest circuit-breaker transition, described

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
) -> list[ProviderStatus]:
    """One status per configured provider, primary first, then fallback, then the rest.

    ``breakers`` is each provider's newest circuit-breaker transition (state, epoch seconds) as
    recorded by any gateway process; an open or half-open breaker is the provider's state."""
    health = health or {}
    breakers = breakers or {}
    faults = faults or {}
    str_secrets = {k: v for k, v in (secrets or {}).items() if isinstance(v, str)}
    order = [settings.routing.primary, settings.routing.fallback]
    order += [n for n in settings.providers if n not in order]
    out = []
    for name in dict.fromkeys(order):
        p = settings.providers[name]
        role = (
            "primary"
            if name == settings.routing.primary
            else "fallback"
            if name == settings.routing.fallback
            else "spare"
        )
        key = key_state(p, env=env, secrets=str_secrets)
        h = health.get(name)
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
            )
        )
    return out


def status_rows(statuses: list[ProviderStatus]) -> list[dict]:
    """Rows for a table: no key value anywhere, only its state. The incident columns come first
    (provider, error rate, breaker, state): on a phone only the first few columns fit, and those
    are the ones an operator mid-incident looks for."""
    return [
        {
            "provider": s.name,
            "error rate": pct(s.error_rate),
            "breaker": s.breaker or "closed",
            "state": s.state,
            "attempts (5 min)": s.attempts,
            "role": s.role,
            "upstream": s.base,
            "key": s.key,
            "detail": s.detail + (f"; fault injection: {s.faults}" if s.faults else ""),
        }
        for s in statuses
    ]
