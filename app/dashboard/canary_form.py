"""The canary page's writes: parse what the operator typed, refuse bad input with a message and
write nothing, and turn the database's optimistic-lock refusal into a sentence.

Every function returns an :class:`Outcome` instead of raising, so the page only decides the colour
and, from ``Outcome.field``, which input the message goes under. Each write function refuses a
viewer (:func:`app.dashboard.identity.refusal`) and a value equal to the stored one ("no change")
before it touches the database.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Engine

from app.config import Settings
from app.dashboard.identity import Identity, refusal
from app.display.fmt import pct, ratio_pct, when
from core.canary import GuardrailSettings, ratio_in_range
from core.faults import FaultSettings
from db.canary import (
    GLOBAL,
    MAX_REASON,
    CanaryState,
    StaleCanaryError,
    ensure_setting,
    get_guardrail,
    get_state,
    set_guardrail,
    set_ratio,
)
from db.events import record_fault_change
from db.faults import clear_faults, get_faults, set_faults
from db.monitor import GuardrailReading


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str
    state: CanaryState | None = None  # the current canary state after the attempt, when known
    field: str | None = None  # the input the refusal is about (shown next to it), if one


class FieldError(ValueError):
    """A refused input, naming the field it is about."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


NOTHING_WRITTEN = "Nothing was written."


def parse_percent(value: object, *, name: str = "Canary ratio") -> float:
    """A percent 0..100 (number or text such as ``"25"``, ``"12.5 %"``) as a ratio 0..1.

    Raises ``ValueError`` with a message for the operator otherwise.
    """
    if value is None or isinstance(value, bool):
        raise ValueError(f"{name} must be a number between 0 and 100")
    if isinstance(value, str):
        text = value.strip().removesuffix("%").strip().replace(",", ".")
        if not text:
            raise ValueError(f"{name} must be a number between 0 and 100")
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number between 0 and 100, got {value!r}") from None
    else:
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number between 0 and 100, got {value!r}") from None
    if not ratio_in_range(number / 100.0):  # the canary's one range check (core.canary)
        raise ValueError(f"{name} must be between 0 and 100 %, got {value!r}")
    return round(number / 100.0, 6) + 0.0  # + 0.0: "-0" is stored as 0, not -0.0


def parse_reason(reason: object) -> str:
    text = reason.strip() if isinstance(reason, str) else ""
    if not text:
        raise ValueError("A reason is required: say why you are changing the canary ratio")
    if len(text) > MAX_REASON:
        raise ValueError(f"The reason is too long ({len(text)} characters, at most {MAX_REASON})")
    return text


def stale_message(current: CanaryState) -> str:
    return (
        f"Refused: {current.updated_by} changed the canary ratio to {ratio_pct(current.ratio)} "
        f'at {when(current.updated_at)} ("{current.reason}") after this page loaded. '
        "Nothing was written; the page now shows the current value, check it and apply again."
    )


def apply_ratio(
    engine: Engine,
    percent: object,
    reason: object,
    *,
    expected_version: int | None,
    actor: Identity,
    scope: str = GLOBAL,
) -> Outcome:
    """Validate and write a new ratio (of ``scope``: the global canary, or a route's), optimistic-
    locked on ``expected_version``; the value the ratio already has is refused as "no change" (no
    new version, no audit row)."""
    if (why_not := refusal(actor)) is not None:
        return Outcome(False, why_not)
    try:
        ratio = parse_percent(percent)
    except ValueError as exc:
        return Outcome(False, f"{exc}. {NOTHING_WRITTEN}", field="ratio")
    try:
        why = parse_reason(reason)
    except ValueError as exc:
        return Outcome(False, f"{exc}. {NOTHING_WRITTEN}", field="reason")
    if scope != GLOBAL:
        ensure_setting(engine, 0.0, scope)
    current = get_state(engine, scope)
    if expected_version is not None and current.version != expected_version:
        return Outcome(False, stale_message(current), current)
    if ratio == current.ratio:
        return Outcome(
            False, f"No change: the canary ratio is already {ratio_pct(ratio)}. {NOTHING_WRITTEN}", field="ratio"
        )
    try:
        state = set_ratio(engine, ratio, expected_version=expected_version, actor=actor.name, reason=why, scope=scope)
    except StaleCanaryError as exc:
        return Outcome(False, stale_message(exc.current), exc.current)
    except ValueError as exc:
        return Outcome(False, f"{exc}. {NOTHING_WRITTEN}", field="ratio")
    return Outcome(
        True, f"Canary ratio set to {ratio_pct(state.ratio)} (version {state.version}) by {state.updated_by}.", state
    )


