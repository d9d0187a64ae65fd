"""A rollout plan and a rollout's state: the data a progressive delivery is made of, validated once.

A plan names the candidate (the global canary's primary, or a route's canary deployment), the
weights it steps through (percent of the scope's traffic, strictly increasing, each in (0, 100]),
how long each step bakes, the samples every metric needs per arm before a step may pass, the
false-abort level ``alpha`` and whether it is a dry run (analysed and recorded, the weight never
moved) and, optionally, a shadow phase before the first step (``shadow_share`` of the baseline's
requests mirrored to the candidate, its answers discarded, until ``shadow_budget_usd`` is spent;
see :mod:`app.rollout.shadow`). Every number is parsed with its bounds before anything is written: ``nan``, ``1e400``,
steps that do not increase or leave (0, 100] are refused with one line saying which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from core.bounds import parse_float, parse_int
from core.errors import InvalidRequest

DEFAULT_STEPS: tuple[float, ...] = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0)
DEFAULT_BAKE_S = 600.0
DEFAULT_MIN_SAMPLES = 50
DEFAULT_ALPHA = 0.05
MAX_STEPS = 20
MAX_BAKE_S = 7 * 86400.0
MIN_BAKE_S = 1.0
MAX_MIN_SAMPLES = 1_000_000
MAX_SHADOW_BUDGET_USD = 1_000_000.0

RUNNING, PAUSED, ABORTED, COMPLETED = "running", "paused", "aborted", "completed"
STATES = (RUNNING, PAUSED, ABORTED, COMPLETED)
ACTIVE = (RUNNING, PAUSED)
#: The step index of the shadow phase: the candidate takes no real traffic (weight 0) and answers
#: mirrored copies of the baseline's requests.
SHADOW_STEP = -1


@dataclass(frozen=True)
class Plan:
    candidate: str
    route: str | None = None
    steps: tuple[float, ...] = DEFAULT_STEPS
    bake_s: float = DEFAULT_BAKE_S
    min_samples: int = DEFAULT_MIN_SAMPLES
    alpha: float = DEFAULT_ALPHA
    dry_run: bool = False
    shadow_share: float | None = None
    shadow_budget_usd: float | None = None


def parse_steps(raw: str | Sequence[str | float | int]) -> tuple[float, ...]:
    """Percents from ``"1,5,25,100"`` (or a sequence): each a finite number in (0, 100], strictly
    increasing, at most :data:`MAX_STEPS` of them."""
    items = [p.strip() for p in raw.split(",")] if isinstance(raw, str) else list(raw)
    if not items or items == [""]:
        raise InvalidRequest("--steps needs at least one weight, e.g. 1,5,25,100")
    if len(items) > MAX_STEPS:
        raise InvalidRequest(f"--steps has {len(items)} weights; at most {MAX_STEPS}")
    steps: list[float] = []
    for item in items:
        try:
            value = parse_float(item, field="each step", lo=0, lo_open=True, hi=100)
        except ValueError:
            raise InvalidRequest(f"--steps: {item!r} is not a percent in (0, 100]") from None
        if steps and value <= steps[-1]:
            raise InvalidRequest(f"--steps must increase: {value:g} follows {steps[-1]:g}")
        steps.append(value)
    return tuple(steps)


Number = str | float | int


def check_plan(
    *,
    candidate: str,
    route: str | None = None,
    steps: str | Sequence[Number] = DEFAULT_STEPS,
    bake_s: Number = DEFAULT_BAKE_S,
    min_samples: Number = DEFAULT_MIN_SAMPLES,
    alpha: Number = DEFAULT_ALPHA,
    dry_run: bool = False,
    shadow_share: Number | None = None,
    shadow_budget_usd: Number | None = None,
) -> Plan:
    """A :class:`Plan` from the operator's values (text or numbers), or :class:`InvalidRequest` /
    ``ValueError`` naming the first bad one."""
    candidate = (candidate or "").strip()
    if not candidate:
        raise InvalidRequest("--candidate must name a provider")
    shadow = (
        None if shadow_share is None else parse_float(shadow_share, field="--shadow-share", lo=0, lo_open=True, hi=1)
    )
    budget = (
        None
        if shadow_budget_usd is None
        else parse_float(shadow_budget_usd, field="--shadow-budget-usd", lo=0, lo_open=True, hi=MAX_SHADOW_BUDGET_USD)
    )
    if (shadow is None) != (budget is None):
        raise InvalidRequest("--shadow-share and --shadow-budget-usd go together")
    return Plan(
        candidate=candidate,
        route=route,
        steps=parse_steps(steps),
        bake_s=parse_float(bake_s, field="--bake-s", lo=MIN_BAKE_S, hi=MAX_BAKE_S),
        min_samples=parse_int(min_samples, field="--min-samples", lo=1, hi=MAX_MIN_SAMPLES),
        alpha=parse_float(alpha, field="--alpha", lo=0, lo_open=True, hi=0.5),
        dry_run=bool(dry_run),
        shadow_share=shadow,
        shadow_budget_usd=budget,
    )


def steps_text(steps: Sequence[float]) -> str:
    return ",".join(f"{s:g}" for s in steps)


@dataclass(frozen=True)
class RolloutState:
    """A stored rollout: its plan and where it stands."""

    id: int
    scope: str
    plan: Plan
    state: str
    step_index: int
    step_started_at: float
    started_at: float
    started_by: str
    reason: str
    updated_at: float
    last_reason: str
    version: int

    @property
    def shadowing(self) -> bool:
        """In the shadow phase (before the first step)."""
        return self.step_index == SHADOW_STEP

    @property
    def weight(self) -> float:
        """The current step's share of the scope's traffic, 0..1 (0 in the shadow phase)."""
        return 0.0 if self.shadowing else self.plan.steps[self.step_index] / 100.0

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def last_step(self) -> bool:
        return self.step_index >= len(self.plan.steps) - 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["weight"] = self.weight
        d["plan"]["steps"] = list(self.plan.steps)
        return d
