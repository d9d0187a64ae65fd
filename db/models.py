"""SQLAlchemy 2 typed models: every table the product keeps.

Times are stored as UNIX epoch seconds (float) and rollup minutes as integer epoch seconds of the
minute's start: the same arithmetic works on SQLite and PostgreSQL and bucketing a window is an
integer division in SQL. No table has a column for API keys or request headers, and prompt text is
only written when the operator opts in (``telemetry.store_prompts``).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from core.histogram import N_BUCKETS

LATENCY_BUCKETS = [f"lat_b{i:02d}" for i in range(N_BUCKETS)]
TTFT_BUCKETS = [f"ttft_b{i:02d}" for i in range(N_BUCKETS)]
ROLLUP_KEY = ["minute", "provider", "model", "intent", "source", "side", "route"]
ROLLUP_SUMS = [
    "attempts",
    "requests",
    "errors",
    "request_errors",
    "fallbacks",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost_usd",
    "latency_sum_ms",
    "ttft_sum_ms",
    "ttft_count",
    # migration 0008: what the whole OpenAI surface does. Final requests per non-chat API (chat is
    # ``requests`` minus these, so rows from before 0008, all chat, need no backfill).
    "reasoning_tokens",
    "tool_calls",
    "responses_requests",
    "embeddings_requests",
    "completions_requests",
]
# API kind -> the rollup counter of its final requests (chat has none: see above).
API_REQUEST_COUNTERS = {
    "responses": "responses_requests",
    "embeddings": "embeddings_requests",
    "completions": "completions_requests",
}

# Bigint primary keys on PostgreSQL, but SQLite only autoincrements "INTEGER PRIMARY KEY".
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class RequestLog(Base):
    """One row per attempt (a request retried twice then served by the fallback has 3+ rows)."""

    __tablename__ = "request_log"
    # One row per (request, attempt): the batch insert skips rows already present, so a retried or
    # replayed batch never duplicates a row or its rollups (migration 0004). ts is part of the key
    # since 0012 because PostgreSQL partitions the table by day on ts and a unique index on a
    # partitioned table must hold the partition key; a replayed attempt carries its original ts,
    # so it hits the same key. The index's request_id prefix also serves lookups by request id.
    # On PostgreSQL the table is PARTITION BY RANGE (ts) without a primary key (see db/partitions.py);
    # ``id`` stays unique through its sequence.
    __table_args__ = (
        Index("ux_request_log_request_attempt_ts", "request_id", "attempt", "ts", unique=True),
        # The drill-down's newest attempts of a session: a range read, bounded by its LIMIT (0012).
        Index("ix_request_log_session_ts", "session_id", "ts"),
        # Substitutions are rare: a partial index lets the monitor sum a window's without a scan.
        Index(
            "ix_request_log_substituted_ts",
            "ts",
            sqlite_where=text("substituted IS 1"),
            postgresql_where=text("substituted IS true"),
        ),
        # The monitor's "failed requests" filter (migration 0011): failures are a small share of a
        # window, so a partial index keeps their pages and counts cheap and costs the writer little.
        Index(
            "ix_request_log_failed_ts",
            "ts",
            sqlite_where=text("status != 'ok'"),
            postgresql_where=text("status != 'ok'"),
        ),
        # The table's error-class filter (migration 0013): one class's failures of a window, newest
        # first, without walking the window's other failures.
        Index(
            "ix_request_log_failed_class_ts",
            "error_class",
            "ts",
            sqlite_where=text("status != 'ok'"),
            postgresql_where=text("status != 'ok'"),
        ),
        # The table's gateway-key filter (migration 0018): one key's rows of a window, newest first,
        # without walking the window's other rows; rows without a key are most rows and left out.
        Index(
            "ix_request_log_key_ts",
            "key_name",
            "ts",
            "id",
            sqlite_where=text("key_name IS NOT NULL"),
            postgresql_where=text("key_name IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float, index=True)  # attempt start, epoch seconds
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    requested_model: Mapped[str] = mapped_column(String(128))  # "auto" or the caller's model
    intent: Mapped[str] = mapped_column(String(32))
    side: Mapped[str] = mapped_column(String(16))  # canary side: primary | fallback
    status: Mapped[str] = mapped_column(String(16))  # ok | error
    http_status: Mapped[int | None] = mapped_column(Integer)
    error_class: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(String(500))
    latency_ms: Mapped[float] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    fallback: Mapped[bool] = mapped_column(Boolean, default=False)  # served by the fallback route
    final: Mapped[bool] = mapped_column(Boolean, default=True)  # last attempt of its request
    substituted: Mapped[bool] = mapped_column(Boolean, default=False)
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    source: Mapped[str] = mapped_column(String(32))  # playground | loadgen | api | cli ...
    session_id: Mapped[str | None] = mapped_column(String(128))
    prompt_text: Mapped[str | None] = mapped_column(Text)  # only with store_prompts = true
    key_name: Mapped[str | None] = mapped_column(String(64))  # gateway key (server requests), for spend per key
    answer_text: Mapped[str | None] = mapped_column(Text)  # successful answers, only with store_prompts = true
    # migration 0008; server defaults so rows written before it (all chat completions) read right.
    api: Mapped[str] = mapped_column(String(16), default="chat", server_default="chat")
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    tool_calls: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    reasoning_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # migration 0010: what a provider's drop_params / rename_params changed ("-a,b->c").
    adjusted_params: Mapped[str | None] = mapped_column(String(256))
    # migration 0015: the [routes] name, the deployment ("provider/model") and why it was chosen.
    route: Mapped[str | None] = mapped_column(String(128))
    deployment: Mapped[str | None] = mapped_column(String(200))
    route_why: Mapped[str | None] = mapped_column(String(200))
    # migration 0019: what the canary analysis judges answers by (core.quality).
    refused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    tool_json_bad: Mapped[int] = mapped_column(Integer, server_default="0")
    schema_bad: Mapped[bool | None] = mapped_column(Boolean)
    chunk_gap_ms: Mapped[float | None] = mapped_column(Float)


class _RollupColumns:
    """Counters of one time bucket and dimension combination (shared by the three resolutions).

    ``minute`` is the bucket's start in epoch seconds (a whole minute; for the 5-minute and hourly
    tables a multiple of 300 or 3600).
    """

    minute: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    provider: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    intent: Mapped[str] = mapped_column(String(32), primary_key=True)
    source: Mapped[str] = mapped_column(String(32), primary_key=True)
    side: Mapped[str] = mapped_column(String(16), primary_key=True)
    # migration 0016: the [routes] name (NO_ROUTE for the two-sided routing); with provider and
    # model it keys a route's deployment.
    route: Mapped[str] = mapped_column(String(128), primary_key=True, default="")

    attempts: Mapped[int] = mapped_column(BigInteger, default=0)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)  # final attempts
    errors: Mapped[int] = mapped_column(BigInteger, default=0)  # failed attempts
    request_errors: Mapped[int] = mapped_column(BigInteger, default=0)  # failed final attempts
    fallbacks: Mapped[int] = mapped_column(BigInteger, default=0)  # final attempts on fallback
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    latency_sum_ms: Mapped[float] = mapped_column(Float, default=0.0)
    ttft_sum_ms: Mapped[float] = mapped_column(Float, default=0.0)
    ttft_count: Mapped[int] = mapped_column(BigInteger, default=0)
    # migration 0008 (server default 0: buckets written before it had none of these)
    reasoning_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    tool_calls: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    responses_requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    embeddings_requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    completions_requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class RequestRollup(_RollupColumns, Base):
    """Per-minute aggregates; the monitor reads rollups, never the raw log."""

    __tablename__ = "request_rollup"


class RequestRollup5m(_RollupColumns, Base):
    """Five-minute aggregates, so a 24-hour chart sums 288 buckets instead of 1,440."""

    __tablename__ = "request_rollup_5m"


class RequestRollup1h(_RollupColumns, Base):
    """Hourly aggregates for the multi-day windows."""

    __tablename__ = "request_rollup_1h"


# Bucket span in seconds -> table. The writer keeps all three; a reader picks the coarsest table
# whose span divides its chart step.
ROLLUP_TABLES: dict[int, type[_RollupColumns]] = {60: RequestRollup, 300: RequestRollup5m, 3600: RequestRollup1h}

for _cls in ROLLUP_TABLES.values():
    for _col in LATENCY_BUCKETS + TTFT_BUCKETS:
        setattr(_cls, _col, mapped_column(_col, Integer, default=0, nullable=False))
del _cls, _col


def rollup_table_for(step_s: int):
    """The coarsest rollup table whose bucket span divides ``step_s`` (a whole number of minutes)."""
    for span in sorted(ROLLUP_TABLES, reverse=True):
        if step_s % span == 0:
            return ROLLUP_TABLES[span].__table__  # type: ignore[attr-defined]  # mapped subclasses
    raise ValueError(f"step must be a whole number of minutes, got {step_s} s")


# The failed attempts and the substituted requests by the columns the per-minute rollups do not
# carry (error class, model asked for), per minute and per hour (migration 0013). The monitor's
# error-class choices and substitution figures read these, never the raw log.
DETAIL_KEY = ["minute", "provider", "model", "requested_model", "intent", "source", "route"]
ERROR_ROLLUP_KEY = [*DETAIL_KEY, "error_class"]
ERROR_ROLLUP_SUMS = ["attempts", "requests"]
SUBSTITUTION_ROLLUP_KEY = DETAIL_KEY
SUBSTITUTION_ROLLUP_SUMS = ["requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd"]
NO_ERROR_CLASS = ""  # a failed attempt without a class (a key column cannot be NULL)
NO_ROUTE = ""  # the rollups' route of an attempt of the two-sided routing (request_log.route is NULL)


class _DetailKey:
    minute: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    provider: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    requested_model: Mapped[str] = mapped_column(String(128), primary_key=True)
    intent: Mapped[str] = mapped_column(String(32), primary_key=True)
    source: Mapped[str] = mapped_column(String(32), primary_key=True)
    route: Mapped[str] = mapped_column(String(128), primary_key=True, default="")  # migration 0016


class _ErrorRollupColumns(_DetailKey):
    """Failed attempts of one bucket and (provider, model, requested model, intent, source,
    error class): ``attempts`` failed attempts, ``requests`` failed final attempts."""

    error_class: Mapped[str] = mapped_column(String(64), primary_key=True)
    attempts: Mapped[int] = mapped_column(BigInteger, default=0)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)


class _SubstitutionRollupColumns(_DetailKey):
    """Final substituted requests of one bucket and (provider, model served, model asked for,
    intent, source), with their tokens and cost."""

    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)


class ErrorRollup(_ErrorRollupColumns, Base):
    __tablename__ = "request_error_rollup"


class ErrorRollup1h(_ErrorRollupColumns, Base):
    __tablename__ = "request_error_rollup_1h"


class SubstitutionRollup(_SubstitutionRollupColumns, Base):
    __tablename__ = "request_substitution_rollup"


class SubstitutionRollup1h(_SubstitutionRollupColumns, Base):
    __tablename__ = "request_substitution_rollup_1h"


# Bucket span in seconds -> table, for each family.
ERROR_ROLLUP_TABLES: dict[int, type[Base]] = {60: ErrorRollup, 3600: ErrorRollup1h}
SUBSTITUTION_ROLLUP_TABLES: dict[int, type[Base]] = {
    60: SubstitutionRollup,
    3600: SubstitutionRollup1h,
}


class CanarySetting(Base):
    """A canary ratio with a version for optimistic locking: the global one (row id 1, scope
    ``global``) and one per route that has a canary deployment (scope ``route:NAME``)."""

    __tablename__ = "canary_setting"
    __table_args__ = (UniqueConstraint("scope", name="uq_canary_setting_scope"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ratio: Mapped[float] = mapped_column(Float)
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(String(500))
    # migration 0015: "global" (row 1, the two-sided canary) or "route:NAME" (a route's canary).
    scope: Mapped[str] = mapped_column(String(140), default="global", server_default="global")


class CanaryAudit(Base):
    __tablename__ = "canary_audit"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    old_ratio: Mapped[float] = mapped_column(Float)
    new_ratio: Mapped[float] = mapped_column(Float)
    version: Mapped[int] = mapped_column(Integer)
    actor: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(String(500))
    scope: Mapped[str] = mapped_column(String(140), default="global", server_default="global")  # migration 0015


class Rollout(Base):
    """A progressive-delivery plan for one canary scope and where it stands (migration 0018).
    ``active_scope`` is ``scope`` while running or paused, NULL once ended: one active per scope."""

    __tablename__ = "rollout"
    __table_args__ = (UniqueConstraint("active_scope", name="uq_rollout_active_scope"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(140))
    active_scope: Mapped[str | None] = mapped_column(String(140))
    candidate: Mapped[str] = mapped_column(String(64))
    route: Mapped[str | None] = mapped_column(String(128))
    steps: Mapped[str] = mapped_column(String(400))  # percents, comma-separated: "1,5,10,25,50,100"
    bake_s: Mapped[float] = mapped_column(Float)
    min_samples: Mapped[int] = mapped_column(Integer)
    alpha: Mapped[float] = mapped_column(Float)
    dry_run: Mapped[bool] = mapped_column(Boolean)
    shadow_share: Mapped[float | None] = mapped_column(Float)
    shadow_budget_usd: Mapped[float | None] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16))  # running | paused | aborted | completed
    step_index: Mapped[int] = mapped_column(Integer)
    step_started_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float, index=True)
    started_by: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(String(500))
    updated_at: Mapped[float] = mapped_column(Float)
    last_reason: Mapped[str] = mapped_column(String(500))
    version: Mapped[int] = mapped_column(Integer)  # optimistic lock: every write names the one it read


class RolloutLease(Base):
    """Which process may act on rollouts, until when, and its fencing token: a counter raised on
    every change of holder, which every rollout write checks (migration 0018)."""

    __tablename__ = "rollout_lease"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    token: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[float] = mapped_column(Float)


class ShadowLog(Base):
    """One mirrored request's answer from a rollout's candidate in its shadow phase (migration
    0022): ``request_id`` is the baseline request it copies. Apart from ``request_log`` so that no
    figure of real traffic counts it."""

    __tablename__ = "shadow_log"
    __table_args__ = (Index("ix_shadow_log_rollout_id", "rollout_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    rollout_id: Mapped[int] = mapped_column(Integer)
    request_id: Mapped[str] = mapped_column(String(64))
    ts: Mapped[float] = mapped_column(Float)
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))
    error_class: Mapped[str | None] = mapped_column(String(64))
    latency_ms: Mapped[float] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    completion_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    tool_calls: Mapped[int] = mapped_column(Integer, server_default="0")
    cost_usd: Mapped[float] = mapped_column(Float, server_default="0")
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    refused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    tool_json_bad: Mapped[int] = mapped_column(Integer, server_default="0")
    schema_bad: Mapped[bool | None] = mapped_column(Boolean)
    stream: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))  # migration 0023
    chunk_gap_ms: Mapped[float | None] = mapped_column(Float)


class GuardrailSetting(Base):
    """Automatic rollback of the canary when the primary's error rate crosses a threshold."""

    __tablename__ = "guardrail_setting"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean)
    error_rate_threshold: Mapped[float] = mapped_column(Float)
    window_minutes: Mapped[int] = mapped_column(Integer)
    min_requests: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str] = mapped_column(String(128))


