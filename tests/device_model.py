"""Bit-exact NumPy model of the emulator's kernel (docs/kernel.md), for tests only.

Every arithmetic step is a float32 NumPy operation in the documented order; constants are
np.float32 so nothing is promoted to float64. Stored NaNs are canonical (docs/kernel.md), so
outputs can be compared byte for byte.
"""

from __future__ import annotations

import math

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


def tree_sum(v) -> np.ndarray:
    """Adjacent-pair tree sum over the last axis (odd tail carried); empty gives +0.0."""
    v = _f32(v)
    n = v.shape[-1]
    if n == 0:
        return np.zeros(v.shape[:-1], dtype=np.float32)
    while n > 1:
        half = n // 2
        s = v[..., 0 : 2 * half : 2] + v[..., 1 : 2 * half : 2]
        if n % 2:
            s = np.concatenate([s, v[..., n - 1 : n]], axis=-1)
        v = s
        n = v.shape[-1]
    return v[..., 0].astype(np.float32)


def chunked_tree_sum(p) -> np.ndarray:
    """gradWeight's order: tree_sum per 64-element chunk, then tree_sum over the chunk sums."""
    p = _f32(p)
    h = p.shape[-1]
    lead = p.shape[:-1]
    parts = []
    full = h // 64
    if full:
        parts.append(tree_sum(p[..., : full * 64].reshape(lead + (full, 64))))
    if h % 64:
        parts.append(tree_sum(p[..., full * 64 :])[..., None])
    if not parts:
        return np.zeros(lead, dtype=np.float32)
    return tree_sum(np.concatenate(parts, axis=-1))


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


def swiglu_group_quant_grad_model(grad_y, x, weight=None, y_origin=None, group_index=None, clamp_limit=None):
    """The exact bits the emulator produces: (grad_x in x's dtype, grad_weight float32 or None)."""
    h = x.shape[-1] // 2
    rows = math.prod(x.shape[:-1])
    trunc = trunc_of(group_index, rows)
    gy = widen(grad_y).reshape(rows, h)[:trunc]
    x2 = widen(x).reshape(rows, 2 * h)[:trunc]
    x0 = x2[:, :h]
    x1 = x2[:, h:]

    grad_w = None
    with np.errstate(all="ignore"):
        if weight is not None:
            w = np.asarray(weight, dtype=np.float32).reshape(rows)[:trunc]
            yo = widen(y_origin).reshape(rows, h)[:trunc]
            p = gy * yo
            gw = np.zeros(rows, dtype=np.float32)
            gw[:trunc] = chunked_tree_sum(p)
            grad_w = canonical_f32(gw).reshape(weight.shape)
            gy = gy * w[:, None]
        # The kernel clamps with c = float32(clamp_limit), and only when c > 0.
        c = F32(clamp_limit) if clamp_limit is not None else ZERO
        clamp = bool(c > ZERO)
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
