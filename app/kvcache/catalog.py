"""The shipped catalogs: models (published config.json values + sources) and GPU presets.

Both live in app/data/kvcache/*.json, are validated with pydantic on first use and cached for the
process. A catalog model's ModelSpec carries the published parameter counts instead of the
estimate from its config.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache, lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, model_validator

from app.kvcache.spec import ModelSpec

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "kvcache"
GIB = 1 << 30


class CatalogModel(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    name: str
    hf_repo: str
    source: HttpUrl
    params_total: int = Field(gt=0)
    params_active: int | None = Field(default=None, gt=0)
    params_source: str
    config: dict
    # how the config was obtained when it is not a verbatim copy of `source` (reconstructed fields)
    source_note: str = ""

    @model_validator(mode="after")
    def _active_not_above_total(self) -> CatalogModel:
        if self.params_active is not None and self.params_active > self.params_total:
            raise ValueError(f"{self.id}: params_active exceeds params_total")
        return self


class Gpu(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    memory_gib: int = Field(gt=0)
    source: HttpUrl

    @property
    def memory_bytes(self) -> int:
        return self.memory_gib * GIB


class _ModelFile(BaseModel):
    models: list[CatalogModel]


class _GpuFile(BaseModel):
    gpus: list[Gpu]


def _unique(items: list, what: str) -> dict:
    out = {}
    for item in items:
        if item.id in out:
            raise ValueError(f"duplicate {what} id {item.id!r}")
        out[item.id] = item
    return out


@lru_cache(maxsize=1)
def models() -> dict[str, CatalogModel]:
    raw = json.loads((DATA_DIR / "models.json").read_text(encoding="utf-8"))
    return _unique(_ModelFile.model_validate(raw).models, "model")


@lru_cache(maxsize=1)
def gpus() -> dict[str, Gpu]:
    raw = json.loads((DATA_DIR / "gpus.json").read_text(encoding="utf-8"))
    return _unique(_GpuFile.model_validate(raw).gpus, "GPU")


@cache
def model_spec(model_id: str) -> ModelSpec:
    """The ModelSpec of a catalog model, with its published parameter counts."""
    try:
        entry = models()[model_id]
    except KeyError:
        raise ValueError(f"unknown model {model_id!r}; catalog: {', '.join(models())}") from None
    spec = ModelSpec.from_hf_config(entry.config, name=entry.name)
    return dataclasses.replace(
        spec,
        params_total=entry.params_total,
        params_active=entry.params_active or entry.params_total,
        params_note=f"published: {entry.params_source}",
    )


def gpu(gpu_id: str) -> Gpu:
    try:
        return gpus()[gpu_id]
    except KeyError:
        raise ValueError(f"unknown GPU {gpu_id!r}; presets: {', '.join(gpus())}") from None
