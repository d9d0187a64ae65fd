"""Dev-only: the bytes transformers' StaticCache keeps, measured, for the KV engine's unit tests.

Not part of the product and not in any requirements file. Run it in a separate virtualenv with CPU
torch and transformers 5.x:

    python3.11 -m venv /work/wt/kv-gt-venv
    /work/wt/kv-gt-venv/bin/pip install torch==2.13.0 transformers==5.23.0
    /work/wt/kv-gt-venv/bin/python scripts/kv_ground_truth.py [model-id ...]
    /work/wt/kv-gt-venv/bin/python scripts/kv_ground_truth.py --variants

For every published config in tests/fixtures/kvcache/ground_truth_configs.json it builds the whole
model on the meta device (no weights, no memory), makes ``StaticCache(config, max_cache_len=L)``,
prefills a short prompt through the model so every cache layer allocates its tensors (a static
layer allocates its full ``max_cache_len`` on first use, so the bytes do not depend on how many
tokens the prompt has), then sums every tensor each cache layer holds: K/V, indexer keys,
convolution states and recurrent states, each with its shape and dtype. The result is written to
tests/fixtures/kvcache/transformers5_truth.json, which tests/unit/kvcache/test_engines.py
compares with ``kv_cache_bytes(for_engine(spec, "transformers5"), L, kv_dtype="bf16")``.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, StaticCache
from transformers.cache_utils import QuantizedCache

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "fixtures" / "kvcache" / "ground_truth_configs.json"
OUT = ROOT / "tests" / "fixtures" / "kvcache" / "transformers5_truth.json"
# small synthetic configs, one per family default / field rule the engine applies (--variants)
VARIANTS = ROOT / "tests" / "fixtures" / "kvcache" / "ground_truth_variants.json"
VARIANTS_OUT = ROOT / "tests" / "fixtures" / "kvcache" / "transformers5_variants_truth.json"
LENGTHS = (1, 4096, 32768, 131072)
PROMPT = 8  # tokens prefilled; the static layers hold max_cache_len whatever the prompt length
# bookkeeping tensors (positions, counters) are not cache contents
SKIP = {"cumulative_length", "indexer_cumulative_length", "indexer_position_ids"}


def hf_config(entry: dict) -> transformers.PretrainedConfig:
    raw = dict(entry["config"])
    if isinstance(raw.get("text_config"), dict):
        # a multimodal wrapper: its text decoder owns the cache (and the vision tower needs timm)
        raw = dict(raw["text_config"])
    if raw.get("model_type") == "minimax_m1":
        # remote-code config; transformers' MiniMax class reads layer_types instead
        types = ["full_attention" if t == 1 else "linear_attention" for t in raw.pop("attn_type_list")]
        raw.pop("architectures", None)
        raw["model_type"] = "minimax"
        raw["layer_types"] = types
    model_type = raw.pop("model_type")
    if model_type == "kimi_k2":
        # remote-code config on DeepSeek-V3's architecture (its architectures entry is DeepseekV3ForCausalLM)
        model_type = "deepseek_v3"
    raw.pop("architectures", None)
    # gpt-oss ships MXFP4 weights; the weight format does not shape the cache, and on the meta device
    # there are no weights to quantize
    raw.pop("quantization_config", None)
    return AutoConfig.for_model(model_type, **raw)


def tensors(layer: object) -> list[tuple[str, tuple[int, ...], str, int]]:
    """(name, shape, dtype, bytes) of every cache tensor a layer holds."""
    out = []
    for name, value in vars(layer).items():
        if name in SKIP:
            continue
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for key, t in items:
            if isinstance(t, torch.Tensor) and t.dim() >= 2:
                label = name if key is None else f"{name}[{key}]"
                out.append((label, tuple(t.shape), str(t.dtype).removeprefix("torch."), t.numel() * t.element_size()))
    return out


def cache_tensors(cache: object) -> list[tuple[int, str, tuple[int, ...], str, int]]:
    """(layer, name, shape, dtype, bytes) of every tensor a cache holds."""
    out = []
    for i, layer in enumerate(cache.layers):  # type: ignore[attr-defined]
        out += [(i, *t) for t in tensors(layer)]
    # MiniMaxCache keeps its lightning-attention states beside the layers, one tensor per layer
    for i, state in enumerate(getattr(cache, "linear_cache", [])):
        if isinstance(state, torch.Tensor):
            out.append(
                (
                    i,
                    "linear_cache",
                    tuple(state.shape),
                    str(state.dtype).removeprefix("torch."),
                    state.numel() * state.element_size(),
                )
            )
    return out


# Fp8QuantizedLayer keeps (fp8 tensor, float32 scale) pairs; the scale is a 0-dim tensor
_PAIR_LABELS = {"_quantized_keys": ("keys", "keys_scale"), "_quantized_values": ("values", "values_scale")}


def held_tensors(layer: object) -> list[tuple[str, torch.Tensor]]:
    """(label, tensor) of every tensor a quantized cache layer holds, of any rank, walking tuples, lists
    and dicts, so a scale or any tensor the layer adds is counted; empty placeholders (0 bytes) too."""
    out: list[tuple[str, torch.Tensor]] = []

    def walk(label: str, value: object) -> None:
        if isinstance(value, torch.Tensor):
            if value.numel():
                out.append((label, value))
        elif isinstance(value, (tuple, list)):
            names = _PAIR_LABELS.get(label)
            for i, item in enumerate(value):
                walk(names[i] if names and i < len(names) else f"{label}[{i}]", item)
        elif isinstance(value, dict):
            for k, item in value.items():
                walk(f"{label}[{k}]", item)

    for name, value in vars(layer).items():
        if name not in SKIP:
            walk(name, value)
    return out


def measure(config: transformers.PretrainedConfig, model: torch.nn.Module, seq_len: int) -> dict:
    cache = StaticCache(config=config, max_cache_len=seq_len)
    kind = "StaticCache(config, max_cache_len=L) after an 8-token prefill"
    with torch.no_grad():
        try:
            ids = torch.zeros((1, min(PROMPT, seq_len)), dtype=torch.long, device="meta")
            # Mamba / Mamba-2 name their cache argument cache_params (modeling_mamba.py)
            name = (
                "cache_params" if "cache_params" in inspect.signature(model.forward).parameters else "past_key_values"
            )
            model(input_ids=ids, use_cache=True, **{name: cache})
        except ValueError as exc:
            if "cache of its own" not in str(exc):
                raise
            # MiniMax refuses StaticCache and keeps MiniMaxCache (a DynamicCache): prefill all L tokens
            ids = torch.zeros((1, seq_len), dtype=torch.long, device="meta")
            cache = model(input_ids=ids, use_cache=True).past_key_values
            kind = f"{type(cache).__name__} (the model's own cache; it refuses StaticCache) after an L-token prefill"
    parts: dict[str, int] = {}
    first: dict[str, list] = {}
    for i, name, shape, dtype, size in cache_tensors(cache):
        key = f"{name} {dtype}"
        parts[key] = parts.get(key, 0) + size
        first.setdefault(key, [list(shape), i])
    return {
        "seq_len": seq_len,
        "bytes": sum(parts.values()),
        "cache": kind,
        "parts": parts,
        "layer_classes": sorted({type(layer).__name__ for layer in cache.layers}),
        "first_shapes": first,
    }


def measure_fp8(config: transformers.PretrainedConfig, model: torch.nn.Module, seq_len: int) -> dict | str:
    """transformers has no fp8 StaticCache; its fp8 cache is QuantizedCache(backend="fp8"), a dynamic
    cache of Fp8QuantizedLayer (float8_e4m3fn K/V plus one float32 scale per K and per V tensor,
    cache_utils.py) that only takes full-attention models. Prefill seq_len tokens and sum every tensor
    each layer holds (held_tensors: the fp8 K/V, their scales, and anything else a later version adds);
    the refusal's message when the model is not full attention only."""
    try:
        cache = QuantizedCache(backend="fp8", config=config)
    except ValueError as exc:
        return str(exc)
    ids = torch.zeros((1, seq_len), dtype=torch.long, device="meta")
    try:
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
    except (RuntimeError, NotImplementedError) as exc:  # recorded, not hidden: the fixture says why
        return f"the {seq_len}-token prefill failed on the meta device: {exc}"
    parts: dict[str, int] = {}
    for layer in cache.layers:
        for label, t in held_tensors(layer):
            key = f"{label} {str(t.dtype).removeprefix('torch.')}"
            parts[key] = parts.get(key, 0) + t.numel() * t.element_size()
    return {"seq_len": seq_len, "bytes": sum(parts.values()), "parts": parts}


