"""Float64 reference for aclnnSwigluGroupQuantGrad and a verdict for comparing results.

The functions here implement the documented math (NumPy only), not the device's fp32 formula:
sigmoid is the mathematical 1/(1+exp(-x)), computed stably. Where the device's fp32 operation
sequence departs from the math (exp overflowing to inf or flushing to 0, a product overflowing
fp32, inf times 0), `device_departures` tells which positions, so that `compare` can report them
instead of failing on them.
"""

from __future__ import annotations

import math
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import formats as _formats
from ._dtypes import as_dtype, bfloat16_dtype, is_bfloat16
from ._validate import check_clamp_limit

__all__ = [
    "EXP_FLUSH_X",
    "EXP_OVERFLOW_X",
    "TOLERANCES",
    "Comparison",
    "QuantComparison",
    "compare",
    "compare_quantised",
    "device_departures",
    "swiglu",
    "swiglu_group_quant",
    "swiglu_group_quant_grad",
]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_MAX_RANK = 8

#: float32(88.72284): from here on the device's fp32 exp is +inf and its sigmoid e/(e+1) is NaN.
EXP_OVERFLOW_X = 88.72283935546875
#: The first float32 whose exp is at least FLT_MIN: below it the device's exp flushes to +0
#: (exp(-87.3365478515625) is FLT_MIN * 0.999997).
EXP_FLUSH_X = -87.33654022216797

# Elements of x (2H per row) handled per chunk: the float64 temporaries (about 1 MB each, a
# few per thread) stay the same whatever the input size, so memory is the outputs plus a
# constant; chunks this large keep NumPy's loops long enough for two threads to overlap.
_CHUNK_ELEMENTS = 1 << 18
_THREADS = max(1, min(2, os.cpu_count() or 1))

#: dtype name -> (tol, allowed failing fraction, MERE threshold Th); MARE is judged against 10*Th.
TOLERANCES = {
    "float32": (1e-4, 1e-4, 2.0 ** -13),
    "float16": (1e-3, 1e-3, 2.0 ** -10),
    "bfloat16": (4e-3, 1e-3, 2.0 ** -7),
}


# ----------------------------------------------------------------------------- validation


def _is_data_dtype(dt: np.dtype, allow_f64: bool = False) -> bool:
    """float32, float16, bfloat16 (and float64 when allowed)."""
    return dt == _F32 or dt == _F16 or is_bfloat16(dt) or (allow_f64 and dt == _F64)


def _check_data(name: str, arr: object, allow_f64: bool = False) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(arr).__name__}")
    if not _is_data_dtype(arr.dtype, allow_f64):
        names = "float32, float16, bfloat16" + (", float64" if allow_f64 else "")
        raise TypeError(f"{name} must have dtype {names}; got {arr.dtype}")
    return arr


def _check_clamp(clamp_limit: object) -> np.float32 | None:
    """None when clamp is off, else the fp32 limit the operator uses. The binding's own rule
    decides (None = off; otherwise finite, > 0 and > 0 once rounded to fp32), so that the
    reference refuses exactly what a call refuses, with the same errors."""
    value = check_clamp_limit(clamp_limit)
    if value is None:
        return None
    # The C ABI takes a double but the kernel compares and clamps with (float)clampLimit.
    # Annotated because NumPy's stubs type the scalar constructors through typing.Self, which
    # mypy sees as Any when checking for Pythons before 3.11.
    with np.errstate(over="ignore", under="ignore"):
        limit: np.float32 = np.float32(value)
    return limit


def _check_x(x: Any, allow_f64: bool = False) -> tuple[int, int]:
    """Validate x alone; return (T, H)."""
    _check_data("x", x, allow_f64)
    if not 1 <= x.ndim <= _MAX_RANK:
        raise ValueError(f"x must have rank 1..{_MAX_RANK}, got shape {x.shape}")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dimension must be even (2H), got shape {x.shape}")
    return math.prod(x.shape[:-1]), x.shape[-1] // 2


def _trunc(group_index: object, rows: int) -> int:
    if group_index is None:
        return rows
    gi = np.asarray(group_index)
    if gi.dtype == np.bool_ or not np.issubdtype(gi.dtype, np.integer):
        raise TypeError(f"group_index must have an integer dtype (int64), got {gi.dtype}")
    if gi.ndim != 1:
        raise ValueError(f"group_index must be 1-D [G], got shape {gi.shape}")
    # The operator casts each count to uint32 and sums in uint32: negatives and sums >= 2**32 wrap.
    total = int(np.sum(gi.astype(np.uint32), dtype=np.uint32)) if gi.size else 0
    return min(total, rows)


def _chunk_rows(width: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(1, width))


def _widen(a: np.ndarray) -> np.ndarray:
    # fp16/bf16/fp32 -> float64 is exact.
    return a.astype(np.float64)


# ----------------------------------------------------------------------------- the math


