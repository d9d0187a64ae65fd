"""Storage formats: how many bytes a vector of values takes in each KV-cache and weight dtype.

All byte counts here are exact integers. Two rules keep them exact and explicit:

* Packing is per vector. A vector is one head's K (or V) for one token, or one MLA latent for one
  token; sub-byte formats (int4) round each vector up to whole bytes, so an odd value count costs
  one extra half byte per vector, never a fractional byte.
* Scale overhead is modelled where real engines store it per vector. fp8 KV uses per-layer
  (per-tensor) scales in vLLM and SGLang: a handful of scalars per layer, independent of the token
  count, so we count zero per-token overhead. int8 / int4 KV follow LMDeploy's online KV
  quantization (asymmetric, per head, per token): one fp16 scale plus one fp16 zero point per
  vector, i.e. 4 bytes per vector.

Weights: bf16 / fp16 2 bytes per parameter, fp8 and int8 1 byte (per-channel or per-block scales are
well under 0.1 % and are ignored), int4 half a byte plus one fp16 scale per group of 128 weights
(GPTQ / AWQ style, the group size both use by default).
"""

from __future__ import annotations

from dataclasses import dataclass

# Where the int8/int4 KV overhead convention comes from, shown on the page.
KV_QUANT_SOURCE = "https://lmdeploy.readthedocs.io/en/latest/quantization/kv_quant.html"


@dataclass(frozen=True)
class KvDtype:
    """A KV-cache storage format."""

    name: str
    bits: int
    overhead_bytes_per_vector: int  # fp16 scale + zero point for int8/int4, else 0
    note: str

    def vector_bytes(self, values: int) -> int:
        """Exact bytes for one vector of `values` elements, including its scale overhead."""
        return -(-values * self.bits // 8) + self.overhead_bytes_per_vector

    def describe_vector(self, values: int) -> str:
        """The arithmetic of `vector_bytes` written out, for the page's working."""
        if self.bits % 8 == 0:
            base = f"{values} x {self.bits // 8} B"
        else:
            base = f"ceil({values} x {self.bits}/8) B"
        if self.overhead_bytes_per_vector:
            base += f" + {self.overhead_bytes_per_vector} B scale/zero"
        return base


KV_DTYPES: dict[str, KvDtype] = {
    d.name: d
    for d in (
        KvDtype("fp32", 32, 0, "4 bytes per value"),
        KvDtype("fp16", 16, 0, "2 bytes per value"),
        KvDtype("bf16", 16, 0, "2 bytes per value"),
        KvDtype("fp8", 8, 0, "1 byte per value (e4m3); per-layer scales, no per-token overhead"),
        KvDtype("fp8_e4m3", 8, 0, "1 byte per value; per-layer scales, no per-token overhead"),
        KvDtype("fp8_e5m2", 8, 0, "1 byte per value; no scales needed"),
        KvDtype("int8", 8, 4, "1 byte per value + fp16 scale and zero point per head vector"),
        KvDtype("int4", 4, 4, "half a byte per value + fp16 scale and zero point per head vector"),
    )
}

# The states of Mamba / linear-attention layers are kept in the model's activation dtype by the
# serving engines (vLLM's mamba_cache_dtype "auto"); they are not quantized with the KV cache.
DEFAULT_STATE_DTYPE = "bf16"


@dataclass(frozen=True)
class WeightDtype:
    """A weight storage format: bits per parameter plus scale bytes per group of parameters."""

    name: str
    bits: int
    group_size: int  # parameters sharing one scale; 0 = scales ignored (negligible)
    scale_bytes: int
    note: str

    def weight_bytes(self, params: int) -> int:
        """Exact bytes to hold `params` parameters, rounding packed bits and groups up."""
        packed = -(-params * self.bits // 8)
        if self.group_size:
            packed += -(-params // self.group_size) * self.scale_bytes
        return packed

    def describe(self, params: int) -> str:
        text = f"{params:,} params x {self.bits}/8 B"
        if self.group_size:
            text += f" + ceil({params:,}/{self.group_size}) x {self.scale_bytes} B scales"
        return text


WEIGHT_DTYPES: dict[str, WeightDtype] = {
    d.name: d
    for d in (
        WeightDtype("bf16", 16, 0, 0, "2 bytes per parameter"),
        WeightDtype("fp16", 16, 0, 0, "2 bytes per parameter"),
        WeightDtype("fp8", 8, 0, 0, "1 byte per parameter; per-block scales ignored (<0.01 %)"),
        WeightDtype("int8", 8, 0, 0, "1 byte per parameter; per-channel scales ignored"),
        WeightDtype("int4", 4, 128, 2, "half a byte per parameter + one fp16 scale per 128"),
    )
}


def kv_dtype(name: str) -> KvDtype:
    """Look a KV dtype up by name, with an error listing the supported ones."""
    try:
        return KV_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown kv_dtype {name!r}; supported: {', '.join(KV_DTYPES)}") from None


def weight_dtype(name: str) -> WeightDtype:
    """Look a weight dtype up by name, with an error listing the supported ones."""
    try:
        return WEIGHT_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown weight dtype {name!r}; supported: {', '.join(WEIGHT_DTYPES)}") from None
