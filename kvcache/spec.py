"""ModelSpec: what a model's config.json says about its cache, parsed once into layer groups.

A model's decoder layers fall into groups that hold the same thing per token or per sequence:

* ``full``     - standard attention (MHA / GQA / MQA): K and V for every token.
* ``sliding``  - sliding-window attention: K and V for the last ``window`` tokens only.
* ``chunked``  - Llama 4 chunked local attention: K and V for the tokens of the current
                 ``attention_chunk_size`` chunk only (``window`` holds the chunk size).
* ``mla``      - DeepSeek's multi-head latent attention: one compressed latent of
                 ``kv_lora_rank + qk_rope_head_dim`` values per token, shared by all heads.
* ``mla_kv``   - the same layers as an engine that decompresses the latent stores them
                 (transformers 4.x): per head, K of qk_nope + qk_rope values and V of v_head_dim.
* ``indexer``  - DeepSeek-V3.2's lightning-indexer keys: one key of ``index_head_dim`` values per
                 token per layer, beside the MLA latent of the same layers (sparse attention).
* ``mamba`` / ``mamba2`` / ``linear_attention`` (gated DeltaNet, Qwen3-Next) - recurrent layers
                 holding a fixed-size convolution window + recurrent state per sequence.
* ``lightning`` - MiniMax lightning (linear) attention: one heads x head_dim x head_dim state per
                 sequence, no convolution.

A layer may hold two parts (Falcon-H1 runs attention and Mamba-2 side by side in every layer: its
index is in a ``full`` and a ``mamba2`` group). Layers that reuse another layer's K/V (Gemma-3n's
last ``num_kv_shared_layers``) are in no group: they keep nothing.

Never a silent wrong number: a config naming layer kinds, layer-type values or cache-shaping fields
(``layer_types``, ``attn_type_list``, ``hybrid_override_pattern``, ``layers_block_type``,
``num_kv_shared_layers``, ``index_*``, ``mamba_*``, ``ssm_*``, ``linear_*``) this module does not
understand for the family is refused with a ``ValueError`` naming the field (``_check_understood``).

``ModelSpec.from_hf_config`` reads a Hugging Face config.json as published (nested ``text_config``,
implicit per-architecture patterns, hybrids) and raises ``ValueError`` naming the field when a
required field is missing or invalid. The arithmetic lives in ``formulas``; this module only
decides which layer holds what.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvcache import conventions
from kvcache import params as _params

_ARCH_DEFAULTS_FILE = Path(__file__).resolve().parent / "data" / "arch_defaults.json"

ATTENTION_KINDS = ("full", "sliding", "chunked", "mla", "mla_kv", "indexer")
# kinds that store K and V per KV head (the others store one latent per token)
KV_HEAD_KINDS = ("full", "sliding", "chunked", "mla_kv")
MAX_LAYERS = 10_000
STATE_KINDS = ("mamba", "mamba2", "linear_attention", "lightning")

# Names other model families use for the standard fields (GPT-2 / GPT-J / GPT-BigCode: n_embd,
# n_head, n_layer, n_positions; Falcon: num_kv_heads; RefinedWeb and BLOOM: n_head, n_layer,
# n_embed; MPT: d_model, n_heads, n_layers, max_seq_len). Family-only names live in arch_defaults.
_ALIASES = {
    "num_hidden_layers": ("n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("n_head", "num_heads", "n_heads"),
    "hidden_size": ("n_embd", "d_model"),
    "max_position_embeddings": ("n_positions", "max_seq_len", "seq_length"),
    "num_key_value_heads": ("num_kv_heads", "n_kv_heads"),
}

# Falcon's three historical model_type names; their KV-head rule is in _falcon_kv_heads.
FALCON_TYPES = ("falcon", "RefinedWeb", "RefinedWebModel")

# layer_types vocabulary (transformers' names) -> our kinds. "mamba" is refined to mamba2 below
# when the config carries Mamba-2 fields.
_LAYER_TYPE_KINDS = {
    "full_attention": "full",
    "attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear_attention",  # refined to lightning for MiniMax (_linear_kind)
    "mamba": "mamba",
    "mamba2": "mamba2",
    # transformers' names for layers without any cache (DummyLayer in cache_utils)
    "moe": None,
    "mlp": None,
}
# layers_block_type (vLLM / NVIDIA hybrid configs): same idea, other spellings
_BLOCK_TYPE_KINDS = {"mamba": "mamba", "attention": "full", "mlp": None, "moe": None}
# MiniMax attn_type_list: 0 = lightning (linear) attention, 1 = softmax attention
_ATTN_TYPE_KINDS = {0: "lightning", 1: "full"}

# Nemotron-H hybrid_override_pattern characters: M = Mamba-2 layer, * = attention, - = MLP only,
# E = MoE only. MLP / MoE layers hold no cache.
_PATTERN_KINDS = {"M": "mamba2", "*": "full", "-": None, "E": None}


@dataclass(frozen=True)
class StateDims:
    """Shape of a recurrent layer's per-sequence state, in one form for Mamba-1, Mamba-2 and
    gated-delta-net linear attention (see formulas.state_values for the arithmetic).

    heads x head_dim channels carry the SSM state (heads is what tensor parallelism splits);
    groups x group_dim channels are the shared B/C (Mamba-2) or q/k (linear attention)
    projections that also pass through the causal convolution.
    """

    heads: int
    head_dim: int
    state_size: int
    conv_kernel: int
    groups: int = 0
    group_dim: int = 0


@dataclass(frozen=True)
class LayerGroup:
    """Layers that hold the same cache, with the fields the formula for their kind needs."""

    kind: str
    layer_indices: tuple[int, ...]
    kv_heads: int = 0
    head_dim: int = 0  # K values per head (and V, unless v_head_dim is set)
    window: int | None = None  # sliding window, or the chunk size of chunked layers
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    state: StateDims | None = None
    v_head_dim: int = 0  # 0 = same as head_dim; MLA's V head size for mla groups
    qk_nope_head_dim: int = 0  # MLA only: what a decompressing engine stores per head in K
    mla_heads: int = 0  # MLA only: attention heads, for the decompressed layout
    owner: str = ""  # "" = the model itself; e.g. "draft Llama 3.2 1B" for a speculative draft
    # Engine conventions (set by engines.for_engine, empty = the breakdown's arguments):
    # conv_dtype / ssm_dtype: "kv" = the KV dtype (the model dtype, for engines whose cache follows
    # it), or a STATE_DTYPES name; conv_columns: convolution-state columns kept (0 = kernel - 1);
    # layout: a byte layout of the engine's own ("ds_mla", "fp8_scale128"; transformers 5's
    # "tf5_fp8" = fp8 with per-tensor scales, "tf5_static" = model dtypes only; formulas.token_bytes).
    conv_dtype: str = ""
    ssm_dtype: str = ""
    conv_columns: int = 0
    layout: str = ""
    convention: str = ""  # the engine rule behind the above, with its source

    @property
    def v_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def layers(self) -> int:
        return len(self.layer_indices)

    @property
    def is_attention(self) -> bool:
        return self.kind in ATTENTION_KINDS


@dataclass(frozen=True)
class ModelSpec:
    """Everything the calculator needs to know about one model."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    max_context: int
    groups: tuple[LayerGroup, ...]
    params_total: int
    params_active: int
    params_note: str = "estimated from config.json"
    extras: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_hf_config(cls, config: dict, name: str | None = None) -> ModelSpec:
        """Parse a Hugging Face config.json (as a dict). Raises ValueError naming a bad field.

        The spec carries the default engine's (vLLM's) conventions for state dtypes and indexer
        layouts, so ``kv_cache_bytes(spec, ...)`` is vLLM's figure; ``engines.for_engine`` gives
        another engine's."""
        spec = _parse(config, name)
        groups = conventions.apply(spec.groups, "vllm", spec.model_type, spec.extras["mamba_ssm_cache_dtype"])
        return dataclasses.replace(spec, groups=groups)

    def group(self, kind: str) -> LayerGroup | None:
        return next((g for g in self.groups if g.kind == kind), None)

    @property
    def kv_heads(self) -> int:
        """KV heads of the standard attention layers (0 when the model has none)."""
        return next((g.kv_heads for g in self.groups if g.kind in ("full", "sliding", "chunked")), 0)

    @property
    def attention_label(self) -> str:
        """Short description such as 'GQA 64q/8kv', 'MLA', 'GQA + sliding 4096', 'hybrid'."""
        parts = []
        if self.group("mla"):
            parts.append("MLA")
        elif self.kv_heads:
            kv, q = self.kv_heads, self.num_attention_heads
            kind = "MHA" if kv == q else ("MQA" if kv == 1 else "GQA")
            parts.append(f"{kind} {q}q/{kv}kv")
        if self.group("mla_kv"):
            parts.append("MLA decompressed K/V")
        windows = sorted({g.window for g in self.groups if g.kind == "sliding" and g.window is not None})
        if windows:
            full = any(g.kind in ("full", "mla", "mla_kv") for g in self.groups)
            w = "/".join(str(x) for x in windows)
            parts.append(f"sliding {w}" + (" + global" if full else ""))
        chunks = sorted({g.window for g in self.groups if g.kind == "chunked" and g.window is not None})
        if chunks:
            parts.append("chunked " + "/".join(str(x) for x in chunks) + (" + global" if self.group("full") else ""))
        if any(g.kind in STATE_KINDS for g in self.groups):
            parts.append("hybrid " + "/".join(sorted({g.kind for g in self.groups if g.kind in STATE_KINDS})))
        return " + ".join(parts)


