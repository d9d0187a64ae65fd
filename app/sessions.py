"""Dashboard sessions that survive a reload: signed, expiring session tokens for local accounts.

A token names the account, the account's creation time and session epoch, and an expiry, and is
signed with HMAC-SHA256 under a server secret. It is the value of an HttpOnly cookie (set by the
dashboard's own route, see ``ui/session_cookie.py``); this module knows nothing of cookies or
Streamlit.

A token signs a session in only while all of these hold:

- its signature verifies under the server secret (a tampered token is just "not signed in");
- it has not expired (``[dashboard] session_ttl_s`` after sign-in, bounded in the config);
- the account still exists, was created at the time the token names (a removed and re-added
  account does not inherit old tokens) and has the same session epoch. The epoch is bumped by
  sign-out, a role change and a new password (:meth:`app.accounts.Accounts.end_sessions`), so
  any of those revokes every token issued before it, in every browser and process.

The secret comes from ``DASHBOARD_SESSION_SECRET`` (environment or Streamlit secrets) when set,
else it is generated once and kept in the database (``dashboard_secret``), so every dashboard
process on one database agrees. It is never shown or logged; replacing it signs everybody out.

:class:`Handoffs` is the bridge from a sign-in (inside a Streamlit script run, over the websocket)
to the cookie (which only an HTTP response can set HttpOnly): a one-time code, redeemed within
seconds by the browser's POST to the dashboard's session route.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy import Engine

from app.accounts import Accounts, User
from core.errors import ConfigurationError
from db import users as db

SECRET_ENV = "DASHBOARD_SESSION_SECRET"
SECRET_NAME = "dashboard_session"
MIN_SECRET_CHARS = 32
MAX_TOKEN_CHARS = 2048  # ours are ~200; anything much longer is not ours and is not parsed
VERSION = 1
# Clock skew tolerated between dashboard processes for a token's issue time.
SKEW_S = 60.0
HANDOFF_TTL_S = 60.0
T = TypeVar("T")


class SessionSecretError(ConfigurationError, ValueError):
    """The configured session secret cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Claims:
    """What a verified token says: who, which account generation and epoch, until when."""

    name: str
    created_at: float
    epoch: int
    issued_at: float
    expires_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionTokens:
    """Issues and verifies session tokens under one secret; the clock is injectable."""

    def __init__(self, secret: bytes, ttl_s: float, clock: Callable[[], float] = time.time):
        if len(secret) < MIN_SECRET_CHARS:
            raise SessionSecretError(f"the session secret must be at least {MIN_SECRET_CHARS} bytes")
        if not (math.isfinite(ttl_s) and ttl_s > 0):
            raise SessionSecretError("the session lifetime must be a positive number of seconds")
        # A key derived for this one use, so the stored secret could serve another purpose later.
        self._key = hmac.new(secret, b"gateway dashboard session v1", hashlib.sha256).digest()
        self.ttl_s = ttl_s
        self.clock = clock

    def issue(self, user: User) -> str:
        now = self.clock()
        payload = {
            "v": VERSION,
            "sub": user.name,
            "ca": user.created_at,
            "ep": user.session_epoch,
            "iat": now,
            "exp": now + self.ttl_s,
        }
        body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8"))
        return f"{body}.{self._sign(body)}"

    def read(self, token: object) -> Claims | None:
        """The claims of a genuine, unexpired token; ``None`` for anything else (never raises)."""
        if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS or token.count(".") != 1:
            return None
        body, signature = token.split(".")
        if not hmac.compare_digest(signature.encode("ascii", "replace"), self._sign(body).encode("ascii")):
            return None
        try:
            payload = json.loads(_unb64(body))
        except ValueError:  # only reachable with our own key, i.e. never; kept as a guard
            return None
        if not isinstance(payload, dict) or payload.get("v") != VERSION:
            return None
        name, epoch = payload.get("sub"), payload.get("ep")
        if not (isinstance(name, str) and isinstance(epoch, int) and not isinstance(epoch, bool)):
            return None
        times = [payload.get(k) for k in ("ca", "iat", "exp")]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in times):
            return None
        created, issued, expires = (float(v) for v in times)  # type: ignore[arg-type]  # checked above
        now = self.clock()
        # The lifetime is re-checked against the current setting: shortening session_ttl_s also
        # shortens the tokens already out there.
        if not (issued - SKEW_S <= now < expires and expires - issued <= self.ttl_s):
            return None
        return Claims(name, created, epoch, issued, expires)

    def _sign(self, body: str) -> str:
        return _b64(hmac.new(self._key, body.encode("ascii", "replace"), hashlib.sha256).digest())


def still_valid(claims: Claims, user: User | None) -> bool:
    """Does the account as stored now still honour a token with ``claims``?"""
    return (
        user is not None
        and user.name == claims.name
        and user.created_at == claims.created_at
        and user.session_epoch == claims.epoch
    )


def resume(tokens: SessionTokens, accounts: Accounts, token: object) -> User | None:
    """The account a session token signs in, as stored now; ``None`` when it does not (tampered,
    expired, revoked, or the account is gone)."""
    claims = tokens.read(token)
    if claims is None:
        return None
    user = accounts.get(claims.name)
    return user if still_valid(claims, user) else None


def session_secret(engine: Engine, configured: str | None, clock: Callable[[], float] = time.time) -> bytes:
    """The signing secret: ``configured`` (``DASHBOARD_SESSION_SECRET``) when set, else the one
    stored in the database, generated on first use."""
    if configured is not None:
        if len(configured.strip()) < MIN_SECRET_CHARS:
            raise SessionSecretError(
                f"{SECRET_ENV} must be at least {MIN_SECRET_CHARS} characters "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(48))'), or unset it to "
                "let the dashboard generate one and keep it in the database"
            )
        return configured.strip().encode("utf-8", "surrogatepass")
    stored = db.stored_secret(engine, SECRET_NAME, lambda: secrets.token_urlsafe(48), clock())
    return stored.encode("ascii")


class Handoffs(Generic[T]):
    """One-time codes that carry a freshly issued token from the script run that signed in to the
    HTTP request that sets the cookie. A code is random, single use and short lived, so the token
    itself never travels in a URL or through page JavaScript."""

    def __init__(self, ttl_s: float = HANDOFF_TTL_S, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._codes: dict[str, tuple[T, float]] = {}

    def offer(self, value: T) -> str:
        code = secrets.token_urlsafe(32)
        with self._lock:
            self._expire()
            self._codes[code] = (value, self.clock() + self.ttl_s)
        return code

    def redeem(self, code: object) -> T | None:
        """The value parked under ``code``, once; ``None`` for an unknown, used or expired code."""
        if not isinstance(code, str):
            return None
        with self._lock:
            self._expire()
            entry = self._codes.pop(code, None)
        return entry[0] if entry is not None else None

    def pending(self, code: str) -> bool:
        with self._lock:
            self._expire()
            return code in self._codes

    def _expire(self) -> None:
        now = self.clock()
        for code in [c for c, (_, until) in self._codes.items() if until <= now]:
            del self._codes[code]
