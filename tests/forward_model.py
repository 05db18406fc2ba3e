"""Bit-exact NumPy model of the emulator's forward kernel, aclnnSwigluGroupQuant modes 0 and 1
(docs/forward.md), for tests only.

Every arithmetic step is a float32 NumPy operation in the device's order, with the emulator's
exp (tests/device_model.py) and IEEE division with subnormal operands and results flushed to
zero; the scale rules are the documented bit rules. The element casts are NumPy's and
ml_dtypes' own conversions (round half to even), not a copy of the C bit tricks: FP8 through
`astype(float8_e4m3fn / float8_e5m2)`, FP4 E2M1 through `astype(float4_e2m1fn)`, E1M2 as
`rint(|v| / 0.25)` capped at 7. NaN codes are the emulator's (0x7F, 0x7E, FP4 +0).

Also here: the integer-only input generator and the FNV-1a digests of
native/tests/test_forward_golden.c, so that its table is checked against this model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import ml_dtypes
import numpy as np

from device_model import model_exp

F32 = np.float32
U32 = np.uint32
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)

# dst codes (aclDataType)
E5M2, E4M3FN, E2M1, E1M2 = 35, 36, 40, 41
# Their names in the package, and the (dst, quant mode, round_scale) combinations the emulator
# runs, with a pytest id each.
NAMES = {E4M3FN: "float8_e4m3fn", E5M2: "float8_e5m2", E2M1: "float4_e2m1fn", E1M2: "float4_e1m2"}
COMBINATIONS = [(E4M3FN, 0, False), (E4M3FN, 0, True), (E5M2, 0, False), (E5M2, 0, True),
                (E4M3FN, 1, True), (E5M2, 1, True), (E2M1, 1, True), (E1M2, 1, True)]
COMBINATION_IDS = [f"{NAMES[d]}-mode{m}{'-round' if r and m == 0 else ''}" for d, m, r in COMBINATIONS]
FP8 = (E4M3FN, E5M2)
FP4 = (E2M1, E1M2)

AMAX_FLOOR = np.uint32(0x38D1B717)                  # 1e-4f
FACTOR = {E4M3FN: np.uint32(0x3B124925), E5M2: np.uint32(0x37924925)}   # fp32(1/448), fp32(1/57344)
FP8_MAX = {E4M3FN: F32(448.0), E5M2: F32(57344.0)}
FP8_DTYPE = {E4M3FN: ml_dtypes.float8_e4m3fn, E5M2: ml_dtypes.float8_e5m2}
FP8_NAN = {E4M3FN: 0x7F, E5M2: 0x7E}
BLOCK, GROUP = 128, 32


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=F32).view(U32)


def floats(u) -> np.ndarray:
    return np.ascontiguousarray(u, dtype=U32).view(F32)


def flush(v) -> np.ndarray:
    """Subnormal float32 values to zero of the same sign (vdiv's operands and result)."""
    u = bits(v)
    return floats(np.where((u & 0x7F800000) == 0, u & 0x80000000, u))


def trunc_of(group_index, rows: int) -> int:
    """min(int64 wrapping sum of the counts, T), at least 0; T without groups."""
    if group_index is None:
        return rows
    total = int(np.sum(np.asarray(group_index, dtype=np.int64).reshape(-1), dtype=np.int64))
    return max(0, min(total, rows))


def swiglu_fp32(x, weight=None, clamp: Optional[float] = None, plus_zero: bool = True) -> np.ndarray:
    """y [T, H] in float32 as the kernel computes it, x [..., 2H] fp16/bf16."""
    h = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * h)
    with np.errstate(all="ignore"):
        x0 = x2[:, :h].astype(F32)
        x1 = x2[:, h:].astype(F32)
        if clamp is not None:
            c = F32(clamp)
            x0 = np.minimum(x0, c)            # NaN propagates
            x1 = np.minimum(np.maximum(x1, -c), c)
        e = model_exp(-x0)
        y = flush(flush(x0) / (e + F32(1.0))) * x1
        if weight is not None:
            y = y * np.asarray(weight, dtype=F32).reshape(-1)[:, None]
        if plus_zero:
            y = y + F32(0.0)
    return y.astype(F32)


