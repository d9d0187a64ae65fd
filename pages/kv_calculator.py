"""KV-cache calculator: size GPU memory, context and concurrency for a model, with the working."""

import pandas as pd
import streamlit as st

from app.dashboard import kv_page as kv
from ui.state import KvPageState

state = KvPageState.get()
if not state.values:
    state.values, state.link_errors = kv.from_query_params(st.query_params.to_dict())
    linked_config, config_error = kv.config_from_link(st.query_params.to_dict())
    if linked_config is not None:
        st.session_state.setdefault("kv_config", linked_config)
    if config_error:
        state.link_errors["config"] = config_error
for name, value in state.values.items():
    st.session_state.setdefault(f"kv_{name}", value)

st.title("KV-cache calculator")
st.caption("Exact KV-cache bytes for GQA, MLA, sliding-window and hybrid models, and what fits on your GPUs.")
verdict_slot = st.empty()  # the answer comes first, above the inputs; filled once they are read

errors: dict = {}


def field_error(name: str) -> None:
    for message in dict.fromkeys((state.link_errors.get(name), errors.get(name))):
        if message:
            st.error(message)


models = kv.model_options()
gpus = kv.gpu_options()

with st.container(border=True):
    st.subheader("Model")
    model = st.selectbox("Model", list(models), format_func=lambda k: models[k], key="kv_model")
    config_text = None
    if model == kv.CUSTOM:
        upload = st.file_uploader("Upload config.json", type=["json"], key="kv_upload")
        pasted = st.text_area(
            "config.json",
            height=160,
            key="kv_config",
            placeholder='{"num_hidden_layers": 32, "hidden_size": 4096, ...}',
        )
        config_text = upload.getvalue().decode("utf-8", errors="replace") if upload else pasted
        if config_text and kv.config_too_long_for_link(config_text):
            st.caption("This config.json is too large to keep in the link; the link holds the other inputs.")
    config_slot = st.empty()

cols = st.columns(3)
with cols[0]:
    st.subheader("Precision")
    st.selectbox("KV cache dtype", kv.kv_dtype_options(), key="kv_kv_dtype")
    kv_dtype_slot = st.empty()
    st.selectbox("Weight dtype", kv.weight_dtype_options(), key="kv_weight_dtype")
    st.selectbox("State dtype (hybrids)", kv.state_dtype_options(), key="kv_state_dtype")
    st.selectbox("Recurrent state dtype (hybrids)", kv.ssm_dtype_options(), key="kv_ssm_dtype")
with cols[1]:
    st.subheader("Workload")
    st.number_input("Context length (tokens)", step=1024, key="kv_context_len")
    context_slot = st.empty()
    st.number_input("Concurrent sequences", step=1, key="kv_batch")
    batch_slot = st.empty()
    st.number_input("Shared prefix (tokens)", step=256, key="kv_prefix_len")
    prefix_slot = st.empty()
with cols[2]:
    st.subheader("Hardware")
    st.selectbox("GPU", list(gpus), format_func=lambda k: gpus[k], key="kv_gpu")
    st.number_input("GPU count", step=1, key="kv_gpu_count")
    count_slot = st.empty()
    st.number_input("Tensor parallel size", step=1, key="kv_tp")
    tp_slot = st.empty()
    st.number_input("gpu_memory_utilization", step=0.01, format="%.2f", key="kv_utilization")
    util_slot = st.empty()
    st.number_input("Runtime reserve (GiB per GPU)", step=0.5, key="kv_reserve_gib")
    reserve_slot = st.empty()
    st.number_input("Block size (tokens)", step=1, key="kv_block_size")
    block_slot = st.empty()

engines = kv.engine_options()
drafts = kv.draft_options()
with st.container(border=True):
    st.subheader("Serving engine")
    top = st.columns(2)
    with top[0]:
        engine = st.selectbox("Serving engine", list(engines), format_func=lambda k: engines[k], key="kv_engine")
        st.caption(kv.engine_note(engine or ""))
        engine_slot = st.empty()
    with top[1]:
        st.selectbox("Speculative draft model", list(drafts), format_func=lambda k: drafts[k], key="kv_draft_model")
        draft_slot = st.empty()
    ecols = st.columns(4)
    with ecols[0]:
        st.number_input("Pipeline parallel size", step=1, key="kv_pp")
        pp_slot = st.empty()
    with ecols[1]:
        st.number_input("max_num_batched_tokens (vLLM)", step=1024, key="kv_max_num_batched_tokens")
        batched_slot = st.empty()
    with ecols[2]:
        st.number_input("CPU weight offload (GiB per GPU)", step=1.0, key="kv_cpu_offload_gib")
        offload_slot = st.empty()
    with ecols[3]:
        st.number_input("CPU swap space for KV (GiB per GPU)", step=4.0, key="kv_swap_gib")
        swap_slot = st.empty()

