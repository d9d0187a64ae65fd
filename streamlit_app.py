"""Entry point: page config, password gate, shared sidebar and the page router. Nothing else."""

from __future__ import annotations

import streamlit as st

from ui import auth, chrome

PAGES = [
    st.Page("pages/overview.py", title="Overview", url_path="overview", default=True),
    st.Page("pages/playground.py", title="Playground", url_path="playground"),
    st.Page("pages/canary.py", title="Canary control", url_path="canary"),
    st.Page("pages/monitor.py", title="Monitor", url_path="monitor"),
    st.Page("pages/kv_calculator.py", title="KV-cache calculator", url_path="kv-calculator"),
]


def main() -> None:
    chrome.page_config()
    page = st.navigation(PAGES, position="sidebar" if auth.gate_open() else "hidden")
    with chrome.entry_run():
        chrome.setup()  # the password gate stops here when locked
        page.run()


if __name__ == "__main__":  # Streamlit runs the entry as __main__; ui.chrome.page_setup imports it
    main()
