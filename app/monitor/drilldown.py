"""The request drill-down: links to it, searches, and one request's story built from its attempt
rows (timeline with the wait before each retry, the API it used, finish reason, tool calls, tokens
with the reasoning share, cost, canary side, intent, substitution with its cost delta, the prompt
when stored).

Every string here that came from a caller or an upstream (session ids, error messages, prompts,
key names) is data: the page shows it as plain text, never as Markdown or HTML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from sqlalchemy import Engine

from app import catalog
from app.display.safe_text import inert
from app.monitor.export import time_utc
from app.monitor.levels import chosen_model
from db.drilldown import SEARCH_KINDS, Match, SearchError, find_requests, request_attempts

PAGE_PATH = "request"  # the drill-down page's URL path
GATEWAY = "gateway"  # the provider of a request the gateway refused itself (app.routing.core.GATEWAY)
# Query parameter per search kind: /request?id=..., /request?session=..., /request?key=...
PARAMS = {"request": "id", "session": "session", "key": "key"}
MAX_QUERY = 256
# How the request view names each API (request_log.api); an unknown value is shown as stored.
API_LABELS = {
    "chat": "chat completions",
    "responses": "responses",
    "embeddings": "embeddings",
    "completions": "completions (legacy)",
}


def api_label(api: str | None) -> str:
    """The operator-facing name of an ``api`` value (``None``: rows from before migration 0008, chat)."""
    return API_LABELS.get(api or "chat", str(api))


def request_link(request_id: str) -> str:
    """The drill-down page's address for one request (relative to the dashboard's root), for
    table links and the playground's answer."""
    return search_link("request", request_id)


def search_link(kind: str, value: str) -> str:
    """The drill-down page's address searching ``kind`` for ``value`` (URL-encoded: session ids
    may hold any Unicode)."""
    return f"/{PAGE_PATH}?" + urlencode({PARAMS[kind]: value})


def query_from_params(params: Mapping[str, str]) -> tuple[str, str] | None:
    """The search a URL asks for: ``(kind, value)`` from its query parameters, the first of
    ``id``, ``session``, ``key`` present; ``None`` when none is."""
    for kind in SEARCH_KINDS:
        value = params.get(PARAMS[kind])
        if value:
            return kind, str(value)[:MAX_QUERY]
    return None


@dataclass(frozen=True)
class Attempt:
    """One row of the timeline."""

    attempt: int
    time_utc: str
    provider: str
    model: str
    status: str
    error_class: str | None
    http_status: int | None
    latency_ms: float
    ttft_ms: float | None
    wait_before_ms: float | None  # since the previous attempt ended (the retry wait); None first
    fallback: bool
    error_message: str | None
    finish_reason: str | None = None
    adjusted_params: str | None = None  # the provider's drop_params / rename_params, as applied
    deployment: str | None = None  # a route's deployment ("provider/model")
    route_why: str | None = None  # why the route's strategy put it there


@dataclass(frozen=True)
class Why:
    """Why a request failed, for the top of its drill-down: the final error and where it happened."""

    error_class: str
    message: str
    http_status: int | None
    refused_by_gateway: bool  # before any provider was asked
    attempts: int
    last: str  # "provider / model" of the last attempt

    def markdown(self) -> str:
        """The alert's text; what came from the log (the message above all) is shown inert."""
        status = f" (HTTP {self.http_status})" if self.http_status else ""
        if self.refused_by_gateway:
            where = "Refused by the gateway itself, before any provider was asked."
        else:
            where = f"{self.attempts} attempt{'s' if self.attempts > 1 else ''} failed; the last at {inert(self.last)}."
        return f"**Failed: {inert(self.error_class)}**{status}: {inert(self.message)}  \n{where}"