class SimFault(Base):
    """Run-time fault injection for one simulated provider (absent row = the config's values)."""

    __tablename__ = "sim_fault"

    provider: Mapped[str] = mapped_column(String(64), primary_key=True)
    error_rate: Mapped[float] = mapped_column(Float, default=0.0)
    rate_limit_rate: Mapped[float] = mapped_column(Float, default=0.0)
    retry_after_s: Mapped[float] = mapped_column(Float, default=1.0)
    timeout_rate: Mapped[float] = mapped_column(Float, default=0.0)
    latency_multiplier: Mapped[float] = mapped_column(Float, default=1.0)
    reject_cache_hints: Mapped[bool] = mapped_column(Boolean, default=False)
    stream_break_rate: Mapped[float] = mapped_column(Float, default=0.0)
    # migration 0020: answer-quality faults (core.faults.FaultSettings.QUALITY)
    refusal_rate: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    truncation_rate: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    empty_rate: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    tool_json_break_rate: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    schema_violation_rate: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    verbosity_multiplier: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    ttft_multiplier: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    updated_at: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str] = mapped_column(String(128))


class OpsEvent(Base):
    """Something an operator or the gateway did that explains a chart: a fault-injection change, a
    circuit-breaker transition. Canary changes and guardrail rollbacks live in ``canary_audit``."""

    __tablename__ = "ops_event"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(32))  # fault | breaker
    provider: Mapped[str | None] = mapped_column(String(64))
    detail: Mapped[str] = mapped_column(String(500))
    actor: Mapped[str] = mapped_column(String(128))