# ---------------------------------------------------------------------------------------------
# parsing


@lru_cache(maxsize=1)
def _arch_defaults() -> dict[str, dict]:
    """model_type -> {"source": str, "defaults": {...}, "aliases": {...}} (arch_defaults.json)."""
    raw = json.loads(_ARCH_DEFAULTS_FILE.read_text(encoding="utf-8"))
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def family_source(model_type: str) -> str | None:
    """The config class a family's conventions come from (short form), None for unknown ones."""
    entry = _arch_defaults().get(model_type)
    return entry["source"].split(":")[0] if entry else None


def _present(cfg: dict, key: str) -> bool:
    """The file names the field (under its own or another family's name). An explicit null
    counts: transformers keeps it as None (e.g. "sliding_window": null turns windows off)."""
    return key in cfg or any(a in cfg for a in _ALIASES.get(key, ()))


def _merged(config: Any) -> tuple[dict, list[str]]:
    """The text model's fields (a multimodal wrapper's text_config wins over its top level) with
    the family's own names mapped and its config-class defaults filled in; plus one note per value
    that did not come from the file, naming its source."""
    if not isinstance(config, dict):
        raise ValueError("config.json must be a JSON object")
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ValueError("'text_config' must be a JSON object")
    cfg = {k: v for k, v in config.items() if k not in ("text_config", "vision_config", "audio_config")}
    if text:
        cfg.update(text)
    notes: list[str] = []
    model_type = str(cfg.get("model_type", ""))
    family = _arch_defaults().get(model_type)
    if family:
        source = family_source(model_type)
        for old, new in family.get("aliases", {}).items():
            if cfg.get(old) is not None and not _present(cfg, new):
                cfg[new] = cfg[old]
                notes.append(f"{new} = {cfg[old]!r} read from '{old}' ({source})")
        for key, value in family["defaults"].items():
            if not _present(cfg, key):
                cfg[key] = value
                if key in _NOTED_DEFAULTS:
                    notes.append(f"{key} = {json.dumps(value)}: not in config.json; default of {source}")
    return cfg, notes


