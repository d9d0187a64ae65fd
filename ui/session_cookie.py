"""The local-account session cookie: an HttpOnly, SameSite=Strict cookie holding a signed session
token (:mod:`app.sessions`), so a reload or a link opened in a new tab stays signed in.

Why this way. Streamlit can read cookies (``st.context.cookies``, taken from the websocket's
handshake, HttpOnly ones included) but a script run cannot write one: the script talks to the
browser over the websocket, and only an HTTP response can set an HttpOnly cookie. Cookie
components (``extra-streamlit-components``, ``streamlit-cookies-controller`` and similar, the usual
answer in public code) write ``document.cookie`` from JavaScript, so the session token would be
readable by any script on the page. Streamlit 1.67 runs on Starlette and lets an ``st.App`` add
routes of its own (``dashboard/asgi.py``), so the cookie is set by a real HTTP response:

1. the sign-in form (a normal Streamlit form) verifies the password and issues a token;
2. the token is parked under a random one-time code (:class:`app.sessions.Handoffs`, this process's
   memory, 60 s) and a tiny component POSTs that code, in the body, to ``/_gateway/session``;
3. that route swaps the code for the token and answers with ``Set-Cookie`` (HttpOnly, SameSite=
   Strict, Path = the app's base path, Secure over HTTPS, Max-Age = ``[dashboard] session_ttl_s``).

The token never appears in a URL, in page JavaScript or in a log line. Sign-out revokes the token in
the database (the account's session epoch) and asks the same route to expire the cookie; a cookie
that is tampered with, expired or revoked is ignored and the sign-in form is shown.

The routes refuse cross-origin requests (the ``Origin`` must be this server), so another site can
neither plant a session nor clear one.
"""

from __future__ import annotations

import functools
import json

import streamlit as st
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.accounts import User
from app.config import lookup
from app.sessions import SECRET_ENV, Handoffs, SessionTokens, session_secret
from ui import resources

COOKIE = "gateway_session"
ROUTE = "/_gateway/session"
# One per process: the script runs and the route share it (they are the same process).
HANDOFFS: Handoffs[tuple[str, int]] = Handoffs()  # code -> (token, cookie Max-Age in seconds)

_JS = """
export default function (component) {
  const data = component.data;
  if (!data || !data.url) return;
  fetch(data.url, {
    method: data.method,
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ code: data.code || null }),
  }).catch(() => {});
}
"""


@functools.cache
def _cookie_component():
    # Registered on first use, inside a script run (the ASGI module imports this file before
    # Streamlit's runtime exists).
    return st.components.v2.component("gateway_session_cookie", js=_JS)


def _base_path() -> str:
    base = str(st.get_option("server.baseUrlPath") or "").strip("/")
    return f"/{base}" if base else ""


@st.cache_resource(show_spinner=False)
def _tokens(key: tuple[str, str], ttl_s: float, configured_secret: str | None) -> SessionTokens:
    return SessionTokens(session_secret(resources.engine(), configured_secret), ttl_s)


def tokens() -> SessionTokens:
    """This process's token issuer/verifier (the secret is read from the database once)."""
    configured = lookup(SECRET_ENV, secrets=resources.secrets())
    return _tokens(resources._config_key(), resources.settings().dashboard.session_ttl_s, configured)


def cookie_token() -> str | None:
    """The session cookie this browser sent with its websocket handshake, if any."""
    try:
        value = st.context.cookies.get(COOKIE)
    except Exception:  # noqa: BLE001 - no browser context (a bare script run)
        return None
    return value if isinstance(value, str) else None


def start(user: User) -> str:
    """Issue a token for ``user`` and park it for the browser to collect; returns the one-time code
    the page hands to :func:`deliver`."""
    issuer = tokens()
    return HANDOFFS.offer((issuer.issue(user), int(issuer.ttl_s)))


def deliver(code: str | None) -> bool:
    """While ``code`` waits to be collected, mount the component that makes the browser collect it
    as the cookie. Returns whether it is still waiting."""
    if code is None or not HANDOFFS.pending(code):
        return False
    _cookie_component()(key="session_cookie_set", data={"url": _base_path() + ROUTE, "method": "POST", "code": code})
    return True


def forget() -> None:
    """Ask the browser to drop the cookie (the token is already revoked in the database)."""
    _cookie_component()(key="session_cookie_clear", data={"url": _base_path() + ROUTE, "method": "DELETE"})


# -- the HTTP side (mounted by dashboard/asgi.py) --------------------------------------------------


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
        path=_base_path() or "/",
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
    try:
        body = json.loads(await request.body())
    except ValueError:
        return Response(status_code=400)
    parked = HANDOFFS.redeem(body.get("code") if isinstance(body, dict) else None)
    if parked is None:
        return Response(status_code=400)
    token, max_age = parked
    return _cookie_response(request, token, max_age)


def routes() -> list[Route]:
    return [Route(_base_path() + ROUTE, session_route, methods=["POST", "DELETE"])]
