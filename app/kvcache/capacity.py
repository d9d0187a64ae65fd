"""Capacity planning: what fits on N GPUs, per GPU of a tensor-parallel group.

Per GPU (all integers; utilization is read as an exact decimal):

    usable    = floor(gpu_memory x gpu_memory_utilization)     # what the engine may use
    weights   = ceil(weight_bytes(params_total, weight_dtype) / tp)
    kv_budget = usable - weights - reserve                      # reserve: activations, CUDA
                                                                # graphs, NCCL buffers

The GPUs form gpu_count / tp replicas; each serves its share of the sequences, and a sequence costs
its paged allocation (whole blocks) on every GPU of its replica. Weights use the total parameter
count (every MoE expert must be resident); the split over tp assumes an even shard (embeddings are
vocab-parallel; replicated norms are a few MB and ignored).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from app.kvcache.catalog import Gpu
from app.kvcache.dtypes import DEFAULT_STATE_DTYPE, weight_dtype
from app.kvcache.formulas import SequenceCost, check_tp, sequence_cost
from app.kvcache.spec import ModelSpec

GIB = 1 << 30
DEFAULT_UTILIZATION = "0.9"
DEFAULT_RESERVE_BYTES = 2 * GIB


@dataclass(frozen=True)
class CapacityPlan:
    gpu_name: str
    gpu_count: int
    tp: int
    replicas: int
    gpu_memory: int
    utilization: Fraction
    usable: int
    weights_total: int
    weights_per_gpu: int
    reserve: int
    kv_budget: int  # per GPU; negative when weights + reserve do not fit
    context_len: int
    batch: int
    batch_per_replica: int
    sequence_bytes: int  # one sequence at context_len, per GPU, whole blocks
    batch_bytes: int  # batch_per_replica sequences, per GPU
    max_concurrency: int  # at context_len, all replicas
    max_context_at_batch: int  # longest context for `batch` sequences (0 = none fits)
    max_len: int
    max_len_sequence_bytes: int

    @property
    def weights_fit(self) -> bool:
        return self.kv_budget > 0

    @property
    def fits(self) -> bool:
        """The requested batch at the requested context fits."""
        return self.weights_fit and self.batch_bytes <= self.kv_budget

    @property
    def headroom(self) -> int:
        """KV bytes left per GPU after the requested batch (negative = short by that much)."""
        return self.kv_budget - self.batch_bytes

    @property
    def max_len_fits(self) -> bool:
        """One request of the model's maximum length fits."""
        return self.weights_fit and self.max_len_sequence_bytes <= self.kv_budget

    @property
    def max_len_headroom(self) -> int:
        return self.kv_budget - self.max_len_sequence_bytes


def parse_utilization(value: object) -> Fraction:
    """gpu_memory_utilization as an exact fraction in (0, 1]."""
    if isinstance(value, bool):
        raise ValueError("gpu_memory_utilization must be a number")
    try:
        frac = Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"gpu_memory_utilization must be a number, got {value!r}") from None
    if not 0 < frac <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {value}")
    return frac


def max_sequences(budget: int, per_sequence: int) -> int:
    if budget <= 0:
        return 0
    return budget // per_sequence if per_sequence else 0


def max_context(cost: SequenceCost, budget: int, sequences: int, limit: int, block_size: int | None) -> int:
    """Largest length <= limit such that `sequences` sequences fit in budget (binary search:
    the cost is non-decreasing in length). 0 when not even one token fits."""
    if sequences <= 0 or budget <= 0 or sequences * cost.bytes(1, block_size) > budget:
        return 0
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sequences * cost.bytes(mid, block_size) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan(
    spec: ModelSpec,
    gpu: Gpu,
    *,
    gpu_count: int = 1,
    tp: int = 1,
    weight_dtype_name: str = "bf16",
    kv_dtype: str = "bf16",
    context_len: int,
    batch: int = 1,
    utilization: object = DEFAULT_UTILIZATION,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    block_size: int = 16,
    state_dtype: str = DEFAULT_STATE_DTYPE,
    max_len: int | None = None,
) -> CapacityPlan:
    """The capacity plan for serving `spec` on `gpu_count` x `gpu` with tensor parallel `tp`."""
    check_tp(spec, tp)
    if gpu_count % tp:
        raise ValueError(f"GPU count {gpu_count} must be a multiple of tensor parallel size {tp}")
    if reserve_bytes < 0:
        raise ValueError("reserve must not be negative")
    util = parse_utilization(utilization)
    replicas = gpu_count // tp
    usable = gpu.memory_bytes * util.numerator // util.denominator
    weights_total = weight_dtype(weight_dtype_name).weight_bytes(spec.params_total)
    weights_per_gpu = -(-weights_total // tp)
    budget = usable - weights_per_gpu - reserve_bytes
    cost = sequence_cost(spec, kv_dtype, tp=tp, state_dtype=state_dtype)
    max_len = spec.max_context if max_len is None else max_len
    per_seq = cost.bytes(context_len, block_size)
    per_replica = -(-batch // replicas)
    return CapacityPlan(
        gpu_name=gpu.name,
        gpu_count=gpu_count,
        tp=tp,
        replicas=replicas,
        gpu_memory=gpu.memory_bytes,
        utilization=util,
        usable=usable,
        weights_total=weights_total,
        weights_per_gpu=weights_per_gpu,
        reserve=reserve_bytes,
        kv_budget=budget,
        context_len=context_len,
        batch=batch,
        batch_per_replica=per_replica,
        sequence_bytes=per_seq,
        batch_bytes=per_replica * per_seq,
        max_concurrency=max_sequences(budget, per_seq) * replicas,
        max_context_at_batch=max_context(cost, budget, per_replica, max_len, block_size),
        max_len=max_len,
        max_len_sequence_bytes=cost.bytes(max_len, block_size),
    )
