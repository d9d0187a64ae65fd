"""Capacity planning: what fits on N GPUs, per GPU of a tensor-parallel group.

Per GPU (all integers; utilization is read as an exact decimal):

    usable    = floor(gpu_memory x gpu_memory_utilization)     # what the engine may use
    weights   = ceil(weight_bytes(params_total, weight_dtype) / tp)
    kv_budget = usable - weights - reserve                      # reserve: activations, CUDA
                                                                # graphs, NCCL buffers

The GPUs form gpu_count / (tp x pp) replicas; each serves its share of the sequences. Weights use
the total parameter count (every MoE expert must be resident), split evenly over tp x pp
(embeddings are vocab-parallel; replicated norms are a few MB and ignored), less what
--cpu-offload-gb moves to host memory.

What a sequence costs depends on the engine (see engines): under vLLM, its v1 allocator exactly
(vllm_alloc: KV-cache groups, padding, num_blocks, the extra sliding block), with both the
steady-state concurrency and the figure vLLM logs at start-up; under TensorRT-LLM whole blocks per
layer group; under SGLang and transformers exactly the tokens held. With pipeline parallelism each
stage holds its own layers' cache, and the fullest stage decides.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from kvcache import vllm_alloc
from kvcache.catalog import Gpu
from kvcache.dtypes import DEFAULT_STATE_DTYPE, weight_dtype
from kvcache.engines import DEFAULT_ENGINE, engine, for_engine
from kvcache.formulas import SequenceCost, check_tp, sequence_cost
from kvcache.spec import ModelSpec

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
    engine: str = DEFAULT_ENGINE
    pp: int = 1
    block_size: int | None = 16  # None: the engine holds exact tokens
    cpu_offload: int = 0  # weight bytes per GPU moved to host memory
    vllm: vllm_alloc.VllmCapacity | None = None  # vLLM's allocator, when it applies

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


# A plain decimal with a small exponent: checked BEFORE Fraction() sees it, because
# Fraction("1e100000000") computes a 100-million-digit power of ten (minutes of CPU) and
# float("1e400") is inf. 40 characters and |exponent| <= 30 cover every real input.
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d{1,3}))?")
MAX_DECIMAL_CHARS = 40
MAX_EXPONENT = 30


def parse_decimal(value: object, name: str) -> Fraction:
    """An exact decimal from user input, refusing nan, inf, huge exponents and long strings
    before any arithmetic. ValueError names the field."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number")
    if isinstance(value, Fraction):
        return value
    text = str(value).strip().replace("_", "")
    match = _DECIMAL.fullmatch(text) if len(text) <= MAX_DECIMAL_CHARS else None
    if match is None or (match.group(1) is not None and abs(int(match.group(1))) > MAX_EXPONENT):
        shown = text if len(text) <= MAX_DECIMAL_CHARS else text[:MAX_DECIMAL_CHARS] + "..."
        raise ValueError(
            f"{name} must be a plain decimal number (at most {MAX_DECIMAL_CHARS} characters, "
            f"exponent within +-{MAX_EXPONENT}), got {shown!r}"
        )
    return Fraction(text)


def parse_utilization(value: object) -> Fraction:
    """gpu_memory_utilization as an exact fraction in (0, 1]."""
    frac = parse_decimal(value, "gpu_memory_utilization")
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
    return _largest(lambda n: sequences * cost.bytes(n, block_size) <= budget, sequences, budget, limit)


def _largest(fits, sequences: int, budget: int, limit: int) -> int:
    if sequences <= 0 or budget <= 0 or not fits(1):
        return 0
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclasses.dataclass(frozen=True)
class StagedCost:
    """One sequence's cost per GPU under pipeline parallelism: the fullest stage's."""

    stages: tuple[SequenceCost, ...]

    def bytes(self, seq_len: int, block_size: int | None = None) -> int:
        return max(c.bytes(seq_len, block_size) for c in self.stages)

    @property
    def per_cache(self) -> int:
        """Bytes the fullest stage keeps once whatever the batch (transformers' fp8 scales)."""
        return max(c.per_cache for c in self.stages)


