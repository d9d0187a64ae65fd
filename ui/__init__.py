"""Streamlit-side glue: cached resources, the password gate, page chrome and typed session state.

The only package besides ``pages/`` and ``streamlit_app.py`` that imports streamlit; the logic it
wires up lives in ``app/`` and ``db/``. Every page script starts with ``ui.chrome.page_setup()``:
Streamlit runs a requested page directly (without the entry and its password gate) while it still
takes the app for a pre-``st.navigation`` app with a ``pages/`` folder, and that call reroutes such a
run through the entry.
"""
