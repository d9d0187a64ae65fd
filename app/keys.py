"""Gateway keys as the operator sees them (the ``keys`` CLI and the Keys page): create (the key is
shown once), revoke, and a table of every key with its limits and its spend.

Spend has two sources: the budget ledger (``db.limits``, settled per request, for keys with a
budget) and the request log (``request_log.key_name``, for every key). The table shows the log's
requests and cost for the current UTC month, and the ledger's spend for the key's budget period.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Engine

from app import catalog
from app.config import Settings
from app.display.fmt import usd, when
from db import keys as db_keys
from db import limits
from db.keys import KeyRecord


@dataclass(frozen=True)
class KeyRow:
    name: str
    prefix: str
    models: str  # "all" or a comma-separated list
    rpm: int | None
    tpm: int | None
    budget: str  # "$25 / month" or "none"
    budget_used_usd: float | None  # spent in the budget period (the ledger)
    requests_month: int
    cost_month_usd: float
    active: bool
    created_at: float
    created_by: str

    def to_dict(self) -> dict:
        """The raw row (``keys list --json``)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def display(self) -> dict[str, str]:
        """The Keys page's row: readable limits, money and UTC times, one type per column."""
        return {
            "name": self.name,
            "prefix": self.prefix,
            "models": self.models,
            "requests/min": "no limit" if self.rpm is None else f"{self.rpm:,}",
            "tokens/min": "no limit" if self.tpm is None else f"{self.tpm:,}",
            "budget": self.budget,
            "spent in budget period": usd(self.budget_used_usd),
            "requests this month": f"{self.requests_month:,}",
            "cost this month": usd(self.cost_month_usd),
            "status": "active" if self.active else "revoked",
            "created": when(self.created_at),
            "created by": self.created_by,
        }


def create(
    engine: Engine,
    name: str,
    *,
    models: str | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    budget_usd: float | None = None,
    period: str | None = None,
    created_by: str = "cli",
) -> tuple[KeyRecord, str]:
    """A new key and its plaintext (never retrievable again). Raises ``ValueError`` subclasses
    with a "Fix:" for a bad setting or a taken name."""
    return db_keys.create_key(
        engine, name, models=models, rpm=rpm, tpm=tpm, budget_usd=budget_usd, period=period, created_by=created_by
    )


def revoke(engine: Engine, name: str) -> KeyRecord:
    db_keys.get_key(engine, name)  # UnknownKeyError with a "Fix:" for a typo
    return db_keys.revoke_key(engine, name)


def rows(engine: Engine, *, now: float | None = None) -> list[KeyRow]:
    ts = time.time() if now is None else now
    logged = db_keys.spend_by_key(engine, since=limits.period_start("month", ts))
    out = []
    for k in db_keys.list_keys(engine):
        state = limits.spend(engine, k, now=ts)
        requests, cost = logged.get(k.name, (0, 0.0))
        out.append(
            KeyRow(
                name=k.name,
                prefix=k.prefix + "…",
                models=",".join(k.models) or "all",
                rpm=k.rpm,
                tpm=k.tpm,
                budget=f"${k.budget_usd:g} / {k.period}" if k.budget_usd is not None else "none",
                budget_used_usd=state.spent_usd if state is not None else None,
                requests_month=requests,
                cost_month_usd=cost,
                active=k.active,
                created_at=k.created_at,
                created_by=k.created_by,
            )
        )
    return out


@dataclass(frozen=True)
class WorstCase:
    """The most one request can reserve of a budget: a request to ``model`` that sets no
    ``max_tokens`` reserves the model's whole output limit (``db.limits``; its prompt comes on top)."""

    model: str
    output_tokens: int
    cost_usd: float

    def tokens_within(self, budget_usd: float) -> int:
        """The largest ``max_tokens`` whose output alone fits in ``budget_usd`` on this model."""
        price = float(catalog.get(self.model).output)  # USD per million output tokens
        return int(budget_usd * 1_000_000 / price) if price > 0 else self.output_tokens