class BreakerHeartbeat(Base):
    """One gateway process's circuit breaker for one provider, as that process last reported it
    (migration 0014). Every process rewrites its rows every few seconds; a process whose
    ``beat_at`` is older than :data:`db.breakers.LIVE_S` stopped reporting (it exited, was killed,
    or lost the database) and no longer counts. A clean exit deletes its rows."""

    __tablename__ = "breaker_heartbeat"

    process: Mapped[str] = mapped_column(String(64), primary_key=True)  # random per process start
    provider: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # closed | open | half_open (as the process sees it now)
    since: Mapped[float | None] = mapped_column(Float)  # wall time of its last transition, when known
    beat_at: Mapped[float] = mapped_column(Float, index=True)
    pid: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(128))
    source: Mapped[str] = mapped_column(String(32))  # api | loadgen | dashboard | cli ...


class DeploymentCooldown(Base):
    """A route deployment cooling down in one gateway process (migration 0017), reported with that
    process's breaker heartbeat (:mod:`db.breakers`): only deployments cooling at the beat have a
    row, and a row beaten too long ago no longer counts."""

    __tablename__ = "deployment_cooldown"

    process: Mapped[str] = mapped_column(String(64), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(200), primary_key=True)  # "provider/model"
    until: Mapped[float] = mapped_column(Float)  # wall time its cooldown ends
    beat_at: Mapped[float] = mapped_column(Float, index=True)
    pid: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(128))
    source: Mapped[str] = mapped_column(String(32))


