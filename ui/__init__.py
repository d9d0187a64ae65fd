"""Streamlit-side glue: cached resources, the password gate and typed session state.

The only package besides ``pages/`` and ``streamlit_app.py`` that imports streamlit; the logic it
wires up lives in ``app/`` and ``db/``.
"""