# Defaults worth a line in the working (they change the cache or its limits); tie_word_embeddings
# and vocab_size only move the weight estimate.
_NOTED_DEFAULTS = frozenset(
    {
        "max_position_embeddings",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "sliding_window_pattern",
        "sliding_window",
        "attention_chunk_size",
        "multi_query",
        "new_decoder_architecture",
    }
)


def _falcon_kv_heads(cfg: dict, heads: int) -> tuple[int, str]:
    """KV heads Falcon caches: num_kv_heads with the new decoder architecture (40B/180B), one
    with multi_query (7B), else one per attention head. Same rule in transformers' FalconAttention
    and vLLM's falcon.py."""
    if cfg.get("new_decoder_architecture"):
        name, value = _get(cfg, "num_key_value_heads")
        kv = heads if value is None else _as_int(name, value)
        return kv, f"new_decoder_architecture: {kv} KV heads (num_kv_heads)"
    if cfg.get("multi_query"):
        return 1, "multi_query: one KV head shared by all query heads"
    return heads, "multi_query false: one KV head per attention head"


def _mpt_kv_heads(cfg: dict, heads: int) -> tuple[int, str]:
    """MPT keeps its KV-head count in attn_config.kv_n_heads (GQA variants); absent = multi-head."""
    attn = cfg.get("attn_config") or {}
    if not isinstance(attn, dict):
        raise ValueError("config.json: 'attn_config' must be a JSON object")
    if attn.get("kv_n_heads") is None:
        return heads, "attn_config has no kv_n_heads: multi-head attention"
    kv = _as_int("attn_config.kv_n_heads", attn["kv_n_heads"])
    return kv, f"{kv} KV heads from attn_config.kv_n_heads"


def _get(cfg: dict, key: str) -> tuple[str, Any]:
    """Value of `key` or of one of its aliases, with the name it was found under."""
    if key in cfg:
        return key, cfg[key]
    for alias in _ALIASES.get(key, ()):
        if alias in cfg:
            return alias, cfg[alias]
    return key, None


def _as_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"config.json: '{name}' must be an integer, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"config.json: '{name}' must be an integer, got {value!r}")
        value = int(value)
    if value < minimum:
        raise ValueError(f"config.json: '{name}' must be at least {minimum}, got {value}")
    return value


def _req(cfg: dict, key: str, minimum: int = 1) -> int:
    name, value = _get(cfg, key)
    if value is None:
        raise ValueError(f"config.json: required field '{key}' is missing")
    return _as_int(name, value, minimum)


def _opt(cfg: dict, key: str, minimum: int = 1) -> int | None:
    name, value = _get(cfg, key)
    return None if value is None else _as_int(name, value, minimum)


def _first(cfg: dict, *keys: str) -> tuple[str, int | None]:
    """First present of several equivalent field names (families name Mamba fields differently)."""
    for key in keys:
        if cfg.get(key) is not None:
            return key, _as_int(key, cfg[key])
    return keys[0], None


def _first_req(cfg: dict, *keys: str) -> int:
    name, value = _first(cfg, *keys)
    if value is None:
        raise ValueError(f"config.json: required field '{name}' is missing")
    return value


def _typed_list(cfg: dict, name: str, n_layers: int, vocab: dict, index_name: str | None = None) -> list[str | None]:
    """A per-layer list (layer_types, layers_block_type, attn_type_list) mapped through `vocab`;
    any value outside it is refused naming the field and the layer."""
    values = cfg[name]
    if not isinstance(values, list) or len(values) != n_layers:
        raise ValueError(f"config.json: '{name}' must list one entry per layer ({n_layers} layers)")
    out: list[str | None] = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (str, int)) or v not in vocab:
            supported = ", ".join(str(k) for k in vocab)
            raise ValueError(f"config.json: {index_name or name}[{i}] is {v!r}; supported: {supported}")
        out.append(vocab[v])
    return out


