"""The Playground's tool and structured-output modes in Chromium (issue 15): with the sample tool
offered, a weather question comes back as a tool call shown as data; in the JSON-schema mode the
answer is shown as structured output. Through the embedded default (the simulator honours tools
and response_format), and the request log records the tool call."""

from __future__ import annotations

from conftest import assert_no_exception, open_page, screenshot, wait_ready, wait_until
from playwright.sync_api import expect


def ask(page, text: str, n: int):
    box = page.get_by_test_id("stChatInputTextArea")
    box.fill(text)
    box.press("Enter")
    answer = page.get_by_test_id("stChatMessage").nth(n)
    expect(answer).to_contain_text("TTFT", timeout=30_000)
    wait_ready(page)
    return answer


def test_a_tool_call_and_a_structured_answer_are_shown_as_data(server, new_page):
    page = new_page()
    open_page(page, server, "playground")
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_text("Offer a sample tool (get_weather)").click()
    wait_ready(page)
    answer = ask(page, "What's the weather in Paris?", 1)
    expect(answer).to_contain_text("Tool call:")
    expect(answer).to_contain_text("get_weather")
    expect(answer.get_by_test_id("stJson")).to_contain_text("Paris")
    assert_no_exception(page)
    screenshot(page, "playground-tool-call")
    session = sidebar.get_by_label("Session id", exact=True).input_value()
    rows = wait_until(
        lambda: server.query(
            f"select finish_reason, tool_calls from request_log where session_id = '{session}' and final"
        ),
        10,
        "the tool call's request_log row",
    )
    assert rows[-1] == ("tool_calls", 1)

    sidebar.get_by_text("Offer a sample tool (get_weather)").click()  # off again
    sidebar.get_by_test_id("stSelectbox").filter(has_text="Answer format").click()
    page.get_by_role("option", name="JSON schema (incident triage)").click()
    wait_ready(page)
    answer = ask(page, "Triage this: the primary database stopped answering", 3)
    expect(answer).to_contain_text("Structured output")
    expect(answer.get_by_test_id("stJson")).to_contain_text("severity")
    assert_no_exception(page)
    screenshot(page, "playground-structured-output")
