"""What every page gets around it: page config, the sign-in gate, a configuration check and the
shared sidebar, drawn by the entry (``ui/entry.py``) before ``page.run()``."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from app.config import ConfigError
from app.dashboard.identity import Identity
from app.dashboard.log_health import ratio_freshness
from app.display.fmt import ratio_pct
from app.display.safe_text import inert
from ui import auth, resources


def page_config() -> None:
    st.set_page_config(page_title="LLM gateway", page_icon="🛰️", layout="wide")


EXPOSURE_MINUTES = 15  # the canary's real share, shown next to the ratio


def _sidebar_ratio() -> None:
    canary = resources.current_canary()
    st.metric(
        "Canary ratio",
        ratio_pct(canary.ratio),
        help=f"set by {inert(canary.updated_by)}: {inert(canary.reason, limit=300)}",
    )
    st.caption(inert(resources.split_causes(EXPOSURE_MINUTES).exposure(EXPOSURE_MINUTES)))
    st.caption(f"Database: {inert(resources.database_label(resources.settings().database_url))}")
    freshness = ratio_freshness(resources.client())
    if freshness is not None:
        (st.warning if freshness.stale else st.caption)(freshness.text())


def sidebar() -> None:
    with st.sidebar:
        # The ratio refreshes on its own like the pages' live parts (a guardrail rollback shows
        # within one interval on every page), without rerunning the page around it.
        st.fragment(_sidebar_ratio, run_every=resources.settings().dashboard.refresh_s)()
        auth.who_panel()
        if st.button("Refresh", help="Re-read everything from the database"):
            resources.refresh()
            st.rerun()


@dataclass(frozen=True)
class Gate:
    """What this run may show, decided once before the page router is built: the pages (``who``
    set), the sign-in form, or only a message (a configuration error, or sign-in that cannot be
    verified)."""

    who: Identity | None = None
    config_error: str | None = None
    unavailable: str | None = None

    @property
    def open(self) -> bool:
        return self.who is not None


def gate() -> Gate:
    """Decide :class:`Gate` for this run. Fails closed: only an identity verified now opens it."""
    try:
        resources.settings()
    except ConfigError as exc:
        return Gate(config_error=f"Configuration error: {inert(exc)}")
    try:
        return Gate(who=auth.identity())
    except ConfigError as exc:  # e.g. the database URL is refused when the engine is built
        return Gate(config_error=f"Configuration error: {inert(exc)}")
    except auth.SignInUnavailable as exc:
        return Gate(unavailable=str(exc))


def setup(decided: Gate) -> None:
    """Configuration check, gate and sidebar; stops the run when locked or misconfigured."""
    if decided.config_error is not None:
        st.error(decided.config_error)
        st.stop()
    if decided.unavailable is not None:
        auth.unavailable_page(decided.unavailable)
        st.stop()
    if not decided.open:
        auth.keep_session()  # e.g. drops the cookie right after a sign-out
        auth.sign_in_form()
        st.stop()
    auth.keep_session()
    sidebar()
