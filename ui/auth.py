"""Sign-in and the signed-in identity (see :mod:`app.dashboard.identity` for the four modes).

Which mode applies, first match wins:

1. an OpenID Connect provider is configured (an ``[auth]`` table in ``.streamlit/secrets.toml``):
   Streamlit's own ``st.login`` / ``st.user``; roles from ``[dashboard.roles]`` in the config;
2. local accounts exist (``python -m app users add``): a name + password form, and a signed,
   expiring HttpOnly session cookie so a reload or a new tab stays signed in
   (:mod:`ui.session_cookie`, :mod:`app.sessions`);
3. ``DASHBOARD_PASSWORD`` is set (environment or secrets): a password form, actor ``dashboard``;
4. otherwise the dashboard is open for one-person local use, actor ``local``.

Failed sign-ins in modes 2 and 3 are throttled in the database (:class:`app.accounts.Accounts`),
so the wait holds across sessions and dashboard processes.

The gate fails closed. Which mode applies is only known once the account store has answered (an
unread store may hold accounts), and a signed-in account is re-read on every run; when either
cannot be read, :class:`SignInUnavailable` is raised and the entry shows :func:`unavailable_page`
and nothing else, which looks again every few seconds and lets the visitor in (or asks for the
password) as soon as the database answers. A ``.streamlit/secrets.toml`` that exists but cannot be
parsed is treated the same way: it may hold ``[auth]`` or ``DASHBOARD_PASSWORD``.
"""

from __future__ import annotations

import hmac
import logging

import streamlit as st

from app.accounts import Accounts, User, store_problem
from app.config import ConfigError, lookup
from app.dashboard.identity import LOCAL, SHARED_PASSWORD, Identity, oidc_name, oidc_role
from app.display.safe_text import inert
from app.sessions import SessionSecretError, resume
from ui import resources, session_cookie
from ui.state import AuthState

log = logging.getLogger(__name__)

DEFAULT_ACTOR = SHARED_PASSWORD.name
RETRY_EVERY_S = 3  # how often the "cannot verify sign-in" page looks at the database again
NOBODY = Identity("anonymous", "viewer", "none")  # the actor when no one could be verified: writes nothing


class SignInUnavailable(Exception):
    """Who may enter cannot be decided (the account store or the secrets file cannot be read): the
    dashboard shows :func:`unavailable_page` and nothing else. The message is for the visitor."""


def expected_password() -> str | None:
    # The one precedence rule (environment, then Streamlit secrets): app.config.lookup.
    return lookup("DASHBOARD_PASSWORD", secrets=resources.secrets())


