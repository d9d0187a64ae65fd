"""Fixtures for the real-client tests: a scripted loopback upstream, a real ``python -m app serve``
process in front of it, and the ``target`` each test talks to. The upstream and the process start
once per test session (per xdist worker), not per module: starting the server and creating its key
through the CLI takes seconds on a loaded 2-core machine, and every test resets what it uses.

``bridged`` is a third kind of target, for the clients of the Responses API: a second serve process
whose providers serve only chat completions, so the gateway translates (app/routing/bridge.py) and
the upstream receives chat completions requests.

``target`` is ``"gateway"`` (the client talks to the serve process, which talks to the upstream) or
``"upstream"`` (the client talks to the scripted upstream directly). The second proves that a test
is right about the client and the wire, independently of the gateway: a test that fails on
"upstream" is a wrong test. CI runs "gateway" only; choose with the environment variable
``CLIENT_TARGETS`` (comma-separated, default ``gateway``), e.g.

    CLIENT_TARGETS=upstream .venv/bin/python -m pytest -p no:xdist -q tests/integration/clients
    CLIENT_TARGETS=gateway,upstream .venv/bin/python -m pytest -p no:xdist -q tests/integration/clients

Both targets send every request to the upstream provider ``direct`` (the gateway's config sends it
the whole canary-free share, with one attempt and nothing to fail over to), so ``target.received``
is what reached the upstream either way. Each test starts with empty scripts and the schema-valid
:func:`openai_like` default answer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from app.catalog import model_names
from tests.support import serve_process as sp
from tests.support.chaos_upstream import ChaosUpstream, Fault, RecordedRequest, openai_like
from tests.support.wire_tap import WireTap

PROVIDER = "direct"
TARGETS = ("gateway", "upstream")
# What both configured providers serve (chat and legacy completions use gpt-4.1), as far as the
# gateway's model catalog knows them (the config refuses unknown models; a test naming a model the
# catalog lacks then fails with the gateway's refusal, which says why).
WANTED_MODELS = ("gpt-4.1", "gemini-2.5-flash", "text-embedding-3-small")
MODELS = tuple(m for m in WANTED_MODELS if m in model_names())


def selected_targets() -> list[str]:
    chosen = [t.strip() for t in os.environ.get("CLIENT_TARGETS", "gateway").split(",") if t.strip()]
    unknown = sorted(set(chosen) - set(TARGETS))
    if unknown or not chosen:
        raise pytest.UsageError(f"CLIENT_TARGETS: {unknown or chosen} (choose among {', '.join(TARGETS)})")
    return chosen


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        metafunc.parametrize("target", selected_targets(), indirect=True)


@dataclass
class Target:
    """Where a test's client points, and what reached the upstream behind it."""

    name: str
    base_url: str
    api_key: str
    upstream: ChaosUpstream
    tap: WireTap
    start: int  # requests the upstream had seen before this test

    @property
    def is_gateway(self) -> bool:
        return self.name == "gateway"

    def script(self, *faults: Fault) -> None:
        self.upstream.script(*faults, provider=PROVIDER)

    @property
    def received(self) -> list[RecordedRequest]:
        """The requests that reached the upstream during this test, in order."""
        return [r for r in self.upstream.requests[self.start :] if r.provider == PROVIDER]

    @property
    def last(self) -> RecordedRequest:
        got = self.received
        assert got, "no request reached the upstream"
        return got[-1]

    def openai(self, **kw: Any) -> openai.OpenAI:
        """openai-python pointed at the target, SDK retries off, every exchange recorded in ``tap``."""
        return openai.OpenAI(
            base_url=self.base_url, api_key=self.api_key, max_retries=0, http_client=self.tap.client(), **kw
        )

    def async_openai(self, **kw: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, max_retries=0, http_client=self.tap.async_client(), **kw
        )

    def validate_all(self) -> int:
        """Every body and SSE event the client read, against the official OpenAI schemas."""
        return self.tap.validate_all()


@pytest.fixture(scope="session")
def upstream():
    with ChaosUpstream(default=openai_like()) as up:
        yield up


#: What the bridged gateway's providers serve: everything but the Responses API.
CHAT_ONLY = ("chat", "embeddings", "completions")


def _serve_with_key(upstream: ChaosUpstream, tmp: Path, **config: Any):
    cfg = tmp / "gateway.toml"
    cfg.write_text(sp.chaos_config(upstream.url, models=MODELS, **config))
    proc = sp.start(cfg, f"sqlite:///{tmp / 'gw.db'}")
    out = sp.cli(proc.env, "keys", "create", "--name", "clients", "--json")
    if out.returncode != 0:
        proc.terminate()
        raise AssertionError(out.stderr)
    return proc, json.loads(out.stdout)["key"]


@pytest.fixture(scope="session")
def gateway(upstream, tmp_path_factory):
    """The serve process on the scripted upstream and a gateway key for it: ``(process, key)``."""
    proc, key = _serve_with_key(upstream, tmp_path_factory.mktemp("serve"))
    try:
        yield proc, key
    finally:
        proc.terminate()


@pytest.fixture(scope="session")
def bridged_gateway(upstream, tmp_path_factory):
    """A serve process whose providers serve only chat completions: ``(process, key)``."""
    proc, key = _serve_with_key(upstream, tmp_path_factory.mktemp("serve-bridged"), apis=CHAT_ONLY)
    try:
        yield proc, key
    finally:
        proc.terminate()


def _reset(upstream: ChaosUpstream) -> None:
    with upstream._lock:
        upstream._queues.clear()
    upstream.set_default(openai_like())


@pytest.fixture()
def bridged(upstream, bridged_gateway) -> Any:
    """A :class:`Target` named "bridged": the Responses API through the gateway's bridge to chat."""
    _reset(upstream)
    proc, key = bridged_gateway
    tap = WireTap()
    yield Target("bridged", proc.base_url, key, upstream, tap, len(upstream.requests))
    tap.close()


@pytest.fixture()
def target(request, upstream) -> Any:
    _reset(upstream)
    if request.param == "gateway":
        proc, key = request.getfixturevalue("gateway")
        base_url = proc.base_url
    else:
        base_url, key = upstream.base_url(PROVIDER), sp.UPSTREAM_KEY
    tap = WireTap()
    yield Target(request.param, base_url, key, upstream, tap, len(upstream.requests))
    tap.close()
