"""``python -m benchmarks rollouts``: the rollout analysis checked by simulation, through the real
test (:class:`core.sequential.RateRatioTest`).

Seeded rollouts over synthetic traffic with known distributions. Each rollout walks the default
steps ``[1, 5, 10, 25, 50, 100]`` %; a step bakes ``BENCH_ROLLOUT_STEP_REQUESTS`` requests (default:
the default bake time, 600 s, at ``RPS`` = 5 requests a second, 3,000), held until each arm has had
``MIN_SAMPLES`` (50) units judged in it, and paused as inconclusive when it still lacks them
:func:`app.routing.rollout.inconclusive_after` its start. Each metric is a count of events:

- provider errors, refusals, truncations, broken tool-call JSON, schema violations: each request has
  the event with its arm's probability;
- latency, TTFT and cost: the event is "above the baseline's p95", the threshold fixed before the
  rollout from a baseline-only warm-up, and for the candidate that p95 times its allowed change
  (``ALLOWED_CHANGE``: +10 %, cost +5 %), as the analysis counts it (a candidate no worse than
  that has at most 5 % of its requests above it, so "not worse" keeps its meaning as a rate).

The analysis is the real one's: requests go through :class:`core.units.UnitTracker` (a request
without a session is its own unit; a sticky session's run is one), and the tests
(:class:`core.sequential.RateRatioTest`) are read after every unit judged (as often as one may
look). A metric's test rejects at its share of ``alpha``: the real controller splits alpha over
every signal of :mod:`app.monitor.canary_analysis` (Bonferroni), of which these eight are simulated,
so the overall false-abort probability is at most ``alpha`` = 0.05. Reported:

- the false-abort rate of a healthy candidate over ``BENCH_ROLLOUT_HEALTHY`` (default 1,000)
  rollouts of per-request draws, with its 95 % Wilson interval; budget: at most alpha;
- the same with sticky sessions (``SESSION_MIXES``, ``BENCH_ROLLOUT_STICKY`` rollouts each, default
  200): under the controller's rules (with how many paused as inconclusive), and walked through every
  step whatever its samples (as if each pause were promoted by hand: the longest reading, which the
  guarantee covers too); budget: at most alpha;
- for each regression, over ``BENCH_ROLLOUT_REGRESSED`` (default 200) rollouts: the share caught
  before the weight passes 25 % (budget 95 %), and the median candidate requests until abort; then
  the same regressions on traffic of many short sessions (``SHORT_SESSIONS``; no budget: a step
  needs 50 *sessions* on the candidate, which at 1 % takes longer, so some pause instead);
- today's guardrail on the same traffic (abort when more than 20 % of the candidate's attempts in the
  last 5 minutes failed, once there are 20): what it catches of each regression, side by side.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

from app.monitor.canary_analysis import ALLOWED_CHANGE, SIGNALS, signal_alpha
from app.rollout.driver import INTERVAL_S
from app.routing.rollout import MAX_SUSPECT_BAKES, SUSPECT_E, inconclusive_after
from core.rollout import DEFAULT_BAKE_S, DEFAULT_MIN_SAMPLES, DEFAULT_STEPS
from core.sequential import RateRatioTest
from core.units import Unit, UnitTracker, run_limits

STEPS = tuple(s / 100 for s in DEFAULT_STEPS)
HEALTHY = int(os.environ.get("BENCH_ROLLOUT_HEALTHY", "1000"))
REGRESSED = int(os.environ.get("BENCH_ROLLOUT_REGRESSED", "200"))
STICKY = int(os.environ.get("BENCH_ROLLOUT_STICKY", "200"))
#: Session mixes of a healthy candidate's traffic: (sessions open at a time, mean requests a session).
SESSION_MIXES = ((200, 20.0), (20, 50.0), (5, 200.0))
#: Many short sessions (1,000 open, 2 requests each on average): the regressions again.
SHORT_SESSIONS = (1000, 2.0)
SHORT_REGRESSED = int(os.environ.get("BENCH_ROLLOUT_SHORT_REGRESSED", str(REGRESSED)))
PAIRS = 3000  # mirrored requests in a simulated shadow phase
MIN_SAMPLES = DEFAULT_MIN_SAMPLES
ALPHA = 0.05
RPS = 5.0  # requests per second: the guardrail's 5-minute window holds 1,500 requests
STEP_REQUESTS = int(os.environ.get("BENCH_ROLLOUT_STEP_REQUESTS", str(round(DEFAULT_BAKE_S * RPS))))
COUNTS = ("errors", "refusals", "truncations", "tool_json", "schema")
TAILS = ("latency", "ttft", "cost")
METRICS = COUNTS + TAILS


@dataclass(frozen=True)
class Arm:
    """One arm's traffic: event probabilities and lognormal scales of the distributions."""

    errors: float = 0.01
    refusals: float = 0.005
    truncations: float = 0.02
    tool_json: float = 0.0
    schema: float = 0.0
    latency: float = 1.0  # multiplies the baseline's median
    ttft: float = 1.0
    cost: float = 1.0


