"""Wire pieces shared by the simulator's endpoints: the pacing of one request, server-sent event
framing, the planned answer an endpoint hands back to ``SimulatedProvider``, and the checks of
request parameters every endpoint shares.

Endpoints build a :class:`Planned` answer without sleeping: a JSON body with the time it takes, or
a list of :class:`Frame` (bytes and the wait before them). ``SimulatedProvider`` does the waiting,
so decisions stay pure and the pacing and stream-break faults live in one place.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.simulator.errors import BadRequest, invalid

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "Frame",
    "Pace",
    "Planned",
    "check_bool",
    "check_int",
    "check_metadata",
    "check_model",
    "check_number",
    "check_object",
    "check_stop",
    "check_string",
    "dumps",
    "sse_data",
    "sse_event",
    "usage_counts",
]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class Pace:
    """Seconds to the first token and per further token for one request (jitter, the latency
    fault and ``latency_scale`` already applied)."""

    ttft_s: float
    per_token_s: float


@dataclass(frozen=True, slots=True)
class Frame:
    delay_s: float  # waited before ``data`` is sent
    data: bytes


@dataclass(frozen=True, slots=True)
class Planned:
    """An endpoint's answer before pacing: ``body`` after ``delay_s``, or streamed ``frames``."""

    body: Any = None
    delay_s: float = 0.0
    frames: Sequence[Frame] | None = None
    tokens: int = 0  # prompt + output tokens, for the rate-limit headers
    processing_ms: int = 0


# One encoder for every event: json.dumps with options builds a new encoder per call, which is
# most of a stream's cost at zero latency.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
dumps = _ENCODER.encode


def sse_data(payload: Any) -> bytes:
    """``data: JSON`` (chat and legacy completion streams; ``"[DONE]"`` as is)."""
    data = payload if isinstance(payload, str) else dumps(payload)
    return f"data: {data}\n\n".encode()


def sse_event(payload: Mapping[str, Any]) -> bytes:
    """``event: TYPE`` + ``data: JSON`` (Responses API streams)."""
    return f"event: {payload['type']}\ndata: {dumps(payload)}\n\n".encode()


# ---- parameter checks ---------------------------------------------------------------------------


def check_number(body: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(name, f"expected a number, but got {type(value).__name__} instead.", "invalid_type")
    if not low <= value <= high:
        raise BadRequest(
            400,
            f"Invalid '{name}': number must be between {low:g} and {high:g}, got {value}.",
            "invalid_value",
            name,
        )
    return float(value)


def check_int(body: Mapping[str, Any], name: str, low: int, high: int = INT64_MAX) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"expected an integer, but got {type(value).__name__} instead.", "invalid_type")
    if value < low:
        raise invalid(
            name,
            f"integer below minimum value. Expected a value >= {low}, but got {value} instead.",
            "integer_below_min_value",
        )
    if value > high:
        raise invalid(
            name,
            f"integer above maximum value. Expected a value <= {high}, but got {value} instead.",
            "integer_above_max_value",
        )
    return value


def check_bool(body: Mapping[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise invalid(name, f"expected a boolean, but got {type(value).__name__} instead.", "invalid_type")
    return value


def check_stop(body: Mapping[str, Any]) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise invalid("stop", "expected a string or an array of strings.", "invalid_type")
    if len(value) > 4:
        raise invalid(
            "stop",
            f"array too long. Expected an array with maximum length 4, but got {len(value)}.",
            "array_above_max_length",
        )
    return list(value)


def check_string(body: Mapping[str, Any], name: str, choices: Sequence[str] | None = None) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(name, f"expected a string, but got {type(value).__name__} instead.", "invalid_type")
    if choices is not None and value not in choices:
        listed = ", ".join(f"'{c}'" for c in choices)
        raise invalid(name, f"value must be one of {listed}, got '{value}'.")
    return value


def check_object(body: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise invalid(name, f"expected an object, but got {type(value).__name__} instead.", "invalid_type")
    return value


def check_metadata(body: Mapping[str, Any]) -> dict[str, str] | None:
    value = check_object(body, "metadata")
    if value is None:
        return None
    if len(value) > 16 or not all(
        isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in value.items()
    ):
        raise invalid("metadata", "at most 16 string keys (64 characters) with string values (512 characters).")
    return dict(value)


def check_model(body: Mapping[str, Any], models: Sequence[str]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest(400, "You must provide a model parameter.", "missing_required_parameter", "model")
    if model not in models:
        raise BadRequest(
            404, f"The model `{model}` does not exist or you do not have access to it.", "model_not_found", "model"
        )
    return model


def usage_counts(prompt: int, cached: int, completion: int, reasoning: int) -> dict[str, Any]:
    """Chat and legacy completion ``usage`` with every detail field OpenAI sends."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": reasoning,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
