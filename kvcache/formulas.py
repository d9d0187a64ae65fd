"""The exact KV-cache arithmetic: bytes per token, per sequence and in total, per layer group.

Per layer group, for one GPU of a tensor-parallel group of size ``tp``:

* full      2 (K and V) x layers x kv_heads_per_gpu x vector_bytes(head_dim)  per token held,
            tokens held = seq_len.
* sliding   the same per token, tokens held = min(seq_len, window).
* chunked   the same per token, tokens held = min(seq_len, attention_chunk_size) (what a cache
            sized for the chunk holds; vLLM's allocator rule is in vllm_alloc).
* mla       layers x vector_bytes(kv_lora_rank + qk_rope_head_dim) per token: one latent shared
            by all heads, and replicated (not split) across tensor-parallel GPUs.
* mla_kv    the MLA layers as transformers 4.x stores them, decompressed: layers x heads x
            (vector_bytes(qk_nope + qk_rope) + vector_bytes(v_head_dim)) per token.
* indexer   DeepSeek-V3.2's lightning-indexer keys: layers x vector_bytes(index_head_dim) per token
            (one single-head key, replicated across TP GPUs); vLLM stores it as fp8 plus a 4-byte
            scale per 128 values whatever the KV dtype (layout "fp8_scale128").
* states    layers x (conv_channels x conv_columns x conv bytes + heads x head_dim x state_size x
            recurrent bytes) per sequence, independent of seq_len. conv_columns defaults to
            conv_kernel - 1, the inputs a causal convolution needs from the past (what vLLM
            allocates; transformers 5 keeps conv_kernel columns, set by engines.for_engine). The
            convolution and recurrent states have their own dtypes (transformers keeps the
            recurrent state in float32; vLLM's mamba_cache_dtype / mamba_ssm_cache_dtype).
            Lightning attention (MiniMax) has no convolution: heads x head_dim x head_dim.

transformers 5's fp8 cache (layout "tf5_fp8", QuantizedCache(backend="fp8")) adds one float32 scale
per K and per V tensor of each layer, 8 B per layer kept once for the whole cache (``cache_parts``
of the breakdown, ``per_cache`` of a SequenceCost), whatever the batch and length.

kv_heads_per_gpu: tp must divide the KV heads (each GPU holds kv_heads / tp), or be a multiple of
them, in which case each GPU holds one head and every head is replicated tp / kv_heads times (the
vLLM rule). Everything is integer arithmetic; see dtypes for per-vector packing and scale bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcache.dtypes import DEFAULT_STATE_DTYPE, KV_DTYPES, KvDtype, kv_dtype
from kvcache.spec import KV_HEAD_KINDS, LayerGroup, ModelSpec

STATE_DTYPES = ("bf16", "fp16", "fp32")
FP8_NAMES = ("fp8", "fp8_e4m3", "fp8_e5m2")

GROUP_LABELS = {
    "full": "full attention",
    "sliding": "sliding-window attention",
    "chunked": "chunked local attention",
    "mla": "MLA latent",
    "mla_kv": "MLA decompressed K/V",
    "indexer": "sparse-attention indexer keys",
    "mamba": "Mamba state",
    "mamba2": "Mamba-2 state",
    "linear_attention": "gated DeltaNet state",
    "lightning": "lightning-attention state",
}


@dataclass(frozen=True)
class GroupBytes:
    """One row of the breakdown: a layer group's cache with its formula filled in."""

    kind: str
    label: str
    layers: int
    tokens_held: int  # per sequence; 0 for constant-state layers
    bytes_per_token: int  # all layers of the group, one sequence, one GPU; 0 for states
    bytes_per_sequence: int
    bytes_total: int  # x batch
    formula: str
    # (part, dtype, bytes per sequence): K/V, latent, indexer keys, conv state, recurrent state
    parts: tuple[tuple[str, str, int], ...] = ()
    convention: str = ""  # the engine rule that fixed the layout / dtypes, with its source
    # (part, dtype, bytes) kept once for the whole cache whatever the batch (transformers' fp8
    # scales), already in bytes_total
    cache_parts: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True)
