"""The KV calculator names how many GPUs would be enough (issue 17 point 10): the smallest count of
the chosen GPU on which the requested sequences fit, checked against a brute-force search over
every count and tensor-parallel width; or "no count fits" with the reason."""

from __future__ import annotations

import pytest

from app.dashboard import kv_page as kv
from kvcache import catalog
from kvcache.capacity import TP_CANDIDATES, gpus_needed, plan
from kvcache.engines import for_engine


def valid(**changes):
    inputs, errors = kv.validate_inputs({**kv.DEFAULTS, **changes})
    assert errors == {}
    return inputs


def plan_for_inputs(v):
    spec = for_engine(v.spec, v.engine)
    gpu = catalog.gpu(v.gpu)

    def plan_for(gpu_count: int, tp: int):
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


def brute_force(plan_for, pp: int, limit: int) -> int | None:
    """The smallest count in 1..limit with any width from TP_CANDIDATES that fits."""
    for count in range(1, limit + 1):
        for tp in TP_CANDIDATES:
            if count % (tp * pp):
                continue
            try:
                if plan_for(count, tp).fits:
                    return count
            except ValueError:
                continue
    return None


@pytest.mark.parametrize(
    "changes",
    [
        {},  # llama-3.1-70b fp8, 8 x 32k on H100: fits on the chosen 2
        {"batch": 64},  # needs more than chosen
        {"batch": 1, "context_len": 4096, "model": "llama-3.1-8b"},  # one GPU is plenty
        {"gpu": "l4-24gb", "batch": 4},  # the weights need several L4s before any KV fits
        {"model": "deepseek-v3", "gpu": "h200-141gb", "gpu_count": 8, "tp": 8, "batch": 16},  # MLA
        {"engine": "sglang", "batch": 40},
    ],
)
def test_the_answer_is_the_smallest_count_that_fits(changes):
    v = valid(**changes)
    plan_for = plan_for_inputs(v)
    needed = gpus_needed(plan_for, batch=v.batch, pp=v.pp)
    assert needed.found
    assert plan_for(needed.gpu_count, needed.tp).fits
    assert needed.gpu_count == needed.replicas * needed.tp * needed.pp
    assert brute_force(plan_for, v.pp, needed.gpu_count) == needed.gpu_count


def test_the_verdict_names_the_count_first_thing_and_the_export_keeps_it():
    data = kv.build_page_data(valid(batch=64))
    assert not data.fits
    assert data.gpus_needed is not None and data.gpus_needed.gpu_count == 8
    assert "8 x NVIDIA H100 80GB (SXM) would be enough (tensor parallel 4, 2 replicas)." in data.verdict
    assert data.export["gpus_needed"]["gpu_count"] == 8
    fits = kv.build_page_data(valid())
    assert fits.fits and "2 x NVIDIA H100 80GB (SXM) would be enough (tensor parallel 2)." in fits.verdict


def test_no_count_fits_says_why():
    huge = kv.build_page_data(valid(batch=100_000))
    assert huge.gpus_needed is not None and not huge.gpus_needed.found
    assert "No count of NVIDIA H100 80GB (SXM) fits: it would take 8,168 GPUs" in huge.verdict
    assert "more than the 1,024 considered" in huge.verdict
    # A plan function under which nothing ever has KV room: the widest width's reason is given.
    base = plan_for_inputs(valid())
    starved = gpus_needed(lambda n, tp: base(n, tp).__class__(**{**base(n, tp).__dict__, "kv_budget": -1}), batch=1)
    assert (
        not starved.found and "even at tensor parallel 64 the weights and the reserve leave no room" in starved.why_not
    )
