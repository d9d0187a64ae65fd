"""ui.resources caches per configuration: two GATEWAY_CONFIG / DATABASE_URL values in one process
get their own settings, engine, routing client and query results, without clearing caches between
them (the key is hashed into every cache key, not passed as an unhashed ``_key``)."""

from __future__ import annotations

import pytest
import streamlit as st

from db.engine import dispose_all
from tests.support import paths
from ui import resources

REPO = paths.REPO


@pytest.fixture
def two_configs(tmp_path, monkeypatch):
    """Two configurations that differ in the initial canary ratio, each with its own database."""
    base = (REPO / "gateway.toml").read_text()
    configs = {}
    for name, ratio in (("a", 0.1), ("b", 0.3)):
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(base.replace("[routing]", f"[routing]\ninitial_ratio = {ratio}", 1))
        configs[name] = (str(cfg), f"sqlite:///{tmp_path / name}.db")
    for var in ("DASHBOARD_PASSWORD", "HOLYSHEEP_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)

    def use(name: str) -> None:
        monkeypatch.setenv("GATEWAY_CONFIG", configs[name][0])
        monkeypatch.setenv("DATABASE_URL", configs[name][1])

    st.cache_data.clear()
    st.cache_resource.clear()
    yield use
    st.cache_data.clear()
    st.cache_resource.clear()  # closes the cached clients
    dispose_all()


def _objects():
    return resources.settings(), resources.engine(), resources.client(), resources.current_canary()


def test_each_configuration_gets_its_own_cached_objects(two_configs):
    two_configs("a")
    settings_a, engine_a, client_a, canary_a = _objects()
    two_configs("b")
    settings_b, engine_b, client_b, canary_b = _objects()

    assert settings_a.routing.initial_ratio == 0.1 and settings_b.routing.initial_ratio == 0.3
    assert str(engine_a.url).endswith("a.db") and str(engine_b.url).endswith("b.db")
    assert client_a is not client_b and client_b.settings is settings_b
    assert (canary_a.ratio, canary_b.ratio) == (0.1, 0.3)

    two_configs("a")  # back to the first: its cached objects again, not rebuilt
    again = _objects()
    assert again[0] is settings_a and again[1] is engine_a and again[2] is client_a
    assert again[3].ratio == 0.1
