"""Background batch writer: the request path never waits on the database, and no record is lost.

A request hands its attempt records over in one step (:meth:`TelemetryWriter.submit_many`: one
append under a lock, no thread wake-up). One daemon thread wakes every ``flush_interval_s``, or as
soon as ``batch_size`` records are waiting, a flush is requested or the writer closes, takes up to
``batch_size`` records and hands them to ``write_batch`` (the idempotent batch insert). Waking per
batch rather than per record is what keeps the hand-off off the request's latency.

With a :class:`~app.telemetry.journal.Journal` (what :func:`app.gateway.build_gateway` wires):

- a full queue (``queue_size`` records) makes ``submit`` append the records to the journal instead
  of waiting, so a stalled database never stalls a request;
- a batch whose write fails for a reason of the database's (down, locked, timed out) goes to the
  journal and the thread keeps taking new records; while the database is failing, batches go
  straight to the journal and the database is probed with backoff;
- whenever the database answers, the journal is replayed in order (at start-up too: a journal left
  by a killed process is replayed), and the idempotent insert makes a replay that repeats a
  committed batch harmless;
- a record the database rejects for what it holds (too long, wrong type, constraint) is isolated
  from its batch and kept in the dead-letter file with the reason.

Without a journal (unit tests, the ingest benchmark) a full queue makes ``submit`` wait
(backpressure) and a failed write is retried with backoff; nothing is dropped either way.

``close()`` drains the queue (into the database, or the journal if the database fails), replays
what it can and fsyncs the journal; interpreter exit does the same for a writer never closed. With
``close(timeout=...)`` a writer stuck on a hung database journals what it still holds and returns
(at interpreter exit the timeout is ``EXIT_CLOSE_S``).

What a SIGKILL can lose: only records still in memory, i.e. accepted since the last batch was taken
(at most ``queue_size``) plus the batch being written when the process died (at most
``batch_size``); everything that reached the journal was already in the OS's page cache. A power
loss can additionally lose the journal lines written since its last fsync (``fsync_every`` records
or ``fsync_interval_s``).
"""

from __future__ import annotations

import atexit
import logging
import math
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from app.telemetry.journal import Journal
from core.records import FIELD_NAMES, AttemptRecord

log = logging.getLogger(__name__)

_FLOAT_FIELDS = ("ts", "latency_ms", "ttft_ms", "cost_usd")
EXIT_CLOSE_S = 10.0  # at interpreter exit, wait this long for the database, then journal the rest


