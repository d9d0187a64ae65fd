"""Fault injection settings of a simulated upstream.

The gateway config gives the starting values and the database overrides them at runtime, so an
operator can rehearse an outage from the dashboard. The simulator only reads a snapshot per
request; where the snapshot comes from is the caller's business.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FaultSettings", "effective_faults"]


class FaultSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    error_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of requests answered HTTP 500")
    rate_limit_rate: float = Field(0.0, ge=0.0, le=1.0, description="share answered HTTP 429")
    retry_after_s: float = Field(1.0, ge=0.0, description="Retry-After sent with a 429")
    timeout_rate: float = Field(0.0, ge=0.0, le=1.0, description="share that never answer in time")
    latency_multiplier: float = Field(1.0, gt=0.0, description="scales time to first token and generation")
    reject_cache_hints: bool = Field(False, description="answer 400 to requests carrying cache-hint headers")
    stream_break_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of streams cut after the first chunk")
    # What a model migration breaks without failing a request (chat completions): each a share of
    # the answers, which the canary analysis must catch side by side with the baseline.
    refusal_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of answers refused (content_filter)")
    truncation_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of answers cut short (length)")
    empty_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of answers with no content")
    tool_json_break_rate: float = Field(
        0.0, ge=0.0, le=1.0, description="share of tool-calling answers whose arguments are not valid JSON"
    )
    schema_violation_rate: float = Field(
        0.0, ge=0.0, le=1.0, description="share of json_schema answers that are not JSON"
    )
    verbosity_multiplier: float = Field(1.0, ge=1.0, le=20.0, description="answers this many times as long")
    ttft_multiplier: float = Field(1.0, gt=0.0, le=100.0, description="scales the time to first token only")

    #: The answer-quality faults, in the order the canary page shows them.
    QUALITY: ClassVar[tuple[str, ...]] = (
        "refusal_rate",
        "truncation_rate",
        "empty_rate",
        "tool_json_break_rate",
        "schema_violation_rate",
        "verbosity_multiplier",
        "ttft_multiplier",
    )


def effective_faults(stored: FaultSettings | None, configured: FaultSettings) -> FaultSettings:
    """The fault settings in force: the database's override when one is stored, else the config's.

    The one statement of that rule, for the simulator, the provider table and the canary page.
    """
    return stored if stored is not None else configured