def worst_case(models: list[str]) -> WorstCase | None:
    """The costliest worst-case request among ``models`` (those the catalog prices; chat models only)."""
    cases = []
    for m in models:
        info = catalog.models().get(m)
        if info is None or info.kind != "chat":
            continue
        limit = catalog.output_limit(m)
        cases.append(WorstCase(m, limit, catalog.cost_usd(m, 0, 0, limit)))
    return max(cases, key=lambda c: c.cost_usd, default=None)


def _dollars(value: float) -> str:
    return f"${value:,.2f}" if value == round(value, 2) else usd(value)


def budget_warning(budget_usd: float | None, period: str | None, models: list[str]) -> str | None:
    """A warning when a budget is smaller than one worst-case request on the key's models: each
    request that sets no ``max_tokens`` is then refused, at $0 spent. None when it is not."""
    case = worst_case(models)
    if not budget_usd or case is None or case.cost_usd <= budget_usd:
        return None
    return (
        f"This budget ({_dollars(budget_usd)} per {period or 'month'}) is smaller than one request's worst case: a "
        f"request to {case.model} that sets no max_tokens reserves its output limit of {case.output_tokens:,} "
        f"tokens, {usd(case.cost_usd)}, so it is refused however little is spent. Clients of this key must set "
        f"max_tokens (at most {case.tokens_within(budget_usd):,} on {case.model}, less for a long prompt), or "
        f"the budget must be at least {usd(case.cost_usd)}."
    )


@dataclass(frozen=True)
class CreateOutcome:
    """What the Keys page shows after Create: the key (once) or why nothing was created, and a
    warning about a budget too small for one worst-case request."""

    ok: bool
    message: str
    key: str | None = None
    warning: str | None = None


def create_from_form(
    engine: Engine,
    *,
    name: str,
    models: list[str],
    rpm: int,
    tpm: int,
    budget_usd: float,
    period: str,
    actor: str,
    servable: list[str] | None = None,
) -> CreateOutcome:
    """The Keys page's Create: 0 means "no limit" for rpm, tpm and budget; an empty model list,
    every model (``servable``, for the budget's worst-case warning)."""
    try:
        record, key = create(
            engine,
            name.strip(),
            models=",".join(models) or None,
            rpm=rpm or None,
            tpm=tpm or None,
            budget_usd=budget_usd or None,
            period=period if budget_usd else None,
            created_by=actor or "dashboard",
        )
    except ValueError as exc:  # KeyValidationError, DuplicateKeyNameError: messages say how to fix
        return CreateOutcome(False, str(exc))
    return CreateOutcome(
        True,
        f"Created key '{record.name}'. Copy it now: it is shown only this once and cannot be retrieved.",
        key,
        budget_warning(record.budget_usd, record.period, list(record.models) or list(servable or [])),
    )


def revoke_from_form(engine: Engine, name: str | None) -> tuple[bool, str]:
    if not name:
        return False, "Choose a key to revoke."
    try:
        record = revoke(engine, name)
    except LookupError as exc:
        return False, str(exc)
    return True, f"Revoked '{record.name}'. Running servers refuse it within a few seconds."


def usage_lines(base_url: str) -> list[str]:
    """The curl and openai-SDK lines a newcomer needs for a first call."""
    return [
        f'curl {base_url}/chat/completions -H "Authorization: Bearer $GATEWAY_KEY" '
        '-H "Content-Type: application/json" '
        '-d \'{"model": "auto", "messages": [{"role": "user", "content": "hi"}]}\'',
        f'OpenAI(base_url="{base_url}", api_key=os.environ["GATEWAY_KEY"])',
    ]


def servable_models(settings: Settings) -> list[str]:
    """Every model a caller may name, in configuration order (the allow-list choices): the
    ``[routes]`` names, then every model some provider serves."""
    out: list[str] = list(settings.routes)
    for p in settings.providers.values():
        out += [m for m in p.models if m not in out]
    return out