BASE = Arm()
SIGMA = {"latency": 0.5, "ttft": 0.6, "cost": 0.4}
MEDIAN = {"latency": 800.0, "ttft": 300.0, "cost": 0.002}
SCENARIOS: dict[str, Arm] = {
    "provider errors 1 % -> 3 %": Arm(errors=0.03),
    "p95 latency +30 %": Arm(latency=1.3),
    "TTFT +50 %": Arm(ttft=1.5),
    "refusals 0.5 % -> 3 %": Arm(refusals=0.03),
    "truncations 2 % -> 8 %": Arm(truncations=0.08),
    "broken tool JSON 0 -> 2 %": Arm(tool_json=0.02),
    "schema violations 0 -> 5 %": Arm(schema=0.05),
    "cost per request +25 %": Arm(cost=1.25),
}


def thresholds(rng: random.Random, n: int = 4000) -> dict[str, float]:
    """The baseline's p95 of each distribution, from a warm-up of baseline traffic only."""
    out = {}
    for m in TAILS:
        xs = sorted(MEDIAN[m] * math.exp(rng.gauss(0, SIGMA[m])) for _ in range(n))
        out[m] = xs[int(0.95 * n)]
    return out


#: The analysis signal each simulated metric stands for (its share of alpha is that signal's).
SIGNAL_OF = {
    "errors": "attempt failed",
    "refusals": "refused",
    "truncations": "truncated",
    "tool_json": "broken tool json",
    "schema": "schema violation",
    "latency": "slow",
    "ttft": "slow first token",
    "cost": "costly",
}


@dataclass
class Outcome:
    aborted_at: float | None = None  # the weight in force when it aborted
    paused_at: float | None = None  # the weight at which a step stayed inconclusive (too few units)
    candidate_requests: int = 0  # until the abort (or the end)
    held_requests: int = 0  # requests baked beyond the steps' own because a metric was suspect
    guardrail_at: float | None = None
    metric: str | None = None
    p_values: dict[str, float] = field(default_factory=dict)
    candidate_units: int = 0  # units judged on the candidate's arm by the end


