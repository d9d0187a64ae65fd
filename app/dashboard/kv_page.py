"""Everything the KV-calculator page shows, from its raw inputs: validation with one message per
field, link (query-parameter) round trip, and one function computing all numbers, tables, figures
and exports for a render. The page itself holds no arithmetic.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
import re
import zlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

import plotly.graph_objects as go

from app.dashboard import kv_charts as charts
from kvcache import catalog
from kvcache.capacity import (
    GIB,
    TP_CANDIDATES,
    CapacityPlan,
    GpusNeeded,
    gpus_needed,
    max_sequences,
    parse_decimal,
    plan,
    staged_cost,
)
from kvcache.dtypes import KV_DTYPES, WEIGHT_DTYPES
from kvcache.engines import ENGINES, for_engine, with_draft, with_ssm_dtype
from kvcache.formulas import STATE_DTYPES, KvBreakdown, breakdown, check_tp, naive_bytes, sequence_cost
from kvcache.paged import PagedAllocation, paged_allocation
from kvcache.prefix import PrefixSharing, prefix_sharing
from kvcache.spec import ModelSpec

CUSTOM = "custom"
MAX_CONFIG_CHARS = 1_000_000
CATALOG_CHART_DTYPES = ["bf16", "fp8", "int4"]

# Field order is the order of the URL; defaults answer the headline question
# (Llama-3.1-70B, fp8 weights and KV, 32k context, 2x H100).
DEFAULTS: dict[str, Any] = {
    "model": "llama-3.1-70b",
    "kv_dtype": "fp8",
    "weight_dtype": "fp8",
    "state_dtype": "bf16",
    "ssm_dtype": "auto",
    "context_len": 32768,
    "batch": 8,
    "prefix_len": 0,
    "gpu": "h100-80gb",
    "gpu_count": 2,
    "tp": 2,
    "utilization": 0.9,
    "reserve_gib": 2.0,
    "block_size": 16,
    "engine": "vllm",
    "pp": 1,
    "max_num_batched_tokens": 8192,
    "cpu_offload_gib": 0.0,
    "draft_model": "none",
    "swap_gib": 0.0,
}
NO_DRAFT = "none"
INT_FIELDS = ("context_len", "batch", "prefix_len", "gpu_count", "tp", "block_size", "pp", "max_num_batched_tokens")
DECIMAL_FIELDS = ("utilization", "reserve_gib", "cpu_offload_gib", "swap_gib")
LABELS = {
    "model": "Model",
    "config": "config.json",
    "kv_dtype": "KV cache dtype",
    "weight_dtype": "Weight dtype",
    "state_dtype": "State dtype (hybrids)",
    "ssm_dtype": "Recurrent state dtype (hybrids)",
    "context_len": "Context length (tokens)",
    "batch": "Concurrent sequences",
    "prefix_len": "Shared prefix (tokens)",
    "gpu": "GPU",
    "gpu_count": "GPU count",
    "tp": "Tensor parallel size",
    "utilization": "gpu_memory_utilization",
    "reserve_gib": "Runtime reserve (GiB per GPU)",
    "block_size": "Block size (tokens)",
    "engine": "Serving engine",
    "pp": "Pipeline parallel size",
    "max_num_batched_tokens": "max_num_batched_tokens (vLLM)",
    "cpu_offload_gib": "CPU weight offload (GiB per GPU)",
    "draft_model": "Speculative draft model",
    "swap_gib": "CPU swap space for KV (GiB per GPU)",
}
# Bounds for every number, checked before any arithmetic (a link can carry anything).
_LIMITS = {
    "batch": (1, 1_000_000),
    "prefix_len": (0, 100_000_000),
    "gpu_count": (1, 4096),
    "tp": (1, 1024),
    "block_size": (1, 4096),
    "context_len": (1, 100_000_000),
    "pp": (1, 1024),
    "max_num_batched_tokens": (1, 100_000_000),
}
_DECIMAL_LIMITS = {  # (lowest, highest, lowest is allowed)
    "utilization": (0, 1, False),
    "reserve_gib": (0, 100_000, True),
    "cpu_offload_gib": (0, 100_000, True),
    "swap_gib": (0, 100_000, True),
}
MAX_INT_DIGITS = 12


@dataclass(frozen=True)
class KvInputs:
    """Validated page inputs."""

    model: str
    kv_dtype: str
    weight_dtype: str
    state_dtype: str
    context_len: int
    batch: int
    prefix_len: int
    gpu: str
    gpu_count: int
    tp: int
    utilization: Fraction
    reserve_bytes: int
    block_size: int
    spec: ModelSpec = field(compare=False)
    source: str = ""
    ssm_dtype: str = "auto"  # "auto" = the engine's own rule (vLLM: same as the conv state; Nemotron-H fp32)
    engine: str = "vllm"
    pp: int = 1
    max_num_batched_tokens: int = 8192
    cpu_offload_bytes: int = 0
    draft_model: str = "none"
    swap_bytes: int = 0


# ---------------------------------------------------------------------------------------------
# options and links


def model_options() -> dict[str, str]:
    """The custom-config option first (paste or upload any config.json), then catalog id -> display name."""
    return {CUSTOM: "Custom config.json", **{k: m.name for k, m in catalog.models().items()}}


def gpu_options() -> dict[str, str]:
    return {k: f"{g.name} ({g.memory_gib} GiB)" for k, g in catalog.gpus().items()}


def kv_dtype_options() -> list[str]:
    return list(KV_DTYPES)


def weight_dtype_options() -> list[str]:
    return list(WEIGHT_DTYPES)


def state_dtype_options() -> list[str]:
    return list(STATE_DTYPES)


SSM_DTYPES = ("auto", *STATE_DTYPES)


def ssm_dtype_options() -> list[str]:
    return list(SSM_DTYPES)


def draft_options() -> dict[str, str]:
    return {NO_DRAFT: "none", **{k: m.name for k, m in catalog.models().items()}}


def engine_options() -> dict[str, str]:
    return {k: e.name for k, e in ENGINES.items()}


def engine_note(engine_id: str) -> str:
    """What the chosen engine stores and how it allocates, shown under the selector."""
    e = ENGINES.get(engine_id)
    return e.note if e else ""


def _decimal_span(key: str) -> str:
    low, high, low_ok = _DECIMAL_LIMITS[key]
    if low_ok and low == 0:
        return f"must not be negative and at most {high:,}"
    return f"must be {'at least' if low_ok else 'above'} {low} and at most {high:,}"


def _decimal_syntax(key: str, value: Any) -> Fraction:
    try:
        return parse_decimal(value, LABELS[key])
    except ValueError as e:
        raise ValueError(f"{e}; it {_decimal_span(key)}") from None


def decimal_field(key: str, value: Any) -> Fraction:
    """A decimal page field within its bounds; ValueError with one line naming field and range."""
    low, high, low_ok = _DECIMAL_LIMITS[key]
    span = _decimal_span(key)
    number = _decimal_syntax(key, value)
    if number < low or (number == low and not low_ok) or number > high:
        raise ValueError(f"{LABELS[key]} {span}, got {value}")
    return number


def from_query_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Widget values from a link: defaults overlaid with parsable link values, plus one message
    per link value that could not be used (the widget then shows the default)."""
    values = dict(DEFAULTS)
    errors: dict[str, str] = {}
    choices: dict[str, Collection[str]] = {
        "model": model_options(),
        "gpu": gpu_options(),
        "kv_dtype": KV_DTYPES,
        "weight_dtype": WEIGHT_DTYPES,
        "state_dtype": STATE_DTYPES,
        "ssm_dtype": SSM_DTYPES,
        "engine": ENGINES,
        "draft_model": draft_options(),
    }
    for key in DEFAULTS:
        if key not in params:
            continue
        raw = str(params[key]).strip()[:200]
        if key in choices:
            if raw in choices[key]:
                values[key] = raw
            else:
                errors[key] = f"The link's {key}={raw!r} is not an option; showing the default."
        elif key in INT_FIELDS:
            try:  # syntax and size here; the range is reported by validation, beside the field
                values[key] = _parse_int(raw)
            except ValueError as e:
                errors[key] = f"The link's {key}={raw[:40]!r}: {e}; showing the default."
        else:
            try:
                values[key] = float(_decimal_syntax(key, raw))
            except ValueError as e:
                errors[key] = f"The link's {key}={raw[:40]!r}: {e}; showing the default."
    return values, errors