raw = {name: st.session_state[f"kv_{name}"] for name in kv.DEFAULTS}
if raw != state.values:
    state.link_errors = {}  # the user has edited since the link was opened
state.values = raw
inputs, errors = kv.validate_inputs(raw, config_text)
for name, slot in (
    ("config", config_slot),
    ("model", config_slot),
    ("kv_dtype", kv_dtype_slot),
    ("context_len", context_slot),
    ("batch", batch_slot),
    ("prefix_len", prefix_slot),
    ("gpu_count", count_slot),
    ("tp", tp_slot),
    ("utilization", util_slot),
    ("reserve_gib", reserve_slot),
    ("block_size", block_slot),
    ("engine", engine_slot),
    ("pp", pp_slot),
    ("max_num_batched_tokens", batched_slot),
    ("cpu_offload_gib", offload_slot),
    ("draft_model", draft_slot),
    ("swap_gib", swap_slot),
):
    with slot.container():
        field_error(name)

link = kv.to_query_params(raw, config_text)
if st.query_params.to_dict() != link:
    st.query_params.from_dict(link)

if inputs is None:
    verdict_slot.warning("Fix the fields marked below to see the results.")
    st.stop()

data = kv.build_page_data(inputs)
(verdict_slot.success if data.fits else verdict_slot.error)(data.verdict)

metrics = list(data.metrics.items())
for start in range(0, len(metrics), 2):  # two per row: the exact byte counts need the width
    for col, (label, value) in zip(st.columns(2), metrics[start : start + 2], strict=False):
        col.metric(label, value)

st.subheader("Working")
st.dataframe(pd.DataFrame(data.breakdown_rows), hide_index=True, width="stretch")
st.caption("Each part of the cache, its storage format and the engine rule that sets it")
st.dataframe(pd.DataFrame(data.parts_rows), hide_index=True, width="stretch")
with st.expander("Formulas with the numbers filled in", expanded=True):
    for line in data.working:
        st.text(line)
with st.expander("Model"):
    st.dataframe(pd.DataFrame(data.model_rows), hide_index=True, width="stretch")

st.subheader("Capacity")
st.dataframe(pd.DataFrame(data.capacity_rows), hide_index=True, width="stretch")
if data.vllm_rows:
    st.subheader("What vLLM allocates")
    st.caption(
        "Steady state: what vLLM sustains while every request decodes. Start-up log: the "
        "'Maximum concurrency' line vLLM prints, which budgets each request for a chunked prefill of "
        "max_num_batched_tokens and is lower for sliding-window and chunked models."
    )
    st.dataframe(pd.DataFrame(data.vllm_rows), hide_index=True, width="stretch")
st.plotly_chart(data.figures["memory"], key="kv_chart_memory")
chart_col, table_col = st.columns([3, 1])
with chart_col:
    st.plotly_chart(data.figures["concurrency"], key="kv_chart_concurrency")
with table_col:
    st.dataframe(pd.DataFrame(data.concurrency_rows), hide_index=True, width="stretch")

st.subheader("Paged allocation")
st.dataframe(pd.DataFrame(data.paged_rows), hide_index=True, width="stretch")
if data.prefix_rows:
    st.subheader("Prefix sharing")
    st.dataframe(pd.DataFrame(data.prefix_rows), hide_index=True, width="stretch")

st.subheader("Across models")
st.plotly_chart(data.figures["catalog"], key="kv_chart_catalog")

export_cols = st.columns(2)
export_cols[0].download_button(
    "Download JSON", data.export_json(), file_name="kv_plan.json", mime="application/json", key="kv_export_json"
)
export_cols[1].download_button(
    "Download CSV", data.export_csv(), file_name="kv_plan.csv", mime="text/csv", key="kv_export_csv"
)