def _sigmoid_pair(x0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sigmoid(x0), 1 - sigmoid(x0)) without overflow and without cancellation in 1 - s."""
    e = np.exp(-np.abs(x0))  # in (0, 1]; NaN stays NaN
    d = 1.0 + e
    pos = x0 >= 0
    s = np.where(pos, 1.0, e)
    s /= d
    sn = np.where(pos, e, 1.0)
    sn /= d
    return s, sn


def _clamped(x0: np.ndarray, x1: np.ndarray, c: np.float32 | None) -> Tuple[np.ndarray, np.ndarray]:
    if c is None:
        return x0, x1
    cf = float(c)
    # np.minimum / np.maximum propagate NaN, as the operator's clamp does.
    return np.minimum(x0, cf), np.minimum(np.maximum(x1, -cf), cf)


def swiglu_group_quant_grad(grad_y: np.ndarray, x: np.ndarray, weight: Optional[np.ndarray] = None,
                            y_origin: Optional[np.ndarray] = None, group_index: Union[np.ndarray, Sequence[int], None] = None,
                            clamp_limit: Optional[float] = None, *,
                            out: Optional[Tuple[np.ndarray, Optional[np.ndarray]]] = None) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Float64 gradients of SwiGLU with optional MoE weight, clamp and group truncation.

    Returns ``(grad_x, grad_weight)``: grad_x float64 with x's shape, grad_weight float64 with
    weight's shape (None without weight). Rows t >= trunc are +0.0 in both.

    ``out=(grad_x, grad_weight)`` writes the results into those arrays instead (C-contiguous,
    writeable float64 of the shapes above, grad_weight None exactly when weight is None, sharing
    no memory with the inputs or each other) and returns them. Checking many batches of one
    shape with the same two arrays saves allocating, and the kernel zeroing, gigabytes of fresh
    pages on every call.
    """
    _check_data("grad_y", grad_y)
    rows, h = _check_x(x)
    if grad_y.dtype != x.dtype:
        raise TypeError(f"grad_y and x must have the same dtype, got {grad_y.dtype} and {x.dtype}")
    if grad_y.ndim != x.ndim or grad_y.shape[:-1] != x.shape[:-1] or grad_y.shape[-1] != h:
        raise ValueError(
            f"grad_y must have shape [..., H] matching x [..., 2H]; got grad_y {grad_y.shape}, x {x.shape}"
        )
    if weight is not None:
        if not isinstance(weight, np.ndarray):
            raise TypeError(f"weight must be a numpy.ndarray, got {type(weight).__name__}")
        if weight.dtype != _F32:
            raise TypeError(f"weight must have dtype float32, got {weight.dtype}")
        if weight.size != rows:
            raise ValueError(f"weight must have T = {rows} elements, got shape {weight.shape}")
        if y_origin is None:
            raise ValueError("y_origin is required when weight is given")
    if y_origin is not None:
        # Without weight, y_origin is validated but plays no part.
        _check_data("y_origin", y_origin)
        if y_origin.dtype != grad_y.dtype:
            raise TypeError(f"y_origin must have grad_y's dtype {grad_y.dtype}, got {y_origin.dtype}")
        if y_origin.shape != grad_y.shape:
            raise ValueError(f"y_origin must have grad_y's shape {grad_y.shape}, got {y_origin.shape}")
    c = _check_clamp(clamp_limit)
    trunc = _trunc(group_index, rows)
    if out is not None:
        grad_x, grad_w = _check_out(out, x, weight, (grad_y, x, weight, y_origin, group_index))
    else:
        grad_x = _output(x.shape)
        grad_w = None if weight is None else _output(weight.shape)

    gx2 = grad_x.reshape(rows, 2 * h)
    gx2[trunc:] = 0.0
    gw1 = w1 = yo2 = None
    if weight is not None and grad_w is not None and y_origin is not None:   # (one is given with the others)
        gw1 = grad_w.reshape(rows)
        gw1[trunc:] = 0.0
        w1 = weight.reshape(rows)
        yo2 = y_origin.reshape(rows, h)
    gy2 = grad_y.reshape(rows, h)
    x2 = x.reshape(rows, 2 * h)

    step = _chunk_rows(2 * h)
    starts = list(range(0, trunc, step))

    def run(part: List[int]) -> None:
        scratch = _Scratch(step, h)
        for r0 in part:
            _rows(r0, min(trunc, r0 + step), gy2, x2, yo2, w1, c, gx2, gw1, scratch)

    # Rows are independent and NumPy releases the GIL in its loops: a second thread halves
    # the time on two cores. Each thread takes a contiguous run of chunks.
    threads = min(_THREADS, len(starts))
    if threads <= 1:
        run(starts)
    else:
        per = -(-len(starts) // threads)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, [starts[i:i + per] for i in range(0, len(starts), per)]))
    return grad_x, grad_w


# Outputs from this size up come from their own anonymous mapping. NumPy asks the kernel for
# transparent huge pages on large arrays, and where the kernel must compact memory to find them
# (THP "defrag" on madvise, common on VMs) the first touch of each page can cost many times the
# arithmetic done on it.
_MAPPED_OUTPUT_BYTES = 64 << 20


def _check_out(out: object, x: np.ndarray, weight: Optional[np.ndarray], inputs: Sequence[object]) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out must be a (grad_x, grad_weight) pair, got {type(out).__name__}")
    checked: List[Optional[np.ndarray]] = []
    for name, arr, like in (("out[0] (grad_x)", out[0], x), ("out[1] (grad_weight)", out[1], weight)):
        if like is None:
            if arr is not None:
                raise ValueError(f"{name} must be None when weight is None")
            checked.append(None)
            continue
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{name} must be a numpy.ndarray, got {type(arr).__name__}")
        if arr.dtype != _F64:
            raise TypeError(f"{name} must have dtype float64, got {arr.dtype}")
        if arr.shape != like.shape:
            raise ValueError(f"{name} must have shape {like.shape}, got {arr.shape}")
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            raise ValueError(f"{name} must be C-contiguous and writeable")
        for other in list(inputs) + checked:
            if isinstance(other, np.ndarray) and np.may_share_memory(arr, other):
                raise ValueError(f"{name} must not share memory with an input or the other output")
        checked.append(arr)
    grad_x = checked[0]
    assert grad_x is not None   # (x is never None)
    return grad_x, checked[1]


def _output(shape: Tuple[int, ...]) -> np.ndarray:
    """A float64 array for a result (contents undefined)."""
    nbytes = math.prod(shape) * 8
    if nbytes < _MAPPED_OUTPUT_BYTES:
        return np.empty(shape, dtype=np.float64)
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | getattr(mmap, "MAP_POPULATE", 0)
    # MAP_POPULATE maps every page in one go instead of one fault per page.
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype=np.float64).reshape(shape)


class _Scratch:
    """float64 work arrays for one chunk of rows, reused from chunk to chunk."""

    def __init__(self, rows: int, h: int) -> None:
        shape = (rows, h)
        self.x0, self.x1, self.t, self.s, self.u = (np.empty(shape) for _ in range(5))
        self.gy = np.empty(shape)
        self.mask, self.mask2 = (np.empty(shape, dtype=bool) for _ in range(2))

    def view(self, rows: int) -> List[np.ndarray]:
        return [a[:rows] for a in (self.gy, self.x0, self.x1, self.t, self.s, self.u, self.mask, self.mask2)]


def _rows(r0: int, r1: int, gy2: np.ndarray, x2: np.ndarray, yo2: Optional[np.ndarray], w1: Optional[np.ndarray],
          c: np.float32 | None, gx2: np.ndarray, gw1: Optional[np.ndarray], scratch: _Scratch) -> None:
    """Rows [r0, r1) of the documented math, in float64, into gx2 (and gw1)."""
    h = gy2.shape[1]
    gy, x0, x1, t, s, u, mask, mask2 = scratch.view(r1 - r0)
    np.copyto(gy, gy2[r0:r1], casting="unsafe")          # widening to float64 is exact
    np.copyto(x0, x2[r0:r1, :h], casting="unsafe")
    np.copyto(x1, x2[r0:r1, h:], casting="unsafe")
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        if w1 is not None and yo2 is not None and gw1 is not None:   # (all three or none)
            # Raw grad_y, before weighting and without clamp mask.
            np.copyto(t, yo2[r0:r1], casting="unsafe")
            np.einsum("ij,ij->i", gy, t, out=gw1[r0:r1])
            gy *= w1[r0:r1, None]
        if c is not None:
            cf = float(c)
            # Strict masks on the ORIGINAL values (taken before the clamp overwrites them);
            # -c < x1 < c is |x1| < c, and NaN fails both.
            np.less(x0, cf, out=mask)
            np.abs(x1, out=t)
            np.less(t, cf, out=mask2)
            # minimum and clip propagate NaN, as the operator's clamp does.
            np.minimum(x0, cf, out=x0)
            np.clip(x1, -cf, cf, out=x1)
        # sigmoid = 1 / (1 + exp(-x0)); exp overflowing to inf gives 0, as the limit does.
        np.negative(x0, out=s)
        np.exp(s, out=s)
        s += 1.0
        np.reciprocal(s, out=s)
        # dsilu = s * (1 + x0 * (1 - s))
        np.subtract(1.0, s, out=u)
        u *= x0
        u += 1.0
        u *= s
        # The masks multiply a factor rather than the product: the same zeros (signed), NaNs
        # and values, and each output is written once. (No float64 product of fp32-range
        # inputs overflows, so inf * 0 cases coincide too.)
        if c is not None:
            u *= mask
        np.multiply(gy, x1, out=t)
        np.multiply(t, u, out=gx2[r0:r1, :h])
        np.multiply(x0, s, out=u)          # silu
        if c is not None:
            u *= mask2
        np.multiply(gy, u, out=gx2[r0:r1, h:])


def swiglu(x: np.ndarray, clamp_limit: Optional[float] = None) -> np.ndarray:
    """Float64 forward: silu(x0) * x1 with x0 = x[..., :H], x1 = x[..., H:], clamped when on.

    With clamp: x0 = min(x0, c), x1 = clip(x1, -c, c). Returns shape [..., H].
    """
    rows, h = _check_x(x, allow_f64=True)
    c = _check_clamp(clamp_limit)
    y = np.empty(x.shape[:-1] + (h,), dtype=np.float64)
    y2 = y.reshape(rows, h)
    x2 = x.reshape(rows, 2 * h)
    step = _chunk_rows(2 * h)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            x0, x1 = _clamped(_widen(x2[r0:r1, :h]), _widen(x2[r0:r1, h:]), c)
            s, _ = _sigmoid_pair(x0)
            np.multiply(x0, s, out=y2[r0:r1])
            y2[r0:r1] *= x1
    return y


