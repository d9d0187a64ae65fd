"""Configuration errors name the file, the key and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import ConfigError, ProviderNotConfigured, key_state, load_settings, lookup, resolve_api_key

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
    repo_cfg = Path(__file__).resolve().parents[2] / "gateway.toml"
    cfg.write_text('database_url = "sqlite:///from-file.db"\n' + repo_cfg.read_text())  # top level: first
    from_secrets = load_settings(cfg, env={}, secrets={"DATABASE_URL": "sqlite:///from-secrets.db"})
    assert from_secrets.database_url == "sqlite:///from-secrets.db"
    assert load_settings(cfg, env={}).database_url == "sqlite:///from-file.db"
    env = {"DATABASE_URL": "sqlite:///from-env.db"}
    assert load_settings(cfg, env=env, secrets={"DATABASE_URL": "x"}).database_url == "sqlite:///from-env.db"


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