def to_query_params(values: Mapping[str, Any], config_text: str | None = None) -> dict[str, str]:
    """The link for the current widget values. A custom config.json travels in it compressed
    (``config``) when it is valid JSON and short enough; see encode_config."""
    out = {}
    for key in DEFAULTS:
        v = values.get(key, DEFAULTS[key])
        out[key] = f"{v:g}" if isinstance(v, float) else str(v)
    if values.get("model") == CUSTOM and config_text:
        token = encode_config(config_text)
        if token is not None:
            out["config"] = token
    return out


# A config.json in a link: compact JSON, zlib, base64url without padding. Browsers and proxies
# handle URLs of a few kilobytes reliably; a typical config.json compresses to 600-1,500 characters.
MAX_LINK_CONFIG_CHARS = 6000


def encode_config(text: str) -> str | None:
    """The link form of a pasted config.json; None when it is not valid JSON or would make the
    link longer than MAX_LINK_CONFIG_CHARS."""
    if len(text) > MAX_CONFIG_CHARS:
        return None
    try:
        compact = json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
    except json.JSONDecodeError:
        return None
    token = base64.urlsafe_b64encode(zlib.compress(compact.encode("utf-8"), 9)).rstrip(b"=").decode("ascii")
    return token if len(token) <= MAX_LINK_CONFIG_CHARS else None


