"""A full rollout and an abort in Chromium, as an operator runs them: a plan started from the Canary
page's rollout form, traffic from another process, the dashboard's own controller stepping the
candidate to 100 % after short bakes; then a candidate degraded from the fault panel, aborted on its
own, the page and the Overview's banner saying so. Screenshots of both ends are kept."""

from __future__ import annotations

from conftest import assert_no_exception, open_page, rerun, screenshot, start_server, stop_server, wait_until
from playwright.sync_api import expect


def _plan(page, steps: str, reason: str, bake_s: str = "2") -> None:
    form = page.get_by_test_id("stForm").filter(has_text="Start rollout")
    form.get_by_label("Steps (%)", exact=True).fill(steps)
    form.get_by_label("Bake time per step (s)", exact=True).fill(bake_s)
    form.get_by_label("Samples per arm (a session counts once)", exact=True).fill("15")
    form.get_by_label("Reason for this rollout (required)", exact=True).fill(reason)
    with rerun(page):
        form.get_by_role("button", name="Start rollout").click()


def _state(server, rollout_id: int) -> str:
    return server.query(f"select state from rollout where id = {rollout_id}")[0][0]


def _until(server, rollout_id: int, wanted: str, seed: int) -> None:
    """Traffic from another process than the dashboard's (this one: ``Server.loadgen``) until the
    rollout reaches ``wanted`` (bounded). Each round is a new seed, so new sessions: the analysis
    counts a session once however many requests it sends, and one seed's two dozen sessions alone
    are too few samples for a step."""
    rounds = iter(range(seed * 1000, seed * 1000 + 1000))

    def reached() -> bool:
        server.loadgen(rps=16, duration_s=2, seed=next(rounds))
        return _state(server, rollout_id) == wanted

    wait_until(reached, 240, f"rollout #{rollout_id} {wanted}", poll=0.5)


def test_a_rollout_is_promoted_then_a_degraded_one_aborts_on_its_own(tmp_path, new_page):
    from conftest import REPO

    # The guardrail stays off here, so the abort is the analysis's own (the guardrail under it is
    # tested in tests/unit/rollout/test_driver.py).
    config = (REPO / "gateway.toml").read_text().replace("[guardrail]\nenabled = true", "[guardrail]\nenabled = false")
    config += "\n[simulator]\nlatency_scale = 0.05\n"
    assert "enabled = false" in config
    server = start_server(tmp_path / "rollout", config_text=config)
    try:
        page = new_page()
        open_page(page, server)  # the Overview builds the dashboard's client, and with it its controller
        open_page(page, server, "canary")
        _plan(page, "50,100", "drill: new provider")
        expect(page.get_by_test_id("stMain")).to_contain_text("running at step 1 of 2 (50 %", timeout=10_000)
        expect(page.locator(".st-key-rollout_promote_1")).to_have_count(1)  # the buttons of an active rollout
        _until(server, 1, "completed", seed=1)
        # The panel follows the rollout on the open page, without a reload (it refreshes while the
        # rollout is active), and the buttons go once it ended.
        main = page.get_by_test_id("stMain")
        expect(main).to_contain_text("completed at step 2 of 2 (100 %", timeout=15_000)
        expect(page.locator(".st-key-rollout_promote_1")).to_have_count(0, timeout=15_000)
        expect(main).to_contain_text("every metric passes")  # ("50 % -> 100 %": markdown shows an arrow)
        assert_no_exception(page)
        screenshot(page, "rollout-completed")

        form = page.get_by_test_id("stForm").filter(has_text="holysheep").filter(has_text="Save faults")
        form.get_by_label("Error rate (%)", exact=True).fill("60")
        with rerun(page):
            form.get_by_role("button", name="Save faults").click()
        # A bake of 10 s: a step whose evidence leans against the candidate holds up to three more
        # bakes, and with sessions counted once (each loadgen round brings about five candidate
        # sessions, and the candidate's breaker sends some of their requests elsewhere) 2 s bakes
        # run out before the evidence reaches the abort level.
        _plan(page, "25,100", "drill: a worse candidate", bake_s="10")
        expect(page.get_by_test_id("stMain")).to_contain_text("running at step 1 of 2 (25 %", timeout=10_000)
        _until(server, 2, "aborted", seed=2)
        assert server.query("select ratio from canary_setting where scope = 'global'")[0][0] == 0.0
        # Worse on first-attempt failures, or the candidate's breaker opened first (its requests then
        # go to the fallback, out of the analysis's sight): either way the rollout ends itself.
        expect(page.get_by_test_id("stMain")).to_contain_text("rollout abort at 25 %: ", timeout=15_000)
        reason = server.query("select last_reason from rollout where id = 2")[0][0]
        assert "first-attempt failure rate" in reason or "circuit breaker for holysheep is open" in reason, reason
        assert_no_exception(page)
        screenshot(page, "rollout-aborted")
        open_page(page, server)
        expect(page.get_by_test_id("stMain")).to_contain_text("Rollout #2 of holysheep on the global canary is aborted")
        screenshot(page, "overview-rollout-aborted")
    finally:
        stop_server(server)
