"""What every page gets around it: page config, the sign-in gate, a configuration check and the
shared sidebar, drawn by the entry (``ui/entry.py``) before ``page.run()``."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from app.config import ConfigError
from app.dashboard.identity import Identity
from app.dashboard.log_health import ratio_freshness
from app.display.fmt import ratio_pct
from app.display.safe_text import inert
from ui import auth, resources


def page_config() -> None:
    st.set_page_config(page_title="LLM gateway", page_icon="🛰️", layout="wide")


EXPOSURE_MINUTES = 15  # the canary's real share, shown next to the ratio
SLOT_KEY = "_sidebar_ratio_slot"  # the sidebar's ratio, when the page draws it (see sidebar_ratio)


def _sidebar_ratio() -> None:
    _draw_ratio(resources.current_canary())


def _draw_ratio(canary) -> None:
    st.metric(
        "Canary ratio",
        ratio_pct(canary.ratio),
        help=f"set by {inert(canary.updated_by)}: {inert(canary.reason, limit=300)}",
    )
    st.caption(inert(resources.split_causes(EXPOSURE_MINUTES).exposure(EXPOSURE_MINUTES)))
    st.caption(f"Database: {inert(resources.database_label(resources.settings().database_url))}")
    freshness = ratio_freshness(resources.client())
    if freshness is not None:
        (st.warning if freshness.stale else st.caption)(freshness.text())


def sidebar(*, ratio_on_page: bool = False) -> None:
    """The shared sidebar. ``ratio_on_page``: the page shows the ratio in a live part of its own,
    which draws the sidebar's ratio in the same run (:func:`sidebar_ratio`); else the sidebar's
    ratio refreshes on its own like the pages' live parts (a guardrail rollback shows within one
    interval on every page), without rerunning the page around it."""
    with st.sidebar:
        if ratio_on_page:
            # Two live parts on two clocks disagreed for a refresh (the sidebar said 25 % while the
            # page said 0 %): on a page that shows the ratio, one read draws both. Only the page's
            # live part writes here (a fragment's writes to a container outside it replace its own
            # previous ones at each refresh; anything else drawn here would stay beside them).
            st.session_state[SLOT_KEY] = st.container()
        else:
            st.session_state.pop(SLOT_KEY, None)
            st.fragment(_sidebar_ratio, run_every=resources.settings().dashboard.refresh_s)()
        auth.who_panel()
        if st.button("Refresh", help="Re-read everything from the database"):
            resources.refresh()
            st.rerun()


def sidebar_ratio(canary) -> None:
    """Draw the sidebar's ratio from ``canary``, the state the calling live part of the page has
    just read and shown: the page and its sidebar change in the same run, never one refresh apart."""
    slot = st.session_state.get(SLOT_KEY)
    if slot is not None:
        with slot:
            _draw_ratio(canary)


@dataclass(frozen=True)
class Gate:
    """What this run may show, decided once before the page router is built: the pages (``who``
    set), the sign-in form, or only a message (a configuration error, or sign-in that cannot be
    verified)."""

    who: Identity | None = None
    config_error: str | None = None
    unavailable: str | None = None

    @property
    def open(self) -> bool:
        return self.who is not None


def gate() -> Gate:
    """Decide :class:`Gate` for this run. Fails closed: only an identity verified now opens it."""
    try:
        resources.settings()
    except ConfigError as exc:
        return Gate(config_error=f"Configuration error: {inert(exc)}")
    try:
        return Gate(who=auth.identity())
    except ConfigError as exc:  # e.g. the database URL is refused when the engine is built
        return Gate(config_error=f"Configuration error: {inert(exc)}")
    except auth.SignInUnavailable as exc:
        return Gate(unavailable=str(exc))


def setup(decided: Gate, *, ratio_on_page: bool = False) -> None:
    """Configuration check, gate and sidebar; stops the run when locked or misconfigured."""
    if decided.config_error is not None:
        st.error(decided.config_error)
        st.stop()
    if decided.unavailable is not None:
        auth.unavailable_page(decided.unavailable)
        st.stop()
    if not decided.open:
        auth.keep_session()  # e.g. drops the cookie right after a sign-out
        auth.sign_in_form()
        st.stop()
    auth.keep_session()
    sidebar(ratio_on_page=ratio_on_page)