class KvBreakdown:
    seq_len: int
    batch: int
    kv_dtype: str
    state_dtype: str
    tp: int
    groups: tuple[GroupBytes, ...]

    @property
    def total(self) -> int:
        return sum(g.bytes_total for g in self.groups)

    @property
    def per_sequence(self) -> int:
        return sum(g.bytes_per_sequence for g in self.groups)

    @property
    def bytes_per_token(self) -> int:
        """Bytes each token adds while every window is still filling (the growth rate)."""
        return sum(g.bytes_per_token for g in self.groups)


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def kv_heads_per_gpu(kv_heads: int, tp: int) -> int:
    """KV heads one GPU holds under tensor parallelism (split, or replicated beyond kv_heads)."""
    if tp <= kv_heads:
        if kv_heads % tp:
            raise ValueError(f"tensor parallel size {tp} must divide the {kv_heads} KV heads")
        return kv_heads // tp
    if tp % kv_heads:
        raise ValueError(
            f"tensor parallel size {tp} exceeds the {kv_heads} KV heads and is not a multiple "
            "of them, so the heads cannot be replicated evenly"
        )
    return 1


def _shard(total: int, tp: int, what: str) -> int:
    if total % tp:
        raise ValueError(f"tensor parallel size {tp} must divide the {total} {what}")
    return total // tp


def check_tp(spec: ModelSpec, tp: int) -> None:
    """Raise ValueError when the model cannot be split over `tp` GPUs."""
    _check_count("tensor parallel size", tp, 1)
    if spec.num_attention_heads:
        _shard(spec.num_attention_heads, tp, "attention heads")
    for g in spec.groups:
        if g.kind in KV_HEAD_KINDS:
            kv_heads_per_gpu(g.kv_heads, tp)
        elif g.state is not None:
            state_values(g, tp)


def tokens_held(group: LayerGroup, seq_len: int) -> int:
    """Tokens of one sequence the group keeps: all, the window, or none (constant state)."""
    if group.kind in ("sliding", "chunked"):
        return min(seq_len, group.window or seq_len)
    if group.kind in ("full", "mla", "mla_kv", "indexer"):
        return seq_len
    return 0