def preview_ratio(typed: object, current: float) -> float | None:
    """The ratio (0..1) to preview for what the operator typed, ``None`` when it is not a valid
    change (a refused value has its own message; the current value changes nothing)."""
    try:
        ratio = parse_percent(typed)
    except (TypeError, ValueError):
        return None
    return None if ratio == current else ratio


QUICK_ACTIONS = {
    "rollback": (0.0, "Roll back to 0 %", "all traffic goes to the fallback"),
    "promote": (100.0, "Promote to 100 %", "all traffic goes to the primary"),
}


def quick_effect(action: str, settings: Settings) -> str:
    """Exactly what a quick action changes, in words: which provider gets what afterwards, and
    what happens to requests for a model only the other side serves (the substitution policy)."""
    r = settings.routing
    to, off = (r.fallback, r.primary) if action == "rollback" else (r.primary, r.fallback)
    only_off = sorted(set(settings.providers[off].models) - set(settings.providers[to].models))
    text = f"every new request is assigned to {to}; {off} gets none"
    if action == "promote" and r.fallback_enabled and r.fallback != r.primary:
        text += f" except fail-over when {to} fails"
    if only_off:
        sub = r.substitution
        policy = (
            "refused"
            if sub.mode == "refuse"
            else f"answered by a substitute on {to} at most {sub.max_price_factor:g}x the price, else refused"
        )
        text += (
            f". Requests for models only {off} serves ({', '.join(only_off)}) are {policy} "
            f"([routing.substitution] mode = {sub.mode!r}), never sent to {off}"
        )
    return text


@dataclass(frozen=True)
class GuardrailInput:
    enabled: bool
    threshold: float  # 0..1
    window_minutes: int
    min_requests: int


def _whole(value: object, field: str, name: str) -> int:
    """A whole number typed by the operator (``"5"``, ``5``, ``5.0``); anything else is refused."""
    if isinstance(value, bool) or value is None:
        raise FieldError(field, f"{name} must be a whole number")
    if isinstance(value, str):
        value = value.strip()
        if not value.lstrip("-").isdigit():
            raise FieldError(field, f"{name} must be a whole number, got {value!r}")
        return int(value)
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise FieldError(field, f"{name} must be a whole number, got {value!r}")
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise FieldError(field, f"{name} must be a whole number, got {value!r}") from None


def parse_guardrail(
    enabled: bool, threshold_pct: object, window_minutes: object, min_requests: object
) -> GuardrailInput:
    try:
        threshold = parse_percent(threshold_pct, name="Error-rate threshold")
    except ValueError as exc:
        raise FieldError("threshold", str(exc)) from None
    if threshold == 0:
        raise FieldError("threshold", "Error-rate threshold must be above 0 % (0 would roll back on any error)")
    window = _whole(window_minutes, "window", "Window (minutes)")
    minimum = _whole(min_requests, "min_requests", "Minimum attempts")
    try:  # the bounds are the guardrail's own (core.canary), not restated here
        g = GuardrailSettings.checked(
            enabled=enabled, error_rate_threshold=threshold, window_minutes=window, min_requests=minimum
        )
    except ValueError as exc:
        text = str(exc)[:1].upper() + str(exc)[1:]
        field = "window" if "window" in text.lower() else "min_requests" if "min" in text.lower() else "threshold"
        raise FieldError(field, text) from None
    return GuardrailInput(g.enabled, g.error_rate_threshold, g.window_minutes, g.min_requests)


def save_guardrail(
    engine: Engine,
    enabled: bool,
    threshold_pct: object,
    window_minutes: object,
    min_requests: object,
    *,
    actor: Identity,
    defaults: GuardrailSettings | None = None,
) -> Outcome:
    if (why_not := refusal(actor)) is not None:
        return Outcome(False, why_not)
    try:
        g = parse_guardrail(enabled, threshold_pct, window_minutes, min_requests)
    except FieldError as exc:
        return Outcome(False, f"{exc}. {NOTHING_WRITTEN}", field=exc.field)
    now = get_guardrail(engine, defaults)
    if (now.enabled, now.error_rate_threshold, now.window_minutes, now.min_requests) == (
        g.enabled,
        g.threshold,
        g.window_minutes,
        g.min_requests,
    ):
        return Outcome(False, f"No change: the guardrail already has these settings. {NOTHING_WRITTEN}")
    try:
        set_guardrail(
            engine,
            enabled=g.enabled,
            error_rate_threshold=g.threshold,
            window_minutes=g.window_minutes,
            min_requests=g.min_requests,
            actor=actor.name,
        )
    except ValueError as exc:
        return Outcome(False, f"{exc}. {NOTHING_WRITTEN}")
    state = "on" if g.enabled else "off"
    return Outcome(
        True,
        f"Guardrail {state}: roll back when the primary's error rate over {g.window_minutes} min "
        f"exceeds {ratio_pct(g.threshold)} (at least {g.min_requests} attempts).",
    )


