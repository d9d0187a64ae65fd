"""What a new canary ratio would do, shown before it is applied (issue 28, item 1): the preview's
arithmetic on the shipped gateway.toml (the share that moves, the share refused or substituted,
per model and intent, from the router's own decision), the CLI's ``canary set X --dry-run``
(nothing written; hostile values refused with one line), and the observed split counting the
gateway's refusals as refusals."""

from __future__ import annotations

import time
import tomllib

import pytest

from app.config import IntentConfig, load_settings
from app.dashboard.canary_preview import one_sided_intents, preview, side_outcome
from app.monitor.stats import split_by_cause
from core.records import AttemptRecord
from db.requests import insert_batch
from tests.configs import one_sided_toml

SHIPPED = load_settings("gateway.toml", env={})
# A configuration whose coding and math rules pick deepseek (only the primary serves it).
SETTINGS = SHIPPED.model_copy(
    update={"intents": IntentConfig.model_validate(tomllib.loads(one_sided_toml())["intents"])}
)
DS = "deepseek-chat-v3.2"  # gateway.toml: only holysheep (the primary) serves it


def test_the_router_decides_each_side_as_it_would_route() -> None:
    assert side_outcome(SETTINGS, "gpt-4.1", "fallback", 0.25, by_intent=True).text() == "served by direct"
    # A model only the primary serves: moved there at 25 %, refused at 0 % (the closed side is
    # never where a request is moved to; direct's gpt-4.1 costs more than 1.5x).
    moved = side_outcome(SETTINGS, DS, "fallback", 0.25, by_intent=True)
    assert (moved.kind, moved.provider) == ("moved", "holysheep")
    assert side_outcome(SETTINGS, DS, "fallback", 0.0, by_intent=True).kind == "refused"


def test_a_rollback_preview_says_how_much_moves_and_is_refused() -> None:
    mix = {
        ("auto", "coding", "primary"): 10,
        ("auto", "coding", "fallback"): 30,  # moved to holysheep today (only it serves deepseek)
        ("auto", "general", "primary"): 10,
        ("auto", "general", "fallback"): 30,
        ("gpt-4.1", "general", "fallback"): 20,
        ("-", "refused", "none"): 5,  # refused at admission: no side, not in the preview
    }
    p = preview(SETTINGS, mix, 0.25, 0.0)
    rows = {(r.model, r.intent): r for r in p.rows}
    assert set(rows) == {(DS, "coding"), ("gemini-2.5-flash", "general"), ("gpt-4.1", "general")}
    coding = rows[(DS, "coding")]
    assert (coding.requests, coding.moves, coding.refused_now, coding.refused_after) == (40, 10, 0, 40)
    assert coding.fallback.kind == "refused"
    assert rows[("gemini-2.5-flash", "general")].refused_after == 0
    assert p.requests == 100 and p.share("moves") == pytest.approx(20 / 100)
    assert p.share("refused_after") == pytest.approx(40 / 100) and p.share("refused_now") == 0
    head = p.lines()[0]
    assert "25 % -> 0 %: 20.0 % move to the other side" in head and "refused 0.0 % now -> 40.0 %" in head
    assert any(line.startswith(f"{DS} (coding): 40 requests, 10 move") for line in p.lines())
    assert preview(SETTINGS, {}, 0.25, 0.5).lines()[0].startswith("No requests in the last 60 minutes")


def test_the_preview_warns_of_intents_whose_model_only_one_side_serves() -> None:
    assert one_sided_intents(SHIPPED) == []  # the shipped rules: every model on both sides
    assert preview(SHIPPED, {}, 0.25, 0.0).warning() is None
    sided = one_sided_intents(SETTINGS)
    assert sided == [
        ("coding", DS, "holysheep"),
        ("long_context", "claude-sonnet-4-20250514", "holysheep"),
        ("math", DS, "holysheep"),
    ]
    warning = preview(SETTINGS, {}, 0.25, 0.0).warning()
    assert warning is not None and f"coding -> {DS} (only holysheep)" in warning


def test_the_gateways_refusals_are_refusals_in_the_observed_split(engine) -> None:
    now = time.time()
    rows = [
        AttemptRecord(f"r{i}", 1, now, "holysheep", "gpt-4.1", "auto", "general", "primary", "ok", 5.0)
        for i in range(4)
    ]
    rows += [
        AttemptRecord(
            f"g{i}", 1, now, "gateway", DS, "auto", "coding", "fallback", "error", 0.0, error_class="refused_by_policy"
        )
        for i in range(6)
    ]
    insert_batch(engine, rows)
    s = split_by_cause(engine, primary="holysheep", fallback="direct", now=now, minutes=15)
    assert (s.refused, s.moved, s.share("holysheep")) == (6, {}, 1.0)
