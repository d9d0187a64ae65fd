"""How one request is to be routed, besides its body: the caller's model, session, stream, source,
forced side, cache hints, gateway key and forwardable headers. One frozen value that the public
APIs build from their keywords and that the drivers and the core pass on as it is, so adding a
routing option is one field here, not a keyword in every signature between the caller and
:meth:`app.routing.core.RoutingCore.plan`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from app.routing.canary import Side


@dataclass(frozen=True)
class RouteOptions:
    model: str | None = "auto"  # a model name, or "auto" (intent rules choose)
    session_id: str | None = None  # keeps the canary side sticky; sent upstream as the cache hint
    stream: bool = False
    source: str | None = None  # the request log's label (None: the client's own)
    route: Side | None = None  # force one side with no fallback (the playground's compare mode)
    canary_only: bool = False  # the model's route's canary deployment alone, no fallback (a shadow copy)
    cache_hints: bool = True
    key_name: str | None = None  # the server's gateway key, carried into the records
    headers: Mapping[str, str] | None = None  # the caller's headers, forwarded where allowed

    @classmethod
    def split(cls, params: Mapping[str, Any], **given: Any) -> tuple[RouteOptions, dict[str, Any]]:
        """``params`` (a public API's keywords) as these options and the rest (the API's body
        parameters); ``given`` are options the API takes by name (``model``, ``stream``)."""
        own = {k: v for k, v in params.items() if k in ROUTE_KEYWORDS}
        rest = {k: v for k, v in params.items() if k not in ROUTE_KEYWORDS}
        return cls(**given, **own), rest


ROUTE_KEYWORDS = frozenset(f.name for f in fields(RouteOptions))
