"""``POST /v1/embeddings`` of the simulator: deterministic unit vectors.

A vector is seeded by a hash of (model, input), so the same text always embeds the same way and
different texts almost never collide. ``dimensions`` shortens it the way OpenAI's
``text-embedding-3`` models do: the leading components, renormalised to unit length. Values are
float32, as OpenAI's are: ``encoding_format="base64"`` sends their little-endian bytes, and the
float list carries exactly the same numbers.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from app.simulator.errors import BadRequest, invalid
from app.simulator.tokens import tokenize
from app.simulator.wire import Pace, Planned, check_int, check_model, check_string

__all__ = ["DEFAULT_DIMENSIONS", "MAX_DIMENSIONS", "MAX_INPUTS", "embedding_vector", "plan_embeddings"]

DEFAULT_DIMENSIONS = 256
MAX_DIMENSIONS = 3072
MAX_INPUTS = 2048
MAX_TOKEN_ID = 2**31 - 1


def embedding_vector(model: str, text: str, dimensions: int) -> list[float]:
    """The unit-norm float32 vector of ``text`` under ``model``: the first ``dimensions``
    components of the text's full vector, renormalised."""
    digest = hashlib.sha256(f"{model}\x00{text}".encode("utf-8", "surrogatepass")).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    raw = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    # Round to float32, the precision OpenAI serves (and base64 carries).
    return list(struct.unpack(f"<{dimensions}f", struct.pack(f"<{dimensions}f", *(v / norm for v in raw))))


def _inputs(value: Any) -> list[tuple[str, int]]:
    """(text to embed, its token count) per input."""
    if isinstance(value, str):
        if not value:
            raise invalid(
                "input", "'$.input' is invalid. Please check the API reference: an empty string is not allowed."
            )
        return [(value, len(tokenize(value)) or 1)]
    if not isinstance(value, list) or not value:
        raise invalid(
            "input",
            "expected a string, an array of strings, or an array of token arrays (non-empty).",
            "invalid_type" if not isinstance(value, list) else "empty_array",
        )
    if len(value) > MAX_INPUTS:
        raise invalid(
            "input",
            f"array too long. Expected an array with maximum length {MAX_INPUTS}, but got {len(value)} instead.",
            "array_above_max_length",
        )
    if all(_is_token(v) for v in value):
        return [(" ".join(map(str, value)), len(value))]
    out: list[tuple[str, int]] = []
    for index, item in enumerate(value):
        if isinstance(item, str) and item:
            out.append((item, len(tokenize(item)) or 1))
        elif isinstance(item, list) and item and all(_is_token(v) for v in item):
            out.append((" ".join(map(str, item)), len(item)))
        else:
            raise invalid(
                f"input[{index}]", "expected a non-empty string or a non-empty array of token ids.", "invalid_type"
            )
    return out


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def plan_embeddings(body: Mapping[str, Any], *, models: Sequence[str], pace: Pace) -> Planned:
    """The answer to an embeddings request ``body``; raises ``BadRequest``."""
    model = check_model(body, models)
    if "input" not in body:
        raise BadRequest(400, "Missing required parameter: 'input'.", "missing_required_parameter", "input")
    inputs = _inputs(body["input"])
    dimensions = check_int(body, "dimensions", 1, MAX_DIMENSIONS) or DEFAULT_DIMENSIONS
    encoding = check_string(body, "encoding_format", ("float", "base64")) or "float"
    check_string(body, "user")
    data = []
    for index, (text, _) in enumerate(inputs):
        vector = embedding_vector(model, text, dimensions)
        embedding: Any = vector
        if encoding == "base64":
            embedding = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = sum(count for _, count in inputs)
    out = {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return Planned(body=out, delay_s=pace.ttft_s, tokens=tokens, processing_ms=round(pace.ttft_s * 1000))