def rollout(candidate: Arm, seed: int, sessions: tuple[int, float] | None = None, forced: bool = False) -> Outcome:
    """One rollout under the controller's rules (:func:`app.routing.rollout.decide`): a step moves
    on after its bake once each arm has ``MIN_SAMPLES`` units judged in it, unless a metric is
    suspect, which holds it up to ``MAX_SUSPECT_BAKES`` more bakes; a step still short of units
    :func:`app.routing.rollout.inconclusive_after` its start pauses (the outcome is ``paused_at``);
    any test rejecting aborts at once.

    The analysis is the real one's (:mod:`core.units`, :class:`core.sequential.RateRatioTest`):
    every request is fed to a :class:`core.units.UnitTracker` as the log would feed it, and the
    runs that ended are judged at each controller tick (every ``INTERVAL_S`` of simulated time).

    ``sessions = (K, M)``: sticky sessions, as the gateway assigns them. ``K`` sessions are open at
    a time; each request belongs to one of them, drawn uniformly; a session ends after each request
    with probability ``1 / M`` (``M`` requests on average) and a new one opens. A session's fixed
    point in [0, 1) puts it on the candidate while the weight is above it, so it stays there as the
    weight grows. Without sessions each request is drawn on its own (and is its own unit).

    ``forced``: every step moves on after one bake, whatever its samples and suspects (an operator
    who resumes or promotes each pause by hand): the schedule that reads the tests longest, at every
    weight, which the guarantee covers as it covers any schedule."""
    rng = random.Random(seed)
    limit = thresholds(rng)
    tests = {m: RateRatioTest(theta0=1.0, alpha=signal_alpha(SIGNAL_OF[m], ALPHA)) for m in METRICS}
    out = Outcome()
    window: deque[tuple[float, bool]] = deque()  # the guardrail's: (time, failed) of candidate attempts
    clock = 0.0
    bake_s = STEP_REQUESTS / RPS
    idle_s, max_s = run_limits(bake_s)
    units = UnitTracker(idle_s=idle_s, max_s=max_s)
    open_ = [(f"s{rng.getrandbits(64)}", rng.random()) for _ in range(sessions[0])] if sessions else []
    tick_every = max(1, round(INTERVAL_S * RPS))
    step_units = [0, 0]
    step_start = 0.0

    def judge(done: list[Unit]) -> str | None:
        rejected = None
        for u in done:
            if not u.informative:
                continue
            assert u.share is not None
            out.candidate_units += u.candidate
            if u.started >= step_start:
                step_units[0 if u.candidate else 1] += 1
            for m in u.events:  # the metrics whose event the unit had
                tests[m].observe(u.candidate, u.share)
                if rejected is None and tests[m].rejected:
                    rejected = m
        return rejected

    for w in STEPS:
        if w >= 1.0:
            break  # 100 %: promoted (nothing left to compare against)
        step_start, step_units[:] = clock, [0, 0]
        done = 0
        while True:
            if done % tick_every == 0:
                elapsed = clock - step_start
                if forced and elapsed >= bake_s:
                    break
                if elapsed >= bake_s:
                    if min(step_units) < MIN_SAMPLES:
                        if elapsed >= inconclusive_after(bake_s):
                            out.paused_at = w
                            return out
                    else:
                        leaning = [m for m, t in tests.items() if t.lr >= SUSPECT_E]
                        if not leaning or elapsed >= bake_s * (1 + MAX_SUSPECT_BAKES):
                            break
                        out.held_requests += tick_every
            done += 1
            clock += 1.0 / RPS
            session = None
            if sessions:
                k = rng.randrange(len(open_))
                session, point = open_[k]
                on_candidate = point < w
                if rng.random() < 1.0 / sessions[1]:
                    open_[k] = (f"s{rng.getrandbits(64)}", rng.random())
            else:
                on_candidate = rng.random() < w
            arm = candidate if on_candidate else BASE
            if on_candidate:
                out.candidate_requests += 1
            failed = False
            hit: list[str] = []
            for m in COUNTS:
                if rng.random() < getattr(arm, m):
                    failed = failed or m == "errors"
                    hit.append(m)
            for m in TAILS:
                value = MEDIAN[m] * getattr(arm, m) * math.exp(rng.gauss(0, SIGMA[m]))
                # As the analysis counts it: the candidate's event is above the p95 times its allowed change.
                if value > (limit[m] * (1.0 + ALLOWED_CHANGE[SIGNAL_OF[m]]) if on_candidate else limit[m]):
                    hit.append(m)
            if on_candidate and out.guardrail_at is None:
                window.append((clock, failed))
                while window and window[0][0] < clock - 300:
                    window.popleft()
                if len(window) >= 20 and sum(f for _, f in window) / len(window) > 0.2:
                    out.guardrail_at = w
            closed = units.add(session, clock, on_candidate, w, hit)
            if done % tick_every == 0:
                closed += units.close(clock)
            metric = judge(closed)
            if metric is not None:
                out.aborted_at, out.metric = w, metric
                out.p_values = {k: t.p_value for k, t in tests.items()}
                return out
    return out


