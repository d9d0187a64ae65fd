"""Configuration errors name the file, the key and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import annotated_types
import pytest
from pydantic import BaseModel

from app.config import (
    ConfigError,
    FileConfig,
    ProviderNotConfigured,
    key_state,
    load_settings,
    lookup,
    resolve_api_key,
)
from app.simulator import SimulatedProvider
from app.simulator.server import MAX_HOLD_S
from core.faults import FaultSettings
from tests.support import paths

BASE = Path("gateway.toml").read_text()


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gw.toml"
    p.write_text(text)
    return p


def test_default_config_loads_without_keys(tmp_path):
    s = load_settings("gateway.toml", env={})
    assert s.routing.primary == "holysheep" and s.routing.fallback == "direct"
    assert s.primary.is_simulated and key_state(s.primary, env={}) == "simulated"
    assert s.database_url.startswith("sqlite:///") and s.database_url.endswith("data/gateway.db")


def test_gateway_config_env_and_database_url_env(tmp_path):
    p = write(tmp_path, BASE)
    s = load_settings(env={"GATEWAY_CONFIG": str(p), "DATABASE_URL": "postgresql+psycopg://u:p@h/db"})
    assert s.config_path == str(p.resolve()) and s.database_url == "postgresql+psycopg://u:p@h/db"


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.toml: configuration file not found"):
        load_settings(tmp_path / "nope.toml", env={})


def test_malformed_toml(tmp_path):
    with pytest.raises(ConfigError, match=r"gw\.toml: not valid TOML"):
        load_settings(write(tmp_path, "[routing\nprimary="), env={})


def test_unknown_key_names_file_key_and_allowed(tmp_path):
    p = write(tmp_path, BASE.replace('default_model = "gpt-4.1"', 'default_model = "gpt-4.1"\nmodelz = []'))
    with pytest.raises(ConfigError) as info:
        load_settings(p, env={})
    msg = str(info.value)
    assert "gw.toml" in msg and "providers.direct.modelz: unknown key" in msg
    assert "allowed: base_url, api_key_env, models, default_model" in msg


def test_unknown_top_level_section(tmp_path):
    with pytest.raises(ConfigError, match=r"routingg: unknown key; allowed: routing, providers"):
        load_settings(write(tmp_path, BASE + "\n[routingg]\nx = 1\n"), env={})


def test_bad_values(tmp_path):
    cases = {
        'primary = "holysheep"': ('primary = "nobody"', "routing.primary = 'nobody' is not a provider"),
        'base_url = "sim://direct"': ('base_url = "ftp://x"', "must start with sim://, http:// or https://"),
        'models = ["gpt-4.1", "gemini-2.5-flash", "text-embedding-3-small"]': (
            'models = ["gpt-5-ultra"]',
            "unknown model(s) gpt-5-ultra",
        ),
    }
    for old, (new, expect) in cases.items():
        with pytest.raises(ConfigError) as info:
            load_settings(write(tmp_path, BASE.replace(old, new)), env={})
        assert expect in str(info.value)


def test_default_model_must_be_served(tmp_path):
    p = write(tmp_path, BASE.replace('default_model = "gpt-4.1"', 'default_model = "deepseek-chat-v3.2"'))
    with pytest.raises(ConfigError, match=r"default_model 'deepseek-chat-v3\.2' must be one of models"):
        load_settings(p, env={})


def test_wrong_type(tmp_path):
    with pytest.raises(ConfigError, match=r"retry\.max_attempts"):
        load_settings(write(tmp_path, BASE + '\n[retry]\nmax_attempts = "many"\n'), env={})


def test_unsupported_database_url():
    with pytest.raises(ConfigError, match="DATABASE_URL: unsupported database 'mysql'"):
        load_settings("gateway.toml", env={"DATABASE_URL": "mysql://x"})


def test_real_provider_key_read_when_used_only(tmp_path):
    text = BASE.replace('base_url = "sim://holysheep"', 'base_url = "https://api.holysheep.ai/v1"')
    s = load_settings(write(tmp_path, text), env={})  # no crash without the key
    assert key_state(s.primary, env={}) == "missing"
    with pytest.raises(ProviderNotConfigured, match="not configured: set HOLYSHEEP_API_KEY"):
        resolve_api_key("holysheep", s.primary, env={})
    assert resolve_api_key("holysheep", s.primary, env={"HOLYSHEEP_API_KEY": "k"}) == "k"
    assert key_state(s.primary, env={}, secrets={"HOLYSHEEP_API_KEY": "k"}) == "set"


def test_real_provider_needs_api_key_env(tmp_path):
    text = BASE.replace(
        'base_url = "sim://direct"\napi_key_env = "OPENAI_API_KEY"\n', 'base_url = "https://api.openai.com/v1"\n'
    )
    with pytest.raises(ConfigError, match="api_key_env is required"):
        load_settings(write(tmp_path, text), env={})


def test_bad_intent_rules(tmp_path):
    p = write(tmp_path, BASE + '\n[intents]\ndefault_model = "nope"\n')
    with pytest.raises(ConfigError, match=r"intents\.default_model: unknown model 'nope'"):
        load_settings(p, env={})
    p = write(tmp_path, BASE + "\n[intents]\nfoo = 1\n")
    with pytest.raises(ConfigError, match=r"intents\.foo: unknown key; allowed: chars_per_token"):
        load_settings(p, env={})


def test_one_precedence_environment_then_secrets_then_file_then_default():
    assert lookup("X", {"X": "env"}, {"X": "secret"}, "file", "default") == "env"
    assert lookup("X", {"X": ""}, {"X": "secret"}, "file", "default") == "secret"
    assert lookup("X", {}, {}, "file", "default") == "file"
    assert lookup("X", {}, None, None, "default") == "default"
    assert lookup("X", {}, None) is None


def test_database_url_from_secrets_when_the_environment_has_none(tmp_path):
    cfg = tmp_path / "g.toml"
    repo_cfg = paths.REPO / "gateway.toml"
    cfg.write_text('database_url = "sqlite:///from-file.db"\n' + repo_cfg.read_text())  # top level: first
    from_secrets = load_settings(cfg, env={}, secrets={"DATABASE_URL": "sqlite:///from-secrets.db"})
    assert from_secrets.database_url == "sqlite:///from-secrets.db"
    assert load_settings(cfg, env={}).database_url == "sqlite:///from-file.db"
    env = {"DATABASE_URL": "sqlite:///from-env.db"}
    assert load_settings(cfg, env=env, secrets={"DATABASE_URL": "x"}).database_url == "sqlite:///from-env.db"


# -- input bounds ----------------------------------------------------------------------------------
# Issue 7 #12: every number from the config file or the command line is parsed with bounds before any
# arithmetic, and a value outside them is refused with one line naming the field and the allowed range.
#
# The config side is checked field by field over the whole settings tree (so a field added later is
# covered too); the command line is run as operators run it, in a subprocess.


REPO = paths.REPO
# With one route, so the sweeps below reach [routes.NAME]'s numbers too.
BASE_INPUT_BOUNDS = (
    REPO / "gateway.toml"
).read_text() + '\n[routes.r1]\ndeployments = [{ provider = "direct", model = "gpt-4.1" }]\n'


def _tables() -> dict[type[BaseModel], str]:
    """The TOML table of each settings model, read off FileConfig (a table added later is covered
    too); providers are checked on ``[providers.direct]``, routes on ``[routes.r1]``."""
    tables: dict[type[BaseModel], str] = {}
    for name, f in FileConfig.model_fields.items():
        args = getattr(f.annotation, "__args__", ())
        for a in (f.annotation, *args):
            if isinstance(a, type) and issubclass(a, BaseModel):
                tables[a] = f"{name}.direct" if name == "providers" else f"{name}.r1" if name == "routes" else name
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
    for kept in BASE_INPUT_BOUNDS.splitlines():
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
    toml = BASE_INPUT_BOUNDS.replace('base_url = "sim://direct"\napi_key_env = "OPENAI_API_KEY"', line)
    assert toml != BASE_INPUT_BOUNDS
    (tmp_path / "gw.toml").write_text(toml)
    with pytest.raises(ConfigError, match=r"providers\.direct\.base_url"):
        load_settings(tmp_path / "gw.toml", env={})


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "https://api.example.com/v1/", "http://[::1]:9/v1"])
def test_real_urls_are_accepted(tmp_path, url):
    toml = BASE_INPUT_BOUNDS.replace('base_url = "sim://direct"', f'base_url = "{url}"')
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


REAL = 'base_url = "https://api.openai.com/v1"\napi_key_env = "OPENAI_API_KEY"\n'


def _real(extra: str, base_url: str = "https://api.openai.com/v1") -> str:
    """The shipped config with ``direct`` a real provider with ``extra`` lines."""
    return BASE.replace(
        'base_url = "sim://direct"\napi_key_env = "OPENAI_API_KEY"\n',
        f'base_url = "{base_url}"\napi_key_env = "OPENAI_API_KEY"\n{extra}',
    )


@pytest.mark.parametrize(
    ("base_url", "extra", "expect"),
    [
        ("https://user:pw@api.example.com/v1", "", "must not carry a user name or password"),
        ("https://api.example.com/v1?key=1", "", "must not have a query or fragment"),
        ("https://api.example.com/v1#x", "", "must not have a query or fragment"),
        ("https://api.example.com/v1", 'forward_headers = ["expect"]\n', "hop-by-hop"),
        ("https://api.example.com/v1", 'forward_headers = ["transfer-encoding"]\n', "hop-by-hop"),
        ("https://api.example.com/v1", 'forward_headers = ["proxy-authorization"]\n', "hop-by-hop"),
        ("https://api.example.com/v1", 'forward_headers = ["accept-encoding"]\n', "hop-by-hop"),
        ("https://api.example.com/v1", 'forward_headers = ["host"]\n', "the gateway sets host itself"),
        ("https://api.example.com/v1", 'forward_headers = ["X-Org", "x-org"]\n', "listed more than once"),
        ("https://api.example.com/v1", 'proxy = "socks5://p:1080"\n', 'must be "none" or an http:// or https://'),
        ("https://api.example.com/v1", 'proxy = "http://p:3128/path"\n', "no path or query"),
        ("https://api.example.com/v1", 'ca_bundle = "/nonexistent/ca.pem"\n', "is not a file"),
    ],
)
def test_the_config_refuses_what_no_upstream_connection_should_carry(tmp_path, base_url, extra, expect):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, _real(extra, base_url)), env={})
    assert expect in str(info.value)
    assert "providers.direct" in str(info.value)  # the field is named


def test_proxy_and_tls_files_load_and_a_key_needs_its_certificate(tmp_path):
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    not_pem = tmp_path / "ca.der"
    not_pem.write_bytes(b"\x30\x82\x01")
    ok = load_settings(write(tmp_path, _real(f'proxy = "none"\nca_bundle = "{pem}"\n')), env={})
    assert ok.providers["direct"].proxy == "none" and ok.providers["direct"].ca_bundle == str(pem)
    assert ok.providers["direct"].net().proxy is None
    with pytest.raises(ConfigError, match="not a PEM file"):
        load_settings(write(tmp_path, _real(f'ca_bundle = "{not_pem}"\n')), env={})
    with pytest.raises(ConfigError, match="client_key needs client_cert"):
        load_settings(write(tmp_path, _real(f'client_key = "{pem}"\n')), env={})
