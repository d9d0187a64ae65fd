"""The canary repository under real concurrency: threads routing and changing the ratio for seconds."""

from __future__ import annotations

import threading

from sqlalchemy import func, select

from db.canary import audit_count, set_ratio
from db.models import RequestLog, RequestRollup

THREADS = 8


PER_THREAD = 200  # 1,600 requests against a ratio changed every 10 ms: hundreds of changes land mid-request


def test_parallel_requests_and_ratio_changes(client_factory, db_url):
    client = client_factory(db_url)
    engine = client.engine
    errors: list[BaseException] = []
    ids: list[str] = []
    ids_lock = threading.Lock()
    stop = threading.Event()
    changes = [0]
    audits_before = audit_count(engine)

    def worker(n: int) -> None:
        try:
            for i in range(PER_THREAD):
                r = client.chat([{"role": "user", "content": f"hello {n} {i}"}], session_id=f"t{n}-{i % 50}")
                with ids_lock:
                    ids.append(r.request_id)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def operator() -> None:
        k = 0
        try:
            while not stop.is_set():
                set_ratio(engine, (k % 11) / 10, expected_version=None, actor="op", reason=f"step {k}")
                changes[0] += 1
                k += 1
                stop.wait(0.01)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    op = threading.Thread(target=operator)
    op.start()
    workers = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    op.join()
    client.flush()

    assert not errors, errors[:3]
    total = THREADS * PER_THREAD
    assert len(ids) == total and len(set(ids)) == total
    with engine.connect() as conn:
        rows = conn.execute(
            select(func.count(), func.count(func.distinct(RequestLog.request_id))).where(RequestLog.final.is_(True))
        ).one()
        assert tuple(rows) == (total, total)
        assert conn.execute(select(func.count()).select_from(RequestLog)).scalar_one() == total
        assert conn.execute(select(func.sum(RequestRollup.requests))).scalar_one() == total
        sides = dict(conn.execute(select(RequestLog.side, func.count()).group_by(RequestLog.side)).all())
    assert changes[0] > 0
    assert audit_count(engine) - audits_before == changes[0]
    assert sum(sides.values()) == total and len(sides) == 2
