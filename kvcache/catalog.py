"""The shipped catalogs: models (published config.json values + sources) and GPU presets.

Both live in kvcache/data/*.json, are validated on first use (plain dataclasses: the engine needs
nothing beyond the standard library) and cached for the process. A catalog model's ModelSpec carries
the published parameter counts instead of the estimate from its config.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from kvcache.spec import ModelSpec

DATA_DIR = Path(__file__).resolve().parent / "data"
GIB = 1 << 30
_ID = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")
_URL = re.compile(r"^https?://[^\s/]+\.[^\s/]+(/\S*)?$")


def _str(entry: dict[str, Any], key: str, where: str, *, default: str | None = None) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key} must be a string")
    return value


def _positive(entry: dict[str, Any], key: str, where: str, *, optional: bool = False) -> int | None:
    value = entry.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{where}: {key} must be a positive integer")
    return value


def _url(entry: dict[str, Any], key: str, where: str) -> str:
    value = _str(entry, key, where)
    if not _URL.match(value):
        raise ValueError(f"{where}: {key} must be an http(s) URL, not {value!r}")
    return value


def _known_keys(entry: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")


@dataclass(frozen=True)
class CatalogModel:
    id: str
    name: str
    hf_repo: str
    source: str
    params_total: int
    params_source: str
    config: dict = field(hash=False)
    params_active: int | None = None
    # how the config was obtained when it is not a verbatim copy of `source` (reconstructed fields)
    source_note: str = ""

    @classmethod
    def parse(cls, entry: Any) -> CatalogModel:
        if not isinstance(entry, dict):
            raise ValueError("a catalog model must be an object")
        where = f"model {entry.get('id')!r}"
        _known_keys(entry, {f.name for f in dataclasses.fields(cls)}, where)
        model_id = _str(entry, "id", where)
        if not _ID.match(model_id):
            raise ValueError(f"{where}: id must match {_ID.pattern}")
        config = entry.get("config")
        if not isinstance(config, dict):
            raise ValueError(f"{where}: config must be an object")
        total = _positive(entry, "params_total", where)
        active = _positive(entry, "params_active", where, optional=True)
        assert total is not None
        if active is not None and active > total:
            raise ValueError(f"{model_id}: params_active exceeds params_total")
        return cls(
            id=model_id,
            name=_str(entry, "name", where),
            hf_repo=_str(entry, "hf_repo", where),
            source=_url(entry, "source", where),
            params_total=total,
            params_active=active,
            params_source=_str(entry, "params_source", where),
            config=config,
            source_note=_str(entry, "source_note", where, default=""),
        )


@dataclass(frozen=True)
class Gpu:
    id: str
    name: str
    memory_gib: int
    source: str

    @property
    def memory_bytes(self) -> int:
        return self.memory_gib * GIB

    @classmethod
    def parse(cls, entry: Any) -> Gpu:
        if not isinstance(entry, dict):
            raise ValueError("a GPU preset must be an object")
        where = f"GPU {entry.get('id')!r}"
        _known_keys(entry, {f.name for f in dataclasses.fields(cls)}, where)
        memory = _positive(entry, "memory_gib", where)
        assert memory is not None
        return cls(
            id=_str(entry, "id", where),
            name=_str(entry, "name", where),
            memory_gib=memory,
            source=_url(entry, "source", where),
        )


def _entries(raw: Any, key: str) -> list:
    if not isinstance(raw, dict) or not isinstance(raw.get(key), list):
        raise ValueError(f"the catalog file needs a list {key!r}")
    return raw[key]


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
    return _unique([CatalogModel.parse(e) for e in _entries(raw, "models")], "model")


@lru_cache(maxsize=1)
def gpus() -> dict[str, Gpu]:
    raw = json.loads((DATA_DIR / "gpus.json").read_text(encoding="utf-8"))
    return _unique([Gpu.parse(e) for e in _entries(raw, "gpus")], "GPU")


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
