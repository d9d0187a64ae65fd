"""Shared measurement harness: interleaved rounds, medians with their spread, and rows that say
what was measured.

Why interleave: on a shared 2-core machine the load drifts over seconds. Measuring ours for ten
seconds and then the peer for ten seconds puts that drift into the comparison; alternating the two
in short rounds (and swapping which one goes first each round) spreads it over both alike.

Every result row carries ``n`` (samples behind it) and, where it is a distribution, p25/p75 (the
interquartile range) next to the median, so a reader can tell a difference from noise.
"""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile (``statistics.quantiles``' inclusive method) of a non-empty list."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Dist:
    """Per-call times in milliseconds."""

    samples: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.samples)

    def q(self, q: float) -> float:
        return quantile(self.samples, q)

    @property
    def p50(self) -> float:
        return statistics.median(self.samples)

    def summary(self) -> str:
        return (
            f"p50 {self.p50:.4f} ms (IQR {self.q(0.25):.4f}-{self.q(0.75):.4f}), p99 {self.q(0.99):.4f} ms, "
            f"min {min(self.samples):.4f}, max {max(self.samples):.4f}, n={self.n}"
        )


@dataclass
class Comparison:
    """Ours vs a peer, measured in interleaved rounds."""

    ours: Dist
    peer: Dist
    round_deltas_p50: list[float]  # per round: median(ours) - median(peer), ms
    rounds: int
    per_round: int
    ours_settle_wall: list[float]  # per ours block: wall ms of the settle step (outside the samples)
    ours_settle_cpu_per_call: list[float]  # per ours block: process CPU ms of the settle step / per_round

    @property
    def added_p50(self) -> float:
        return self.ours.p50 - self.peer.p50

    @property
    def added_p99(self) -> float:
        return self.ours.q(0.99) - self.peer.q(0.99)


Block = Callable[[int], list[float]]


def per_call(fn: Callable[[], object]) -> Block:
    """A block runner timing ``n`` calls of ``fn`` in this process (ms per call)."""
    clock = time.perf_counter

    def block(n: int) -> list[float]:
        times = []
        for _ in range(n):
            t0 = clock()
            fn()
            times.append((clock() - t0) * 1000.0)
        return times

    return block


def interleaved(
    ours: Callable[[], object] | Block,
    peer: Callable[[], object] | Block,
    *,
    rounds: int,
    per_round: int,
    warmup: int,
    ours_settle: Callable[[], object] | None = None,
    blocks: bool = False,
) -> Comparison:
    """Run ``rounds`` rounds of ``per_round`` timed calls of each side, alternating which side goes
    first; ``warmup`` untimed calls of each before. With ``blocks=True`` each side is a block
    runner (``n -> per-call ms``), for a peer that times its calls in another process.

    ``ours_settle`` runs after each block of ours (e.g. drain a background writer), so work ours
    leaves behind does not land in the peer's block. Its wall time and its process CPU time per
    call (the CPU of the background threads doing ours' leftover work) are kept apart so they can be
    reported rather than silently dropped."""
    run_ours: Block = ours if blocks else per_call(ours)  # type: ignore[assignment,arg-type]
    run_peer: Block = peer if blocks else per_call(peer)  # type: ignore[assignment,arg-type]
    run_ours(warmup)
    run_peer(warmup)
    if ours_settle:
        ours_settle()
    a, b, deltas, wall, cpu = Dist(), Dist(), [], [], []
    clock = time.perf_counter
    gc.collect()
    for r in range(rounds):
        first_ours = r % 2 == 0
        got: dict[str, list[float]] = {}
        for side in ("ours", "peer") if first_ours else ("peer", "ours"):
            if side == "peer":
                got[side] = run_peer(per_round)
                continue
            got[side] = run_ours(per_round)
            if ours_settle:
                t0, c0 = clock(), time.process_time()
                ours_settle()
                wall.append((clock() - t0) * 1000.0)
                cpu.append((time.process_time() - c0) * 1000.0 / per_round)
        a.samples.extend(got["ours"])
        b.samples.extend(got["peer"])
        deltas.append(statistics.median(got["ours"]) - statistics.median(got["peer"]))
    return Comparison(a, b, deltas, rounds, per_round, wall, cpu)


def timed(fn: Callable[[], object], runs: int, warmup: int = 1) -> Dist:
    """Per-run times of ``fn`` (no peer), after ``warmup`` untimed runs."""
    for _ in range(warmup):
        fn()
    d = Dist()
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        d.samples.append((time.perf_counter() - t0) * 1000.0)
    return d


def row(
    name: str,
    value: float,
    unit: str,
    *,
    budget: float | None = None,
    lower_is_better: bool = True,
    n: int | None = None,
    spread: str = "",
    measured: str = "",
    digits: int = 4,
) -> dict:
    """One result row; ``ok`` is whether the budget is met (no budget: always ok)."""
    if budget is None:
        ok = True
    else:
        ok = value < budget if lower_is_better else value >= budget
    out: dict = {"name": name, "value": round(value, digits), "unit": unit, "budget": budget, "ok": ok}
    if n is not None:
        out["n"] = n
    if spread:
        out["spread"] = spread
    if measured:
        out["measured"] = measured
    return out


def dist_rows(label: str, d: Dist, measured: str = "") -> list[dict]:
    """p50 (with IQR and n) and p99 rows for one distribution."""
    return [
        row(
            f"{label} p50",
            d.p50,
            "ms",
            n=d.n,
            spread=f"IQR {d.q(0.25):.4f}-{d.q(0.75):.4f} ms, min {min(d.samples):.4f}, max {max(d.samples):.4f}",
            measured=measured,
        ),
        row(f"{label} p99", d.q(0.99), "ms", n=d.n),
    ]


def say(text: str) -> None:
    """Progress and 'what was measured' notes go to stderr so stdout stays the result table."""
    import sys

    print(text, file=sys.stderr, flush=True)


def json_of(cmd: list[str], label: str, **kwargs: Any) -> Any:
    """The JSON a benchmark's child process prints on its last line of output (``RuntimeError``
    naming ``label`` with the end of its stderr when it fails); ``kwargs`` go to ``subprocess.run``."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{label}: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