def _device_exp(x0: np.ndarray) -> np.ndarray:
    """The device's fp32 exp, as far as what follows depends on it: +inf from EXP_OVERFLOW_X on,
    +0 below EXP_FLUSH_X, NaN for NaN; in between within an ulp of the true value."""
    with np.errstate(over="ignore", under="ignore"):
        e = np.exp(x0.astype(np.float64)).astype(np.float32)
    e[x0 >= EXP_OVERFLOW_X] = np.inf
    e[x0 < EXP_FLUSH_X] = 0.0
    return e


def _device_rows(gy: np.ndarray, x0o: np.ndarray, x1o: np.ndarray, c: np.float32 | None) -> np.ndarray:
    """grad_x of some rows by the device's fp32 operation sequence (section 1, steps 5 to 8), from
    fp32 inputs (gy already weighted). Exact in every step but exp, which is within an ulp; what
    matters here is where a step gives inf, NaN or 0."""
    f32 = np.float32
    one = f32(1)
    if c is not None:
        x0, x1 = np.minimum(x0o, c), np.minimum(np.maximum(x1o, -c), c)
    else:
        x0, x1 = x0o, x1o
    e = _device_exp(x0)
    s = e / (e + one)                                 # inf/inf = NaN where exp overflowed
    silu = x0 * s
    dsilu = s * (((one - s) * x0) + one)
    gx0 = (gy * x1) * dsilu                           # gy * x1 may overflow first
    gx1 = gy * silu
    if c is not None:                                 # masks by multiplication: inf * 0 = NaN
        gx0 = gx0 * (x0o < c).astype(f32)
        gx1 = gx1 * ((-c < x1o) & (x1o < c)).astype(f32)
    return np.concatenate([gx0, gx1], axis=1)


def device_departures(x: np.ndarray, clamp_limit: Optional[float] = None,
                      group_index: Union[np.ndarray, Sequence[int], None] = None, grad_y: Optional[np.ndarray] = None,
                      weight: Optional[np.ndarray] = None) -> np.ndarray:
    """Bool mask (x's shape) of grad_x positions where the device's fp32 formula departs from the
    math, so that `compare(..., departures=mask)` counts them instead of judging them.

    The device's steps are followed in fp32 (section 1): ``gy * weight``, the clamp, ``exp`` (which
    overflows to inf from x0 >= 88.72283935546875 and flushes to 0 below -87.33654), ``e/(e+1)``,
    ``gy * x1``, the products with dsilu and silu and the masks (inf * 0 = NaN). A position departs
    when that sequence gives NaN, inf or 0 where the float64 math (rounded to the output dtype, as
    `compare` judges it) does not, by more than the dtype's tolerance; and an overflowed exp always
    marks both of its columns (the device's sigmoid is NaN there, the math's 1). Examples: x0 >= 88.72
    without clamp (NaN); a flushed exp meeting x1 = +-inf (NaN where the math gives +-inf); ``gy *
    x1`` or ``gy * weight`` beyond the fp32 range where the true gradient is finite (inf); a masked
    overflow (NaN where the math gives 0). NaN inputs are NaN in both and are not marked.

    Without ``grad_y`` the steps are followed for gy = 1 (what depends on x alone); ``weight`` (fp32,
    T elements) is the MoE weight if the call has one. Rows t >= trunc are never marked.
    """
    rows, h = _check_x(x, allow_f64=True)
    c = _check_clamp(clamp_limit)
    trunc = _trunc(group_index, rows)
    if grad_y is not None:
        _check_data("grad_y", grad_y)
        if grad_y.shape != x.shape[:-1] + (h,):
            raise ValueError(f"grad_y must have shape {x.shape[:-1] + (h,)} for x {x.shape}, got {grad_y.shape}")
    if weight is not None:
        if not isinstance(weight, np.ndarray) or weight.dtype != _F32 or weight.size != rows:
            raise ValueError(f"weight must be a float32 numpy.ndarray of T = {rows} elements")
    out_dt = _F32 if x.dtype == _F64 else x.dtype
    tol = TOLERANCES[out_dt.name][0]
    mask = np.zeros(x.shape, dtype=bool)
    m2 = mask.reshape(rows, 2 * h)
    x2 = x.reshape(rows, 2 * h)
    gy2 = None if grad_y is None else grad_y.reshape(rows, h)
    w1 = None if weight is None else weight.reshape(rows)
    step = _chunk_rows(2 * h)
    scratch = _Scratch(step, h)
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        for r0 in range(0, trunc, step):
            r1 = min(trunc, r0 + step)
            x0o = x2[r0:r1, :h].astype(np.float32)
            x1o = x2[r0:r1, h:].astype(np.float32)
            gy = np.ones_like(x0o) if gy2 is None else gy2[r0:r1].astype(np.float32)
            gy64 = gy.astype(np.float64)
            if w1 is not None:
                gy64 *= w1[r0:r1, None]                 # exact: a product of two fp32 values
                gy = gy * w1[r0:r1, None]               # fp32: may overflow
            device = _device_rows(gy, x0o, x1o, c).astype(out_dt).astype(np.float64)
            golden = np.empty((r1 - r0, 2 * h))
            _rows(0, r1 - r0, gy64, x2[r0:r1], None, None, c, golden, None, scratch)
            rounded = golden.astype(out_dt).astype(np.float64)
            differs = _classes(device) != _classes(rounded)
            flushed = (device == 0) & np.isfinite(golden) & (np.abs(golden) > tol + tol * np.abs(golden))
            overflowed = (np.minimum(x0o, c) if c is not None else x0o) >= EXP_OVERFLOW_X
            m2[r0:r1] = differs | flushed | np.concatenate([overflowed, overflowed], axis=1)
    return mask


# ----------------------------------------------------------------------------- the verdict


@dataclass
class Comparison:
    """Verdict and figures of one output against the float64 reference (docs/operator.md (judging a result))."""

    passed: bool
    dtype: str
    count: int
    failures: int
    fail_fraction: float
    allowed_fraction: float
    tol: float
    max_abs_error: float
    mere: float
    mare: float
    mere_ok: bool
    mare_ok: bool
    threshold: float
    nan_mismatch: int
    inf_mismatch: int
    departures: int
    departures_nan: int
    worst_index: tuple[int, ...] | None

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        head = (
            f"{'PASS' if self.passed else 'FAIL'} {self.dtype}: {self.failures}/{self.count} failing "
            f"({self.fail_fraction:.3g} vs allowed {self.allowed_fraction:.3g}, tol {self.tol:g}), "
            f"max abs error {self.max_abs_error:.3g}"
        )
        if self.worst_index is not None:
            head += f" at {self.worst_index}"
        tail = (
            f"  MERE {self.mere:.3g} {'<' if self.mere_ok else '>='} {self.threshold:.3g}, "
            f"MARE {self.mare:.3g} {'<' if self.mare_ok else '>='} {10 * self.threshold:.3g} (information); "
            f"NaN mismatches {self.nan_mismatch}, inf mismatches {self.inf_mismatch}; "
            f"device departures {self.departures} excluded ({self.departures_nan} NaN in actual)"
        )
        return head + "\n" + tail

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["worst_index"] = None if self.worst_index is None else [int(i) for i in self.worst_index]
        return d


def _resolve_out_dtype(dtype: Any, actual: np.ndarray) -> np.dtype:
    dt = actual.dtype if dtype is None else as_dtype(dtype)
    if not _is_data_dtype(dt):
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dt}")
    return dt


