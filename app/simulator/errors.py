"""OpenAI-shaped error bodies of the simulator and the exception its endpoint code raises for them.

Endpoint modules raise :class:`BadRequest`; ``SimulatedProvider`` turns it into the JSON error
object real upstreams send (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["BadRequest", "error_body"]


def error_body(message: str, error_type: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class BadRequest(Exception):
    """A request the upstream refuses: ``status`` (400 or 404), OpenAI's ``code`` and ``param``."""

    def __init__(self, status: int, message: str, code: str | None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, "invalid_request_error", self.code, self.param)


def invalid(param: str, message: str, code: str = "invalid_value") -> BadRequest:
    """The usual 400 for one bad parameter, worded like OpenAI's ``Invalid 'param': ...``."""
    return BadRequest(400, f"Invalid '{param}': {message}", code, param)