#: The answer-quality faults the page offers: field, label, and the multiplier's bounds (None: a percent).
QUALITY_FAULTS: tuple[tuple[str, str, tuple[float, float] | None], ...] = (
    ("refusal_rate", "Refusals (%)", None),
    ("truncation_rate", "Truncations (%)", None),
    ("empty_rate", "Empty answers (%)", None),
    ("tool_json_break_rate", "Broken tool JSON (%)", None),
    ("schema_violation_rate", "Schema violations (%)", None),
    ("verbosity_multiplier", "Verbosity multiplier", (1.0, 20.0)),
    ("ttft_multiplier", "TTFT multiplier", (0.1, 100.0)),
)


def _multiplier(value: object, label: str, lo: float, hi: float) -> float:
    text = value.strip().lower().removeprefix("x") if isinstance(value, str) else value
    try:
        number = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{label} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(number) or not lo <= number <= hi:
        raise ValueError(f"{label} must be between {lo:g} and {hi:g}, got {value!r}")
    return number


def parse_quality(values: Mapping[str, object]) -> dict[str, float]:
    """The answer-quality faults the page's inputs hold (only those given), or :class:`FieldError`."""
    out: dict[str, float] = {}
    for field, label, bounds in QUALITY_FAULTS:
        if field not in values:
            continue
        try:
            if bounds is None:
                out[field] = parse_percent(values[field], name=label.removesuffix(" (%)"))
            else:
                out[field] = _multiplier(values[field], label, *bounds)
        except ValueError as exc:
            raise FieldError(field, str(exc)) from None
    return out


def quality_inputs(faults: FaultSettings) -> dict[str, float]:
    """The answer-quality inputs' values: percents, and the multipliers as they are."""
    return {f: getattr(faults, f) * (100 if bounds is None else 1) for f, _, bounds in QUALITY_FAULTS}


def parse_faults(
    error_pct: object,
    rate_limit_pct: object,
    latency_multiplier: object,
    base: FaultSettings | None = None,
    quality: Mapping[str, object] | None = None,
) -> FaultSettings:
    try:
        errors = parse_percent(error_pct, name="Error rate")
    except ValueError as exc:
        raise FieldError("error_rate", str(exc)) from None
    try:
        limited = parse_percent(rate_limit_pct, name="429 rate")
    except ValueError as exc:
        raise FieldError("rate_limit_rate", str(exc)) from None
    try:
        text = latency_multiplier.strip().lower().removeprefix("x") if isinstance(latency_multiplier, str) else None
        mult = float(text if text is not None else latency_multiplier)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise FieldError(
            "latency_multiplier", f"Latency multiplier must be a number, got {latency_multiplier!r}"
        ) from None
    if isinstance(latency_multiplier, bool) or not math.isfinite(mult) or not 0.1 <= mult <= 100:
        raise FieldError(
            "latency_multiplier", f"Latency multiplier must be between 0.1 and 100, got {latency_multiplier!r}"
        )
    return (base or FaultSettings()).model_copy(
        update={"error_rate": errors, "rate_limit_rate": limited, "latency_multiplier": mult,
                **parse_quality(quality or {})}
    )  # fmt: skip


def save_faults(
    engine: Engine,
    provider: str,
    error_pct: object,
    rate_limit_pct: object,
    latency_multiplier: object,
    *,
    actor: Identity,
    base: FaultSettings | None = None,
    quality: Mapping[str, object] | None = None,
) -> Outcome:
    """Validate and store fault injection for ``provider``; ``base`` is what is in force now (the
    stored override, else the config's), so saving the same values is refused as "no change".
    ``quality``: the answer-quality faults' inputs (:data:`QUALITY_FAULTS`)."""
    if (why_not := refusal(actor)) is not None:
        return Outcome(False, why_not)
    try:
        faults = parse_faults(error_pct, rate_limit_pct, latency_multiplier, base, quality)
    except FieldError as exc:
        return Outcome(False, f"{exc}. {NOTHING_WRITTEN}", field=exc.field)
    if faults == (get_faults(engine, provider) or base or FaultSettings()):
        return Outcome(False, f"No change: {provider} already has these fault settings. {NOTHING_WRITTEN}")
    set_faults(engine, provider, faults, actor=actor.name)
    message = (
        f"Fault injection for {provider}: {ratio_pct(faults.error_rate)} errors, "
        f"{ratio_pct(faults.rate_limit_rate)} 429s, latency x{faults.latency_multiplier:g}."
    )
    if bad := quality_faults_text(faults):
        message += f" Answers: {bad}."
    record_fault_change(engine, provider, message, actor=actor.name)  # a Monitor chart marker
    return Outcome(True, message)