def _classes(v: np.ndarray) -> np.ndarray:
    """0 finite, 1 NaN, 2 +inf, 3 -inf."""
    cls = np.zeros(v.shape, dtype=np.int8)
    cls[np.isnan(v)] = 1
    cls[v == np.inf] = 2
    cls[v == -np.inf] = 3
    return cls


def compare(actual: np.ndarray, golden: np.ndarray, dtype: Any = None,
            departures: Optional[np.ndarray] = None) -> Comparison:
    """Judge ``actual`` against the float64 ``golden`` per docs/operator.md (judging a result).

    ``dtype`` is the output dtype (default ``actual.dtype``); the golden rounded to it decides
    which positions must be NaN or +-inf. ``departures`` (bool mask) excludes positions where
    the device formula departs from the math; they are counted, not judged.
    """
    if not isinstance(actual, np.ndarray):
        raise TypeError(f"actual must be a numpy.ndarray, got {type(actual).__name__}")
    golden = np.asarray(golden)
    if golden.dtype.kind != "f" and not is_bfloat16(golden.dtype):
        raise TypeError(f"golden must be a floating-point array, got {golden.dtype}")
    if actual.dtype.kind != "f" and not is_bfloat16(actual.dtype):
        raise TypeError(f"actual must be a floating-point array, got {actual.dtype}")
    if actual.shape != golden.shape:
        raise ValueError(f"actual and golden shapes differ: {actual.shape} vs {golden.shape}")
    out_dt = _resolve_out_dtype(dtype, actual)
    name = out_dt.name
    tol, allowed, th = TOLERANCES[name]

    a_flat = actual.reshape(-1)
    g_flat = golden.reshape(-1)
    if departures is not None:
        departures = np.asarray(departures)
        if departures.dtype != np.bool_:
            raise TypeError(f"departures must be a bool mask, got {departures.dtype}")
        if departures.shape != actual.shape:
            raise ValueError(f"departures must have shape {actual.shape}, got {departures.shape}")
        d_flat = departures.reshape(-1)

    count = failures = nan_mm = inf_mm = n_dep = n_dep_nan = 0
    n_finite = 0
    rel_sum = 0.0
    mare = 0.0
    max_abs = 0.0
    worst_score = -1.0
    worst_flat = None
    first_mismatch = None

    step = 1 << 20
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        for i0 in range(0, a_flat.size, step):
            i1 = min(a_flat.size, i0 + step)
            a = a_flat[i0:i1].astype(np.float64)
            g = g_flat[i0:i1].astype(np.float64)
            gc = g.astype(out_dt).astype(np.float64)
            if departures is not None:
                dep = d_flat[i0:i1]
                n_dep += int(np.count_nonzero(dep))
                n_dep_nan += int(np.count_nonzero(dep & np.isnan(a)))
                keep = ~dep
            else:
                keep = np.ones(a.shape, dtype=bool)
            count += int(np.count_nonzero(keep))

            ca, cg = _classes(a), _classes(gc)
            mism = keep & (ca != cg)
            nan_m = mism & ((ca == 1) | (cg == 1))
            inf_m = mism & ~nan_m
            nan_mm += int(np.count_nonzero(nan_m))
            inf_mm += int(np.count_nonzero(inf_m))
            if first_mismatch is None and mism.any():
                first_mismatch = i0 + int(np.flatnonzero(mism)[0])

            both = keep & (ca == 0) & (cg == 0)
            af, gf = a[both], g[both]
            err = np.abs(af - gf)
            bound = tol + tol * np.abs(gf)
            failures += int(np.count_nonzero(err > bound)) + int(np.count_nonzero(mism))
            if err.size:
                n_finite += err.size
                rel = err / (np.abs(gf) + 1e-7)
                rel_sum += float(np.sum(rel))
                mare = max(mare, float(np.max(rel)))
                max_abs = max(max_abs, float(np.max(err)))
                score = err / bound
                k = int(np.argmax(score))
                if float(score[k]) > worst_score:
                    worst_score = float(score[k])
                    worst_flat = i0 + int(np.flatnonzero(both)[k])

    mere = rel_sum / n_finite if n_finite else 0.0
    fail_fraction = failures / count if count else 0.0
    passed = nan_mm == 0 and inf_mm == 0 and fail_fraction <= allowed
    where = first_mismatch if first_mismatch is not None else worst_flat
    worst_index = None
    if where is not None:
        worst_index = tuple(int(i) for i in np.unravel_index(where, actual.shape))
    return Comparison(
        passed=bool(passed),
        dtype=name,
        count=count,
        failures=failures,
        fail_fraction=float(fail_fraction),
        allowed_fraction=float(allowed),
        tol=float(tol),
        max_abs_error=float(max_abs),
        mere=float(mere),
        mare=float(mare),
        mere_ok=bool(mere < th),
        mare_ok=bool(mare < 10 * th),
        threshold=float(th),
        nan_mismatch=nan_mm,
        inf_mismatch=inf_mm,
        departures=n_dep,
        departures_nan=n_dep_nan,
        worst_index=worst_index,
    )


# ============================================================================= the forward
# aclnnSwigluGroupQuant, quant modes 0 and 1 (docs/forward.md): y = silu(x0) * x1 (clamped,
# times the weight) in float64, rounded once to fp32 (the device holds y in fp32), then the
# documented quantisation rules, their fp32 products included: the block / group maximum, the
# 1e-4 floor, s = amax * fp32(1/max), the power-of-two scale rule on s's bits, round-half-even
# casts. So a device result departs from this reference only through the few ulps of its own
# fp32 SwiGLU (exp, division) and, in mode 0 without round_scale, its M / amax division.

