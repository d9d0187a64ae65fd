"""What every page gets around it: page config, the password gate, a configuration check and the
shared sidebar, drawn by the entry (``streamlit_app.py``) before ``page.run()``.

Streamlit runs a page script *directly*, without the entry, while it still takes the app for a
pre-``st.navigation`` app with a ``pages/`` folder: on the first run of a server process when the
browser asks for a page URL, and in AppTest on every run after the first. So every page script calls
:func:`page_setup` first: under the entry it does nothing; run directly, it switches Streamlit to
``st.navigation`` mode and reruns, so the entry (and its password gate) draws the page.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st
from streamlit.runtime.pages_manager import PagesManager

from app.config import ConfigError
from app.dashboard.fmt import ratio_pct
from ui import auth, resources

_run = threading.local()  # the script thread's "entry already set this run up" flag


def page_config() -> None:
    st.set_page_config(page_title="LLM gateway", page_icon="🛰️", layout="wide")


@contextmanager
def entry_run() -> Iterator[None]:
    """Mark the current script run as set up by the entry (reset when the run ends)."""
    _run.active = True
    try:
        yield
    finally:
        _run.active = False


def sidebar() -> None:
    with st.sidebar:
        canary = resources.current_canary()
        st.metric("Canary ratio", ratio_pct(canary.ratio), help=f"set by {canary.updated_by}: {canary.reason}")
        st.caption(f"Database: {resources.database_label(resources.settings().database_url)}")
        auth.actor_input()
        if st.button("Refresh", help="Re-read everything from the database"):
            resources.refresh()
            st.rerun()


def setup() -> None:
    """Gate, configuration check and sidebar; stops the run when locked or misconfigured."""
    if not auth.gate_open():
        auth.sign_in_form()
        st.stop()
    try:
        resources.settings()
    except ConfigError as exc:
        st.error(f"Configuration error: {exc}")
        st.stop()
    sidebar()


def page_setup() -> None:
    """First call of every page script: a no-op under the entry; run directly by Streamlit's
    ``pages/`` folder mode, rerun through the entry (so the password gate always applies)."""
    if getattr(_run, "active", False):
        return
    if PagesManager.uses_pages_directory:
        # Run the entry inside this same script run (not st.rerun(), which would drop the click or
        # form submission that caused this run), then stop so the page is not drawn twice.
        PagesManager.uses_pages_directory = False  # what the entry's st.navigation call would have set
        import streamlit_app

        streamlit_app.main()
        st.stop()
    # Otherwise this script is the app's main script (AppTest.from_file of one page): draw it.
