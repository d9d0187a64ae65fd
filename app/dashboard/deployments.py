"""The routes table of the Overview: each ``[routes]`` entry's deployments as configured (strategy,
weight, limits, canary) beside what they served in the window, from the rollups (a deployment is
a route's provider and the model sent to it, which the rollups key by)."""

from __future__ import annotations

from collections.abc import Mapping

from app.config import Settings, deployment_model
from core.histogram import percentile
from db.monitor import ProviderSums


def deployment_rows(
    settings: Settings, sums: Mapping[tuple[str, str, str], ProviderSums], route_ratios: Mapping[str, float]
) -> list[dict]:
    """One row per deployment of every route, in configuration order (the canary last)."""
    rows: list[dict] = []
    for name, r in settings.routes.items():
        deps = [(d, False) for d in r.deployments] + ([(r.canary, True)] if r.canary is not None else [])
        total = sum(d.weight for d, canary in deps if not canary)
        for d, canary in deps:
            model = deployment_model(name, d)
            got = sums.get((name, d.provider, model))
            if canary:
                share = f"canary, {route_ratios.get(name, 0.0):.0%}"
            elif r.strategy == "weighted":
                share = f"weight {d.weight:g} of {total:g}"
            elif r.strategy == "ordered":
                share = f"priority {r.deployments.index(d) + 1}"
            else:
                share = r.strategy
            limits = ", ".join(x for x in (f"rpm {d.rpm:,}" if d.rpm else "", f"tpm {d.tpm:,}" if d.tpm else "") if x)
            p50 = percentile(got.lat, 0.5) if got is not None and got.lat else None
            rows.append(
                {
                    "route": name,
                    "strategy": r.strategy,
                    "deployment": f"{d.provider}/{model}",
                    "share": share,
                    "limits": limits,
                    "attempts": got.attempts if got is not None else 0,
                    "error rate": (got.errors / got.attempts) if got is not None and got.attempts else None,
                    "p50 ms": round(p50) if p50 is not None else None,
                }
            )
    return rows
