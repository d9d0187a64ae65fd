"""AppTest tests of the KV-calculator page, reached through the dashboard's entry script."""

import json
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests.support import paths

ENTRY = str(paths.REPO / "ui" / "entry.py")


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch, sqlite_url):
    """The entry draws the sidebar from a database: a temporary one, and fresh caches."""
    from db.engine import dispose_all

    monkeypatch.setenv("GATEWAY_CONFIG", str(Path(ENTRY).parents[1] / "gateway.toml"))
    monkeypatch.setenv("DATABASE_URL", sqlite_url)
    monkeypatch.delenv("DASHBOARD_PASSWORD", raising=False)
    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_data.clear()
    st.cache_resource.clear()
    dispose_all()


def run(**query) -> AppTest:
    at = AppTest.from_file(ENTRY, default_timeout=60).run()
    assert not at.exception
    for k, v in query.items():
        at.query_params[k] = v
    return at.switch_page("../pages/kv_calculator.py").run()


def errors(at) -> list[str]:
    return [e.value for e in at.error]


def test_default_render_answers_the_headline_question():
    at = run()
    assert not at.exception
    assert "Up to 14 such sequences fit" in at.success[0].value
    assert [m.value for m in at.metric if m.label == "Max concurrent sequences"] == ["14"]
    charts = at.get("plotly_chart")
    assert len(charts) == 3
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in charts]
    assert titles[0].startswith("Memory per GPU") and "across models" in titles[2]


def test_inputs_are_written_to_the_link():
    at = run()
    at.number_input(key="kv_context_len").set_value(8192).run()
    assert at.query_params["context_len"] == ["8192"] or at.query_params["context_len"] == "8192"
    assert not at.exception


def test_link_sets_the_inputs():
    at = run(model="deepseek-v3", gpu="h200-141gb", gpu_count="8", tp="8", weight_dtype="fp8", context_len="65536")
    assert not at.exception
    assert at.selectbox(key="kv_model").value == "deepseek-v3"
    assert at.number_input(key="kv_context_len").value == 65536
    assert any("MLA latent" in t.value for t in at.text)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("kv_context_len", 0, "at least 1"),
        ("kv_context_len", -10, "at least 1"),
        ("kv_context_len", 200000, "at most 131,072 tokens"),
        ("kv_batch", 0, "at least 1"),
        ("kv_tp", 3, "must divide"),
        ("kv_gpu_count", 3, "multiple of the tensor"),
        ("kv_block_size", 0, "at least 1"),
        ("kv_utilization", 1.5, "at most 1"),
        ("kv_reserve_gib", -1.0, "negative"),
    ],
)
def test_bad_input_gets_a_message_not_a_traceback(field, value, message):
    at = run()
    at.number_input(key=field).set_value(value).run()
    assert not at.exception
    assert any(message in e for e in errors(at)), errors(at)
    assert not at.get("plotly_chart")


def test_bad_link_value_gets_a_message():
    at = run(context_len="1.5", model="nope")
    assert not at.exception
    assert any("context_len='1.5'" in e for e in errors(at))
    assert any("model='nope'" in e for e in errors(at))
    assert at.success  # defaults are used for the bad values


def test_malformed_custom_config():
    at = run()
    at.selectbox(key="kv_model").set_value("custom").run()
    assert any("paste or upload" in e for e in errors(at))
    at.text_area(key="kv_config").input("{broken").run()
    assert not at.exception
    assert any("not valid JSON" in e for e in errors(at))
    at.text_area(key="kv_config").input('{"hidden_size": 4096}').run()
    assert any("num_hidden_layers" in e for e in errors(at))


def test_valid_custom_config():
    config = {
        "model_type": "mistral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
        "vocab_size": 32000,
        "intermediate_size": 14336,
    }
    at = run()
    at.selectbox(key="kv_model").set_value("custom").run()
    at.text_area(key="kv_config").input(json.dumps(config)).run()
    at.number_input(key="kv_context_len").set_value(16384).run()
    assert not at.exception and not errors(at)
    assert any("min(16,384, window 4,096)" in t.value for t in at.text)


def test_changing_model_and_dtype_updates_results():
    at = run()
    at.selectbox(key="kv_model").set_value("llama-3.1-8b").run()
    at.selectbox(key="kv_kv_dtype").set_value("bf16").run()
    per_token = [m.value for m in at.metric if m.label == "Bytes per token"]
    assert per_token == ["131,072 B"]


def metric(at, label) -> str:
    return next(m.value for m in at.metric if m.label == label)


@pytest.mark.parametrize("raw", ["1e100000000", "1e400", "nan"])
def test_link_with_an_absurd_utilization_gets_one_line_and_the_default(raw):
    at = run(utilization=raw)
    assert not at.exception
    assert any("gpu_memory_utilization" in e and "above 0 and at most 1" in e for e in errors(at))
    assert at.success  # the default 0.9 is used


