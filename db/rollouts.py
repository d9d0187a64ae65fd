"""Rollouts and the controller's lease: all their SQL.

A rollout's every change (start, step, pause, resume, abort, completion) is one transaction that
updates the rollout row (optimistic-locked on its ``version``), moves its scope's canary ratio
through the canary's own locked write path and writes that change's audit row with its reason, so
the audit, the ratio and the rollout never disagree. A dry run writes the audit row with the ratio
unchanged.

The controller's writes are also *fenced*: they carry the lease token the controller holds, and the
transaction first updates the lease row ``WHERE holder = :me AND token = :token AND expires_at >
:now``. A process whose lease expired or was taken over (a paused VM, a long GC, a partition) finds
no such row and writes nothing, however late its write arrives: the token only ever grows. On
PostgreSQL that first update also locks the lease row, so a takeover waits for an in-flight write
to commit and then sees the renewed expiry; on SQLite the transaction takes the write lock up front.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from core.errors import ConflictError, InvalidRequest
from core.rollout import ACTIVE, COMPLETED, SHADOW_STEP, Plan, RolloutState, parse_steps, steps_text
from db.canary import GLOBAL, MAX_ACTOR, MAX_REASON, CanaryState, StaleCanaryError, ensure_setting
from db.models import CanaryAudit, CanarySetting, Rollout, RolloutLease

LEASE = "rollout-controller"


class LeaseLost(ConflictError):
    """The caller's fencing token is no longer the lease's (expired or taken over): nothing written."""


class StaleRollout(ConflictError):
    """The rollout changed since the caller read it: nothing written."""


@dataclass(frozen=True)
class Fence:
    """The lease a controller holds: its name, the holder and the token every write checks."""

    holder: str
    token: int
    name: str = LEASE


def _state(row) -> RolloutState:
    plan = Plan(
        candidate=row["candidate"],
        route=row["route"],
        steps=parse_steps(row["steps"]),
        bake_s=float(row["bake_s"]),
        min_samples=int(row["min_samples"]),
        alpha=float(row["alpha"]),
        dry_run=bool(row["dry_run"]),
        shadow_share=row["shadow_share"],
        shadow_budget_usd=row["shadow_budget_usd"],
    )
    return RolloutState(
        id=int(row["id"]),
        scope=row["scope"],
        plan=plan,
        state=row["state"],
        step_index=int(row["step_index"]),
        step_started_at=float(row["step_started_at"]),
        started_at=float(row["started_at"]),
        started_by=row["started_by"],
        reason=row["reason"],
        updated_at=float(row["updated_at"]),
        last_reason=row["last_reason"],
        version=int(row["version"]),
    )


def _clip(text: str, n: int = MAX_REASON) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _write_ratio(
    conn: Connection, scope: str, ratio: float | None, *, actor: str, reason: str, ts: float,
    expected_version: int | None,
) -> CanaryState:  # fmt: skip
    """The canary's locked write inside the caller's transaction: ``ratio`` None keeps the ratio
    (an audit row all the same, with the version raised, so every rollout event is in the trail)."""
    row = conn.execute(select(CanarySetting).where(CanarySetting.scope == scope)).mappings().first()
    if row is None:
        raise LookupError(f"canary setting {scope!r} not initialised")
    current = CanaryState(row["ratio"], row["version"], row["updated_at"], row["updated_by"], row["reason"])
    if expected_version is not None and expected_version != current.version:
        raise StaleCanaryError(current)
    new = current.ratio if ratio is None else ratio
    res = conn.execute(
        update(CanarySetting)
        .where(CanarySetting.scope == scope, CanarySetting.version == current.version)
        .values(ratio=new, version=current.version + 1, updated_at=ts, updated_by=actor, reason=reason)
    )
    if res.rowcount != 1:
        raise StaleCanaryError(current)
    conn.execute(
        insert(CanaryAudit).values(
            ts=ts, old_ratio=current.ratio, new_ratio=new, version=current.version + 1, actor=actor,
            reason=reason, scope=scope,
        )
    )  # fmt: skip
    return CanaryState(new, current.version + 1, ts, actor, reason)


def _check_fence(conn: Connection, fence: Fence | None, now: float) -> None:
    if fence is None:
        return
    res = conn.execute(
        update(RolloutLease)
        .where(
            RolloutLease.name == fence.name,
            RolloutLease.holder == fence.holder,
            RolloutLease.token == fence.token,
            RolloutLease.expires_at > now,
        )
        .values(token=fence.token)
    )
    if res.rowcount != 1:
        raise LeaseLost(f"lease {fence.name!r} token {fence.token} is no longer {fence.holder}'s; nothing written")


def start(engine: Engine, plan: Plan, *, scope: str, actor: str, reason: str, now: float | None = None) -> RolloutState:
    """Store a new running rollout at its first step and move the scope's ratio there (a dry run
    leaves the ratio); with a shadow phase, at that phase (step :data:`SHADOW_STEP`) with the ratio
    at 0, the candidate answering only mirrored requests. Refused when the scope already has an
    active rollout."""
    ts = time.time() if now is None else now
    actor, reason = _clip(actor, MAX_ACTOR), _clip(reason)
    ensure_setting(engine, 0.0, scope)
    shadow = plan.shadow_share is not None
    first = 0.0 if shadow else plan.steps[0]
    where = (
        f"in a shadow phase ({plan.shadow_share * 100:g} % mirrored, budget {plan.shadow_budget_usd:g} USD)"
        if plan.shadow_share is not None
        else f"at {first:g} %"
    )
    audit = (
        f"rollout start{' (dry run)' if plan.dry_run else ''} of {plan.candidate} {where} "
        f"(steps {steps_text(plan.steps)}, bake {plan.bake_s:g} s): {reason}"
    )
    try:
        with engine.connect().execution_options(sqlite_immediate=True) as conn, conn.begin():
            rid = conn.execute(
                insert(Rollout).values(
                    scope=scope, active_scope=scope, candidate=plan.candidate, route=plan.route,
                    steps=steps_text(plan.steps), bake_s=plan.bake_s, min_samples=plan.min_samples,
                    alpha=plan.alpha, dry_run=plan.dry_run, shadow_share=plan.shadow_share,
                    shadow_budget_usd=plan.shadow_budget_usd, state="running", step_index=SHADOW_STEP if shadow else 0,
                    step_started_at=ts, started_at=ts, started_by=actor, reason=reason, updated_at=ts,
                    last_reason=_clip(audit), version=1,
                )
            ).inserted_primary_key[0]  # type: ignore[index]  # fmt: skip
            _write_ratio(conn, scope, None if plan.dry_run else first / 100.0, actor=actor,
                         reason=_clip(f"#{rid} {audit}"), ts=ts, expected_version=None)  # fmt: skip
    except IntegrityError:
        busy = active(engine, scope)
        which = f" (#{busy.id}, {busy.state} at {busy.weight * 100:g} %)" if busy else ""
        raise InvalidRequest(f"{scope} already has an active rollout{which}; abort or finish it first") from None
    got = get(engine, int(rid))
    assert got is not None
    return got


def apply(
    engine: Engine,
    current: RolloutState,
    *,
    state: str,
    step_index: int,
    ratio: float | None,
    actor: str,
    reason: str,
    now: float | None = None,
    fence: Fence | None = None,
    expected_canary_version: int | None = None,
    restart_clock: bool = False,
) -> RolloutState:
    """Move ``current`` to ``state`` at ``step_index`` (a new step restarts its bake clock) and the
    scope's ratio to ``ratio`` (None: unchanged), with ``reason`` in the audit; refused with
    :class:`StaleRollout` if the rollout moved on (``restart_clock``: the step's bake starts again,
    as on resume), :class:`LeaseLost` if ``fence`` is no longer
    valid, :class:`StaleCanaryError` if the ratio moved since ``expected_canary_version``."""
    ts = time.time() if now is None else now
    reason = _clip(f"#{current.id} {reason}")
    step_started = ts if restart_clock or step_index != current.step_index else current.step_started_at
    with engine.connect().execution_options(sqlite_immediate=True) as conn, conn.begin():
        _check_fence(conn, fence, ts)
        res = conn.execute(
            update(Rollout)
            .where(Rollout.id == current.id, Rollout.version == current.version)
            .values(
                state=state,
                active_scope=current.scope if state in ACTIVE else None,
                step_index=step_index,
                step_started_at=step_started,
                updated_at=ts,
                last_reason=reason,
                version=current.version + 1,
            )
        )
        if res.rowcount != 1:
            raise StaleRollout(f"rollout #{current.id} changed since it was read; nothing written")
        _write_ratio(conn, current.scope, ratio, actor=_clip(actor, MAX_ACTOR), reason=reason, ts=ts,
                     expected_version=expected_canary_version)  # fmt: skip
    got = get(engine, current.id)
    assert got is not None
    return got


def get(engine: Engine, rollout_id: int) -> RolloutState | None:
    with engine.connect() as conn:
        row = conn.execute(select(Rollout).where(Rollout.id == rollout_id)).mappings().first()
    return None if row is None else _state(row)


def active(engine: Engine, scope: str | None = None) -> RolloutState | None:
    """The scope's running or paused rollout (``scope`` None: any scope's, the oldest first)."""
    q = select(Rollout).where(Rollout.active_scope.is_not(None)).order_by(Rollout.id)
    if scope is not None:
        q = q.where(Rollout.active_scope == scope)
    with engine.connect() as conn:
        row = conn.execute(q.limit(1)).mappings().first()
    return None if row is None else _state(row)


def all_active(engine: Engine) -> list[RolloutState]:
    with engine.connect() as conn:
        rows = conn.execute(select(Rollout).where(Rollout.active_scope.is_not(None)).order_by(Rollout.id)).mappings()
        return [_state(r) for r in rows]


def latest(engine: Engine, scope: str | None = None) -> RolloutState | None:
    """The scope's newest rollout, active or ended (``scope`` None: any scope's)."""
    q = select(Rollout).order_by(Rollout.id.desc()).limit(1)
    if scope is not None:
        q = q.where(Rollout.scope == scope)
    with engine.connect() as conn:
        row = conn.execute(q).mappings().first()
    return None if row is None else _state(row)


def history(engine: Engine, rollout: RolloutState, limit: int = 500) -> list[tuple[float, float, float, str, str]]:
    """The rollout's audit rows, oldest first: ``(ts, old_ratio, new_ratio, actor, reason)``."""
    prefix = f"#{rollout.id} "
    q = (
        select(CanaryAudit.ts, CanaryAudit.old_ratio, CanaryAudit.new_ratio, CanaryAudit.actor, CanaryAudit.reason)
        .where(CanaryAudit.scope == rollout.scope, CanaryAudit.ts >= rollout.started_at,
               CanaryAudit.reason.startswith(prefix, autoescape=True))
        .order_by(CanaryAudit.ts, CanaryAudit.id)
        .limit(limit)
    )  # fmt: skip
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(q).all()]  # type: ignore[misc]


