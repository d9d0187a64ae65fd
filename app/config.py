"""Typed settings: the gateway TOML file (``GATEWAY_CONFIG``) plus ``DATABASE_URL``.

Everything the product reads from its configuration goes through :func:`load_settings`, which
either returns a fully validated :class:`Settings` or raises one :class:`ConfigError` whose message
names the file, the key and what is allowed. API keys are never part of the settings: a provider
names the environment variable holding its key, and :func:`resolve_api_key` reads it when used.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import annotated_types
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from app import catalog, netconf
from app.netconf import NetConf
from core.bounds import BoundsError, parse_float, parse_int
from core.canary import GuardrailSettings as GuardrailConfig
from core.errors import ConfigurationError
from core.faults import FaultSettings

DEFAULT_CONFIG_PATH = "gateway.toml"
DEFAULT_DATA_DIR = "data"
SIM_SCHEME = "sim://"
INTENT_RULES_FILE = Path(__file__).parent / "data" / "intent_rules.toml"
# The simulator's latency_scale: 100x the profiles' latency is already minutes per answer.
MAX_LATENCY_SCALE = 100.0
# A provider's upstream connections per process: past max_in_flight's default, so by default the
# process-wide admission bound answers first; the wait for a slot is bounded (then 503).
# Fields of one connection (RFC 9110 7.6.1, 9112): the gateway's own connection to an upstream
# owns them, so a caller's are never forwarded.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "expect", "accept-encoding"}
)
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_POOL_TIMEOUT_S = 5.0


class ConfigError(ConfigurationError, ValueError):
    """A configuration problem, phrased for the operator: file, key, what is allowed."""


class ProviderNotConfigured(ConfigurationError, RuntimeError):
    """A real provider was used but the environment variable holding its key is unset."""

    def __init__(self, provider: str, env_var: str):
        self.provider = provider
        self.env_var = env_var
        super().__init__(f"provider {provider!r} not configured: set {env_var}")


class _Strict(BaseModel):
    # allow_inf_nan=False: every float setting is finite (TOML has ``inf`` and ``nan`` literals, and
    # ``flush_interval_s = inf`` once killed the writer thread). Upper bounds sit on each field.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        # Pydantic's lax mode reads ``true`` as 1 for a number field; a typo the operator must see.
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(v, bool) and field is not None and field.annotation in (int, float, int | None, float | None):
            raise ValueError("must be a number, not true/false")
        return v


ApiKind = Literal["chat", "responses", "embeddings", "completions"]
ALL_APIS: tuple[ApiKind, ...] = ("chat", "responses", "embeddings", "completions")


class ProviderConfig(_Strict):
    base_url: str
    api_key_env: str | None = None
    models: list[str] = Field(min_length=1)
    default_model: str
    timeout_s: float = Field(default=30.0, gt=0, le=600)
    # Upstream connections at once to this provider, per process (the async server's pool), and how
    # long a request waits for one before it gets 503 gateway_overloaded (the gateway's saturation,
    # never counted against the provider).
    max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, ge=1, le=65_536)
    pool_timeout_s: float = Field(default=DEFAULT_POOL_TIMEOUT_S, gt=0, le=600)
    # Attempts per request on this provider; 1 when the provider is itself a retrying gateway (a
    # LiteLLM proxy retries each call itself). Unset: [retry] max_attempts.
    max_attempts: int | None = Field(default=None, ge=1, le=10)
    # Initial fault injection for a simulated provider; the database overrides it at run time.
    faults: FaultSettings = FaultSettings()
    # The OpenAI APIs this provider serves; routing skips it for the others.
    apis: list[ApiKind] = Field(default_factory=lambda: list(ALL_APIS), min_length=1)
    # Request fields this upstream rejects: removed, or renamed (old -> new), before sending.
    drop_params: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=list, max_length=64)
    rename_params: dict[str, Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=dict)
    # Caller headers forwarded to this provider (lower case), e.g. "openai-organization".
    forward_headers: list[Annotated[str, Field(pattern=r"^[a-z0-9-]{1,64}$")]] = Field(default_factory=list)
    # How the upstream is reached: a proxy URL, or "none" for no proxy (unset: HTTPS_PROXY /
    # HTTP_PROXY / ALL_PROXY with NO_PROXY, as curl reads them); a private CA's PEM bundle (added to
    # the system's trust); a client certificate and its key for mutual TLS.
    proxy: str | None = None
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    @field_validator("proxy")
    @classmethod
    def _proxy_url(cls, v: str | None) -> str | None:
        if v is None or v == "none":
            return v
        if not v.startswith(("http://", "https://")):
            raise ValueError('must be "none" or an http:// or https:// proxy URL, e.g. http://proxy.internal:3128')
        _http_url(v)
        parts = urlsplit(v)
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("a proxy URL is scheme://[user:password@]host:port, with no path or query")
        return v

    @field_validator("ca_bundle", "client_cert", "client_key")
    @classmethod
    def _readable_file(cls, v: str | None) -> str | None:
        if v is None:
            return v
        path = Path(v).expanduser()
        if not path.is_file():
            raise ValueError(f"{v!r} is not a file")
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"{v!r} cannot be read: {exc.strerror}") from None
        if b"-----BEGIN " not in text:
            raise ValueError(f"{v!r} is not a PEM file (no -----BEGIN line)")
        return str(path)

    @field_validator("forward_headers", mode="before")
    @classmethod
    def _lower_headers(cls, v: object) -> object:
        return [h.lower() if isinstance(h, str) else h for h in v] if isinstance(v, list) else v

    @field_validator("forward_headers")
    @classmethod
    def _not_owned_headers(cls, v: list[str]) -> list[str]:
        owned = {"authorization", "host", "content-length", "content-type", "x-session-id", "x-cache-controls"}
        bad = sorted(set(v) & owned)
        if bad:
            raise ValueError(f"the gateway sets {', '.join(bad)} itself; it cannot be forwarded")
        hop = sorted(h for h in set(v) if h in HOP_BY_HOP or h.startswith("proxy-"))
        if hop:
            raise ValueError(f"{', '.join(hop)} belong(s) to one connection (hop-by-hop), never forwarded")
        twice = sorted({h for h in v if v.count(h) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed more than once (names are case-insensitive)")
        return v

    def net(self) -> NetConf:
        """The proxy and TLS settings this provider is reached with."""
        return netconf.resolve(
            self.base_url,
            proxy=self.proxy,
            ca_bundle=self.ca_bundle,
            client_cert=self.client_cert,
            client_key=self.client_key,
        )

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if v.startswith(SIM_SCHEME):
            if not v[len(SIM_SCHEME) :].strip("/"):
                raise ValueError("sim:// needs a name, e.g. sim://holysheep")
            return v
        _http_url(v)
        parts = urlsplit(v)
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not carry a user name or password (the key comes from api_key_env)")
        if parts.query or parts.fragment or v.endswith(("?", "#")):
            raise ValueError("must not have a query or fragment (e.g. https://api.example.com/v1)")
        return v.rstrip("/")

    @field_validator("models")
    @classmethod
    def _known_models(cls, v: list[str]) -> list[str]:
        known = catalog.model_names()
        unknown = [m for m in v if m not in known]
        if unknown:
            raise ValueError(f"unknown model(s) {', '.join(unknown)}; supported: {', '.join(known)}")
        return v

    @model_validator(mode="after")
    def _default_in_models(self) -> ProviderConfig:
        if self.default_model not in self.models:
            raise ValueError(f"default_model {self.default_model!r} must be one of models {self.models}")
        if not self.is_simulated and not self.api_key_env:
            raise ValueError("api_key_env is required for a non-simulated provider")
        if self.client_key and not self.client_cert:
            raise ValueError("client_key needs client_cert (the certificate it belongs to)")
        return self

    @property
    def is_simulated(self) -> bool:
        return self.base_url.startswith(SIM_SCHEME)

    @property
    def sim_name(self) -> str:
        return self.base_url[len(SIM_SCHEME) :].strip("/")


def _http_url(v: str) -> str:
    """``v`` if it is an http(s) URL with a host and a valid port, else ``ValueError``."""
    example = "e.g. https://api.example.com/v1 or sim://NAME"
    if not v.startswith(("http://", "https://")):
        raise ValueError(f"must start with sim://, http:// or https:// ({example})")
    if any(c.isspace() for c in v):
        raise ValueError(f"must not contain spaces ({example})")
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 - raises ValueError for a port outside 0..65535 or not a number
    except ValueError:
        raise ValueError(f"is not a valid URL ({example})") from None
    if not parts.hostname:
        raise ValueError(f"needs a host name ({example})")
    return v


def _known_model(v: str) -> str:
    if v not in catalog.model_names():
        raise ValueError(f"unknown model {v!r}; supported: {', '.join(catalog.model_names())}")
    return v


KnownModel = Annotated[str, AfterValidator(_known_model)]


class IntentRule(_Strict):
    """One intent rule: it matches when any keyword or any regular expression is found in what the
    user wrote (see :mod:`app.routing.intent`). Patterns are checked here, at load."""

    intent: str = Field(min_length=1)
    model: KnownModel
    keywords: list[Annotated[str, Field(min_length=1)]] = []
    patterns: list[str] = []

    @field_validator("patterns")
    @classmethod
    def _valid_patterns(cls, v: list[str]) -> list[str]:
        for pattern in v:
            try:
                compiled = re.compile(pattern, re.IGNORECASE)
            except re.error as exc:
                raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None
            # A pattern that matches the empty string matches every prompt and would swallow the
            # rules after it.
            if compiled.search("") is not None:
                raise ValueError(f"pattern {pattern!r} matches the empty string, so it would match every prompt")
        return v

    @model_validator(mode="after")
    def _something_to_match(self) -> IntentRule:
        if not self.keywords and not self.patterns:
            raise ValueError(f"rule {self.intent!r} needs at least one of keywords or patterns")
        return self


class IntentConfig(_Strict):
    chars_per_token: int = Field(default=4, ge=1, le=100)
    long_context_tokens: int = Field(default=8000, ge=1, le=10_000_000)
    long_context_model: KnownModel = "claude-sonnet-4-20250514"
    default_model: KnownModel = "gemini-2.5-flash"
    rules: list[IntentRule] = []


class SubstitutionConfig(_Strict):
    """``[routing.substitution]``: when a provider that does not serve the chosen model may answer
    with its default model instead (see :mod:`app.routing.substitution`)."""

    # The one setting where inf is meaningful (``max_price_factor = inf``: no price cap); nan is
    # still refused by its lower bound.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=True)

    mode: Literal["route", "substitute", "refuse"] = "route"
    # Blended price (input + output per M tokens) of the substitute over the chosen model's.
    max_price_factor: float = Field(default=1.5, ge=1.0)


class RoutingConfig(_Strict):
    primary: str
    fallback: str
    initial_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    fallback_enabled: bool = True
    # How old the cached canary ratio may get before a router re-reads it from the database.
    ratio_refresh_s: float = Field(default=0.5, gt=0, le=1.0)
    substitution: SubstitutionConfig = SubstitutionConfig()


class RetryConfig(_Strict):
    max_attempts: int = Field(default=3, ge=1, le=10)  # per provider
    base_delay_s: float = Field(default=0.25, ge=0, le=60)
    max_delay_s: float = Field(default=8.0, ge=0, le=600)
    max_total_wait_s: float = Field(default=20.0, ge=0, le=3600)  # all backoff sleeps of one request
    retry_after_cap_s: float = Field(default=10.0, ge=0, le=3600)  # a server's Retry-After is capped here
    long_prompt_tokens: int = Field(default=8000, ge=1, le=10_000_000)  # prompts above this get long_timeout_s
    long_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    timeout_per_1k_tokens_s: float = Field(default=1.0, ge=0, le=600)  # timeout grows with prompt size
    # One request ends within this, whatever the upstreams do: all attempts, backoff and fallback.
    request_deadline_s: float = Field(default=120.0, gt=0, le=3600)
    # A stream that sends nothing for this long (after its first token) is cut.
    stream_idle_timeout_s: float = Field(default=30.0, gt=0, le=600)
    # The most an upstream may send for one attempt (body bytes, streamed or not); more fails over.
    max_response_bytes: int = Field(default=32 * 1024 * 1024, ge=64 * 1024, le=1024 * 1024 * 1024)


class BreakerConfig(_Strict):
    """Circuit breaker per provider (see :mod:`app.routing.breaker`)."""

    enabled: bool = True
    window_s: int = Field(default=30, ge=1, le=3600)  # sliding window of attempt outcomes
    min_attempts: int = Field(default=10, ge=1, le=1_000_000)  # in the window before it may open
    failure_rate: float = Field(default=0.5, gt=0, le=1)  # share of provider-health failures that opens it
    cooldown_s: float = Field(default=15.0, gt=0, le=3600)  # open this long, then one probe


STRATEGIES = ("weighted", "ordered", "least_busy", "lowest_latency", "cheapest")
_ROUTE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$"  # what a caller may send as "model"


class DeploymentConfig(_Strict):
    """One deployment of a route: a provider and the model name sent to it."""

    provider: str
    # The model sent upstream (an Azure deployment name, a vLLM served name); default: the route's name.
    model: str | None = Field(default=None, min_length=1, max_length=128)
    # The catalog model whose prices and context window this deployment has; default: ``model`` when
    # the catalog knows it, else the route's name.
    price_as: str | None = None
    weight: float = Field(default=1.0, ge=0, le=1_000_000)
    rpm: int | None = Field(default=None, ge=1, le=100_000_000)  # the deployment's own rate limits, if known
    tpm: int | None = Field(default=None, ge=1, le=100_000_000_000)


class RouteConfig(_Strict):
    """``[routes."NAME"]``: a model name callers send, served by several deployments (see
    :mod:`app.routing.routes`)."""

    strategy: Literal["weighted", "ordered", "least_busy", "lowest_latency", "cheapest"] = "weighted"
    deployments: list[DeploymentConfig] = Field(min_length=1, max_length=64)
    fallbacks: list[str] = []  # other routes, in order, when every deployment failed
    context_window_fallbacks: list[str] = []  # when the prompt is longer than the deployments' windows
    content_policy_fallbacks: list[str] = []  # when an upstream refuses on content policy
    allowed_fails: int = Field(default=3, ge=1, le=1000)  # failures in a row before a deployment sits out
    cooldown_s: float = Field(default=30.0, gt=0, le=3600)
    # A deployment that gets the route's canary share (``canary set --route NAME``); the rest goes to
    # ``deployments``.
    canary: DeploymentConfig | None = None

    @property
    def every_deployment(self) -> tuple[DeploymentConfig, ...]:
        """Its deployments and its canary deployment, if it has one."""
        return (*self.deployments, *((self.canary,) if self.canary else ()))


class TelemetryConfig(_Strict):
    # Spill journal for records the database cannot take yet; one subdirectory per database URL.
    # Unset: a "journal" directory next to the SQLite file, or data/journal for PostgreSQL.
    journal_dir: str | None = None
    store_prompts: bool = False  # opt-in: prompt text is not stored by default
    queue_size: int = Field(default=10_000, ge=1, le=10_000_000)
    batch_size: int = Field(default=500, ge=1, le=100_000)
    flush_interval_s: float = Field(default=0.2, gt=0, le=60)


class SimulatorConfig(_Strict):
    # 0 = answer instantly (tests, benchmarks); the bound is the simulator's (1e300 overflowed a sleep).
    latency_scale: float = Field(default=1.0, ge=0, le=MAX_LATENCY_SCALE)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)


class DatabaseConfig(_Strict):
    """Bounded waits on the database (see :mod:`db.engine`): a hung database delays, never hangs."""

    connect_timeout_s: float = Field(default=5.0, gt=0, le=300)
    statement_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    lock_timeout_s: float = Field(default=10.0, gt=0, le=3600)


class DashboardRoles(_Strict):
    """Roles for identities from an OpenID Connect provider (``st.login``): a claim naming the role,
    else the lists below (matched against the e-mail, else the subject), else ``default``."""

    claim: str | None = None
    admins: list[str] = []
    operators: list[str] = []
    viewers: list[str] = []
    default: Literal["viewer", "operator", "admin"] = "viewer"


class ServerConfig(_Strict):
    # Browser origins allowed to call the server (CORS), e.g. "https://app.example.com"; none by default.
    cors_origins: list[Annotated[str, Field(pattern=r"^https?://[^/\s]+$")]] = Field(default_factory=list)
    cors_max_age_s: int = Field(default=600, ge=0, le=86400)
    # Routed requests one server process serves at once; above it, 503 gateway_overloaded with
    # Retry-After (admission before saturation). 0 turns the bound off.
    max_in_flight: int = Field(default=1024, ge=0, le=1_000_000)
    # Hostile connections (app/server/edge.py). A request head (request line and headers) larger
    # than max_header_bytes or with more than max_headers header lines: 431, connection closed.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    max_headers: int = Field(default=128, ge=8, le=10_000)
    # A head not complete this long after the connection opened (or its first byte arrived): 408, closed.
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    # Open connections per server process, kept below its open-file limit (raised to the hard limit
    # at start); at the bound the connection idle longest is closed to make room.
    max_connections: int = Field(default=8192, ge=16, le=1_000_000)
    # Keep-alive: idle seconds between requests (above the 5 s after which clients such as httpx and
    # the openai SDK drop an idle connection, so they, not the server, close it first) and requests
    # per connection before it is closed (0: no bound).
    keep_alive_s: float = Field(default=15.0, gt=0, le=3600)
    max_requests_per_connection: int = Field(default=1000, ge=0, le=1_000_000_000)


# How long a local-account sign-in survives reloads and new tabs (the session cookie's lifetime):
# 8 hours, one working shift; at least a minute, at most 30 days.
SESSION_TTL_DEFAULT_S = 8 * 3600.0
SESSION_TTL_MIN_S = 60.0
SESSION_TTL_MAX_S = 30 * 86400.0


class AlertsConfig(_Strict):
    """``[alerts]``: where rollout steps, pauses, aborts, completions, guardrail rollbacks and
    breaker openings are sent as JSON (a Slack-compatible ``text`` field included)."""

    webhooks: list[str] = Field(default_factory=list, max_length=20)
    timeout_s: float = Field(default=5.0, gt=0, le=60)  # one delivery attempt, connect to answer
    attempts: int = Field(default=3, ge=1, le=10)  # tries per event and URL, with a growing pause

    @field_validator("webhooks")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if len(url) > 2000 or not re.fullmatch(r"https?://[^/\s?#]+(/\S*)?", url):
                raise ValueError(f"{url[:100]!r} is not an http:// or https:// URL")
        return urls


class DashboardConfig(_Strict):
    refresh_s: float = Field(default=5.0, gt=0, le=3600)
    # A provider without a failed attempt this long is no longer failing: the Overview's incident
    # banner ends this long after the last failure (plus a refresh), unless a live process still
    # holds the provider's breaker open.
    incident_quiet_s: float = Field(default=30.0, gt=0, le=3600)
    session_ttl_s: float = Field(default=SESSION_TTL_DEFAULT_S, ge=SESSION_TTL_MIN_S, le=SESSION_TTL_MAX_S)
    roles: DashboardRoles = DashboardRoles()


class FileConfig(_Strict):
    """The TOML file as written by the operator."""

    routing: RoutingConfig
    providers: dict[str, ProviderConfig] = Field(min_length=1)
    intents: IntentConfig | None = None
    retry: RetryConfig = RetryConfig()
    breaker: BreakerConfig = BreakerConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    simulator: SimulatorConfig = SimulatorConfig()
    guardrail: GuardrailConfig = GuardrailConfig()
    dashboard: DashboardConfig = DashboardConfig()
    database: DatabaseConfig = DatabaseConfig()
    server: ServerConfig = ServerConfig()
    alerts: AlertsConfig = AlertsConfig()
    routes: dict[Annotated[str, Field(pattern=_ROUTE_NAME)], RouteConfig] = Field(default_factory=dict)
    database_url: str | None = None

    @model_validator(mode="after")
    def _routes_exist(self) -> FileConfig:
        for role in ("primary", "fallback"):
            name = getattr(self.routing, role)
            if name not in self.providers:
                raise ValueError(f"routing.{role} = {name!r} is not a provider; defined: {', '.join(self.providers)}")
        for name, route in self.routes.items():
            _check_route(name, route, self.providers, self.routes)
        return self


def deployment_model(route: str, d: DeploymentConfig) -> str:
    """The model name a deployment sends upstream."""
    return d.model or route


def deployment_catalog_model(route: str, d: DeploymentConfig) -> str | None:
    """The catalog model a deployment is priced as (None: the catalog knows none of its names)."""
    known = catalog.models()
    for name in (d.price_as, d.model, route):
        if name is not None and name in known:
            return name
    return None


def priced_as(settings: Settings, model: str) -> str:
    """The catalog model a name a caller sends is priced as before it is routed: a route's first
    deployment's (a route's name need not be in the catalog), else the name itself."""
    route = settings.routes.get(model)
    if route is None:
        return model
    return deployment_catalog_model(model, route.deployments[0]) or model


def _check_route(
    name: str, route: RouteConfig, providers: Mapping[str, ProviderConfig], routes: Mapping[str, RouteConfig]
) -> None:
    """A route's deployments name providers that serve their model, each priced by the catalog; its
    fallbacks name other routes."""
    where = f"routes.{name}"
    seen: set[tuple[str, str]] = set()
    deps = [(f"{where}.deployments[{i}]", d) for i, d in enumerate(route.deployments)]
    if route.canary is not None:
        deps.append((f"{where}.canary", route.canary))
    for at, d in deps:
        if d.provider not in providers:
            raise ValueError(f"{at}: provider {d.provider!r} is not defined; defined: {', '.join(providers)}")
        p = providers[d.provider]
        model = deployment_model(name, d)
        if (d.provider, model) in seen:
            raise ValueError(f"{at}: {d.provider} with model {model!r} is listed twice")
        seen.add((d.provider, model))
        if d.price_as is not None and d.price_as not in catalog.models():
            raise ValueError(f"{at}: price_as {d.price_as!r} is not in the catalog")
        if deployment_catalog_model(name, d) is None:
            raise ValueError(
                f"{at}: the catalog knows neither {model!r} nor {name!r}, so its cost is unknown; "
                f"set price_as to the catalog model it is billed as"
            )
        if model in catalog.models() and model not in p.models:
            raise ValueError(f"{at}: {d.provider} does not serve {model!r} (its models: {', '.join(p.models)})")
        if p.is_simulated and model not in p.models:
            raise ValueError(f"{at}: the simulated {d.provider} serves only {', '.join(p.models)}")
    if not any(d.weight > 0 for d in route.deployments) and route.strategy == "weighted":
        raise ValueError(f"{where}: every deployment has weight 0, so the weighted strategy has nothing to pick")
    for kind in ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks"):
        for target in getattr(route, kind):
            if target == name:
                raise ValueError(f"{where}.{kind}: a route cannot fall back to itself")
            if target not in routes:
                raise ValueError(f"{where}.{kind}: {target!r} is not a route; routes: {', '.join(routes)}")


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    config_path: str
    database_url: str
    routing: RoutingConfig
    providers: dict[str, ProviderConfig]
    intents: IntentConfig
    retry: RetryConfig
    telemetry: TelemetryConfig
    simulator: SimulatorConfig
    guardrail: GuardrailConfig
    dashboard: DashboardConfig
    database: DatabaseConfig = DatabaseConfig()
    breaker: BreakerConfig = BreakerConfig()
    server: ServerConfig = ServerConfig()
    alerts: AlertsConfig = AlertsConfig()
    routes: dict[str, RouteConfig] = {}

    @property
    def primary(self) -> ProviderConfig:
        return self.providers[self.routing.primary]

    @property
    def fallback(self) -> ProviderConfig:
        return self.providers[self.routing.fallback]


def _format_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-")))


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """Walk the model tree along ``loc`` to the model that holds ``loc[-1]``."""
    current: Any = model
    for part in loc[:-1]:
        field = current.model_fields.get(str(part)) if current is not None else None
        if field is None:
            continue  # a dict key or list index: stay on the element model
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]  # X, dict[str, X], list[X], X | None
        models = [a for a in candidates if isinstance(a, type) and issubclass(a, BaseModel)]
        current = models[0] if models else None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed beside the bad key at ``loc``."""
    current = _model_at(model, loc)
    return list(current.model_fields) if current is not None else []


