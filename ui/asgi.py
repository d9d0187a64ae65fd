"""The dashboard's web server: Streamlit's own ASGI app (``st.App``) running ``entry.py`` beside
this file, plus the one route of ours, ``/_gateway/session``, which sets and clears the HttpOnly
session cookie (``ui/session_route.py``; ``ui/session_cookie.py`` says why a route and not a cookie component),
and a middleware that refuses Streamlit's ``/_stcore/metrics``, which answers without sign-in
(``ui/refused_routes.py``).

``python -m app dashboard`` runs ``streamlit run`` on this file; Streamlit finds ``app`` below and
serves it with its own uvicorn runner, so every ``--server.*`` option works as before.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st
from starlette.middleware import Middleware

from ui import refused_routes, session_route

app = st.App(
    Path(__file__).resolve().parent / "entry.py",
    routes=session_route.routes(),
    middleware=[Middleware(refused_routes.RefuseRoutes)],
)
