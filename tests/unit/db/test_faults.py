"""The fault-injection repository."""

from __future__ import annotations

from core.faults import FaultSettings


def test_faults_round_trip(engine) -> None:
    from db.faults import all_faults, clear_faults, get_faults, set_faults

    assert get_faults(engine, "holysheep") is None
    assert all_faults(engine) == {}
    f1 = FaultSettings(
        error_rate=0.25,
        rate_limit_rate=0.1,
        retry_after_s=2.5,
        timeout_rate=0.05,
        latency_multiplier=3.0,
        reject_cache_hints=True,
        stream_break_rate=0.2,
    )
    set_faults(engine, "holysheep", f1, actor="alice")
    assert get_faults(engine, "holysheep") == f1
    assert get_faults(engine, "direct") is None

    f2 = FaultSettings(error_rate=1.0)
    set_faults(engine, "holysheep", f2, actor="bob")  # update in place, not a second row
    set_faults(engine, "direct", f1, actor="bob")
    assert get_faults(engine, "holysheep") == f2
    assert all_faults(engine) == {"holysheep": f2, "direct": f1}

    clear_faults(engine, "holysheep")
    assert get_faults(engine, "holysheep") is None
    assert all_faults(engine) == {"direct": f1}
