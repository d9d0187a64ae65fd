"""Command line: ``python -m app chat|canary|rollout|loadgen|simulate|dashboard|serve|keys|status|users``.

Exit 0 on success; otherwise one clear line on stderr and a non-zero code (2 for bad input or
configuration, 1 when the gateway itself failed). No tracebacks unless ``--debug`` is given.

SIGTERM and SIGINT (see :mod:`app.shutdown`): a command stops its work, closes its gateway with the
request log flushed within a bound, and exits ``128 + signal`` (130, 143). ``chat`` is interrupted
where it stands; ``loadgen`` stops scheduling, lets requests in flight finish for a bounded time and
prints its report; ``simulate`` stops serving. A second signal exits at once.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime

from app.shutdown import DRAIN_S, Interrupted, StopSignals, abandoned, close_within, exit_now, stop_on_signals
from core.bounds import parse_decimal, parse_float, parse_int
from core.errors import ConflictError, GatewayError, InvalidRequest

EXIT_FAILED = 1
EXIT_USAGE = 2

# Bounds of the numbers the command line takes (text is parsed with core.bounds before any use).
MAX_RPS = 1000.0
MAX_DURATION_S = 7 * 86400.0
MAX_DAYS = 36500.0  # a century
MAX_SEED = 2**63 - 1


class CliError(GatewayError):
    """A bad command line (exit 2 unless ``code`` says otherwise)."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


def _settings():
    from app.config import load_settings

    return load_settings()


def _engine(settings):
    from db.canary import ensure_setting
    from db.engine import DbTimeouts, get_engine

    engine = get_engine(settings.database_url, timeouts=DbTimeouts(**settings.database.model_dump()))
    ensure_setting(engine, settings.routing.initial_ratio)
    return engine


