"""Answers are stored with the request only when the operator opted in (``store_prompts``), on the
successful attempt only, and cleaned like prompts; the drill-down shows them."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from app.monitor import load_story
from tests.support import paths

REPO = paths.REPO


def _config(store: bool) -> str:
    body = (REPO / "gateway.toml").read_text()
    return body + f"\n[telemetry]\nstore_prompts = {str(store).lower()}\n"


def _answers(url: str) -> list[tuple[str, str | None]]:
    eng = create_engine(url)
    try:
        with eng.connect() as conn:
            return [tuple(r) for r in conn.execute(text("select status, answer_text from request_log order by id"))]
    finally:
        eng.dispose()


def test_answers_are_stored_only_when_opted_in(db_url, client_factory):
    client = client_factory(db_url, _config(store=True))
    r = client.chat([{"role": "user", "content": "hello there"}], session_id="s-1")
    client.flush()
    rows = _answers(db_url)
    assert rows[-1] == ("ok", r.text) and r.text
    story = load_story(client.engine, r.request_id)
    assert story is not None and story.answer_text == r.text and story.prompt_text == "hello there"


def test_answers_are_not_stored_by_default(db_url, client_factory):
    client = client_factory(db_url, _config(store=False))
    client.chat([{"role": "user", "content": "hello there"}], session_id="s-2")
    client.flush()
    assert all(answer is None for _, answer in _answers(db_url))
