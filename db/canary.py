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


def ensure_setting(engine: Engine, initial_ratio: float) -> None:
    """Create the setting row on a new database (first writer wins; later calls do nothing)."""
    with engine.connect() as conn:
        if conn.execute(select(CanarySetting.id).where(CanarySetting.id == SETTING_ID)).first():
            return
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(CanarySetting).values(
                    id=SETTING_ID,
                    ratio=validate_ratio(initial_ratio),
                    version=1,
                    updated_at=time.time(),
                    updated_by="config",
                    reason="initial ratio from gateway config",
                )
            )
    except IntegrityError:
        pass  # another process created it first


def get_state(engine: Engine) -> CanaryState:
    with engine.connect() as conn:
        row = conn.execute(select(CanarySetting).where(CanarySetting.id == SETTING_ID)).mappings().first()
    if row is None:
        raise LookupError("canary setting not initialised (call ensure_setting first)")
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


def set_ratio(
    engine: Engine,
    new_ratio: object,
    *,
    expected_version: int | None,
    actor: str,
    reason: str,
    now: float | None = None,
) -> CanaryState:
    """Change the ratio; with ``expected_version`` refuse if it moved on (optimistic lock).

    Without ``expected_version`` the change applies on top of whatever is current (the CLI).
    """
    ratio = validate_ratio(new_ratio)
    actor = _validate_text("actor", actor, required=True, max_len=MAX_ACTOR)
    reason = _validate_text("reason", reason, required=True)
    for _ in range(20):
        current = get_state(engine)
        base = current.version if expected_version is None else expected_version
        if base != current.version:
            raise StaleCanaryError(current)
        ts = time.time() if now is None else now
        with engine.begin() as conn:
            # Write first: the UPDATE takes the write lock, so nothing can slip in between it and
            # the audit insert, and a stale version matches no row.
            res = conn.execute(
                update(CanarySetting)
                .where(CanarySetting.id == SETTING_ID, CanarySetting.version == base)
                .values(ratio=ratio, version=base + 1, updated_at=ts, updated_by=actor, reason=reason)
            )
            if res.rowcount == 1:
                conn.execute(
                    insert(CanaryAudit).values(
                        ts=ts, old_ratio=current.ratio, new_ratio=ratio, version=base + 1, actor=actor, reason=reason
                    )
                )
                return CanaryState(ratio, base + 1, ts, actor, reason)
        if expected_version is not None:
            raise StaleCanaryError(get_state(engine))
    raise ConflictError("canary ratio is changing too fast to apply; try again")


def audit_log(engine: Engine, limit: int = 200, since: float | None = None) -> list[AuditEntry]:
    q = select(CanaryAudit).order_by(CanaryAudit.ts.desc(), CanaryAudit.id.desc()).limit(limit)
    if since is not None:
        q = q.where(CanaryAudit.ts >= since)
    with engine.connect() as conn:
        rows = conn.execute(q).mappings().all()
    return [AuditEntry(r["ts"], r["old_ratio"], r["new_ratio"], r["version"], r["actor"], r["reason"]) for r in rows]


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
