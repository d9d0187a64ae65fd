"""Who is acting on the dashboard: the signed-in identity and its role, never typed text.

Four ways in, one :class:`Identity` out:

- an OpenID Connect provider (Streamlit's ``st.login``): the name is the e-mail (else the subject),
  the role comes from a claim or the ``[dashboard.roles]`` lists (:func:`oidc_role`);
- local accounts (``python -m app users add``): the account's name and role;
- ``DASHBOARD_PASSWORD``: one shared password, actor ``dashboard``, operator rights;
- none of these: open for one-person local use, actor ``local``, admin rights (the one person owns the
  machine and its CLI anyway: they create gateway keys on the Keys page too).

The write functions of the canary page take an :class:`Identity` and refuse a viewer themselves,
so a disabled button is not the only thing between a viewer and a write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.accounts import ROLES, allows

LOCAL_ACTOR = "local"
PASSWORD_ACTOR = "dashboard"


@dataclass(frozen=True)
class Identity:
    name: str
    role: str  # viewer | operator | admin
    source: str  # local | password | account | oidc

    @property
    def can_write(self) -> bool:
        return allows(self.role, "operator")

    @property
    def is_admin(self) -> bool:
        return allows(self.role, "admin")


LOCAL = Identity(LOCAL_ACTOR, "admin", "local")
SHARED_PASSWORD = Identity(PASSWORD_ACTOR, "operator", "password")


def refusal(who: Identity) -> str | None:
    """Why ``who`` may not change anything, or ``None`` when it may."""
    if who.can_write:
        return None
    return f"Refused: {who.name} is signed in as a {who.role}, and viewers cannot change anything. Nothing was written."


def oidc_name(claims: Mapping[str, object]) -> str:
    """The actor for an OpenID Connect identity: its e-mail, else its subject (``sub``)."""
    for key in ("email", "preferred_username", "sub"):
        value = claims.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()[:200]
    return "unknown"


def oidc_role(claims: Mapping[str, object], roles) -> str:
    """The role for an OpenID Connect identity under ``roles`` (``DashboardRoles``): the highest
    valid role named by ``roles.claim`` in the token (a string or a list), else the first list
    (admins, operators, viewers) holding the e-mail or subject, else ``roles.default``."""
    if roles.claim:
        value = claims.get(roles.claim)
        named = [value] if isinstance(value, str) else list(value) if isinstance(value, list | tuple) else []
        valid = [r for r in named if r in ROLES]
        if valid:
            return max(valid, key=ROLES.index)
    ids = {v.strip().lower() for k in ("email", "sub") if isinstance(v := claims.get(k), str) and v.strip()}
    for role, members in (("admin", roles.admins), ("operator", roles.operators), ("viewer", roles.viewers)):
        if ids & {m.strip().lower() for m in members}:
            return role
    return roles.default
