"""``request_log``'s day partitions on PostgreSQL: which exist, creating them ahead of the rows, and
dropping whole days for retention (migration 0012 makes the table ``PARTITION BY RANGE (ts)``).

Why partitions: at 36 M requests a day a retention ``DELETE`` of a day's rows runs for minutes
(past any sane statement timeout) and leaves the table bloated; dropping the day's partition is a
catalog change that takes milliseconds however many rows it held.

Every bound is a UTC day boundary (epoch seconds that are multiples of 86,400), except the first
partition of a table that had rows before 0012 (``request_log_p_legacy``): the old table itself,
attached as ``FROM (MINVALUE) TO (<a day boundary>)`` so the migration copies nothing.

Partitions are created as rows arrive, not by a cron job: before a batch is inserted, the writer
makes sure every UTC day the batch touches, and the next one, has a partition (a process-wide set of
the days known to be covered makes that a set lookup on the hot path). There is no DEFAULT
partition on purpose: a DEFAULT partition would have to be scanned (under a lock) every time a day
partition is added, and rows that landed in it could never be dropped by day. A row for a day with
no partition cannot happen through :func:`db.requests.insert_batch`; if another process dropped the
day meanwhile, the insert fails with a check violation, the known-days set is cleared and the batch
is retried once.

The pure pieces (day arithmetic, names, reading a bound, which partitions a cutoff drops) are plain
functions; the catalog reads and DDL are the thin functions at the bottom.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

DAY_S = 86_400
PARENT = "request_log"
LEGACY = "request_log_p_legacy"
# One transaction-level advisory lock key for partition DDL, so two writers that reach a new day
# at the same moment do not both try to create its partition.
_DDL_LOCK_KEY = 0x72_6C_70_61  # "rlpa"


def day_floor(ts: float) -> int:
    """The start (epoch seconds, UTC) of the day holding ``ts``."""
    return math.floor(ts / DAY_S) * DAY_S


def partition_name(day: int) -> str:
    """``request_log_pYYYYMMDD`` for the day starting at ``day``."""
    import time

    return f"{PARENT}_p{time.strftime('%Y%m%d', time.gmtime(day))}"


@dataclass(frozen=True)
class Partition:
    """One partition and its range ``[lower, upper)``; ``None`` is MINVALUE / MAXVALUE."""

    name: str
    lower: float | None
    upper: float | None

    def covers(self, ts: float) -> bool:
        return (self.lower is None or ts >= self.lower) and (self.upper is None or ts < self.upper)


_BOUND = re.compile(r"FOR VALUES FROM \((.+?)\) TO \((.+?)\)")


def parse_bound(name: str, expr: str) -> Partition:
    """A partition from ``pg_get_expr(relpartbound)``, e.g. ``FOR VALUES FROM ('1764547200') TO
    ('1764633600')`` or ``FROM (MINVALUE) TO ('1764633600')``."""
    m = _BOUND.search(expr)
    if m is None:
        raise ValueError(f"partition {name} has a bound this code does not manage: {expr}")

    def value(v: str) -> float | None:
        v = v.strip().strip("'")
        return None if v in ("MINVALUE", "MAXVALUE") else float(v)

    return Partition(name, value(m.group(1)), value(m.group(2)))


def days_needed(timestamps: Iterable[float], ahead: int = 1) -> set[int]:
    """The day starts a batch with these ``timestamps`` writes into, plus ``ahead`` following days
    (so a new day's partition is usually created the day before, not by the first row after
    midnight)."""
    days: set[int] = set()
    for ts in timestamps:
        d = day_floor(ts)
        days.update(d + i * DAY_S for i in range(ahead + 1))
    return days


def missing_days(days: Iterable[int], existing: Iterable[Partition]) -> list[int]:
    """The days in ``days`` that no existing partition covers (all bounds are day boundaries, so a
    day is covered whole or not at all)."""
    parts = list(existing)
    return sorted(d for d in set(days) if not any(p.covers(d) for p in parts))


def droppable(parts: Iterable[Partition], cutoff: float) -> list[Partition]:
    """Partitions whose whole range is older than ``cutoff`` (the one holding the cutoff is kept
    whole: retention keeps at most one day more than asked, never less)."""
    return [p for p in parts if p.upper is not None and p.upper <= cutoff]


# -- catalog reads and DDL ---------------------------------------------------------------------------


def is_partitioned(conn: Connection) -> bool:
    """Whether ``request_log`` here is a partitioned table (PostgreSQL after migration 0012)."""
    if conn.dialect.name != "postgresql":
        return False
    kind = conn.execute(text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"), {"t": PARENT}).scalar()
    return kind == "p"


def list_partitions(conn: Connection) -> list[Partition]:
    """The partitions of ``request_log``, oldest first."""
    rows = conn.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(:t)"
        ),
        {"t": PARENT},
    ).all()
    parts = [parse_bound(name, expr) for name, expr in rows]
    return sorted(parts, key=lambda p: -math.inf if p.lower is None else p.lower)


def create_day(conn: Connection, day: int) -> str:
    """Create the partition of the day starting at ``day`` (it gets the parent's indexes)."""
    name = partition_name(day)
    conn.execute(
        text(f'CREATE TABLE IF NOT EXISTS "{name}" PARTITION OF {PARENT} FOR VALUES FROM ({day}) TO ({day + DAY_S})')
    )
    return name


class PartitionKeeper:
    """Days known to have a partition, per database, so the writer's check is a set lookup; the
    catalog is read (and DDL run) only for a day not seen before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, set[int]] = {}
        self._flat: set[str] = set()  # databases whose log is not partitioned

    def forget(self) -> None:
        """Re-read the catalog on the next batch (after a prune, or an insert that found no
        partition for its row)."""
        with self._lock:
            self._known.clear()
            self._flat.clear()

    def ensure(self, engine: Engine, timestamps: Iterable[float]) -> list[str]:
        """Make sure the days of ``timestamps`` (and the next day) have partitions; returns the
        partitions created. A no-op on SQLite or an unpartitioned table."""
        if engine.dialect.name != "postgresql":
            return []
        key = _key(engine)
        want = days_needed(timestamps)
        with self._lock:
            if key in self._flat or want <= self._known.get(key, set()):
                return []
        created: list[str] = []
        with engine.begin() as conn:
            if not is_partitioned(conn):
                with self._lock:
                    self._flat.add(key)
                return []
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _DDL_LOCK_KEY})
            for day in missing_days(want, list_partitions(conn)):
                created.append(create_day(conn, day))
        with self._lock:
            self._known.setdefault(key, set()).update(want)
        return created


def _key(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


KEEPER = PartitionKeeper()


def drop_before(conn: Connection, cutoff: float) -> tuple[list[str], int]:
    """Drop every partition wholly older than ``cutoff``; returns their names and the rows they
    held (from the planner's statistics when the partition was analysed, else counted: a day that
    autovacuum never analysed is small)."""
    names, rows = [], 0
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _DDL_LOCK_KEY})
    for p in droppable(list_partitions(conn), cutoff):
        est = conn.execute(text("SELECT reltuples FROM pg_class WHERE oid = to_regclass(:t)"), {"t": p.name}).scalar()
        if est is None or est < 0:
            est = conn.execute(text(f'SELECT count(*) FROM "{p.name}"')).scalar_one()
        rows += int(est)
        conn.execute(text(f'DROP TABLE "{p.name}"'))
        names.append(p.name)
    return names, rows
