"""Bit-exact NumPy model of the emulator's kernel (docs/kernel.md), for tests only.

Every arithmetic step is a float32 NumPy operation in the documented order; constants are
np.float32 so nothing is promoted to float64. Stored NaNs are canonical (docs/kernel.md), so
outputs can be compared byte for byte.
"""

from __future__ import annotations

import math
import os
import re

import ml_dtypes
import numpy as np

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)

ZERO = F32(0.0)
ONE = F32(1.0)
X_OVF = F32(88.72283935546875)
LOG2E = F32(1.44269502162933349609375)
ROUNDER = F32(12582912.0)
LN2_HI = F32(0.693145751953125)
LN2_LO = F32(1.428606765330187045e-06)
X_LO = F32(-104.0)
X_HI = F32(89.0)
P7 = F32(1.0 / 5040.0)
P6 = F32(1.0 / 720.0)
P5 = F32(1.0 / 120.0)
P4 = F32(1.0 / 24.0)
P3 = F32(1.0 / 6.0)
P2 = F32(0.5)
FLT_MIN = F32(np.finfo(np.float32).tiny)
FLT_MAX = F32(np.finfo(np.float32).max)
_ROUNDER_BITS = np.int64(np.array(ROUNDER).view(np.uint32))


def _f32(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != np.float32:
        raise TypeError(f"expected float32, got {a.dtype}")
    return a


def _pow2(k: np.ndarray) -> np.ndarray:
    """2**k as float32 by writing k + 127 into the exponent field (k within normal range)."""
    return ((k.astype(np.int64) + 127) << 23).astype(np.uint32).view(np.float32)


def model_exp(x) -> np.ndarray:
    """The emulator's device_exp on a float32 array."""
    x = _f32(x)
    with np.errstate(all="ignore"):
        xc = np.where(x < X_LO, X_LO, x)
        xc = np.where(xc > X_HI, X_HI, xc).astype(np.float32)
        t = xc * LOG2E
        t = t + ROUNDER
        nf = t - ROUNDER
        r = xc - nf * LN2_HI
        r = r - nf * LN2_LO
        p = np.full_like(r, P7)
        for coef in (P6, P5, P4, P3, P2, ONE, ONE):
            p = p * r
            p = p + coef
        nan = np.isnan(x)
        n = (t.view(np.uint32).astype(np.int64) - _ROUNDER_BITS).astype(np.int32)
        n = np.where(nan, np.int32(0), n)  # t is NaN there; its bits mean nothing
        lo = n >> 1
        hi = n - lo
        result = p * _pow2(lo)
        result = result * _pow2(hi)
        result = np.where(result < FLT_MIN, ZERO, result)
        result = np.where(result > FLT_MAX, FLT_MAX, result)
        result = np.where(x >= X_OVF, F32(np.inf), result)
        result = np.where(nan, x, result)
    return result.astype(np.float32)


# ----------------------------------------------------------------------------- gradWeight order
# docs/operator.md: the kernel cuts a row into tiles of its unified buffer, adds the later tiles into
# an accumulator of the first tile's length, and the 950's ReduceSum sums that accumulator.

UB_AVAILABLE = 253952 - 32 - 8192
REDUCE_MAX = 4096
TILING_CURRENT = "current"
TILING_9_1 = "9.1.0"  # 9.1.0 and 9.2.0-beta.1
_RELEASE = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:-(alpha|beta|rc)\.(\d+))?")
_STAGES = {"alpha": 0, "beta": 1, "rc": 2, None: 3}


def tiling_of_release(text):
    """The tiling a release string stands for; None when it is no release of the operator."""
    m = _RELEASE.fullmatch(text or "")
    if not m:
        return None
    major, minor, patch, stage, number = m.groups()
    key = (int(major), int(minor), int(patch), _STAGES[stage], int(number or 0))
    if key < (9, 1, 0, 3, 0):  # the operator ships from 9.1.0
        return None
    return TILING_9_1 if key < (9, 2, 0, 1, 2) else TILING_CURRENT  # current from 9.2.0-beta.2


