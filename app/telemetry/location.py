"""Where a process keeps its telemetry journal, and how two processes avoid sharing one.

Every database URL gets its own directory (so two databases never share a journal): under
``[telemetry] journal_dir`` when configured, else a ``journal`` directory next to the SQLite file,
else ``data/journal`` in the working directory (PostgreSQL). The directory name is the database's
name plus a hash of its URL (password removed, SQLite path made absolute).

Inside it, each process holds one numbered slot (``slot-0``, ``slot-1`` ...) under an exclusive
``flock``, so a dashboard and a CLI command on the same database never write or replay the same
segments. A slot's lock dies with its process; the next process to start takes the lowest free slot
(and replays what is in it), and also adopts every other unlocked slot that still holds records
(a journal left by a killed process is replayed even when its slot number is not reused).

A directory that cannot be written (a read-only mount, a path through a file, no permission) is
refused with :class:`JournalUnwritable`, one line naming the directory with a ``Fix:``; there is no
silent fallback elsewhere, since another process of the same database would not look there and
what was journaled would never be replayed. ``serve`` checks it (:func:`check_writable`) before it
announces itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sqlalchemy.engine import make_url

from app.config import ConfigError
from app.telemetry.journal import Journal
from app.telemetry.writer import TelemetryWriter
from core.records import AttemptRecord

LOCK_NAME = "owner.lock"
MAX_SLOTS = 64


class JournalUnwritable(ConfigError):
    """The journal directory cannot be created or written; the message says what to change."""

    def __init__(self, directory: Path, exc: OSError):
        reason = exc.strerror or type(exc).__name__
        super().__init__(
            f"telemetry journal directory {str(directory)!r} cannot be written ({reason}); "
            "Fix: make it writable, or set [telemetry] journal_dir in the configuration to a writable directory"
        )


def check_writable(directory: Path | None) -> None:
    """Create ``directory`` and write (then remove) a probe file in it, or raise
    :class:`JournalUnwritable`. ``None`` (no journal) passes."""
    if directory is None:
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise JournalUnwritable(directory, exc) from None


def journal_dir_for(database_url: str, configured: str | None = None, cwd: Path | None = None) -> Path | None:
    """The journal directory of ``database_url`` (None for an in-memory SQLite database, which
    does not outlive the process, so neither should its records)."""
    cwd = cwd or Path.cwd()
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        if not url.database or url.database == ":memory:" or url.database.startswith("file::memory:"):
            return None
        db_path = Path(url.database)
        db_path = db_path if db_path.is_absolute() else (cwd / db_path)
        db_path = db_path.resolve()
        identity = f"sqlite:{db_path}"
        name = db_path.name
        base = Path(configured) if configured else db_path.parent / "journal"
    else:
        identity = url.render_as_string(hide_password=True)  # "***": the password is no part of it
        name = f"{url.get_backend_name()}-{url.host or 'local'}-{url.database or ''}"
        base = Path(configured) if configured else cwd / "data" / "journal"
    if not base.is_absolute():
        base = cwd / base
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return base / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)[:60]}-{digest}"


@dataclass
class JournalClaim:
    """This process's journal (a locked slot) and the journals of dead processes it adopted."""

    journal: Journal
    orphans: list[Journal] = field(default_factory=list)
    _locks: list[IO[bytes]] = field(default_factory=list, repr=False)

    def release(self) -> None:
        """Unlock every slot; this process's own slot directory is removed when it holds nothing
        (no segments, no dead letters), so short-lived processes leave no litter."""
        own = self.journal.dir
        if not any(p.name != LOCK_NAME for p in own.iterdir()):
            for p in (own / LOCK_NAME, own):
                try:
                    p.unlink() if p.is_file() else p.rmdir()
                except OSError:
                    pass
            try:
                own.parent.rmdir()  # the database's directory, if no other slot remains
            except OSError:
                pass
        for f in self._locks:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            finally:
                f.close()
        self._locks.clear()


def _try_lock(slot: Path) -> IO[bytes] | None:
    slot.mkdir(parents=True, exist_ok=True)
    f = open(slot / LOCK_NAME, "ab")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def claim_journal(directory: str | os.PathLike[str], **journal_kw) -> JournalClaim:
    """Lock the lowest free slot under ``directory`` for this process and adopt every other
    unlocked slot that holds records (see the module docstring)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    mine: Journal | None = None
    orphans: list[Journal] = []
    locks: list[IO[bytes]] = []
    existing = sorted((p for p in root.glob("slot-*") if p.is_dir()), key=lambda p: int(p.name[5:] or 0))
    candidates = [root / f"slot-{i}" for i in range(MAX_SLOTS)]
    for slot in candidates:
        lock = _try_lock(slot)
        if lock is not None:
            locks.append(lock)
            mine = Journal(slot, **journal_kw)
            break
    if mine is None:
        raise RuntimeError(f"{root}: all {MAX_SLOTS} journal slots are held by running processes")
    for slot in existing:
        if slot == mine.dir:
            continue
        lock = _try_lock(slot)
        if lock is None:
            continue  # a live process owns it
        orphan = Journal(slot, **journal_kw)
        if orphan.has_pending():
            locks.append(lock)
            orphans.append(orphan)
        else:
            orphan.close()
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            lock.close()
    return JournalClaim(journal=mine, orphans=orphans, _locks=locks)


def open_writer(
    database_url: str,
    write_batch: Callable[[Sequence[AttemptRecord]], int],
    *,
    journal_dir: str | None = None,
    queue_size: int = 10_000,
    batch_size: int = 500,
    flush_interval_s: float = 0.2,
    **writer_kw: Any,
) -> TelemetryWriter:
    """A :class:`TelemetryWriter` with this process's journal for ``database_url`` (none for an
    in-memory database): what :func:`app.gateway.build_gateway` wires."""
    directory = journal_dir_for(database_url, journal_dir)
    if directory is None:
        return TelemetryWriter(
            write_batch, queue_size=queue_size, batch_size=batch_size, flush_interval_s=flush_interval_s, **writer_kw
        )
    try:
        claim = claim_journal(directory, fsync_every=batch_size)
    except OSError as exc:
        raise JournalUnwritable(directory, exc) from None
    return TelemetryWriter(
        write_batch,
        queue_size=queue_size,
        batch_size=batch_size,
        flush_interval_s=flush_interval_s,
        journal=claim.journal,
        orphans=claim.orphans,
        on_release=claim.release,
        **writer_kw,
    )


@dataclass(frozen=True)
class SlotInfo:
    slot: str
    records: int  # waiting in the journal
    dead_letters: int
    live: bool  # held by a running process (else: left by a process that ended)


def journal_overview(directory: str | os.PathLike[str] | None) -> list[SlotInfo]:
    """What the journals of one database hold on disk, slot by slot, read without claiming them
    (for ``status``: records other processes, or dead ones, have not replayed yet)."""
    if directory is None:
        return []
    root = Path(directory)
    if not root.is_dir():
        return []
    out = []
    for slot in sorted((p for p in root.glob("slot-*") if p.is_dir()), key=lambda p: int(p.name[5:] or 0)):
        lock = _try_lock(slot)
        live = lock is None
        if lock is not None:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            lock.close()
        records = sum(_lines(p) for p in slot.glob("segment-*.jsonl"))
        out.append(SlotInfo(slot.name, records, _lines(slot / "dead-letter.jsonl"), live))
    return out


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0
