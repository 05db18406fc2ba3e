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

from ._dtypes import as_dtype, is_bfloat16
from ._validate import check_clamp_limit

__all__ = [
    "EXP_FLUSH_X",
    "EXP_OVERFLOW_X",
    "TOLERANCES",
    "Comparison",
    "compare",
    "device_departures",
    "swiglu",
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
