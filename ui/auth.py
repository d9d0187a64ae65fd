"""Password gate: when ``DASHBOARD_PASSWORD`` is set (environment or secrets) every page asks for it,
compared in constant time; the operator's name is kept in the session and recorded as the actor of
every write."""

from __future__ import annotations

import hmac
import os

import streamlit as st

from ui.state import AuthState

DEFAULT_ACTOR = "dashboard"


def expected_password() -> str | None:
    value = os.environ.get("DASHBOARD_PASSWORD")
    if not value:
        try:
            value = st.secrets.get("DASHBOARD_PASSWORD")
        except Exception:  # noqa: BLE001 - no secrets file
            value = None
    return value if isinstance(value, str) and value else None


def check_password(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def gate_open() -> bool:
    """True when no password is configured or this session has signed in."""
    return expected_password() is None or AuthState.get().authenticated


def sign_in_form() -> None:
    """The sign-in form shown instead of any page until the password is given."""
    expected = expected_password()
    if expected is None:
        return
    state = AuthState.get()
    st.title("Sign in")
    st.caption("This dashboard is protected by DASHBOARD_PASSWORD.")
    with st.form("sign_in"):
        name = st.text_input("Your name (recorded with every change)", value=state.actor or "", key="sign_in_name")
        password = st.text_input("Password", type="password", key="sign_in_password")
        submitted = st.form_submit_button("Sign in", type="primary", key="sign_in_submit")
    if submitted:
        if check_password(password, expected):
            state.authenticated = True
            state.actor = name.strip() or None
            st.rerun()
        st.error("Wrong password.")


def actor() -> str:
    """Who is making a change: the signed-in name, else ``dashboard``."""
    return AuthState.get().actor or DEFAULT_ACTOR


def actor_input() -> None:
    """Sidebar field to name yourself (recorded as the actor of canary and fault changes)."""
    state = AuthState.get()
    name = st.text_input(
        "Your name",
        value=state.actor or "",
        placeholder=DEFAULT_ACTOR,
        help="Recorded as the actor of every change you make.",
        key="actor_name",
    )
    state.actor = name.strip()[:100] or None
