"""Parameter-count estimate from a config.json, for pasted configs that have no published count.

Only weight memory uses it, so it counts the large matrices and ignores biases and norms
(well under 0.1 % of any current model). The catalog's published counts replace it for
catalog models. Per decoder layer:

* attention  q: hidden x heads x head_dim, k and v: hidden x kv_heads x head_dim each,
             o: heads x head_dim x hidden; MLA adds its low-rank down/up projections instead.
* MLP        3 x hidden x intermediate (gated: gate, up, down), or 2 x hidden x ffn_dim for
             OPT-style ungated MLPs.
* MoE        experts x 3 x hidden x moe_intermediate + shared experts + router; "active"
             counts num_experts_per_tok experts instead of all.
* Mamba / linear attention: input and output projections, convolution, SSM parameters.

Embeddings: vocab x hidden, twice unless tie_word_embeddings.
"""

from __future__ import annotations


def _i(cfg: dict, *keys: str, default: int = 0) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return default


def _attention(cfg: dict, kind: str | None, hidden: int, heads: int, kv: int, hd: int) -> int:
    if kind == "mla":
        nope, rope = _i(cfg, "qk_nope_head_dim"), _i(cfg, "qk_rope_head_dim")
        v_dim, lora, q_lora = _i(cfg, "v_head_dim"), _i(cfg, "kv_lora_rank"), _i(cfg, "q_lora_rank")
        q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        kv_proj = hidden * (lora + rope) + lora * heads * (nope + v_dim)
        return q + kv_proj + heads * v_dim * hidden
    if kind == "lightning":  # MiniMax: q, k, v, an output gate and the output projection
        return 5 * hidden * heads * hd
    if kind in ("full", "sliding", "chunked"):
        return 2 * hidden * heads * hd + 2 * hidden * kv * hd
    return 0


def _mixer(cfg: dict, kind: str | None, hidden: int) -> int:
    """Parameters of a Mamba / linear-attention token mixer."""
    if kind == "mamba":
        d_inner = _i(cfg, "mamba_expand", "expand", default=2) * hidden
        d_state = _i(cfg, "mamba_d_state", "state_size", default=16)
        dt_rank = _i(cfg, "mamba_dt_rank", default=-(-hidden // 16))
        conv = _i(cfg, "mamba_d_conv", "conv_kernel", default=4)
        return (
            hidden * 2 * d_inner
            + d_inner * conv
            + d_inner * (dt_rank + 2 * d_state)
            + dt_rank * d_inner
            + d_inner * d_state
            + d_inner * hidden
        )
    if kind == "mamba2":
        # hybrids' mamba_* names first; a pure Mamba-2 (Mamba2Config) uses num_heads / head_dim / state_size
        nh = _i(cfg, "mamba_num_heads", "mamba_n_heads", "num_heads")
        d_inner = nh * _i(cfg, "mamba_head_dim", "mamba_d_head", "head_dim")
        state = _i(cfg, "ssm_state_size", "mamba_d_state", "state_size")
        groups_state = 2 * _i(cfg, "n_groups", "mamba_n_groups", default=1) * state
        conv = _i(cfg, "conv_kernel", "mamba_d_conv", default=4)
        return hidden * (2 * d_inner + groups_state + nh) + (d_inner + groups_state) * conv + d_inner * hidden
    if kind == "linear_attention":
        key_dim = _i(cfg, "linear_num_key_heads") * _i(cfg, "linear_key_head_dim")
        v_heads = _i(cfg, "linear_num_value_heads")
        value_dim = v_heads * _i(cfg, "linear_value_head_dim")
        conv = _i(cfg, "linear_conv_kernel_dim", default=4)
        return (
            hidden * (2 * key_dim + 2 * value_dim + 2 * v_heads) + (2 * key_dim + value_dim) * conv + value_dim * hidden
        )
    return 0


def _is_moe_layer(cfg: dict, i: int, experts: int) -> bool:
    if experts <= 1:
        return False
    if "first_k_dense_replace" in cfg:  # DeepSeek: the first k layers are dense
        return i >= _i(cfg, "first_k_dense_replace") and i % max(1, _i(cfg, "moe_layer_freq", default=1)) == 0
    if "expert_layer_period" in cfg:  # Jamba
        return i % _i(cfg, "expert_layer_period", default=1) == _i(cfg, "expert_layer_offset")
    return i not in (cfg.get("mlp_only_layers") or [])


def estimate(cfg: dict, kinds: list[str | None], hidden: int, heads: int, kv: int, hd: int) -> tuple[int, int]:
    """(total, active) parameters, estimated from the merged config."""
    vocab = _i(cfg, "vocab_size")
    # transformers defaults tie_word_embeddings to True when a config leaves it out (OPT, Gemma)
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings", True) else 2)
    experts = _i(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    per_tok = _i(cfg, "num_experts_per_tok", "experts_per_token", default=experts)
    moe_inter = _i(cfg, "moe_intermediate_size", "intermediate_size")
    shared = _i(cfg, "n_shared_experts") * moe_inter + _i(cfg, "shared_expert_intermediate_size")
    if "ffn_dim" in cfg:
        dense_mlp = 2 * hidden * _i(cfg, "ffn_dim")
    elif cfg.get("model_type") == "nemotron_h":  # relu2 up / down projections, no gate
        dense_mlp = 2 * hidden * _i(cfg, "intermediate_size", default=4 * hidden)
    else:
        dense_mlp = 3 * hidden * _i(cfg, "intermediate_size", default=4 * hidden)

    total = active = embed
    for i, kind in enumerate(kinds):
        mixer = _attention(cfg, kind, hidden, heads, kv, hd) + _mixer(cfg, kind, hidden)
        total += mixer
        active += mixer
        if kind is None and cfg.get("hybrid_override_pattern"):
            # Nemotron-H: '-' layers are MLP only; '*' and 'M' layers have no MLP
            total += dense_mlp
            active += dense_mlp
            continue
        if cfg.get("hybrid_override_pattern") or cfg.get("model_type") in ("mamba", "falcon_mamba", "mamba2"):
            continue  # a pure Mamba block is the mixer alone (its intermediate_size is the mixer width)
        if _is_moe_layer(cfg, i, experts):
            expert = 3 * hidden * moe_inter
            common = 3 * hidden * shared + hidden * experts
            total += experts * expert + common
            active += per_tok * expert + common
        else:
            total += dense_mlp
            active += dense_mlp
    return total, active