# -- the lease ---------------------------------------------------------------------------------------


def acquire_lease(engine: Engine, holder: str, *, ttl_s: float, now: float, name: str = LEASE) -> Fence | None:
    """Renew the lease when ``holder`` has it, take it when it expired (a new, larger token), else
    ``None``: another process acts."""
    with engine.connect() as conn:
        exists = conn.execute(select(RolloutLease.name).where(RolloutLease.name == name)).first()
    if exists is None:
        try:
            with engine.begin() as conn:
                conn.execute(insert(RolloutLease).values(name=name, holder=holder, token=1, expires_at=now + ttl_s))
            return Fence(holder, 1, name)
        except IntegrityError:
            pass  # another process created it first
    with engine.connect().execution_options(sqlite_immediate=True) as conn, conn.begin():
        renewed = conn.execute(
            update(RolloutLease)
            .where(RolloutLease.name == name, RolloutLease.holder == holder, RolloutLease.expires_at > now)
            .values(expires_at=now + ttl_s)
        ).rowcount
        if not renewed:
            taken = conn.execute(
                update(RolloutLease)
                .where(RolloutLease.name == name, RolloutLease.expires_at <= now)
                .values(holder=holder, token=RolloutLease.token + 1, expires_at=now + ttl_s)
            ).rowcount
            if not taken:
                return None
        token = conn.execute(select(RolloutLease.token).where(RolloutLease.name == name)).scalar_one()
    return Fence(holder, int(token), name)


def release_lease(engine: Engine, holder: str, *, name: str = LEASE) -> None:
    """Let the lease go at once (a clean exit), so another process need not wait out its expiry."""
    with engine.begin() as conn:
        conn.execute(
            update(RolloutLease).where(RolloutLease.name == name, RolloutLease.holder == holder).values(expires_at=0.0)
        )


def lease_holder(engine: Engine, *, name: str = LEASE) -> tuple[str, int, float] | None:
    with engine.connect() as conn:
        row = conn.execute(
            select(RolloutLease.holder, RolloutLease.token, RolloutLease.expires_at).where(RolloutLease.name == name)
        ).first()
    return None if row is None else (row[0], int(row[1]), float(row[2]))


__all__ = [
    "COMPLETED",
    "GLOBAL",
    "Fence",
    "LeaseLost",
    "StaleRollout",
    "acquire_lease",
    "active",
    "all_active",
    "apply",
    "get",
    "history",
    "latest",
    "release_lease",
    "start",
]
