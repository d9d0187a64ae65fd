"""A PostgreSQL cluster of a test's own, and a TCP forwarder in front of it that the test can cut
("the database stops answering") and restore, without touching the shared cluster.

    with ThrowawayPostgres() as pg, Forwarder(pg.port) as fwd:
        url = pg.url(port=fwd.port)       # what the gateway gets
        ...
        fwd.cut()                         # every connection closed, new ones refused
        fwd.restore()

The cluster runs as the ``postgres`` user (initdb refuses root), on a free loopback port with its
socket in its own directory, trust authentication, and is stopped and removed at exit. Skips the
test when the PostgreSQL 15 binaries or ``runuser`` are missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
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
        data = self.dir / "data"
        r = self._as_postgres(str(BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
        assert r.returncode == 0, r.stderr
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        r = self._as_postgres(
            str(BIN / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(self.dir / "log"), "-w", "start"
        )
        assert r.returncode == 0, r.stderr + (self.dir / "log").read_text(errors="replace")
        r = self._as_postgres(str(BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "gateway")
        assert r.returncode == 0, r.stderr
        return self

    def url(self, port: int | None = None) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{port or self.port}/gateway"

    def __exit__(self, *exc: object) -> None:
        self._as_postgres(str(BIN / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


class Forwarder:
    """127.0.0.1:``port`` -> 127.0.0.1:``target``, one thread pair per connection."""

    def __init__(self, target: int):
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open = True
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> Forwarder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self.cut()
        self._listener.close()
        self._thread.join(timeout=5)

    def cut(self) -> None:
        """Close every forwarded connection; refuse new ones until :meth:`restore`."""
        with self._lock:
            self._open = False
            for s in list(self._conns):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._conns.clear()

    def restore(self) -> None:
        with self._lock:
            self._open = True

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                if not self._open:
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                except OSError:
                    client.close()
                    continue
                upstream.settimeout(None)
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)
