"""Routing: canary split, intent rules and the RoutingClient (retries, fallback, hints, streaming)."""

from app.catalog import UnknownModelError
from app.config import ProviderNotConfigured
from app.routing.errors import BadResponse, ClientClosedError, StreamBrokenError
from app.routing.io.client import ChatStream, RoutingClient, validate_messages
from app.routing.options import RouteOptions
from app.routing.result import AllRoutesFailed, AttemptInfo, ChatResult, Usage
from core.errors import GatewayError

__all__ = [
    "AllRoutesFailed",
    "AttemptInfo",
    "BadResponse",
    "ChatResult",
    "ChatStream",
    "ClientClosedError",
    "GatewayError",
    "ProviderNotConfigured",
    "RouteOptions",
    "RoutingClient",
    "StreamBrokenError",
    "UnknownModelError",
    "Usage",
    "validate_messages",
]
