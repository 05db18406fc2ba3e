"""The quantised number formats of aclnnSwigluGroupQuant (docs/forward.md, "Number formats").

The destination types, by name: ``"float8_e4m3fn"``, ``"float8_e5m2"``, ``"float4_e2m1fn"``,
``"float4_e1m2"`` and ``"hifloat8"``, each with its aclDataType code, how NumPy stores it, its
largest finite value and the quant modes that produce it (`DST_TYPES`, looked up by
`as_dst_type`). FP8 values are ml_dtypes arrays; FP4 values are stored two to a byte (element 2i in
the low nibble, 2i+1 in the high one: `pack_fp4` / `unpack_fp4`); HiFloat8 is raw ``uint8``.
MX scales are FLOAT8_E8M0 bytes: `e8m0_scales` gives their values, `e8m0_view` the same bytes
as ``ml_dtypes.float8_e8m0fnu`` (a view: ml_dtypes' conversion to that type rounds, and maps 0
and negatives to NaN, so it is never used to make them).

NumPy and ml_dtypes only; ml_dtypes is imported on first use, not with the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Tuple, Union

import numpy as np
import numpy.typing as npt

__all__ = [
    "DST_TYPES",
    "DstType",
    "DstTypeLike",
    "as_dst_type",
    "e8m0_scales",
    "e8m0_view",
    "pack_fp4",
    "unpack_fp4",
]

_ml_dtypes: List[Any] = []


def _ml() -> Any:
    """ml_dtypes, imported the first time a format needs it."""
    if not _ml_dtypes:
        import ml_dtypes
        _ml_dtypes.append(ml_dtypes)
    return _ml_dtypes[0]


@dataclass(frozen=True)
class DstType:
    """One destination type of the quantisation.

    ``name``: the type's name (ml_dtypes' where it has one); ``acl_code``: its aclDataType value
    (what ``dstType`` and the y tensor carry); ``max``: its largest finite value; ``quant_modes``:
    the quant modes that produce it; ``bits``: bits per element (4 for FP4, which NumPy stores two
    to a byte).
    """

    name: str
    acl_code: int
    max: float
    quant_modes: Tuple[int, ...]
    bits: int

    @property
    def packed(self) -> bool:
        """True for the FP4 types: y is ``uint8`` with two elements a byte."""
        return self.bits == 4

    @property
    def storage_dtype(self) -> np.dtype:
        """How NumPy holds y: the ml_dtypes FP8 dtype, or ``uint8`` (FP4 packed, HiFloat8 raw)."""
        dtype: np.dtype = np.dtype(getattr(_ml(), self.name)) if self.bits == 8 and self.name != "hifloat8" \
            else np.dtype(np.uint8)
        return dtype

    def storage_shape(self, shape: Tuple[int, ...]) -> Tuple[int, ...]:
        """The NumPy shape that holds y of logical shape ``shape`` (FP4: the last dim halved)."""
        if not self.packed:
            return tuple(shape)
        if not shape or shape[-1] % 2:
            raise ValueError(f"{self.name} packs two elements a byte: the last dim must be even, got shape {shape}")
        return tuple(shape[:-1]) + (shape[-1] // 2,)

    def __str__(self) -> str:
        return self.name


#: The destination types by name.
DST_TYPES: Mapping[str, DstType] = {
    t.name: t for t in (
        DstType("float8_e4m3fn", 36, 448.0, (0, 1), 8),
        DstType("float8_e5m2", 35, 57344.0, (0, 1), 8),
        DstType("float4_e2m1fn", 40, 6.0, (1,), 4),
        DstType("float4_e1m2", 41, 1.75, (1,), 4),
        DstType("hifloat8", 34, 32768.0, (2, 3), 8),
    )
}

#: What `as_dst_type` accepts: a `DstType`, a name of `DST_TYPES`, or the ml_dtypes dtype (or scalar
#: type) of one (``ml_dtypes.float8_e4m3fn``, ``np.dtype(ml_dtypes.float4_e2m1fn)``, ...).
DstTypeLike = Union[DstType, str, np.dtype, type]

_NAMES = ", ".join(repr(name) for name in DST_TYPES)


def as_dst_type(dst_type: object) -> DstType:
    """The `DstType` that ``dst_type`` names. TypeError for a value of another kind (an int among
    them: aclDataType codes are not accepted in place of names); ValueError for an unknown name
    or a dtype that is no destination type."""
    value = dst_type
    if isinstance(value, DstType):
        return value
    if isinstance(value, str):
        found = DST_TYPES.get(value)
        if found is None:
            raise ValueError(f"dst_type {value!r} is not a destination type; use one of {_NAMES}")
        return found
    if isinstance(value, (bool, int, np.integer)):
        raise TypeError(f"dst_type must be a type name ({_NAMES}) or an ml_dtypes dtype, not the number {value!r} "
                        "(aclDataType codes are not accepted)")
    dtype: np.dtype
    if isinstance(value, np.dtype):
        dtype = value
    elif isinstance(value, type) and issubclass(value, np.generic):
        dtype = np.dtype(value)
    else:
        raise TypeError(f"dst_type must be a type name ({_NAMES}) or an ml_dtypes dtype, got {type(value).__name__}")
    found = DST_TYPES.get(dtype.name)
    # ml_dtypes is imported already when one of its dtypes exists; another dtype of the same name is not it.
    if found is None or found.name == "hifloat8" or found.name == "float4_e1m2" or \
            dtype != np.dtype(getattr(_ml(), found.name)):
        raise ValueError(f"dst_type {dtype} is not a destination type; use one of {_NAMES}")
    return found


# ----------------------------------------------------------------------------- FP4

_FP4_VALUES = {
    "float4_e2m1fn": np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]),
    "float4_e1m2": np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]),
}


def _fp4_type(dst_type: object) -> DstType:
    t = as_dst_type(dst_type)
    if not t.packed:
        raise ValueError(f"dst_type must be an FP4 type ('float4_e2m1fn' or 'float4_e1m2'), got {t.name!r}")
    return t


def _decode_table(t: DstType) -> np.ndarray:
    magnitudes = _FP4_VALUES[t.name].astype(np.float32)
    return np.concatenate([magnitudes, -magnitudes])   # code 8 + k: sign bit set (8 is -0.0)


def unpack_fp4(packed: npt.ArrayLike, dst_type: DstTypeLike) -> np.ndarray:
    """float32 values of FP4 codes stored two a byte: ``uint8`` [..., n] -> float32 [..., 2n],
    element 2i from the low nibble of byte i, 2i+1 from the high one (bit 3 of a code is the
    sign: code 8 is -0.0)."""
    t = _fp4_type(dst_type)
    data = np.asarray(packed)
    if data.dtype != np.uint8:
        raise TypeError(f"packed must hold uint8 bytes, got {data.dtype}")
    if data.ndim == 0:
        raise ValueError("packed must have at least one dim")
    table = _decode_table(t)
    out = np.empty(data.shape[:-1] + (2 * data.shape[-1],), dtype=np.float32)
    out[..., 0::2] = table[data & 0x0F]
    out[..., 1::2] = table[data >> 4]
    return out


def _fp4_codes(values: np.ndarray, t: DstType) -> np.ndarray:
    """Codes by round half to even with saturation; NaN gives +0 (as the device's cast)."""
    magnitudes = _FP4_VALUES[t.name]
    midpoints = (magnitudes[:-1] + magnitudes[1:]) / 2
    with np.errstate(invalid="ignore"):
        a = np.abs(values)
        below = np.searchsorted(midpoints, a, side="left")    # midpoints under a
        upto = np.searchsorted(midpoints, a, side="right")    # midpoints at or under a
    # On a midpoint (upto > below) the tie goes to the even code of the two.
    codes = np.where((upto > below) & (below % 2 == 1), upto, below).astype(np.uint8)
    codes |= (np.signbit(values).astype(np.uint8) << 3)
    packed: np.ndarray = np.where(np.isnan(values), np.uint8(0), codes).astype(np.uint8)
    return packed


def pack_fp4(values: npt.ArrayLike, dst_type: DstTypeLike) -> np.ndarray:
    """FP4 codes of real values, two a byte: [..., 2n] -> ``uint8`` [..., n]. Rounds half to even
    and saturates (values past the max, inf included, become +-max), keeps the sign of zeros, and
    stores NaN as +0, as the device's cast does."""
    t = _fp4_type(dst_type)
    data = np.asarray(values)
    if data.dtype.kind not in "fiu" and not data.dtype.name.startswith(("bfloat16", "float")):
        raise TypeError(f"values must be real numbers, got {data.dtype}")
    if data.ndim == 0 or data.shape[-1] % 2:
        raise ValueError(f"values must have an even last dim (two elements a byte), got shape {data.shape}")
    codes = _fp4_codes(data.astype(np.float64), t)   # every float32 / bf16 / fp16 is exact in float64
    packed: np.ndarray = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return packed


# ----------------------------------------------------------------------------- E8M0

def _e8m0_bytes(scales: npt.ArrayLike) -> np.ndarray:
    data = np.asarray(scales)
    if data.dtype.name == "float8_e8m0fnu":
        return data.view(np.uint8)
    if data.dtype != np.uint8:
        raise TypeError(f"scales must be uint8 bytes or float8_e8m0fnu, got {data.dtype}")
    return data


def e8m0_scales(scales: npt.ArrayLike) -> np.ndarray:
    """float32 values of FLOAT8_E8M0 scale bytes (``uint8`` or ``float8_e8m0fnu``): byte b is
    2^(b - 127) exactly (2^-127 is an fp32 subnormal), 0xFF is NaN."""
    data = _e8m0_bytes(scales)
    with np.errstate(over="ignore"):   # 0xFF's 2^128: NaN instead
        values = np.ldexp(np.float32(1.0), data.astype(np.int32) - 127).astype(np.float32)
    decoded: np.ndarray = np.where(data == 0xFF, np.float32(np.nan), values).astype(np.float32)
    return decoded


def e8m0_view(scales: npt.ArrayLike) -> np.ndarray:
    """The same bytes as ``ml_dtypes.float8_e8m0fnu`` (a view, never a conversion)."""
    data = np.asarray(scales)
    if data.dtype.name == "float8_e8m0fnu":
        return data
    if data.dtype != np.uint8:
        raise TypeError(f"scales must be uint8 bytes, got {data.dtype}")
    view: np.ndarray = data.view(np.dtype(_ml().float8_e8m0fnu))
    return view
