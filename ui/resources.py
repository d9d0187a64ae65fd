"""One settings object, one engine and one RoutingClient per process (``st.cache_resource``), and
the short-``ttl`` query helpers the pages read through (``st.cache_data``; Refresh clears them).

Keys are read from the environment or ``st.secrets`` only when a provider is used; nothing here
ever returns or displays one.
"""

from __future__ import annotations

import os
import time

import streamlit as st
from sqlalchemy import Engine

from app.config import Settings, load_settings
from app.routing import RoutingClient

QUERY_TTL_S = 3


def _config_key() -> tuple[str, str]:
    # The first argument of every cached function below, hashed into its cache key (no leading
    # underscore: Streamlit does not hash underscore-prefixed arguments), so a process that sees
    # another GATEWAY_CONFIG / DATABASE_URL gets its own settings, engine, client and query results.
    return os.environ.get("GATEWAY_CONFIG", ""), os.environ.get("DATABASE_URL", "")


def secrets() -> dict[str, str]:
    """Top-level string secrets (for provider keys); empty when there is no secrets file."""
    try:
        return {k: v for k, v in st.secrets.to_dict().items() if isinstance(v, str)}
    except Exception:  # noqa: BLE001 - no secrets.toml is the normal case
        return {}


@st.cache_resource(show_spinner=False)
def _settings(key: tuple[str, str]) -> Settings:
    return load_settings()  # reads the same environment ``key`` was taken from


def settings() -> Settings:
    """The validated configuration; raises ``ConfigError`` with a clear message."""
    return _settings(_config_key())


@st.cache_resource(show_spinner=False)
def _engine(url: str, initial_ratio: float) -> Engine:
    from db.canary import ensure_setting
    from db.engine import get_engine

    engine = get_engine(url)
    ensure_setting(engine, initial_ratio)
    return engine


def engine() -> Engine:
    s = settings()
    return _engine(s.database_url, s.routing.initial_ratio)


@st.cache_resource(show_spinner=False, on_release=lambda c: c.close())
def _client(key: tuple[str, str], secrets: tuple[tuple[str, str], ...]) -> RoutingClient:
    # ``secrets`` is part of the key too: a key added to secrets.toml gets a client that uses it.
    from app.gateway import build_gateway

    return build_gateway(
        settings(), engine=engine(), source="playground", secrets=dict(secrets), rollout_controller=True
    ).client


def client() -> RoutingClient:
    return _client(_config_key(), tuple(sorted(secrets().items())))


def database_label(url: str) -> str:
    """What the sidebar may say about the database: its kind, never a password."""
    if url.startswith("sqlite"):
        return "SQLite " + url.split("///", 1)[-1].rsplit("/", 1)[-1]
    return "PostgreSQL"


# -- cached queries ------------------------------------------------------------------------------


def current_canary():
    """The global canary as stored now, for everything that shows the ratio (the sidebar, the
    Overview, the Canary page). A one-row read, never cached: each live part that shows the ratio
    reads it at its own refresh, so no part keeps showing a ratio another part has moved past (a
    cached read let the sidebar say 25 % for seconds after the page said 0 %)."""
    from db.canary import get_state

    return get_state(engine())


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _overview(key: tuple[str, str], window_s: int):
    from app.monitor.stats import overview_stats

    return overview_stats(engine(), now=time.time(), window_s=window_s)


def overview(window_s: int = 900):
    return _overview(_config_key(), window_s)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _analysis(key: tuple[str, str], route: str | None, minutes: int):
    from app.monitor.canary_analysis import analyse

    now = time.time()
    return analyse(engine(), since=now - minutes * 60, until=now, route=route)


def analysis(route: str | None, minutes: int):
    """The canary (global, or ``route``'s) against its baseline over the last ``minutes``."""
    return _analysis(_config_key(), route, minutes)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _deployments(key: tuple[str, str], window_s: int) -> list[dict]:
    from app.dashboard.deployments import deployment_rows
    from db.breakers import live_cooldowns
    from db.canary import read_route_ratios
    from db.monitor import deployment_sums

    now = time.time()
    s = settings()
    sums = deployment_sums(engine(), providers=list(s.providers), since=now - window_s, until=now)
    return deployment_rows(s, sums, read_route_ratios(engine()), live_cooldowns(engine(), now=now), now)


def deployments(window_s: int) -> list[dict]:
    """The routes' deployments with what they served over the last ``window_s`` seconds."""
    return _deployments(_config_key(), window_s)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _live(key: tuple[str, str], providers: tuple[str, ...], primary: str, window_s: int):
    from app.monitor.figures import live_figures
    from app.monitor.incidents import current_incidents

    now = time.time()
    figures = live_figures(engine(), now=now, window_s=window_s)
    found = current_incidents(
        engine(),
        providers,
        now=now,
        last_minute=figures.providers_last_minute,
        primary=primary,
        last_failure=figures.providers_last_failure,
        quiet_s=settings().dashboard.incident_quiet_s,
    )
    return figures, found, now


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _refusals(key: tuple[str, str], providers: tuple[str, ...], primary: str, window_s: int):
    from app.monitor.incidents import gateway_refusals

    figures, _, read_at = _live(key, providers, primary, window_s)
    return gateway_refusals(engine(), now=read_at, last_minute=figures.providers_last_minute)


def gateway_refusals(window_s: int = 900):
    """The requests the gateway refused before any attempt in the last minute (``None``: none),
    from the same reading as :func:`live`."""
    s = settings()
    return _refusals(_config_key(), tuple(s.providers), s.routing.primary, window_s)