def config_too_long_for_link(text: str) -> bool:
    """Valid JSON that encode_config still refuses: the page says the link will not hold it."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return encode_config(text) is None


def decode_config(token: str) -> str:
    """The config.json text a link carries. Bounded on both sides: the token's length, and the
    decompressed size (a small token must not inflate into gigabytes)."""
    token = token.strip()
    if len(token) > MAX_LINK_CONFIG_CHARS or not re.fullmatch(r"[A-Za-z0-9_-]+", token):
        raise ValueError(
            f"the link's config is not a config link (base64url, at most {MAX_LINK_CONFIG_CHARS:,} characters)"
        )
    try:
        data = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        inflater = zlib.decompressobj()
        raw = inflater.decompress(data, MAX_CONFIG_CHARS + 1)
    except (binascii.Error, zlib.error):
        raise ValueError("the link's config is damaged (not zlib + base64url); paste the config.json again") from None
    if len(raw) > MAX_CONFIG_CHARS or inflater.unconsumed_tail:
        raise ValueError("the link's config inflates beyond 1 MB; that is not a model config")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the link's config is not UTF-8 text") from None


def config_from_link(params: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(config.json text, error message) from a link's ``config`` parameter."""
    if "config" not in params:
        return None, None
    try:
        return decode_config(str(params["config"])), None
    except ValueError as e:
        return None, f"{str(e)[0].upper()}{str(e)[1:]}."


# ---------------------------------------------------------------------------------------------
# validation


def _parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("must be a whole number")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise ValueError(f"must be a whole number, got {value:g}")
    text = str(value).strip().replace(",", "").replace("_", "")
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ValueError(f"must be a whole number, got {str(value)[:40]!r}")
    if len(text.lstrip("+-")) > MAX_INT_DIGITS:  # int() of a huge digit string is quadratic
        raise ValueError(f"must have at most {MAX_INT_DIGITS} digits")
    return int(text)


def _bounded_int(key: str, value: Any) -> int:
    number = _parse_int(value)
    low, high = _LIMITS[key]
    if number < low:
        raise ValueError(f"must be at least {low:,}, got {number:,}")
    if number > high:
        raise ValueError(f"must be at most {high:,}, got {number:,}")
    return number


def parse_config(text: str | None) -> ModelSpec:
    """A pasted / uploaded config.json as a ModelSpec; ValueError with a readable message."""
    if not text or not text.strip():
        raise ValueError("paste or upload a config.json")
    if len(text) > MAX_CONFIG_CHARS:
        raise ValueError("config.json is larger than 1 MB; that is not a model config")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    spec = ModelSpec.from_hf_config(data)
    return spec


def validate_inputs(raw: Mapping[str, Any], config_text: str | None = None) -> tuple[KvInputs | None, dict[str, str]]:
    """Check every field; return (inputs, {}) or (None, {field: message})."""
    errors: dict[str, str] = {}
    ints: dict[str, int] = {}
    for key in INT_FIELDS:
        try:
            ints[key] = _bounded_int(key, raw.get(key, DEFAULTS[key]))
        except ValueError as e:
            errors[key] = f"{LABELS[key]} {e}."

    choices: dict[str, Collection[str]] = {
        "kv_dtype": KV_DTYPES,
        "weight_dtype": WEIGHT_DTYPES,
        "state_dtype": STATE_DTYPES,
        "ssm_dtype": SSM_DTYPES,
        "gpu": catalog.gpus(),
        "engine": ENGINES,
        "draft_model": draft_options(),
    }
    for key, options in choices.items():
        if raw.get(key, DEFAULTS[key]) not in options:
            errors[key] = f"{LABELS[key]}: choose one of {', '.join(options)}."

    decimals: dict[str, Fraction] = {}
    for key in DECIMAL_FIELDS:
        try:
            decimals[key] = decimal_field(key, raw.get(key, DEFAULTS[key]))
        except ValueError as e:
            errors[key] = f"{e}."
    utilization = decimals.get("utilization")
    reserve = offload = None
    if "reserve_gib" in decimals:
        reserve = decimals["reserve_gib"].numerator * GIB // decimals["reserve_gib"].denominator
    if "cpu_offload_gib" in decimals:
        offload = decimals["cpu_offload_gib"].numerator * GIB // decimals["cpu_offload_gib"].denominator
    swap = decimals["swap_gib"].numerator * GIB // decimals["swap_gib"].denominator if "swap_gib" in decimals else 0

    model = raw.get("model", DEFAULTS["model"])
    spec: ModelSpec | None = None
    source = ""
    if model == CUSTOM:
        try:
            spec = parse_config(config_text)
        except ValueError as e:
            errors["config"] = f"config.json: {str(e).removeprefix('config.json: ')}"
    elif model in catalog.models():
        spec = catalog.model_spec(model)
        source = str(catalog.models()[model].source)
    else:
        errors["model"] = f"Unknown model {model!r}."

    draft = raw.get("draft_model", DEFAULTS["draft_model"])
    if spec is not None and draft != NO_DRAFT and "draft_model" not in errors:
        if ints.get("pp", 1) > 1:
            errors["draft_model"] = (
                "A draft model with pipeline parallelism is not modelled; set pipeline parallel size 1."
            )
        else:
            spec = with_draft(spec, catalog.model_spec(draft))
    if spec is not None:
        ctx = ints.get("context_len")
        if ctx is not None and ctx > spec.max_context:
            errors["context_len"] = (
                f"{spec.name} supports at most {spec.max_context:,} tokens (max_position_embeddings); got {ctx:,}."
            )
        if "tp" in ints:
            try:
                check_tp(spec, ints["tp"])
            except ValueError as e:
                errors["tp"] = f"{str(e)[0].upper()}{str(e)[1:]}."
        if "pp" in ints and ints["pp"] > spec.num_layers:
            errors["pp"] = f"Pipeline parallel size ({ints['pp']}) cannot exceed the {spec.num_layers} layers."
        engine_id = raw.get("engine", DEFAULTS["engine"])
        if engine_id in ENGINES and "engine" not in errors:
            try:
                engine_spec = for_engine(spec, engine_id)
            except ValueError as e:
                errors["engine"] = str(e).removeprefix("config.json: ")
            else:
                kv_name = raw.get("kv_dtype", DEFAULTS["kv_dtype"])
                if kv_name in KV_DTYPES and "kv_dtype" not in errors:
                    try:  # an engine may not keep this model in every format (DeepSeek-V3.2 in vLLM)
                        sequence_cost(engine_spec, kv_name)
                    except ValueError as e:
                        errors["kv_dtype"] = f"{str(e)[0].upper()}{str(e)[1:]}."
    if "tp" in ints and "gpu_count" in ints and "pp" in ints and ints["gpu_count"] % (ints["tp"] * ints["pp"]):
        errors["gpu_count"] = (
            f"GPU count ({ints['gpu_count']}) must be a multiple of the tensor parallel size ({ints['tp']}) "
            f"x the pipeline parallel size ({ints['pp']})."
        )
    if "prefix_len" in ints and "context_len" in ints and ints["prefix_len"] > ints["context_len"]:
        errors["prefix_len"] = "The shared prefix cannot be longer than the context."

    if errors:
        return None, errors
    assert spec is not None and utilization is not None and reserve is not None and offload is not None
    return KvInputs(
        model=model,
        engine=raw.get("engine", DEFAULTS["engine"]),
        draft_model=draft,
        cpu_offload_bytes=offload,
        swap_bytes=swap,
        kv_dtype=raw.get("kv_dtype", DEFAULTS["kv_dtype"]),
        weight_dtype=raw.get("weight_dtype", DEFAULTS["weight_dtype"]),
        state_dtype=raw.get("state_dtype", DEFAULTS["state_dtype"]),
        ssm_dtype=raw.get("ssm_dtype", DEFAULTS["ssm_dtype"]),
        utilization=utilization,
        reserve_bytes=reserve,
        spec=spec,
        source=source,
        gpu=raw.get("gpu", DEFAULTS["gpu"]),
        **ints,
    ), {}


