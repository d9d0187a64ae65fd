"""Alert webhooks: JSON with a Slack-compatible text, off the caller's thread, retried, bounded,
each failure logged without the URL's secret path."""

from __future__ import annotations

import json
import logging
import threading

import httpx2

from app.alerts import Webhooks, event


def _wait(done: threading.Event) -> None:
    assert done.wait(30), "the webhook thread never delivered"


def test_an_event_reaches_every_url_as_json_with_text() -> None:
    got: list[tuple[str, dict]] = []
    done = threading.Event()

    def handler(request: httpx2.Request) -> httpx2.Response:
        got.append((str(request.url), json.loads(request.content)))
        if len(got) == 2:
            done.set()
        return httpx2.Response(200)

    hooks = Webhooks(["https://a.example/x", "https://b.example/y"], transport=httpx2.MockTransport(handler))
    hooks.send(event("rollout.abort", "[global canary] rollout abort at 10 %", rollout=3))
    _wait(done)
    hooks.close()
    assert [u for u, _ in got] == ["https://a.example/x", "https://b.example/y"]
    body = got[0][1]
    assert body["event"] == "rollout.abort" and body["text"].startswith("[global canary]") and body["rollout"] == 3
    assert hooks.delivered == 2 and hooks.failed == 0


def test_failures_are_retried_then_logged_once_each_without_the_path(caplog) -> None:
    calls: list[int] = []
    pauses: list[float] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        calls.append(1)
        if len(calls) == 1:
            raise httpx2.ConnectError("connection refused")
        return httpx2.Response(503 if len(calls) == 2 else 204)

    hooks = Webhooks(["https://hooks.example/T000/SECRET"], transport=httpx2.MockTransport(handler),
                     attempts=3, sleep=pauses.append)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="app.alerts"):
        hooks.send(event("breaker.open", "breaker opened"))
        hooks.close()
    assert len(calls) == 3 and hooks.delivered == 1 and pauses == [0.5, 1.0]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "ConnectError" in lines[0] and "HTTP 503" in lines[1]
    assert all("hooks.example" in line and "SECRET" not in line for line in lines)


def test_send_never_blocks_and_a_full_queue_drops_with_a_warning(caplog) -> None:
    gate = threading.Event()

    def handler(request: httpx2.Request) -> httpx2.Response:
        gate.wait(30)
        return httpx2.Response(200)

    hooks = Webhooks(["https://a.example/"], transport=httpx2.MockTransport(handler), queue_size=2)
    with caplog.at_level(logging.WARNING, logger="app.alerts"):
        for i in range(6):
            hooks.send(event("rollout.step", f"step {i}"))
    assert hooks.dropped >= 3 and any("queue full" in r.getMessage() for r in caplog.records)
    gate.set()
    hooks.close()


def test_no_url_no_thread() -> None:
    hooks = Webhooks([])
    hooks.send(event("rollout.step", "nothing to send"))
    assert not hooks._thread.is_alive()
    hooks.close()