# Pydantic's refusals of a number: its message names one side; ours names the whole allowed range.
_NUMBER_ERRORS = frozenset(
    {
        *("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"),
        *("float_parsing", "float_type", "int_parsing", "int_parsing_size", "int_from_float", "int_type"),
    }
)


def _range_message(model: type[BaseModel], loc: tuple[Any, ...], key: str, raw: object) -> str | None:
    """``KEY must be a number from LO to HI, got RAW`` for a numeric field, from its Field bounds."""
    holder = _model_at(model, loc)
    field: FieldInfo | None = holder.model_fields.get(str(loc[-1])) if holder is not None and loc else None
    if field is None:
        return None
    bounds: dict[str, Any] = {}
    for m in field.metadata:
        if isinstance(m, annotated_types.Ge):
            bounds.update(lo=m.ge)
        elif isinstance(m, annotated_types.Gt):
            bounds.update(lo=m.gt, lo_open=True)
        elif isinstance(m, annotated_types.Le):
            bounds.update(hi=m.le)
        elif isinstance(m, annotated_types.Lt):
            bounds.update(hi=m.lt, hi_open=True)
    try:
        if field.annotation in (int, int | None) and not bounds.get("lo_open") and not bounds.get("hi_open"):
            parse_int(raw, field=key, lo=bounds.get("lo"), hi=bounds.get("hi"))  # type: ignore[arg-type]
        else:
            parse_float(raw, field=key, **bounds)  # type: ignore[arg-type]
    except BoundsError as exc:
        return str(exc)
    return None