# ---------------------------------------------------------------------------------------------
# the page's data


def fmt_bytes(n: int) -> str:
    """'39.06 GiB (41,943,040,000 B)': the exact count with a readable unit."""
    sign = "-" if n < 0 else ""
    a = abs(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if a >= size:
            return f"{sign}{a / size:,.2f} {unit} ({n:,} B)"
    return f"{n:,} B"


@dataclass
class PageData:
    inputs: KvInputs
    model_rows: list[dict]
    whole: KvBreakdown  # the whole model's cache (tp = 1)
    per_gpu: KvBreakdown  # one GPU of the TP group
    naive: int
    paged: PagedAllocation
    capacity: CapacityPlan
    prefix: PrefixSharing | None
    metrics: dict[str, str]
    verdict: str
    fits: bool
    working: list[str]
    breakdown_rows: list[dict]
    capacity_rows: list[dict]
    paged_rows: list[dict]
    prefix_rows: list[dict]
    vllm_rows: list[dict]
    concurrency_rows: list[dict]
    figures: dict[str, go.Figure]
    export: dict
    gpus_needed: GpusNeeded | None = None  # the fewest GPUs of the chosen kind that would be enough
    # one row per cache part (K/V, MLA latent, indexer keys, conv state, recurrent state) with its
    # dtype and the engine rule behind it
    parts_rows: list[dict] = field(default_factory=list)

    def export_json(self) -> str:
        return json.dumps(self.export, indent=2)

    def export_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=["section", "item", "value", "formula"])
        writer.writeheader()
        for section, rows in (
            ("breakdown", self.breakdown_rows),
            ("capacity", self.capacity_rows),
            ("paged", self.paged_rows),
            ("prefix", self.prefix_rows),
            ("vllm", self.vllm_rows),
        ):
            for r in rows:
                value = r["bytes"] if "bytes" in r else r["value"]
                writer.writerow(
                    {"section": section, "item": r["item"], "value": value, "formula": r.get("formula", "")}
                )
        return buf.getvalue()


def _row(item: str, value: int, formula: str = "") -> dict:
    return {"item": item, "bytes": value, "readable": fmt_bytes(value), "formula": formula}


def _vrow(item: str, value: str, formula: str = "") -> dict:
    return {"item": item, "value": value, "formula": formula}


