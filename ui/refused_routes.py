"""Streamlit routes the dashboard refuses: ``/_stcore/metrics``. Streamlit serves it to anyone,
signed in or not, and it tells the number of sessions and what the caches hold, while every page
of the dashboard waits for sign-in. The dashboard has no use for it (the gateway's own metrics are
``python -m app serve``'s ``/metrics``), so an ASGI middleware in front of Streamlit's routes answers
403 for it, whatever the method, before Streamlit sees the request.

Like :mod:`ui.session_route`, it imports nothing that defines Streamlit caches.
"""

from __future__ import annotations

import re

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ui.session_route import base_path

REFUSED = ("/_stcore/metrics",)
MESSAGE = (
    "Refused: the dashboard does not serve Streamlit's metrics (they answer without sign-in). "
    "The gateway's metrics are at `python -m app serve`'s /metrics.\n"
)


def refused_paths() -> frozenset[str]:
    return frozenset((base_path() + p).lower() for p in REFUSED)


def normalized(path: str) -> str:
    # "//_stcore//metrics/" reaches the same route in some routers: compare the collapsed form.
    return re.sub(r"/{2,}", "/", path).rstrip("/") or "/"


class RefuseRoutes:
    """ASGI middleware: 403 for :data:`REFUSED` under the app's base path, everything else passes."""

    def __init__(self, app: ASGIApp, paths: frozenset[str] | None = None):
        self.app = app
        self.paths = refused_paths() if paths is None else paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and normalized(scope.get("path", "")).lower() in self.paths:
            await PlainTextResponse(MESSAGE, status_code=403, headers={"Cache-Control": "no-store"})(
                scope, receive, send
            )
            return
        await self.app(scope, receive, send)
