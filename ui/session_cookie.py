"""The local-account session cookie: an HttpOnly, SameSite=Strict cookie holding a signed session
token (:mod:`app.sessions`), so a reload or a link opened in a new tab stays signed in.

Why this way. Streamlit can read cookies (``st.context.cookies``, taken from the websocket's
handshake, HttpOnly ones included) but a script run cannot write one: the script talks to the
browser over the websocket, and only an HTTP response can set an HttpOnly cookie. Cookie
components (``extra-streamlit-components``, ``streamlit-cookies-controller`` and similar, the usual
answer in public code) write ``document.cookie`` from JavaScript, so the session token would be
readable by any script on the page. Streamlit 1.67 runs on Starlette and lets an ``st.App`` add
routes of its own (``ui/asgi.py`` mounts :mod:`ui.session_route`), so the cookie is set by a
real HTTP response:

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

import streamlit as st

from app.accounts import User
from app.config import lookup
from app.sessions import SECRET_ENV, SessionTokens, session_secret
from ui import resources
from ui.session_route import COOKIE, HANDOFFS, ROUTE, base_path

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
    # Registered on first use, inside a script run, where Streamlit's runtime exists.
    return st.components.v2.component("gateway_session_cookie", js=_JS)


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
    _cookie_component()(key="session_cookie_set", data={"url": base_path() + ROUTE, "method": "POST", "code": code})
    return True


def forget() -> None:
    """Ask the browser to drop the cookie (the token is already revoked in the database)."""
    _cookie_component()(key="session_cookie_clear", data={"url": base_path() + ROUTE, "method": "DELETE"})
