"""What every page gets around it: page config, the sign-in gate, a configuration check and the
shared sidebar, drawn by the entry (``ui/entry.py``) before ``page.run()``."""

from __future__ import annotations

import streamlit as st

from app.config import ConfigError
from app.dashboard.fmt import ratio_pct
from app.dashboard.log_health import ratio_freshness
from app.dashboard.safe_text import inert
from ui import auth, resources


def page_config() -> None:
    st.set_page_config(page_title="LLM gateway", page_icon="🛰️", layout="wide")


def sidebar() -> None:
    with st.sidebar:
        canary = resources.current_canary()
        st.metric(
            "Canary ratio",
            ratio_pct(canary.ratio),
            help=f"set by {inert(canary.updated_by)}: {inert(canary.reason, limit=300)}",
        )
        st.caption(f"Database: {inert(resources.database_label(resources.settings().database_url))}")
        freshness = ratio_freshness(resources.client())
        if freshness is not None:
            (st.warning if freshness.stale else st.caption)(freshness.text())
        auth.who_panel()
        if st.button("Refresh", help="Re-read everything from the database"):
            resources.refresh()
            st.rerun()


def setup() -> None:
    """Configuration check, gate and sidebar; stops the run when locked or misconfigured."""
    try:
        resources.settings()
    except ConfigError as exc:
        st.error(f"Configuration error: {inert(exc)}")
        st.stop()
    if not auth.gate_open():
        auth.keep_session()  # e.g. drops the cookie right after a sign-out
        auth.sign_in_form()
        st.stop()
    auth.keep_session()
    sidebar()
