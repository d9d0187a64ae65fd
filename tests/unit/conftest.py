"""The unit tier's rule, enforced: a unit test starts no process and opens no network socket (an
in-process ASGI app or an httpx ``MockTransport`` stands in for the network), and never reaches
PostgreSQL. A test that needs any of these belongs in ``tests/integration``; here it fails, naming
what it did.

The PostgreSQL runs of the database tests (the ``postgres`` parameter of ``db_url``) are collected
here but run with the integration tier (``-m postgres``), so ``make test-unit`` deselects them.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator

import pytest

_REASON = "a unit test starts no process, opens no network socket and uses no PostgreSQL (tests/integration)"


class _Breach(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def _unit_tier_rule(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker("postgres") is not None:
        yield  # runs with the integration tier
        return
    seen: list[str] = []

    def breach(what: str) -> None:
        seen.append(what)
        raise _Breach(f"{what}: {_REASON}")

    def popen(self, args, *a, **k):
        breach(f"started a process {args!r}"[:200])

    def fork():
        breach("forked")

    def guarded(name: str):
        original = getattr(socket.socket, name)

        def call(self, *a, **k):
            if self.family in (socket.AF_INET, socket.AF_INET6):
                breach(f"socket.{name}{a!r}")
            return original(self, *a, **k)

        return call

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    monkeypatch.setattr(os, "fork", fork)
    for name in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, name, guarded(name))
    yield
    if seen:
        pytest.fail("; ".join(dict.fromkeys(seen)) + f" ({_REASON})", pytrace=False)