@dataclass(frozen=True)
class RequestStory:
    """Everything the request view shows about one request."""

    request_id: str
    started_utc: str
    status: str  # of the final attempt
    provider: str
    model: str
    requested_model: str
    chosen_model: str | None
    intent: str
    side: str
    source: str
    stream: bool
    session_id: str | None
    key_name: str | None
    substituted: bool
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: float  # every attempt's cost
    substitution_delta_usd: float | None  # actual - the chosen model's price for the same tokens
    total_ms: float
    attempts: tuple[Attempt, ...]
    prompt_text: str | None
    answer_text: str | None = None
    api: str = "chat"  # chat | responses | embeddings | completions
    finish_reason: str | None = None  # of the final attempt
    tool_calls: int = 0  # in the final answer
    reasoning_tokens: int = 0  # part of completion_tokens
    route: str | None = None  # the [routes] name it went to (None: the two-sided routing)

    @property
    def embeddings(self) -> bool:
        return self.api == "embeddings"

    @property
    def refused_by_gateway(self) -> bool:
        """Refused before any provider was asked (a key, a limit, the routing policy)."""
        return self.provider == GATEWAY or self.intent == "refused"

    def why(self) -> Why | None:
        """Why the request failed (its final attempt's error), None when it did not."""
        if self.status != "error" or not self.attempts:
            return None
        last = self.attempts[-1]
        return Why(
            error_class=last.error_class or "error",
            message=last.error_message or "(no message logged)",
            http_status=last.http_status,
            refused_by_gateway=self.refused_by_gateway,
            attempts=len(self.attempts),
            last=f"{last.provider} / {last.model}",
        )

    def timeline_rows(self) -> list[dict]:
        routed = self.route is not None
        return [
            {
                "attempt": a.attempt,
                "time (UTC)": a.time_utc,
                "provider": a.provider,
                "model": a.model,
                **({"chosen because": a.route_why or ""} if routed else {}),
                "status": a.status,
                "error class": a.error_class,
                "HTTP status": a.http_status,
                "latency ms": a.latency_ms,
                "TTFT ms": a.ttft_ms,
                "wait before ms": a.wait_before_ms,
                "fallback route": a.fallback,
                "finish reason": a.finish_reason,
                "params changed": a.adjusted_params,
                "error": a.error_message,
            }
            for a in self.attempts
        ]

    def facts(self) -> list[dict]:
        """Name/value pairs for the summary table (values as text)."""

        def text(v) -> str:
            return "" if v is None else str(v)

        delta = self.substitution_delta_usd
        pairs = [
            ("request id", self.request_id),
            ("started", self.started_utc + " UTC"),
            ("status", self.status),
            self._outcome(),
            ("model asked for", self.requested_model),
            *([("route", self.route), ("strategy", self._strategy())] if self.route is not None else []),
            ("model chosen", text(self.chosen_model)),
            ("substituted", "yes" if self.substituted else "no"),
            ("substitution cost delta", "" if delta is None else f"{delta:+.6f} USD"),
            ("intent", self.intent),
            ("canary side", self.side),
            ("source", self.source),
            ("streamed", "yes" if self.stream else "no"),
            ("session id", text(self.session_id)),
            ("gateway key", text(self.key_name)),
            ("API", api_label(self.api)),
            *self._answer_facts(),
            ("cost", f"{self.cost_usd:.6f} USD"),
            ("attempts", str(len(self.attempts))),
            ("total time", f"{self.total_ms:,.0f} ms"),
        ]
        return [{"field": k, "value": v} for k, v in pairs]

    def _strategy(self) -> str:
        """How the route chose the deployment that answered (or was tried last)."""
        last = self.attempts[-1] if self.attempts else None
        return (last.route_why or "") if last is not None else ""

    def _outcome(self) -> tuple[str, str]:
        if self.status != "error":
            return ("answered by", f"{self.provider} / {self.model}")
        if self.refused_by_gateway:
            return ("refused by", "the gateway, before any provider was asked")
        return ("last tried", f"{self.provider} / {self.model}")

    def _answer_facts(self) -> list[tuple[str, str]]:
        # An embedding has input tokens only: no completion, finish reason or tool calls to show.
        if self.embeddings:
            return [("embedding tokens", f"{self.prompt_tokens:,}")]
        return [
            ("finish reason", self.finish_reason or ""),
            ("tool calls", f"{self.tool_calls:,}"),
            ("prompt tokens", f"{self.prompt_tokens:,}"),
            ("cached tokens", f"{self.cached_tokens:,}"),
            ("completion tokens", f"{self.completion_tokens:,}"),
            ("reasoning tokens", f"{self.reasoning_tokens:,} (included in completion tokens)"),
        ]


