"""A PostgreSQL cluster of a test's own, which the test may stop and start again, without touching
the shared cluster. For "the database stops answering" while it keeps running, put a
:class:`tests.support.db_switch.DbSwitch` in front of it:

    with ThrowawayPostgres() as pg:
        switch = DbSwitch("127.0.0.1", pg.port)
        url = pg.url(port=switch.port)    # what the gateway gets
        ...
        switch.off()                      # every connection closed, new ones refused
        switch.on()
        pg.stop(); pg.start()             # or the server itself stopped and started again

The cluster runs as the ``postgres`` user (initdb refuses root), on a free loopback port with its
socket in its own directory, trust authentication, and is stopped and removed at exit. Skips the
test when the PostgreSQL 15 binaries, ``runuser`` or root are missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThrowawayPostgres:
    def __init__(self) -> None:
        if not (BIN / "initdb").exists() or shutil.which("runuser") is None or os.geteuid() != 0:
            pytest.skip("needs PostgreSQL 15 binaries, runuser and root to make a throwaway cluster")
        # Under /tmp, not pytest's tmp_path: its parents are root-only, and the server runs as postgres.
        self.dir = Path(tempfile.mkdtemp(prefix="gw-pg-"))
        self.port = free_port()

    def _as_postgres(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["runuser", "-u", "postgres", "--", *args], capture_output=True, text=True, timeout=timeout
        )

    def __enter__(self) -> ThrowawayPostgres:
        shutil.chown(self.dir, "postgres", "postgres")
        r = self._as_postgres(str(BIN / "initdb"), "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres")
        assert r.returncode == 0, r.stderr
        self.start()
        r = self._as_postgres(str(BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "gateway")
        assert r.returncode == 0, r.stderr
        return self

    def start(self) -> None:
        """Start the server (again), waiting until it accepts connections."""
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        r = self._as_postgres(
            str(BIN / "pg_ctl"), "-D", str(self.dir / "data"), "-o", opts, "-l", str(self.dir / "log"), "-w", "start"
        )
        assert r.returncode == 0, r.stderr + (self.dir / "log").read_text(errors="replace")

    def stop(self) -> None:
        """Stop the server (fast shutdown: open sessions are ended), keeping its data for :meth:`start`."""
        r = self._as_postgres(str(BIN / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")
        assert r.returncode == 0, r.stderr

    def url(self, port: int | None = None) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{port or self.port}/gateway"

    def __exit__(self, *exc: object) -> None:
        # Whether or not it is running (a test may have stopped it): stop it if it is, then remove it.
        self._as_postgres(str(BIN / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)
