"""The dashboard's entry script (``python -m app dashboard`` runs it): page config, sign-in, shared
sidebar and the page router. Nothing else.

It lives with the rest of the Streamlit glue in ``ui/``, where no ``pages/`` folder sits beside it:
Streamlit starts in its legacy pages-folder mode whenever one does. Here there is none, so Streamlit is in
``st.navigation`` mode from a fresh server's first request on, and every page, whatever URL it was
asked for by, runs through this script and its password gate. The page scripts stay in the
top-level ``pages/`` and are registered by absolute path.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from ui import chrome

PAGES_DIR = Path(__file__).resolve().parent.parent / "pages"


def pages() -> list[st.Page]:
    """Every page, in sidebar order, with the URL paths the contract names.

    The Overview is served at ``/`` and at ``/overview``. Streamlit serves its default page only at
    the root (a default page's own ``url_path`` answers "Page not found"), so ``/overview`` is a
    second, hidden registration of the same script; the default one's path is never shown."""
    return [
        st.Page(PAGES_DIR / "overview.py", title="Overview", url_path="home", default=True),
        st.Page(PAGES_DIR / "overview.py", title="Overview", url_path="overview", visibility="hidden"),
        st.Page(PAGES_DIR / "playground.py", title="Playground", url_path="playground"),
        st.Page(PAGES_DIR / "canary.py", title="Canary control", url_path="canary"),
        st.Page(PAGES_DIR / "monitor.py", title="Monitor", url_path="monitor"),
        st.Page(PAGES_DIR / "kv_calculator.py", title="KV-cache calculator", url_path="kv-calculator"),
        st.Page(PAGES_DIR / "request.py", title="Request drill-down", url_path="request"),
        st.Page(PAGES_DIR / "keys.py", title="Gateway keys", url_path="keys"),
    ]


def main() -> None:
    chrome.page_config()
    gate = chrome.gate()  # fails closed: no verified identity, no page list
    page = st.navigation(pages(), position="sidebar" if gate.open else "hidden")
    chrome.setup(gate)  # the sign-in gate stops the run here while locked
    page.run()


main()
