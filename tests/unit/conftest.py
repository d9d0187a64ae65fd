"""The unit tier's rule, enforced: a unit test starts no process, binds no port and never reaches
PostgreSQL (an in-process ASGI app or an httpx ``MockTransport`` stands in for the network). A test
that needs any of these belongs in ``tests/integration``; here it fails, naming what it did. The
network is empty: a connection attempt is refused at once, as if nothing listened, so code that
probes for a server (the dashboard's gateway probe) sees none. The rule covers a test's fixtures of
every scope (they are set up inside the test's own run).

The PostgreSQL runs of the database tests (the ``postgres`` parameter of ``db_url``) are collected
here and run with the integration tier (``-m postgres``); ``make test-unit`` deselects them.
"""

from __future__ import annotations

import errno
import os
import platform
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

_REASON = "a unit test starts no process, binds no port and uses no PostgreSQL: tests/integration"
_breaches: list[str] = []
HERE = Path(__file__).resolve().parent

# platform caches what it learns by running `uname -p`; learn it before the rule is on.
platform.processor()


def _breach(what: str) -> None:
    _breaches.append(what)
    raise RuntimeError(f"{what} ({_REASON})")


def _popen(self, args, *a, **k):
    _breach(f"started a process {args!r}"[:200])


def _fork():
    _breach("forked")


def _guarded(name: str):
    original = getattr(socket.socket, name)

    def call(self, *a, **k):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            if name == "bind":
                _breach(f"socket.bind{a!r}")
            if name == "connect_ex":
                return errno.ECONNREFUSED
            raise ConnectionRefusedError(errno.ECONNREFUSED, "the unit tier's network is empty")
        return original(self, *a, **k)

    return call


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # pytest calls this hook for every item of the session, not only those below this conftest:
    # the integration tier runs in the same session as the unit tier's PostgreSQL tests.
    if HERE not in Path(str(item.fspath)).parents or item.get_closest_marker("postgres") is not None:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "__init__", _popen)
        mp.setattr(os, "fork", _fork)
        for name in ("connect", "connect_ex", "bind"):
            mp.setattr(socket.socket, name, _guarded(name))
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    if not _breaches:
        return
    report = outcome.get_result()
    seen = "; ".join(dict.fromkeys(_breaches))
    _breaches.clear()
    if report.passed:  # the code under test swallowed the refusal; the test still broke the rule
        report.outcome = "failed"
        report.longrepr = f"{seen} ({_REASON})"