@dataclass(frozen=True)
class WriterStats:
    """One consistent look at the writer's counters (for ``status``, the Overview and tests)."""

    queued: int  # records in memory, waiting for the writer thread
    accepted: int  # records handed to submit() since start (queued or spilled)
    written: int  # rows newly written to the database (replayed ones included)
    spilled: int  # records sent to the journal (queue full, or the database failing)
    replayed: int  # journal records delivered to the database (written, already there, or rejected)
    rejected: int  # records the database refused for what they hold (dead letters)
    journal_depth: int  # records waiting in the journal
    write_failures: int  # failed batch writes (transient database errors)
    database_ok: bool  # the last write or probe succeeded
    last_error: str | None
    last_error_at: float | None  # epoch seconds
    journal_dir: str | None  # None: no journal (full queue applies backpressure)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TelemetryWriter:
    def __init__(
        self,
        write_batch: Callable[[Sequence[AttemptRecord]], int],
        *,
        queue_size: int = 10_000,
        batch_size: int = 500,
        flush_interval_s: float = 0.2,
        retry_delays_s: Sequence[float] = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
        name: str = "telemetry-writer",
        journal: Journal | None = None,
        orphans: Sequence[Journal] = (),
        on_release: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ):
        self._write_batch = write_batch
        self._max = queue_size
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._retry_delays = tuple(retry_delays_s) or (1.0,)
        self._journal = journal
        self._orphans = list(orphans)  # journals of dead processes, replayed then released
        self._on_release = on_release
        self._clock = clock
        self._wall = wall_clock
        self._cv = threading.Condition()
        self._chunks: deque[Sequence[AttemptRecord]] = deque()  # one entry per submit_many
        self._count = 0  # records queued, not yet taken by the writer thread
        self._submitted = 0  # records queued since start
        self._done = 0  # records taken and written, journaled or rejected
        self._in_flight: list[AttemptRecord] = []
        self._flush_waiters = 0
        self._replay_wanted = False
        self._replay_rounds = 0
        self._closed = False
        self._stopping = False
        self._db_ok = True
        self._failures_in_row = 0
        self._next_probe = 0.0
        self.accepted = 0
        self.written = 0
        self.spilled = 0
        self.replayed = 0
        self.write_failures = 0
        self.rejected = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        ref = weakref.ref(self)

        def _close_at_exit() -> None:
            w = ref()
            if w is not None:
                # Exit is bounded when a journal can take what a hung database still holds.
                w.close(timeout=EXIT_CLOSE_S if w._journal is not None else None)

        atexit.register(_close_at_exit)

    # -- producer side -------------------------------------------------------------------------
    def submit(self, record: AttemptRecord, timeout: float | None = None) -> None:
        """Queue a record (see :meth:`submit_many`)."""
        self.submit_many((record,), timeout=timeout)

    def submit_many(self, records: Sequence[AttemptRecord], timeout: float | None = None) -> None:
        """Queue one request's records in one step. When the queue is full they go to the journal
        (never waiting on the database); without a journal this waits for room (raises
        ``queue.Full`` after ``timeout``). A group larger than the whole queue is accepted once the
        queue is empty, never split."""
        n = len(records)
        with self._cv:
            if self._closed:
                raise RuntimeError("telemetry writer is closed")
            if n == 0:
                return
            full = self._count + n > self._max and self._count > 0
            if full and self._journal is None:
                if not self._cv.wait_for(lambda: self._count + n <= self._max or self._count == 0, timeout):
                    raise queue.Full
                if self._closed:
                    raise RuntimeError("telemetry writer is closed")
                full = False
            self.accepted += n
            if not full:
                self._chunks.append(records)
                self._count += n
                self._submitted += n
                if self._count >= self._batch_size:
                    self._cv.notify_all()  # a full batch is waiting: no need to sit out the interval
                return
        self._spill(records)

    @property
    def pending(self) -> int:
        """Records queued in memory and not yet taken by the writer thread."""
        return self._count

    @property
    def journal(self) -> Journal | None:
        return self._journal

    @property
    def journal_depth(self) -> int:
        """Records spilled to the journal and not yet replayed (0 without a journal): the
        ``gateway_log_journal_depth`` gauge reads this at each scrape."""
        j = self._journal
        return j.pending if j is not None else 0

    def stats(self) -> WriterStats:
        j = self._journal
        return WriterStats(
            queued=self._count,
            accepted=self.accepted,
            written=self.written,
            spilled=self.spilled,
            replayed=self.replayed,
            rejected=self.rejected,
            journal_depth=j.pending if j is not None else 0,
            write_failures=self.write_failures,
            database_ok=self._db_ok,
            last_error=self.last_error,
            last_error_at=self.last_error_at,
            journal_dir=str(j.dir) if j is not None else None,
        )

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything submitted so far is handled (see :meth:`drain`)."""
        self.drain(timeout)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is handled (written, rejected, or journaled when
        the database fails), then, with a journal holding records, for one replay attempt. Returns
        True when nothing submitted so far is left outside the database."""
        deadline = None if timeout is None else self._clock() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - self._clock())

        with self._cv:
            target = self._submitted
            self._flush_waiters += 1
            self._cv.notify_all()
            try:
                self._cv.wait_for(lambda: self._done >= target or not self._thread.is_alive(), left())
                if self._journal is not None and self._journal.has_pending() and self._thread.is_alive():
                    rounds = self._replay_rounds
                    self._replay_wanted = True
                    self._cv.notify_all()
                    self._cv.wait_for(lambda: self._replay_rounds > rounds or not self._thread.is_alive(), left())
                journal_empty = self._journal is None or not self._journal.has_pending()
                return self._done >= target and journal_empty
            finally:
                self._flush_waiters -= 1

    def close(self, timeout: float | None = None) -> None:
        """Drain and stop. With ``timeout`` and a journal, a writer still stuck on the database
        after ``timeout`` seconds journals what it holds (the idempotent insert makes a later
        replay of the in-flight batch harmless) and returns."""
        with self._cv:
            if self._closed:
                return
            self._closed = self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive() and self._journal is not None:
            with self._cv:
                held = list(self._in_flight)
                while self._chunks:
                    held.extend(self._chunks.popleft())
                self._count = 0
            log.error("telemetry writer still busy after %.1fs; %d records kept in the journal", timeout, len(held))
            self._spill(held)
            self._journal.sync()
        elif self._journal is not None:
            self._journal.close()
            if self._on_release is not None:
                self._on_release()

    # -- writer thread -------------------------------------------------------------------------
    def _take(self) -> list[AttemptRecord]:
        """Up to ``batch_size`` records from the front of the queue (caller holds the lock)."""
        batch: list[AttemptRecord] = []
        while self._chunks and len(batch) < self._batch_size:
            chunk = self._chunks.popleft()
            room = self._batch_size - len(batch)
            if len(chunk) > room:
                self._chunks.appendleft(chunk[room:])
                chunk = chunk[:room]
            batch.extend(chunk)
        self._count -= len(batch)
        return batch

    def _run(self) -> None:
        if self._journal is not None:
            self._replay_orphans()
        while True:
            with self._cv:
                self._cv.wait_for(
                    lambda: (
                        self._count >= self._batch_size
                        or self._stopping
                        or self._replay_wanted
                        or (self._flush_waiters > 0 and self._count > 0)
                    ),
                    timeout=self._interval,
                )
                batch = self._take() if self._chunks else []
                self._in_flight = batch
                final = self._stopping
                # A flush asks for one replay attempt now; closing makes one once the queue is
                # drained (not per batch: each probe of a hung database costs its lock timeout).
                forced = self._replay_wanted or (final and not batch)
                self._replay_wanted = False
                self._cv.notify_all()  # producers waiting for room
            try:
                if self._journal is not None:
                    self._journal.sync()  # bound what an OS crash can lose to one interval
                    self._maybe_replay(forced=forced, have_batch=bool(batch))
                if batch:
                    if self._journal is None:
                        self._write_with_retry(batch, final=final)
                    else:
                        self._deliver(batch)
            except Exception:  # the writer thread must survive anything
                log.exception("telemetry writer error")
            finally:
                with self._cv:
                    self._done += len(batch)
                    self._in_flight = []
                    if forced and self._journal is not None:
                        self._replay_rounds += 1
                    self._cv.notify_all()  # flush() waiters
            if final and not batch:
                with self._cv:
                    if not self._chunks:
                        self._cv.notify_all()
                        return

    # -- with a journal ------------------------------------------------------------------------
    def _deliver(self, batch: list[AttemptRecord]) -> None:
        """Write a batch, or journal it when the database is failing."""
        assert self._journal is not None
        if not self._db_ok and (self._stopping or self._clock() < self._next_probe):
            self._spill(batch)  # closing: no probe per batch, the final replay attempt decides
            return
        if not self._db_ok and self._journal.has_pending():
            # The probe is due and older records wait in the journal: the batch goes behind them
            # and the replay is the probe, so records reach the database in the order accepted
            # (written first, the batch would overtake everything the outage journaled).
            self._spill(batch)
            self._maybe_replay(forced=True)
            return
        try:
            self._write_isolating(batch)
        except Exception as exc:  # noqa: BLE001 - transient: the database's state, not the rows
            self._failed(exc)
            self._spill(batch)
        else:
            self._recovered()

    def _maybe_replay(self, *, forced: bool, have_batch: bool = False) -> None:
        assert self._journal is not None
        if not self._journal.has_pending():
            return
        # While the database fails, a new batch is the probe (cheap); replaying the journal as a
        # probe would read and decode all of it each time. Idle, the replay itself probes.
        probe_due = not (self._stopping or have_batch or self._clock() < self._next_probe)
        if not self._db_ok and not forced and not probe_due:
            return
        try:
            self._journal.replay(self._replay_rows, self._batch_size)
        except Exception as exc:  # noqa: BLE001 - transient: left in the journal
            self._failed(exc)
        else:
            self._recovered()

    def _replay_orphans(self) -> None:
        for orphan in self._orphans:
            try:
                n = orphan.replay(self._replay_rows, self._batch_size)
                if n:
                    log.warning("replayed %d telemetry records left in %s by an earlier process", n, orphan.dir)
            except Exception as exc:  # noqa: BLE001 - left for the next start
                self._failed(exc)
            finally:
                orphan.close()
        self._orphans.clear()

    def _replay_rows(self, rows: list[dict]) -> None:
        records: list[AttemptRecord] = []
        for row in rows:
            try:
                records.append(record_from_row(row))
            except (TypeError, ValueError) as exc:
                self._dead_letter_row(row, f"unreadable journal record: {exc}")
        if records:
            self._write_isolating(records)  # transient errors propagate: replay stops, rows stay
        self.replayed += len(rows)

    def _write_isolating(self, batch: list[AttemptRecord]) -> None:
        """Write ``batch``; a record the database rejects is isolated (halving) and dead-lettered.
        Transient errors propagate."""
        try:
            self.written += self._write_batch(batch)
            return
        except Exception as exc:  # permanent or transient: decided below
            if not _is_permanent(exc):
                raise
            if len(batch) == 1:
                self._reject(batch[0], exc)
                return
        mid = len(batch) // 2
        self._write_isolating(batch[:mid])
        self._write_isolating(batch[mid:])

    def _spill(self, records: Sequence[AttemptRecord]) -> None:
        if not records:
            return
        assert self._journal is not None
        try:
            self._journal.append([record_to_row(r) for r in records])
        except OSError as exc:
            # The disk refuses too (full, read-only): keep the records in memory, past the queue's
            # bound, rather than lose them; the writer thread tries again.
            self._note_error(exc)
            log.error("telemetry journal write failed (%s); %d records kept in memory", self.last_error, len(records))
            with self._cv:
                self._chunks.appendleft(records)
                self._count += len(records)
                self._submitted += len(records)
            if threading.current_thread() is self._thread:
                time.sleep(self._interval)  # do not spin while both the database and the disk fail
            return
        with self._cv:
            self.spilled += len(records)

    def _failed(self, exc: Exception) -> None:
        self.write_failures += 1
        self._note_error(exc)
        delay = self._retry_delays[min(self._failures_in_row, len(self._retry_delays) - 1)]
        self._failures_in_row += 1
        if self._db_ok:
            log.warning("telemetry: database write failed (%s); journaling until it answers", self.last_error)
        self._db_ok = False
        self._next_probe = self._clock() + delay

    def _recovered(self) -> None:
        if not self._db_ok:
            log.warning("telemetry: database answers again; journal replayed")
        self._db_ok = True
        self._failures_in_row = 0

    def _reject(self, record: AttemptRecord, exc: Exception) -> None:
        self.rejected += 1
        self._note_error(exc)
        log.error(
            "telemetry record %s#%s rejected by the database: %s", record.request_id, record.attempt, self.last_error
        )
        if self._journal is not None:
            self._journal.dead_letter(record_to_row(record), self.last_error or type(exc).__name__)

    def _dead_letter_row(self, row: Mapping[str, Any], reason: str) -> None:
        self.rejected += 1
        self.last_error, self.last_error_at = reason, self._wall()
        assert self._journal is not None
        self._journal.dead_letter(row, reason)

    def _note_error(self, exc: BaseException) -> None:
        # First line only: driver errors carry the SQL and its parameters (prompts, session ids).
        text = str(getattr(exc, "orig", None) or exc).strip()
        first = text.splitlines()[0] if text else ""
        self.last_error = f"{type(exc).__name__}: {first}"[:300]
        self.last_error_at = self._wall()

    # -- without a journal ---------------------------------------------------------------------
    def _write_with_retry(self, batch: list[AttemptRecord], *, final: bool) -> None:
        attempt = 0
        while True:
            try:
                self.written += self._write_batch(batch)
                return
            except Exception as exc:  # noqa: BLE001 - any DB error: keep the batch and retry
                if _is_permanent(exc):
                    # Retrying the same rows cannot help: split the batch so one bad record does
                    # not hold back (or, at shutdown, take down) the good ones.
                    self._isolate(batch, exc, final=final)
                    return
                self.write_failures += 1
                self._note_error(exc)
                delay = self._retry_delays[min(attempt, len(self._retry_delays) - 1)]
                attempt += 1
                if (final or self._closed) and attempt > len(self._retry_delays):
                    # Shutting down and the database stays unreachable: say so loudly.
                    log.error("could not write %d telemetry records: %s", len(batch), self.last_error)
                    return
                log.warning("telemetry write failed (%s); retrying in %.2fs", self.last_error, delay)
                time.sleep(delay)

    def _isolate(self, batch: list[AttemptRecord], exc: Exception, *, final: bool) -> None:
        if len(batch) == 1:
            self._reject(batch[0], exc)
            return
        mid = len(batch) // 2
        self._write_with_retry(batch[:mid], final=final)
        self._write_with_retry(batch[mid:], final=final)