def _ds_mla_bytes(group: LayerGroup) -> int:
    """vLLM's fp8_ds_mla entry per token per layer: the latent in fp8 plus one float32 scale per
    128 values, and the RoPE part in bf16 (656 B for DeepSeek-V3.2's 512 + 64; vLLM
    vllm/model_executor/models/config.py DeepseekV32ForCausalLM.verify_and_update_config selects it,
    the layout is FlashMLA's sparse fp8 cache)."""
    return group.kv_lora_rank + 4 * -(-group.kv_lora_rank // 128) + 2 * group.qk_rope_head_dim


def _fp8_scale128_bytes(values: int) -> int:
    """fp8 values plus a float32 scale per 128 (vLLM deepseek_v2.py Indexer: head_dim +
    head_dim // quant_block_size * 4 bytes, dtype uint8)."""
    return values + 4 * -(-values // 128)


MODEL_DTYPES = ("bf16", "fp16", "fp32")
TF5_FP8 = ("fp8", "fp8_e4m3")  # Fp8QuantizedLayer.fp8_dtype is float8_e4m3fn
TF5_SCALE_BYTES = 8  # per layer: one float32 scale for its K tensor, one for its V tensor


def _check_tf5_dtype(group: LayerGroup, dtype: KvDtype) -> None:
    """transformers 5 keeps K/V in the model dtype (StaticCache) or, for full-attention-only models,
    as QuantizedCache(backend="fp8") does (cache_utils.py Fp8QuantizedLayer); its quanto / hqq
    int caches (a model-dtype residual window plus group-wise scales) are not modelled."""
    if dtype.name in MODEL_DTYPES:
        return
    if group.layout == "tf5_fp8" and dtype.name in TF5_FP8:
        return
    if group.layout == "tf5_fp8" or dtype.name not in FP8_NAMES:
        raise ValueError(
            f"transformers 5 keeps no {dtype.name} KV cache modelled here: bf16 / fp16 / fp32 (StaticCache) or, "
            "for full-attention models, fp8 e4m3 (QuantizedCache(backend='fp8'))"
        )
    raise ValueError(
        f"transformers 5 cannot keep this model's KV cache in {dtype.name}: its fp8 cache, "
        "QuantizedCache(backend='fp8'), takes only models whose layer_types are all full_attention, and this one "
        f"has {GROUP_LABELS[group.kind]} layers; choose bf16, fp16 or fp32"
    )


def token_bytes(group: LayerGroup, dtype: KvDtype, tp: int = 1) -> tuple[int, str]:
    """Bytes per held token for all layers of an attention group on one GPU, and the working."""
    rep = " (replicated on every TP GPU)" if tp > 1 else ""
    if group.layout in ("tf5_fp8", "tf5_static"):
        _check_tf5_dtype(group, dtype)
    if group.kind == "mla":
        values = group.kv_lora_rank + group.qk_rope_head_dim
        if group.layout == "ds_mla" and dtype.name in FP8_NAMES:
            per_layer = _ds_mla_bytes(group)
            per_token = group.layers * per_layer
            text = (
                f"{group.layers} layers x fp8_ds_mla ({group.kv_lora_rank} fp8 + "
                f"{-(-group.kv_lora_rank // 128)} x 4 B scales + {group.qk_rope_head_dim} x 2 B RoPE = "
                f"{per_layer} B) = {per_token:,} B/token" + rep
            )
            return per_token, text
        if group.layout == "ds_mla" and dtype.name not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"vLLM keeps DeepSeek-V3.2's cache in bf16 or its fp8_ds_mla format, not {dtype.name}")
        per_token = group.layers * dtype.vector_bytes(values)
        text = (
            f"{group.layers} layers x ({group.kv_lora_rank} kv_lora_rank + "
            f"{group.qk_rope_head_dim} qk_rope_head_dim = {values} values: "
            f"{dtype.describe_vector(values)}) = {per_token:,} B/token"
            + (" (latent replicated on every TP GPU)" if tp > 1 else "")
        )
        return per_token, text
    if group.kind == "indexer":
        if group.layout == "fp8_scale128":
            per_layer = _fp8_scale128_bytes(group.head_dim)
            how = f"{group.head_dim} fp8 + {-(-group.head_dim // 128)} x 4 B scale = {per_layer} B"
        else:
            per_layer = dtype.vector_bytes(group.head_dim)
            how = f"{group.head_dim} values: {dtype.describe_vector(group.head_dim)}"
        per_token = group.layers * per_layer
        return per_token, f"{group.layers} layers x 1 key ({how}) = {per_token:,} B/token" + rep
    if group.kind in KV_HEAD_KINDS:
        heads = kv_heads_per_gpu(group.kv_heads, tp)
        per_token = group.layers * heads * (dtype.vector_bytes(group.head_dim) + dtype.vector_bytes(group.v_dim))
        tp_note = ""
        if tp > 1:
            tp_note = (
                f" ({group.kv_heads} / TP {tp})"
                if tp <= group.kv_heads
                else f" ({group.kv_heads} KV heads replicated over TP {tp})"
            )
        if group.v_dim == group.head_dim:
            text = (
                f"2 (K,V) x {group.layers} layers x {heads} KV heads{tp_note} x "
                f"({dtype.describe_vector(group.head_dim)}) = {per_token:,} B/token"
            )
        else:
            text = (
                f"{group.layers} layers x {heads} heads{tp_note} x (K {dtype.describe_vector(group.head_dim)} + "
                f"V {dtype.describe_vector(group.v_dim)}) = {per_token:,} B/token"
            )
        return per_token, text
    return 0, ""


def attention_part(group: LayerGroup, dtype: KvDtype) -> tuple[str, str]:
    """(part name, storage) of an attention group's per-token entry, for the breakdown."""
    if group.kind == "indexer":
        return "indexer keys", "fp8 + fp32 scale per 128" if group.layout == "fp8_scale128" else dtype.name
    if group.kind == "mla":
        fp8 = group.layout == "ds_mla" and dtype.name in FP8_NAMES
        return "MLA latent", "fp8_ds_mla" if fp8 else dtype.name
    return "K/V", dtype.name


def state_values(group: LayerGroup, tp: int = 1) -> tuple[int, int, int]:
    """(conv channels, conv values, recurrent values) per layer per sequence on one GPU."""
    s = group.state
    assert s is not None
    heads = _shard(s.heads, tp, "state heads/channels")
    if group.kind == "lightning":
        return 0, 0, heads * s.head_dim * s.state_size  # no convolution
    if s.groups == 0:
        groups = 0
    elif s.groups % tp == 0:
        groups = s.groups // tp
    elif tp % s.groups == 0:
        groups = 1  # too few groups to split: each GPU keeps a replica of one
    else:
        raise ValueError(f"tensor parallel size {tp} cannot split {s.groups} state groups")
    channels = heads * s.head_dim + 2 * groups * s.group_dim
    conv = channels * conv_columns(group)
    ssm = heads * s.head_dim * s.state_size
    return channels, conv, ssm


def conv_columns(group: LayerGroup) -> int:
    assert group.state is not None
    return group.conv_columns or group.state.conv_kernel - 1


def state_dtypes(group: LayerGroup, kv: KvDtype, state_dtype: str, ssm_dtype: str | None) -> tuple[KvDtype, KvDtype]:
    """(conv dtype, recurrent dtype) of a state group: the engine's convention when it fixes one
    ("kv" = the model / KV dtype), else the arguments (ssm_dtype None = same as state_dtype, vLLM's
    mamba_ssm_cache_dtype "auto")."""

    def pick(rule: str, default: str, argument: str | None = None) -> KvDtype:
        if rule == "kv":
            # the state follows the model dtype (transformers 5), which no quantized format is
            if kv.name not in MODEL_DTYPES:
                raise ValueError(
                    f"this engine keeps the {GROUP_LABELS[group.kind]} in the model dtype, which cannot be "
                    f"{kv.name}; choose bf16, fp16 or fp32 as the KV dtype"
                )
            return kv
        if rule.startswith("auto:"):  # the engine's default when the argument is left "auto"
            return KV_DTYPES[argument or rule.removeprefix("auto:")]
        return KV_DTYPES[rule or default]

    conv = pick(group.conv_dtype, state_dtype)
    return conv, pick(group.ssm_dtype, ssm_dtype or conv.name, ssm_dtype)


def state_bytes(group: LayerGroup, conv_dt: KvDtype, ssm_dt: KvDtype, tp: int = 1) -> tuple[int, int, str]:
    """(conv bytes, recurrent bytes) of one sequence for all layers of a recurrent group on one
    GPU, and the working."""
    channels, conv, ssm = state_values(group, tp)
    s = group.state
    assert s is not None
    conv_b = group.layers * conv_dt.vector_bytes(conv) if conv else 0
    ssm_b = group.layers * ssm_dt.vector_bytes(ssm)
    if group.kind == "lightning":
        heads = s.heads // tp
        text = (
            f"{group.layers} layers x state {heads} heads x {s.head_dim} x {s.state_size} = {ssm:,} values"
            f" x {ssm_dt.bits // 8} B ({ssm_dt.name}) = {ssm_b:,} B/sequence"
        )
        return conv_b, ssm_b, text
    cols = conv_columns(group)
    col_text = f"({s.conv_kernel} - 1)" if not group.conv_columns else f"{cols} (conv_kernel)"
    text = (
        f"{group.layers} layers x (conv {channels:,} channels x {col_text} = {conv:,} values x "
        f"{conv_dt.bits // 8} B ({conv_dt.name}) + recurrent {ssm:,} values x {ssm_dt.bits // 8} B "
        f"({ssm_dt.name})) = {conv_b + ssm_b:,} B/sequence"
    )
    return conv_b, ssm_b, text


def _check_state_dtype(name: str, value: str | None, optional: bool = False) -> None:
    if optional and value is None:
        return
    if value not in STATE_DTYPES:
        raise ValueError(f"{name} must be one of {', '.join(STATE_DTYPES)}, got {value!r}")


def breakdown(
    spec: ModelSpec,
    seq_len: int,
    batch: int = 1,
    kv_dtype_name: str = "bf16",
    *,
    tp: int = 1,
    state_dtype: str = DEFAULT_STATE_DTYPE,
    ssm_dtype: str | None = None,
) -> KvBreakdown:
    """Per-group bytes on one GPU of a TP group, with every formula written out. state_dtype is
    the convolution-state dtype (vLLM's mamba_cache_dtype), ssm_dtype the recurrent state's
    (mamba_ssm_cache_dtype; None = the same); an engine convention on a group wins over both."""
    _check_count("seq_len", seq_len, 0)
    _check_count("batch", batch, 0)
    _check_count("tensor parallel size", tp, 1)
    kv = kv_dtype(kv_dtype_name)
    _check_state_dtype("state_dtype", state_dtype)
    _check_state_dtype("ssm_dtype", ssm_dtype, optional=True)
    rows = []
    for g in spec.groups:
        label = (f"{g.owner}: " if g.owner else "") + GROUP_LABELS[g.kind]
        cache_parts: tuple[tuple[str, str, int], ...] = ()
        if g.is_attention:
            per_token, text = token_bytes(g, kv, tp)
            held = tokens_held(g, seq_len)
            per_seq = per_token * held
            window = ""
            if g.kind in ("sliding", "chunked"):
                span = "window" if g.kind == "sliding" else "chunk"
                window = f" (min({seq_len:,}, {span} {g.window:,}))"
            text += f"; x {held:,} tokens{window} = {per_seq:,} B/sequence"
            part, storage = attention_part(g, kv)
            parts: tuple[tuple[str, str, int], ...] = ((part, storage, per_seq),)
            if g.layout == "tf5_fp8" and kv.name in TF5_FP8 and seq_len and batch:
                # Fp8QuantizedLayer: a float32 scale per K and per V tensor of each layer, the
                # tensors holding the whole batch (cache_utils.py Fp8QuantizedLayer._quantize)
                scales = TF5_SCALE_BYTES * g.layers
                cache_parts = (("fp8 scales", "fp32", scales),)
                text += f"; + {g.layers} layers x 2 float32 scales (K, V) = {scales:,} B for the whole cache"
        else:
            per_token, held = 0, 0
            conv_dt, ssm_dt = state_dtypes(g, kv, state_dtype, ssm_dtype)
            conv_b, ssm_b, text = state_bytes(g, conv_dt, ssm_dt, tp)
            per_seq = conv_b + ssm_b
            parts = (("recurrent state", ssm_dt.name, ssm_b),)
            if g.kind != "lightning":
                parts = (("conv state", conv_dt.name, conv_b), *parts)
        total = per_seq * batch + sum(size for _, _, size in cache_parts)
        text += f"; x {batch} sequences" + (" + the scales" if cache_parts else "") + f" = {total:,} B"
        if g.kind in ("sliding", "chunked"):
            label += f" ({g.window:,})"
        rows.append(
            GroupBytes(g.kind, label, g.layers, held, per_token, per_seq, total, text, parts, g.convention, cache_parts)
        )
    return KvBreakdown(seq_len, batch, kv.name, state_dtype, tp, tuple(rows))


def kv_cache_bytes(
    spec: ModelSpec,
    seq_len: int,
    batch: int = 1,
    kv_dtype: str = "bf16",
    *,
    tp: int = 1,
    state_dtype: str = DEFAULT_STATE_DTYPE,
    ssm_dtype: str | None = None,
) -> int:
    """Exact bytes to hold the cache of `batch` sequences of `seq_len` tokens.

    With tp > 1 this is the cache on ONE GPU of the tensor-parallel group (the figure that has to
    fit); with tp = 1, the whole cache.
    """
    return breakdown(spec, seq_len, batch, kv_dtype, tp=tp, state_dtype=state_dtype, ssm_dtype=ssm_dtype).total


def naive_bytes(spec: ModelSpec, seq_len: int, batch: int = 1, kv_dtype_name: str = "bf16") -> int:
    """The common wrong formula 2 x layers x hidden x bytes x tokens (ignores GQA, head_dim,
    windows, MLA and hybrids), kept only to show how far off it is."""
    kv = kv_dtype(kv_dtype_name)
    return 2 * spec.num_layers * kv.vector_bytes(spec.hidden_size) * seq_len * batch


@dataclass(frozen=True)
class SequenceCost:
    """One sequence's per-GPU cost as (bytes per held token, window) per attention group plus the
    constant state, precomputed so charts and searches can evaluate many lengths cheaply."""

    token_groups: tuple[tuple[int, int | None], ...]
    state: int
    # bytes kept once for the whole cache whatever the batch (transformers' fp8 scales), not per sequence
    per_cache: int = 0

    def bytes(self, seq_len: int, block_size: int | None = None) -> int:
        """Bytes of one sequence of seq_len tokens; with block_size, whole blocks per group."""
        total = self.state
        for per_token, window in self.token_groups:
            held = seq_len if window is None else min(seq_len, window)
            if block_size:
                held = -(-held // block_size) * block_size
            total += per_token * held
        return total


def sequence_cost(
    spec: ModelSpec,
    kv_dtype_name: str = "bf16",
    *,
    tp: int = 1,
    state_dtype: str = DEFAULT_STATE_DTYPE,
    ssm_dtype: str | None = None,
) -> SequenceCost:
    _check_count("tensor parallel size", tp, 1)
    kv = kv_dtype(kv_dtype_name)
    _check_state_dtype("state_dtype", state_dtype)
    _check_state_dtype("ssm_dtype", ssm_dtype, optional=True)
    groups, state, per_cache = [], 0, 0
    for g in spec.groups:
        if g.is_attention:
            groups.append((token_bytes(g, kv, tp)[0], g.window if g.kind in ("sliding", "chunked") else None))
            if g.layout == "tf5_fp8" and kv.name in TF5_FP8:
                per_cache += TF5_SCALE_BYTES * g.layers
        else:
            conv_b, ssm_b, _ = state_bytes(g, *state_dtypes(g, kv, state_dtype, ssm_dtype), tp)
            state += conv_b + ssm_b
    return SequenceCost(tuple(groups), state, per_cache)
