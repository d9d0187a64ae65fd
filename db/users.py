"""Dashboard accounts and the sign-in throttle: all their SQL.

The throttle row for a key counts failed sign-ins; the increment is one atomic upsert with
``RETURNING`` (SQLite and PostgreSQL both have it), so two dashboard processes sharing a database
cannot lose a failure between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from db.models import DashboardUser, SigninThrottle


@dataclass(frozen=True)
class UserRow:
    name: str
    role: str
    password_hash: str
    created_at: float
    created_by: str


class DuplicateUser(ValueError):
    pass


def insert_user(engine: Engine, row: UserRow) -> None:
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(DashboardUser).values(
                    name=row.name,
                    role=row.role,
                    password_hash=row.password_hash,
                    created_at=row.created_at,
                    created_by=row.created_by,
                )
            )
    except IntegrityError:
        raise DuplicateUser(row.name) from None


def get_user(engine: Engine, name: str) -> UserRow | None:
    with engine.connect() as conn:
        r = conn.execute(select(DashboardUser.__table__).where(DashboardUser.name == name)).mappings().first()
    return UserRow(**r) if r else None


def all_users(engine: Engine) -> list[UserRow]:
    with engine.connect() as conn:
        rows = conn.execute(select(DashboardUser.__table__).order_by(DashboardUser.name)).mappings().all()
    return [UserRow(**r) for r in rows]


def delete_user(engine: Engine, name: str) -> bool:
    with engine.begin() as conn:
        return conn.execute(delete(DashboardUser).where(DashboardUser.name == name)).rowcount > 0


def update_user(engine: Engine, name: str, **values: object) -> bool:
    with engine.begin() as conn:
        return conn.execute(update(DashboardUser).where(DashboardUser.name == name).values(**values)).rowcount > 0


def count_users(engine: Engine) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(DashboardUser.name)).all())


# -- sign-in throttle ------------------------------------------------------------------------------


def blocked_until(engine: Engine, key: str) -> float:
    with engine.connect() as conn:
        v = conn.execute(select(SigninThrottle.blocked_until).where(SigninThrottle.key == key)).scalar()
    return float(v) if v is not None else 0.0


def add_failure(engine: Engine, key: str, now: float, forget_after_s: float) -> int:
    """Count one failed sign-in (failures older than ``forget_after_s`` start the count anew);
    returns the failure count including this one."""
    table = SigninThrottle.__table__
    ins = (sqlite if engine.dialect.name == "sqlite" else postgresql).insert(table)
    stmt = ins.values(key=key, failures=1, last_failure=now, blocked_until=0.0).on_conflict_do_update(
        index_elements=["key"],
        set_={
            "failures": _case_stale(table, now - forget_after_s),
            "last_failure": now,
        },
    )
    with engine.begin() as conn:
        return int(conn.execute(stmt.returning(table.c.failures)).scalar_one())


def _case_stale(table, stale_before: float):
    from sqlalchemy import case

    return case((table.c.last_failure < stale_before, 1), else_=table.c.failures + 1)


def set_blocked_until(engine: Engine, key: str, until: float) -> None:
    with engine.begin() as conn:
        conn.execute(update(SigninThrottle).where(SigninThrottle.key == key).values(blocked_until=until))


def clear_failures(engine: Engine, key: str) -> None:
    with engine.begin() as conn:
        conn.execute(delete(SigninThrottle).where(SigninThrottle.key == key))
