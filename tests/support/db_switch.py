"""A TCP forwarder between the gateway and a real database that a test can switch off and on: off,
it drops every open connection and closes each new one at once (the client sees "server closed the
connection unexpectedly", as when PostgreSQL is stopped or a network path breaks); on, it forwards
again. The database itself keeps running, so a shared test cluster is never stopped."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit, urlunsplit


class DbSwitch:
    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._on = threading.Event()
        self._on.set()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, name="db-switch", daemon=True).start()

    @classmethod
    def in_front_of(cls, url: str) -> tuple[DbSwitch, str]:
        """A switch in front of ``url``'s host and port, and ``url`` rewritten to go through it."""
        parts = urlsplit(url)
        switch = cls(parts.hostname or "127.0.0.1", parts.port or 5432)
        auth, _, _ = parts.netloc.rpartition("@")
        netloc = f"{auth}@127.0.0.1:{switch.port}" if auth else f"127.0.0.1:{switch.port}"
        return switch, urlunsplit(parts._replace(netloc=netloc))

    def off(self) -> None:
        self._on.clear()
        with self._lock:
            for s in list(self._open):
                _close(s)
            self._open.clear()

    def on(self) -> None:
        self._on.set()

    def close(self) -> None:
        self._closed = True
        self.off()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._on.is_set():
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            _close(src)
            _close(dst)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
