"""An anytime-valid test that a candidate's event rate (errors, refusals, truncations, ...) is not
worse than the baseline's, read as often as one likes.

The data are the events themselves, each with the candidate's traffic share at the moment it
happened. A request goes to the candidate with probability ``w`` (the weight in force), and an event
follows with probability ``p_c`` on the candidate and ``p_b`` on the baseline. Given that an event
happened, it is the candidate's with probability

    q(theta) = w * theta / (w * theta + 1 - w),   theta = p_c / p_b,

which no longer depends on the baseline's own rate: the nuisance is gone, and so is any need to
estimate it (Lindon & Malek, "Anytime-valid inference for multinomial count data", NeurIPS 2022,
test counts as Poisson processes the same way). The weight may change between events (a rollout's
steps): it only has to be known before the event's arm is seen.

The null is ``theta <= theta0`` (the candidate is at most ``theta0`` times the baseline: ``theta0 =
1 + allowed increase``). The statistic is a mixture of likelihood ratios of alternatives ``theta1 >
theta0`` (a fixed grid, equal weights) against ``theta0``. Under the null it is a non-negative
supermartingale starting at 1: for each event, ``E[LR factor] = 1 + (q(theta) - q(theta0)) * (...)``
with a positive bracket, so ``<= 1`` whenever ``theta <= theta0``. Ville's inequality then bounds
the chance that it *ever* reaches ``1 / alpha`` by ``alpha``: the test may be read after every event
and the false-alarm probability stays at most ``alpha``. The always-valid p-value is
``min(1, 1 / max LR so far)``. Several metrics share one ``alpha`` by splitting it (Bonferroni,
weighted: ``sum alpha_i = alpha``), which keeps the overall false-abort probability at most ``alpha``.

**The guarantee**, stated once: if, for every event, the probability that it is the candidate's
given everything before it is at most ``q(share, theta0)`` with the ``share`` passed for it, then
``P(the test ever rejects) <= alpha``, whenever and however often it is read and whatever rule
chose each share from the data before it (a controller that holds a step longer while a metric
leans against the candidate, or steps on, keeps it). The premise holds when each request goes to
the candidate with probability ``share`` on its own (a random draw per request) and the candidate's
rate is at most ``theta0`` times the baseline's at every moment; the baseline's rate may drift.

**Units larger than a request**: the same statistic read as a bet on experimental units. A unit (a
sticky session's run of requests, :mod:`core.units`) is on the candidate with a known probability
``share`` given everything before it; a unit in which the event happened at least once is observed
as one event at that share, a unit without it is not observed. For alternative ``theta1`` the factor
of a unit is ``1 + lambda (A / share - theta0 (1 - A) / (1 - share))`` when it had the event and 1
when not, with ``lambda = share (1 - share) (theta1 - theta0) / (theta0 (share theta1 + 1 - share))``
(the likelihood-ratio factors above, rewritten), so its expectation given the past is ``1 + lambda
(P_c - theta0 P_b)``, where ``P_c`` and ``P_b`` are the chances that the unit has the event on each
arm. Under the null ``P_c <= theta0 P_b`` for every unit (given everything before it) each factor
has mean at most 1, the statistic is again a non-negative supermartingale and Ville's inequality
gives the same ``P(ever rejects) <= alpha``. Nothing is assumed about the requests *inside* a unit:
a session's requests may be as correlated as they like, because the unit counts once. A request
without a session is a unit of one request, and the test is the per-request one.

- *Sticky sessions* break the per-request premise (a request of a session already on the candidate
  goes there with probability 1), so the analysis never feeds a session's requests as separate
  events: each session's run of requests is one unit whose ``share`` is the probability of its arm
  given what was seen of that session before (:mod:`core.units`), and the unit form holds.
- *Paired events* (the shadow phase: both arms answer the same request) use ``share = 1/2``: under
  the null that a pair's two answers are exchangeable, an event of one arm only is the candidate's
  with probability 1/2, and a pair where both arms have the event multiplies the statistic by
  ``4 q (1 - q) <= 1``; the guarantee holds.

``benchmarks/rollouts_bench.py`` checks the guarantee by simulation (healthy candidates) and
measures how fast regressions are caught.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Alternatives mixed over: rate ratios above theta0 by these factors (a regression of 10 % up to
#: 20x). Equal weights; a finer grid changes little, a wider one costs power at small effects.
DEFAULT_FACTORS: tuple[float, ...] = (1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 10.0, 20.0)


def _q(w: float, theta: float) -> float:
    return w * theta / (w * theta + 1.0 - w)


@dataclass
class RateRatioTest:
    """One count metric's test; :meth:`observe` each event as it comes."""

    theta0: float = 1.0
    alpha: float = 0.05
    factors: Sequence[float] = DEFAULT_FACTORS

    def __post_init__(self) -> None:
        if not (self.theta0 > 0 and math.isfinite(self.theta0)):
            raise ValueError(f"theta0 must be a positive finite number, got {self.theta0!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be between 0 and 1, got {self.alpha!r}")
        if not self.factors or any(not (f > 1 and math.isfinite(f)) for f in self.factors):
            raise ValueError("factors must be finite numbers above 1")
        self._thetas = [self.theta0 * f for f in self.factors]
        self._log_lr = [0.0] * len(self._thetas)  # log LR of each alternative against theta0
        self.events = 0
        self.candidate_events = 0
        self.max_lr = 1.0

    def observe(self, candidate: bool, share: float) -> None:
        """One event: whether it was the candidate's, and the candidate's traffic share ``share``
        (0..1) in force when its request was routed (for a unit, the probability that the unit is
        the candidate's given everything seen before it). A share of 0 or 1 says nothing (every
        event is one arm's) and is skipped, as is a share that is not a number."""
        if not (0.0 < share < 1.0):  # also refuses nan
            return
        self.events += 1
        self.candidate_events += bool(candidate)
        q0 = _q(share, self.theta0)
        for i, theta in enumerate(self._thetas):
            q1 = _q(share, theta)
            self._log_lr[i] += math.log(q1 / q0) if candidate else math.log((1.0 - q1) / (1.0 - q0))
        self.max_lr = max(self.max_lr, self.lr)

    @property
    def lr(self) -> float:
        """The mixture likelihood ratio now (the e-value)."""
        top = max(self._log_lr)
        return math.exp(top) * sum(math.exp(x - top) for x in self._log_lr) / len(self._log_lr)

    @property
    def p_value(self) -> float:
        """Always valid: the chance, under the null, of a statistic ever this large."""
        return min(1.0, 1.0 / self.max_lr)

    @property
    def rejected(self) -> bool:
        """The candidate is worse than ``theta0`` times the baseline (at level ``alpha``, however
        often this was read)."""
        return self.max_lr >= 1.0 / self.alpha

    def estimate(self, exposures: tuple[float, float]) -> float | None:
        """The observed rate ratio given the arms' request counts ``(candidate, baseline)``."""
        nc, nb = exposures
        base = self.events - self.candidate_events
        if nc <= 0 or nb <= 0 or base <= 0:
            return None
        return (self.candidate_events / nc) / (base / nb)