_FWD_BLOCK = 128
_FWD_GROUP = 32
_AMAX_FLOOR = np.float32(1e-4)                       # 0x38D1B717
_FP8_FACTOR = {"float8_e4m3fn": np.uint32(0x3B124925), "float8_e5m2": np.uint32(0x37924925)}   # fp32(1/max)
_FP8_NAN = {"float8_e4m3fn": 0x7F, "float8_e5m2": 0x7E}
_FWD_EMAX_KEY = {"float4_e2m1fn": 0x0100, "float4_e1m2": 0x0000}
_FWD_STICKY = {"float4_e2m1fn": 0x00FF, "float4_e1m2": 0x007F}
_FWD_NOT_EMULATED = {2: "static HiFloat8", 3: "dynamic HiFloat8", 5: "the dual-axis MX mode of aclnnSwigluGroupQuantV2"}
_FWD_CHUNK_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class _Forward:
    """A checked forward call: T, H, trunc, the destination type, the mode and its options."""

    rows: int
    hidden: int
    trunc: int
    dst: _formats.DstType
    quant_mode: int
    round_scale: bool
    clamp: Optional[np.float32]
    x_dtype: np.dtype

    @property
    def per_scale(self) -> int:
        return _FWD_BLOCK if self.quant_mode == 0 else _FWD_GROUP

    @property
    def y_shape_tail(self) -> Tuple[int, ...]:
        return (self.hidden // 2,) if self.dst.packed else (self.hidden,)

    @property
    def scale_tail(self) -> Tuple[int, ...]:
        groups = self.hidden // _FWD_GROUP
        return (self.hidden // _FWD_BLOCK,) if self.quant_mode == 0 else ((groups + 1) // 2, 2)


def _check_forward(x: object, weight: object, group_index: object, dst_type: object, quant_mode: object,
                   block_size: object, round_scale: object, clamp_limit: object) -> _Forward:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != _F16 and not is_bfloat16(x.dtype):
        raise TypeError(f"x must have dtype float16 or bfloat16 (quant modes 0 and 1), got {x.dtype}")
    if isinstance(quant_mode, (bool, np.bool_)) or not isinstance(quant_mode, (int, np.integer)):
        raise TypeError(f"quant_mode must be an int (0 or 1), got {type(quant_mode).__name__}")
    mode = int(quant_mode)
    if mode in _FWD_NOT_EMULATED:
        raise ValueError(f"quant_mode {mode} ({_FWD_NOT_EMULATED[mode]}) is not emulated: quant modes 0 (block FP8) "
                         "and 1 (MX FP8/FP4) are")
    if mode not in (0, 1):
        raise ValueError(f"quant_mode must be 0 (block FP8) or 1 (MX), got {mode}")
    dst = _formats.as_dst_type(dst_type)
    if mode not in dst.quant_modes:
        if dst.name == "hifloat8":
            raise ValueError("dst_type 'hifloat8' belongs to quant modes 2 and 3, which are not emulated")
        raise ValueError(f"dst_type {dst.name!r} needs quant_mode {' or '.join(map(str, dst.quant_modes))}, got {mode}")
    if not 2 <= x.ndim <= (_MAX_RANK if mode == 0 else _MAX_RANK - 1):
        raise ValueError(f"x must have rank 2..{_MAX_RANK if mode == 0 else _MAX_RANK - 1} in quant_mode {mode}, "
                         f"got shape {x.shape}")
    rows = math.prod(x.shape[:-1])
    if rows == 0:
        raise ValueError(f"x must not be empty (T = 0 rows), got shape {x.shape}")
    width = x.shape[-1]
    if width < 256 or width % 256:
        raise ValueError(f"x's last dimension must be a multiple of 256 (2H, H a multiple of 128), got shape {x.shape}")
    if weight is not None:
        if not isinstance(weight, np.ndarray):
            raise TypeError(f"weight must be a numpy.ndarray, got {type(weight).__name__}")
        if weight.dtype != _F32:
            raise TypeError(f"weight must have dtype float32, got {weight.dtype}")
        if not 1 <= weight.ndim <= _MAX_RANK or weight.size != rows:
            raise ValueError(f"weight must hold T = {rows} elements (one per row) in 1..8 dims, got shape {weight.shape}")
    trunc = rows
    if group_index is not None:
        gi = np.asarray(group_index)
        if gi.dtype == np.bool_ or not np.issubdtype(gi.dtype, np.integer):
            raise TypeError(f"group_index must have an integer dtype (int64), got {gi.dtype}")
        if gi.ndim != 1 or gi.size == 0:
            raise ValueError(f"group_index must be 1-D [G] with G > 0, got shape {gi.shape}")
        # The counts are summed in int64 (wrapping); rows from the sum on are not computed.
        total = int(np.sum(gi.astype(np.int64), dtype=np.int64))
        trunc = max(0, min(total, rows))
    if isinstance(block_size, (bool, np.bool_)) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
    block = _FWD_BLOCK if mode == 0 else _FWD_GROUP
    if int(block_size) not in (0, block):
        raise ValueError(f"block_size must be 0 or {block} in quant_mode {mode}, got {block_size}")
    if not isinstance(round_scale, (bool, np.bool_)):
        raise TypeError(f"round_scale must be a bool, got {type(round_scale).__name__}")
    if mode == 1 and not round_scale:
        raise ValueError("round_scale must be True in quant_mode 1 (MX scales are powers of two)")
    return _Forward(rows, width // 2, trunc, dst, mode, bool(round_scale) or mode == 1, _check_clamp(clamp_limit),
                    x.dtype)


def _ulp32(v: np.ndarray) -> np.ndarray:
    """The fp32 ulp at |v| (float64; the ulp of the largest finite float for inf, NaN for NaN)."""
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(v).astype(np.float32)
        ulp: np.ndarray = np.spacing(np.minimum(a, np.float32(np.finfo(np.float32).max))).astype(np.float64)
    return ulp


def _pow2_exponent(s: np.ndarray) -> np.ndarray:
    """ceil(log2 s) of fp32 s from its bits: the exponent field - 127, plus 1 for a non-zero mantissa."""
    u = np.ascontiguousarray(s, dtype=np.float32).view(np.uint32)
    exponent: np.ndarray = ((u >> 23) & 0xFF).astype(np.int64) - 127 + ((u & 0x7FFFFF) != 0)
    return exponent


def _bits_f32(u: np.ndarray) -> np.ndarray:
    return (np.asarray(u, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def _fp8_codes(q: np.ndarray, name: str) -> np.ndarray:
    """fp32 -> FP8 codes, round half to even, not saturating; NaN stored as the emulator's code."""
    with np.errstate(all="ignore"):
        codes = np.ascontiguousarray(q, dtype=np.float32).astype(_formats.as_dst_type(name).storage_dtype)
    codes_u8: np.ndarray = codes.view(np.uint8).copy()
    nan = np.isnan(q)
    if name == "float8_e4m3fn":
        nan |= (codes_u8 & 0x7F) == 0x7F      # overflow and inf: NaN of either sign
    codes_u8[nan] = _FP8_NAN[name]
    return codes_u8


@dataclass
class _Rows:
    """The reference for some rows: codes [r, H] (FP4 unpacked), scales [r, S] (float32, or the
    E8M0 bytes), the value each code rounds (float64, after scaling), how far a device's value
    may lie from it (the window), where a power-of-two scale sits on a step (boundary), and the
    multiplier per block."""

    codes: np.ndarray
    scales: np.ndarray
    value: np.ndarray
    window: np.ndarray
    boundary: np.ndarray
    multiplier: np.ndarray


_FLT_MIN = float(np.finfo(np.float32).tiny)


def _flush_subnormal(v: np.ndarray) -> np.ndarray:
    """fp32-subnormal magnitudes to zero of the same sign (float64 arrays)."""
    flushed: np.ndarray = np.where(np.abs(v) < _FLT_MIN, np.copysign(0.0, v), v)
    return flushed


def _forward_y(f: _Forward, x2: np.ndarray, w1: Optional[np.ndarray], r0: int, r1: int) -> np.ndarray:
    """y in float64: the swish x0 / (1 + exp(-x0)) times x1 (and the weight), with the two
    places where the operator's fp32 formula departs from the math by construction kept: exp(-x0)
    is +inf from x0 <= -88.72283935546875 on (the swish is -0 there, so -0 * inf is NaN), and the
    division reads an fp32-subnormal operand, and gives an fp32-subnormal quotient, as 0."""
    h = f.hidden
    x0, x1 = _clamped(_widen(x2[r0:r1, :h]), _widen(x2[r0:r1, h:]), f.clamp)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        e = np.exp(-x0)
        e[-x0 >= EXP_OVERFLOW_X] = np.inf
        swish = _flush_subnormal(_flush_subnormal(x0) / (1.0 + e))   # x0 = -inf: -inf / inf = NaN
        y: np.ndarray = swish * x1
        if w1 is not None:
            y *= w1[r0:r1, None].astype(np.float64)
    return y


def _fp8_rows(f: _Forward, y64: np.ndarray, ulps: float) -> _Rows:
    name = f.dst.name
    r, h = y64.shape
    n = f.per_scale
    with np.errstate(all="ignore"):
        y64 = y64 + 0.0                              # the +0 step: -0 becomes +0
        yf = y64.astype(np.float32)
        blocks = yf.reshape(r, h // n, n)
        a = np.abs(blocks)
        if f.quant_mode == 0:
            a = np.where(np.isfinite(a), a, np.float32(0))      # inf and NaN count as 0
            amax = a.max(axis=-1)
        else:
            amax = np.where(np.isnan(a).any(axis=-1), np.float32(np.nan), a.max(axis=-1))
        amax = np.where(np.isnan(amax) | (amax > _AMAX_FLOOR), amax, _AMAX_FLOOR).astype(np.float32)
        factor = np.uint32(_FP8_FACTOR[name]).view(np.float32)
        s = (amax * factor).astype(np.float32)
        e = _pow2_exponent(s)
        scales: np.ndarray
        if f.quant_mode == 1:
            scales = ((e + 127) & 0xFF).astype(np.uint8)
            inv = _bits_f32((127 - e) << 23)
        elif f.round_scale:
            scales = _bits_f32((e + 127) << 23)
            inv = _bits_f32((127 - e) << 23)
        else:
            scales = s
            inv = (np.float32(f.dst.max) / amax).astype(np.float32)
        q = blocks * inv[..., None]
        value = y64.reshape(r, h // n, n) * inv[..., None].astype(np.float64)
        if f.quant_mode == 0:
            finite = np.isfinite(q)
            q = np.where(finite, q, blocks)
            value = np.where(finite, value, blocks.astype(np.float64))
        # A power-of-two scale is on a step when amax a few ulps either way gives another exponent.
        boundary = np.zeros(amax.shape, dtype=bool)
        if f.round_scale:
            spread = amax.astype(np.float64) * (ulps * 2.0 ** -23)
            lo = ((amax - spread).astype(np.float32) * factor).astype(np.float32)
            hi = ((amax + spread).astype(np.float32) * factor).astype(np.float32)
            boundary = np.isfinite(amax) & (_pow2_exponent(lo) != _pow2_exponent(hi))
    codes = _fp8_codes(q.reshape(r, h), name)
    value = value.reshape(r, h)
    with np.errstate(invalid="ignore"):
        window = np.nan_to_num(ulps * _ulp32(value))
    return _Rows(codes, scales, value, window, boundary, inv)


def _fp4_operand_bf16(v16: np.ndarray, fp16: bool, name: str) -> np.ndarray:
    """The bf16 operand of the FP4 scaling (as float32): fp16 v with the sticky bit folded into
    bit 3 and truncated to bf16; bf16 v as is."""
    if not fp16:
        return (v16.astype(np.uint32) << 16).view(np.float32)
    low = v16 & _FWD_STICKY[name]
    bits = np.where((low > 0) & (low < 8), v16 | 0x0008, v16).astype(np.uint16)
    widened = bits.view(np.float16).astype(np.float32).view(np.uint32)
    truncated: np.ndarray = (widened & np.uint32(0xFFFF0000)).view(np.float32)
    return truncated


def _fp4_key(v16: np.ndarray, fp16: bool) -> np.ndarray:
    if not fp16:
        return (v16 & 0x7F80).astype(np.int64)
    widened = (v16.view(np.float16).astype(np.float32).view(np.uint32) >> 16) & 0x7F80
    return np.where((v16 & 0x7C00) == 0x7C00, 0x7F80, widened).astype(np.int64)


def _fp4_recip(key: np.ndarray, name: str) -> Tuple[np.ndarray, np.ndarray]:
    """(E8M0 bytes, bf16 multiplier bits) from the groups' exponent keys."""
    emax = _FWD_EMAX_KEY[name]
    shift = np.maximum(key, emax) - emax
    scales = np.where(key == 0x7F80, 0xFF, np.where(key == 0, 0, shift >> 7)).astype(np.uint8)
    recip = (0x7F00 - shift) & 0xFFFF
    recip = np.where(key == 0x7F80, 0x7F81, recip)
    recip = np.where(key == 0, 0, recip)
    recip = np.where(shift == 0x7F00, 0x0040, recip)
    return scales, recip.astype(np.uint32)


def _fp4_rows(f: _Forward, y64: np.ndarray, ulps: float) -> _Rows:
    name = f.dst.name
    fp16 = f.x_dtype == _F16
    r, h = y64.shape
    n = _FWD_GROUP
    with np.errstate(all="ignore"):
        yf = y64.astype(np.float32)                  # no +0 step on this path
        v = yf.astype(f.x_dtype)                     # y rounded to x's dtype
        v16 = np.ascontiguousarray(v).view(np.uint16).reshape(r, h // n, n)
        key = _fp4_key(v16, fp16).max(axis=-1)
        scales, recip = _fp4_recip(key, name)
        recip_f = (recip << 16).view(np.float32)
        operand = _fp4_operand_bf16(v16, fp16, name)
        product = (operand * recip_f[..., None]).astype(np.float32)
        p = product.astype(bfloat16_dtype()).astype(np.float64)
        codes = _formats._fp4_codes(p, f.dst)
        value = y64.reshape(r, h // n, n) * recip_f[..., None].astype(np.float64)
        # y is rounded to x's 16-bit format before anything else: a device's value may lie one
        # such ulp (at the scaled value) from the reference's.
        ulp16 = np.abs(np.spacing(np.abs(v).astype(f.x_dtype)).astype(np.float64)) if fp16 else \
            np.ldexp(1.0, np.frexp(np.abs(v.astype(np.float64)))[1] - 8)
        window = ulp16.reshape(r, h // n, n) * recip_f[..., None].astype(np.float64)
        amax = np.abs(yf).reshape(r, h // n, n).max(axis=-1)
        spread = amax.astype(np.float64) * (ulps * 2.0 ** -23)
        lo = (amax - spread).astype(np.float32).astype(f.x_dtype)
        hi = (amax + spread).astype(np.float32).astype(f.x_dtype)
        lo16 = np.ascontiguousarray(lo).view(np.uint16)
        hi16 = np.ascontiguousarray(hi).view(np.uint16)
        boundary = np.isfinite(amax) & (_fp4_key(lo16, fp16) != _fp4_key(hi16, fp16))
    return _Rows(codes.reshape(r, h), scales, value.reshape(r, h), np.nan_to_num(window.reshape(r, h)), boundary,
                 recip_f)


def _forward_rows(f: _Forward, x2: np.ndarray, w1: Optional[np.ndarray], r0: int, r1: int, ulps: float) -> _Rows:
    y64 = _forward_y(f, x2, w1, r0, r1)
    return _fp4_rows(f, y64, ulps) if f.dst.packed else _fp8_rows(f, y64, ulps)


def _forward_out(f: _Forward, x: np.ndarray, out: object) -> Tuple[np.ndarray, np.ndarray]:
    y_shape = x.shape[:-1] + f.y_shape_tail
    s_shape = x.shape[:-1] + f.scale_tail
    y_dtype = f.dst.storage_dtype
    s_dtype = _F32 if f.quant_mode == 0 else np.dtype(np.uint8)
    if out is None:
        return np.zeros(y_shape, dtype=y_dtype), np.zeros(s_shape, dtype=s_dtype)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out must be a (y, y_scale) pair, got {type(out).__name__}")
    checked: List[np.ndarray] = []
    for name, arr, shape, dtype in (("out[0] (y)", out[0], y_shape, y_dtype), ("out[1] (y_scale)", out[1], s_shape, s_dtype)):
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{name} must be a numpy.ndarray, got {type(arr).__name__}")
        if arr.dtype.name == "float8_e8m0fnu" and f.quant_mode == 1 and name.startswith("out[1]"):
            arr = arr.view(np.uint8)
        if arr.dtype != dtype:
            raise TypeError(f"{name} must have dtype {dtype}{' or float8_e8m0fnu' if f.quant_mode == 1 and dtype == np.uint8 else ''}, got {arr.dtype}")
        if arr.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            raise ValueError(f"{name} must be C-contiguous and writeable")
        if np.may_share_memory(arr, x) or any(np.may_share_memory(arr, other) for other in checked):
            raise ValueError(f"{name} must not share memory with x or the other output")
        checked.append(arr)
    return checked[0], checked[1]


def swiglu_group_quant(x: np.ndarray, weight: Optional[np.ndarray] = None,
                       group_index: Union[np.ndarray, Sequence[int], None] = None, *, dst_type: Any,
                       quant_mode: int = 0, block_size: int = 0, round_scale: bool = False,
                       clamp_limit: Optional[float] = None,
                       out: Optional[Tuple[np.ndarray, np.ndarray]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Reference of aclnnSwigluGroupQuant, quant modes 0 and 1: ``(y, y_scale)`` in the storage a
    device gives them.

    x [..., 2H] float16 or bfloat16 (x[..., :H] is the gate), weight float32 with one element per
    row, group_index int counts (rows from their sum on are not computed), ``dst_type`` one of
    acl_swiglu.formats.DST_TYPES (a name or an ml_dtypes dtype). quant_mode 0: FP8 codes with one
    float32 scale per 128 elements (powers of two with round_scale); quant_mode 1: MX, one E8M0
    scale per 32 elements, FP8 or FP4 (round_scale must be True). ``clamp_limit`` None is off.

    Returns y [..., H] as the ml_dtypes FP8 dtype, or [..., H/2] uint8 with two FP4 codes a byte
    (element 2i low nibble); y_scale [..., H/128] float32 (mode 0) or [..., H/64, 2] as
    ml_dtypes.float8_e8m0fnu (mode 1). Rows t >= trunc are zero, or, with ``out=(y, y_scale)``
    (arrays of those dtypes and shapes; for mode 1 scales uint8 bytes or float8_e8m0fnu), left as
    they were, as the device leaves the caller's buffers.

    The math is float64: y = x0 / (1 + exp(-x0)) * x1 (x0 = min(x0, c), x1 = clip(x1, -c, c))
    times the weight, rounded once to fp32; then the documented quantisation (docs/forward.md).
    Two properties of the operator's fp32 swish are kept because they are not rounding noise:
    from x0 <= -88.72283935546875 on exp(-x0) overflows and the swish is -0 (so -0 * inf = NaN),
    and the division reads fp32-subnormal operands and quotients as 0. NaN codes are the
    emulator's (E4M3FN 0x7F, E5M2 0x7E, FP4 NaN as +0).
    """
    f = _check_forward(x, weight, group_index, dst_type, quant_mode, block_size, round_scale, clamp_limit)
    y_out, s_out = _forward_out(f, x, out)
    s_bytes = s_out.view(np.uint8) if f.quant_mode == 1 else s_out
    y2 = y_out.reshape(f.rows, -1).view(np.uint8) if not f.dst.packed else y_out.reshape(f.rows, -1)
    s2 = s_bytes.reshape(f.rows, -1)
    x2 = x.reshape(f.rows, 2 * f.hidden)
    w1 = None if weight is None else weight.reshape(f.rows)
    step = max(1, _FWD_CHUNK_ELEMENTS // (2 * f.hidden))
    for r0 in range(0, f.trunc, step):
        r1 = min(f.trunc, r0 + step)
        rows = _forward_rows(f, x2, w1, r0, r1, 0.0)
        if f.dst.packed:
            y2[r0:r1] = rows.codes[:, 0::2] | (rows.codes[:, 1::2] << 4)
        else:
            y2[r0:r1] = rows.codes
        s2[r0:r1] = rows.scales
    if f.quant_mode == 1:
        return y_out, _formats.e8m0_view(s_out.view(np.uint8))
    return y_out, s_out


@dataclass
class QuantComparison:
    """Verdict and figures of a quantised result (y codes and y_scale) against the reference.

    Rows past trunc are not judged. Codes: NaN and +-inf positions (and inf signs) must match;
    another code passes when it is the reference's, or the reference's neighbour where the
    reference's value (before the cast, after the scaling) lies within the window of the
    midpoint between the two (``near_midpoint``): a few fp32 ulps for FP8, one ulp of x's format
    for FP4, where y is rounded to it first. Scales: powers of two (mode 1, round_scale) must be
    equal unless the reference's amax a few ulps either way gives another exponent
    (``scale_boundary``; that block's codes are then judged at the result's scale); mode 0's fp32
    scales without round_scale may differ by ``scale_ulps``. Where the operator's fp32 swish
    departs from the math by construction (exp overflowing for x0 <= -88.72, subnormal operands
    and quotients of its division), the reference follows the operator (see
    `swiglu_group_quant`), so every element is judged."""

    passed: bool
    dst_type: str
    quant_mode: int
    rows_judged: int
    count: int
    exact: int
    near_midpoint: int
    code_mismatches: int
    nan_mismatch: int
    inf_mismatch: int
    scale_count: int
    scale_mismatches: int
    scale_boundary: int
    max_scale_ulps: int
    worst_index: Optional[Tuple[int, ...]]

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        head = (f"{'PASS' if self.passed else 'FAIL'} {self.dst_type} mode {self.quant_mode}: "
                f"{self.code_mismatches}/{self.count} codes wrong, {self.near_midpoint} one step off at a rounding "
                f"midpoint, {self.exact} exact; NaN mismatches {self.nan_mismatch}, inf mismatches {self.inf_mismatch}")
        if self.worst_index is not None:
            head += f"; first wrong at {self.worst_index}"
        tail = (f"  scales: {self.scale_mismatches}/{self.scale_count} wrong, {self.scale_boundary} on an exponent step, "
                f"max {self.max_scale_ulps} ulps apart; {self.rows_judged} rows judged")
        return head + "\n" + tail

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["worst_index"] = None if self.worst_index is None else [int(i) for i in self.worst_index]
        return d


def _decoded(codes: np.ndarray, dst: _formats.DstType) -> np.ndarray:
    """float64 values of uint8 codes (FP4: one code per byte, unpacked)."""
    if dst.packed:
        table = np.concatenate([_formats._FP4_VALUES[dst.name], -_formats._FP4_VALUES[dst.name]])
        values: np.ndarray = table[codes & 0x0F]
        return values
    return codes.view(dst.storage_dtype).astype(np.float64)


def _result_arrays(f: _Forward, x: np.ndarray, y: object, y_scale: object) -> Tuple[np.ndarray, np.ndarray]:
    """The result as uint8 codes [T, H] (FP4 unpacked) and scales [T, S] (float32 or E8M0 bytes)."""
    if not isinstance(y, np.ndarray) or not isinstance(y_scale, np.ndarray):
        raise TypeError("y and y_scale must be numpy.ndarrays")
    y_shape = x.shape[:-1] + f.y_shape_tail
    if y.shape != y_shape:
        raise ValueError(f"y must have shape {y_shape}, got {y.shape}")
    if f.dst.packed or y.dtype == np.uint8:
        if y.dtype != np.uint8:
            raise TypeError(f"y of {f.dst.name} must be packed uint8, got {y.dtype}")
        codes = y.reshape(f.rows, -1)
    elif y.dtype == f.dst.storage_dtype:
        codes = y.reshape(f.rows, -1).view(np.uint8)
    else:
        raise TypeError(f"y must have dtype {f.dst.storage_dtype} (or its uint8 bytes), got {y.dtype}")
    if f.dst.packed:
        unpacked = np.empty((f.rows, f.hidden), dtype=np.uint8)
        unpacked[:, 0::2] = codes & 0x0F
        unpacked[:, 1::2] = codes >> 4
        codes = unpacked
    s_shape = x.shape[:-1] + f.scale_tail
    if y_scale.shape != s_shape:
        raise ValueError(f"y_scale must have shape {s_shape}, got {y_scale.shape}")
    if f.quant_mode == 0:
        if y_scale.dtype != _F32:
            raise TypeError(f"y_scale must have dtype float32 in quant_mode 0, got {y_scale.dtype}")
        scales = y_scale.reshape(f.rows, -1)
    else:
        scales = _formats._e8m0_bytes(y_scale).reshape(f.rows, -1)[:, :f.hidden // _FWD_GROUP]
    return codes, scales


def _rejudged(f: _Forward, y64: np.ndarray, scales: np.ndarray, ref: _Rows, redo: np.ndarray, ulps: float) -> None:
    """Codes and values of the blocks in `redo` (a power-of-two scale one step from the
    reference's) recomputed at the result's own scale, in place in `ref`."""
    r, h = y64.shape
    n = f.per_scale
    blocks = np.nonzero(redo)
    dev = scales[blocks].astype(np.int64) if f.quant_mode == 1 else _pow2_exponent(scales[blocks]) + 127
    if f.dst.packed:
        shift = dev << 7
        multiplier = _bits_f32(((0x7F00 - shift) & 0xFFFF) << 16)
    else:
        multiplier = _bits_f32((254 - dev) << 23)     # 2^-E from the scale 2^E
    for (t, b), m in zip(zip(*blocks), multiplier):
        cols = slice(b * n, (b + 1) * n)
        y = y64[t, cols]
        if f.dst.packed:
            fp16 = f.x_dtype == _F16
            v16 = np.ascontiguousarray(y.astype(np.float32).astype(f.x_dtype)).view(np.uint16)
            product = (_fp4_operand_bf16(v16, fp16, f.dst.name) * np.float32(m)).astype(np.float32)
            ref.codes[t, cols] = _formats._fp4_codes(product.astype(bfloat16_dtype()).astype(np.float64), f.dst)
            ref.window[t, cols] *= float(m) / float(ref.multiplier[t, b]) if ref.multiplier[t, b] else 0.0
        else:
            with np.errstate(all="ignore"):
                y = y + 0.0
                q = (y.astype(np.float32) * np.float32(m)).astype(np.float32)
            ref.codes[t, cols] = _fp8_codes(q, f.dst.name)
            ref.window[t, cols] = ulps * _ulp32(y * float(m))
        ref.value[t, cols] = y * float(m)


def compare_quantised(y: np.ndarray, y_scale: np.ndarray, x: np.ndarray, weight: Optional[np.ndarray] = None,
                      group_index: Union[np.ndarray, Sequence[int], None] = None, *, dst_type: Any,
                      quant_mode: int = 0, block_size: int = 0, round_scale: bool = False,
                      clamp_limit: Optional[float] = None, ulps: float = 4.0, scale_ulps: int = 4) -> QuantComparison:
    """Judge a quantised result ``(y, y_scale)`` of these inputs against the reference (see
    `QuantComparison` for the rules). y and y_scale are in the storage `swiglu_group_quant`
    returns (FP8 as ml_dtypes or uint8 bytes, FP4 packed uint8, E8M0 scales as float8_e8m0fnu or
    uint8). ``ulps``: the window around a rounding midpoint, in fp32 ulps of the reference's value
    (the device's fp32 y carries up to about three: its exp and division are 1-ulp operations);
    ``scale_ulps``: how far mode 0's exact fp32 scales may lie apart."""
    f = _check_forward(x, weight, group_index, dst_type, quant_mode, block_size, round_scale, clamp_limit)
    if not (isinstance(ulps, (int, float)) and ulps >= 0) or isinstance(ulps, bool):
        raise ValueError(f"ulps must be a number >= 0, got {ulps!r}")
    codes, scales = _result_arrays(f, x, y, y_scale)
    x2 = x.reshape(f.rows, 2 * f.hidden)
    w1 = None if weight is None else weight.reshape(f.rows)
    step = max(1, _FWD_CHUNK_ELEMENTS // (2 * f.hidden))
    count = exact = near = wrong = nan_mm = inf_mm = 0
    scale_count = scale_wrong = scale_boundary = max_ulps = 0
    first_wrong: Optional[int] = None
    for r0 in range(0, f.trunc, step):
        r1 = min(f.trunc, r0 + step)
        ref = _forward_rows(f, x2, w1, r0, r1, float(ulps))
        got_scales = scales[r0:r1]
        # -- scales
        if f.round_scale:
            differs = got_scales != ref.scales
            allowed = differs & ref.boundary
            scale_boundary += int(np.count_nonzero(allowed))
            scale_wrong += int(np.count_nonzero(differs & ~ref.boundary))
            if allowed.any():
                y64 = _forward_y(f, x2, w1, r0, r1)
                _rejudged(f, y64, got_scales, ref, allowed, float(ulps))
            apart = np.where(differs, 1, 0)
        else:
            a = got_scales.view(np.int32).astype(np.int64)
            b = np.ascontiguousarray(ref.scales, dtype=np.float32).view(np.int32).astype(np.int64)
            apart = np.abs(a - b)
            scale_wrong += int(np.count_nonzero(apart > scale_ulps))
        max_ulps = max(max_ulps, int(apart.max(initial=0)))
        scale_count += got_scales.size
        # -- codes
        got = codes[r0:r1]
        judged = np.ones(got.shape, dtype=bool)
        count += got.size
        gv = _decoded(got, f.dst)
        rv = _decoded(ref.codes, f.dst)
        g_nan, r_nan = np.isnan(gv), np.isnan(rv)
        g_inf, r_inf = np.isinf(gv), np.isinf(rv)
        nan_bad = judged & (g_nan != r_nan)
        with np.errstate(invalid="ignore"):
            inf_bad = judged & ~nan_bad & ((g_inf != r_inf) | (g_inf & r_inf & (np.sign(gv) != np.sign(rv))))
            finite = judged & ~g_nan & ~r_nan & ~g_inf & ~r_inf
            same = finite & (gv == rv)
            alike = same | (judged & g_nan & r_nan) | (judged & g_inf & r_inf & (np.sign(gv) == np.sign(rv)))
            mag_g = (got & (0x07 if f.dst.packed else 0x7F)).astype(np.int64)
            mag_r = (ref.codes & (0x07 if f.dst.packed else 0x7F)).astype(np.int64)
            sign_bit = 0x08 if f.dst.packed else 0x80
            same_sign = ((got & sign_bit) == (ref.codes & sign_bit)) | (mag_g == 0) | (mag_r == 0)
            neighbours = finite & ~same & same_sign & (np.abs(mag_g - mag_r) == 1)
            midpoint = (gv + rv) / 2
            close = np.abs(np.nan_to_num(ref.value) - midpoint) <= ref.window
        one_step = neighbours & close
        bad = nan_bad | inf_bad | (finite & ~same & ~one_step)
        nan_mm += int(np.count_nonzero(nan_bad))
        inf_mm += int(np.count_nonzero(inf_bad))
        exact += int(np.count_nonzero(alike))
        near += int(np.count_nonzero(one_step))
        wrong += int(np.count_nonzero(finite & ~same & ~one_step))
        if first_wrong is None and bad.any():
            first_wrong = r0 * f.hidden + int(np.flatnonzero(bad)[0])
    worst = None
    if first_wrong is not None:
        t, hh = divmod(first_wrong, f.hidden)
        worst = tuple(int(i) for i in np.unravel_index(t, x.shape[:-1])) + (hh,)
    passed = nan_mm == 0 and inf_mm == 0 and wrong == 0 and scale_wrong == 0
    return QuantComparison(passed=bool(passed), dst_type=f.dst.name, quant_mode=f.quant_mode, rows_judged=f.trunc,
                           count=count, exact=exact, near_midpoint=near, code_mismatches=wrong, nan_mismatch=nan_mm,
                           inf_mismatch=inf_mm, scale_count=scale_count,
                           scale_mismatches=scale_wrong, scale_boundary=scale_boundary, max_scale_ulps=max_ulps,
                           worst_index=worst)
