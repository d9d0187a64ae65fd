"""Typed session state: one small dataclass per page instead of string keys scattered in scripts."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import streamlit as st

from app.dashboard.identity import Identity
from app.monitor.table import RequestPage, TableCursor

T = TypeVar("T", bound="_PageState")


class _PageState:
    KEY: ClassVar[str]

    @classmethod
    def get(cls: type[T]) -> T:
        obj = st.session_state.get(cls.KEY)
        if not isinstance(obj, cls):
            obj = cls()
            st.session_state[cls.KEY] = obj
        return obj


def new_session_id() -> str:
    return f"pg-{uuid.uuid4().hex[:10]}"


@dataclass
class AuthState(_PageState):
    KEY: ClassVar[str] = "_auth_state"
    identity: Identity | None = None  # set by a successful sign-in (accounts or DASHBOARD_PASSWORD)
    # A local account's (created_at, session_epoch) at sign-in: when the stored account no longer
    # matches (signed out elsewhere, role or password changed, removed and re-added), so does this.
    account_session: tuple[float, int] | None = None
    handoff: str | None = None  # the one-time code the browser collects as the session cookie
    forget_cookie: bool = False  # after sign-out: ask the browser to drop the (revoked) cookie


@dataclass
class PlaygroundState(_PageState):
    KEY: ClassVar[str] = "_playground_state"
    session_id: str = field(default_factory=new_session_id)
    # Each turn: {"role", "content", "meta": ChatResult.to_dict() | None, "error": FailureView | None,
    # "compare": [(label, result dict | None, FailureView | None), ...] | None}
    turns: list[dict[str, Any]] = field(default_factory=list)

    def new_session(self) -> None:
        self.session_id = new_session_id()
        self.turns.clear()

    def history(self) -> list[dict]:
        """Past user/assistant messages that reached the model (compare turns and failures excluded)."""
        return [t for t in self.turns if not (t.get("compare") or t.get("error") or t.get("failed"))]


@dataclass
class OverviewState(_PageState):
    KEY: ClassVar[str] = "_overview_state"
    # The demo-traffic job this session started: only its own session is told it is done (the job
    # is shared by the process, a new visitor should not find an old banner).
    demo_job: Any = None


@dataclass
class CanaryPageState(_PageState):
    KEY: ClassVar[str] = "_canary_state"
    seen_version: int | None = None  # the version this page showed; Apply is locked on it
    flash: tuple[str, str] | None = None  # (kind, message) shown once after a rerun
    pending: str | None = None  # quick action awaiting confirmation: rollback | promote
    # A refused input's message, shown next to that input: field ("ratio", "reason", "threshold",
    # "err_holysheep", ...) -> message. Cleared when the field changes or a write goes through.
    errors: dict[str, str] = field(default_factory=dict)
    notes: dict[str, tuple[str, str]] = field(default_factory=dict)  # area -> (kind, message), shown once
    pending_rollout: tuple[int, str] | None = None  # (rollout id, verb) awaiting confirmation
    ratio_generation: int = 0  # bumped when the page puts a value in the ratio inputs (new widget keys)


@dataclass
class KvPageState(_PageState):
    """The KV calculator's state: the last input values (widget state is dropped while another
    page is shown, so they are restored from here) and the link values that could not be used."""

    KEY: ClassVar[str] = "kv_page_state"
    values: dict = field(default_factory=dict)
    link_errors: dict = field(default_factory=dict)


@dataclass
class MonitorTableState(_PageState):
    """The Monitor's request table: where the operator is (a keyset cursor, held still while they
    page or filter: :mod:`app.monitor.table`) and the page last shown, which the paging buttons'
    callbacks move from."""

    KEY: ClassVar[str] = "_monitor_table_state"
    cursor: TableCursor = field(default_factory=TableCursor)
    page: RequestPage | None = None
    filtered: bool = False

    def settle(self, query: tuple, *, filtered: bool) -> TableCursor:
        self.filtered = filtered
        self.cursor = self.cursor.for_query(query, time.time(), filtered=filtered)
        return self.cursor

    def go_older(self) -> None:
        if self.page is not None:
            self.cursor = self.cursor.older(self.page)

    def go_newer(self) -> None:
        if self.page is not None:
            self.cursor = self.cursor.newer(self.page)

    def go_newest(self) -> None:
        self.cursor = self.cursor.newest(time.time(), filtered=self.filtered)

    def go_refresh(self) -> None:
        self.cursor = self.cursor.refresh(time.time())


@dataclass
class KeysPageState(_PageState):
    KEY: ClassVar[str] = "_keys_state"
    # The key just created (its secret, shown once), on screen until the operator dismisses it:
    # any other rerun (a click elsewhere, another Create) must not wipe it.
    created: Any = None  # app.keys.CreateOutcome
    # Bumped when the shown key is dismissed: the Create form's widgets get new keys, so it is empty.
    form_generation: int = 0
    pending_revoke: str | None = None  # the key whose revocation awaits confirmation
    flash: tuple[bool, str] | None = None  # the outcome of a revoke, shown once after its rerun

    def dismiss_created(self) -> None:
        self.created = None
        self.form_generation += 1
