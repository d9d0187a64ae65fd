"""The query plans a database chooses for the statements a call issues."""

from __future__ import annotations


def plans(engine, call) -> list[str]:
    """The query plans of the SELECTs on ``request_log`` that ``call`` issues, as the database
    chooses them for those statements and parameters."""
    from sqlalchemy import event

    issued: list[tuple[str, object]] = []

    def grab(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "request_log" in statement:
            issued.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", grab)
    try:
        call()
    finally:
        event.remove(engine, "before_cursor_execute", grab)
    plans = []
    with engine.connect() as conn:
        for statement, parameters in issued:
            if engine.dialect.name == "sqlite":
                rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
                plans.append(" | ".join(str(r[-1]) for r in rows))
            else:
                rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters)
                plans.append(" | ".join(r[0] for r in rows))
    return plans
