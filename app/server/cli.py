"""The ``serve`` and ``keys`` subcommands of ``python -m app`` (registered by :func:`add_commands`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime

from app.server.defaults import DEFAULT_GRACEFUL_S, DEFAULT_HOST, DEFAULT_PORT, MAX_GRACEFUL_S, MAX_WORKERS


def _engine():
    from app.config import load_settings
    from db.engine import DbTimeouts, get_engine

    settings = load_settings()
    return get_engine(settings.database_url, timeouts=DbTimeouts(**settings.database.model_dump()))


def cmd_serve(args: argparse.Namespace) -> int:
    # numpy (loaded later, by the rollout statistics) would start a BLAS thread per core that spins
    # after each call, on the cores the event loop needs; the server's arrays are small.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from app.config import load_settings
    from app.server.serve import serve
    from app.telemetry.location import check_writable, journal_dir_for
    from core.bounds import parse_int

    # The command line first (a typo there is named before anything is read), then what the
    # workers would refuse (configuration, DATABASE_URL, an unwritable journal), as one line
    # before the server says it is listening.
    graceful_s = parse_int(args.graceful_s, field="--graceful-s", lo=0, hi=MAX_GRACEFUL_S)
    raw = str(args.workers).strip().lower()
    workers = (os.cpu_count() or 1) if raw == "auto" else parse_int(raw, field="--workers", lo=1, hi=MAX_WORKERS)
    settings = load_settings()
    check_writable(journal_dir_for(settings.database_url, settings.telemetry.journal_dir))
    return serve(args.host, args.port, graceful_s=graceful_s, workers=workers)


def cmd_keys_create(args: argparse.Namespace) -> int:
    from app import keys

    record, key = keys.create(
        _engine(),
        args.name,
        models=args.models,
        rpm=args.rpm,
        tpm=args.tpm,
        budget_usd=args.budget_usd,
        period=args.period,
        created_by=args.created_by,
    )
    if args.json:
        print(json.dumps({"name": record.name, "key": key}))
    else:
        print(key)
        print(
            f"created gateway key {record.name!r}; it is shown only this once: store it now. "
            f"Use it as 'Authorization: Bearer {record.prefix}...'",
            file=sys.stderr,
        )
    if record.budget_usd:
        from app.config import load_settings

        allowed = list(record.models) or keys.servable_models(load_settings())
        if warning := keys.budget_warning(record.budget_usd, record.period, allowed):
            print(f"warning: {warning}", file=sys.stderr)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    from app import keys

    rows = keys.rows(_engine())
    if args.json:
        print(json.dumps([r.to_dict() for r in rows]))
        return 0
    if not rows:
        print("no gateway keys yet. Create one: python -m app keys create --name NAME", file=sys.stderr)
        return 0
    print(
        f"{'name':<20} {'prefix':<12} {'state':<8} {'models':<24} {'rpm':>6} {'tpm':>9} {'budget':<16} "
        f"{'requests/mo':>11} {'cost/mo':>10}"
    )
    for r in rows:
        print(
            f"{r.name:<20} {r.prefix:<12} {'active' if r.active else 'revoked':<8} {r.models[:24]:<24} "
            f"{r.rpm or '-':>6} {r.tpm or '-':>9} {r.budget:<16} {r.requests_month:>11} ${r.cost_month_usd:>9.4f}"
        )
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from app import keys
    from core.errors import InvalidRequest
    from db.keys import UnknownKeyError

    try:
        record = keys.revoke(_engine(), args.name)
    except UnknownKeyError as exc:
        raise InvalidRequest(str(exc)) from None  # exit 2: the operator's to fix
    when = datetime.fromtimestamp(record.revoked_at or 0, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    print(f"revoked gateway key {record.name!r} at {when} (running servers stop accepting it within seconds)")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    sv = sub.add_parser("serve", help="the OpenAI-compatible gateway server")
    sv.add_argument("--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST} (local only)")
    sv.add_argument("--port", type=int, default=DEFAULT_PORT)
    sv.add_argument(
        "--graceful-s",
        default=str(DEFAULT_GRACEFUL_S),
        dest="graceful_s",
        help=f"on SIGTERM/Ctrl-C, requests in flight get this long to finish, then are cut ({DEFAULT_GRACEFUL_S})",
    )
    sv.add_argument(
        "--workers",
        default="1",
        help=f"server processes sharing the port, each with its own upstream pool and log writer (1-{MAX_WORKERS}, "
        "or auto: one per core)",
    )
    sv.set_defaults(func=cmd_serve)

    keys = sub.add_parser("keys", help="create, list or revoke gateway keys")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    kc = ksub.add_parser("create", help="create a key (printed once)")
    kc.add_argument("--name", required=True)
    kc.add_argument("--models", default=None, help="comma-separated models the key may use (default: all)")
    kc.add_argument("--rpm", type=int, default=None, help="requests per minute")
    kc.add_argument("--tpm", type=int, default=None, help="tokens per minute")
    kc.add_argument("--budget-usd", type=float, default=None, dest="budget_usd")
    kc.add_argument("--period", choices=["day", "month"], default=None)
    kc.add_argument("--created-by", default="cli", dest="created_by")
    kc.add_argument("--json", action="store_true", help='print {"name": ..., "key": ...}')
    kc.set_defaults(func=cmd_keys_create)
    kl = ksub.add_parser("list")
    kl.add_argument("--json", action="store_true")
    kl.set_defaults(func=cmd_keys_list)
    kr = ksub.add_parser("revoke")
    kr.add_argument("name")
    kr.set_defaults(func=cmd_keys_revoke)
