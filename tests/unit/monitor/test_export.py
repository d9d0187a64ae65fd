"""Issue 7 #11, the export and log side: the CSV download cannot carry a spreadsheet formula, and a
failed database write never puts the rows' values (session ids, prompts, upstream texts) into the
error text that the telemetry writer logs and the CLI prints."""

from __future__ import annotations

import csv
import io

import pytest
from sqlalchemy import text

from app.monitor import RECENT_COLUMNS, requests_csv
from core.records import AttemptRecord

FORMULAS = ['=HYPERLINK("http://evil.example","click")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)", "\t=1"]


def row(**over) -> dict:
    base: dict[str, object] = {name: None for name in RECENT_COLUMNS}
    base.update(request_id="r1", attempt=1, final=True, provider="p", latency_ms=-1.5, cost_usd=0.0, ts=1.0)
    base.update(over)
    return base


@pytest.mark.parametrize("payload", FORMULAS)
@pytest.mark.parametrize("column", ["error_message", "session_id", "prompt_text", "model"])
def test_csv_text_cells_never_start_a_formula(payload, column):
    parsed = next(csv.DictReader(io.StringIO(requests_csv([row(**{column: payload})]))))
    assert parsed[column] == "'" + payload  # kept, readable, and inert in a spreadsheet
    assert parsed["latency_ms"] == "-1.5"  # numbers stay numbers, sign included


def test_csv_plain_text_is_unchanged():
    parsed = next(csv.DictReader(io.StringIO(requests_csv([row(error_message="upstream 503, retry=yes")]))))
    assert parsed["error_message"] == "upstream 503, retry=yes"


SECRET_SESSION = "session-of-alice-7f3a"
SECRET_PROMPT = "my card number is 4111 1111 1111 1111"


def test_a_failed_write_does_not_show_the_rows_values(engine):
    from db.requests import insert_batch

    record = AttemptRecord(
        request_id="hygiene-1",
        attempt=1,
        ts=1.0,
        provider="p",
        model="m",
        requested_model="auto",
        intent="general",
        side="primary",
        status="error",
        latency_ms=1.0,
        error_message="upstream said: " + SECRET_PROMPT,
        session_id=SECRET_SESSION,
        prompt_text=SECRET_PROMPT,
    )
    with engine.begin() as conn:
        conn.execute(text("drop table request_log"))
    with pytest.raises(Exception) as info:  # whatever the driver raises: its text is the point
        insert_batch(engine, [record])
    shown = f"{type(info.value).__name__}: {info.value}"  # what the writer's warning prints
    assert "request_log" in shown  # the error is still useful...
    assert SECRET_SESSION not in shown and "4111" not in shown  # ...without the values
