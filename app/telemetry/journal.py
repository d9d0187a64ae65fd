"""A local append-only journal for request-log records the database cannot take right now, and a
dead-letter file for records it will never take.

The telemetry writer spills a batch here when the database is down or slow, or when its queue is
full, and replays the journal in order once the database answers again. Records are JSON lines in
numbered segment files (``segment-000001.jsonl`` ...): appends go to the newest segment, replay
reads the oldest first, and a segment is deleted only after every record in it was written to the
database. Writes are flushed to the OS at once and ``fsync``ed in batches (every ``fsync_every``
records or ``fsync_interval_s``, and on close), so a killed process loses nothing that reached the
journal and a power loss at most the records since the last fsync. A torn last line (the process
died mid-write) is skipped on replay, never fatal.

Replay is at-least-once: a crash between the database commit and the segment's deletion replays
those records again, which the idempotent insert (unique request id + attempt) turns into no-ops.

The dead-letter file (``dead-letter.jsonl``) keeps each rejected record with the database's reason,
so nothing is dropped silently.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SEGMENT_PREFIX = "segment-"
SEGMENT_SUFFIX = ".jsonl"
DEAD_LETTER = "dead-letter.jsonl"
# A segment is closed for appends past this size, so replay can delete finished work early.
SEGMENT_MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class JournalStats:
    segments: int
    records: int  # records waiting in the journal (appended, not yet replayed)
    bytes: int
    dead_letters: int


class Journal:
    """Append-only JSON-lines journal in ``directory``; thread-safe."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync_every: int = 500,
        fsync_interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        fsync: Callable[[int], None] = os.fsync,
    ):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fsync_every = fsync_every
        self._fsync_interval = fsync_interval_s
        self._clock = clock
        self._fsync = fsync
        self._lock = threading.Lock()
        self._file: Any = None  # the open newest segment (binary append)
        self._file_seq = 0
        self._unsynced = 0
        self._last_sync = clock()
        self._pending = sum(_count_lines(p) for p in self._segments())
        self._dead = _count_lines(self.dir / DEAD_LETTER)

    # -- appends -------------------------------------------------------------------------------
    def append(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append rows (JSON-serialisable mappings) as one write; fsync when the batch is due."""
        if not rows:
            return
        data = b"".join(_line(r) for r in rows)
        with self._lock:
            f = self._writable()
            f.write(data)
            f.flush()
            self._pending += len(rows)
            self._unsynced += len(rows)
            if self._unsynced >= self._fsync_every or self._clock() - self._last_sync >= self._fsync_interval:
                self._sync()

    def sync(self) -> None:
        with self._lock:
            self._sync()

    def close(self) -> None:
        with self._lock:
            self._sync()
            if self._file is not None:
                self._file.close()
                self._file = None

    def _writable(self):
        if self._file is not None and self._file.tell() < SEGMENT_MAX_BYTES:
            return self._file
        if self._file is not None:
            self._sync()
            self._file.close()
        segments = self._segments()
        self._file_seq = (_seq(segments[-1]) + 1) if segments else 1
        self._file = open(self.dir / f"{SEGMENT_PREFIX}{self._file_seq:06d}{SEGMENT_SUFFIX}", "ab")
        return self._file

    def _sync(self) -> None:
        if self._file is not None and self._unsynced:
            self._fsync(self._file.fileno())
        self._unsynced = 0
        self._last_sync = self._clock()

    # -- replay --------------------------------------------------------------------------------
    def replay(self, write: Callable[[list[dict]], object], batch_size: int = 500) -> int:
        """Hand every journaled row to ``write`` in order, in batches; delete each segment once all
        its rows were written. Stops (and re-raises) at the first failing ``write``: what was not
        written stays for the next call. Returns the number of rows written."""
        done = 0
        for path in self._segments():
            with self._lock:
                if self._file is not None and self._file_seq == _seq(path):
                    # Close the newest segment so new appends start a fresh one we do not delete.
                    self._sync()
                    self._file.close()
                    self._file = None
            rows = list(_read_rows(path))
            for i in range(0, len(rows), batch_size):
                write(rows[i : i + batch_size])
            path.unlink()
            with self._lock:
                self._pending = max(0, self._pending - len(rows))
            done += len(rows)
        return done

    @property
    def pending(self) -> int:
        return self._pending

    def has_pending(self) -> bool:
        return self._pending > 0

    # -- dead letters --------------------------------------------------------------------------
    def dead_letter(self, row: Mapping[str, Any], reason: str, ts: float | None = None) -> None:
        entry = {"ts": time.time() if ts is None else ts, "reason": reason, "record": dict(row)}
        with self._lock, open(self.dir / DEAD_LETTER, "ab") as f:
            f.write(_line(entry))
            f.flush()
            self._fsync(f.fileno())
            self._dead += 1

    def dead_letters(self) -> Iterator[dict]:
        yield from _read_rows(self.dir / DEAD_LETTER)

    def stats(self) -> JournalStats:
        segments = self._segments()
        return JournalStats(
            segments=len(segments),
            records=self._pending,
            bytes=sum(p.stat().st_size for p in segments if p.exists()),
            dead_letters=self._dead,
        )

    def _segments(self) -> list[Path]:
        return sorted(self.dir.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"), key=_seq)


def _line(row: Mapping[str, Any]) -> bytes:
    # ensure_ascii (the default) escapes lone surrogates, so any str survives the round trip.
    return json.dumps(row, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"


def _seq(path: Path) -> int:
    return int(path.name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)])


def _read_rows(path: Path) -> Iterator[dict]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError:
            # A torn write from a killed process: only ever the last line of a segment.
            log.warning("journal %s line %d is incomplete; skipped", path.name, n)
            continue
        if isinstance(row, dict):
            yield row


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0