def _explain(path: str, exc: ValidationError, prefix: tuple[str, ...] = ()) -> ConfigError:
    lines = []
    for err in exc.errors():
        loc = (*prefix, *err["loc"])
        key = _format_loc(loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            root: type[BaseModel] = IntentConfig if prefix else FileConfig
            allowed = _allowed_keys(root, loc[len(prefix) :])
            lines.append(f"{path}: {key}: unknown key; allowed: {', '.join(allowed)}")
        elif err["type"] == "missing":
            lines.append(f"{path}: {key}: required key is missing")
        elif err["type"] in _NUMBER_ERRORS and (
            message := _range_message(IntentConfig if prefix else FileConfig, loc[len(prefix) :], key, err.get("input"))
        ):
            lines.append(f"{path}: {message}")
        elif not loc:  # a check across tables (routes naming providers): the message names its key
            lines.append(f"{path}: {err['msg'].removeprefix('Value error, ')}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{path}: {key}: {msg} (got {err.get('input')!r})")
    return ConfigError("; ".join(lines))


def _default_database_url(base_dir: Path) -> str:
    data_dir = base_dir / DEFAULT_DATA_DIR
    return f"sqlite:///{(data_dir / 'gateway.db').resolve()}"


def _load_intents(path: str, raw: Mapping[str, Any] | None) -> IntentConfig:
    if raw is not None:
        try:
            return IntentConfig.model_validate(raw)
        except ValidationError as exc:
            raise _explain(path, exc, prefix=("intents",)) from None
    with INTENT_RULES_FILE.open("rb") as fh:
        return IntentConfig.model_validate(tomllib.load(fh))


def lookup(
    name: str,
    env: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    file_value: str | None = None,
    default: str | None = None,
) -> str | None:
    """The one precedence rule for every setting read by name: the environment, then the Streamlit
    secrets, then the config file, then the default (an empty value counts as unset)."""
    env = os.environ if env is None else env
    for value in (env.get(name), (secrets or {}).get(name), file_value, default):
        if value:
            return value
    return None


def _masked(url: str) -> str:
    """``url`` as an error may show it: the query dropped and any password replaced by ``***``."""
    shown = re.sub(r"(://[^:/@?#]*:)[^@/?#]*@", r"\1***@", url.split("?", 1)[0])
    return shown if len(shown) <= 200 else shown[:200] + "..."


def check_database_url(url: str):
    """Parse ``url`` as the database URL (no connection is made): a :class:`ConfigError` naming
    ``DATABASE_URL`` with a ``Fix:`` when it cannot be, e.g. a port that is not a number (SQLAlchemy's
    own error is Python's "invalid literal for int()"). Returns SQLAlchemy's ``URL``."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    fix = "Fix: e.g. postgresql+psycopg://user:password@127.0.0.1:5432/gateway or sqlite:///data/gateway.db"
    port = re.search(r"://(?:[^@/?#]*@)?(?:\[[^\]]*\]|[^:/?#@]*):([^/?#@]+)(?=[/?#]|$)", url)
    given = port.group(1) if port is not None else ""
    if given and not (given.isascii() and given.isdigit()):
        raise ConfigError(f"DATABASE_URL: port {given[:20]!r} is not a number (in {_masked(url)!r}); {fix}")
    if given and (len(given) > 5 or not 0 < int(given) < 65536):
        raise ConfigError(f"DATABASE_URL: port {given[:20]} is out of range 1-65535 (in {_masked(url)!r}); {fix}")
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ConfigError(f"DATABASE_URL: not a valid database URL (got {_masked(url)!r}); {fix}") from None
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise ConfigError(f"DATABASE_URL: port {parsed.port} is out of range 1-65535 (in {_masked(url)!r}); {fix}")
    return parsed


def _shared_database(url: str) -> None:
    """Refuse a SQLite database that lives in one connection's memory: the telemetry writer's thread,
    the refresher and the request path each connect on their own, so they would each see a different,
    empty database (the writer then retries 'no such table' for ever)."""
    parsed = check_database_url(url)
    if not url.startswith("sqlite:"):
        return
    database = parsed.database or ""
    in_memory = not database or database == ":memory:" or database.startswith("file::memory:")
    if in_memory or parsed.query.get("mode") == "memory":
        raise ConfigError(
            f"DATABASE_URL: {url!r} is an in-memory SQLite database, which each connection sees empty; "
            "Fix: use a file, e.g. sqlite:///data/gateway.db"
        )


def load_settings(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
) -> Settings:
    """Read and validate the configuration; raise :class:`ConfigError` with a clear message.

    ``GATEWAY_CONFIG`` and ``DATABASE_URL`` follow :func:`lookup`'s precedence; an explicit
    ``path`` wins over ``GATEWAY_CONFIG``.
    """
    env = os.environ if env is None else env
    cfg_path = Path(path if path is not None else lookup("GATEWAY_CONFIG", env, secrets) or DEFAULT_CONFIG_PATH)
    shown = str(cfg_path)
    try:
        with cfg_path.open("rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{shown}: configuration file not found (set GATEWAY_CONFIG to its path)") from None
    except IsADirectoryError:
        raise ConfigError(f"{shown}: is a directory, expected a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{shown}: not valid TOML: {exc}") from None

    intents_raw = raw.pop("intents", None)
    try:
        file_cfg = FileConfig.model_validate(raw)
    except ValidationError as exc:
        raise _explain(shown, exc) from None
    intents = _load_intents(shown, intents_raw)

    database_url = lookup("DATABASE_URL", env, secrets, file_cfg.database_url) or _default_database_url(Path.cwd())
    if not database_url.startswith(("sqlite:", "postgresql")):
        raise ConfigError(
            f"DATABASE_URL: unsupported database {database_url.split(':', 1)[0]!r}; "
            "use sqlite:///path/to/file.db or postgresql+psycopg://user:pass@host/db"
        )
    _shared_database(database_url)
    return Settings(
        config_path=str(cfg_path.resolve()),
        database_url=database_url,
        routing=file_cfg.routing,
        providers=file_cfg.providers,
        intents=intents,
        retry=file_cfg.retry,
        telemetry=file_cfg.telemetry,
        simulator=file_cfg.simulator,
        guardrail=file_cfg.guardrail,
        dashboard=file_cfg.dashboard,
        database=file_cfg.database,
        breaker=file_cfg.breaker,
        server=file_cfg.server,
        alerts=file_cfg.alerts,
        routes=file_cfg.routes,
    )


KeyState = Literal["simulated", "set", "missing"]


def resolve_api_key(
    name: str, provider: ProviderConfig, env: Mapping[str, str] | None = None, secrets: Mapping[str, str] | None = None
) -> str:
    """The provider's API key, read when used: from the environment, or the UI's secrets.

    Simulated providers need none. A missing key raises :class:`ProviderNotConfigured`.
    """
    if provider.is_simulated:
        return "sim"
    var = provider.api_key_env or ""
    key = lookup(var, env, secrets)
    if not key:
        raise ProviderNotConfigured(name, var)
    return key


def key_state(
    provider: ProviderConfig, env: Mapping[str, str] | None = None, secrets: Mapping[str, str] | None = None
) -> KeyState:
    """``simulated``, ``set`` or ``missing``: what the UI may show about a key (never the key)."""
    if provider.is_simulated:
        return "simulated"
    return "set" if lookup(provider.api_key_env or "", env, secrets) else "missing"
