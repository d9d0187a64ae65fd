"""The simulator over real HTTP on loopback: ``python -m app simulate --port N``.

Each request is turned into an ``httpx2.Request`` and answered by the same
``SimulatedProvider.respond`` the in-process transport uses, so both paths behave alike.
``/{name}/v1/...`` reaches the provider ``name``; plain ``/v1/...`` reaches the first one.
Streams go out as chunked server-sent events, written as the provider produces them.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx2

from app.simulator.server import MAX_HOLD_S, SimulatedProvider, UpstreamTimeout

__all__ = ["SimulatorHTTPServer", "make_server", "serve"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
# Hop-by-hop and framing headers are the HTTP server's business, not the provider's.
_NOT_FORWARDED = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length"})
# How often a held (timed-out) request checks whether its client left or the server stops.
_HOLD_POLL_S = 0.1
# How long closing the server waits for its connections' threads once their sockets are shut.
_CLOSE_JOIN_S = 2.0


class _BodyTooLarge(Exception):
    pass


class SimulatorHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server in front of simulated providers; ``stop()`` ends it cleanly."""

    # Handler threads are daemons, so a stuck one never holds the process; ``server_close`` still
    # ends them (connections shut, threads joined within ``_CLOSE_JOIN_S``), so none is left running
    # while the interpreter finalizes, where a thread writing to stderr can wedge the exit.
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], providers: Mapping[str, SimulatedProvider], *, hold_s: float = MAX_HOLD_S
    ) -> None:
        if not providers:
            raise ValueError("the simulator needs at least one provider")
        self.providers = dict(providers)
        self.default_provider = next(iter(self.providers.values()))
        self.hold_s = hold_s
        # Set on stop, so requests held by the timeout fault let go at once.
        self.stopping = threading.Event()
        self._open: dict[socket.socket, threading.Thread] = {}
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), name="simulator-conn", daemon=True
        )
        with self._open_lock:
            self._open[request] = thread
        thread.start()

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if self.stopping.is_set():
            log.debug("simulator: connection from %s ended by the shutdown", client_address, exc_info=True)
        else:
            log.warning("simulator: request from %s failed", client_address, exc_info=True)

    def server_close(self) -> None:
        """Close the listening socket, then every open connection, and wait (bounded) for their
        threads: a keep-alive client or a held request never keeps the process up."""
        self.stopping.set()
        super().server_close()
        with self._open_lock:
            open_now = list(self._open.items())
        for conn, _thread in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its thread
        deadline = time.monotonic() + _CLOSE_JOIN_S
        for _conn, thread in open_now:
            thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{port}"

    def start_in_thread(self) -> threading.Thread:
        # A short poll interval so stop() returns quickly.
        thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="simulator-http", daemon=True
        )
        thread.start()
        return thread

    def stop(self) -> None:
        """Stop serving (from another thread than ``serve_forever``) and close the socket."""
        self.stopping.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams
    server_version = "llm-gateway-simulator"
    # Headers and body go out in separate writes; without TCP_NODELAY, Nagle + delayed ACK stall
    # every keep-alive request on loopback by about 40 ms.
    disable_nagle_algorithm = True
    server: SimulatorHTTPServer

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: object) -> None:
        # The request line only: headers (and so any Authorization) are never logged.
        log.debug("%s %s", self.address_string(), format % args)

    # ---- request ------------------------------------------------------------------------

    def _route(self) -> tuple[SimulatedProvider | None, str]:
        path = urlsplit(self.path).path
        if path == "/v1" or path.startswith("/v1/"):
            return self.server.default_provider, path
        name, _, rest = path.lstrip("/").partition("/")
        provider = self.server.providers.get(name)
        return provider, "/" + rest

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(body)
                if len(body) + size > MAX_BODY_BYTES:
                    raise _BodyTooLarge
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0 or length > MAX_BODY_BYTES:
            raise _BodyTooLarge
        return self.rfile.read(length) if length else b""

    def _dispatch(self) -> None:
        try:
            body = self._read_body()
        except _BodyTooLarge:
            self.close_connection = True
            self._send_json(413, {"error": {"message": "request body too large", "type": "invalid_request_error"}})
            return
        except ValueError:
            self.close_connection = True
            self._send_json(400, {"error": {"message": "malformed request body", "type": "invalid_request_error"}})
            return
        provider, path = self._route()
        if provider is None:
            self._send_json(
                404,
                {
                    "error": {
                        "message": f"Unknown request URL: {self.command} {urlsplit(self.path).path}.",
                        "type": "invalid_request_error",
                        "code": "unknown_url",
                    }
                },
            )
            return
        query = urlsplit(self.path).query
        request = httpx2.Request(
            self.command,
            f"http://{provider.name}.sim{path}" + (f"?{query}" if query else ""),
            headers=[(k, v) for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED],
            content=body,
        )
        try:
            response = provider.respond(request)
        except UpstreamTimeout:
            self._hold()
            return
        self._send(response)

    # ---- response -----------------------------------------------------------------------

    def _send_json(self, status: int, body: object) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _send(self, response: httpx2.Response) -> None:
        self.send_response(response.status_code)
        for key, value in response.headers.multi_items():
            if key.lower() not in _NOT_FORWARDED:
                self.send_header(key, value)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            payload = response.content
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            return

        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        stream = iter(response.stream)  # type: ignore[arg-type]  # a sync transport's stream
        try:
            for chunk in stream:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except httpx2.RemoteProtocolError:
            # The stream-break fault: drop the connection without the closing chunk, which the
            # client sees as an incomplete body, exactly like a real upstream dying mid-answer.
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client left mid-stream
        finally:
            response.close()

    def _hold(self) -> None:
        """The timeout fault over HTTP: answer nothing until the client leaves, the server stops
        or ``hold_s`` passes, then close the connection."""
        self.close_connection = True
        deadline = time.monotonic() + self.server.hold_s
        while not self.server.stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            readable, _, _ = select.select([self.connection], [], [], min(_HOLD_POLL_S, remaining))
            if readable:
                try:
                    peeked = self.connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    return
                if not peeked:
                    return  # the client closed its end
                # A pipelined request is not a disconnect; wait without spinning on it.
                self.server.stopping.wait(min(_HOLD_POLL_S, remaining))


def make_server(
    providers: Mapping[str, SimulatedProvider],
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    hold_s: float = MAX_HOLD_S,
) -> SimulatorHTTPServer:
    """A bound, not yet serving server (``port=0`` picks a free port; see ``.url``)."""
    return SimulatorHTTPServer((host, port), providers, hold_s=hold_s)


def serve(
    providers: Mapping[str, SimulatedProvider],
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    ready: threading.Event | None = None,
) -> None:
    """Serve until Ctrl-C; ``ready`` is set once the port is bound."""
    server = make_server(providers, host, port)
    log.info("simulator serving %s on %s", ", ".join(server.providers), server.url)
    if ready is not None:
        ready.set()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("simulator stopped")
    finally:
        server.stopping.set()
        server.server_close()
