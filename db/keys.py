"""Gateway keys: create (the plaintext is returned once), list, revoke, and look up a presented key.

Only a hash of each key is stored, with a short non-secret prefix for display. Keys are
``gw-`` + 32 random bytes (``secrets.token_urlsafe(32)``, 256 bits). For keys with that much entropy a
single SHA-256 is the right hash: slow password hashes (bcrypt, scrypt, argon2) exist to make
guessing low-entropy human passwords expensive, but nobody can enumerate a 2**256 key space, and a
fast hash keeps the per-request lookup to microseconds. The lookup goes by the hash (an indexed
column), so the database never sees the key itself and its timing reveals nothing about the key; the
final comparison uses ``hmac.compare_digest`` all the same.

Money is held in integer micro-USD, so a budget of $0.10 is exactly 100_000.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, case, insert, select, update
from sqlalchemy.exc import IntegrityError

from db.models import GatewayKey

KEY_PREFIX = "gw-"
DISPLAY_PREFIX_LEN = 10  # "gw-" + 7 random characters: enough to tell keys apart, useless to guess
MAX_PRESENTED_KEY_LEN = 256  # a real key is 46 characters; anything far longer is not worth hashing
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
PERIODS = ("day", "month")
MAX_RPM = 10_000_000
MAX_TPM = 10_000_000_000
MAX_BUDGET_USD = 1_000_000_000.0
MAX_CREATED_BY = 128
MICRO = 1_000_000


class KeyValidationError(ValueError):
    """A key setting is invalid; the message says which and how to fix it."""


class DuplicateKeyNameError(ValueError):
    def __init__(self, name: str):
        super().__init__(
            f"a gateway key named {name!r} already exists. Fix: choose another name "
            "(revoked keys keep their name so their spend history stays attributable)"
        )


class UnknownKeyError(LookupError):
    def __init__(self, name: str):
        super().__init__(f"no gateway key named {name!r}. Fix: see `python -m app keys list` for the names")


@dataclass(frozen=True)
class KeyRecord:
    """A stored key's settings. Never holds the key or its hash."""

    id: int
    name: str
    prefix: str
    models: tuple[str, ...]  # empty = every model
    rpm: int | None
    tpm: int | None
    budget_micro_usd: int | None
    period: str | None
    created_at: float
    created_by: str
    revoked_at: float | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    @property
    def budget_usd(self) -> float | None:
        return None if self.budget_micro_usd is None else self.budget_micro_usd / MICRO

    def allows_model(self, model: str) -> bool:
        return not self.models or model in self.models

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "prefix": self.prefix,
            "models": list(self.models),
            "rpm": self.rpm,
            "tpm": self.tpm,
            "budget_usd": self.budget_usd,
            "period": self.period,
            "created_at": self.created_at,
            "created_by": self.created_by,
            "revoked_at": self.revoked_at,
            "active": self.active,
        }


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------- validation


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise KeyValidationError(
            f"key name {name!r} is not valid. Fix: 1-64 characters, letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def validate_models(models: Iterable[str] | str | None) -> tuple[str, ...]:
    if models is None:
        return ()
    if isinstance(models, str):
        models = [m.strip() for m in models.split(",") if m.strip()]
    out: list[str] = []
    for m in models:
        if not isinstance(m, str) or not MODEL_RE.match(m):
            raise KeyValidationError(
                f"model name {m!r} is not valid. Fix: a comma-separated list of model names such as gpt-4.1"
            )
        if m not in out:
            out.append(m)
    return tuple(out)


def _validate_limit(label: str, value: object, maximum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        else:
            raise KeyValidationError(f"{label} must be a whole number, got {value!r}. Fix: e.g. --{label} 60")
    assert isinstance(value, int)
    if not 1 <= value <= maximum:
        raise KeyValidationError(f"{label} must be between 1 and {maximum:,}, got {value}. Fix: omit it for no limit")
    return value


def validate_budget(budget_usd: object, period: object) -> tuple[int | None, str | None]:
    """(budget in micro-USD, period) or ``KeyValidationError``."""
    if budget_usd is None:
        if period is not None:
            raise KeyValidationError("a budget period was given without a budget. Fix: add --budget-usd X")
        return None, None
    if isinstance(budget_usd, bool):
        raise KeyValidationError("budget must be a number of US dollars")
    try:
        value = float(budget_usd)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise KeyValidationError(f"budget must be a number of US dollars, got {budget_usd!r}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_BUDGET_USD:
        raise KeyValidationError(
            f"budget must be more than 0 and at most {MAX_BUDGET_USD:,.0f} USD, got {budget_usd!r}. "
            "Fix: e.g. --budget-usd 25"
        )
    micro = round(value * MICRO)
    if micro < 1:
        raise KeyValidationError(f"budget {budget_usd!r} USD is below one micro-dollar. Fix: a larger budget")
    if period is None:
        raise KeyValidationError("a budget needs a period. Fix: add --period day or --period month")
    if period not in PERIODS:
        raise KeyValidationError(f"budget period must be 'day' or 'month', got {period!r}")
    return micro, str(period)


def _validate_created_by(created_by: object) -> str:
    if not isinstance(created_by, str) or not created_by.strip() or len(created_by) > MAX_CREATED_BY:
        raise KeyValidationError(f"created_by must be 1-{MAX_CREATED_BY} characters")
    return created_by.strip()


# ---------------------------------------------------------------------------------------- operations


def _record(row: Any) -> KeyRecord:
    return KeyRecord(
        id=row.id,
        name=row.name,
        prefix=row.key_prefix,
        models=tuple(m for m in row.models.split(",") if m),
        rpm=row.rpm,
        tpm=row.tpm,
        budget_micro_usd=row.budget_micro_usd,
        period=row.budget_period,
        created_at=row.created_at,
        created_by=row.created_by,
        revoked_at=row.revoked_at,
    )


_COLUMNS = [c for c in GatewayKey.__table__.c if c.name != "key_hash"]


def create_key(
    engine: Engine,
    name: str,
    *,
    models: Iterable[str] | str | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    budget_usd: float | None = None,
    period: str | None = None,
    created_by: str = "cli",
    now: float | None = None,
) -> tuple[KeyRecord, str]:
    """Store a new key; returns its record and the plaintext key, which is never retrievable again."""
    name = validate_name(name)
    model_list = validate_models(models)
    rpm = _validate_limit("rpm", rpm, MAX_RPM)
    tpm = _validate_limit("tpm", tpm, MAX_TPM)
    budget_micro, period = validate_budget(budget_usd, period)
    created_by = _validate_created_by(created_by)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    values = {
        "name": name,
        "key_hash": hash_key(key),
        "key_prefix": key[:DISPLAY_PREFIX_LEN],
        "models": ",".join(model_list),
        "rpm": rpm,
        "tpm": tpm,
        "budget_micro_usd": budget_micro,
        "budget_period": period,
        "created_at": time.time() if now is None else now,
        "created_by": created_by,
        "revoked_at": None,
    }
    try:
        with engine.begin() as conn:
            row = conn.execute(insert(GatewayKey).values(**values).returning(*_COLUMNS)).one()
    except IntegrityError:
        # The hash is 256 random bits, so a unique violation is the name.
        raise DuplicateKeyNameError(name) from None
    return _record(row), key


def list_keys(engine: Engine, *, include_revoked: bool = True) -> list[KeyRecord]:
    q = select(*_COLUMNS).order_by(GatewayKey.name)
    if not include_revoked:
        q = q.where(GatewayKey.revoked_at.is_(None))
    with engine.connect() as conn:
        return [_record(r) for r in conn.execute(q)]


def get_key(engine: Engine, name: str) -> KeyRecord:
    with engine.connect() as conn:
        row = conn.execute(select(*_COLUMNS).where(GatewayKey.name == name)).first()
    if row is None:
        raise UnknownKeyError(name)
    return _record(row)


def revoke_key(engine: Engine, name: str, *, now: float | None = None) -> KeyRecord:
    """Revoke by name (idempotent: revoking a revoked key keeps its first revocation time)."""
    ts = time.time() if now is None else now
    with engine.begin() as conn:
        conn.execute(
            update(GatewayKey).where(GatewayKey.name == name, GatewayKey.revoked_at.is_(None)).values(revoked_at=ts)
        )
    return get_key(engine, name)


def lookup_key(engine: Engine, presented: str | None) -> KeyRecord | None:
    """The active key matching ``presented``, or None (unknown, revoked, malformed or missing)."""
    if not presented or len(presented) > MAX_PRESENTED_KEY_LEN or not presented.startswith(KEY_PREFIX):
        return None
    digest = hash_key(presented)
    with engine.connect() as conn:
        row = conn.execute(select(GatewayKey.key_hash, *_COLUMNS).where(GatewayKey.key_hash == digest)).first()
    if row is None or not hmac.compare_digest(row.key_hash, digest) or row.revoked_at is not None:
        return None
    return _record(row)


def spend_by_key(engine: Engine, *, since: float) -> dict[str, tuple[int, float]]:
    """{key name: (requests, cost in USD)} logged in ``request_log`` since ``since`` (epoch seconds);
    a request counts once (its final attempt), its cost is the sum over its attempts."""
    from sqlalchemy import func

    from db.models import RequestLog

    log = RequestLog.__table__.c
    q = (
        select(
            log.key_name, func.sum(case((log.final.is_(True), 1), else_=0)), func.coalesce(func.sum(log.cost_usd), 0.0)
        )
        .where(log.key_name.is_not(None), log.ts >= since)
        .group_by(log.key_name)
    )
    with engine.connect() as conn:
        return {row[0]: (int(row[1] or 0), float(row[2] or 0.0)) for row in conn.execute(q)}
