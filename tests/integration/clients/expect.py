"""What each target must show, shared by the client tests: the model name a client sees, and the
body the upstream must receive for what a client sent (the gateway's contract: the body as sent,
``model`` routed, and a stream always asking the upstream for its usage chunk)."""

from __future__ import annotations

from typing import Any

MODEL = "gpt-4.1"  # what the clients ask for; routed to itself (explicit intent)
SNAPSHOT = "gpt-4.1-2025-04-14"  # what a real upstream names in its answer


def answer_model(target: Any, upstream_model: str = SNAPSHOT) -> str:
    """The ``model`` the client must see: the routed model through the gateway, else the upstream's."""
    return MODEL if target.is_gateway else upstream_model


def forwarded(target: Any, sent: dict, path: str = "/v1/chat/completions") -> dict:
    """What the upstream must receive for the body ``sent`` to ``path``: the same, except that through
    the gateway a chat completions stream always asks for the usage chunk (withheld again from a client
    that did not ask). Other endpoints (the Responses API has no such option) are forwarded as sent."""
    want = dict(sent)
    if target.is_gateway and path.rstrip("/").endswith("/chat/completions") and sent.get("stream"):
        want["stream_options"] = {**(sent.get("stream_options") or {}), "include_usage": True}
    return want


def renamed(obj: Any, model: str) -> Any:
    """``obj`` with its ``model`` replaced (bodies without one are returned as they are)."""
    return {**obj, "model": model} if isinstance(obj, dict) and "model" in obj else obj
