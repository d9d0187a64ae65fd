"""Per-request key admission for the async server: rate limits and budgets from ``db.limits``, run
off the event loop, refusals turned into OpenAI 429 errors and counted in the metrics.

The driver calls :meth:`Admission.admit` before routing a request and :meth:`Admission.settle` when
it ends (served, failed or cancelled) with the real tokens and cost. Settling is shielded from
cancellation, so a client that disconnects mid-stream still has its spend recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio
import anyio.to_thread
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from app.server import wire
from app.server.metrics import GatewayMetrics
from db import limits
from db.keys import KeyRecord

log = logging.getLogger(__name__)


class Admission:
    def __init__(
        self, engine: Engine, metrics: GatewayMetrics | None = None, *, clock: Callable[[], float] = time.time
    ):
        self.engine = engine
        self.metrics = metrics
        self.clock = clock

    async def admit(
        self,
        key: KeyRecord,
        *,
        est_tokens: int = 0,
        est_cost_usd: float = 0.0,
        ceiling_cost_usd: float | None = None,
        worst_case: str = "",
    ) -> str:
        """The reservation id, or a :class:`wire.WireError` (429) when a limit or the budget refuses.
        ``est_cost_usd`` is the request's worst case, ``ceiling_cost_usd`` its model's (see
        :func:`db.limits.admit`)."""
        now = self.clock()
        try:
            decision = await anyio.to_thread.run_sync(
                lambda: limits.admit(
                    self.engine,
                    key,
                    est_tokens=est_tokens,
                    est_cost_usd=est_cost_usd,
                    ceiling_cost_usd=ceiling_cost_usd,
                    worst_case=worst_case,
                    now=now,
                )
            )
        except SQLAlchemyError as exc:
            # Fail closed: a key with limits or a budget is not served unchecked.
            log.warning("limits store not answering (%s): key %s refused with 503", type(exc).__name__, key.name)
            if self.metrics is not None:
                self.metrics.observe_key_denial("store_unavailable")
            raise wire.store_unavailable(f"the rate limits and budget of key {key.name!r} cannot be checked") from None
        if decision.allowed:
            assert decision.reservation_id is not None
            return decision.reservation_id
        if self.metrics is not None and decision.code:
            self.metrics.observe_key_denial(decision.code)
        if decision.code == limits.BUDGET_EXCEEDED:
            raise wire.budget_exceeded(decision.message + ".")  # it says which refusal it is, and the fix
        if decision.code == limits.BUDGET_RESERVED:
            # Not used up: a retry succeeds once the requests in flight settle (OpenAI's rate-limit
            # type, so clients retry it, unlike insufficient_quota).
            raise wire.WireError(
                429,
                decision.message + ".",
                type="requests",
                code=limits.BUDGET_RESERVED,
                headers={"Retry-After": str(decision.retry_after_s or 1)},
            )
        raise wire.rate_limited(
            decision.message + ".", decision.retry_after_s or 1, tokens=decision.code == limits.TOKENS_LIMITED
        )

    async def settle(self, key: KeyRecord, reservation_id: str, *, tokens: int, cost_usd: float) -> bool:
        """Record the request's real tokens and cost (exactly once; survives cancellation). When the
        database does not answer, the reservation stays as it is and is settled at its estimate
        later (``db.limits``); False then."""
        now = self.clock()
        with anyio.CancelScope(shield=True):
            try:
                settled = await anyio.to_thread.run_sync(
                    lambda: limits.settle(self.engine, reservation_id, tokens=tokens, cost_usd=cost_usd, now=now)
                )
                if settled and self.metrics is not None and key.budget_micro_usd is not None:
                    state = await anyio.to_thread.run_sync(lambda: limits.spend(self.engine, key, now=now))
                    if state is not None:
                        self.metrics.set_key_budget_used(key.name, state.period, state.used_ratio)
            except SQLAlchemyError as exc:
                log.warning("could not settle the spend of key %s: %s", key.name, type(exc).__name__)
                return False
        return bool(settled)
