"""Local dashboard accounts: names, roles, Argon2 hashes, and the growing delay after failed
sign-ins, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from argon2 import PasswordHasher
from sqlalchemy import text

from app.accounts import FREE_TRIES, AccountError, Accounts, allows, throttle_delay_s

CHEAP = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)


@pytest.fixture
def accounts(engine):
    now = [1_000_000.0]
    acc = Accounts(engine, hasher=CHEAP, clock=lambda: now[0])
    acc.now = now  # type: ignore[attr-defined]
    return acc


def test_add_and_sign_in(accounts):
    u = accounts.add("Alice", "operator", "correct horse", actor="admin-bob")
    assert (u.name, u.role, u.created_by) == ("alice", "operator", "admin-bob")
    ok = accounts.sign_in("alice", "correct horse")
    assert ok.ok and ok.user.name == "alice" and ok.user.can("viewer") and not ok.user.can("admin")
    assert not accounts.sign_in("alice", "wrong horse").ok


def test_only_a_hash_is_stored(accounts, engine):
    accounts.add("alice", "viewer", "correct horse", actor="cli")
    with engine.connect() as conn:
        stored = conn.execute(text("select password_hash from dashboard_user")).scalar_one()
    assert "correct horse" not in stored
    assert stored.startswith("$argon2id$")


@pytest.mark.parametrize("name", ["guardrail", "config", "Guardrail", " system "])
def test_system_actors_are_reserved(accounts, name):
    with pytest.raises(AccountError, match="reserved"):
        accounts.add(name, "admin", "correct horse", actor="cli")


@pytest.mark.parametrize("name", ["", "a" * 65, "bad name", "x\ny", "x\u0000", "<img>", "-lead", "\udcff"])
def test_bad_names_are_refused(accounts, name):
    with pytest.raises(AccountError, match="not allowed"):
        accounts.add(name, "viewer", "correct horse", actor="cli")
    assert accounts.list() == []


@pytest.mark.parametrize("pw", ["short", "x" * 1025, "ok password \udcff"])
def test_bad_passwords_are_refused_and_nothing_written(accounts, pw):
    with pytest.raises(AccountError):
        accounts.add("alice", "viewer", pw, actor="cli")
    assert accounts.list() == []


def test_bad_role_refused(accounts):
    with pytest.raises(AccountError, match="role must be one of viewer, operator, admin"):
        accounts.add("alice", "root", "correct horse", actor="cli")


def test_duplicate_refused(accounts):
    accounts.add("alice", "viewer", "correct horse", actor="cli")
    with pytest.raises(AccountError, match="exists already"):
        accounts.add("ALICE", "admin", "another pass", actor="cli")
    assert [u.role for u in accounts.list()] == ["viewer"]


def test_set_role_and_remove(accounts):
    accounts.add("alice", "viewer", "correct horse", actor="cli")
    assert accounts.set_role("alice", "admin").role == "admin"
    accounts.remove("alice")
    assert accounts.list() == []
    with pytest.raises(AccountError, match="no account"):
        accounts.remove("alice")
    with pytest.raises(AccountError, match="no account"):
        accounts.set_role("alice", "viewer")


def test_growing_delay_after_failed_sign_ins(accounts):
    accounts.add("alice", "admin", "correct horse", actor="cli")
    for _ in range(FREE_TRIES - 1):
        r = accounts.sign_in("alice", "guess")
        assert not r.ok and r.retry_after_s == 0
    r = accounts.sign_in("alice", "guess")
    assert r.retry_after_s == 1.0
    # while the wait is on, even the right password is refused (without being checked)
    blocked = accounts.sign_in("alice", "correct horse")
    assert not blocked.ok and "try again" in blocked.message
    accounts.now[0] += 1.0
    assert accounts.sign_in("alice", "guess").retry_after_s == 2.0
    accounts.now[0] += 2.0
    assert accounts.sign_in("alice", "guess").retry_after_s == 4.0
    accounts.now[0] += 4.0
    assert accounts.sign_in("alice", "correct horse").ok
    # success resets the count
    assert accounts.sign_in("alice", "guess").retry_after_s == 0


def test_unknown_names_are_throttled_too(accounts):
    delays = [accounts.sign_in("nobody", "guess").retry_after_s for _ in range(FREE_TRIES)]
    assert delays[-1] == 1.0


def test_old_failures_are_forgotten(accounts):
    accounts.add("alice", "admin", "correct horse", actor="cli")
    for _ in range(FREE_TRIES - 1):
        accounts.sign_in("alice", "guess")
    accounts.now[0] += 7200
    assert accounts.sign_in("alice", "guess").retry_after_s == 0  # counts as the first failure again


def test_delay_schedule_is_capped():
    assert [throttle_delay_s(n) for n in range(FREE_TRIES + 3)] == [0.0] * FREE_TRIES + [1.0, 2.0, 4.0]
    assert throttle_delay_s(100) == 900.0


def test_role_order():
    assert allows("admin", "operator") and allows("operator", "viewer") and not allows("viewer", "operator")
    assert not allows("nonsense", "viewer")