def _catalog_rows(context: int, extra: ModelSpec | None) -> list[dict]:
    specs = [catalog.model_spec(k) for k in catalog.models()]
    if extra is not None:
        specs.append(extra)
    rows = []
    for spec in specs:
        tokens = min(context, spec.max_context)
        for dtype in CATALOG_CHART_DTYPES:
            try:
                total = sequence_cost(spec, dtype).bytes(tokens)
            except ValueError:
                continue  # a format the engine cannot keep this model in (DeepSeek-V3.2 in int4): no bar
            rows.append(
                {
                    "label": f"{spec.name} ({spec.attention_label})",
                    "dtype": dtype,
                    "bytes_per_token": total / tokens,
                    "tokens": tokens,
                }
            )
    return rows


def _planner(spec: ModelSpec, v: KvInputs) -> Callable[[int, int], CapacityPlan]:
    """The capacity plan of the page's inputs on ``gpu_count`` GPUs at tensor parallel ``tp``."""
    gpu = catalog.gpu(v.gpu)

    def plan_for(gpu_count: int, tp: int) -> CapacityPlan:
        return plan(
            spec,
            gpu,
            gpu_count=gpu_count,
            tp=tp,
            weight_dtype_name=v.weight_dtype,
            kv_dtype=v.kv_dtype,
            context_len=v.context_len,
            batch=v.batch,
            utilization=v.utilization,
            reserve_bytes=v.reserve_bytes,
            block_size=v.block_size,
            state_dtype=v.state_dtype,
            engine_id=v.engine,
            pp=v.pp,
            max_num_batched_tokens=v.max_num_batched_tokens,
            cpu_offload_bytes=v.cpu_offload_bytes,
        )

    return plan_for


def _prefix(spec: ModelSpec, v: KvInputs, cap: CapacityPlan) -> PrefixSharing | None:
    if not v.prefix_len:
        return None
    return prefix_sharing(
        spec,
        cap.batch_per_replica,
        v.prefix_len,
        v.context_len,
        v.kv_dtype,
        block_size=v.block_size,
        tp=v.tp,
        state_dtype=v.state_dtype,
    )


