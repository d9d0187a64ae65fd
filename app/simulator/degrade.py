"""Answer-quality faults of a simulated chat answer: what a worse model does without failing a
request. Given the provider's fault settings and one request's draws, :func:`degrade` turns the
planned reply into a refusal (``content_filter``, no text), an empty answer, a truncated one
(``length``, half the text), breaks the JSON of its tool-call arguments, answers a json_schema
request with text that is not JSON, or repeats the text (verbosity). Time to first token is the
pacing's business (``ttft_multiplier`` in :mod:`app.simulator.server`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from app.simulator.generation import Reply, ToolCall
from core.faults import FaultSettings

NOT_JSON = "Sure! Here is the answer you asked for, as plain text rather than JSON."
DRAWS = 5  # per request: refusal, empty, truncation, tool JSON, schema


def degrade(
    reply: Reply, faults: FaultSettings, draws: Sequence[float], text_format: Mapping[str, Any] | None
) -> Reply:
    """``reply`` as the faults make it, one draw each (``draws`` of length :data:`DRAWS`)."""
    refuse, empty, truncate, tool_json, schema = draws
    if refuse < faults.refusal_rate:
        return replace(reply, text="", finish_reason="content_filter", tool_calls=())
    if empty < faults.empty_rate:
        return replace(reply, text="", finish_reason="stop", tool_calls=())
    if reply.tool_calls and tool_json < faults.tool_json_break_rate:
        broken = tuple(
            ToolCall(c.call_id, c.name, c.arguments[: max(1, len(c.arguments) // 2)]) for c in reply.tool_calls
        )
        reply = replace(reply, tool_calls=broken)
    wants_schema = bool(text_format) and text_format.get("type") == "json_schema"  # type: ignore[union-attr]
    if reply.text and wants_schema and schema < faults.schema_violation_rate:
        reply = replace(reply, text=NOT_JSON)
    if reply.text and faults.verbosity_multiplier > 1.0:
        reply = replace(reply, text=" ".join([reply.text] * max(1, round(faults.verbosity_multiplier))))
    if reply.text and truncate < faults.truncation_rate:
        reply = replace(reply, text=reply.text[: max(1, len(reply.text) // 2)], finish_reason="length")
    return reply
