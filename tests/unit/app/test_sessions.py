"""Dashboard session tokens (app/sessions.py), without Streamlit: signed, expiring, and revoked by
sign-out, by removing the account, by a role or password change; a tampered token or one signed
with another secret is "not signed in", never an error. The signing secret is generated once per
database. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import json

import pytest
from argon2 import PasswordHasher

from app.accounts import Accounts
from app.sessions import Handoffs, SessionSecretError, SessionTokens, resume, session_secret

CHEAP = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
SECRET = b"s" * 48
TTL = 8 * 3600.0


class Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def accounts(engine, clock):
    acc = Accounts(engine, hasher=CHEAP, clock=clock)
    acc.add("olga", "operator", "pw-of-olga-123", actor="cli")
    return acc


@pytest.fixture
def tokens(clock):
    return SessionTokens(SECRET, TTL, clock=clock)


def olga(accounts):
    user = accounts.get("olga")
    assert user is not None
    return user


def test_a_token_signs_its_account_in_until_it_expires(accounts, tokens, clock):
    token = tokens.issue(olga(accounts))
    user = resume(tokens, accounts, token)
    assert user is not None and (user.name, user.role) == ("olga", "operator")
    claims = tokens.read(token)
    assert claims is not None and claims.expires_at - claims.issued_at == TTL
    clock.t += TTL - 1
    assert resume(tokens, accounts, token) is not None
    clock.t += 1
    assert resume(tokens, accounts, token) is None  # expired at exactly issue + ttl


def test_shortening_the_lifetime_shortens_tokens_already_issued(accounts, tokens, clock):
    token = tokens.issue(olga(accounts))
    shorter = SessionTokens(SECRET, 60.0, clock=clock)
    assert shorter.read(token) is None
    assert tokens.read(token) is not None


def _flip(text: str, i: int) -> str:
    return text[:i] + ("A" if text[i] != "A" else "B") + text[i + 1 :]


def test_tampered_forged_or_foreign_tokens_do_not_sign_in(accounts, tokens, clock):
    token = tokens.issue(olga(accounts))
    body, signature = token.split(".")
    # Promote the payload to another account and keep the old signature.
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    accounts.add("sam", "admin", "pw-of-sam-1234", actor="cli")
    forged = base64.urlsafe_b64encode(json.dumps({**payload, "sub": "sam"}).encode()).rstrip(b"=").decode()
    candidates = [
        f"{forged}.{signature}",
        f"{_flip(body, 5)}.{signature}",
        f"{body}.{_flip(signature, 3)}",
        f"{body}.",
        body,
        "",
        "a.b.c",
        "é." + signature,
        "x" * 5000,
        None,
        12345,
        SessionTokens(b"another secret of enough length!!", TTL, clock=clock).issue(olga(accounts)),
    ]
    for candidate in candidates:
        assert resume(tokens, accounts, candidate) is None, candidate
    assert resume(tokens, accounts, token) is not None  # the genuine one still works


@pytest.mark.parametrize(
    "revoke",
    [
        lambda acc: acc.end_sessions("olga"),  # sign-out
        lambda acc: acc.remove("olga"),
        lambda acc: acc.set_role("olga", "viewer"),
        lambda acc: acc.set_password("olga", "a new password!"),
    ],
    ids=["sign-out", "removed", "role-change", "new-password"],
)
def test_revocation(accounts, tokens, revoke):
    token = tokens.issue(olga(accounts))
    other = tokens.issue(olga(accounts))  # a second browser of the same account
    revoke(accounts)
    assert resume(tokens, accounts, token) is None
    assert resume(tokens, accounts, other) is None
    # Signing in again afterwards gives a token that works (when the account still exists).
    user = accounts.get("olga")
    if user is not None:
        assert resume(tokens, accounts, tokens.issue(user)) is not None


def test_a_removed_and_re_added_account_does_not_inherit_old_tokens(accounts, tokens, clock):
    token = tokens.issue(olga(accounts))
    accounts.remove("olga")
    clock.t += 5
    accounts.add("olga", "admin", "someone else's pw", actor="cli")
    assert olga(accounts).session_epoch == 0  # the same epoch as the old token: creation time decides
    assert resume(tokens, accounts, token) is None


def test_sign_out_of_an_unknown_account_is_harmless(accounts):
    accounts.end_sessions("nobody")
    accounts.end_sessions("NOT a valid name!")
    assert olga(accounts).session_epoch == 0


def test_the_secret_is_generated_once_per_database_and_a_configured_one_must_be_long(engine):
    first = session_secret(engine, None)
    assert len(first) >= 32
    assert session_secret(engine, None) == first  # stored, not regenerated
    configured = "c" * 40
    assert session_secret(engine, configured) == configured.encode()
    with pytest.raises(SessionSecretError, match="at least 32"):
        session_secret(engine, "short")
    with pytest.raises(SessionSecretError):
        SessionTokens(b"short", TTL)
    with pytest.raises(SessionSecretError):
        SessionTokens(SECRET, float("nan"))


def test_handoff_codes_are_single_use_and_expire():
    now = Clock(100.0)
    handoffs: Handoffs[str] = Handoffs(ttl_s=60, clock=now)
    a, b = handoffs.offer("token-a"), handoffs.offer("token-b")
    assert a != b and "token-a" not in a
    assert handoffs.pending(a)
    assert handoffs.redeem(a) == "token-a"
    assert handoffs.redeem(a) is None  # used
    assert not handoffs.pending(a)
    now.t += 60
    assert handoffs.redeem(b) is None  # expired
    assert handoffs.redeem(None) is None and handoffs.redeem(["x"]) is None


def test_session_ttl_is_bounded_in_the_config(settings_factory):
    from app.config import ConfigError

    base = "[routing]\nprimary='p'\nfallback='p'\n[providers.p]\nbase_url='sim://p'\nmodels=['gpt-4.1']\ndefault_model='gpt-4.1'\n"
    assert settings_factory(base).dashboard.session_ttl_s == 8 * 3600
    assert settings_factory(base + "[dashboard]\nsession_ttl_s = 600\n").dashboard.session_ttl_s == 600
    for bad in ("0", "59", "1e400", "nan", "inf", "31e6", "true", "'8h'"):
        with pytest.raises(ConfigError, match="session_ttl_s"):
            settings_factory(base + f"[dashboard]\nsession_ttl_s = {bad}\n")
