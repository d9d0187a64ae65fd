"""The request record: one per attempt, as the router produces it and the log stores it.

Fields are only ever appended (positional construction and the journal's old lines keep working:
a journal line without a newer key replays with that field's default).
"""

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
    # What part of the OpenAI surface the request used. Embedding tokens are ``prompt_tokens`` of an
    # ``api == "embeddings"`` record (no separate field).
    api: str = "chat"  # chat | responses | embeddings | completions
    finish_reason: str | None = None  # the answer's finish reason (stop, length, tool_calls, ...)
    tool_calls: int = 0  # tool calls in the answer
    # completion_tokens_details.reasoning_tokens: already counted in completion_tokens (and costed
    # at the output price), kept apart to show how much of the output was thinking.
    reasoning_tokens: int = 0
    adjusted_params: str | None = None  # what a provider's drop_params / rename_params changed ("-a,b->c")
    # A request to a [routes] name: the route, the deployment tried ("provider/model") and why the
    # route's strategy put it there ("lowest_latency: azure-eu 180 ms < openai 420 ms").
    route: str | None = None
    deployment: str | None = None
    route_why: str | None = None
    # What a canary analysis judges an answer by (see core.quality): the model refused (a refusal, or
    # finish_reason content_filter); tool calls whose arguments are not valid JSON; the answer fails
    # the json_schema the caller asked for (None: none asked, or not judged); a stream's mean time
    # between output chunks.
    refused: bool = False
    tool_json_bad: int = 0
    schema_bad: bool | None = None
    chunk_gap_ms: float | None = None

    def to_tuple(self) -> tuple:
        """The row in :data:`FIELD_NAMES` order, for the driver's executemany."""
        values = [getattr(self, name) for name in FIELD_NAMES]
        if values[_ERROR_MESSAGE]:
            values[_ERROR_MESSAGE] = values[_ERROR_MESSAGE][:500]
        # The upstream names the finish reason: an unexpected long one must not get the whole row
        # rejected by the column's bound (PostgreSQL enforces it).
        if values[_FINISH_REASON]:
            values[_FINISH_REASON] = values[_FINISH_REASON][:FINISH_REASON_MAX]
        return tuple(values)


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(AttemptRecord))
_ERROR_MESSAGE = FIELD_NAMES.index("error_message")
_FINISH_REASON = FIELD_NAMES.index("finish_reason")
FINISH_REASON_MAX = 32  # request_log.finish_reason is varchar(32)
