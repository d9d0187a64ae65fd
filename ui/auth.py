"""Sign-in and the signed-in identity (see :mod:`app.dashboard.identity` for the four modes).

Which mode applies, first match wins:

1. an OpenID Connect provider is configured (an ``[auth]`` table in ``.streamlit/secrets.toml``):
   Streamlit's own ``st.login`` / ``st.user``; roles from ``[dashboard.roles]`` in the config;
2. local accounts exist (``python -m app users add``): a name + password form;
3. ``DASHBOARD_PASSWORD`` is set (environment or secrets): a password form, actor ``dashboard``;
4. otherwise the dashboard is open for one-person local use, actor ``local``.

Failed sign-ins in modes 2 and 3 are throttled in the database (:class:`app.accounts.Accounts`),
so the wait holds across sessions and dashboard processes.
"""

from __future__ import annotations

import hmac

import streamlit as st

from app.accounts import Accounts
from app.config import lookup
from app.dashboard.identity import LOCAL, SHARED_PASSWORD, Identity, oidc_name, oidc_role
from app.dashboard.safe_text import inert
from ui import resources
from ui.state import AuthState

DEFAULT_ACTOR = SHARED_PASSWORD.name


def expected_password() -> str | None:
    # The one precedence rule (environment, then Streamlit secrets): app.config.lookup.
    return lookup("DASHBOARD_PASSWORD", secrets=resources.secrets())


def check_password(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def oidc_configured() -> bool:
    """True when ``.streamlit/secrets.toml`` has an ``[auth]`` table for ``st.login``."""
    try:
        return "auth" in st.secrets
    except Exception:  # noqa: BLE001 - no secrets file
        return False


def accounts() -> Accounts:
    return Accounts(resources.engine())


def mode() -> str:
    """oidc | accounts | password | open."""
    if oidc_configured():
        return "oidc"
    try:
        if accounts().has_accounts():
            return "accounts"
    except Exception:  # noqa: BLE001 - a database problem is reported by the page, not by the gate
        pass
    if expected_password() is not None:
        return "password"
    return "open"


def identity() -> Identity | None:
    """Who this session is, or ``None`` while it has not signed in. An account's role is re-read on
    every run, so ``users set-role`` and ``users remove`` apply at once."""
    m = mode()
    if m == "open":
        return LOCAL
    if m == "oidc":
        if not st.user.is_logged_in:
            return None
        claims = st.user.to_dict()
        return Identity(oidc_name(claims), oidc_role(claims, resources.settings().dashboard.roles), "oidc")
    state = AuthState.get()
    who = state.identity
    if who is None or who.source != ("account" if m == "accounts" else "password"):
        return None
    if m == "accounts":
        user = accounts().get(who.name)
        if user is None:
            state.identity = None
            return None
        return Identity(user.name, user.role, "account")
    return who


def gate_open() -> bool:
    """True when this session may see the pages."""
    return identity() is not None


def sign_in_form() -> None:
    """The sign-in shown instead of any page until this session has signed in."""
    m = mode()
    st.title("Sign in")
    if m == "oidc":
        st.caption("This dashboard signs you in through your organisation's identity provider.")
        if st.button("Sign in with your identity provider", type="primary", key="oidc_sign_in"):
            st.login()
        return
    state = AuthState.get()
    if m == "accounts":
        st.caption("Sign in with your dashboard account (an admin creates it with `python -m app users add`).")
    else:
        st.caption("This dashboard is protected by DASHBOARD_PASSWORD.")
    with st.form("sign_in"):
        name = st.text_input("Account name", key="sign_in_name") if m == "accounts" else ""
        password = st.text_input("Password", type="password", key="sign_in_password")
        submitted = st.form_submit_button("Sign in", type="primary", key="sign_in_submit")
    if submitted:
        expected = expected_password()
        if m == "accounts":
            result = accounts().sign_in(name, password)
        elif expected is not None:
            result = accounts().check_shared_password(password, expected)
        else:  # the password was removed meanwhile: the gate is open now
            st.rerun()
        if result.ok and result.user is not None:
            source = "account" if m == "accounts" else "password"
            state.identity = Identity(result.user.name, result.user.role, source)
            st.rerun()
        st.error(result.message[:1].upper() + result.message[1:] + ".")


def actor() -> Identity:
    """Who is making a change: the signed-in identity (the gate guarantees there is one)."""
    return identity() or Identity("anonymous", "viewer", "none")


def sign_out() -> None:
    if mode() == "oidc":
        st.logout()
        return
    AuthState.get().identity = None


def who_panel() -> None:
    """Sidebar: who is signed in, with which role, and a sign-out button when there is one."""
    who = actor()
    if who.source == "local":
        st.caption("Open for local use: changes are recorded as `local`.")
        return
    st.caption(f"Signed in as **{inert(who.name)}** ({who.role})")
    st.button("Sign out", on_click=sign_out, key="sign_out")


def viewer_note() -> bool:
    """Shows why the controls are disabled for a viewer; returns True when they are."""
    who = actor()
    if who.can_write:
        return False
    st.info(f"You are signed in as {inert(who.name)} with the viewer role: you can look, not change anything.")
    return True
