"""Who may act on the dashboard: local accounts, roles and the sign-in throttle.

Roles, lowest first: ``viewer`` (reads everything, changes nothing), ``operator`` (moves the canary,
injects faults, edits the guardrail, uses the playground), ``admin`` (also manages accounts and
gateway keys). The actor recorded on every write is the signed-in identity, never typed text; the
system actors (``guardrail``, ``config``, ...) are reserved and cannot be account names.

Passwords are stored only as Argon2id hashes (argon2-cffi, RFC 9106 defaults). Failed sign-ins
are counted per account name in the database and, after ``FREE_TRIES``, each further try must wait
twice as long as the last (1 s, 2 s, 4 s ... capped at ``MAX_DELAY_S``); a sign-in is refused
without looking at the password while the wait is on. An unknown name costs the same hash
verification as a known one, so timing does not tell which names exist.
"""

from __future__ import annotations

import hmac
import re
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import Engine

from db import users as db

ROLES: tuple[str, ...] = ("viewer", "operator", "admin")
RANK = {role: i for i, role in enumerate(ROLES)}
RESERVED_ACTORS = frozenset(
    {"guardrail", "rollout", "config", "system", "cli", "api", "loadgen", "playground", "anonymous"}
)
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._@-]{0,63}")
MIN_PASSWORD = 8
MAX_PASSWORD = 1024
FREE_TRIES = 3
MAX_DELAY_S = 900.0
FORGET_AFTER_S = 3600.0

SHARED_PASSWORD_KEY = "password"  # the throttle key of the single DASHBOARD_PASSWORD mode

_DUMMY_HASH: str | None = None


class AccountError(ValueError):
    """A refused account operation; the message says what to fix. Nothing was written."""


@dataclass(frozen=True)
class User:
    name: str
    role: str
    created_at: float
    created_by: str
    session_epoch: int = 0  # see :meth:`Accounts.end_sessions`

    def can(self, needed: str) -> bool:
        return allows(self.role, needed)


@dataclass(frozen=True)
class SignIn:
    user: User | None
    message: str
    retry_after_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.user is not None


def allows(role: str, needed: str) -> bool:
    """Does ``role`` include the rights of ``needed``?"""
    return RANK.get(role, -1) >= RANK[needed]


def normalize_name(raw: object) -> str:
    if not isinstance(raw, str):
        raise AccountError("account name must be text")
    name = unicodedata.normalize("NFKC", raw).strip().lower()
    if not NAME_RE.fullmatch(name):
        raise AccountError(
            f"account name {raw!r} is not allowed: 1 to 64 characters, letters, digits and . _ @ -, "
            "starting with a letter or digit"
        )
    if name in RESERVED_ACTORS:
        raise AccountError(f"{name!r} is a reserved system actor; choose another account name")
    return name


def check_role(role: object) -> str:
    if role not in ROLES:
        raise AccountError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return str(role)


def check_password(password: object) -> str:
    if not isinstance(password, str):
        raise AccountError("password must be text")
    if not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
        raise AccountError(f"password must be {MIN_PASSWORD} to {MAX_PASSWORD} characters")
    try:
        password.encode("utf-8")
    except UnicodeEncodeError:
        raise AccountError("password is not valid Unicode text") from None
    return password


def throttle_delay_s(failures: int) -> float:
    """The wait imposed after ``failures`` consecutive failed sign-ins."""
    if failures < FREE_TRIES:
        return 0.0
    return min(2.0 ** (failures - FREE_TRIES), MAX_DELAY_S)