def pow2_exponent(s) -> np.ndarray:
    """ceil(log2 s) from the bits: exponent - 127, plus one for a non-zero mantissa."""
    u = bits(s)
    return ((u >> 23) & 0xFF).astype(np.int64) - 127 + ((u & 0x7FFFFF) != 0)


def fp8_codes(q, dst: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        codes = np.asarray(q, dtype=F32).astype(FP8_DTYPE[dst]).view(np.uint8).copy()
    codes[np.isnan(q)] = FP8_NAN[dst]
    if dst == E4M3FN:   # no inf: ml_dtypes gives overflow and +-inf a NaN of their sign; one code is stored
        codes[(codes & 0x7F) == 0x7F] = FP8_NAN[dst]
    return codes


def block_quant(y, dst: int, round_scale: bool) -> Tuple[np.ndarray, np.ndarray]:
    """Mode 0: codes [T, H] uint8 and scales [T, H/128] float32."""
    t, h = y.shape
    yb = y.reshape(t, h // BLOCK, BLOCK)
    a = bits(yb) & 0x7FFFFFFF
    a = np.where(a < 0x7F800000, a, 0)
    amax = floats(np.maximum(a.max(axis=-1), AMAX_FLOOR))
    with np.errstate(all="ignore"):
        s = amax * floats(FACTOR[dst])
        if round_scale:
            e = pow2_exponent(s)
            scale = floats(((e + 127) << 23).astype(U32))
            inv = floats(((127 - e) << 23).astype(U32))
        else:
            scale = s
            inv = FP8_MAX[dst] / amax
        q = yb * inv[..., None]
        q = np.where(np.isfinite(q), q, yb)
    return fp8_codes(q, dst).reshape(t, h), scale.astype(F32)


def mx_fp8_quant(y, dst: int) -> Tuple[np.ndarray, np.ndarray]:
    """Mode 1 FP8: codes [T, H] uint8 and E8M0 bytes [T, H/32]."""
    t, h = y.shape
    yg = y.reshape(t, h // GROUP, GROUP)
    amax = (bits(yg) & 0x7FFFFFFF).max(axis=-1)     # NaN bits lie above inf's
    amax = floats(np.maximum(amax, AMAX_FLOOR))
    with np.errstate(all="ignore"):
        e = pow2_exponent(amax * floats(FACTOR[dst]))
        scale = ((e + 127) & 0xFF).astype(np.uint8)
        inv = floats((((127 - e) << 23) & 0xFFFFFFFF).astype(U32))      # mod 2^32
        q = yg * inv[..., None]
    return fp8_codes(q, dst).reshape(t, h), scale


def fp4_key(v) -> np.ndarray:
    u = v.view(np.uint16).astype(np.uint32)
    if v.dtype == BF16:
        return u & 0x7F80
    widened = bits(v.astype(F32)) >> 16
    return np.where((u & 0x7C00) == 0x7C00, 0x7F80, widened & 0x7F80)


def fp4_operand(v, dst: int) -> np.ndarray:
    """The bf16 operand of the scaling, as float32."""
    u = v.view(np.uint16)
    if v.dtype == BF16:
        return v.astype(F32)
    low = u & (0x00FF if dst == E2M1 else 0x007F)
    u = np.where((low > 0) & (low < 8), u | 0x0008, u).astype(np.uint16)
    return floats(bits(u.view(np.float16).astype(F32)) & 0xFFFF0000)


def fp4_codes(p, dst: int) -> np.ndarray:
    """bf16 values -> 4-bit codes, round half to even, saturating, NaN -> +0."""
    f = p.astype(F32)
    nan = np.isnan(f)
    if dst == E2M1:
        with np.errstate(all="ignore"):
            codes = p.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F
    else:
        mag = np.minimum(np.rint(np.abs(np.where(nan, 0, f)) / F32(0.25)), 7).astype(np.uint8)
        codes = mag | (np.signbit(f).astype(np.uint8) << 3)
    return np.where(nan, 0, codes).astype(np.uint8)


def mx_fp4_quant(y, x_dtype, dst: int) -> Tuple[np.ndarray, np.ndarray]:
    """Mode 1 FP4: packed codes [T, H/2] uint8 and E8M0 bytes [T, H/32]."""
    t, h = y.shape
    with np.errstate(all="ignore"):
        v = y.astype(x_dtype).reshape(t, h // GROUP, GROUP)
    key = fp4_key(v).max(axis=-1).astype(np.int64)
    emax = 0x0100 if dst == E2M1 else 0
    shift = np.maximum(key, emax) - emax
    scale = np.where(key == 0x7F80, 0xFF, np.where(key == 0, 0, shift >> 7)).astype(np.uint8)
    recip = (0x7F00 - shift) & 0xFFFF
    recip = np.where(key == 0x7F80, 0x7F81, recip)
    recip = np.where(key == 0, 0, recip)
    recip = np.where(shift == 0x7F00, 0x0040, recip)
    recip_f = floats(recip.astype(U32) << 16)
    with np.errstate(all="ignore"):
        p = (fp4_operand(v, dst) * recip_f[..., None]).astype(BF16)
    codes = fp4_codes(p, dst).reshape(t, h)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8), scale


def forward(x, weight=None, group_index=None, *, dst: int, quant_mode: int, round_scale: bool = False,
            clamp: Optional[float] = None, y_out=None, scale_out=None) -> Tuple[np.ndarray, np.ndarray]:
    """The kernel's outputs as raw storage: y [T, H] uint8 (FP4: [T, H/2] packed), scales
    [T, H/128] float32 (mode 0) or [T, H/32] uint8 (mode 1). Rows >= trunc come from y_out and
    scale_out (same shapes and dtypes), or are zero."""
    t = math.prod(x.shape[:-1])
    h = x.shape[-1] // 2
    trunc = trunc_of(group_index, t)
    fp4 = dst in FP4
    y_cols = h // 2 if fp4 else h
    y = np.zeros((t, y_cols), np.uint8) if y_out is None else np.array(y_out, dtype=np.uint8).reshape(t, y_cols)
    if quant_mode == 0:
        s = np.zeros((t, h // BLOCK), F32) if scale_out is None else np.array(scale_out, F32).reshape(t, -1)
    else:
        s = np.zeros((t, h // GROUP), np.uint8) if scale_out is None else np.array(scale_out, np.uint8).reshape(t, -1)
    if trunc == 0:
        return y, s
    rows = x.reshape(t, 2 * h)[:trunc]
    w = None if weight is None else np.asarray(weight, F32).reshape(-1)[:trunc]
    yf = swiglu_fp32(rows, w, clamp, plus_zero=not fp4)
    if quant_mode == 0:
        codes, scales = block_quant(yf, dst, round_scale)
    elif fp4:
        codes, scales = mx_fp4_quant(yf, x.dtype, dst)
    else:
        codes, scales = mx_fp8_quant(yf, dst)
    y[:trunc] = codes
    s[:trunc] = scales
    return y, s


# ----------------------------------------------------------------------------- golden inputs
# The generator of native/tests/test_forward_golden.c, integer for integer.

MASK64 = (1 << 64) - 1
SPECIAL_FP16 = (0x4300, 0xC300, 0x5640, 0xD640, 0x7E00, 0x7C00, 0xFC00, 0x8000, 0x0001)
SPECIAL_BF16 = (0x4060, 0xC060, 0x42C8, 0xC2C8, 0x7FC0, 0x7F80, 0xFF80, 0x8000, 0x0001)
SPECIAL_EVERY = 97
GOLDEN_CLAMP = 3.5
GOLDEN_GROUPS = (2, 1, 1)
SENTINEL = 0xA5


def splitmix64(state: int) -> Tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def _randoms(seed: int, count: int) -> List[int]:
    out = []
    state = seed & MASK64
    for _ in range(count):
        state, r = splitmix64(state)
        out.append(r)
    return out


def golden_x(fp16: bool, count: int, seed: int) -> np.ndarray:
    """x bits: random values of magnitude below 8 (fp16 subnormals included), a special value
    in every 97th element."""
    out = np.empty(count, np.uint16)
    specials = SPECIAL_FP16 if fp16 else SPECIAL_BF16
    for i, r in enumerate(_randoms(seed, count)):
        if i % SPECIAL_EVERY == SPECIAL_EVERY - 1:
            out[i] = specials[r % len(specials)]
        elif fp16:
            out[i] = ((r >> 20) & 0x8000) | (((r >> 32) % 18) << 10) | (r & 0x3FF)
        else:
            value = np.float32((r >> 40) * 2.0 ** -20 - 8.0)          # exact
            out[i] = int(np.array(value).view(np.uint32)) >> 16        # truncation: an exact bf16
    return out.view(F16 if fp16 else BF16)


def golden_weight(count: int, seed: int) -> np.ndarray:
    """Weights in [-1, 1): a 23-bit integer times 2^-22, minus 1 (exact)."""
    return np.array([F32((r >> 41) * 2.0 ** -22 - 1.0) for r in _randoms(seed, count)], F32)


@dataclass(frozen=True)
class GoldenCase:
    fp16: bool
    dst: int
    quant_mode: int
    round_scale: bool
    full: bool          # weight, clamp and groups (trunc 4 of 5 rows), H crossing the kernel's chunk

    @property
    def rows(self) -> int:
        return 5 if self.full else 7

    @property
    def hidden(self) -> int:
        return 2304 if self.full else 384

    @property
    def name(self) -> str:
        dst = {E4M3FN: "e4m3fn", E5M2: "e5m2", E2M1: "e2m1", E1M2: "e1m2"}[self.dst]
        text = f"{'fp16' if self.fp16 else 'bf16'} mode{self.quant_mode} {dst}"
        if self.quant_mode == 0:
            text += " round" if self.round_scale else " exact"
        return text + (f" T={self.rows} H={self.hidden}" + (" weight clamp groups" if self.full else ""))

    @property
    def seed(self) -> int:
        return (int(self.fp16) << 40) ^ (self.dst << 32) ^ (self.quant_mode << 24) ^ (int(self.round_scale) << 16) ^ \
            (self.hidden << 1) ^ int(self.full)


def golden_cases() -> List[GoldenCase]:
    cases = []
    for fp16 in (True, False):
        for dst, mode, round_scale in COMBINATIONS:
            for full in (False, True):
                cases.append(GoldenCase(fp16, dst, mode, round_scale, full))
    return cases


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    return h


def golden_problem(case: GoldenCase):
    """(x, weight, group_index, clamp, y_out, scale_out) of a case, outputs sentinel-filled."""
    t, h = case.rows, case.hidden
    x = golden_x(case.fp16, t * 2 * h, case.seed + 1).reshape(t, 2 * h)
    weight = golden_weight(t, case.seed + 2) if case.full else None
    groups = np.array(GOLDEN_GROUPS, np.int64) if case.full else None
    clamp = GOLDEN_CLAMP if case.full else None
    y_cols = h // 2 if case.dst in FP4 else h
    y_out = np.full((t, y_cols), SENTINEL, np.uint8)
    scale_bytes = t * (h // BLOCK) * 4 if case.quant_mode == 0 else t * (h // GROUP)
    raw = np.full(scale_bytes, SENTINEL, np.uint8)
    scale_out = raw.view(F32) if case.quant_mode == 0 else raw
    return x, weight, groups, clamp, y_out, scale_out


def golden_digests(case: GoldenCase) -> Tuple[int, int]:
    x, weight, groups, clamp, y_out, scale_out = golden_problem(case)
    y, s = forward(x, weight, groups, dst=case.dst, quant_mode=case.quant_mode, round_scale=case.round_scale,
                   clamp=clamp, y_out=y_out, scale_out=scale_out)
    return fnv1a64(y.tobytes()), fnv1a64(s.tobytes())


GOLDEN_SOURCE = Path(__file__).resolve().parents[1] / "native" / "tests" / "test_forward_golden.c"
_ROW = re.compile(r'\{"([^"]+)", 0x([0-9a-f]{16})ull, 0x([0-9a-f]{16})ull\}')


def golden_table(source: Path = GOLDEN_SOURCE) -> dict:
    """The GOLDEN table of the C test: name -> (y digest, y_scale digest)."""
    text = source.read_text()
    start = text.index("FORWARD_GOLDEN[] = {")
    body = text[start:text.index("};", start)]
    return {name: (int(y, 16), int(s, 16)) for name, y, s in _ROW.findall(body)}


if __name__ == "__main__":
    # Prints the table native/tests/test_forward_golden.c holds, computed by this model.
    for case in golden_cases():
        y, s = golden_digests(case)
        print(f'    {{"{case.name}", 0x{y:016x}ull, 0x{s:016x}ull}},')