class DashboardUser(Base):
    """A local dashboard account (when no identity provider is configured): Argon2 hash only."""

    __tablename__ = "dashboard_user"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    password_hash: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(128))
    # Bumped by sign-out, a role change and a new password: every session token names the epoch it
    # was issued under, so one bump revokes all of the account's sessions (see app/sessions.py).
    session_epoch: Mapped[int] = mapped_column(Integer, server_default=text("0"), default=0)


class DashboardSecret(Base):
    """Server secrets generated once and kept in the database (the session-token signing key when
    none is configured), so every dashboard process on one database signs and verifies alike."""

    __tablename__ = "dashboard_secret"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Float)


class SigninThrottle(Base):
    """Failed sign-ins per account name, for the growing delay between tries."""

    __tablename__ = "signin_throttle"

    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer)
    last_failure: Mapped[float] = mapped_column(Float)
    blocked_until: Mapped[float] = mapped_column(Float)


class GatewayKey(Base):
    """A key for the gateway server's clients. Only a hash of the key is stored (see db/keys.py).

    Money is kept in integer micro-USD so budgets and the spend ledger add up exactly.
    """

    __tablename__ = "gateway_key"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # hex SHA-256 of the key
    key_prefix: Mapped[str] = mapped_column(String(16))  # first characters, for display only
    models: Mapped[str] = mapped_column(Text, default="")  # comma-separated; empty = every model
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(BigInteger)
    budget_micro_usd: Mapped[int | None] = mapped_column(BigInteger)
    budget_period: Mapped[str | None] = mapped_column(String(8))  # day | month
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(128))
    revoked_at: Mapped[float | None] = mapped_column(Float)


