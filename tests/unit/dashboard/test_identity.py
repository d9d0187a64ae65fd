"""Who acts on the dashboard: roles for OpenID Connect identities, the viewer refusal, and the
shared DASHBOARD_PASSWORD sign-in throttled like an account (key ``password``)."""

from __future__ import annotations

import pytest
from argon2 import PasswordHasher

from app.accounts import Accounts
from app.config import DashboardRoles
from app.dashboard.identity import LOCAL, SHARED_PASSWORD, Identity, oidc_name, oidc_role, refusal

ROLES = DashboardRoles(claim="groups", admins=["Boss@Example.com"], operators=["op-sub"], default="viewer")


@pytest.mark.parametrize(
    "claims, role",
    [
        ({"email": "a@x", "groups": "operator"}, "operator"),
        ({"email": "a@x", "groups": ["viewer", "admin", "nonsense"]}, "admin"),  # the highest valid one
        ({"email": "a@x", "groups": ["nonsense"]}, "viewer"),  # nothing valid: the lists, then default
        ({"email": "boss@example.com"}, "admin"),  # lists match case-insensitively
        ({"sub": "op-sub"}, "operator"),
        ({"email": "boss@example.com", "groups": "viewer"}, "viewer"),  # the claim wins over the lists
        ({"email": "someone@x"}, "viewer"),
        ({}, "viewer"),
    ],
)
def test_oidc_role_from_the_claim_else_the_lists_else_the_default(claims, role):
    assert oidc_role(claims, ROLES) == role


def test_oidc_role_without_a_claim_setting_uses_the_lists_and_default():
    roles = DashboardRoles(operators=["ops@x"], default="operator")
    assert oidc_role({"email": "ops@x", "roles": "admin"}, roles) == "operator"
    assert oidc_role({"email": "else@x"}, roles) == "operator"


def test_oidc_name_prefers_the_email_then_username_then_subject():
    assert oidc_name({"email": "a@x", "sub": "1"}) == "a@x"
    assert oidc_name({"preferred_username": "ann", "sub": "1"}) == "ann"
    assert oidc_name({"sub": "1", "email": "  "}) == "1"
    assert oidc_name({}) == "unknown"


def test_who_may_write():
    assert LOCAL.can_write and LOCAL.is_admin and LOCAL.name == "local" and SHARED_PASSWORD.name == "dashboard"
    assert not SHARED_PASSWORD.is_admin  # a shared password is an operator, not an admin
    assert refusal(Identity("ann", "operator", "oidc")) is None
    message = refusal(Identity("vic", "viewer", "account"))
    assert message is not None and "vic" in message and "Nothing was written" in message
    assert Identity("b", "admin", "oidc").is_admin and not Identity("o", "operator", "oidc").is_admin


def test_shared_password_is_throttled_under_its_own_key(engine):
    now = [1000.0]
    acc = Accounts(engine, hasher=PasswordHasher(time_cost=1, memory_cost=8, parallelism=1), clock=lambda: now[0])
    assert acc.check_shared_password("s3cret", "s3cret").ok
    results = [acc.check_shared_password(f"bad {i}", "s3cret") for i in range(3)]
    assert [r.message for r in results[:2]] == ["wrong password", "wrong password"]
    assert results[2].retry_after_s == 1.0 and "next try in 1 s" in results[2].message
    blocked = acc.check_shared_password("s3cret", "s3cret")  # the right one waits too
    assert not blocked.ok and "try again in" in blocked.message
    now[0] += 1.5
    assert "next try in 2 s" in acc.check_shared_password("bad", "s3cret").message
    now[0] += 2.5
    ok = acc.check_shared_password("s3cret", "s3cret")
    assert ok.ok and ok.user is not None and (ok.user.name, ok.user.role) == ("dashboard", "operator")
    assert acc.check_shared_password("bad", "s3cret").message == "wrong password"  # the count starts anew
    # An account's throttle is separate from the shared password's.
    assert acc.sign_in("password", "whatever").message == "wrong name or password"
