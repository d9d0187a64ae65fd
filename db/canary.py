"""Canary ratio, its audit trail and the guardrail setting: all their SQL.

Writes are optimistic-locked: a change names the version it was based on and is refused with
:class:`StaleCanaryError` (saying who changed it to what) if the row has moved on since. The update
and its audit row commit in one transaction, so the audit never disagrees with the setting.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from core.canary import GuardrailSettings, ratio_in_range
from core.errors import ConflictError, InvalidRequest
from db.models import CanaryAudit, CanarySetting, GuardrailSetting

SETTING_ID = 1
GLOBAL = "global"  # the scope of the two-sided canary (row 1)
MAX_REASON = 500
MAX_ACTOR = 128  # the width of the actor columns


@dataclass(frozen=True)
class CanaryState:
    ratio: float
    version: int
    updated_at: float
    updated_by: str
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AuditEntry:
    ts: float
    old_ratio: float
    new_ratio: float
    version: int
    actor: str
    reason: str
    scope: str = GLOBAL


def route_scope(route: str) -> str:
    """The scope of a route's canary ratio."""
    return f"route:{route}"


@dataclass(frozen=True)
class GuardrailState:
    enabled: bool
    error_rate_threshold: float
    window_minutes: int
    min_requests: int
    updated_at: float
    updated_by: str


class StaleCanaryError(ConflictError):
    """The ratio changed since the caller read it; nothing was written."""

    def __init__(self, current: CanaryState):
        self.current = current
        super().__init__(
            f"canary ratio was changed by {current.updated_by} to {current.ratio * 100:g} % "
            f"(version {current.version}) since you loaded it; reload and try again"
        )


def validate_ratio(ratio: object) -> float:
    """A ratio in 0..1 as float, or ``ValueError`` with a message fit for the operator."""
    if isinstance(ratio, bool):
        raise InvalidRequest("canary ratio must be a number between 0 and 1")
    try:
        value = float(ratio)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidRequest(f"canary ratio must be a number between 0 and 1, got {ratio!r}") from None
    if not ratio_in_range(value):
        raise InvalidRequest(f"canary ratio must be between 0 and 1 (0 % to 100 %), got {ratio!r}")
    return value


def _validate_text(name: str, value: str, *, required: bool, max_len: int = MAX_REASON) -> str:
    value = (value or "").strip()
    if required and not value:
        raise InvalidRequest(f"{name} is required")
    if len(value) > max_len:
        raise InvalidRequest(f"{name} is too long ({len(value)} characters, at most {max_len})")
    return value


def ensure_setting(engine: Engine, initial_ratio: float, scope: str = GLOBAL) -> None:
    """Create a scope's setting row on a new database (first writer wins; later calls do nothing).
    A route's canary starts at ``initial_ratio`` too (0 unless the caller says otherwise)."""
    with engine.connect() as conn:
        if conn.execute(select(CanarySetting.id).where(CanarySetting.scope == scope)).first():
            return
    for _ in range(5):
        try:
            with engine.begin() as conn:
                if scope == GLOBAL:
                    row_id = SETTING_ID
                else:
                    top = conn.execute(select(func.max(CanarySetting.id))).scalar_one_or_none() or SETTING_ID
                    row_id = max(int(top), SETTING_ID) + 1
                conn.execute(
                    insert(CanarySetting).values(
                        id=row_id,
                        ratio=validate_ratio(initial_ratio),
                        version=1,
                        updated_at=time.time(),
                        updated_by="config",
                        reason="initial ratio from gateway config",
                        scope=scope,
                    )
                )
            return
        except IntegrityError:  # another process created it, or took the id first
            with engine.connect() as conn:
                if conn.execute(select(CanarySetting.id).where(CanarySetting.scope == scope)).first():
                    return


def get_state(engine: Engine, scope: str = GLOBAL) -> CanaryState:
    with engine.connect() as conn:
        row = conn.execute(select(CanarySetting).where(CanarySetting.scope == scope)).mappings().first()
    if row is None:
        raise LookupError(f"canary setting {scope!r} not initialised (call ensure_setting first)")
    return CanaryState(
        ratio=row["ratio"],
        version=row["version"],
        updated_at=row["updated_at"],
        updated_by=row["updated_by"],
        reason=row["reason"],
    )


def read_ratio_version(engine: Engine) -> tuple[float, int]:
    """The cheapest read of the current ratio, for the routers' once-a-second refresh."""
    with engine.connect() as conn:
        row = conn.execute(
            select(CanarySetting.ratio, CanarySetting.version).where(CanarySetting.id == SETTING_ID)
        ).first()
    if row is None:
        raise LookupError("canary setting not initialised")
    return float(row[0]), int(row[1])


