"""Per-model latency profiles of the simulator, read from ``app/data/sim_profiles.toml``.

Profiles are data, not code: the file is loaded and validated once per process. Unknown models
use the ``default`` entry (see ``profile_for``).
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["DEFAULT_PROFILES_PATH", "LatencyProfile", "load_profiles", "profile_for"]

DEFAULT_PROFILES_PATH = Path(__file__).resolve().parent.parent / "data" / "sim_profiles.toml"


class LatencyProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    ttft_ms: float = Field(ge=0.0)
    tokens_per_s: float = Field(gt=0.0)
    jitter: float = Field(ge=0.0, lt=1.0)


class _ProfilesFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: dict[str, LatencyProfile]


@functools.cache
def _load(path: Path) -> Mapping[str, LatencyProfile]:
    try:
        with path.open("rb") as handle:
            parsed = _ProfilesFile.model_validate(tomllib.load(handle))
    except (OSError, tomllib.TOMLDecodeError, ValidationError) as exc:
        raise ValueError(f"invalid simulator latency profiles in {path}: {exc}") from exc
    if "default" not in parsed.models:
        raise ValueError(f"invalid simulator latency profiles in {path}: no [models.default] entry")
    return parsed.models


def load_profiles(path: Path | None = None) -> dict[str, LatencyProfile]:
    """Profiles keyed by model name, always with a ``"default"`` entry."""
    # A fresh dict each call: the cached mapping must not be mutated by callers.
    return dict(_load((path or DEFAULT_PROFILES_PATH).resolve()))


def profile_for(profiles: Mapping[str, LatencyProfile], model: str) -> LatencyProfile:
    return profiles.get(model) or profiles["default"]