def check_password(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def oidc_configured() -> bool:
    """True when ``.streamlit/secrets.toml`` has an ``[auth]`` table for ``st.login``. No secrets
    file is the normal case (False); one that cannot be parsed raises :class:`SignInUnavailable`,
    since it may hold ``[auth]`` or ``DASHBOARD_PASSWORD`` and guessing "none" would open the gate."""
    try:
        return "auth" in st.secrets
    except FileNotFoundError as exc:  # StreamlitSecretNotFoundError: missing, or unparseable
        if getattr(exc, "error_id", None) in (None, "no-secrets-found"):
            return False
        raise SignInUnavailable(
            "Cannot verify sign-in: .streamlit/secrets.toml cannot be read. "
            "Fix the file (the dashboard's log names the error) and reload."
        ) from exc


def accounts() -> Accounts:
    return Accounts(resources.engine())


def _store_unavailable(exc: BaseException) -> SignInUnavailable:
    log.warning("cannot verify sign-in: %s", store_problem(exc))
    return SignInUnavailable(f"Cannot verify sign-in: {store_problem(exc)}.")


def mode() -> str:
    """oidc | accounts | password | open. Raises :class:`SignInUnavailable` when the account store
    cannot be read: it may hold accounts, so neither "password" nor "open" can be assumed."""
    if oidc_configured():
        return "oidc"
    try:
        if accounts().has_accounts():
            return "accounts"
    except ConfigError:
        raise  # shown by the page chrome as a configuration error
    except Exception as exc:
        raise _store_unavailable(exc) from exc
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
    if m == "accounts":
        return _account_identity(state)
    who = state.identity
    if who is None or who.source != "password":
        return None
    return who


def _account_identity(state: AuthState) -> Identity | None:
    """The signed-in account: this session's own sign-in, else the session cookie's (a reload or a
    new tab). Either way the account is re-read: removed, signed out elsewhere, or a changed role
    or password ends the session (see :mod:`app.sessions`)."""
    who = state.identity
    if who is None or who.source != "account":
        user = _resume_from_cookie()
        if user is None:
            return None
        _signed_in(state, user)
        return state.identity
    try:
        user = accounts().get(who.name)
    except Exception as exc:
        raise _store_unavailable(exc) from exc
    if user is None or state.account_session not in (None, (user.created_at, user.session_epoch)):
        state.identity, state.account_session, state.handoff = None, None, None
        return None
    return Identity(user.name, user.role, "account")


def _resume_from_cookie() -> User | None:
    token = session_cookie.cookie_token()
    if token is None:
        return None
    try:
        return resume(session_cookie.tokens(), accounts(), token)
    except SessionSecretError:  # a configured secret that is refused: ask for the password instead
        log.warning("the session cookie could not be checked; showing the sign-in form", exc_info=False)
        return None
    except Exception as exc:
        raise _store_unavailable(exc) from exc


def _signed_in(state: AuthState, user: User) -> None:
    state.identity = Identity(user.name, user.role, "account")
    state.account_session = (user.created_at, user.session_epoch)


def keep_session() -> None:
    """Keep the browser's session cookie in step with this session: collect a fresh sign-in's
    cookie, or drop a signed-out one. Drawn on every run; shows nothing."""
    state = AuthState.get()
    if state.forget_cookie:
        state.forget_cookie = False
        session_cookie.forget()
    if state.handoff is not None and not session_cookie.deliver(state.handoff):
        state.handoff = None  # collected (or expired): nothing more to do


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
        try:
            if m == "accounts":
                result = accounts().sign_in(name, password)
            elif expected is not None:
                result = accounts().check_shared_password(password, expected)
            else:  # the password was removed meanwhile: the gate is open now
                st.rerun()
        except Exception as exc:  # noqa: BLE001 - the store stopped answering after the gate read it
            st.error(str(_store_unavailable(exc)) + " Nobody was signed in; try again in a moment.")
            return
        if result.ok and result.user is not None:
            if m == "accounts":
                _signed_in(state, result.user)
                try:
                    state.handoff = session_cookie.start(result.user)
                except Exception:  # noqa: BLE001 - no cookie: signed in for this tab only
                    log.warning("no session cookie could be issued; the sign-in lasts for this tab only")
            else:
                state.identity = Identity(result.user.name, result.user.role, "password")
            st.rerun()
        st.error(result.message[:1].upper() + result.message[1:] + ".")


def actor() -> Identity:
    """Who is making a change: the signed-in identity (the gate guarantees there is one). When it
    cannot be verified any more (the database stopped answering during the run), a viewer that
    nothing lets write: the write functions refuse it themselves."""
    try:
        return identity() or NOBODY
    except SignInUnavailable:
        return NOBODY


def unavailable_page(message: str) -> None:
    """The page shown instead of everything else while sign-in cannot be verified: no sidebar, no
    page list, no data. It looks at the account store again every :data:`RETRY_EVERY_S` seconds
    and reruns the whole app once it answers (then the sign-in form, or the pages, are back)."""
    st.title("Sign-in unavailable")
    st.error(message, icon="🔒")
    st.caption(
        "Nothing is shown until sign-in can be verified. This page checks again every few seconds "
        "and continues by itself once the database answers."
    )
    st.button("Try again", key="sign_in_retry")  # a click is a rerun, and the rerun checks again
    _wait_for_store()


@st.fragment(run_every=RETRY_EVERY_S)
def _wait_for_store() -> None:
    try:
        mode()
    except SignInUnavailable:
        return  # still not answering: look again at the next tick
    st.rerun(scope="app")


def sign_out() -> None:
    if oidc_configured():
        st.logout()
        return
    state = AuthState.get()
    if state.identity is not None and state.identity.source == "account":
        # Revokes every token of the account (this browser's cookie, other tabs and browsers), then
        # asks this browser to drop its cookie; the revocation holds even if that never arrives.
        try:
            accounts().end_sessions(state.identity.name)
        except Exception as exc:  # noqa: BLE001 - this session still signs out; the cookie is dropped
            log.warning("sign-out could not revoke the account's other sessions: %s", store_problem(exc))
        state.forget_cookie = True
    state.identity, state.account_session, state.handoff = None, None, None


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
