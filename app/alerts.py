"""Operational events to the ``[alerts] webhooks``: rollout steps, pauses, aborts and completions,
guardrail rollbacks and breaker openings, as JSON with a Slack-compatible ``text`` field.

:meth:`Webhooks.send` only puts the event on a bounded queue and returns: delivery never happens on
the request path (a breaker hook runs on the request thread). One daemon thread posts each event
to each URL, every attempt bounded by ``timeout_s``, retried up to ``attempts`` times with a
growing pause; each failed attempt is logged with the URL's host (never its path, which for Slack
and most chat tools is the secret) and the reason. A full queue drops the event with a warning
rather than block. :meth:`close` drains what is queued within a bound.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx2

log = logging.getLogger(__name__)
QUEUE_SIZE = 1000
_STOP = object()


def event(kind: str, text: str, **fields: Any) -> dict[str, Any]:
    """One event: ``kind`` (e.g. ``rollout.abort``), the line a person reads (``text``, which Slack
    shows), the wall time and any other fields."""
    return {"event": kind, "text": text, "ts": time.time(), **fields}


def _host(url: str) -> str:
    return urlsplit(url).netloc or "?"


class Webhooks:
    """Delivers events to every URL in ``urls`` from a background thread."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout_s: float = 5.0,
        attempts: int = 3,
        backoff_s: float = 0.5,
        queue_size: int = QUEUE_SIZE,
        transport: httpx2.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.urls = list(urls)
        self.attempts = attempts
        self.backoff_s = backoff_s
        self._sleep = sleep
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._client = httpx2.Client(timeout=timeout_s, transport=transport, follow_redirects=False)
        self.delivered = 0
        self.failed = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="alert-webhooks", daemon=True)
        if self.urls:
            self._thread.start()

    def send(self, payload: dict[str, Any]) -> None:
        """Queue ``payload`` for every URL; never blocks."""
        if not self.urls:
            return
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            self.dropped += 1
            log.warning("alert webhooks: queue full (%d events); dropped %s", self._queue.qsize(), payload.get("event"))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            assert isinstance(item, dict)
            body = json.dumps(item, default=str).encode()  # ASCII: a lone surrogate in a reason cannot fail it
            for url in self.urls:
                self._deliver(url, body, str(item.get("event")))

    def _deliver(self, url: str, body: bytes, kind: str) -> bool:
        for attempt in range(1, self.attempts + 1):
            try:
                resp = self._client.post(url, content=body, headers={"content-type": "application/json"})
                if resp.status_code < 300:
                    self.delivered += 1
                    return True
                reason = f"HTTP {resp.status_code}"
            except httpx2.HTTPError as exc:
                reason = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
            log.warning(
                "alert webhook to %s failed (%s event, attempt %d of %d): %s",
                _host(url), kind, attempt, self.attempts, reason,
            )  # fmt: skip
            if attempt < self.attempts:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
        self.failed += 1
        return False

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued, for at most ``timeout_s``; then stop."""
        if self._thread.is_alive():
            try:
                self._queue.put(_STOP, timeout=timeout_s)
            except queue.Full:
                pass
            self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._client.close()


class NoWebhooks(Webhooks):
    """No URL configured: :meth:`send` does nothing and no thread runs."""

    def __init__(self) -> None:
        super().__init__(())