def shadow_phase(candidate_errors: float, seed: int) -> bool:
    """One shadow phase through the paired test (share 1/2, as
    :func:`app.monitor.canary_analysis.analyse_shadow` reads it): ``PAIRS`` mirrored requests whose
    prompts differ in how often they fail (each prompt's own rate, drawn around the baseline's 1 %,
    so the two arms' events are correlated as they are on the same request); the candidate's rate is
    its multiple. Whether the failures test rejects."""
    rng = random.Random(seed)
    test = RateRatioTest(theta0=1.0, alpha=signal_alpha("attempt failed", ALPHA))
    for _ in range(PAIRS):
        base = min(1.0, rng.expovariate(1.0 / BASE.errors))
        cand = min(1.0, base * candidate_errors / BASE.errors)
        if rng.random() < cand:
            test.observe(True, 0.5)
        if rng.random() < base:
            test.observe(False, 0.5)
        if test.rejected:
            return True
    return False


#: A streamed shadow phase's first-token times: a prompt's own factor (its length, its cache state)
#: is shared by both arms of a pair, each arm adds its own noise; together they give the baseline's
#: spread ``SIGMA["ttft"]``.
SHADOW_PROMPT_SIGMA = 0.5
SHADOW_TTFT_MULTS = (1.0, 1.1, 1.2, 1.3, 1.5, 2.0)