def test_mistral_at_32k_shows_vllm_steady_state_and_start_up_log():
    at = run(
        model="mistral-7b-v0.1",
        gpu="h100-80gb",
        gpu_count="1",
        tp="1",
        weight_dtype="bf16",
        kv_dtype="bf16",
        context_len="32768",
        batch="1",
    )
    assert not at.exception, at.exception
    assert metric(at, "vLLM steady state (per instance)") == "112.59 sequences"
    assert metric(at, "vLLM start-up log: Maximum concurrency") == "37.63x for 32,768 tokens"
    assert metric(at, "Max concurrent sequences") == "112"


def test_engine_input_switches_the_mla_layout():
    at = run(model="deepseek-v3", gpu="h200-141gb", gpu_count="8", tp="8", kv_dtype="bf16", context_len="4096")
    assert metric(at, "Bytes per token") == "70,272 B"
    at.selectbox(key="kv_engine").set_value("transformers4").run()
    assert not at.exception
    assert metric(at, "Bytes per token") == "4,997,120 B"
    assert any("MLA decompressed K/V" in t.value for t in at.text)


def test_falcon_7b_config_as_published():
    falcon = {
        "alibi": False,
        "bias": False,
        "hidden_size": 4544,
        "model_type": "falcon",
        "multi_query": True,
        "new_decoder_architecture": False,
        "num_attention_heads": 71,
        "num_hidden_layers": 32,
        "parallel_attn": True,
        "vocab_size": 65024,
    }
    at = run(kv_dtype="bf16", context_len="2048", tp="1", gpu_count="1")
    at.selectbox(key="kv_model").set_value("custom").run()
    at.text_area(key="kv_config").input(json.dumps(falcon)).run()
    assert not at.exception and not errors(at), errors(at)
    assert metric(at, "Bytes per token") == "8,192 B"  # one KV head: 2 x 32 x 64 x 2
    assert any("max_position_embeddings = 2048" in t.value and "FalconConfig" in t.value for t in at.text)


def test_model_that_does_not_fit_says_so_on_the_concurrency_chart():
    at = run(model="llama-3.1-405b", gpu="l4-24gb", gpu_count="1", tp="1", context_len="8192", batch="1")
    assert not at.exception
    chart = json.loads(at.get("plotly_chart")[1].proto.spec)
    assert chart["data"][0]["y"] == []
    assert any("Does not fit" in a["text"] for a in chart["layout"]["annotations"])


def test_pasted_config_survives_in_the_link():
    config = json.dumps({**FALCON_7B_CONFIG})
    at = run(kv_dtype="bf16", context_len="2048", tp="1", gpu_count="1")
    at.selectbox(key="kv_model").set_value("custom").run()
    at.text_area(key="kv_config").input(config).run()
    link = {k: (v[0] if isinstance(v, list) else v) for k, v in at.query_params.items()}
    assert link["model"] == "custom" and link["config"]
    # opening the link again shows the same model without pasting anything
    again = run(**link)
    assert not again.exception and not errors(again), errors(again)
    assert again.text_area(key="kv_config").value and metric(again, "Bytes per token") == "8,192 B"


def test_damaged_config_link_gets_a_message():
    at = run(model="custom", config="@@@")
    assert not at.exception
    assert any("not a config link" in e for e in errors(at))


def test_draft_model_adds_its_cache():
    at = run(model="llama-3.1-70b", draft_model="llama-3.2-1b", kv_dtype="bf16", context_len="8192")
    assert not at.exception, at.exception
    # target 80 x 2 x 8 x 128 x 2 + draft 16 x 2 x 8 x 64 x 2 bytes per token
    assert metric(at, "Bytes per token") == f"{80 * 2 * 8 * 128 * 2 + 16 * 2 * 8 * 64 * 2:,} B"
    assert any("draft Llama 3.2 1B" in t.value for t in at.text)


FALCON_7B_CONFIG = {
    "alibi": False,
    "bias": False,
    "hidden_size": 4544,
    "model_type": "falcon",
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "vocab_size": 65024,
}


def _in_order(node) -> list:
    """Every element under ``node`` in the order the page draws them."""
    children = getattr(node, "children", None)
    if not children:
        return [node]
    return [el for key in sorted(children) for el in _in_order(children[key])]


def test_the_verdict_comes_first_and_names_the_gpus_needed():
    at = run(batch="64")
    assert not at.exception
    drawn = _in_order(at.main)
    kinds = [getattr(el, "type", "") for el in drawn]
    verdict = next(i for i, el in enumerate(drawn) if kinds[i] in ("success", "error", "alert"))
    first_input = next(i for i, k in enumerate(kinds) if k in ("selectbox", "number_input"))
    assert verdict < first_input, kinds[: first_input + 1]
    assert (
        at.error[0].value.startswith("Does not fit")
        and "8 x NVIDIA H100 80GB (SXM) would be enough" in at.error[0].value
    )


def test_custom_config_is_offered_first_and_sglang_is_named_in_the_verdict():
    at = run(engine="sglang")
    assert not at.exception
    model = at.selectbox(key="kv_model")
    assert model.options[0] == "Custom config.json" and model.value != "custom"  # first, not chosen
    assert "Engine: SGLang, token pool" in (at.success or at.error)[0].value
    convention = next(el for el in at.dataframe if "convention" in el.value.columns).value["convention"]
    assert not any("MLA" in c for c in convention)  # the default model is a plain GQA model