def story(rows: list[dict], intent_models: Mapping[str, str] | None = None) -> RequestStory | None:
    """Build the view of one request from its attempt rows (:func:`db.drilldown.request_attempts`)."""
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: (r["attempt"], r["ts"]))
    final = next((r for r in rows if r["final"]), rows[-1])
    attempts, prev_end = [], None
    for r in rows:
        start = float(r["ts"])
        attempts.append(
            Attempt(
                attempt=int(r["attempt"]),
                time_utc=time_utc(start),
                provider=r["provider"],
                model=r["model"],
                status=r["status"],
                error_class=r["error_class"],
                http_status=r["http_status"],
                latency_ms=float(r["latency_ms"]),
                ttft_ms=r["ttft_ms"],
                wait_before_ms=None if prev_end is None else max(0.0, (start - prev_end) * 1000.0),
                fallback=bool(r["fallback"]),
                error_message=r["error_message"],
                finish_reason=r.get("finish_reason"),
                adjusted_params=r.get("adjusted_params"),
                deployment=r.get("deployment"),
                route_why=r.get("route_why"),
            )
        )
        prev_end = start + float(r["latency_ms"]) / 1000.0
    chosen = chosen_model(final["requested_model"], final["intent"], intent_models or {})
    delta = None
    if final["substituted"] and chosen:
        try:
            delta = float(final["cost_usd"]) - catalog.cost_usd(
                chosen, final["prompt_tokens"], final["cached_tokens"], final["completion_tokens"]
            )
        except catalog.UnknownModelError:
            delta = None
    first = float(rows[0]["ts"])
    return RequestStory(
        request_id=final["request_id"],
        started_utc=time_utc(first),
        status=final["status"],
        provider=final["provider"],
        model=final["model"],
        requested_model=final["requested_model"],
        chosen_model=chosen,
        intent=final["intent"],
        side=final["side"],
        source=final["source"],
        stream=bool(final["stream"]),
        session_id=final["session_id"],
        key_name=final.get("key_name"),
        substituted=bool(final["substituted"]),
        prompt_tokens=int(final["prompt_tokens"] or 0),
        cached_tokens=int(final["cached_tokens"] or 0),
        completion_tokens=int(final["completion_tokens"] or 0),
        cost_usd=sum(float(r["cost_usd"] or 0.0) for r in rows),
        substitution_delta_usd=delta,
        total_ms=((prev_end or first) - first) * 1000.0,
        attempts=tuple(attempts),
        prompt_text=next((r.get("prompt_text") for r in rows if r.get("prompt_text")), None),
        answer_text=next((r.get("answer_text") for r in rows if r.get("answer_text")), None),
        api=final.get("api") or "chat",
        finish_reason=final.get("finish_reason"),
        tool_calls=int(final.get("tool_calls") or 0),
        reasoning_tokens=int(final.get("reasoning_tokens") or 0),
        route=next((r.get("route") for r in rows if r.get("route")), None),
    )


def load_story(engine: Engine, request_id: str, intent_models: Mapping[str, str] | None = None) -> RequestStory | None:
    """One request's view, ``None`` when no attempt of it is logged."""
    return story(request_attempts(engine, request_id), intent_models)


@dataclass(frozen=True)
class SearchResult:
    """What a search found, or why it could not run (``error``)."""

    kind: str
    value: str
    matches: tuple[Match, ...] = ()
    error: str | None = None

    def rows(self) -> list[dict]:
        return [
            {
                "open": request_link(m.request_id),
                "request id": m.request_id,
                "started (UTC)": time_utc(m.ts),
                "attempts": m.attempts,
                "status": m.status,
                "provider": m.provider,
                "model": m.model,
                "session id": m.session_id,
                "cost USD": m.cost_usd,
            }
            for m in self.matches
        ]


def search(engine: Engine, kind: str, value: str) -> SearchResult:
    """Run one search; a refused search comes back with ``error`` set (nothing raised)."""
    value = (value or "").strip()[:MAX_QUERY]
    try:
        return SearchResult(kind, value, tuple(find_requests(engine, kind, value)))
    except SearchError as exc:
        return SearchResult(kind, value, error=str(exc))