def live(window_s: int = 900):
    """``(figures, incidents, read_at)``: the named figures (last minute and ``window_s``) and
    the providers in an incident now, read together so the banner and the tiles agree."""
    s = settings()
    return _live(_config_key(), tuple(s.providers), s.routing.primary, window_s)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _health(key: tuple[str, str], providers: tuple[str, ...], window_s: int):
    from app.monitor.stats import provider_health

    return provider_health(engine(), providers=list(providers), now=time.time(), window_s=window_s)


def health(window_s: int = 300) -> dict:
    return _health(_config_key(), tuple(settings().providers), window_s)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _has_requests(key: tuple[str, str]) -> bool:
    from db.monitor import has_requests

    return has_requests(engine())


def has_requests() -> bool:
    return _has_requests(_config_key())


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _split(key: tuple[str, str], minutes: int):
    from app.monitor.stats import observed_split

    return observed_split(engine(), now=time.time(), minutes=minutes)


@st.cache_data(ttl=60, show_spinner=False)
def _filter_choices(key: tuple[str, str], window: str, selected):
    from app.monitor.view import filter_choices

    return filter_choices(engine(), window, selected)


def monitor_filter_choices(window: str, selected=None):
    """Filter choices for the monitor's window; they change slowly, so a minute's staleness spares
    a scan of the window on every rerun."""
    return _filter_choices(_config_key(), window, selected)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _overview_figures(key: tuple[str, str]):
    from app.dashboard.overview import overview_figures

    return overview_figures(engine())


def overview_figures():
    return _overview_figures(_config_key())


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _ratio_preview(key: tuple[str, str], ratio: float):
    from app.dashboard.canary_preview import ratio_preview

    return ratio_preview(engine(), settings(), ratio, now=time.time())


def ratio_preview(ratio: float):
    """What canary ``ratio`` would do, from the last hour of traffic (a few seconds' cache)."""
    return _ratio_preview(_config_key(), float(ratio))


def split(minutes: int):
    return _split(_config_key(), minutes)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _split_causes(key: tuple[str, str], minutes: int):
    from app.monitor.stats import split_by_cause

    r = settings().routing
    return split_by_cause(engine(), primary=r.primary, fallback=r.fallback, now=time.time(), minutes=minutes)


def split_causes(minutes: int):
    """The observed split of the last ``minutes`` minutes by cause (ratio, fail-over, model)."""
    return _split_causes(_config_key(), minutes)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _audit(key: tuple[str, str], limit: int, scope: str | None):
    from db.canary import audit_log

    return audit_log(engine(), limit=limit, scope=scope)


def audit(limit: int = 200, scope: str | None = "global"):
    """The canary audit, newest first: the global canary's (what its charts draw), or with
    ``scope=None`` every scope's (the audit trail, routes' changes included)."""
    return _audit(_config_key(), limit, scope)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _rollout_banner(key: tuple[str, str]):
    from app.dashboard.rollout_panel import banner

    return banner(engine())


def rollout_banner() -> tuple[str, str] | None:
    """The Overview's line about a running, paused or recently aborted rollout (None: none)."""
    return _rollout_banner(_config_key())


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _faults(key: tuple[str, str]):
    from db.faults import all_faults

    return all_faults(engine())


def faults() -> dict:
    return _faults(_config_key())


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _breakers(key: tuple[str, str]) -> dict[str, tuple[str, float]]:
    from app.dashboard.providers import live_breaker_states

    return live_breaker_states(engine(), now=time.time())


def breakers() -> dict[str, tuple[str, float]]:
    """Each provider's circuit breaker as the live gateway processes report it (the worst state
    any of them holds, and since when)."""
    return _breakers(_config_key())


def guardrail():
    """Not cached: the canary page edits it and must show what is stored."""
    from app.guardrail import guardrail_defaults
    from db.canary import get_guardrail

    return get_guardrail(engine(), guardrail_defaults(settings()))


def refresh() -> None:
    """Drop cached query results (the Refresh button, and after every write); the playground's
    router re-reads the ratio and faults on its next request."""
    st.cache_data.clear()
    try:
        client().refresh()
    except Exception:  # noqa: BLE001 - a broken configuration is reported by the page itself
        pass


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _gateway_server(url: str):
    from app.server.probe import server_status

    return server_status(url)


def gateway_server():
    """The gateway server's address and whether it answers (probed at most every few seconds)."""
    from app.server.probe import server_url

    return _gateway_server(server_url())


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def _key_rows(key: tuple[str, str]):
    from app.keys import rows

    return rows(engine())


def key_rows():
    return _key_rows(_config_key())


@st.cache_data(ttl=60, show_spinner=False)
def _table_choices(key: tuple[str, str], since_minute: int, selected_classes: tuple[str, ...], selected_keys):
    from app.monitor.table import error_class_choices, key_choices

    return {
        "error_classes": error_class_choices(engine(), since=since_minute, selected=selected_classes),
        "keys": key_choices(engine(), selected_keys),
    }


def monitor_table_choices(since: float, error_classes=(), keys=()) -> dict[str, list[str]]:
    """Error classes seen since ``since`` and the gateway key names, for the request table's
    filters; cached for a minute (``since`` rounded to the minute so reruns share the entry)."""
    return _table_choices(_config_key(), int(since // 60) * 60, tuple(error_classes), tuple(keys))
