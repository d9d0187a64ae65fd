"""Entry point: page config, password gate, shared sidebar and the page router. Nothing else."""

from __future__ import annotations

import streamlit as st

from app.config import ConfigError
from app.dashboard.fmt import ratio_pct
from ui import auth, resources

PAGES = [
    st.Page("pages/overview.py", title="Overview", icon="🏠", url_path="overview", default=True),
    st.Page("pages/playground.py", title="Playground", icon="💬", url_path="playground"),
    st.Page("pages/canary.py", title="Canary control", icon="🐤", url_path="canary"),
    st.Page("pages/monitor.py", title="Monitor", icon="📈", url_path="monitor"),
    st.Page("pages/kv_calculator.py", title="KV-cache calculator", icon="🧮", url_path="kv-calculator"),
]


def sidebar() -> None:
    with st.sidebar:
        canary = resources.current_canary()
        st.metric("Canary ratio", ratio_pct(canary.ratio), help=f"set by {canary.updated_by}: {canary.reason}")
        st.caption(f"Database: {resources.database_label(resources.settings().database_url)}")
        auth.actor_input()
        if st.button("Refresh", icon="🔄", help="Re-read everything from the database"):
            resources.refresh()
            st.rerun()


def main() -> None:
    st.set_page_config(page_title="LLM gateway", page_icon="🛰️", layout="wide")
    unlocked = auth.gate_open()
    page = st.navigation(PAGES, position="sidebar" if unlocked else "hidden")
    if not unlocked:
        auth.sign_in_form()
        st.stop()
    try:
        resources.settings()
    except ConfigError as exc:
        st.error(f"Configuration error: {exc}")
        st.stop()
    sidebar()
    page.run()


main()
