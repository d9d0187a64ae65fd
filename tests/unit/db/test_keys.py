"""Gateway keys (db/keys.py): creation with validation, hashed storage, lookup, listing, revocation."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import select

from db.keys import (
    DuplicateKeyNameError,
    KeyValidationError,
    UnknownKeyError,
    create_key,
    get_key,
    list_keys,
    lookup_key,
    revoke_key,
)
from db.models import GatewayKey


def test_create_returns_plaintext_once_and_stores_only_its_hash(engine):
    rec, key = create_key(
        engine, "team-a", models="gpt-4.1, gemini-2.5-flash", rpm=60, tpm=1000, budget_usd=2.5, period="day", now=100.0
    )
    assert key.startswith("gw-") and len(key) == 3 + 43
    assert rec.name == "team-a" and rec.models == ("gpt-4.1", "gemini-2.5-flash")
    assert (rec.rpm, rec.tpm, rec.budget_micro_usd, rec.budget_usd, rec.period) == (60, 1000, 2_500_000, 2.5, "day")
    assert rec.prefix == key[:10] and rec.created_at == 100.0 and rec.active
    with engine.connect() as conn:
        row = conn.execute(select(GatewayKey)).one()._mapping
    assert row["key_hash"] == hashlib.sha256(key.encode()).hexdigest()
    assert key not in {str(v) for v in row.values()}
    assert "key" not in rec.to_dict() and key not in repr(rec)


def test_two_keys_differ(engine):
    _, k1 = create_key(engine, "a")
    _, k2 = create_key(engine, "b")
    assert k1 != k2


def test_lookup_finds_active_key_and_refuses_wrong_revoked_or_malformed(engine):
    rec, key = create_key(engine, "svc")
    found = lookup_key(engine, key)
    assert found is not None and found.id == rec.id
    assert lookup_key(engine, key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert lookup_key(engine, "") is None
    assert lookup_key(engine, None) is None
    assert lookup_key(engine, "sk-" + key[3:]) is None
    assert lookup_key(engine, key + "x" * 300) is None
    revoked = revoke_key(engine, "svc", now=5.0)
    assert revoked.revoked_at == 5.0 and not revoked.active
    assert lookup_key(engine, key) is None
    # Idempotent: the first revocation time is kept.
    assert revoke_key(engine, "svc", now=9.0).revoked_at == 5.0


def test_list_and_revoke_unknown(engine):
    create_key(engine, "b-key")
    create_key(engine, "a-key")
    revoke_key(engine, "b-key")
    assert [k.name for k in list_keys(engine)] == ["a-key", "b-key"]
    assert [k.name for k in list_keys(engine, include_revoked=False)] == ["a-key"]
    with pytest.raises(UnknownKeyError, match="no gateway key named 'zzz'"):
        revoke_key(engine, "zzz")
    with pytest.raises(UnknownKeyError):
        get_key(engine, "zzz")


def test_duplicate_name_refused_even_after_revocation(engine):
    create_key(engine, "dup")
    revoke_key(engine, "dup")
    with pytest.raises(DuplicateKeyNameError, match="already exists"):
        create_key(engine, "dup")
    assert len(list_keys(engine)) == 1


def test_allows_model():
    from db.keys import KeyRecord

    k = KeyRecord(1, "n", "gw-x", ("gpt-4.1",), None, None, None, None, 0.0, "t", None)
    assert k.allows_model("gpt-4.1") and not k.allows_model("gemini-2.5-flash")
    assert KeyRecord(1, "n", "gw-x", (), None, None, None, None, 0.0, "t", None).allows_model("anything")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "key name"),
        ({"name": "has space"}, "key name"),
        ({"name": "-dash-first"}, "key name"),
        ({"name": "x" * 65}, "key name"),
        ({"name": 7}, "key name"),
        ({"models": "gpt 4"}, "model name"),
        ({"models": ["ok", ""]}, "model name"),
        ({"rpm": 0}, "rpm must be between"),
        ({"rpm": -5}, "rpm must be between"),
        ({"rpm": 2.5}, "rpm must be a whole number"),
        ({"rpm": True}, "rpm must be a whole number"),
        ({"rpm": float("nan")}, "rpm must be a whole number"),
        ({"tpm": 10**20}, "tpm must be between"),
        ({"budget_usd": 5.0}, "needs a period"),
        ({"period": "day"}, "without a budget"),
        ({"budget_usd": 5.0, "period": "week"}, "'day' or 'month'"),
        ({"budget_usd": 0, "period": "day"}, "more than 0"),
        ({"budget_usd": -1, "period": "day"}, "more than 0"),
        ({"budget_usd": float("nan"), "period": "day"}, "more than 0"),
        ({"budget_usd": float("inf"), "period": "day"}, "more than 0"),
        ({"budget_usd": "1e400", "period": "day"}, "more than 0"),
        ({"budget_usd": 1e12, "period": "day"}, "more than 0"),
        ({"budget_usd": 1e-9, "period": "day"}, "below one micro-dollar"),
        ({"budget_usd": "lots", "period": "day"}, "number of US dollars"),
        ({"budget_usd": True, "period": "day"}, "number of US dollars"),
        ({"created_by": ""}, "created_by"),
    ],
)
def test_validation_refuses_with_clear_message_and_writes_nothing(sqlite_url, kwargs, message):
    from db.engine import dispose_all, get_engine

    engine = get_engine(sqlite_url)
    try:
        args = {"name": "ok-name", **kwargs}
        name = args.pop("name")
        with pytest.raises(KeyValidationError, match=message):
            create_key(engine, name, **args)
        assert list_keys(engine) == []
    finally:
        dispose_all()


def test_whole_float_limits_and_month_period_accepted(engine):
    rec, _ = create_key(engine, "m", rpm=60.0, budget_usd="0.10", period="month")
    assert rec.rpm == 60 and rec.budget_micro_usd == 100_000 and rec.period == "month"
