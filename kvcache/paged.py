"""Paged allocation (PagedAttention) against contiguous pre-allocation to the maximum length.

A paged allocator gives each sequence whole blocks of ``block_size`` tokens per layer group, so
its only waste is the unfilled tail of the last block of each group (internal fragmentation).
A contiguous allocator (a static cache) reserves the maximum length for every sequence up front
(sliding layers reserve their window, states their fixed size). The difference between the two is
the memory PagedAttention gives back. Model: a sliding group holds ceil(min(seq_len, window) /
block_size) blocks; a real allocator can hold one block more while the window straddles a block
boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.dtypes import DEFAULT_STATE_DTYPE
from kvcache.formulas import sequence_cost
from kvcache.spec import ModelSpec

DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class PagedAllocation:
    block_size: int
    seq_len: int
    max_len: int
    batch: int
    used: int  # exact bytes the tokens occupy
    allocated: int  # whole blocks
    contiguous: int  # max_len reserved per sequence

    @property
    def fragmentation(self) -> int:
        """Bytes allocated but not used: the unfilled tails of last blocks."""
        return self.allocated - self.used

    @property
    def contiguous_waste(self) -> int:
        """Bytes a max-length pre-allocation reserves beyond what the tokens use."""
        return self.contiguous - self.used

    @property
    def saved_by_paging(self) -> int:
        return self.contiguous - self.allocated


def paged_allocation(
    spec: ModelSpec,
    seq_len: int,
    batch: int = 1,
    kv_dtype: str = "bf16",
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_len: int | None = None,
    tp: int = 1,
    state_dtype: str = DEFAULT_STATE_DTYPE,
) -> PagedAllocation:
    """Used vs paged-allocated vs contiguous bytes on one GPU for `batch` sequences."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    max_len = spec.max_context if max_len is None else max_len
    if seq_len > max_len:
        raise ValueError(f"seq_len {seq_len} exceeds max_len {max_len}")
    cost = sequence_cost(spec, kv_dtype, tp=tp, state_dtype=state_dtype)
    return PagedAllocation(
        block_size=block_size,
        seq_len=seq_len,
        max_len=max_len,
        batch=batch,
        used=batch * cost.bytes(seq_len),
        allocated=batch * cost.bytes(seq_len, block_size),
        contiguous=batch * cost.bytes(max_len),
    )
