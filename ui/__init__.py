"""Streamlit-side glue: the entry script (``entry.py``), its ASGI app and launcher (``asgi.py``,
``run.py``), cached resources, the password gate, page chrome and typed session state.

The only package besides ``pages/`` that imports streamlit; the logic it wires up lives in ``app/``
and ``db/``. Page scripts need no set-up call of their own: Streamlit runs each of them from the
entry, after its password gate.
"""
