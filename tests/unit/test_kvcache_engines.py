"""Which MLA layout each engine stores, and bounded parsing of every number a link can carry."""

import base64
import dataclasses
import json
import zlib

import pytest

from app.dashboard import kv_page as page_data
from kvcache import catalog, kv_cache_bytes
from kvcache.capacity import parse_decimal, parse_utilization
from kvcache.engines import ENGINES, for_engine


def test_deepseek_v3_latent_vs_transformers_4_decompressed():
    spec = catalog.model_spec("deepseek-v3")
    # latent: 61 layers x (512 kv_lora_rank + 64 qk_rope_head_dim) x 2 B
    latent = 61 * (512 + 64) * 2
    # transformers 4.x: 61 layers x 128 heads x (K: 128 nope + 64 rope, V: 128) x 2 B
    decompressed = 61 * 128 * ((128 + 64) + 128) * 2
    assert (latent, decompressed) == (70_272, 4_997_120)
    for engine_id in ("vllm", "sglang", "trtllm", "transformers5"):
        assert kv_cache_bytes(for_engine(spec, engine_id), 1) == latent
    t4 = for_engine(spec, "transformers4")
    assert kv_cache_bytes(t4, 1) == decompressed
    assert "MLA decompressed K/V" in t4.attention_label
    # decompressed heads split over tensor parallelism; the latent is replicated
    assert kv_cache_bytes(t4, 1, tp=8) == decompressed // 8
    assert kv_cache_bytes(for_engine(spec, "vllm"), 1, tp=8) == latent


def test_engines_do_not_change_non_mla_models():
    """Only transformers 5 marks the layers of an attention-only model: its fp8 cache is
    QuantizedCache's (fp8 K/V plus per-tensor scales); the K/V bytes in bf16 are everyone's."""
    spec = catalog.model_spec("llama-3.1-8b")
    assert all(for_engine(spec, e) is spec for e in ENGINES if e != "transformers5")
    t5 = for_engine(spec, "transformers5")
    assert {g.layout for g in t5.groups} == {"tf5_fp8"} and "Fp8QuantizedLayer" in t5.groups[0].convention
    assert kv_cache_bytes(t5, 4096) == kv_cache_bytes(spec, 4096)
    assert kv_cache_bytes(t5, 4096, 1, "fp8") == kv_cache_bytes(spec, 4096, 1, "fp8") + 8 * spec.num_layers


def test_decompressed_layout_needs_its_fields():
    spec = catalog.model_spec("deepseek-v3")
    g = spec.group("mla")
    broken = dataclasses.replace(spec, groups=(dataclasses.replace(g, v_head_dim=0),))
    with pytest.raises(ValueError, match="v_head_dim"):
        for_engine(broken, "transformers4")


def test_unknown_engine():
    with pytest.raises(ValueError, match="unknown engine"):
        for_engine(catalog.model_spec("llama-3.1-8b"), "nope")


# --- numbers from links and forms: bounded before any arithmetic ---------------------------------


@pytest.mark.parametrize("raw", ["1e100000000", "1e400", "nan", "inf", "-inf", "1" * 500, "0x10", "1/0", ""])
def test_decimal_parser_refuses_before_computing(raw):
    # Fraction("1e100000000") would build a 100-million-digit integer (the test would hang) and
    # float("1e400") is inf: both are refused by their text first
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        parse_utilization(raw)


def test_decimal_parser_accepts_plain_numbers():
    assert parse_decimal("0.95", "x") == parse_decimal("9.5e-1", "x") == parse_decimal(0.95, "x")
    assert parse_utilization("1") == 1


@pytest.mark.parametrize("raw", ["1e100000000", "1e400", "nan", "inf", "9" * 200])
def test_link_utilization_gets_a_one_line_error_naming_the_field(raw):
    values, errors = page_data.from_query_params({"utilization": raw})
    assert values["utilization"] == page_data.DEFAULTS["utilization"]
    message = errors["utilization"]
    assert "gpu_memory_utilization" in message and "\n" not in message
    assert "above 0 and at most 1" in message


@pytest.mark.parametrize("field", ["context_len", "batch", "gpu_count", "max_num_batched_tokens"])
def test_link_huge_integers_are_refused(field):
    values, errors = page_data.from_query_params({field: "9" * 5000})
    assert values[field] == page_data.DEFAULTS[field] and "at most 12 digits" in errors[field]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("utilization", "1e-31", "exponent"),
        ("reserve_gib", "1e30", "at most 100,000"),
        ("cpu_offload_gib", "-1", "must not be negative"),
        ("pp", 0, "at least 1"),
        ("max_num_batched_tokens", 10**9, "at most 100,000,000"),
        ("engine", "nope", "choose one of"),
    ],
)
def test_form_bounds(field, value, message):
    raw = {**page_data.DEFAULTS, field: value}
    inputs, errors = page_data.validate_inputs(raw)
    assert inputs is None and message in errors[field], errors


# --- a pasted config.json in the shareable link ------------------------------------------------

FALCON_7B = (
    '{"alibi": false, "bias": false, "hidden_size": 4544, "model_type": "falcon", "multi_query": true,'
    ' "new_decoder_architecture": false, "num_attention_heads": 71, "num_hidden_layers": 32, "vocab_size": 65024}'
)


def test_config_round_trips_through_the_link_compressed():
    values = {**page_data.DEFAULTS, "model": page_data.CUSTOM}
    link = page_data.to_query_params(values, FALCON_7B)
    token = link["config"]
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    text, error = page_data.config_from_link(link)
    assert error is None and json.loads(text) == json.loads(FALCON_7B)
    # a catalog model's link carries no config
    assert "config" not in page_data.to_query_params(page_data.DEFAULTS, FALCON_7B)


def test_config_link_is_bounded():
    import random

    rng = random.Random(1)  # incompressible content: the compressed token stays long
    big = json.dumps({f"k{i}": rng.getrandbits(64) for i in range(2000)})
    assert page_data.encode_config(big) is None and page_data.config_too_long_for_link(big)
    assert not page_data.config_too_long_for_link("{broken")


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("not base64!", "not a config link"),
        ("A" * 7000, "at most 6,000"),
        ("AAAA", "damaged"),
        # 2 MB of spaces compress to a short token that would inflate past the 1 MB bound
        (base64.urlsafe_b64encode(zlib.compress(b" " * 2_000_000, 9)).rstrip(b"=").decode(), "beyond 1 MB"),
    ],
)
def test_bad_config_links(token, message):
    text, error = page_data.config_from_link({"config": token})
    assert text is None and message in error
