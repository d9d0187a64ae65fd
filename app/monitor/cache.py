"""The monitor's in-process caches, and the one call that clears them all (:func:`clear_cache`).

Two caches keep a live refresh from re-reading what no longer changes: :class:`SettledCache` holds
the per-bucket cells of a window's settled buckets (:mod:`app.monitor.series`), :class:`PartCache`
the whole-window cells of a window's settled pieces (:mod:`app.monitor.levels`). Each process has
one of each (:data:`SETTLED`, :data:`PARTS`), shared by every page session and the benchmarks. They
live here, below both users, so that clearing them (the Refresh button, tests, after deleting or
back-filling rollups) needs neither module to import the other.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

# bucket start -> the series' cells of that bucket (``app.monitor.series`` owns their shape)
Buckets = dict[int, Any]


class SettledCache:
    """Per (database, step, filters): the cells of buckets that ended ``SETTLE_S`` before the
    window's end. Rollups of such minutes no longer change in practice (records are written within
    seconds of a request ending), so a live refresh only re-reads the last few buckets. Each entry
    is dropped ``TTL_S`` seconds of ``clock`` after it was first filled, so a late write or a
    cleared database shows up on the next full read; entries are bounded in number and pruned to
    the window."""

    SETTLE_S = 600
    TTL_S = 300.0
    MAX_KEYS = 64

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, tuple[float, Buckets]] = OrderedDict()

    def get(self, key: tuple) -> Buckets:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or self._clock() - hit[0] > self.TTL_S:
                self._entries.pop(key, None)
                return {}
            self._entries.move_to_end(key)
            return dict(hit[1])

    def put(self, key: tuple, settled: Buckets, keep_from: int) -> None:
        with self._lock:
            created, old = self._entries.get(key, (self._clock(), {}))
            merged = {b: v for b, v in old.items() if b >= keep_from}
            merged.update(settled)
            self._entries[key] = (created, merged)
            self._entries.move_to_end(key)
            while len(self._entries) > self.MAX_KEYS:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class PartCache:
    """Summed cells of settled pieces of a window (:func:`db.monitor.span_parts`), so a live
    refresh re-reads only the pieces near its end: a 24-hour window's 23 hourly pieces are read
    once. Entries expire ``TTL_S`` seconds of ``clock`` after they were read (a late write or a
    cleared database shows up), and their number is bounded."""

    TTL_S = 300.0
    MAX_ENTRIES = 2048

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, tuple[float, dict]] = OrderedDict()

    def get(self, key: tuple) -> dict | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or self._clock() - hit[0] > self.TTL_S:
                self._entries.pop(key, None)
                return None
            self._entries.move_to_end(key)
            return hit[1]

    def put(self, key: tuple, cells: dict) -> None:
        with self._lock:
            self._entries[key] = (self._clock(), cells)
            self._entries.move_to_end(key)
            while len(self._entries) > self.MAX_ENTRIES:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


SETTLED = SettledCache()  # the process's settled buckets
PARTS = PartCache()  # the process's settled window pieces


def clear_cache() -> None:
    """Forget every cached settled bucket and window piece (the Refresh button; tests; after
    deleting or back-filling rollups)."""
    SETTLED.clear()
    PARTS.clear()