def _linear_kind(cfg: dict, model_type: str) -> str:
    """What a layer_types 'linear_attention' layer is: MiniMax lightning attention, or gated
    DeltaNet (Qwen3-Next) when the config carries its linear_* fields; anything else is refused."""
    if model_type.startswith("minimax"):
        return "lightning"
    if cfg.get("linear_key_head_dim") is not None or model_type == "qwen3_next":
        return "linear_attention"
    raise ValueError(
        f"config.json: layer_types has 'linear_attention' layers, but model_type {model_type!r} is "
        "neither MiniMax (lightning attention) nor gated DeltaNet (no linear_key_head_dim): the engine "
        "does not know their state"
    )


def _layer_kinds(
    cfg: dict, n_layers: int, model_type: str, ignored: dict[str, str]
) -> tuple[list[str | None], int | None]:
    """Kind of every layer (None = no cache) and the sliding window, following the config. A window
    or chunk size no layer uses is recorded in `ignored` when an explicit layer list says so, and
    refused when the layers come from a rule that never reads it (never computed as if unused)."""
    kinds, window = _kinds_and_window(cfg, n_layers, model_type)
    # the field that placed the layers, when it says per layer which kind each is
    if cfg.get("layer_types") is not None:
        listed = "layer_types"
    elif cfg.get("no_rope_layers"):
        listed = "no_rope_layers"
    elif cfg.get("use_sliding_window") is True and cfg.get("max_window_layers") is not None:
        listed = "max_window_layers"  # Qwen2: the window applies from that layer on
    else:
        listed = ""
    unused = []
    if cfg.get("use_sliding_window") is not False and cfg.get("sliding_window") is not None and "sliding" not in kinds:
        unused.append(("sliding_window", "sliding"))
    if cfg.get("attention_chunk_size") is not None and "chunked" not in kinds:
        unused.append(("attention_chunk_size", "chunked"))
    for key, kind in unused:
        if not listed:
            raise ValueError(
                f"config.json: '{key}' is set, but this config's layers come from a rule that has no {kind} "
                "layers; the engine does not know how this family applies it, so it refuses rather than "
                "ignoring it"
            )
        ignored[key] = f"{listed} leaves no {kind} layer"
    return kinds, window


