"""The HTTP side of the session cookie (see :mod:`ui.session_cookie` for the whole design): the
route ``/_gateway/session`` that ``ui/asgi.py`` mounts beside Streamlit's own, and the
one-time codes it redeems.

It imports nothing that defines Streamlit caches: the ASGI module loads it before Streamlit's
runtime exists.
"""

from __future__ import annotations

import json

import streamlit as st
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.sessions import Handoffs

COOKIE = "gateway_session"
ROUTE = "/_gateway/session"
MAX_BODY = 1024
# One per process: the script runs (which park tokens) and this route (which collects them) are
# the same process, so they share it.
HANDOFFS: Handoffs[tuple[str, int]] = Handoffs()  # code -> (token, cookie Max-Age in seconds)


def base_path() -> str:
    base = str(st.get_option("server.baseUrlPath") or "").strip("/")
    return f"/{base}" if base else ""


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    host = request.headers.get("host")
    if not origin or not host:
        return False
    if request.headers.get("sec-fetch-site", "same-origin") != "same-origin":
        return False
    return origin.split("://", 1)[-1].rstrip("/") == host


def _cookie_response(request: Request, value: str, max_age: int) -> Response:
    response = Response(status_code=204, headers={"Cache-Control": "no-store"})
    response.set_cookie(
        COOKIE,
        value,
        max_age=max_age,
        path=base_path() or "/",
        secure=request.url.scheme == "https" or bool(st.get_option("server.sslCertFile")),
        httponly=True,
        samesite="strict",
    )
    return response


async def session_route(request: Request) -> Response:
    """POST {"code": ...}: set the cookie for a fresh sign-in. DELETE: expire the cookie."""
    if not _same_origin(request):
        return Response(status_code=403)
    if request.method == "DELETE":
        return _cookie_response(request, "", 0)
    body_bytes = b""
    async for chunk in request.stream():  # read at most MAX_BODY bytes: a code is 43 characters
        body_bytes += chunk
        if len(body_bytes) > MAX_BODY:
            return Response(status_code=413)
    try:
        body = json.loads(body_bytes)
    except ValueError:
        return Response(status_code=400)
    parked = HANDOFFS.redeem(body.get("code") if isinstance(body, dict) else None)
    if parked is None:
        return Response(status_code=400)
    token, max_age = parked
    return _cookie_response(request, token, max_age)


def routes() -> list[Route]:
    return [Route(base_path() + ROUTE, session_route, methods=["POST", "DELETE"])]
