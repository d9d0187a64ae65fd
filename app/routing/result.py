"""What a routed chat returns: the answer plus everything an operator wants to know about it.

Plain data, like the rest of the core: the upstream's answer is kept as JSON (``raw``). Its view as
the openai SDK's type (``result.completion``) is built by the I/O layer, which owns the SDK
(:mod:`app.routing.io.sdk` sets :data:`sdk_view` when the routing package is imported)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from core.errors import UpstreamError

T = TypeVar("T")

#: ``sdk_view(api, raw)``: an answer's JSON as the SDK's model of it; set by :mod:`app.routing.io.sdk`.
sdk_view: Callable[[str, dict], Any] | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # part of completion_tokens (OpenAI's completion_tokens_details)

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
    adjusted_params: tuple[str, ...] = ()  # what the provider's drop_params / rename_params changed
    upstream_error: dict | None = None  # the upstream's error object (cleaned), when it sent one
    retry_after_s: float | None = None  # the upstream's Retry-After, when it sent one


class Deferred(Generic[T]):
    """A value computed when first read (a stream's text and assembled answer: the server forwards
    the chunks and never reads either unless it stores the answer)."""

    __slots__ = ("_compute",)

    def __init__(self, compute: Callable[[], T]):
        self._compute = compute

    def __call__(self) -> T:
        return self._compute()


class _Resolved(Generic[T]):
    """A dataclass field that takes a value or a :class:`Deferred` one, computed on first read."""

    def __init__(self, default: Any = AttributeError, name: str = ""):
        self._default = default
        self._slot = "_" + name  # given where the dataclass sets the descriptor itself (``field()``)

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = "_" + name

    def __get__(self, obj: Any, owner: Any = None) -> T:
        if obj is None:  # the dataclass asks for the field's default
            if self._default is AttributeError:
                raise AttributeError(self._slot)
            return self._default
        value = obj.__dict__[self._slot]
        if isinstance(value, Deferred):
            value = value()
            obj.__dict__[self._slot] = value
        return value

    def __set__(self, obj: Any, value: T | Deferred[T]) -> None:
        if isinstance(value, _Resolved):  # a default given through ``field()`` arrives as the descriptor
            value = value._default
        obj.__dict__[self._slot] = value


@dataclass(frozen=True)
class ChatResult:
    # ``text`` and ``raw`` take a value or a :class:`Deferred` one (typed as the value they read as).
    if TYPE_CHECKING:
        text: str
    else:
        text: _Resolved[str] = _Resolved()
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
    api: str = "chat"  # chat | responses | embeddings | completions
    tool_call_count: int = 0
    #: The upstream's whole answer (JSON), ``model`` set to the routed model; for a chat stream, choice 0
    #: assembled from its chunks (text, tool calls, finish, usage); None for other streams.
    if TYPE_CHECKING:
        raw: dict | None = field(default=None, repr=False, compare=False)
    else:
        raw: _Resolved[dict | None] = field(default=_Resolved(None, "raw"), repr=False, compare=False)
    #: The upstream's rate-limit and processing-time headers, passed on by the server.
    upstream_headers: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def completion(self) -> Any:
        """The upstream's answer as the openai SDK's type (``ChatCompletion``, ``Response``,
        ``CreateEmbeddingResponse`` or ``Completion``), or None for a stream."""
        if self.raw is None:
            return None
        if sdk_view is None:
            raise RuntimeError("the SDK's types come with the routing package: import app.routing first")
        return sdk_view(self.api, self.raw)

    @property
    def tool_calls(self) -> list[Any]:
        """The first choice's tool calls (chat) or the function calls (Responses API), as SDK objects."""
        c = self.completion
        if c is None:
            return []
        if self.api == "chat":
            return list(c.choices[0].message.tool_calls or []) if c.choices else []
        if self.api == "responses":
            return [item for item in (c.output or []) if getattr(item, "type", None) == "function_call"]
        return []

    def to_dict(self) -> dict:
        d = asdict(replace(self, raw=None, upstream_headers={}))
        d.pop("raw", None)
        d.pop("upstream_headers", None)
        d["usage"]["total_tokens"] = self.usage.total_tokens
        d["tool_calls"] = [t.model_dump(mode="json") for t in self.tool_calls]
        return d


class AllRoutesFailed(UpstreamError):
    """Every route failed (or a request error stopped routing); names each attempt and its cause."""

    def __init__(self, request_id: str, attempts: list[AttemptInfo], reason: str = "all routes failed"):
        self.request_id = request_id
        self.attempts = attempts
        detail = "; ".join(f"#{a.number} {a.provider}/{a.model}: {a.error}" for a in attempts)
        super().__init__(f"{reason} (request {request_id}): {detail}")
