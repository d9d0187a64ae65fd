"""Backoff schedule and per-attempt timeouts; the router is the only place that retries.

Delays use exponential backoff with full jitter (a uniform draw in [0, base * 2**n], capped), and
a server's ``Retry-After`` is honoured as a floor (itself capped), within a bounded total wait per
request: when the next sleep would exceed what is left, the router stops retrying that provider.
"""

from __future__ import annotations

import random

from app.config import RetryConfig


class Backoff:
    def __init__(self, cfg: RetryConfig, rng: random.Random | None = None):
        self.cfg = cfg
        self.rng = rng or random.Random()
        self.waited_s = 0.0

    def propose(self, retry_number: int, retry_after_s: float | None) -> float | None:
        """The sleep before retry ``retry_number`` (0-based), or ``None`` if over the total wait budget;
        nothing is spent until :meth:`commit`."""
        cap = min(self.cfg.max_delay_s, self.cfg.base_delay_s * (2**retry_number))
        delay = self.rng.uniform(0.0, cap)
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.cfg.retry_after_cap_s))
        if self.waited_s + delay > self.cfg.max_total_wait_s:
            return None
        return delay

    def commit(self, delay: float) -> None:
        self.waited_s += delay

    def next_delay(self, retry_number: int, retry_after_s: float | None) -> float | None:
        """Seconds to sleep before retry ``retry_number`` (0-based), or ``None`` if over budget."""
        delay = self.propose(retry_number, retry_after_s)
        if delay is not None:
            self.commit(delay)
        return delay


def attempt_timeout_s(base_timeout_s: float, prompt_tokens: int, cfg: RetryConfig) -> float:
    """Per-attempt timeout: grows with the prompt, and long prompts get at least ``long_timeout_s``."""
    timeout = base_timeout_s + cfg.timeout_per_1k_tokens_s * prompt_tokens / 1000.0
    if prompt_tokens > cfg.long_prompt_tokens:
        timeout = max(timeout, cfg.long_timeout_s)
    return timeout