class GatewayKeyWindow(Base):
    """Requests and tokens of one key in one fixed one-minute window (rate limits)."""

    __tablename__ = "gateway_key_window"

    key_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    window_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch s, whole minute
    requests: Mapped[int] = mapped_column(Integer, default=0)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class GatewayKeySpend(Base):
    """Spend ledger of one key in one budget period: settled spend plus outstanding reservations."""

    __tablename__ = "gateway_key_spend"

    key_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    period_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch s, UTC day/month start
    spent_micro_usd: Mapped[int] = mapped_column(BigInteger, default=0)
    reserved_micro_usd: Mapped[int] = mapped_column(BigInteger, default=0)


class GatewayKeyReservation(Base):
    """One admitted request's estimate, settled exactly once with its real tokens and cost."""

    __tablename__ = "gateway_key_reservation"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # uuid4 hex
    key_id: Mapped[int] = mapped_column(BigInteger, index=True)
    window_start: Mapped[int] = mapped_column(BigInteger)
    period_start: Mapped[int | None] = mapped_column(BigInteger)  # None when the key has no budget
    est_tokens: Mapped[int] = mapped_column(BigInteger)
    est_micro_usd: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    settled_at: Mapped[float | None] = mapped_column(Float)
    actual_tokens: Mapped[int | None] = mapped_column(BigInteger)
    actual_micro_usd: Mapped[int | None] = mapped_column(BigInteger)