def main(only: list[str]) -> None:
    doc = json.loads(CONFIGS.read_text(encoding="utf-8"))
    previous = json.loads(OUT.read_text(encoding="utf-8"))["models"] if OUT.exists() else {}
    results = dict(previous)
    for entry in doc["models"]:
        if only and entry["id"] not in only:
            continue
        config = hf_config(entry)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.eval()
        cases = [measure(config, model, n) for n in LENGTHS]
        results[entry["id"]] = {"name": entry["name"], "source": entry["source"], "dtype": "bfloat16", "cases": cases}
        print(entry["id"], [c["bytes"] for c in cases], flush=True)
        fp8 = [measure_fp8(config, model, n) for n in LENGTHS]
        if all(isinstance(c, dict) for c in fp8):
            results[entry["id"]]["fp8"] = {
                "cache": 'QuantizedCache(backend="fp8", config) after an L-token prefill',
                "cases": fp8,
            }
            print(entry["id"], "fp8", [c["bytes"] for c in fp8 if isinstance(c, dict)], flush=True)
        else:
            results[entry["id"]]["fp8_refused"] = next(c for c in fp8 if isinstance(c, str))
    out = {
        "_about": (
            "Bytes transformers' StaticCache(config, max_cache_len=L) keeps after a prefill, every cache tensor "
            "summed, model built on the meta device in bfloat16; 'fp8': what QuantizedCache(backend='fp8') keeps "
            "after an L-token prefill (full-attention models only; 'fp8_refused' otherwise). Written by "
            "scripts/kv_ground_truth.py; "
            "do not edit by hand."
        ),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "models": dict(sorted(results.items())),
    }
    OUT.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


def main_variants() -> None:
    """The bytes StaticCache keeps for each synthetic variant config (transformers' own defaults fill
    what the config leaves out), at the file's seq_len."""
    doc = json.loads(VARIANTS.read_text(encoding="utf-8"))
    results = {}
    for entry in doc["variants"]:
        raw = dict(entry["config"])
        config = AutoConfig.for_model(raw.pop("model_type"), **raw)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        case = measure(config, model, doc["seq_len"])
        results[entry["id"]] = {"checks": entry["checks"], **case}
        print(entry["id"], case["bytes"], flush=True)
    out = {
        "_about": "Written by scripts/kv_ground_truth.py --variants from ground_truth_variants.json; do not edit.",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "variants": results,
    }
    VARIANTS_OUT.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--variants"]:
        main_variants()
    else:
        main(sys.argv[1:])
