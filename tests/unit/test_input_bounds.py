"""Issue 7 #12: every number from the config file or the command line is parsed with bounds before any
arithmetic, and a value outside them is refused with one line naming the field and the allowed range.

The config side is checked field by field over the whole settings tree (so a field added later is
covered too); the command line is run as operators run it, in a subprocess.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import annotated_types
import pytest
from pydantic import BaseModel

from app.config import (
    ConfigError,
    FileConfig,
    load_settings,
)
from app.simulator import SimulatedProvider
from app.simulator.server import MAX_HOLD_S
from core.faults import FaultSettings

REPO = Path(__file__).resolve().parents[2]
BASE = (REPO / "gateway.toml").read_text()


def _tables() -> dict[type[BaseModel], str]:
    """The TOML table of each settings model, read off FileConfig (a table added later is covered
    too); providers are checked on ``[providers.direct]``."""
    tables: dict[type[BaseModel], str] = {}
    for name, f in FileConfig.model_fields.items():
        args = getattr(f.annotation, "__args__", ())
        for a in (f.annotation, *args):
            if isinstance(a, type) and issubclass(a, BaseModel):
                tables[a] = f"{name}.direct" if name == "providers" else name
    return tables


TABLES = _tables()
# app.config's own models: each of their numbers has an upper bound. core's (guardrail, faults) are
# checked for finiteness only; the simulator bounds what they feed it (the clamp test below).
OWN_MODELS = tuple(m for m in TABLES if m.__module__ == "app.config")


def config_with(tmp_path: Path, table: str, line: str) -> Path:
    header = f"[{table}]"
    # gateway.toml sets some of these keys itself (its [guardrail] table, since the guardrail is on
    # by default): the tested line replaces the file's own, as a second one would be invalid TOML.
    key = line.split("=", 1)[0].strip()
    lines, in_table = [], False
    for kept in BASE.splitlines():
        if kept.startswith("["):
            in_table = kept.strip() == header
        elif in_table and kept.split("=", 1)[0].strip() == key:
            continue
        lines.append(kept)
    base = "\n".join(lines) + "\n"
    text = base.replace(header, f"{header}\n{line}") if header in base else f"{base}\n{header}\n{line}\n"
    path = tmp_path / "gw.toml"
    path.write_text(text)
    return path


def refusal(tmp_path: Path, table: str, line: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(config_with(tmp_path, table, line), env={"DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"})
    message = str(info.value)
    assert "\n" not in message
    return message


def numeric_fields() -> Iterator[tuple[type[BaseModel], str, type]]:
    for model in OWN_MODELS:
        for name, field in model.model_fields.items():
            kinds = [a for a in (field.annotation, *getattr(field.annotation, "__args__", ())) if a in (int, float)]
            if kinds:
                yield model, name, kinds[0]


NUMERIC = list(numeric_fields())
IDS = [f"{TABLES[m]}.{n}" for m, n, _ in NUMERIC]


def test_the_settings_tree_is_covered():
    """The sweeps below see every table of the file, including the providers' and the intents'."""
    assert {"routing", "providers.direct", "retry", "telemetry", "simulator", "database", "intents"} <= set(
        TABLES.values()
    )
    assert len(NUMERIC) >= 20


@pytest.mark.parametrize(("model", "name", "kind"), NUMERIC, ids=IDS)
def test_every_number_has_an_upper_bound(model, name, kind):
    metadata = model.model_fields[name].metadata
    assert any(isinstance(m, (annotated_types.Le, annotated_types.Lt)) for m in metadata), name


@pytest.mark.parametrize(("model", "name", "kind"), NUMERIC, ids=IDS)
@pytest.mark.parametrize("raw", ["inf", "-inf", "nan", "1e300", "true"])
def test_every_number_refuses_values_that_cannot_work(tmp_path, model, name, kind, raw):
    message = refusal(tmp_path, TABLES[model], f"{name} = {raw}")
    assert name in message
    if raw != "true":
        assert "must be a" in message and "number" in message, message  # the allowed range, stated


def test_every_float_is_finite_in_cores_models_too(tmp_path):
    for table, name in [("guardrail", "error_rate_threshold"), ("providers.direct.faults", "latency_multiplier")]:
        assert name in refusal(tmp_path, table, f"{name} = inf")


@pytest.mark.parametrize(
    ("table", "line", "expected"),
    [
        ("telemetry", "flush_interval_s = inf", "telemetry.flush_interval_s must be a number above 0 and at most 60"),
        ("simulator", "latency_scale = 1e300", "simulator.latency_scale must be a number from 0 to 100, got 1e+300"),
        ("retry", "max_total_wait_s = inf", "retry.max_total_wait_s must be a number from 0 to 3600, got inf"),
        ("retry", "max_attempts = 0", "retry.max_attempts must be a whole number from 1 to 10, got 0"),
        ("telemetry", "queue_size = 100000000000", "telemetry.queue_size must be a whole number from 1 to"),
    ],
)
def test_the_message_names_the_field_and_the_whole_range(tmp_path, table, line, expected):
    assert expected in refusal(tmp_path, table, line)


@pytest.mark.parametrize(
    "url",
    [
        "http://",
        "https://",
        "http:///v1",
        "http://:8000/v1",
        "http://host:99999/v1",
        "http://host:port/v1",
        "http://exa mple.com/v1",
        "ftp://example.com",
        "example.com/v1",
    ],
)
def test_base_url_must_be_http_with_a_host(tmp_path, url):
    line = f'base_url = "{url}"\napi_key_env = "X_KEY"'
    toml = BASE.replace('base_url = "sim://direct"\napi_key_env = "OPENAI_API_KEY"', line)
    assert toml != BASE
    (tmp_path / "gw.toml").write_text(toml)
    with pytest.raises(ConfigError, match=r"providers\.direct\.base_url"):
        load_settings(tmp_path / "gw.toml", env={})


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "https://api.example.com/v1/", "http://[::1]:9/v1"])
def test_real_urls_are_accepted(tmp_path, url):
    toml = BASE.replace('base_url = "sim://direct"', f'base_url = "{url}"')
    (tmp_path / "gw.toml").write_text(toml)
    assert load_settings(tmp_path / "gw.toml", env={}).providers["direct"].base_url == url.rstrip("/")


@pytest.mark.parametrize(
    "url",
    ["sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:?cache=shared", "sqlite:///x.db?mode=memory&uri=true"],
)
def test_in_memory_sqlite_is_refused_with_a_fix(url):
    with pytest.raises(ConfigError, match=r"DATABASE_URL: .*in-memory SQLite.*Fix: use a file"):
        load_settings(REPO / "gateway.toml", env={"DATABASE_URL": url})


# -- the simulator: a huge latency can hold a request, never overflow a sleep ----------------------


def test_simulated_latency_is_held_at_most_max_hold():
    sleeps: list[float] = []
    sim = SimulatedProvider(
        "direct",
        ["gpt-4.1"],
        faults=lambda: FaultSettings(latency_multiplier=1e300),
        latency_scale=100.0,
        sleep=sleeps.append,
        seed=1,
    )
    import httpx2

    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}
    response = sim.handle(httpx2.Request("POST", "http://direct.sim/v1/chat/completions", json=body))
    assert response.status_code == 200
    assert sleeps and all(math.isfinite(s) and 0 < s <= MAX_HOLD_S for s in sleeps)


# -- the command line ----------------------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "gateway.toml"
    config.write_text(BASE + "\n[simulator]\nlatency_scale = 0\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GATEWAY_CONFIG")}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'cli.db'}", GATEWAY_CONFIG=str(config))
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


CLI_CASES = [
    *[
        (["canary", "set", raw, "--reason", "r"], "ratio must be a number from 0 to 1")
        for raw in ["1e-400", "nan", "inf", "1.5", "-0.1", "1e100000000"]
    ],
    *[
        (["prune", "--days", raw], "--days must be a number above 0 and at most 36500")
        for raw in ["nan", "inf", "-1", "1e400"]
    ],
    (["canary", "set", "--reason", "r", "--", "-inf"], "ratio must be a number from 0 to 1"),
    (["prune", "--rollup-days", "inf"], "--rollup-days must be a number above 0"),
    *[
        (["loadgen", "--rps", raw, "--quiet"], "--rps must be a number above 0 and at most 1000")
        for raw in ["0", "nan", "1e9"]
    ],
    (["loadgen", "--duration", "nan", "--quiet"], "--duration must be a number above 0"),
    (["loadgen", "--seed", "1.5", "--quiet"], "--seed must be a whole number from 0"),
    (["simulate", "--port", "99999"], "--port must be a whole number from 0 to 65535"),
]


def test_cli_refusals_write_nothing(cli_env):
    """One run per refusal would take minutes; the first state is read once and compared at the end."""
    before = run(cli_env, "canary", "show", "--json")
    assert before.returncode == 0, before.stderr
    for args, expected in CLI_CASES:
        proc = run(cli_env, *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(lines) == 1 and expected in lines[0], (args, proc.stderr)
        assert proc.stdout == "", args
    after = run(cli_env, "canary", "show", "--json")
    assert json.loads(after.stdout) == json.loads(before.stdout)
