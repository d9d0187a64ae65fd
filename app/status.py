"""``python -m app status``: what an operator checks first during an incident, as one record.

The canary ratio this process loaded and its age (the request path serves the last known value;
a large age or a refresh error means the database is not answering), the providers with their
circuit-breaker state when the client keeps breakers, the route deployments cooling down in any
live gateway process, and the request log: this process's writer
counters plus what the journals of the same database hold on disk (records other processes, or
killed ones, have not replayed yet, and dead letters), as found before this command's own
gateway started (which, like every gateway process, then replays what dead processes left).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from app.telemetry.location import SlotInfo, journal_dir_for, journal_overview


def journal_on_disk(settings: Any) -> list[SlotInfo]:
    """The journals of ``settings``' database as found on disk. Read it before building a gateway:
    the new gateway's writer adopts and replays what dead processes left."""
    return journal_overview(journal_dir_for(settings.database_url, settings.telemetry.journal_dir))


def gateway_status(gateway: Any, slots: list[SlotInfo] | None = None) -> dict[str, Any]:
    """A JSON-ready status record of a built :class:`app.gateway.Gateway`; ``slots`` is what
    :func:`journal_on_disk` found before it was built (default: read now)."""
    settings = gateway.settings
    client = gateway.client
    snapshot = gateway.snapshot()
    ratio = snapshot.get("canary_ratio")
    breakers_of = getattr(client, "breaker_states", None)
    breakers: dict[str, Any] = {}
    if callable(breakers_of):
        breakers = {name: _plain(state) for name, state in (breakers_of() or {}).items()}
    roles = {settings.routing.primary: "primary", settings.routing.fallback: "fallback"}
    recorded = recorded_breakers(getattr(gateway, "engine", None))
    providers = [
        {
            "name": name,
            "role": roles.get(name, "other"),
            "base_url": p.base_url,
            "breaker": breakers.get(name),
            # The breaker as the live gateway processes report it (this process's start closed).
            "breaker_recorded": recorded.get(name),
        }
        for name, p in settings.providers.items()
    ]
    directory = journal_dir_for(settings.database_url, settings.telemetry.journal_dir)
    slots = journal_overview(directory) if slots is None else slots
    return {
        "ratio": {
            "value": ratio.value if ratio else client.current_ratio(),
            "age_s": round(ratio.age_s if ratio else client.ratio_age_s(), 3),
            "error": ratio.last_error if ratio else None,
        },
        "refreshed": {n: {"age_s": round(s.age_s, 3), "error": s.last_error} for n, s in snapshot.items()},
        "providers": providers,
        "cooling": recorded_cooldowns(getattr(gateway, "engine", None)),
        "log": gateway.telemetry.stats().to_dict(),
        "journal": {
            "dir": str(directory) if directory else None,
            "records": sum(s.records for s in slots),
            "dead_letters": sum(s.dead_letters for s in slots),
            "slots": [asdict(s) for s in slots],
        },
    }


def _plain(state: Any) -> Any:
    """A breaker state as JSON: enums by value, objects by their fields, else as text."""
    if hasattr(state, "value") and not isinstance(state, (int, float, str)):
        return state.value
    if hasattr(state, "__dataclass_fields__"):
        return {k: _plain(v) for k, v in asdict(state).items()}
    return state if isinstance(state, (int, float, str, bool, type(None), dict, list)) else str(state)


def recorded_breakers(engine: Any, now: float | None = None) -> dict[str, dict[str, Any]]:
    """Each provider's breaker as the live gateway processes report it (:mod:`db.breakers`), as
    ``{provider: {"state", "ts", "processes"}}`` (the worst state a live process holds, since when,
    and how many hold it); empty when there is no engine or the database does not answer (status
    must still print what this process knows)."""
    if engine is None:
        return {}
    from db.breakers import live_breakers

    now = time.time() if now is None else now
    try:
        live = live_breakers(engine, now=now)
    except Exception:  # noqa: BLE001 - a stalled database is reported by the ratio's refresh error
        return {}
    return {
        name: {"state": b.state, "ts": b.since if b.since is not None else now, "processes": b.holding}
        for name, b in live.items()
    }


def recorded_cooldowns(engine: Any, now: float | None = None) -> list[dict[str, Any]]:
    """The route deployments cooling down in the live gateway processes (:mod:`db.breakers`), as
    ``[{"deployment", "left_s", "pid", "source"}]`` (one per process holding it); empty when there
    is no engine or the database does not answer."""
    if engine is None:
        return []
    from db.breakers import live_cooldowns

    now = time.time() if now is None else now
    try:
        live = live_cooldowns(engine, now=now)
    except Exception:  # noqa: BLE001 - a stalled database is reported by the ratio's refresh error
        return []
    return [
        {"deployment": d, "left_s": round(c.left_s(now), 1), "pid": c.pid, "source": c.source}
        for d, held in live.items()
        for c in held
    ]


def status_lines(status: dict[str, Any]) -> list[str]:
    """The status record as a few lines of text."""
    r = status["ratio"]
    ratio = f"canary ratio {r['value'] * 100:g} % (loaded {r['age_s']:.1f} s ago)"
    if r["error"]:
        ratio += f"; refresh failing: {r['error']}"
    providers = []
    for p in status["providers"]:
        breaker = p["breaker"]
        shown = breaker.get("state") if isinstance(breaker, dict) else breaker
        recorded = p.get("breaker_recorded")
        if recorded and recorded["state"] != "closed":
            when = time.strftime("%H:%M:%S", time.gmtime(recorded["ts"]))
            held = recorded.get("processes", 1)
            shown = (
                f"{recorded['state']} (held by {held} live gateway process{'es' if held != 1 else ''} since {when} UTC)"
            )
        providers.append(f"{p['name']} ({p['role']}{', breaker ' + str(shown) if shown is not None else ''})")
    log = status["log"]
    j = status["journal"]
    lines = [
        ratio,
        "providers: " + ", ".join(providers),
        (
            f"log (this process): queued {log['queued']}, written {log['written']}, spilled {log['spilled']}, "
            f"replayed {log['replayed']}, rejected {log['rejected']}, journal {log['journal_depth']}"
        ),
        (
            f"journal on disk: {j['records']} records waiting, {j['dead_letters']} dead letters "
            f"in {len(j['slots'])} slot(s) ({j['dir'] or 'no journal: in-memory database'})"
        ),
    ]
    cooling = status.get("cooling") or []
    if cooling:
        lines.insert(
            2,
            "route deployments cooling down: "
            + ", ".join(
                f"{c['deployment']} ({c['left_s']:.0f} s left in {c['source']} pid {c['pid']})" for c in cooling
            ),
        )
    if log["last_error"]:
        lines.append(f"last log error: {log['last_error']}")
    return lines