def reset_faults(engine: Engine, provider: str, *, actor: Identity) -> Outcome:
    if (why_not := refusal(actor)) is not None:
        return Outcome(False, why_not)
    clear_faults(engine, provider)
    message = f"Fault injection for {provider} cleared: back to the configuration's values."
    record_fault_change(engine, provider, message, actor=actor.name)  # a Monitor chart marker
    return Outcome(True, message)


# -- what the page's inputs show -------------------------------------------------------------------


def input_percent(ratio: float) -> float:
    """A stored 0..1 ratio as the percent the page's inputs show (one decimal, like the slider)."""
    return round(ratio * 100, 1)


def quality_faults_text(f: FaultSettings) -> str:
    """The answer-quality faults in force, in words ("" when none)."""
    parts = [
        f"{ratio_pct(getattr(f, field))} {label.removesuffix(' (%)').lower()}"
        for field, label, bounds in QUALITY_FAULTS
        if bounds is None and getattr(f, field)
    ]
    if f.verbosity_multiplier != 1.0:
        parts.append(f"verbosity x{f.verbosity_multiplier:g}")
    if f.ttft_multiplier != 1.0:
        parts.append(f"TTFT x{f.ttft_multiplier:g}")
    return ", ".join(parts)


def fault_inputs(faults: FaultSettings) -> tuple[float, float, float]:
    """The fault form's values: error rate (%), 429 rate (%), latency multiplier."""
    return faults.error_rate * 100, faults.rate_limit_rate * 100, faults.latency_multiplier


def guardrail_summary(g: GuardrailSettings, primary: str, reading: GuardrailReading) -> tuple[str, str]:
    """The guardrail at a glance, for the top of the canary page: (``info`` | ``warning``, text)
    naming its state, its thresholds and what it sees now."""
    rule = (
        f"rolls the canary back to 0 % when {primary}'s error rate over {g.window_minutes} min is above "
        f"{ratio_pct(g.error_rate_threshold)} (once there are at least {g.min_requests} attempts)"
    )
    now = guardrail_status(reading, g.window_minutes)
    if g.enabled:
        return "info", f"Guardrail on: {rule}. Now: {now}."
    return "warning", f"Guardrail off: nothing rolls the canary back automatically. When on, it {rule}. Now: {now}."


def guardrail_status(reading: GuardrailReading, window_minutes: int) -> str:
    """What the guardrail sees now, e.g. ``2.0 % of 150 attempts failed in the last 5 min``."""
    seen = f"{pct(reading.error_rate)} of {reading.attempts} attempts failed" if reading.attempts else "no attempts"
    return f"{seen} in the last {window_minutes} min"


@dataclass(frozen=True)
class RouteCanary:
    """A route with a canary deployment, for the Canary page: its ratio as stored (0 until set)."""

    route: str
    canary: str  # "provider/model"
    baseline: str  # its other deployments, "provider/model, ..."
    state: CanaryState | None  # None: never set (0 %)

    @property
    def ratio(self) -> float:
        return self.state.ratio if self.state is not None else 0.0

    @property
    def version(self) -> int | None:
        return self.state.version if self.state is not None else None


def route_canaries(engine: Engine, settings: Settings) -> list[RouteCanary]:
    """Every ``[routes]`` entry that names a canary deployment, with its stored ratio. A route's
    row is created (at 0 %) the first time it is listed, so the page's Apply always locks on a
    version: a change made elsewhere after the page loaded is refused, never overwritten."""
    from app.config import deployment_model
    from db.canary import route_scope

    out = []
    for name, r in settings.routes.items():
        if r.canary is None:
            continue
        ensure_setting(engine, 0.0, route_scope(name))
        try:
            state: CanaryState | None = get_state(engine, route_scope(name))
        except LookupError:
            state = None
        baseline = ", ".join(f"{d.provider}/{deployment_model(name, d)}" for d in r.deployments)
        out.append(RouteCanary(name, f"{r.canary.provider}/{deployment_model(name, r.canary)}", baseline, state))
    return out