def _charts(spec: ModelSpec, v: KvInputs, cap: CapacityPlan) -> tuple[list[int], list[int], dict[str, go.Figure]]:
    """The context lengths charted, the sequences that fit at each, and the three figures: one cost
    model, many lengths."""
    contexts = charts.context_points(v.context_len, spec.max_context)
    if cap.vllm is not None:
        lay, pool = cap.vllm.layout, cap.vllm.num_blocks
        steady = [lay.steady_blocks(c) for c in contexts]
        seq_bytes = [n * lay.block_bytes for n in steady]
        concurrency = [pool // n * cap.replicas for n in steady]
    else:
        cost = staged_cost(spec, v.kv_dtype, tp=v.tp, pp=v.pp, state_dtype=v.state_dtype)
        seq_bytes = [cost.bytes(c, cap.block_size) for c in contexts]
        concurrency = [max_sequences(cap.kv_budget, b) * cap.replicas for b in seq_bytes]
    figures = {
        "memory": charts.memory_figure(contexts, cap, [cap.batch_per_replica * b for b in seq_bytes]),
        "concurrency": charts.concurrency_figure(contexts, concurrency, v.context_len, cap.weights_fit),
        "catalog": charts.catalog_figure(
            _catalog_rows(v.context_len, spec if v.model == CUSTOM else None), CATALOG_CHART_DTYPES, v.context_len
        ),
    }
    return contexts, concurrency, figures


def _verdict(v: KvInputs, cap: CapacityPlan, needed: GpusNeeded) -> str:
    """Fits or not and by how much; the engine it was computed for, whichever it is (its allocator
    decides what a sequence holds); and how many GPUs would be enough, fitting or not."""
    if not cap.weights_fit:
        verdict = (
            f"Does not fit: the weights ({fmt_bytes(cap.weights_per_gpu)} per GPU) and the reserve "
            f"leave no KV budget out of {fmt_bytes(cap.usable)} usable per GPU."
        )
    elif cap.fits:
        verdict = (
            f"Fits: {v.batch:,} sequences of {v.context_len:,} tokens need "
            f"{fmt_bytes(cap.batch_bytes)} of KV per GPU; headroom {fmt_bytes(cap.headroom)} "
            f"({cap.headroom * 100 // cap.kv_budget}% of the KV budget). Up to "
            f"{cap.max_concurrency:,} such sequences fit."
        )
    else:
        verdict = (
            f"Does not fit: {v.batch:,} sequences of {v.context_len:,} tokens need "
            f"{fmt_bytes(cap.batch_bytes)} of KV per GPU but the budget is "
            f"{fmt_bytes(cap.kv_budget)} (short by {fmt_bytes(-cap.headroom)}). At most "
            f"{cap.max_concurrency:,} such sequences fit."
        )
    chosen = ENGINES[v.engine]
    verdict += f" Engine: {chosen.name}, {chosen.alloc_note}."
    verdict += " " + needed.text(catalog.gpu(v.gpu).name)
    if cap.vllm is not None and cap.weights_fit:
        vc = cap.vllm
        verdict += (
            f" vLLM steady state: {float(vc.steady_concurrency):.2f} sequences per instance while decoding; "
            f"its start-up log will report {float(vc.logged_concurrency):.2f}x (it budgets each request for a "
            f"{v.max_num_batched_tokens:,}-token chunked prefill)."
        )
    return verdict


def _metrics(v: KvInputs, whole: KvBreakdown, cap: CapacityPlan) -> dict[str, str]:
    metrics = {
        "Bytes per token": f"{whole.bytes_per_token:,} B",
        "Per sequence": fmt_bytes(whole.per_sequence),
        f"Total ({v.batch:,} seq)": fmt_bytes(whole.total),
        "Per GPU (TP)": fmt_bytes(cap.batch_bytes),
        "Max concurrent sequences": f"{cap.max_concurrency:,}",
        f"Max context at {v.batch:,} seq": f"{cap.max_context_at_batch:,} tokens",
    }
    if cap.vllm is not None:
        vc = cap.vllm
        metrics["vLLM steady state (per instance)"] = f"{float(vc.steady_concurrency):.2f} sequences"
        # the log line reads 'Maximum concurrency for N tokens per request: X.XXx'
        metrics["vLLM start-up log: Maximum concurrency"] = (
            f"{float(vc.logged_concurrency):.2f}x for {v.context_len:,} tokens"
        )
    return metrics


def _vllm_rows(v: KvInputs, cap: CapacityPlan) -> list[dict]:
    """What vLLM allocates: its KV-cache groups, pages and blocks, and both concurrency figures."""
    if cap.vllm is None:
        if v.engine != "vllm":
            return []
        return [
            _vrow(
                "vLLM allocator",
                "not modelled for recurrent-state layers",
                "Mamba / linear-attention pages are aligned to attention pages by vLLM; "
                "capacity here counts whole blocks per group plus the states",
            )
        ]
    vc = cap.vllm
    lay = vc.layout
    rows = [
        _vrow(
            "KV-cache groups",
            f"{len(lay.groups)} x {lay.group_size} layers",
            f"{lay.describe()} (vLLM get_kv_cache_groups)",
        ),
        _vrow("page (one layer, one block)", f"{lay.page_bytes:,} B", f"{v.block_size} tokens x one layer's bytes"),
        _vrow(
            "num_blocks",
            f"{vc.num_blocks:,}",
            f"{vc.available:,} // {lay.page_bytes:,} // {lay.group_size} layers per group"
            + (f", smallest of {v.pp} pipeline stages" if v.pp > 1 else ""),
        ),
        _vrow("GPU KV cache size (start-up log)", f"{vc.kv_cache_tokens:,} tokens", "num_blocks // groups x block"),
    ]
    for i, g in enumerate(lay.groups):
        name = f"group {i} ({g.kind}{'' if g.span is None else f' {g.span:,}'}, {len(g.layers)} layers"
        name += f" + {g.padding} padding)" if g.padding else ")"
        logged = g.logged_blocks(v.context_len, v.max_num_batched_tokens)
        rows.append(
            _vrow(
                name,
                f"{g.steady_blocks(v.context_len):,} / {logged:,}",
                f"steady {g.describe_steady(v.context_len)}; "
                f"start-up {g.describe_logged(v.context_len, v.max_num_batched_tokens)}",
            )
        )
    rows += [
        _vrow(
            "steady-state concurrency (what vLLM sustains while decoding)",
            f"{float(vc.steady_concurrency):.2f}",
            f"{vc.num_blocks:,} / {vc.steady_blocks:,} blocks per request",
        ),
        _vrow(
            f"'Maximum concurrency for {v.context_len:,} tokens per request' (start-up log)",
            f"{float(vc.logged_concurrency):.2f}x",
            f"{vc.num_blocks:,} / {vc.logged_blocks:,} blocks per request "
            f"(max_num_batched_tokens {v.max_num_batched_tokens:,})",
        ),
    ]
    return rows


def _working(spec: ModelSpec, v: KvInputs, whole: KvBreakdown, per_gpu: KvBreakdown, naive: int) -> list[str]:
    """The formulas behind the figures, the config's conventions first, the naive formula last."""
    working = [f"config: {note}" for note in spec.extras.get("conventions", ())]
    working += [f"{g.label}: {g.formula}" for g in whole.groups]
    if v.tp > 1:
        working += [f"per GPU (TP {v.tp}), {g.label}: {g.formula}" for g in per_gpu.groups]
    working.append(
        f"naive 2 x layers x hidden_size formula: 2 x {spec.num_layers} x {spec.hidden_size} x "
        f"{KV_DTYPES[v.kv_dtype].describe_vector(1)} x {v.context_len:,} tokens x {v.batch} = "
        f"{naive:,} B ({naive / whole.total:.2f}x the exact figure)"
        if whole.total
        else "naive formula: n/a"
    )
    return working


def _breakdown_rows(spec: ModelSpec, v: KvInputs, whole: KvBreakdown) -> list[dict]:
    """One row per layer group of the whole model's cache, then the total."""
    rows = [
        {
            "item": g.label,
            "layers": g.layers,
            "tokens held": g.tokens_held,
            "B/token": g.bytes_per_token,
            "B/sequence": g.bytes_per_sequence,
            "bytes": g.bytes_total,
            "readable": fmt_bytes(g.bytes_total),
            "formula": g.formula,
        }
        for g in whole.groups
    ]
    rows.append(
        {
            "item": "total",
            "layers": spec.num_layers,
            "tokens held": v.context_len,
            "B/token": whole.bytes_per_token,
            "B/sequence": whole.per_sequence,
            "bytes": whole.total,
            "readable": fmt_bytes(whole.total),
            "formula": "sum of the groups",
        }
    )
    return rows


def _parts_rows(v: KvInputs, whole: KvBreakdown) -> list[dict]:
    """One row per cache part of each layer group, with its dtype and the engine rule behind it."""
    return [
        {
            "layers": g.label,
            "part": part,
            "dtype": dtype,
            "B/sequence": size,
            "bytes": size * v.batch,
            "readable": fmt_bytes(size * v.batch),
            "convention": g.convention or ENGINES[v.engine].convention(g.kind),
        }
        for g in whole.groups
        for part, dtype, size in g.parts
    ] + [
        {  # kept once for the whole cache (transformers' fp8 scales), not per sequence
            "layers": g.label,
            "part": f"{part} (whole cache)",
            "dtype": dtype,
            "B/sequence": 0,
            "bytes": size,
            "readable": fmt_bytes(size),
            "convention": g.convention,
        }
        for g in whole.groups
        for part, dtype, size in g.cache_parts
    ]


def _capacity_rows(spec: ModelSpec, v: KvInputs, cap: CapacityPlan) -> list[dict]:
    """Per GPU, from its memory down to the headroom; the swap space when one is set."""
    weight = WEIGHT_DTYPES[v.weight_dtype]
    rows = [
        _row("GPU memory", cap.gpu_memory, f"{catalog.gpu(v.gpu).memory_gib} GiB"),
        _row("usable per GPU", cap.usable, f"floor({cap.gpu_memory:,} x {cap.utilization})"),
        _row("weights (all GPUs of a replica)", cap.weights_total, weight.describe(spec.params_total)),
        _row(
            "weights per GPU",
            cap.weights_per_gpu,
            f"ceil({cap.weights_total:,} / (TP {v.tp} x PP {v.pp}))"
            + (f" - {cap.cpu_offload:,} offloaded to CPU" if cap.cpu_offload else ""),
        ),
        _row("runtime reserve per GPU", cap.reserve),
        _row("KV budget per GPU", cap.kv_budget, "usable - weights per GPU - reserve"),
        _row(
            f"one sequence of {v.context_len:,} tokens per GPU",
            cap.sequence_bytes,
            "vLLM: steady-state blocks x page x layers per group"
            if cap.vllm
            else ("exact tokens" if cap.block_size is None else "whole blocks per group"),
        ),
        _row(f"{cap.batch_per_replica} sequences per replica, per GPU", cap.batch_bytes),
        _row("headroom per GPU", cap.headroom, "KV budget - batch"),
        _row(
            f"one max-length request ({cap.max_len:,} tokens) per GPU",
            cap.max_len_sequence_bytes,
            ("fits" if cap.max_len_fits else "does not fit")
            + (" (vLLM's start-up check, with max_num_batched_tokens)" if cap.vllm else ""),
        ),
    ]
    if v.swap_bytes:
        parked = v.swap_bytes // cap.sequence_bytes if cap.sequence_bytes else 0
        rows.append(
            _row(
                f"CPU swap space per GPU: holds {parked:,} preempted sequences of {v.context_len:,} tokens",
                v.swap_bytes,
                "swap // one sequence per GPU; host memory parks preempted sequences (vLLM v0 --swap-space; "
                "v1 recomputes or offloads prefix blocks with --kv-offloading-size) and does not raise the "
                "number of sequences running on the GPU",
            )
        )
    return rows


def _paged_rows(v: KvInputs, paged: PagedAllocation, cap: CapacityPlan) -> list[dict]:
    return [
        _row("used by the tokens", paged.used),
        _row(
            f"paged allocation ({v.block_size}-token blocks)",
            paged.allocated,
            "ceil(tokens held / block) x block per group"
            + (
                "; vLLM's exact blocks (groups, the extra sliding block) are under 'What vLLM allocates'"
                if cap.vllm
                else ""
            ),
        ),
        _row("internal fragmentation", paged.fragmentation, "allocated - used"),
        _row(f"contiguous pre-allocation to {paged.max_len:,} tokens", paged.contiguous),
        _row("saved by paging", paged.saved_by_paging, "contiguous - allocated"),
    ]


def _prefix_rows(prefix: PrefixSharing | None) -> list[dict]:
    if prefix is None:
        return []
    return [
        _row(f"{prefix.requests} requests without prefix caching", prefix.without_sharing),
        _row(
            f"with a shared {prefix.shared_tokens:,}-token prefix",
            prefix.with_sharing,
            "prefix stored once; only whole blocks are shared",
        ),
        _row("saved by prefix caching", prefix.saved),
    ]


def _model_rows(spec: ModelSpec, v: KvInputs) -> list[dict]:
    rows = [
        {"field": "attention", "value": spec.attention_label},
        {"field": "layers", "value": f"{spec.num_layers}"},
        {"field": "layer groups", "value": ", ".join(f"{g.layers} {g.kind}" for g in spec.groups)},
        {"field": "max context", "value": f"{spec.max_context:,} tokens"},
        {
            "field": "parameters",
            "value": f"{spec.params_total:,} total, {spec.params_active:,} active ({spec.params_note})",
        },
        {"field": "source", "value": v.source or "pasted config.json"},
    ]
    conventions = list(spec.extras.get("conventions", ()))
    if conventions:
        rows.append({"field": "not in config.json / family names", "value": "; ".join(conventions)})
    return rows


_EXPORTED_INPUTS = (
    "model",
    "kv_dtype",
    "weight_dtype",
    "state_dtype",
    "ssm_dtype",
    "context_len",
    "batch",
    "prefix_len",
    "gpu",
    "gpu_count",
    "tp",
    "block_size",
    "reserve_bytes",
    "engine",
    "pp",
    "max_num_batched_tokens",
    "cpu_offload_bytes",
    "draft_model",
    "swap_bytes",
)


def _export(spec: ModelSpec, data: PageData) -> dict:
    """The JSON export: the inputs, the model, the verdict and every table's figures."""
    v, cap, whole, per_gpu = data.inputs, data.capacity, data.whole, data.per_gpu
    inputs: dict[str, Any] = {k: getattr(v, k) for k in _EXPORTED_INPUTS}
    inputs["utilization"] = str(v.utilization)
    return {
        "inputs": inputs,
        "model": {"name": spec.name, **{r["field"]: r["value"] for r in data.model_rows}},
        "verdict": data.verdict,
        "fits": cap.fits,
        "gpus_needed": asdict(data.gpus_needed) if data.gpus_needed is not None else None,
        "kv_whole_model": {
            "bytes_per_token": whole.bytes_per_token,
            "per_sequence": whole.per_sequence,
            "total": whole.total,
            "groups": [asdict(g) for g in whole.groups],
        },
        "kv_per_gpu": {"total": per_gpu.total, "groups": [asdict(g) for g in per_gpu.groups]},
        "capacity": {r["item"]: r["bytes"] for r in data.capacity_rows}
        | {
            "max_concurrency": cap.max_concurrency,
            "max_context_at_batch": cap.max_context_at_batch,
            "replicas": cap.replicas,
            "max_len_fits": cap.max_len_fits,
        },
        "paged": {r["item"]: r["bytes"] for r in data.paged_rows},
        "prefix": {r["item"]: r["bytes"] for r in data.prefix_rows},
        "engine": {"id": v.engine, "pp": v.pp, "max_num_batched_tokens": v.max_num_batched_tokens}
        | {r["item"]: r["value"] for r in data.vllm_rows},
    }


def build_page_data(v: KvInputs) -> PageData:
    """All numbers, tables, figures and exports of one render of the KV-calculator page, section by
    section."""
    # the chosen engine's layouts and state dtypes, and the user's recurrent-state dtype if set
    spec = with_ssm_dtype(for_engine(v.spec, v.engine), None if v.ssm_dtype == "auto" else v.ssm_dtype)
    whole = breakdown(spec, v.context_len, v.batch, v.kv_dtype, state_dtype=v.state_dtype)
    per_gpu = breakdown(spec, v.context_len, v.batch, v.kv_dtype, tp=v.tp, state_dtype=v.state_dtype)
    plan_for = _planner(spec, v)
    cap = plan_for(v.gpu_count, v.tp)
    paged = paged_allocation(
        spec,
        v.context_len,
        cap.batch_per_replica,
        v.kv_dtype,
        block_size=v.block_size,
        tp=v.tp,
        state_dtype=v.state_dtype,
    )
    prefix = _prefix(spec, v, cap)
    naive = naive_bytes(spec, v.context_len, v.batch, v.kv_dtype)
    contexts, concurrency, figures = _charts(spec, v, cap)
    needed = gpus_needed(plan_for, batch=v.batch, pp=v.pp, tp_choices=(*TP_CANDIDATES, v.tp))
    data = PageData(
        inputs=v,
        model_rows=_model_rows(spec, v),
        whole=whole,
        per_gpu=per_gpu,
        naive=naive,
        paged=paged,
        capacity=cap,
        prefix=prefix,
        metrics=_metrics(v, whole, cap),
        verdict=_verdict(v, cap, needed),
        fits=cap.fits,
        working=_working(spec, v, whole, per_gpu, naive),
        breakdown_rows=_breakdown_rows(spec, v, whole),
        capacity_rows=_capacity_rows(spec, v, cap),
        paged_rows=_paged_rows(v, paged, cap),
        prefix_rows=_prefix_rows(prefix),
        vllm_rows=_vllm_rows(v, cap),
        concurrency_rows=[
            {"context": f"{c:,}", "max sequences": f"{n:,}" if n > 0 else "does not fit"}
            for c, n in zip(contexts, concurrency, strict=True)
        ],
        figures=figures,
        export={},
        gpus_needed=needed,
        parts_rows=_parts_rows(v, whole),
    )
    data.export = _export(spec, data)
    return data