def environment_tiling():
    """The tiling the emulator takes from ACL_EMU_CANN_VERSION (unset or not a release: current)."""
    return tiling_of_release(os.environ.get("ACL_EMU_CANN_VERSION", "")) or TILING_CURRENT


def first_tile(dtype, clamp: bool, hidden: int, tiling=TILING_CURRENT) -> int:
    """Length of the first tile of a weighted row (all of it when the row fits the UB)."""
    narrow = np.dtype(dtype) in (np.dtype(np.float16), BF16)
    if tiling == TILING_9_1:
        f = 12 + 8 * clamp + 4
    else:
        f = 14 + 2 * narrow + 8 * clamp + 4 + 2 * narrow
    if f * hidden * 4 + 64 <= UB_AVAILABLE:
        return hidden
    return max(16, (UB_AVAILABLE - 64) // (f * 4) // 16 * 16)


def tree64(lanes) -> np.ndarray:
    """The perfect tree of adjacent pairs over the last axis of 64 lanes."""
    v = _f32(lanes)
    if v.shape[-1] != 64:
        raise ValueError("tree64 takes 64 lanes")
    while v.shape[-1] > 1:
        v = v[..., 0::2] + v[..., 1::2]
    return v[..., 0].astype(np.float32)


def _pad(v, width):
    pad = [(0, 0)] * (v.ndim - 1) + [(0, width - v.shape[-1])]
    return np.pad(v, pad, constant_values=ZERO)  # +0.0 lanes


def reduce_sum(acc) -> np.ndarray:
    """The 950's ReduceSum over the last axis (n <= 4096), rows at a time."""
    acc = _f32(acc)
    n = acc.shape[-1]
    if n > REDUCE_MAX:
        raise ValueError(f"ReduceSum of {n} > {REDUCE_MAX} elements")
    if n <= 64:
        return tree64(_pad(acc, 64))
    if n <= 256:
        rows = _pad(acc, 256).reshape(acc.shape[:-1] + (4, 64))
        present = np.arange(256).reshape(4, 64) < n
        lanes = np.where(present[1], rows[..., 0, :] + rows[..., 1, :], rows[..., 0, :])
        if n > 128:
            upper = np.where(present[3], rows[..., 2, :] + rows[..., 3, :], rows[..., 2, :])
            lanes = np.where(present[2], lanes + upper, lanes) if n <= 192 else lanes + upper
        return tree64(lanes)
    chunks = -(-n // 64)
    sums = tree64(_pad(acc, 64 * chunks).reshape(acc.shape[:-1] + (chunks, 64)))
    return tree64(_pad(sums, 64))


def accumulate_tiles(p, tile: int) -> np.ndarray:
    """acc = the first tile of p, then each later tile added in order into acc's head."""
    p = _f32(p)
    h = p.shape[-1]
    acc = p[..., :tile].copy()
    for start in range(tile, h, max(tile, 1)):
        part = p[..., start : start + tile]
        acc[..., : part.shape[-1]] = acc[..., : part.shape[-1]] + part
    return acc


def grad_weight_sum(p, dtype, clamp: bool, tiling=TILING_CURRENT) -> np.ndarray:
    """gradWeight's order over the last axis of the products p = gy * yOrigin."""
    tile = first_tile(dtype, clamp, p.shape[-1], tiling)
    return reduce_sum(accumulate_tiles(p, tile))


def widen(a) -> np.ndarray:
    """fp16/bf16/fp32 -> fp32, exact."""
    a = np.asarray(a)
    if a.dtype == BF16:
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


CANONICAL_NAN_F32 = np.uint32(0x7FC00000)
CANONICAL_NAN_F16 = np.uint16(0x7E00)
CANONICAL_NAN_BF16 = np.uint16(0x7FC0)


def canonical_f32(v) -> np.ndarray:
    """Every NaN as the positive quiet NaN 0x7FC00000, as the emulator stores them."""
    v = np.array(_f32(v), dtype=np.float32)
    bits = v.view(np.uint32)
    bits[np.isnan(v)] = CANONICAL_NAN_F32
    return v


def to_bf16(v) -> np.ndarray:
    """Round half to even on the upper 16 bits; NaN becomes the canonical 0x7FC0."""
    v = _f32(v)
    bits = np.ascontiguousarray(v).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = np.where(np.isnan(v), np.uint64(CANONICAL_NAN_BF16), rounded).astype(np.uint16)
    return out.view(BF16)


def to_f16(v) -> np.ndarray:
    """Round half to even (NumPy's cast does that, subnormals included); NaN -> 0x7E00."""
    v = _f32(v)
    with np.errstate(all="ignore"):
        bits = v.astype(np.float16).view(np.uint16)
    bits = np.where(np.isnan(v), CANONICAL_NAN_F16, bits).astype(np.uint16)
    return bits.view(np.float16)


def narrow(v, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return canonical_f32(v)
    if dtype == np.float16:
        return to_f16(v)
    if dtype == BF16:
        return to_bf16(v)
    raise TypeError(f"unsupported output dtype {dtype}")


def trunc_of(group_index, rows: int) -> int:
    if group_index is None:
        return rows
    gi = np.asarray(group_index)
    total = int(np.sum(gi.astype(np.uint32), dtype=np.uint32)) if gi.size else 0
    return min(total, rows)


def swiglu_group_quant_grad_model(grad_y, x, weight=None, y_origin=None, group_index=None, clamp_limit=None,
                                  tiling=None):
    """The exact bits the emulator produces: (grad_x in x's dtype, grad_weight float32 or None).
    tiling: TILING_CURRENT or TILING_9_1; None takes it from ACL_EMU_CANN_VERSION as the emulator does."""
    h = x.shape[-1] // 2
    rows = math.prod(x.shape[:-1])
    trunc = trunc_of(group_index, rows)
    gy = widen(grad_y).reshape(rows, h)[:trunc]
    x2 = widen(x).reshape(rows, 2 * h)[:trunc]
    x0 = x2[:, :h]
    x1 = x2[:, h:]

    grad_w = None
    # The kernel clamps with c = float32(clamp_limit), and only when c > 0.
    c = F32(clamp_limit) if clamp_limit is not None else ZERO
    clamp = bool(c > ZERO)
    with np.errstate(all="ignore"):
        if weight is not None:
            w = np.asarray(weight, dtype=np.float32).reshape(rows)[:trunc]
            yo = widen(y_origin).reshape(rows, h)[:trunc]
            p = gy * yo
            gw = np.zeros(rows, dtype=np.float32)
            gw[:trunc] = grad_weight_sum(p, x.dtype, clamp, tiling or environment_tiling())
            grad_w = canonical_f32(gw).reshape(weight.shape)
            gy = gy * w[:, None]
        if clamp:
            a = np.minimum(x0, c)
            b = np.minimum(np.maximum(x1, -c), c)
        else:
            a, b = x0, x1
        e = model_exp(a)
        s = e / (e + ONE)
        silu = a * s
        dsilu = s * (((ONE - s) * a) + ONE)
        gx0 = (gy * b) * dsilu
        gx1 = gy * silu
        if clamp:
            gx0 = gx0 * np.where(x0 < c, ONE, ZERO)
            gx1 = gx1 * np.where((-c < x1) & (x1 < c), ONE, ZERO)
    full = np.zeros((rows, 2 * h), dtype=np.float32)
    full[:trunc, :h] = gx0
    full[:trunc, h:] = gx1
    grad_x = narrow(full, x.dtype)
    # Rows past trunc are +0.0 in every dtype (all-zero bits).
    return grad_x.reshape(x.shape), grad_w
