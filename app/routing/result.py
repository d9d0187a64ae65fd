"""What a routed chat returns: the answer plus everything an operator wants to know about it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from core.errors import UpstreamError


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class AttemptInfo:
    number: int
    provider: str
    model: str
    status: str  # ok | error
    latency_ms: float
    error_class: str | None = None
    http_status: int | None = None
    error: str | None = None
    with_hints: bool = True
    ttft_ms: float | None = None  # streams: first token, from the caller's request
    attempt_ttft_ms: float | None = None  # streams: first token, from this attempt's start


@dataclass(frozen=True)
class ChatResult:
    text: str
    provider: str
    model: str
    requested_model: str
    intent: str
    side: str  # canary side the request was assigned to
    fallback_used: bool
    attempts: int
    latency_ms: float
    ttft_ms: float | None
    usage: Usage
    cost_usd: float
    request_id: str
    session_id: str | None = None
    substituted_model: bool = False
    finish_reason: str | None = None
    attempt_log: list[AttemptInfo] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["usage"]["total_tokens"] = self.usage.total_tokens
        return d


class AllRoutesFailed(UpstreamError):
    """Every route failed (or a request error stopped routing); names each attempt and its cause."""

    def __init__(self, request_id: str, attempts: list[AttemptInfo], reason: str = "all routes failed"):
        self.request_id = request_id
        self.attempts = attempts
        detail = "; ".join(f"#{a.number} {a.provider}/{a.model}: {a.error}" for a in attempts)
        super().__init__(f"{reason} (request {request_id}): {detail}")