class Accounts:
    """Account operations on one database; the hasher and clock are injectable (tests use a cheap
    Argon2 setting and a fixed clock)."""

    def __init__(self, engine: Engine, hasher: PasswordHasher | None = None, clock: Callable[[], float] = time.time):
        self.engine = engine
        self.hasher = hasher or PasswordHasher()
        self.clock = clock

    def add(self, name: str, role: str, password: str, *, actor: str) -> User:
        n, r, p = normalize_name(name), check_role(role), check_password(password)
        row = db.UserRow(n, r, self.hasher.hash(p), self.clock(), actor)
        try:
            db.insert_user(self.engine, row)
        except db.DuplicateUser:
            raise AccountError(f"account {n!r} exists already; remove it first or use set-role") from None
        return _user(row)

    def list(self) -> list[User]:
        return [_user(r) for r in db.all_users(self.engine)]

    def remove(self, name: str) -> None:
        n = normalize_name(name)
        if not db.delete_user(self.engine, n):
            raise AccountError(f"no account named {n!r}")
        db.clear_failures(self.engine, _throttle_key(n))

    def set_role(self, name: str, role: str) -> User:
        n, r = normalize_name(name), check_role(role)
        if not db.update_user(self.engine, n, role=r):
            raise AccountError(f"no account named {n!r}")
        # A session signed in under the old role must sign in again: its token names the old epoch.
        db.bump_session_epoch(self.engine, n)
        row = db.get_user(self.engine, n)
        assert row is not None
        return _user(row)

    def set_password(self, name: str, password: str) -> None:
        n, p = normalize_name(name), check_password(password)
        if not db.update_user(self.engine, n, password_hash=self.hasher.hash(p)):
            raise AccountError(f"no account named {n!r}")
        db.bump_session_epoch(self.engine, n)  # a new password ends the sessions the old one opened

    def end_sessions(self, name: str) -> None:
        """Sign ``name`` out everywhere: every session token issued so far stops working (sign-out
        on the dashboard calls this; removing the account or changing its role has the same effect).
        An unknown name is not an error: there is nothing left to end."""
        try:
            db.bump_session_epoch(self.engine, normalize_name(name))
        except AccountError:
            pass

    def has_accounts(self) -> bool:
        return db.count_users(self.engine) > 0

    def sign_in(self, name: object, password: object) -> SignIn:
        now = self.clock()
        try:
            n = normalize_name(name)
        except AccountError:
            return SignIn(None, "wrong name or password")
        key = _throttle_key(n)
        wait = db.blocked_until(self.engine, key) - now
        if wait > 0:
            return SignIn(None, f"too many failed sign-ins: try again in {wait:.0f} s", retry_after_s=wait)
        row = db.get_user(self.engine, n)
        if row is not None and isinstance(password, str) and self._verify(row, password):
            db.clear_failures(self.engine, key)
            return SignIn(_user(row), "signed in")
        if row is None:
            self._verify_dummy(password)
        failures = db.add_failure(self.engine, key, now, FORGET_AFTER_S)
        delay = throttle_delay_s(failures)
        if delay > 0:
            db.set_blocked_until(self.engine, key, now + delay)
            return SignIn(None, f"wrong name or password; next try in {delay:.0f} s", retry_after_s=delay)
        return SignIn(None, "wrong name or password")

    def check_shared_password(self, given: object, expected: str) -> SignIn:
        """The single ``DASHBOARD_PASSWORD`` mode's sign-in, compared in constant time and throttled
        like an account under the key ``password`` (same free tries, same growing delay). The
        returned user is the shared actor ``dashboard`` with operator rights."""
        now = self.clock()
        wait = db.blocked_until(self.engine, SHARED_PASSWORD_KEY) - now
        if wait > 0:
            return SignIn(None, f"too many failed sign-ins: try again in {wait:.0f} s", retry_after_s=wait)
        given_bytes = given.encode("utf-8", "surrogatepass") if isinstance(given, str) else b""
        if hmac.compare_digest(given_bytes, expected.encode("utf-8", "surrogatepass")):
            db.clear_failures(self.engine, SHARED_PASSWORD_KEY)
            return SignIn(User("dashboard", "operator", now, "config"), "signed in")
        failures = db.add_failure(self.engine, SHARED_PASSWORD_KEY, now, FORGET_AFTER_S)
        delay = throttle_delay_s(failures)
        if delay > 0:
            db.set_blocked_until(self.engine, SHARED_PASSWORD_KEY, now + delay)
            return SignIn(None, f"wrong password; next try in {delay:.0f} s", retry_after_s=delay)
        return SignIn(None, "wrong password")

    def get(self, name: str) -> User | None:
        """The account ``name`` as stored now (its role may have changed since sign-in), or None."""
        try:
            row = db.get_user(self.engine, normalize_name(name))
        except AccountError:
            return None
        return _user(row) if row is not None else None

    def _verify(self, row: db.UserRow, password: str) -> bool:
        try:
            self.hasher.verify(row.password_hash, password)
        except (VerificationError, InvalidHashError):
            return False
        if self.hasher.check_needs_rehash(row.password_hash):
            db.update_user(self.engine, row.name, password_hash=self.hasher.hash(password))
        return True

    def _verify_dummy(self, password: object) -> None:
        global _DUMMY_HASH
        if _DUMMY_HASH is None:
            _DUMMY_HASH = self.hasher.hash("not-a-real-password")
        try:
            self.hasher.verify(_DUMMY_HASH, password if isinstance(password, str) else "")
        except (VerificationError, InvalidHashError):
            pass


def store_problem(exc: BaseException) -> str:
    """What to tell a visitor when the account store could not be read: the database not answering
    (refused, timed out, dropped connection) or, for anything else, the error's kind. Never the
    driver's text, which may name hosts and SQL."""
    from sqlalchemy.exc import InterfaceError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(exc, OperationalError | InterfaceError | PoolTimeout | OSError | TimeoutError):
        return "the database is not answering"
    return f"the account store could not be read ({type(exc).__name__})"


def _throttle_key(name: str) -> str:
    return f"user:{name}"


def _user(row: db.UserRow) -> User:
    return User(row.name, row.role, row.created_at, row.created_by, row.session_epoch)