def read_route_ratios(engine: Engine) -> dict[str, float]:
    """Every route's canary ratio (routes whose row does not exist yet: absent, meaning 0)."""
    prefix = route_scope("")
    with engine.connect() as conn:
        rows = conn.execute(
            select(CanarySetting.scope, CanarySetting.ratio).where(CanarySetting.scope.startswith(prefix))
        ).all()
    return {scope[len(prefix) :]: float(ratio) for scope, ratio in rows}


def set_ratio(
    engine: Engine,
    new_ratio: object,
    *,
    expected_version: int | None,
    actor: str,
    reason: str,
    now: float | None = None,
    scope: str = GLOBAL,
) -> CanaryState:
    """Change a scope's ratio; with ``expected_version`` refuse if it moved on (optimistic lock).

    Without ``expected_version`` the change applies on top of whatever is current (the CLI).
    """
    ratio = validate_ratio(new_ratio)
    actor = _validate_text("actor", actor, required=True, max_len=MAX_ACTOR)
    reason = _validate_text("reason", reason, required=True)
    if scope != GLOBAL:
        ensure_setting(engine, 0.0, scope)
    for _ in range(20):
        current = get_state(engine, scope)
        base = current.version if expected_version is None else expected_version
        if base != current.version:
            raise StaleCanaryError(current)
        ts = time.time() if now is None else now
        with engine.begin() as conn:
            # Write first: the UPDATE takes the write lock, so nothing can slip in between it and
            # the audit insert, and a stale version matches no row.
            res = conn.execute(
                update(CanarySetting)
                .where(CanarySetting.scope == scope, CanarySetting.version == base)
                .values(ratio=ratio, version=base + 1, updated_at=ts, updated_by=actor, reason=reason)
            )
            if res.rowcount == 1:
                conn.execute(
                    insert(CanaryAudit).values(
                        ts=ts,
                        old_ratio=current.ratio,
                        new_ratio=ratio,
                        version=base + 1,
                        actor=actor,
                        reason=reason,
                        scope=scope,
                    )
                )
                return CanaryState(ratio, base + 1, ts, actor, reason)
        if expected_version is not None:
            raise StaleCanaryError(get_state(engine, scope))
    raise ConflictError("canary ratio is changing too fast to apply; try again")


def audit_log(
    engine: Engine, limit: int = 200, since: float | None = None, scope: str | None = None
) -> list[AuditEntry]:
    """The newest changes first; ``scope`` None: every scope's."""
    q = select(CanaryAudit).order_by(CanaryAudit.ts.desc(), CanaryAudit.id.desc()).limit(limit)
    if since is not None:
        q = q.where(CanaryAudit.ts >= since)
    if scope is not None:
        q = q.where(CanaryAudit.scope == scope)
    with engine.connect() as conn:
        rows = conn.execute(q).mappings().all()
    return [
        AuditEntry(r["ts"], r["old_ratio"], r["new_ratio"], r["version"], r["actor"], r["reason"], r["scope"])
        for r in rows
    ]


def audit_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(CanaryAudit)).scalar_one())


def get_guardrail(engine: Engine, defaults: GuardrailSettings | None = None) -> GuardrailState:
    """The stored guardrail setting, or ``defaults`` (the config's) when none was saved."""
    with engine.connect() as conn:
        row = conn.execute(select(GuardrailSetting).where(GuardrailSetting.id == SETTING_ID)).mappings().first()
    if row is None:
        d = (defaults or GuardrailSettings()).model_dump()
        return GuardrailState(updated_at=0.0, updated_by="config", **d)
    return GuardrailState(
        enabled=row["enabled"],
        error_rate_threshold=row["error_rate_threshold"],
        window_minutes=row["window_minutes"],
        min_requests=row["min_requests"],
        updated_at=row["updated_at"],
        updated_by=row["updated_by"],
    )


def set_guardrail(
    engine: Engine, *, enabled: bool, error_rate_threshold: float, window_minutes: int, min_requests: int, actor: str
) -> GuardrailState:
    g = GuardrailSettings.checked(
        enabled=enabled,
        error_rate_threshold=error_rate_threshold,
        window_minutes=window_minutes,
        min_requests=min_requests,
    )
    actor = _validate_text("actor", actor, required=True, max_len=MAX_ACTOR)
    values = dict(**g.model_dump(), updated_at=time.time(), updated_by=actor)
    with engine.begin() as conn:
        res = conn.execute(update(GuardrailSetting).where(GuardrailSetting.id == SETTING_ID).values(**values))
        if res.rowcount == 0:
            conn.execute(insert(GuardrailSetting).values(id=SETTING_ID, **values))
    return GuardrailState(**values)