def stage_spec(spec: ModelSpec, layers: range) -> ModelSpec:
    """The part of the model one pipeline stage holds."""
    groups = []
    for g in spec.groups:
        idx = tuple(i for i in g.layer_indices if i in layers)
        if idx:
            groups.append(dataclasses.replace(g, layer_indices=idx))
    return dataclasses.replace(spec, groups=tuple(groups), num_layers=len(layers))


def staged_cost(spec: ModelSpec, kv_dtype: str, *, tp: int, pp: int, state_dtype: str) -> StagedCost:
    stages = vllm_alloc.pp_stages(spec.num_layers, pp) if pp > 1 else [range(spec.num_layers)]
    return StagedCost(
        tuple(sequence_cost(stage_spec(spec, s), kv_dtype, tp=tp, state_dtype=state_dtype) for s in stages)
    )


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
    engine_id: str = DEFAULT_ENGINE,
    pp: int = 1,
    max_num_batched_tokens: int = vllm_alloc.DEFAULT_MAX_NUM_BATCHED_TOKENS,
    cpu_offload_bytes: int = 0,
    extra_weight_bytes: int = 0,
) -> CapacityPlan:
    """The capacity plan for serving `spec` on `gpu_count` x `gpu` with tensor parallel `tp` and
    pipeline parallel `pp`, as `engine_id` allocates it."""
    check_tp(spec, tp)
    if pp < 1 or pp > spec.num_layers:
        raise ValueError(f"pipeline parallel size must be between 1 and the {spec.num_layers} layers, got {pp}")
    if gpu_count % (tp * pp):
        raise ValueError(
            f"GPU count {gpu_count} must be a multiple of tensor parallel size {tp} x pipeline parallel size {pp}"
        )
    if reserve_bytes < 0 or cpu_offload_bytes < 0:
        raise ValueError("reserve and CPU offload must not be negative")
    eng = engine(engine_id)
    spec = for_engine(spec, engine_id)
    util = parse_utilization(utilization)
    replicas = gpu_count // (tp * pp)
    usable = gpu.memory_bytes * util.numerator // util.denominator
    weights_total = weight_dtype(weight_dtype_name).weight_bytes(spec.params_total) + extra_weight_bytes
    on_gpu = -(-weights_total // (tp * pp))
    offload = min(cpu_offload_bytes, on_gpu)
    weights_per_gpu = on_gpu - offload
    budget = usable - weights_per_gpu - reserve_bytes
    max_len = spec.max_context if max_len is None else max_len
    per_replica = -(-batch // replicas)
    blocks = None if eng.allocator == "tokens" else block_size

    lay = (
        vllm_alloc.layout(spec, kv_dtype, tp=tp, block_size=block_size, state_dtype=state_dtype)
        if eng.allocator == "vllm"
        else None
    )
    fixed = 0  # bytes kept once whatever the batch (transformers' fp8 scales; none in vLLM's pool)
    if lay is not None:
        vc = vllm_alloc.capacity(lay, budget, context_len, pp=pp, max_num_batched_tokens=max_num_batched_tokens)
        pool = vc.num_blocks

        def fits_n(n: int) -> bool:
            return per_replica * lay.steady_blocks(n) <= pool

        per_seq = vc.steady_blocks * lay.block_bytes
        at_max = vllm_alloc.capacity(lay, budget, max_len, pp=pp, max_num_batched_tokens=max_num_batched_tokens)
        max_len_bytes = at_max.startup_needed
        concurrency = (pool // vc.steady_blocks if vc.steady_blocks else 0) * replicas
        best_len = _largest(fits_n, per_replica, pool, max_len)
    else:
        vc = None
        cost = staged_cost(spec, kv_dtype, tp=tp, pp=pp, state_dtype=state_dtype)
        # what the cache keeps once whatever the batch comes off the budget before any sequence
        fixed = cost.per_cache
        per_seq = cost.bytes(context_len, blocks)
        max_len_bytes = cost.bytes(max_len, blocks) + fixed
        concurrency = max_sequences(budget - fixed, per_seq) * replicas
        best_len = max_context(cost, budget - fixed, per_replica, max_len, blocks)  # type: ignore[arg-type]
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
        batch_bytes=per_replica * per_seq + (fixed if per_replica else 0),
        max_concurrency=concurrency,
        max_context_at_batch=best_len,
        max_len=max_len,
        max_len_sequence_bytes=max_len_bytes,
        engine=eng.id,
        pp=pp,
        block_size=blocks,
        cpu_offload=offload,
        vllm=vc,
    )


# -- how many GPUs would be enough -------------------------------------------------------------------

TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)  # tensor-parallel widths tried (within and across nodes)
MAX_GPUS = 1024  # beyond this the answer is "no count fits" rather than a number nobody buys


@dataclass(frozen=True)
class GpusNeeded:
    """The smallest GPU count of the chosen GPU on which the requested sequences fit, with the
    layout that achieves it; or, when none does within :data:`MAX_GPUS`, why not."""

    gpu_count: int | None
    tp: int | None = None
    pp: int = 1
    replicas: int | None = None
    why_not: str = ""

    @property
    def found(self) -> bool:
        return self.gpu_count is not None

    def text(self, gpu_name: str) -> str:
        if self.gpu_count is None:
            return f"No count of {gpu_name} fits: {self.why_not}."
        layout = f"tensor parallel {self.tp}" + (f" x pipeline parallel {self.pp}" if self.pp > 1 else "")
        copies = f", {self.replicas} replicas" if self.replicas and self.replicas > 1 else ""
        return f"{self.gpu_count} x {gpu_name} would be enough ({layout}{copies})."


def gpus_needed(
    plan_for: Callable[[int, int], CapacityPlan],
    *,
    batch: int,
    pp: int = 1,
    tp_choices: Sequence[int] = TP_CANDIDATES,
    max_gpus: int = MAX_GPUS,
) -> GpusNeeded:
    """The fewest GPUs on which ``batch`` sequences fit, where ``plan_for(gpu_count, tp)`` is the
    capacity plan for that layout (every other input fixed; pipeline parallel ``pp`` kept).

    For one tensor-parallel width, more GPUs only add replicas, and each replica serves
    ``ceil(batch / replicas)`` sequences; so one plan per width (a single replica) gives how many
    sequences a replica holds, and the replicas needed follow by division. The widths a model
    cannot be split over (heads not divisible) are skipped. Ties go to the narrower width (less
    interconnect traffic); the answer is re-checked with a real plan before it is returned."""
    best: tuple[int, int, int] | None = None  # (gpu_count, tp, replicas)
    too_many: tuple[int, int] | None = None  # the fewest GPUs beyond max_gpus: (gpu_count, tp)
    widest_reason = "the model cannot be split over any tensor-parallel width tried"
    for tp in sorted(set(tp_choices)):
        if tp * pp > max_gpus:
            break
        try:
            one = plan_for(tp * pp, tp)
        except ValueError:
            continue  # this width does not divide the model's heads
        if not one.weights_fit:
            widest_reason = f"even at tensor parallel {tp} the weights and the reserve leave no room for KV"
            continue
        per_replica = one.max_concurrency  # a single replica: how many sequences it holds
        if per_replica <= 0:
            widest_reason = f"even at tensor parallel {tp} one sequence needs more KV than a GPU has left"
            continue
        replicas = -(-batch // per_replica)
        count = replicas * tp * pp
        if count > max_gpus:
            if too_many is None or count < too_many[0]:
                too_many = (count, tp)
        elif best is None or count < best[0]:
            best = (count, tp, replicas)
    if best is not None:
        count, tp, replicas = best
        if plan_for(count, tp).fits:
            return GpusNeeded(count, tp, pp, replicas)
        return GpusNeeded(None, why_not="no layout was confirmed by the capacity plan")  # a guard
    if too_many is not None:
        return GpusNeeded(
            None,
            why_not=f"it would take {too_many[0]:,} GPUs (tensor parallel {too_many[1]}), more than the "
            f"{max_gpus:,} considered",
        )
    return GpusNeeded(None, why_not=widest_reason)
