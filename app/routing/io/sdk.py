"""The openai SDK's shapes of the core's plain data, in one place: a provider's SDK client settings,
an :class:`~app.routing.core.UpstreamRequest` as the SDK's request options, and answers and stream
chunks as the SDK's types (``result.completion``, ``stream.chunks()``).

Importing this module gives :class:`~app.routing.result.ChatResult` its SDK view
(:data:`app.routing.result.sdk_view`): the core keeps answers as JSON and never imports the SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openai import RequestOptions
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from app.config import Settings, resolve_api_key
from app.routing import result
from app.routing.core import UpstreamRequest, upstream_base_url

_EVENT = TypeAdapter(ResponseStreamEvent)


def sdk_settings(
    settings: Settings, name: str, env: Mapping[str, str] | None, secrets: Mapping[str, str] | None
) -> dict[str, Any]:
    """How both drivers configure a provider's SDK client: its key (raises
    :class:`~app.config.ProviderNotConfigured` when unset), its base URL, its timeout, and no SDK
    retries (the routing policy retries). Their HTTP clients never follow redirects, so the key
    never leaves the configured host (a 3xx is a failure that fails over)."""
    p = settings.providers[name]
    return {
        "api_key": resolve_api_key(name, p, env, secrets),
        "base_url": upstream_base_url(p),
        "max_retries": 0,
        "timeout": p.timeout_s,
    }


def sdk_options(request: UpstreamRequest) -> RequestOptions:
    """An attempt's request as the SDK's ``client.post`` options: its timeout, the key as a bearer
    token, and the gateway's headers."""
    options: RequestOptions = {"timeout": request.timeout, "security": {"bearer_auth": True}}
    if request.headers:
        options["headers"] = request.headers
    return options


def sdk_chunk(api: str, chunk: dict) -> Any:
    """A stream chunk as the openai SDK's type (built unvalidated, as the SDK builds what it reads)."""
    if api == "responses":
        try:
            return _EVENT.validate_python(chunk)
        except ValueError:
            return chunk
    cls = Completion if api == "completions" else ChatCompletionChunk
    return cls.construct(**chunk)


def sdk_answer(api: str, raw: dict) -> Any:
    """A whole answer as the SDK's model; one the SDK's schema does not accept is still built
    (unvalidated, as the SDK itself builds what it reads)."""
    cls: Any = {"chat": ChatCompletion, "responses": Response, "embeddings": CreateEmbeddingResponse}.get(
        api, Completion
    )
    try:
        return cls.model_validate(raw)
    except ValueError:
        return cls.construct(**raw)


result.sdk_view = sdk_answer
