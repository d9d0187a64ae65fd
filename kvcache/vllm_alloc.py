"""vLLM's v1 KV-cache allocator, modelled from vllm/v1/core/kv_cache_utils.py and
vllm/v1/kv_cache_interface.py, for attention models (full, sliding, chunked, MLA, DeepSeek-V3.2's
indexer) and for hybrids of full attention with recurrent-state layers (Mamba-1/2, gated DeltaNet,
MiniMax lightning attention).

DeepSeek-V3.2 (``UniformTypeKVCacheSpecs``, kv_cache_utils.py ``_get_kv_cache_groups_uniform_type``):
the indexer-key layers are full-attention specs of another head size, so all MLA and indexer layers
form ONE group whose block holds block_size tokens of every layer: the indexer's bytes are part of
each MLA layer's page here.

Hybrids with state layers (vllm/model_executor/models/config.py
``HybridAttentionMambaModelConfig.verify_and_update_config``, vLLM commit 0144dd5): a state layer
is a ``MambaSpec`` whose page is one sequence's whole state (conv + recurrent tensors). The
attention block size is raised to 16 x cdiv(state page, 16 x attention bytes per token) when the
configured one is smaller, and the state page is padded up to the attention page, so both pages
are equal; state layers then form KV-cache groups of their own by the rule below. A request holds
one block in each state group whatever its length (``MambaSpec.max_memory_usage_bytes`` = one page).
Layers that reuse another layer's K/V (Gemma-3n) have no spec and are in no group.

Grouping (``get_kv_cache_groups``). One attention type: one group of every layer. Several types
(hybrids such as Gemma 3, gpt-oss, Llama 4): layers of one type are split into groups of
``group_size`` layers, the smallest type's layer count (or the largest one when it is below 1.5x
the smallest); the last group of a type is padded. Gemma-3-27B: 52 sliding + 10 full -> 6 sliding
groups + 1 full group of 10, 8 padding layers. Layer i of a type goes to group i mod num_groups.

Blocks (``get_kv_cache_config_from_groups``). A block is one page of ``block_size`` tokens in each
of ``group_size`` tensors; ``page`` = block_size x one layer's bytes per token (after vLLM unifies
page sizes). num_blocks = available // page // group_size, the same pool serving every group.
Under pipeline parallelism each stage projects the global groups onto its layers and the engine
keeps the smallest stage's num_blocks.

Blocks one request holds per group:

* steady state (what the manager keeps while decoding): full and MLA cdiv(L, block); sliding
  min(cdiv(L, block), cdiv(W - 1, block) + 1) (the window of W tokens may straddle one more block);
  chunked at most the blocks one chunk can touch.
* start-up log, 'Maximum concurrency for L tokens per request' (``max_memory_usage_bytes``): full
  cdiv(L, block); sliding cdiv(min(W - 1 + max_num_batched_tokens, L), block) + 1; chunked
  cdiv(min(C + max_num_batched_tokens, L), block). This budgets for a chunked prefill in flight,
  so for windowed models it is much lower than the steady state.

Concurrency = num_blocks / blocks per request, a fraction (vLLM logs it with two decimals).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import gcd

from kvcache.dtypes import DEFAULT_STATE_DTYPE, kv_dtype
from kvcache.formulas import state_bytes, state_dtypes, token_bytes
from kvcache.spec import ATTENTION_KINDS, STATE_KINDS, LayerGroup, ModelSpec

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM's default for online serving on large GPUs


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class CacheGroup:
    """One vLLM KV-cache group: layers of one attention type sharing a block table."""

    kind: str  # full / sliding / chunked / mla, or a state kind (mamba, mamba2, ...)
    span: int | None  # sliding window or chunk size
    block_size: int
    layers: tuple[int, ...]
    padding: int

    @property
    def is_state(self) -> bool:
        return self.kind in STATE_KINDS

    def steady_blocks(self, seq_len: int) -> int:
        if self.is_state:
            return 1  # one page holds the whole state of a sequence
        b = self.block_size
        whole = cdiv(seq_len, b)
        if self.kind == "sliding":
            assert self.span is not None
            return min(whole, cdiv(self.span - 1, b) + 1)
        if self.kind == "chunked":
            assert self.span is not None
            # chunks start at multiples of C, so a chunk's offset inside its first block is a
            # multiple of gcd(C, block); the largest such offset, block - gcd, touches the most
            # blocks: floor((offset + C - 1) / block) + 1
            worst = b - gcd(self.span, b)
            return min(whole, (worst + self.span - 1) // b + 1)
        return whole

    def logged_blocks(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        if self.is_state:
            return 1
        b = self.block_size
        if self.kind == "sliding":
            assert self.span is not None
            return cdiv(min(self.span - 1 + max_num_batched_tokens, max_model_len), b) + 1
        if self.kind == "chunked":
            assert self.span is not None
            return cdiv(min(self.span + max_num_batched_tokens, max_model_len), b)
        return cdiv(max_model_len, b)

    def describe_steady(self, seq_len: int) -> str:
        if self.is_state:
            return "1 (the whole state of the sequence)"
        b, n = self.block_size, self.steady_blocks(seq_len)
        if self.kind == "sliding":
            return f"min(cdiv({seq_len:,}, {b}), cdiv({self.span:,} - 1, {b}) + 1) = {n:,}"
        if self.kind == "chunked":
            return f"min(cdiv({seq_len:,}, {b}), blocks one {self.span:,}-token chunk touches) = {n:,}"
        return f"cdiv({seq_len:,}, {b}) = {n:,}"

    def describe_logged(self, max_model_len: int, batched: int) -> str:
        if self.is_state:
            return "1 (MambaSpec: one page per request)"
        b, n = self.block_size, self.logged_blocks(max_model_len, batched)
        if self.kind == "sliding":
            return f"cdiv(min({self.span:,} - 1 + {batched:,}, {max_model_len:,}), {b}) + 1 = {n:,}"
        if self.kind == "chunked":
            return f"cdiv(min({self.span:,} + {batched:,}, {max_model_len:,}), {b}) = {n:,}"
        return f"cdiv({max_model_len:,}, {b}) = {n:,}"


@dataclass(frozen=True)
class VllmLayout:
    groups: tuple[CacheGroup, ...]
    group_size: int  # layers (tensors) per group
    page_bytes: int  # one layer's block, on one GPU
    num_layers: int
    note: str = ""  # how vLLM sized the pages (hybrids: the raised attention block size)

    @property
    def padding_layers(self) -> int:
        return sum(g.padding for g in self.groups)

    @property
    def block_bytes(self) -> int:
        """One block id across the group's tensors: what each block of a request costs."""
        return self.page_bytes * self.group_size

    def steady_blocks(self, seq_len: int) -> int:
        return sum(g.steady_blocks(seq_len) for g in self.groups)

    def logged_blocks(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return sum(g.logged_blocks(max_model_len, max_num_batched_tokens) for g in self.groups)

    def stage_group_size(self, layers: range) -> int:
        """group_size of one pipeline stage: the most layers any group has on it."""
        return max(sum(1 for i in g.layers if i in layers) for g in self.groups)

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for g in self.groups:
            label = g.kind if g.span is None else f"{g.kind} {g.span:,}"
            kinds[label] = kinds.get(label, 0) + 1
        parts = ", ".join(f"{n} {k}" for k, n in kinds.items())
        pad = f", {self.padding_layers} padding layers" if self.padding_layers else ""
        text = f"{len(self.groups)} KV-cache groups of {self.group_size} layers ({parts}{pad})"
        return text + (f"; {self.note}" if self.note else "")


def pp_stages(num_layers: int, pp: int) -> list[range]:
    """Layers of each pipeline stage, as vLLM's get_pp_indices splits them: evenly, with the
    remainder given to the stages before the last one, counting back from it."""
    per = num_layers // pp
    parts = [per] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    out, start = [], 0
    for n in parts:
        out.append(range(start, start + n))
        start += n
    return out


def _signature(g: LayerGroup) -> tuple:
    """What makes two layers the same KVCacheSpec in vLLM (a draft model's layers with the
    target's head shape share the target's spec)."""
    return (g.kind, g.window, g.kv_heads, g.head_dim, g.v_dim, g.kv_lora_rank, g.qk_rope_head_dim, g.state)


def _group_types(groups: tuple[LayerGroup, ...]) -> list[tuple[LayerGroup, list[int]]]:
    """Layers by KV-cache spec, in order of each type's first layer (vLLM builds a dict in
    layer order)."""
    merged: dict[tuple, tuple[LayerGroup, list[int]]] = {}
    for g in sorted(groups, key=lambda g: g.layer_indices[0]):
        _, layers = merged.setdefault(_signature(g), (g, []))
        layers.extend(g.layer_indices)
    return [(g, sorted(layers)) for g, layers in merged.values()]


def unsupported(spec: ModelSpec) -> str:
    """Why this allocator model does not cover `spec` ("" when it does)."""
    if not spec.groups:
        return "the model has no cache layers"
    kinds = {g.kind for g in spec.groups}
    if kinds & set(STATE_KINDS) and kinds - set(STATE_KINDS) - {"full"}:
        return "hybrids of state layers with sliding, chunked or MLA attention are not modelled"
    if "mla_kv" in kinds:
        return "vLLM caches the MLA latent, not decompressed K/V"
    return ""


def _state_page(g: LayerGroup, kv_name: str, tp: int, state_dtype: str, ssm_dtype: str | None) -> int:
    """MambaSpec.page_size_bytes of one state layer: its conv and recurrent tensors for one sequence."""
    conv_b, ssm_b, _ = state_bytes(g, *state_dtypes(g, kv_dtype(kv_name), state_dtype, ssm_dtype), tp)
    return (conv_b + ssm_b) // g.layers


def layout(
    spec: ModelSpec,
    kv_dtype_name: str,
    *,
    tp: int = 1,
    block_size: int = 16,
    state_dtype: str = DEFAULT_STATE_DTYPE,
    ssm_dtype: str | None = None,
) -> VllmLayout | None:
    """vLLM's KV-cache groups for `spec` (pass ``for_engine(spec, "vllm")`` for its byte layouts);
    None when :func:`unsupported` names a reason."""
    if unsupported(spec):
        return None
    kv = kv_dtype(kv_dtype_name)
    indexer = spec.group("indexer")
    attention = [g for g in spec.groups if g.is_attention and g.kind != "indexer"]
    states = [g for g in spec.groups if g.kind in STATE_KINDS]
    note = ""

    def per_layer_token(g: LayerGroup) -> int:
        own = token_bytes(g, kv, tp)[0] // g.layers
        if indexer is not None and g.kind == "mla":
            own += token_bytes(indexer, kv, tp)[0] // indexer.layers  # UniformTypeKVCacheSpecs
        return own

    if states:
        # HybridAttentionMambaModelConfig: raise the attention block so its page holds a state page
        attn_token = per_layer_token(attention[0]) if attention else 0
        state_page = max(_state_page(g, kv_dtype_name, tp, state_dtype, ssm_dtype) for g in states)
        if attn_token:
            needed = 16 * cdiv(state_page, 16 * attn_token)
            if block_size < needed:
                note = (
                    f"attention block size raised to 16 x cdiv({state_page:,} B state page, 16 x "
                    f"{attn_token:,} B/token) = {needed} tokens"
                )
                block_size = needed
            page = block_size * attn_token
            if page > state_page:
                note += ("; " if note else "") + f"state page padded from {state_page:,} to {page:,} B"
        else:
            page = state_page
        pages = {id(g): page for g in attention + states}
        blocks = {id(g): (1 if g in states else block_size) for g in attention + states}
        types = _group_types(tuple(attention + states))
    else:
        types = _group_types(tuple(attention))
        pages = {id(g): block_size * per_layer_token(g) for g, _ in types}
        page = max(pages.values())
        blocks = {}
        for g, _ in types:  # unify_kv_cache_spec_page_size: grow the block size of smaller pages
            if page % pages[id(g)]:
                raise ValueError(
                    "vLLM cannot serve this model: its layers' page sizes do not divide each other "
                    f"({sorted(set(pages.values()))} bytes per {block_size}-token block)"
                )
            blocks[id(g)] = block_size * (page // pages[id(g)])

    def block_of(g: LayerGroup) -> int:
        return blocks[id(g)] if id(g) in blocks else block_size

    if len(types) == 1:
        g, layers = types[0]
        only = CacheGroup(g.kind, g.window, block_of(g), tuple(layers), 0)
        return VllmLayout((only,), len(layers), page, spec.num_layers, note)

    counts = [len(layers) for _, layers in types]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    out = []
    for g, layers in types:
        n_groups = cdiv(len(layers), group_size)
        for i in range(n_groups):
            members = tuple(layers[i::n_groups])
            out.append(CacheGroup(g.kind, g.window, block_of(g), members, group_size - len(members)))
    return VllmLayout(tuple(out), group_size, page, spec.num_layers, note)


@dataclass(frozen=True)
class VllmCapacity:
    """What vLLM allocates on one engine instance (one replica), and what it logs at start-up."""

    layout: VllmLayout
    available: int  # KV memory per GPU
    pp: int
    num_blocks: int
    seq_len: int
    max_num_batched_tokens: int
    steady_blocks: int  # per request at seq_len
    logged_blocks: int  # per request at seq_len, as the start-up log budgets it

    @property
    def steady_concurrency(self) -> Fraction:
        return Fraction(self.num_blocks, self.steady_blocks) if self.steady_blocks else Fraction(0)

    @property
    def logged_concurrency(self) -> Fraction:
        return Fraction(self.num_blocks, self.logged_blocks) if self.logged_blocks else Fraction(0)

    @property
    def kv_cache_tokens(self) -> int:
        """vLLM's 'GPU KV cache size: N tokens' log line."""
        attention = [g.block_size for g in self.layout.groups if not g.is_state]
        return self.num_blocks // len(self.layout.groups) * min(attention or [1])

    @property
    def startup_needed(self) -> int:
        """Memory vLLM's start-up check wants for one request of seq_len (per GPU)."""
        return self.layout.block_bytes * self.logged_blocks

    @property
    def startup_ok(self) -> bool:
        return self.available > 0 and self.startup_needed <= self.available


def num_blocks(lay: VllmLayout, available: int, pp: int = 1) -> int:
    if available <= 0:
        return 0
    if pp == 1:
        return available // lay.page_bytes // lay.group_size
    sizes = [lay.stage_group_size(stage) for stage in pp_stages(lay.num_layers, pp)]
    return min(available // lay.page_bytes // size for size in sizes if size)


def capacity(
    lay: VllmLayout, available: int, seq_len: int, *, pp: int = 1, max_num_batched_tokens: int = 8192
) -> VllmCapacity:
    return VllmCapacity(
        layout=lay,
        available=available,
        pp=pp,
        num_blocks=num_blocks(lay, available, pp),
        seq_len=seq_len,
        max_num_batched_tokens=max_num_batched_tokens,
        steady_blocks=lay.steady_blocks(seq_len),
        logged_blocks=lay.logged_blocks(seq_len, max_num_batched_tokens),
    )


__all__ = [
    "ATTENTION_KINDS",
    "CacheGroup",
    "VllmCapacity",
    "VllmLayout",
    "capacity",
    "layout",
    "pp_stages",
    "unsupported",
]
