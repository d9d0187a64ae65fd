"""``POST /v1/completions`` (the legacy text completion API) of the simulator, streamed or not.

``prompt`` is a string, a list of strings, or token arrays; each prompt gets ``n`` choices (index
``prompt * n + choice``). ``max_tokens`` defaults to 16, as on OpenAI; ``stop``, ``echo``,
``seed`` and ``logprobs`` (an integer, the legacy shape) are honoured.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.simulator.answers import Answer, compose_answer
from app.simulator.errors import BadRequest, invalid
from app.simulator.generation import pieces, token_logprobs
from app.simulator.prefix_cache import PrefixCache
from app.simulator.tokens import prompt_tokens, tokenize
from app.simulator.wire import (
    INT64_MAX,
    INT64_MIN,
    Frame,
    Pace,
    Planned,
    check_bool,
    check_int,
    check_model,
    check_number,
    check_object,
    check_stop,
    sse_data,
    usage_counts,
)

__all__ = ["DEFAULT_MAX_TOKENS", "plan_completions"]

DEFAULT_MAX_TOKENS = 16
MAX_PROMPTS = 2048


def _prompts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [" ".join(map(str, value))]
        if len(value) > MAX_PROMPTS:
            raise invalid(
                "prompt",
                f"array too long. Expected an array with maximum length {MAX_PROMPTS}.",
                "array_above_max_length",
            )
        out = []
        for item in value:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in item):
                out.append(" ".join(map(str, item)))
            else:
                raise invalid("prompt", "expected a string, an array of strings, or token arrays.", "invalid_type")
        return out
    if value is None:
        raise BadRequest(400, "Missing required parameter: 'prompt'.", "missing_required_parameter", "prompt")
    raise invalid("prompt", "expected a string, an array of strings, or token arrays.", "invalid_type")


def _legacy_logprobs(tokens: Sequence[str], top: int, salt: str, offset: int) -> dict[str, Any]:
    entries = token_logprobs(tokens, top, salt)
    offsets, at = [], offset
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": list(tokens),
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


def plan_completions(
    body: Mapping[str, Any],
    *,
    provider: str,
    models: Sequence[str],
    prefix_cache: PrefixCache,
    pace: Pace,
    compose: Callable[..., Answer] = compose_answer,
) -> Planned:
    """The answer to a legacy completion request ``body``; raises ``BadRequest``."""
    model = check_model(body, models)
    prompts = _prompts(body.get("prompt"))
    max_tokens = check_int(body, "max_tokens", 0)
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    n = check_int(body, "n", 1, 128) or 1
    best_of = check_int(body, "best_of", 1, 20)
    if best_of is not None and best_of < n:
        raise invalid("best_of", "'best_of' must be greater than or equal to 'n'.")
    top = check_int(body, "logprobs", 0, 5)
    echo = bool(check_bool(body, "echo"))
    seed = check_int(body, "seed", INT64_MIN, INT64_MAX)
    check_number(body, "temperature", 0, 2)
    check_number(body, "top_p", 0, 1)
    check_number(body, "presence_penalty", -2, 2)
    check_number(body, "frequency_penalty", -2, 2)
    stream = bool(check_bool(body, "stream"))
    options = check_object(body, "stream_options")
    if options is not None and not stream:
        raise BadRequest(
            400,
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "invalid_value",
            "stream_options",
        )
    stop = check_stop(body)

    choices: list[tuple[str, Answer, str]] = []  # (echoed prompt, answer, salt)
    prompt_total = cached = 0
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt}]
        tokens = prompt_tokens(messages)
        prompt_total += len(tokenize(prompt))
        cached += prefix_cache.lookup_and_insert(tokens)
        for choice in range(n):
            salt = "" if choice == 0 and seed is None else f"seed={seed}\x00n={choice}"
            answer = compose(provider, model, messages, tokens, max_tokens, salt=salt, stop=stop)
            choices.append((prompt if echo else "", answer, salt))
    completion = sum(len(tokenize(answer.text)) for _, answer, _ in choices)
    usage = usage_counts(prompt_total, cached, completion, 0)
    head = {
        "id": f"cmpl-sim-{uuid.uuid4().hex[:24]}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"fp_sim_{provider}",
    }
    longest = max(len(tokenize(answer.text)) for _, answer, _ in choices)

    def logprobs(text: str, salt: str, offset: int) -> Any:
        return None if top is None else _legacy_logprobs(pieces(text), top, salt + model, offset)

    if not stream:
        out = [
            {
                "text": echoed + answer.text,
                "index": index,
                "logprobs": logprobs(answer.text, salt, len(echoed)),
                "finish_reason": answer.finish_reason,
            }
            for index, (echoed, answer, salt) in enumerate(choices)
        ]
        delay = pace.ttft_s + longest * pace.per_token_s
        return Planned(
            body={**head, "choices": out, "usage": usage},
            delay_s=delay,
            tokens=prompt_total + completion,
            processing_ms=round(delay * 1000),
        )

    include_usage = bool(options and options.get("include_usage") is True)
    usage_field: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(index: int, text: str, finish: str | None, lp: Any = None) -> bytes:
        choice = {"text": text, "index": index, "logprobs": lp, "finish_reason": finish}
        return sse_data({**head, "choices": [choice], **usage_field})

    steps: list[list[bytes]] = []
    for index, (echoed, answer, salt) in enumerate(choices):
        tokens = pieces(answer.text)
        events = [chunk(index, echoed, None)] if echoed else []
        for position, token in enumerate(tokens):
            lp = None if top is None else _legacy_logprobs([token], top, f"{salt}{model}{position}", 0)
            events.append(chunk(index, token, None, lp))
        for step, event in enumerate(events):
            while len(steps) <= step:
                steps.append([])
            steps[step].append(event)
    frames = [Frame(pace.ttft_s if step == 0 else pace.per_token_s, b"".join(e)) for step, e in enumerate(steps)]
    tail = [chunk(index, "", answer.finish_reason) for index, (_, answer, _) in enumerate(choices)]
    if include_usage:
        tail.append(sse_data({**head, "choices": [], "usage": usage}))
    tail.append(sse_data("[DONE]"))
    frames.append(Frame(0.0 if frames else pace.ttft_s, b"".join(tail)))
    return Planned(frames=frames, tokens=prompt_total + completion, processing_ms=round(pace.ttft_s * 1000))