def shadow_ttft(mult: float, seed: int) -> int | None:
    """One streamed shadow phase judged on "slow first token" alone, as
    :func:`app.monitor.canary_analysis.analyse_shadow` counts it: the baseline's p95 from a warm-up of
    its own traffic, a pair's candidate event above that p95 times (1 + the allowed change), the
    baseline's above the p95, each event tested at share 1/2. The candidate's first token is
    ``mult`` times the baseline's in distribution, on correlated prompts. Returns the pairs read
    when the test rejected, or None when ``PAIRS`` pairs passed without it."""
    rng = random.Random(seed)
    noise = math.sqrt(SIGMA["ttft"] ** 2 - SHADOW_PROMPT_SIGMA**2)

    def base_draw(prompt: float) -> float:
        return MEDIAN["ttft"] * math.exp(prompt + rng.gauss(0, noise))

    warm = sorted(base_draw(rng.gauss(0, SHADOW_PROMPT_SIGMA)) for _ in range(4000))
    limit = warm[int(0.95 * (len(warm) - 1))]
    cand_limit = limit * (1 + ALLOWED_CHANGE["slow first token"])
    test = RateRatioTest(theta0=1.0, alpha=signal_alpha("slow first token", ALPHA))
    for i in range(PAIRS):
        prompt = rng.gauss(0, SHADOW_PROMPT_SIGMA)
        if mult * base_draw(prompt) > cand_limit:
            test.observe(True, 0.5)
        if base_draw(prompt) > limit:
            test.observe(False, 0.5)
        if test.rejected:
            return i + 1
    return None


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def run() -> list[dict]:
    rows: list[dict] = []
    started = time.perf_counter()
    healthy = [rollout(BASE, seed) for seed in range(HEALTHY)]
    k = sum(o.aborted_at is not None for o in healthy)
    lo, hi = wilson(k, HEALTHY)
    guard_false = sum(o.guardrail_at is not None for o in healthy)
    held = sum(o.held_requests for o in healthy) / HEALTHY / STEP_REQUESTS
    rows.append(
        {
            "name": "rollouts: false aborts of a healthy candidate",
            "value": round(k / HEALTHY, 4),
            "unit": "share",
            "budget": ALPHA,
            "ok": k / HEALTHY <= ALPHA,
            "n": HEALTHY,
            "spread": f"95 % interval {lo:.4f}-{hi:.4f}; "
            f"{held:.3f} extra bakes a rollout on average; guardrail false trips {guard_false}",
            "measured": f"{HEALTHY} seeded rollouts, steps {STEPS}, {STEP_REQUESTS} requests a step, "
            f"{len(METRICS)} of the {len(SIGNALS)} signals simulated at their share of alpha, read after every "
            f"event; a step holds while a metric's e-value >= {SUSPECT_E:g} (up to {MAX_SUSPECT_BAKES} more bakes)",
        }
    )
    for j, (k_open, mean_len) in enumerate(SESSION_MIXES):
        outs = [rollout(BASE, 7_000_000 * (j + 1) + seed, sessions=(k_open, mean_len)) for seed in range(STICKY)]
        walked = [
            rollout(BASE, 8_000_000 * (j + 1) + s, sessions=(k_open, mean_len), forced=True) for s in range(STICKY)
        ]
        kf = sum(o.aborted_at is not None for o in walked)
        lo_f, hi_f = wilson(kf, STICKY)
        ks = sum(o.aborted_at is not None for o in outs)
        lo_s, hi_s = wilson(ks, STICKY)
        paused = [o.paused_at for o in outs if o.paused_at is not None]
        completed = STICKY - ks - len(paused)
        where = ", ".join(f"{w * 100:g} %: {paused.count(w)}" for w in sorted(set(paused)))
        rows.append(
            {
                "name": f"rollouts: false aborts with sticky sessions ({k_open} open, {mean_len:g} requests each)",
                "value": round(ks / STICKY, 4),
                "unit": "share",
                "budget": ALPHA,
                "ok": ks / STICKY <= ALPHA,
                "n": STICKY,
                "spread": f"95 % interval {lo_s:.4f}-{hi_s:.4f}; paused as inconclusive {len(paused)}"
                f"{f' (at {where})' if paused else ''}, completed {completed}; median "
                f"{statistics.median(o.candidate_units for o in outs):g} candidate units judged a rollout",
            }
        )
        rows.append(
            {
                "name": f"rollouts: false aborts with sticky sessions ({k_open} open, {mean_len:g} requests each), "
                "every step walked to the last",
                "value": round(kf / STICKY, 4),
                "unit": "share",
                "budget": ALPHA,
                "ok": kf / STICKY <= ALPHA,
                "n": STICKY,
                "spread": f"95 % interval {lo_f:.4f}-{hi_f:.4f}; each step moves on after one bake whatever its "
                f"samples (as if each pause were promoted by hand); median "
                f"{statistics.median(o.candidate_units for o in walked):g} candidate units judged a rollout",
            }
        )
    shadow_false = sum(shadow_phase(BASE.errors, 9_000_000 + s) for s in range(HEALTHY))
    lo_p, hi_p = wilson(shadow_false, HEALTHY)
    rows.append(
        {
            "name": "rollouts: shadow phase: false aborts on failures (paired, correlated prompts)",
            "value": round(shadow_false / HEALTHY, 4),
            "unit": "share",
            "budget": signal_alpha("attempt failed", ALPHA),
            "ok": shadow_false / HEALTHY <= signal_alpha("attempt failed", ALPHA),
            "n": HEALTHY,
            "spread": f"95 % interval {lo_p:.4f}-{hi_p:.4f}; {PAIRS} mirrored requests each",
        }
    )
    shadow_caught = sum(shadow_phase(0.03, 9_500_000 + s) for s in range(REGRESSED))
    rows.append(
        {
            "name": "rollouts: shadow phase: provider errors 1 % -> 3 % caught",
            "value": round(shadow_caught / REGRESSED, 3),
            "unit": "share",
            "budget": None,
            "ok": True,
            "n": REGRESSED,
            "spread": f"within {PAIRS} mirrored requests",
        }
    )
    for j, mult in enumerate(SHADOW_TTFT_MULTS):
        # The allowed change itself (x1.1) is the null's edge: it must be found worse at most at
        # the signal's share of alpha; beyond it, the power.
        null = mult <= 1 + ALLOWED_CHANGE["slow first token"]
        runs = HEALTHY if null else REGRESSED
        found = [shadow_ttft(mult, 9_700_000 + 100_000 * j + s) for s in range(runs)]
        hit = [n for n in found if n is not None]
        lo_t, hi_t = wilson(len(hit), runs)
        budget = signal_alpha("slow first token", ALPHA)
        rows.append(
            {
                "name": f"rollouts: shadow phase, streamed: first token x{mult:g} "
                + ("found worse (false abort)" if null else "caught"),
                "value": round(len(hit) / runs, 4),
                "unit": "share",
                "budget": budget if null else None,
                "ok": len(hit) / runs <= budget if null else True,
                "n": runs,
                "spread": f"95 % interval {lo_t:.4f}-{hi_t:.4f}; within {PAIRS} mirrored streamed requests; "
                f"median {statistics.median(hit) if hit else 'n/a'} pairs to abort; allowed change "
                f"+{ALLOWED_CHANGE['slow first token']:.0%}, prompts shared by both arms (sigma {SHADOW_PROMPT_SIGMA})",
            }
        )
    for i, (name, arm) in enumerate(SCENARIOS.items()):
        outs = [rollout(arm, 1_000_000 * (i + 1) + seed) for seed in range(REGRESSED)]
        early = sum(o.aborted_at is not None and o.aborted_at <= 0.25 for o in outs)
        lo_r, hi_r = wilson(early, REGRESSED)
        until = [o.candidate_requests for o in outs if o.aborted_at is not None]
        guard = sum(o.guardrail_at is not None and o.guardrail_at <= 0.25 for o in outs)
        paused = sum(o.paused_at is not None for o in outs)
        by_metric: dict[str, int] = {}
        for o in outs:
            if o.metric and o.aborted_at is not None:
                by_metric[o.metric] = by_metric.get(o.metric, 0) + 1
        rows.append(
            {
                "name": f"rollouts: {name}: caught by 25 %",
                "value": round(early / REGRESSED, 3),
                "unit": "share",
                "budget": 0.95,
                "ok": early / REGRESSED >= 0.95,
                "n": REGRESSED,
                "spread": (
                    f"95 % interval {lo_r:.3f}-{hi_r:.3f}; "
                    f"median {statistics.median(until) if until else 'n/a'} candidate requests to abort; "
                    f"guardrail caught {guard / REGRESSED:.0%}; aborted on {by_metric}; paused {paused}"
                ),
            }
        )
    k_open, mean_len = SHORT_SESSIONS
    for i, (name, arm) in enumerate(SCENARIOS.items()):
        outs = [rollout(arm, 3_000_000 * (i + 1) + seed, sessions=SHORT_SESSIONS) for seed in range(SHORT_REGRESSED)]
        early = sum(o.aborted_at is not None and o.aborted_at <= 0.25 for o in outs)
        held = sum(o.paused_at is not None and o.paused_at <= 0.25 for o in outs)
        lo_r, hi_r = wilson(early, SHORT_REGRESSED)
        rows.append(
            {
                "name": f"rollouts: {name}, {k_open} sessions open of {mean_len:g} requests: caught by 25 %",
                "value": round(early / SHORT_REGRESSED, 3),
                "unit": "share",
                "budget": None,
                "ok": True,
                "n": SHORT_REGRESSED,
                "spread": f"95 % interval {lo_r:.3f}-{hi_r:.3f}; paused as inconclusive by 25 % {held}; stopped "
                f"before passing 25 % (aborted or paused) {(early + held) / SHORT_REGRESSED:.0%}",
            }
        )
    rows.append(
        {
            "name": "rollouts: simulation time",
            "value": round(time.perf_counter() - started, 1),
            "unit": "s",
            "budget": None,
            "ok": True,
        }
    )
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
