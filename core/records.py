"""The request record: one per attempt, as the router produces it and the log stores it."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    request_id: str
    attempt: int
    ts: float
    provider: str
    model: str
    requested_model: str
    intent: str
    side: str  # canary side the request was assigned to: primary | fallback
    status: str  # ok | error
    latency_ms: float
    http_status: int | None = None
    error_class: str | None = None
    error_message: str | None = None
    ttft_ms: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    fallback: bool = False
    final: bool = True
    substituted: bool = False
    stream: bool = False
    source: str = "api"
    session_id: str | None = None
    prompt_text: str | None = None
    key_name: str | None = None  # the gateway key that sent it (server requests only)
    answer_text: str | None = None  # the answer of a successful attempt, only with store_prompts

    def to_tuple(self) -> tuple:
        """The row in :data:`FIELD_NAMES` order, for the driver's executemany."""
        values = [getattr(self, name) for name in FIELD_NAMES]
        if values[_ERROR_MESSAGE]:
            values[_ERROR_MESSAGE] = values[_ERROR_MESSAGE][:500]
        return tuple(values)


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(AttemptRecord))
_ERROR_MESSAGE = FIELD_NAMES.index("error_message")