def _ts(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _signals(args: argparse.Namespace) -> StopSignals:
    """The signal state :func:`main` installed (a command called directly gets its own, idle one)."""
    sig = getattr(args, "signals", None)
    if sig is None:
        import threading

        sig = StopSignals(stop=threading.Event(), interrupt=False)
    return sig


def cmd_chat(args: argparse.Namespace) -> int:
    from app.gateway import build_gateway

    gateway = build_gateway(_settings(), source="cli")
    client = gateway.client
    try:
        messages = [{"role": "user", "content": args.prompt}]
        if args.stream:
            stream = client.chat(messages, model=args.model, session_id=args.session, stream=True)
            for piece in stream:
                if not args.json:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            result = stream.result
            if not args.json:
                sys.stdout.write("\n")
        else:
            result = client.chat(messages, model=args.model, session_id=args.session)
            if not args.json:
                print(result.text)
        assert result is not None
        if args.json:
            print(json.dumps(result.to_dict(), ensure_ascii=False))
        else:
            u = result.usage
            print(
                f"-- {result.provider}/{result.model} intent={result.intent} side={result.side} "
                f"fallback={'yes' if result.fallback_used else 'no'} attempts={result.attempts} "
                f"latency={result.latency_ms:.0f}ms tokens={u.prompt_tokens}/{u.cached_tokens} cached/"
                f"{u.completion_tokens} cost=${result.cost_usd:.6f}",
                file=sys.stderr,
            )
        return 0
    finally:
        # Interrupted or not: the request's records are flushed, within a bound.
        with _signals(args).shutting_down():
            close_within(gateway)


def _route_scope(settings, route: str | None) -> str:
    """The canary scope ``--route`` names: the global canary without it; a route with a canary
    deployment with it, else a usage error naming the routes that have one."""
    from db.canary import GLOBAL, route_scope

    if route is None:
        return GLOBAL
    with_canary = [n for n, r in settings.routes.items() if r.canary is not None]
    if route not in with_canary:
        have = ", ".join(with_canary) if with_canary else "none (add canary = { provider = ... } to a route)"
        raise CliError(f"--route {route!r} has no canary deployment; routes with one: {have}")
    return route_scope(route)


def cmd_canary_show(args: argparse.Namespace) -> int:
    from db.canary import ensure_setting, get_state

    settings = _settings()
    engine = _engine(settings)
    scope = _route_scope(settings, args.route)
    ensure_setting(engine, 0.0, scope)
    state = get_state(engine, scope)
    if args.json:
        print(json.dumps(state.to_dict()))
    else:
        where = f"route {args.route} " if args.route else ""
        print(
            f"{where}canary ratio {state.ratio * 100:g} % (version {state.version}), set by {state.updated_by} "
            f"at {_ts(state.updated_at)}: {state.reason}"
        )
    return 0


def cmd_canary_set(args: argparse.Namespace) -> int:
    from db.canary import set_ratio, validate_ratio

    try:
        # Exact text first: "1e-400" is not 0 and "nan" is not a ratio; both are refused here.
        ratio = validate_ratio(float(parse_decimal(args.ratio, field="ratio", lo=0, hi=1)))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.dry_run and args.route is not None:
        settings = _settings()
        _route_scope(settings, args.route)
        print(f"route {args.route}: {ratio:.0%} of its requests would go to its canary deployment first")
        print("dry run: nothing written")
        return 0
    if args.dry_run:
        import time

        from app.dashboard.canary_preview import ratio_preview

        settings = _settings()
        for line in ratio_preview(_engine(settings), settings, ratio, now=time.time()).lines():
            print(line)
        print("dry run: nothing written")
        return 0
    if not (args.reason or "").strip():
        raise CliError("--reason must not be empty")
    from app.accounts import RESERVED_ACTORS

    if args.actor and args.actor.strip().lower() in RESERVED_ACTORS:
        raise CliError(f"--actor {args.actor!r} is a reserved system actor; name yourself instead")
    actor = args.actor or getpass.getuser() or "cli"
    settings = _settings()
    scope = _route_scope(settings, args.route)
    engine = _engine(settings)
    from db.canary import ensure_setting, get_state

    ensure_setting(engine, 0.0, scope)
    old = get_state(engine, scope)
    state = set_ratio(engine, ratio, expected_version=None, actor=actor, reason=args.reason, scope=scope)
    where = f"route {args.route} " if args.route else ""
    print(f"{where}canary ratio {old.ratio * 100:g} % -> {state.ratio * 100:g} % (version {state.version}) by {actor}")
    return 0


def _allowed(signal: str) -> str:
    """The candidate's allowed change on a tail signal, as the analysis counts it."""
    from app.monitor.canary_analysis import TAIL_SIGNALS, allowed_text

    return f"  (candidate allowed {allowed_text(signal)})" if signal in TAIL_SIGNALS else ""


def cmd_canary_analyze(args: argparse.Namespace) -> int:
    """The canary against its baseline over the last minutes: every signal, both arms, verdicts."""
    import time

    from app.monitor.canary_analysis import analyse

    try:
        minutes = parse_decimal(args.minutes, field="--minutes", lo=1, hi=7 * 24 * 60)
        alpha = parse_decimal(args.alpha, field="--alpha", lo=0.0001, hi=0.5)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    settings = _settings()
    if args.route is not None:
        _route_scope(settings, args.route)
    now = time.time()
    result = analyse(
        _engine(settings), since=now - float(minutes) * 60, until=now, route=args.route, alpha=float(alpha)
    )
    if args.json:
        print(json.dumps({"scope": result.scope, "verdict": result.verdict, "candidate_requests":
                          result.candidate_requests, "baseline_requests": result.baseline_requests,
                          "candidate_units": result.candidate_units, "baseline_units": result.baseline_units,
                          "alpha": result.alpha, "signals": result.rows()}))  # fmt: skip
        return 0
    print(
        f"{result.scope} canary, last {float(minutes):g} min: {result.candidate_requests} candidate and "
        f"{result.baseline_requests} baseline requests ({result.candidate_units} and {result.baseline_units} units: "
        f"a session counts once); verdict {result.verdict} (alpha {result.alpha:g} over "
        f"{len(result.signals)} signals, always valid)"
    )
    for s in result.signals:
        rate = lambda v: "-" if v is None else f"{v:.2%}"  # noqa: E731
        ratio = "-" if s.ratio is None else f"{s.ratio:.2f}x"
        print(
            f"  {s.signal:<17} candidate {s.candidate:>6} ({rate(s.candidate_rate)})  baseline {s.baseline:>6} "
            f"({rate(s.baseline_rate)})  ratio {ratio:>7}  p {s.p_value:.3g}  {s.verdict}{_allowed(s.signal)}"
        )
    return 0


def _actor(args: argparse.Namespace) -> str:
    from app.accounts import RESERVED_ACTORS

    if args.actor and args.actor.strip().lower() in RESERVED_ACTORS:
        raise CliError(f"--actor {args.actor!r} is a reserved system actor; name yourself instead")
    return (args.actor or "").strip() or getpass.getuser() or "cli"


def _alerts(settings):
    """The webhooks of ``[alerts]``, for the events a command causes (flushed, within a bound, at exit)."""
    from app.alerts import Webhooks

    a = settings.alerts
    return Webhooks(a.webhooks, timeout_s=a.timeout_s, attempts=a.attempts)


def _rollout_json(r, reading=None) -> dict:
    out = r.to_dict()
    if reading is not None:
        a = reading.analysis
        out["analysis"] = {
            "verdict": a.verdict, "candidate_requests": a.candidate_requests, "baseline_requests": a.baseline_requests,
            "candidate_units": a.candidate_units, "baseline_units": a.baseline_units,
            "step_candidate_units": reading.evidence.step_candidate,
            "step_baseline_units": reading.evidence.step_baseline, "alpha": a.alpha, "metrics": a.rows(),
        }  # fmt: skip
    return out


def cmd_rollout_start(args: argparse.Namespace) -> int:
    from app.rollout import ops
    from core.rollout import DEFAULT_STEPS, check_plan

    # Every value is checked before the configuration or the database is touched.
    plan = check_plan(
        candidate=args.candidate, route=args.route, steps=args.steps or DEFAULT_STEPS, bake_s=args.bake_s,
        min_samples=args.min_samples, alpha=args.alpha, dry_run=args.dry_run, shadow_share=args.shadow_share,
        shadow_budget_usd=args.shadow_budget_usd,
    )  # fmt: skip
    if not (args.reason or "").strip():
        raise CliError("--reason must not be empty")
    actor = _actor(args)
    settings = _settings()
    alerts = _alerts(settings)
    try:
        r = ops.start(_engine(settings), settings, plan, actor=actor, reason=args.reason, notify=alerts.send)
    finally:
        alerts.close()
    print(json.dumps(_rollout_json(r)) if args.json else ops.summary(r))
    return 0


def cmd_rollout_status(args: argparse.Namespace) -> int:
    import time

    from app.rollout import ops
    from db import rollouts

    settings = _settings()
    engine = _engine(settings)
    shown = rollouts.all_active(engine) or [r for r in [rollouts.latest(engine)] if r is not None]
    now = time.time()
    readings = [ops.read(engine, r, now) for r in shown]
    if args.json:
        print(json.dumps({"rollouts": [_rollout_json(x.rollout, x) for x in readings]}))
        return 0
    if not readings:
        print("no rollout yet (start one with `python -m app rollout start`)")
    for x in readings:
        r, a, e = x.rollout, x.analysis, x.evidence
        print(ops.summary(r))
        print(f"  last: {r.last_reason}")
        print(
            f"  step {now - r.step_started_at:.0f} s old: {e.step_candidate} candidate / {e.step_baseline} baseline "
            f"units; since start {a.candidate_units} / {a.baseline_units} units, {a.candidate_requests} / "
            f"{a.baseline_requests} requests; verdict {a.verdict}"
        )
        for s in a.signals:
            rate = lambda v: "-" if v is None else f"{v:.2%}"  # noqa: E731
            print(
                f"  {s.signal:<17} candidate {s.candidate:>6} ({rate(s.candidate_rate)})  baseline {s.baseline:>6} "
                f"({rate(s.baseline_rate)})  p {s.p_value:.3g}  {s.verdict}{_allowed(s.signal)}"
            )
    return 0


def cmd_rollout_act(args: argparse.Namespace) -> int:
    from app.rollout import ops

    if not (args.reason or "").strip():
        raise CliError("--reason must not be empty")
    actor = _actor(args)
    settings = _settings()
    engine = _engine(settings)
    r = ops.find(engine, settings, args.route)
    alerts = _alerts(settings)
    try:
        new, _ = ops.command(engine, r, args.verb, actor=actor, reason=args.reason,
                                  full=getattr(args, "full", False), notify=alerts.send)  # fmt: skip
    finally:
        alerts.close()
    if args.json:
        print(json.dumps(_rollout_json(new)))
    else:
        print(new.last_reason)
        print(ops.summary(new))
    return 0


def cmd_loadgen(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from app.gateway import build_gateway
    from app.loadgen import run_loadgen

    rps = parse_float(args.rps, field="--rps", lo=0, lo_open=True, hi=MAX_RPS)
    duration = parse_float(args.duration, field="--duration", lo=0, lo_open=True, hi=MAX_DURATION_S)
    seed = None if args.seed is None else parse_int(args.seed, field="--seed", lo=0, hi=MAX_SEED)
    sig = _signals(args)
    sig.interrupt = False  # a signal ends the schedule (sig.stop); the report still goes out
    gateway = build_gateway(_settings(), source="loadgen")
    try:
        with tqdm(total=max(1, round(rps * duration)), unit="req", file=sys.stderr, disable=args.quiet) as bar:
            report = run_loadgen(
                gateway.client,
                rps=rps,
                duration_s=duration,
                seed=seed,
                progress=lambda done, planned: bar.update(1),
                stop=sig.stop,
                drain_s=DRAIN_S,
            )
    finally:
        with sig.shutting_down():
            close_within(gateway)  # every request the report counts is in the log after this
    report.interrupted = sig.name
    print(json.dumps(report.to_dict()), flush=True)
    return sig.exit_code or 0


def cmd_prune(args: argparse.Namespace) -> int:
    import time

    from db.requests import prune

    days = parse_float(args.days, field="--days", lo=0, lo_open=True, hi=MAX_DAYS)
    keep = [days]
    for flag, raw in (
        ("--rollup-days", args.rollup_days),
        ("--rollup-5m-days", args.rollup_5m_days),
        ("--rollup-1h-days", args.rollup_1h_days),
    ):
        value = parse_float(raw, field=flag, lo=0, lo_open=True, hi=MAX_DAYS)
        if value < keep[-1]:
            finer = "--days" if len(keep) == 1 else ("--rollup-days", "--rollup-5m-days")[len(keep) - 2]
            raise CliError(f"{flag} must be at least {finer} (coarser rollups summarise the finer ones)")
        keep.append(value)
    now = time.time()
    # Every statement prune runs is short (a partition drop, or one delete batch well under a
    # second), so the engine's statement timeout stays as configured.
    deleted = prune(
        _engine(_settings()),
        raw_before=now - keep[0] * 86400,
        minute_rollups_before=now - keep[1] * 86400,
        rollups_5m_before=now - keep[2] * 86400,
        rollups_1h_before=now - keep[3] * 86400,
    )
    print(json.dumps(deleted))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from app.gateway import build_gateway
    from app.status import gateway_status, journal_on_disk, status_lines

    settings = _settings()
    on_disk = journal_on_disk(settings)
    gateway = build_gateway(settings, source="cli", guardrail=False)
    try:
        status = gateway_status(gateway, on_disk)
    finally:
        gateway.close()
    print(json.dumps(status) if args.json else "\n".join(status_lines(status)))
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from app.gateway import build_gateway
    from app.simulator import serve

    # The gateway keeps the simulators' fault settings current from the database; no guardrail here
    # (the routers that send the traffic run it).
    port = parse_int(args.port, field="--port", lo=0, hi=65535)
    gateway = build_gateway(_settings(), source="simulate", guardrail=False)
    providers = {u.provider.name: u.provider for u in gateway.upstreams.values()}
    if not providers:
        gateway.close()
        raise CliError("no sim:// providers in the configuration")
    first = next(iter(providers))
    print(
        f"simulator on http://{args.host}:{port}/v1 ({first}); "
        + ", ".join(f"http://{args.host}:{port}/{n}/v1" for n in providers),
        file=sys.stderr,
    )
    sig = _signals(args)
    try:
        serve(providers, host=args.host, port=port)  # returns on SIGINT/SIGTERM (KeyboardInterrupt)
    finally:
        with sig.shutting_down():
            close_within(gateway)
    return sig.exit_code or 0


def _accounts():
    from app.accounts import Accounts

    return Accounts(_engine(_settings()))


def _read_password(from_stdin: bool) -> str:
    """The new password: one line from stdin (``--password-stdin``), else typed twice at the
    terminal without echo. Never from argv, where ``ps`` and shell history would show it."""
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("Password: ")
    if getpass.getpass("Repeat the password: ") != first:
        raise CliError("the two passwords differ; nothing was written")
    return first


def cmd_users_add(args: argparse.Namespace) -> int:
    from app.accounts import check_role, normalize_name

    normalize_name(args.name)  # refuse a bad name or role before asking for a password
    check_role(args.role)
    user = _accounts().add(args.name, args.role, _read_password(args.password_stdin), actor="cli")
    print(f"account {user.name} added with role {user.role}")
    return 0


def cmd_users_list(args: argparse.Namespace) -> int:
    users = _accounts().list()
    if args.json:
        print(json.dumps([{"name": u.name, "role": u.role, "created_at": u.created_at} for u in users]))
    elif not users:
        print("no accounts: the dashboard is open (or uses DASHBOARD_PASSWORD); add one with `users add`")
    for u in [] if args.json else users:
        print(f"{u.name:<32} {u.role:<9} created {_ts(u.created_at)} by {u.created_by}")
    return 0


def cmd_users_remove(args: argparse.Namespace) -> int:
    _accounts().remove(args.name)
    print(f"account {args.name} removed")
    return 0


def cmd_users_set_role(args: argparse.Namespace) -> int:
    user = _accounts().set_role(args.name, args.role)
    print(f"account {user.name} now has role {user.role}")
    return 0


# Security defaults that hold from any working directory (Streamlit reads .streamlit/config.toml
# only from the current one); an option the operator passes wins.
DASHBOARD_DEFAULTS = {
    "--server.address": "127.0.0.1",
    "--client.showErrorDetails": "none",
    "--browser.gatherUsageStats": "false",
}


def dashboard_argv(streamlit_args: list[str]) -> list[str]:
    """The command ``python -m app dashboard`` replaces itself with: ``streamlit run`` on the
    dashboard's ASGI app (``ui/asgi.py``: Streamlit's ``st.App`` over the entry script
    ``ui/entry.py``, plus the session-cookie route; resolved from this package so any working
    directory finds it), with the local-only defaults unless the caller set those options."""
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "ui"
    given = {a.split("=", 1)[0] for a in streamlit_args if a.startswith("--")}
    defaults = [f"{k}={v}" for k, v in DASHBOARD_DEFAULTS.items() if k not in given]
    # ui/run.py is `streamlit run` with handlers that make SIGTERM/SIGINT a clean exit 0.
    return [sys.executable, str(folder / "run.py"), "run", str(folder / "asgi.py"), *defaults, *streamlit_args]


def cmd_dashboard(args: argparse.Namespace) -> int:
    import os

    from app.config import check_database_url

    # A DATABASE_URL that cannot even be parsed is refused here, as one line, rather than by every
    # page of a server that started anyway (the pages still say so for one set in secrets.toml).
    if url := os.environ.get("DATABASE_URL"):
        check_database_url(url)
    argv = dashboard_argv(args.streamlit_args)
    sys.stdout.flush()
    os.execv(argv[0], argv)  # the server becomes this process: same pid, signals reach it directly
    return 0  # not reached


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app", description="LLM gateway operator tools")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    chat = sub.add_parser("chat", help="send one prompt through the routing client")
    chat.add_argument("prompt")
    chat.add_argument("--model", default="auto", help="auto (intent routing) or a catalog model")
    chat.add_argument("--session", default=None, help="session id (sticky routing, cache hints)")
    chat.add_argument("--stream", action="store_true")
    chat.add_argument("--json", action="store_true", help="print the result record as JSON")
    chat.set_defaults(func=cmd_chat)

    canary = sub.add_parser("canary", help="show or set the canary ratio")
    csub = canary.add_subparsers(dest="canary_command", required=True)
    show = csub.add_parser("show")
    show.add_argument("--json", action="store_true")
    show.add_argument("--route", default=None, help="a route's canary (a [routes] name with a canary deployment)")
    show.set_defaults(func=cmd_canary_show)
    cset = csub.add_parser("set")
    cset.add_argument("ratio", help="share of traffic for the primary, 0 to 1 (e.g. 0.25)")
    cset.add_argument("--reason", default=None, help="why (required unless --dry-run)")
    cset.add_argument("--actor", default=None)
    cset.add_argument(
        "--route", default=None, help="set a route's canary share instead (a [routes] name with a canary deployment)"
    )
    cset.add_argument(
        "--dry-run",
        action="store_true",
        help="show what the new ratio would do, from the last hour of traffic; write nothing",
    )
    cset.set_defaults(func=cmd_canary_set)
    analyze = csub.add_parser("analyze", help="the canary against its baseline: every signal, both arms, verdicts")
    analyze.add_argument("--route", default=None, help="a route's canary (default: the global canary)")
    analyze.add_argument("--minutes", default="60", help="the window, 1 to 10080 minutes (default 60)")
    analyze.add_argument("--alpha", default="0.05", help="false-alarm level over all signals (default 0.05)")
    analyze.add_argument("--json", action="store_true")
    analyze.set_defaults(func=cmd_canary_analyze)

    ro = sub.add_parser("rollout", help="progressive delivery: start, status, promote, pause, resume, abort")
    rsub = ro.add_subparsers(dest="rollout_command", required=True)
    rstart = rsub.add_parser("start", help="start a rollout of a candidate provider")
    rstart.add_argument("--candidate", required=True, help="routing.primary, or the --route's canary provider")
    rstart.add_argument("--route", default=None, help="a route's canary (default: the global canary)")
    rstart.add_argument("--steps", default=None, help="weights in percent, increasing (default 1,5,10,25,50,100)")
    rstart.add_argument("--bake-s", default="600", help="seconds each step bakes at least (default 600)")
    rstart.add_argument("--min-samples", default="50", help="requests per arm a step needs (default 50)")
    rstart.add_argument("--alpha", default="0.05", help="false-abort level over all metrics (default 0.05)")
    rstart.add_argument(
        "--shadow-share", default=None,
        help="first mirror this share (0 to 1) of the baseline's requests to the candidate, answers discarded, "
        "judged like a step (needs --shadow-budget-usd)",
    )  # fmt: skip
    rstart.add_argument("--shadow-budget-usd", default=None, help="what the shadow phase's copies may cost in all")
    rstart.add_argument("--dry-run", action="store_true", help="analyse and record, never move the weight")
    rstart.add_argument("--reason", default=None, help="why (required)")
    rstart.add_argument("--actor", default=None)
    rstart.add_argument("--json", action="store_true")
    rstart.set_defaults(func=cmd_rollout_start)
    rstatus = rsub.add_parser("status", help="every active rollout (else the last): step, weight, every metric")
    rstatus.add_argument("--json", action="store_true")
    rstatus.set_defaults(func=cmd_rollout_status)
    for verb, what in (
        ("promote", "go to the next step now (--full: to 100 %)"),
        ("pause", "stop stepping; the weight stays"),
        ("resume", "step again; the step's bake time starts over"),
        ("abort", "end it; the weight goes to 0"),
    ):
        rv = rsub.add_parser(verb, help=what)
        if verb == "promote":
            rv.add_argument("--full", action="store_true", help="straight to 100 %")
        rv.add_argument("--reason", default=None, help="why (required)")
        rv.add_argument("--actor", default=None)
        rv.add_argument("--route", default=None, help="the route's rollout (needed when several are active)")
        rv.add_argument("--json", action="store_true")
        rv.set_defaults(func=cmd_rollout_act, verb=verb)

    lg = sub.add_parser("loadgen", help="generate traffic through the routing client")
    # Numbers stay text here and are parsed with their bounds by the command (one clear line).
    lg.add_argument("--rps", default="5", help=f"requests per second, above 0 and at most {MAX_RPS:g}")
    lg.add_argument("--duration", default="60", help=f"seconds, above 0 and at most {MAX_DURATION_S:g}")
    lg.add_argument("--seed", default=None)
    lg.add_argument("--quiet", action="store_true", help="no progress bar")
    lg.set_defaults(func=cmd_loadgen)

    pr = sub.add_parser(
        "prune", help="delete old request-log rows and rollups (PostgreSQL: drops whole day partitions)"
    )
    pr.add_argument("--days", default="30", help="keep this many days of raw rows (default 30)")
    pr.add_argument("--rollup-days", default="90", help="keep this many days of per-minute rollups (default 90)")
    pr.add_argument("--rollup-5m-days", default="400", help="keep this many days of 5-minute rollups (default 400)")
    pr.add_argument("--rollup-1h-days", default="1830", help="keep this many days of hourly rollups (default 1830)")
    pr.set_defaults(func=cmd_prune)

    st = sub.add_parser("status", help="canary ratio and its age, providers and breakers, log queue and journal")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)

    sim = sub.add_parser("simulate", help="serve the simulated providers over HTTP")
    sim.add_argument("--port", default="8001")
    sim.add_argument("--host", default="127.0.0.1")
    sim.set_defaults(func=cmd_simulate)

    users = sub.add_parser("users", help="dashboard accounts: add, list, remove, set-role")
    usub = users.add_subparsers(dest="users_command", required=True)
    uadd = usub.add_parser("add", help="add an account (the password is asked for, or read from stdin)")
    uadd.add_argument("name")
    uadd.add_argument("--role", required=True, choices=["viewer", "operator", "admin"])
    uadd.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    uadd.set_defaults(func=cmd_users_add)
    ulist = usub.add_parser("list")
    ulist.add_argument("--json", action="store_true")
    ulist.set_defaults(func=cmd_users_list)
    urm = usub.add_parser("remove")
    urm.add_argument("name")
    urm.set_defaults(func=cmd_users_remove)
    urole = usub.add_parser("set-role")
    urole.add_argument("name")
    urole.add_argument("role", choices=["viewer", "operator", "admin"])
    urole.set_defaults(func=cmd_users_set_role)

    # Every argument after "dashboard" goes to `streamlit run` as is ("+" prefix: none is ours).
    dash = sub.add_parser(
        "dashboard",
        help="start the dashboard (streamlit run; Streamlit options pass through)",
        prefix_chars="+",
        add_help=False,
    )
    dash.add_argument("streamlit_args", nargs=argparse.REMAINDER, help="e.g. --server.port 8600")
    dash.set_defaults(func=cmd_dashboard)

    from app.server.cli import add_commands

    add_commands(sub)  # serve, keys
    return parser


def one_line(exc: BaseException) -> str:
    """A single line for the operator. Database driver errors carry the SQL and its parameters on
    later lines; only the driver's own first line is useful (e.g. "connection refused")."""
    from sqlalchemy.exc import DBAPIError, SQLAlchemyError

    if isinstance(exc, DBAPIError) and exc.orig is not None:
        first = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
        return f"database error: {first}"
    if isinstance(exc, SQLAlchemyError):
        return f"database error: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}"
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def exit_code(exc: GatewayError) -> int:
    """2 for what the operator can fix in the command or the config, 1 when the gateway failed."""
    from app.config import ConfigError  # imported here: --help and a bad command line need no settings

    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, (InvalidRequest, ConflictError, ConfigError)):
        return EXIT_USAGE
    return EXIT_FAILED


def configure_logging(env: Mapping[str, str] | None = None) -> None:
    """Once per process, at the entry point: level from ``LOG_LEVEL`` (default WARNING), to stderr."""
    env = os.environ if env is None else env
    name = (env.get("LOG_LEVEL") or "WARNING").upper()
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise CliError(f"LOG_LEVEL={name!r} is not a logging level; use DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configure_logging()
        with stop_on_signals(interrupt=True) as signals:
            args.signals = signals  # commands adjust it (loadgen) and use it to shut down
            return int(args.func(args) or 0)
    except Interrupted as exc:
        print(f"interrupted by {exc.name}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except GatewayError as exc:
        if args.debug:
            raise
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return exit_code(exc)
    except ValueError as exc:  # a library's refusal of a value (e.g. pydantic); the operator's to fix
        if args.debug:
            raise
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        if args.debug:
            raise
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    code = main()
    if abandoned():  # a writer thread is stuck on the database: the exit hooks would wait for it
        exit_now(code)
    sys.exit(code)
