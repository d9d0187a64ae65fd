"""Prefix sharing: memory saved when N concurrent requests share a P-token prefix.

With prefix caching the prefix's KV is stored once and referenced by every request. Per attention
group (bytes per held token p), for N requests of seq_len L sharing S prefix tokens:

    without = N x p x held(L)
    with    = p x (shared + N x (held(L) - shared))

where shared = the prefix tokens the group still holds: S for full and MLA layers, and for a
sliding layer only the part of the prefix still inside its window, max(0, S - max(0, L - window)).
Recurrent states are per sequence and never shared. With paging, only whole blocks are shared
(S = floor(P / block_size) x block_size, as vLLM's prefix cache does) and each part is rounded up
to whole blocks; a prefix block the window has partly left is no longer shared.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.dtypes import DEFAULT_STATE_DTYPE
from kvcache.formulas import sequence_cost
from kvcache.spec import ModelSpec


@dataclass(frozen=True)
class PrefixSharing:
    requests: int
    prefix_len: int
    shared_tokens: int
    seq_len: int
    without_sharing: int
    with_sharing: int

    @property
    def saved(self) -> int:
        return self.without_sharing - self.with_sharing


def prefix_sharing(
    spec: ModelSpec,
    requests: int,
    prefix_len: int,
    seq_len: int,
    kv_dtype: str = "bf16",
    *,
    block_size: int | None = None,
    tp: int = 1,
    state_dtype: str = DEFAULT_STATE_DTYPE,
) -> PrefixSharing:
    """Per-GPU bytes for `requests` sequences of seq_len tokens with and without prefix sharing."""
    for name, value in (("requests", requests), ("prefix_len", prefix_len), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if prefix_len > seq_len:
        raise ValueError(f"prefix_len {prefix_len} exceeds seq_len {seq_len}")
    shared = prefix_len if not block_size else prefix_len // block_size * block_size

    def blocks(tokens: int) -> int:
        return -(-tokens // block_size) * block_size if block_size else tokens

    cost = sequence_cost(spec, kv_dtype, tp=tp, state_dtype=state_dtype)
    without = requests * cost.state
    with_ = requests * cost.state
    for per_token, window in cost.token_groups:
        held = seq_len if window is None else min(seq_len, window)
        in_window = shared if window is None else max(0, shared - max(0, seq_len - window))
        if block_size:  # a sliding window can leave a partial prefix block: it is not shared
            in_window = in_window // block_size * block_size
        without += requests * per_token * blocks(held)
        if requests:
            with_ += per_token * (in_window + requests * (blocks(held) - in_window))
    return PrefixSharing(requests, prefix_len, shared, seq_len, without, with_)