def _kinds_and_window(cfg: dict, n_layers: int, model_type: str) -> tuple[list[str | None], int | None]:
    use = cfg.get("use_sliding_window")
    if use is not None and not isinstance(use, bool):
        raise ValueError(f"config.json: 'use_sliding_window' must be true or false, got {use!r}")
    window = _opt(cfg, "sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None  # Qwen2/Qwen3 publish a sliding_window they do not use

    lists = [
        k
        for k in ("layer_types", "layers_block_type", "attn_type_list", "hybrid_override_pattern")
        if cfg.get(k) is not None
    ]
    if len(lists) > 1:
        # two descriptions of the same layers: which one an engine reads differs, so refuse
        raise ValueError(f"config.json: both '{lists[0]}' and '{lists[1]}' describe the layers; keep one")

    if model_type == "falcon_h1":  # every layer runs attention and Mamba-2 side by side
        if lists:
            raise ValueError(f"config.json: '{lists[0]}' in a Falcon-H1 config is not understood")
        if cfg.get("attn_layer_indices") is not None:
            raise ValueError(
                "config.json: 'attn_layer_indices' (Falcon-H1 with attention on some layers only) is not supported"
            )
        return ["full"] * n_layers, None

    if cfg.get("layer_types") is not None:
        kinds = _typed_list(cfg, "layer_types", n_layers, _LAYER_TYPE_KINDS)
        if "linear_attention" in kinds:
            linear = _linear_kind(cfg, model_type)
            kinds = [linear if k == "linear_attention" else k for k in kinds]
        if "sliding" in kinds and window is None:
            raise ValueError("config.json: 'sliding_window' is missing but layer_types has sliding layers")
        if "chunked" in kinds and cfg.get("attention_chunk_size") is None:
            raise ValueError("config.json: 'attention_chunk_size' is missing but layer_types has chunked layers")
        return kinds, window

    if cfg.get("layers_block_type") is not None:
        return _typed_list(cfg, "layers_block_type", n_layers, _BLOCK_TYPE_KINDS), None

    if cfg.get("attn_type_list") is not None:  # MiniMax-Text-01 / M1
        if not model_type.startswith("minimax"):
            raise ValueError(
                f"config.json: 'attn_type_list' is MiniMax's; not understood for model_type {model_type!r}"
            )
        return _typed_list(cfg, "attn_type_list", n_layers, _ATTN_TYPE_KINDS), None

    if cfg.get("attention_chunk_size") is not None:  # Llama 4: chunked local attention
        _req(cfg, "attention_chunk_size")
        no_rope = cfg.get("no_rope_layers")
        if no_rope:  # 1 = RoPE layer (chunked), 0 = NoPE layer (global, full attention)
            if not isinstance(no_rope, list) or len(no_rope) != n_layers or any(v not in (0, 1) for v in no_rope):
                raise ValueError(f"config.json: 'no_rope_layers' must list 0 or 1 for each of the {n_layers} layers")
            return ["chunked" if v else "full" for v in no_rope], None
        interval = _opt(cfg, "no_rope_layer_interval") or 4  # Llama4TextConfig default
        return ["chunked" if (i + 1) % interval else "full" for i in range(n_layers)], None

    if cfg.get("hybrid_override_pattern") is not None:
        pattern = cfg["hybrid_override_pattern"]
        if not isinstance(pattern, str) or len(pattern) != n_layers:
            raise ValueError(f"config.json: 'hybrid_override_pattern' must have one character per layer ({n_layers})")
        bad = sorted(set(pattern) - set(_PATTERN_KINDS))
        if bad:
            raise ValueError(f"config.json: 'hybrid_override_pattern' has unknown characters {bad}")
        return [_PATTERN_KINDS[c] for c in pattern], None

    if cfg.get("attn_layer_period") is not None:  # Jamba: attention every period-th layer
        period = _req(cfg, "attn_layer_period")
        offset = _req(cfg, "attn_layer_offset", minimum=0)
        kinds = ["full" if i % period == offset else "mamba" for i in range(n_layers)]
        return kinds, None

    if cfg.get("full_attention_interval") is not None:  # Qwen3-Next: 3 linear, 1 full, repeat
        interval = _req(cfg, "full_attention_interval")
        kinds = ["full" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
        return kinds, None

    if model_type in PURE_STATE_TYPES:  # Mamba-1 / Falcon-Mamba / Mamba-2: every layer is a mixer
        return [PURE_STATE_TYPES[model_type]] * n_layers, None
    if model_type in _PURE_SSM_TYPES:
        raise ValueError(
            f"config.json: model_type {model_type!r} is a pure state-space model; the engine does not cover it yet"
        )
    if window is None:
        return ["full"] * n_layers, None
    pattern = _opt(cfg, "sliding_window_pattern")
    if pattern is not None:  # Gemma 2/3: every pattern-th layer is global
        return ["sliding" if (i + 1) % pattern else "full" for i in range(n_layers)], window
    if cfg.get("use_sliding_window") is True and cfg.get("max_window_layers") is not None:
        first = _req(cfg, "max_window_layers", minimum=0)  # Qwen2: layers from here on slide
        return ["sliding" if i >= first else "full" for i in range(n_layers)], window
    return ["sliding"] * n_layers, window  # Mistral, Phi-3: every layer slides


# attention-free models whose every layer is one Mamba mixer (transformers MambaConfig,
# FalconMambaConfig, Mamba2Config; vLLM mamba.py / mamba2.py)
STATE_MODEL_CONTEXT = 1_048_576
PURE_STATE_TYPES = {"mamba": "mamba", "falcon_mamba": "mamba", "mamba2": "mamba2"}
_PURE_SSM_TYPES = ("rwkv", "rwkv7", "xlstm")


def _mamba_d_head(cfg: dict, inner: int, heads: int) -> int:
    """Falcon-H1's mamba_d_head may be "auto": d_ssm / n_heads (FalconH1Config)."""
    if cfg.get("mamba_d_head") == "auto":
        if inner % heads:
            raise ValueError(f"config.json: mamba_d_ssm ({inner}) is not divisible by mamba_n_heads ({heads})")
        return inner // heads
    return _first_req(cfg, "mamba_head_dim", "mamba_d_head")


def _state_dims(cfg: dict, kind: str, hidden: int, ignored: dict[str, str]) -> StateDims:
    if kind == "mamba":
        expand = _first_req(cfg, "mamba_expand", "expand")
        if cfg.get("model_type") in PURE_STATE_TYPES and cfg.get("intermediate_size") is not None:
            # MambaConfig / FalconMambaConfig.__post_init__ set intermediate_size = int(expand *
            # hidden_size) whatever the file says, and vLLM's mamba.py reads that attribute: a file
            # whose two fields disagree has no single answer, so refuse rather than pick one
            given = _as_int("intermediate_size", cfg["intermediate_size"])
            if given != expand * hidden:
                raise ValueError(
                    f"config.json: intermediate_size ({given:,}) is not expand x hidden_size "
                    f"({expand} x {hidden:,}); transformers sizes the Mamba mixer from expand, so the "
                    "state size is ambiguous"
                )
        return StateDims(
            heads=expand * hidden,  # d_inner channels, each with its own d_state SSM state
            head_dim=1,
            state_size=_first_req(cfg, "mamba_d_state", "state_size", "ssm_state_size"),
            conv_kernel=_first_req(cfg, "mamba_d_conv", "conv_kernel"),
        )
    if kind == "mamba2" and cfg.get("model_type") == "mamba2":
        # pure Mamba-2 (Mamba2Config): its own names; Mamba2Config.validate_architecture requires
        # num_heads x head_dim == expand x hidden_size, the mixer width
        heads = _req(cfg, "num_heads")
        head_dim = _req(cfg, "head_dim")
        expand = _req(cfg, "expand")
        if heads * head_dim != expand * hidden:
            raise ValueError(
                f"config.json: num_heads x head_dim ({heads} x {head_dim}) must equal expand x hidden_size "
                f"({expand} x {hidden})"
            )
        state = _req(cfg, "state_size")
        return StateDims(
            heads=heads,
            head_dim=head_dim,
            state_size=state,
            conv_kernel=_req(cfg, "conv_kernel"),
            groups=_req(cfg, "n_groups"),
            group_dim=state,
        )
    if kind == "mamba2":
        state = _first_req(cfg, "ssm_state_size", "mamba_d_state")
        heads = _first_req(cfg, "mamba_num_heads", "mamba_n_heads")
        if cfg.get("mamba_d_ssm") is not None or cfg.get("model_type") == "falcon_h1":
            # Falcon-H1: the Mamba width is mamba_d_ssm, else mamba_expand x hidden_size (FalconH1Config)
            if cfg.get("mamba_d_ssm") is not None:
                inner = _as_int("mamba_d_ssm", cfg["mamba_d_ssm"])
                if "mamba_expand" in cfg:
                    ignored["mamba_expand"] = "mamba_d_ssm is given, so the Mamba width does not use mamba_expand"
            else:
                inner = _first_req(cfg, "mamba_expand") * hidden
            head_dim = _mamba_d_head(cfg, inner, heads)
            if heads * head_dim != inner:
                raise ValueError(
                    f"config.json: mamba_n_heads x mamba_d_head ({heads} x {head_dim}) must equal the Mamba "
                    f"width mamba_d_ssm ({inner}; mamba_expand x hidden_size when mamba_d_ssm is absent)"
                )
        else:
            head_dim = _mamba_d_head(cfg, 0, heads)
            if "mamba_expand" in cfg:
                ignored["mamba_expand"] = "the Mamba-2 width is mamba heads x head dim, not mamba_expand x hidden"
        return StateDims(
            heads=heads,
            head_dim=head_dim,
            state_size=state,
            conv_kernel=_first_req(cfg, "conv_kernel", "mamba_d_conv"),
            groups=_first_req(cfg, "n_groups", "mamba_n_groups"),
            group_dim=state,
        )
    if kind == "lightning":
        # MiniMax lightning attention: one head_dim x head_dim state per attention head (vLLM
        # MambaStateShapeCalculator.linear_attention_state_shape; transformers MiniMaxLightningAttention)
        heads = _req(cfg, "num_attention_heads")
        head_dim = _opt(cfg, "head_dim") or _req(cfg, "hidden_size") // heads
        return StateDims(heads=heads, head_dim=head_dim, state_size=head_dim, conv_kernel=1)
    # gated delta net (Qwen3-Next): state is v_heads x k_head_dim x v_head_dim
    k_dim = _req(cfg, "linear_key_head_dim")
    return StateDims(
        heads=_req(cfg, "linear_num_value_heads"),
        head_dim=_req(cfg, "linear_value_head_dim"),
        state_size=k_dim,
        conv_kernel=_req(cfg, "linear_conv_kernel_dim"),
        groups=_req(cfg, "linear_num_key_heads"),
        group_dim=k_dim,
    )


# Cache-shaping field families: every such field in a config must be one this module
# reads for the layer kinds the config has, or one known not to change the cache (with why).
_SHAPING_PREFIXES = ("index_", "indexer_", "mamba_", "ssm_", "linear_")
_SHAPING_NAMES = (
    "layer_types",
    "attn_type_list",
    "hybrid_override_pattern",
    "layers_block_type",
    "num_kv_shared_layers",
)
# fields read for each kind
_READ_FOR_KIND = {
    "mamba": ("mamba_expand", "mamba_d_state", "mamba_d_conv", "ssm_state_size"),
    "mamba2": (
        "ssm_state_size",
        "mamba_d_state",
        "mamba_num_heads",
        "mamba_n_heads",
        "mamba_head_dim",
        "mamba_d_head",
        "mamba_d_ssm",
        "mamba_d_conv",
        "mamba_n_groups",
        "mamba_expand",
    ),
    "linear_attention": (
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_conv_kernel_dim",
    ),
    "indexer": ("index_head_dim",),
}
# fields that never change what a layer caches, and why
NO_CACHE_FIELDS = {
    "mamba_chunk_size": "chunk length of the prefill scan; the state has the same shape",
    "mamba_conv_bias": "a bias of the convolution weights, not part of its state",
    "mamba_proj_bias": "projection bias (weights only)",
    "mamba_dt_rank": "rank of the dt projection (weights only)",
    "mamba_rms_norm": "a norm inside the mixer (weights only)",
    "mamba_norm_before_gate": "order of two operations, no state",
    "mamba_use_mlp": "an MLP beside the mixer (weights only)",
    "mamba_hidden_act": "activation function",
    "mamba_dt_min": "dt initialisation",
    "mamba_dt_max": "dt initialisation",
    "mamba_dt_init_floor": "dt initialisation",
    "mamba_dt_limit": "dt clamp",
    "mamba_dt_init": "dt initialisation",
    "mamba_dt_scale": "dt initialisation",
    "mamba_conv_init": "initialisation",
    "ssm_multipliers": "scalar multipliers of the SSM inputs (muP), no state",
    "ssm_in_multiplier": "scalar multiplier (muP)",
    "ssm_out_multiplier": "scalar multiplier (muP)",
    "linear_attn_alpha_factor": "MiniMax residual scale",
    "linear_attn_beta_factor": "MiniMax residual scale",
    "index_topk": "how many cached tokens the sparse attention reads, not how many are kept",
    "index_n_heads": "indexer query heads; the cached key is a single head of index_head_dim values",
    "indexer_rope_interleave": "rotary layout of the indexer key, same size",
}


def _check_understood(cfg: dict, kinds_present: set[str], ignored: dict[str, str]) -> None:
    read = {f for k in kinds_present for f in _READ_FOR_KIND.get(k, ())}
    for key in sorted(cfg):
        shaping = key.startswith(_SHAPING_PREFIXES) or key in _SHAPING_NAMES
        if not shaping or cfg[key] is None or key in read or key in NO_CACHE_FIELDS or key in ignored:
            continue
        if key in _SHAPING_NAMES:
            continue  # read by _layer_kinds / the KV-sharing rule, which validated it
        raise ValueError(
            f"config.json: field '{key}' shapes a cache the engine does not model for this config "
            f"(layer kinds here: {', '.join(sorted(kinds_present)) or 'none'}); refusing rather than "
            "computing it as plain attention"
        )


_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _ssm_cache_dtype(cfg: dict) -> str | None:
    value = cfg.get("mamba_ssm_cache_dtype")
    if value is None or value == "auto":
        return None
    if value not in _TORCH_DTYPES:
        raise ValueError(f"config.json: 'mamba_ssm_cache_dtype' {value!r} is not one of {', '.join(_TORCH_DTYPES)}")
    return _TORCH_DTYPES[value]


def _kv_shared(cfg: dict, kinds: list[str | None]) -> tuple[list[str | None], int]:
    """Gemma-3n: the last num_kv_shared_layers layers reuse the K/V of the last earlier layer of
    their type and keep none (transformers Gemma3nTextConfig.kv_sharing_modes -> DummyLayer; vLLM
    gives them no KV-cache spec, gemma3n.py kv_sharing_target_layer_name)."""
    if cfg.get("num_kv_shared_layers") is None:
        return kinds, 0
    shared = _as_int("num_kv_shared_layers", cfg["num_kv_shared_layers"], minimum=0)
    n = len(kinds)
    if shared >= n:
        raise ValueError(f"config.json: 'num_kv_shared_layers' ({shared}) must be below the {n} layers")
    first = n - shared
    for i in range(first, n):
        if kinds[i] is not None and kinds[i] not in kinds[:first]:
            raise ValueError(
                f"config.json: 'num_kv_shared_layers': layer {i} ({kinds[i]}) has no earlier layer of its kind to share"
            )
        if kinds[i] not in (None, "full", "sliding", "chunked"):
            raise ValueError(f"config.json: 'num_kv_shared_layers' over {kinds[i]} layers is not understood")
    return kinds[:first] + [None] * shared, shared


def _parse(config: dict, name: str | None) -> ModelSpec:
    cfg, notes = _merged(config)
    model_type = str(cfg.get("model_type") or "unknown")
    n_layers = _req(cfg, "num_hidden_layers")
    if n_layers > MAX_LAYERS:  # a typo'd config must not make us build a billion-entry layer list
        raise ValueError(f"config.json: 'num_hidden_layers' is {n_layers:,}; at most {MAX_LAYERS:,} supported")
    hidden = _req(cfg, "hidden_size")
    if model_type in PURE_STATE_TYPES and cfg.get("max_position_embeddings") is None:
        # a state-space model has no position table and keeps the same bytes at any length; the
        # page still needs an axis, so one is chosen and said
        max_ctx = STATE_MODEL_CONTEXT
        notes.append(
            f"no max_position_embeddings (a state-space model has no position limit): the context axis "
            f"stops at {STATE_MODEL_CONTEXT:,} tokens"
        )
    else:
        max_ctx = _req(cfg, "max_position_embeddings")
    ignored: dict[str, str] = {}
    kinds, window = _layer_kinds(cfg, n_layers, model_type, ignored)
    if any(k == "mamba" for k in kinds) and any(k in cfg for k in ("mamba_num_heads", "mamba_n_heads")):
        kinds = ["mamba2" if k == "mamba" else k for k in kinds]
    # per-layer entries of the layer list that cannot change the cache (the property test in
    # tests/unit/kvcache/test_spec.py accepts an unchanged figure only for these)
    listed = next((k for k in _SHAPING_NAMES[:4] if cfg.get(k) is not None), None)
    positions = {f"{listed}[{i}]": "an MLP / MoE-only layer keeps no cache" for i, k in enumerate(kinds) if k is None}
    kinds, shared = _kv_shared(cfg, kinds)
    if listed:
        positions.update(
            {
                f"{listed}[{i}]": "a KV-shared layer keeps nothing; its type only names the layer it reuses"
                for i in range(n_layers - shared, n_layers)
            }
        )
    if shared:
        notes.append(
            f"num_kv_shared_layers = {shared}: the last {shared} layers reuse earlier layers' K/V and keep none"
        )
    # parallel parts of one layer (Falcon-H1: attention + Mamba-2 in every layer)
    parallel: list[str | None] = ["mamba2"] * n_layers if model_type == "falcon_h1" else [None] * n_layers
    if model_type == "falcon_h1":
        notes.append("Falcon-H1: every layer keeps attention K/V and a Mamba-2 state side by side")

    if cfg.get("use_sliding_window") is not None and cfg.get("sliding_window") is None:
        ignored["use_sliding_window"] = "sliding_window is null: there is no window to turn on or off"
    if cfg.get("use_sliding_window") is False:
        for key in ("sliding_window", "max_window_layers"):
            if cfg.get(key) is not None:
                ignored[key] = (
                    "use_sliding_window is false: every layer is full attention (transformers Qwen2Config / "
                    "Qwen3Config drop the window, vLLM reads their layer_types)"
                )
    heads = kv_heads = head_dim = 0
    mla = cfg.get("kv_lora_rank") is not None
    if any(k in ATTENTION_KINDS for k in kinds):
        heads = _req(cfg, "num_attention_heads")
        if model_type in FALCON_TYPES:
            kv_heads, why = _falcon_kv_heads(cfg, heads)
            notes.append(f"Falcon {why} (transformers FalconAttention, vLLM falcon.py)")
        elif model_type == "mpt":
            kv_heads, why = _mpt_kv_heads(cfg, heads)
            notes.append(f"MPT: {why} (vLLM mpt.py)")
        elif model_type == "gpt_bigcode" and cfg.get("multi_query"):
            kv_heads = 1
            notes.append(f"GPT-BigCode multi_query: one KV head ({family_source(model_type)})")
        else:
            kv_name, kv_value = _get(cfg, "num_key_value_heads")
            kv_heads = heads if kv_value is None else _as_int(kv_name, kv_value)  # absent -> MHA
        if heads % kv_heads:
            raise ValueError(
                f"config.json: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )
        explicit = _opt(cfg, "head_dim")
        if explicit is None and cfg.get("attention_head_dim") is not None:
            explicit = _as_int("attention_head_dim", cfg["attention_head_dim"])  # Nemotron-H's name
        if explicit is not None:
            head_dim = explicit  # Qwen3, Gemma: not hidden_size / heads
        elif hidden % heads:
            raise ValueError(
                f"config.json: hidden_size ({hidden}) is not divisible by num_attention_heads "
                f"({heads}); the config must give 'head_dim'"
            )
        else:
            head_dim = hidden // heads

    lora = rope = 0
    if mla:
        lora = _req(cfg, "kv_lora_rank")
        rope = _req(cfg, "qk_rope_head_dim")
        kinds = ["mla" if k == "full" else k for k in kinds]
    indexed = model_type == "deepseek_v32" or cfg.get("index_topk") is not None
    if indexed:
        # DeepSeek-V3.2 sparse attention: vLLM's deepseek_v2.py tells V3.2 by hasattr(index_topk)
        if not mla:
            raise ValueError("config.json: 'index_topk' (a sparse-attention indexer) without MLA is not understood")
        index_dim = _req(cfg, "index_head_dim")
        notes.append(f"lightning indexer: one {index_dim}-value key per token per MLA layer")

    groups = []
    for kind in dict.fromkeys(k for k in kinds if k is not None):
        idx = tuple(i for i, k in enumerate(kinds) if k == kind)
        if kind in ("full", "sliding", "chunked"):
            span = {"sliding": window, "chunked": _opt(cfg, "attention_chunk_size")}.get(kind)
            groups.append(LayerGroup(kind, idx, kv_heads=kv_heads, head_dim=head_dim, window=span))
        elif kind == "mla":
            groups.append(
                LayerGroup(
                    kind,
                    idx,
                    kv_lora_rank=lora,
                    qk_rope_head_dim=rope,
                    qk_nope_head_dim=_opt(cfg, "qk_nope_head_dim", minimum=0) or 0,
                    v_head_dim=_opt(cfg, "v_head_dim", minimum=0) or 0,
                    mla_heads=heads,
                )
            )
            if indexed:
                groups.append(LayerGroup("indexer", idx, kv_heads=1, head_dim=index_dim))
        else:
            groups.append(LayerGroup(kind, idx, state=_state_dims(cfg, kind, hidden, ignored)))
    for kind in dict.fromkeys(k for k in parallel if k is not None):
        idx = tuple(i for i, k in enumerate(parallel) if k == kind)
        groups.append(LayerGroup(kind, idx, state=_state_dims(cfg, kind, hidden, ignored)))
    present = {g.kind for g in groups}
    _check_understood(cfg, present, ignored)
    notes.extend(f"{k} not used: {why}" for k, why in sorted(ignored.items()))

    total, active = _params.estimate(cfg, kinds, hidden, heads, kv_heads, head_dim)
    return ModelSpec(
        name=name or str(cfg.get("_name_or_path") or model_type),
        model_type=model_type,
        num_layers=n_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        max_context=max_ctx,
        groups=tuple(groups),
        params_total=total,
        params_active=active,
        extras={
            "vocab_size": cfg.get("vocab_size"),
            "conventions": tuple(notes),
            "ignored_fields": dict(ignored),
            "kv_shared_layers": shared,
            "ignored_positions": positions,
            "mamba_ssm_cache_dtype": _ssm_cache_dtype(cfg),
        },
    )