def _is_permanent(exc: BaseException) -> bool:
    """Errors caused by the rows themselves (too long, wrong type, constraint, text the driver
    cannot encode), not the database's state: the same rows would fail again."""
    from sqlalchemy.exc import DataError, IntegrityError, ProgrammingError

    return isinstance(exc, (DataError, IntegrityError, ProgrammingError, UnicodeError, ValueError, TypeError))


def record_to_row(record: AttemptRecord) -> dict[str, Any]:
    """A JSON-ready mapping of a record; non-finite floats become their names ("inf", "nan") so
    the journal (strict JSON) can hold any record."""
    row = {}
    for name in FIELD_NAMES:
        value = getattr(record, name)
        if isinstance(value, float) and not math.isfinite(value):
            value = repr(value)
        row[name] = value
    return row


def record_from_row(row: Mapping[str, Any]) -> AttemptRecord:
    """The inverse of :func:`record_to_row` (unknown keys ignored; raises TypeError/ValueError).
    A missing key takes its field's default: a line journalled by an older version, before fields
    such as ``api`` or ``reasoning_tokens`` existed, replays as what that version logged."""
    values = {k: row[k] for k in FIELD_NAMES if k in row}
    for name in _FLOAT_FIELDS:
        if isinstance(values.get(name), str):
            values[name] = float(values[name])
    return AttemptRecord(**values)
