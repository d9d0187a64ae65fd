"""vLLM's v1 KV-cache allocator, modelled from vllm/v1/core/kv_cache_utils.py and
vllm/v1/kv_cache_interface.py, for models whose layers are all attention (full, sliding, chunked,
MLA).

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

from app.kvcache.dtypes import kv_dtype
from app.kvcache.formulas import token_bytes
from app.kvcache.spec import ATTENTION_KINDS, LayerGroup, ModelSpec

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM's default for online serving on large GPUs


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class CacheGroup:
    """One vLLM KV-cache group: layers of one attention type sharing a block table."""

    kind: str  # full / sliding / chunked / mla
    span: int | None  # sliding window or chunk size
    block_size: int
    layers: tuple[int, ...]
    padding: int

    def steady_blocks(self, seq_len: int) -> int:
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
        b = self.block_size
        if self.kind == "sliding":
            assert self.span is not None
            return cdiv(min(self.span - 1 + max_num_batched_tokens, max_model_len), b) + 1
        if self.kind == "chunked":
            assert self.span is not None
            return cdiv(min(self.span + max_num_batched_tokens, max_model_len), b)
        return cdiv(max_model_len, b)

    def describe_steady(self, seq_len: int) -> str:
        b, n = self.block_size, self.steady_blocks(seq_len)
        if self.kind == "sliding":
            return f"min(cdiv({seq_len:,}, {b}), cdiv({self.span:,} - 1, {b}) + 1) = {n:,}"
        if self.kind == "chunked":
            return f"min(cdiv({seq_len:,}, {b}), blocks one {self.span:,}-token chunk touches) = {n:,}"
        return f"cdiv({seq_len:,}, {b}) = {n:,}"

    def describe_logged(self, max_model_len: int, batched: int) -> str:
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
        return f"{len(self.groups)} KV-cache groups of {self.group_size} layers ({parts}{pad})"


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
    return (g.kind, g.window, g.kv_heads, g.head_dim, g.v_dim, g.kv_lora_rank, g.qk_rope_head_dim)


def _group_types(groups: tuple[LayerGroup, ...]) -> list[tuple[LayerGroup, list[int]]]:
    """Layers by KV-cache spec, in order of each type's first layer (vLLM builds a dict in
    layer order)."""
    merged: dict[tuple, tuple[LayerGroup, list[int]]] = {}
    for g in sorted(groups, key=lambda g: g.layer_indices[0]):
        _, layers = merged.setdefault(_signature(g), (g, []))
        layers.extend(g.layer_indices)
    return [(g, sorted(layers)) for g, layers in merged.values()]


def layout(spec: ModelSpec, kv_dtype_name: str, *, tp: int = 1, block_size: int = 16) -> VllmLayout | None:
    """vLLM's KV-cache groups for `spec`; None when the model has recurrent-state layers (vLLM
    aligns Mamba pages to attention pages, which this model does not cover)."""
    if any(not g.is_attention for g in spec.groups) or not spec.groups:
        return None
    kv = kv_dtype(kv_dtype_name)
    types = _group_types(spec.groups)
    pages = {id(g): block_size * (token_bytes(g, kv, tp)[0] // g.layers) for g, _ in types}
    page = max(pages.values())
    blocks: dict[int, int] = {}
    for g, _ in types:  # unify_kv_cache_spec_page_size: grow the block size of smaller pages
        if page % pages[id(g)]:
            raise ValueError(
                "vLLM cannot serve this model: its layers' page sizes do not divide each other "
                f"({sorted(set(pages.values()))} bytes per {block_size}-token block)"
            )
        blocks[id(g)] = block_size * (page // pages[id(g)])

    if len(types) == 1:
        g, layers = types[0]
        only = CacheGroup(g.kind, g.window, blocks[id(g)], tuple(layers), 0)
        return VllmLayout((only,), len(layers), page, spec.num_layers)

    counts = [len(layers) for _, layers in types]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    out = []
    for g, layers in types:
        n_groups = cdiv(len(layers), group_size)
        for i in range(n_groups):
            members = tuple(layers[i::n_groups])
            out.append(CacheGroup(g.kind, g.window, blocks[id(g)], members, group_size - len(members)))
    return VllmLayout(tuple(out), group_size, page, spec.num_layers)


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
        return self.num_blocks // len(self.layout.groups) * min(g.block_size for g in self.layout.groups)

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


__all__ = ["ATTENTION_KINDS", "CacheGroup", "VllmCapacity", "VllmLayout", "capacity", "layout", "pp_stages"]
