"""A throwaway PostgreSQL cluster of a test's own (initdb in a temporary directory, its own port,
run as the ``postgres`` user), which the test may stop and start again: the shared cluster is
never touched. Needs root (to run as ``postgres``) and Debian's PostgreSQL 15 binaries."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

BIN = Path("/usr/lib/postgresql/15/bin")


def available() -> str | None:
    """Why a cluster cannot be made here, or ``None`` when it can."""
    if not (BIN / "initdb").exists():
        return "PostgreSQL 15 binaries are not installed"
    if os.geteuid() != 0:
        return "running as postgres needs root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    def __init__(self) -> None:
        # Not under pytest's tmp_path: its folders are root-only and postgres must reach its own.
        self.dir = Path(tempfile.mkdtemp(prefix="gw-pg-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.port = _free_port()
        self._as_postgres(str(BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        self.start()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True, timeout=120)

    def _pg_ctl(self, *args: str) -> None:
        self._as_postgres(str(BIN / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        self._pg_ctl("-o", opts, "-l", str(self.dir / "server.log"), "start")

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "stop")

    def remove(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.dir, ignore_errors=True)
