"""The shadow phase's log: the candidate's answers to mirrored requests, and their baseline pairs.

A row is written once the candidate answered (or failed) a copy of a baseline request; the pair is
that row and the baseline request's final ``request_log`` row (same ``request_id``). Spend is the
sum of the rows' cost, which is what the shadow budget bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, insert, select

from db.models import RequestLog, ShadowLog

MAX_PAIRS = 50_000  # pairs read for one analysis (a shadow phase is bounded by its budget)


def insert_rows(engine: Engine, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        with engine.begin() as conn:
            conn.execute(insert(ShadowLog), list(rows))


def spent(engine: Engine, rollout_id: int) -> tuple[int, float]:
    """Mirrored requests answered so far and what they cost (USD)."""
    t = ShadowLog.__table__
    with engine.connect() as conn:
        n, usd = conn.execute(
            select(func.count(), func.coalesce(func.sum(t.c.cost_usd), 0.0)).where(t.c.rollout_id == rollout_id)
        ).one()
    return int(n), float(usd)


@dataclass(frozen=True)
class Pair:
    shadow: Any  # the candidate's row (shadow_log)
    baseline: Any  # the baseline request's final row (request_log)


def pairs(engine: Engine, rollout_id: int, *, limit: int = MAX_PAIRS) -> list[Pair]:
    """Every mirrored request of ``rollout_id`` whose baseline request is logged, oldest first."""
    s, r = ShadowLog.__table__, RequestLog.__table__
    base_cols = [c.label(f"b_{c.name}") for c in r.c]
    with engine.connect() as conn:
        rows = (
            conn.execute(
                select(s, *base_cols)
                .join(r, (r.c.request_id == s.c.request_id) & r.c.final.is_(True))
                .where(s.c.rollout_id == rollout_id)
                .order_by(s.c.id)
                .limit(limit)
            )
            .mappings()
            .all()
        )
    out = []
    for row in rows:
        shadow = _Row({c.name: row[c.name] for c in s.c}, attempt=1)
        base = _Row({c.name: row[f"b_{c.name}"] for c in r.c})
        out.append(Pair(shadow, base))
    return out


class _Row(dict):
    """A row read by attribute, as the analysis reads request_log rows."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None
