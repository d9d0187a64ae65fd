"""Model catalog and prices, loaded once from ``app/data/models.toml``.

Prices are USD per million tokens (input, cached input, output). ``cost_usd`` is the one place the
cost of a request is computed: uncached prompt tokens at the input price, cached prompt tokens at
the cached-input price, completion tokens at the output price.
"""

from __future__ import annotations

import tomllib
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.errors import InvalidRequest

CATALOG_FILE = Path(__file__).parent / "data" / "models.toml"
_PER_MILLION = Decimal(1_000_000)


class ModelInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    display: str
    input: Decimal = Field(ge=0)
    cached_input: Decimal = Field(ge=0)
    output: Decimal = Field(ge=0)
    context_tokens: int = Field(gt=0)
    # The most output one request can produce (the provider's documented limit): what a budget
    # holds for a request when nothing smaller is known (db.limits). None: bounded by the context.
    max_output_tokens: int | None = Field(default=None, ge=0)
    source: str
    kind: Literal["chat", "embedding"] = "chat"  # embedding models serve only the embeddings API


class UnknownModelError(InvalidRequest):
    """An explicit model name that is not in the catalog (refused before any network call)."""

    def __init__(self, model: str):
        self.model = model
        super().__init__(f"unknown model {model!r}; supported models: {', '.join(model_names())}")


@cache
def models() -> dict[str, ModelInfo]:
    with CATALOG_FILE.open("rb") as fh:
        raw = tomllib.load(fh)
    return {name: ModelInfo(name=name, **fields) for name, fields in raw["models"].items()}


def model_names() -> list[str]:
    return list(models())


def get(model: str) -> ModelInfo:
    try:
        return models()[model]
    except KeyError:
        raise UnknownModelError(model) from None


def output_limit(model: str) -> int:
    """The most completion tokens one answer of ``model`` can have (its output limit, else its context)."""
    info = get(model)
    return info.max_output_tokens if info.max_output_tokens is not None else info.context_tokens


def cost_usd(model: str, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
    """Cost of one request in USD, computed exactly in decimal and rounded to 1e-12 USD."""
    info = get(model)
    cached = min(max(cached_tokens, 0), prompt_tokens)
    total = (
        (prompt_tokens - cached) * info.input + cached * info.cached_input + completion_tokens * info.output
    ) / _PER_MILLION
    return float(round(total, 12))
