"""Property tests (hypothesis) of the one-shot API on the emulator.

Random shapes (rank 1-4, H 1..80, T 0..40), dtypes (fp32, fp16, bf16), layouts (contiguous,
strided slices, offset slices, transposed, broadcast, reversed), options (weight, clamp values,
group_index with random counts, negatives, wrap-around and G = 0, both ABI revisions where the
rank allows) and values (NaN with any payload, +-inf, -0.0, the dtype's max, tiny normals,
subnormals, arbitrary bit patterns):

* the emulator's output equals tests/device_model.py bit for bit (the model is exact);
* on finite moderate values, the docs/operator.md (judging a result) verdict against the float64 reference passes;
* targeted device behaviour: x0 >= 88.72284 without clamp gives NaN in both columns of that
  position; clamp-masked positions are multiplied by 0 (a finite gradient becomes +-0 with the
  product's sign); rows past trunc are +0 bits whatever the inputs.

Sized to run in well under a minute on 2 cores. With CI set, examples are derandomized and no
example database is used.
"""

from __future__ import annotations

import contextlib
import os
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

sys.path.insert(0, os.path.dirname(__file__))

import device_model  # noqa: E402

import acl_swiglu  # noqa: E402
from acl_swiglu import reference  # noqa: E402

pytestmark = pytest.mark.emulator_only

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
DTYPES = (F32, F16, BF16)
UINT = {F32: np.dtype(np.uint32), F16: np.dtype(np.uint16), BF16: np.dtype(np.uint16)}
FLT_MAX = float(np.finfo(np.float32).max)
X_OVF = reference.EXP_OVERFLOW_X   # float32(88.72284)

CI = bool(os.environ.get("CI"))
# CI: the same examples every run and no example database on disk. Locally: random examples
# and hypothesis' default database (failures are replayed first).
PROFILE = dict(deadline=None, derandomize=True, database=None) if CI else dict(deadline=None)
# The array strategies make large inputs on purpose (up to 40 x 160 elements); generating them
# is slower than hypothesis' default budget for a "large base example", nothing is wrong.
SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large]


def settings_for(examples: int):
    return settings(max_examples=examples, suppress_health_check=SLOW_DATA, **PROFILE)


# ----------------------------------------------------------------------------- values


def to_bits(value: float, dtype) -> int:
    dtype = np.dtype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == BF16:
            return int(np.array([value], np.float32).astype(BF16).view(np.uint16)[0])
        return int(np.array([value], dtype).view(UINT[dtype])[0])


def special_values(dtype) -> list:
    info = ml_dtypes.finfo(dtype) if dtype == BF16 else np.finfo(dtype)
    tiny, smallest_sub, big = float(info.tiny), float(info.smallest_subnormal), float(info.max)
    values = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 0.5, -1.2785, 2.0, -3.0,
              X_OVF, 88.7228, 88.75, 89.0, 100.0, 1000.0, -87.3, -87.4, -88.0, -103.9, -104.0, -105.0, -500.0,
              tiny, -tiny, smallest_sub, -smallest_sub, tiny - smallest_sub, big, -big, big / 2, 1e-30, -1e-30]
    return sorted({to_bits(v, dtype) for v in values})


# Non-canonical NaNs (signalling, negative, payloads): the kernel must store canonical ones.
ODD_NANS = {F32: [0x7F800001, 0xFFC00001, 0x7FFFFFFF, 0xFF800123], F16: [0x7C01, 0xFE00, 0x7FFF, 0xFC11],
            BF16: [0x7F81, 0xFFC1, 0x7FFF, 0xFF85]}


def any_bits(dtype):
    """Element bit patterns: specials, arbitrary bits, and ordinary values."""
    dtype = np.dtype(dtype)
    width = UINT[dtype].itemsize * 8
    return st.one_of(
        st.sampled_from(special_values(dtype) + ODD_NANS[dtype]),
        st.integers(0, 2 ** width - 1),
        st.floats(-100, 100, width=32).map(lambda v: to_bits(v, dtype)),
    )


def bits_value(b: int, dtype) -> float:
    dtype = np.dtype(dtype)
    return float(np.array([b], UINT[dtype]).view(dtype)[0].astype(np.float32))


def finite_bits(dtype, bound=None):
    """Any finite value of the dtype (|v| <= bound when given), huge and subnormal included."""
    dtype = np.dtype(dtype)
    width = UINT[dtype].itemsize * 8

    top_exponent_bit = 1 << (width - 2)

    def finite(b):
        v = bits_value(b, dtype)
        return bool(np.isfinite(v)) and (bound is None or abs(v) <= bound)

    def make_finite(b):
        # clearing the exponent's top bit leaves |v| < 2 (and keeps sign and low bits)
        return b if finite(b) else b & ~top_exponent_bit

    return st.one_of(
        st.sampled_from([b for b in special_values(dtype) if finite(b)]),
        st.integers(0, 2 ** width - 1).map(make_finite),
        st.floats(-100, 100, width=32).map(lambda v: to_bits(v, dtype)),
    )


def bit_array(draw, shape, dtype, elements):
    dtype = np.dtype(dtype)
    raw = draw(hnp.arrays(UINT[dtype], shape, elements=elements))
    return raw.view(dtype)


def float_array(draw, shape, dtype, low, high):
    """Finite moderate values, drawn as float32 and rounded to the dtype."""
    a = draw(hnp.arrays(np.float32, shape, elements=st.floats(low, high, width=32)))
    return a.astype(dtype)


# ----------------------------------------------------------------------------- layouts


LAYOUTS = ("contiguous", "strided", "offset", "transposed", "broadcast", "reversed")


def with_layout(a: np.ndarray, layout: str, garbage_bits: int) -> np.ndarray:
    """A view with the same shape as `a` and the given memory layout. Values equal `a`'s except
    for 'broadcast' (the first row repeated). Unused bytes of the storage hold garbage."""
    shape = a.shape
    garbage = garbage_bits & ((1 << (8 * a.dtype.itemsize)) - 1)
    if layout == "strided" and a.ndim >= 1:
        base = np.empty(shape[:-1] + (2 * shape[-1],), a.dtype)
        base.view(UINT[a.dtype])[...] = garbage
        base[..., ::2] = a
        return base[..., ::2]
    if layout == "offset" and a.ndim >= 1:
        base = np.empty((shape[0] + 1,) + shape[1:], a.dtype)
        base.view(UINT[a.dtype])[...] = garbage
        base[1:] = a
        return base[1:]
    if layout == "transposed" and a.ndim >= 2:
        return np.moveaxis(np.ascontiguousarray(np.moveaxis(a, -1, 0)), 0, -1)
    if layout == "broadcast" and a.size:
        return np.broadcast_to(a[:1], shape)   # stride 0 along the first dim
    if layout == "reversed" and a.ndim >= 1:
        return np.ascontiguousarray(a[..., ::-1])[..., ::-1]
    return a


# ----------------------------------------------------------------------------- problems


@st.composite
def shapes(draw, max_rank=4):
    rank = draw(st.integers(1, max_rank))
    h = draw(st.integers(1, 80))
    lead, product = [], 1
    empty = rank > 1 and draw(st.integers(0, 9)) == 0   # T = 0 in about one example in ten
    zero_at = draw(st.integers(0, rank - 2)) if empty else -1
    for i in range(rank - 1):
        d = 0 if i == zero_at else draw(st.integers(1, max(1, 40 // max(product, 1))))
        lead.append(d)
        product *= max(d, 1)
    return tuple(lead), h


GROUP_VALUES = st.one_of(st.integers(-3, 45), st.sampled_from([0, 1, -1, 2 ** 32 - 1, 2 ** 32, 2 ** 32 + 3, 2 ** 31,
                                                               -(2 ** 32) + 5, 2 ** 62, -(2 ** 63)]),
                         st.integers(-(2 ** 63), 2 ** 63 - 1))
CLAMPS = st.one_of(st.none(), st.sampled_from([1.401298464324817e-45, 1e-40, 1e-6, 0.5, 1.0, 2.5, 7.0, 50.0, 88.0, X_OVF,
                                               100.0, 1e30, FLT_MAX]),
                   st.floats(min_value=1.401298464324817e-45, max_value=FLT_MAX))


@st.composite
def problems(draw, values="any", with_layouts=True, clamp=CLAMPS, groups=True):
    """A complete one-shot call: arrays (with layouts), options and the ABI revision.

    values: "any" (every bit pattern likely), "moderate" (finite, |x| <= 30, others <= 2) or
    "bounded" (finite; x of any size, the others |v| <= 1e18 so no product overflows)."""
    lead, h = draw(shapes())
    dtype = draw(st.sampled_from(DTYPES))
    rank = len(lead) + 1
    abi = draw(st.sampled_from([1, 2])) if rank in (2, 3) else 2
    rows = int(np.prod(lead, dtype=np.int64))
    if values == "any":
        elems = any_bits(dtype)
        gy = bit_array(draw, lead + (h,), dtype, elems)
        x = bit_array(draw, lead + (2 * h,), dtype, elems)
    elif values == "bounded":
        gy = bit_array(draw, lead + (h,), dtype, finite_bits(dtype, 1e18))
        x = bit_array(draw, lead + (2 * h,), dtype, finite_bits(dtype))
    else:
        gy = float_array(draw, lead + (h,), dtype, -2, 2)
        x = float_array(draw, lead + (2 * h,), dtype, -30, 30)
    weight = y_origin = None
    if draw(st.booleans()):
        wshape = lead + (1,) if abi == 1 or draw(st.booleans()) else (rows,)
        if values == "any":
            weight = bit_array(draw, wshape, F32, any_bits(F32))
            y_origin = bit_array(draw, lead + (h,), dtype, any_bits(dtype))
        elif values == "bounded":
            weight = bit_array(draw, wshape, F32, finite_bits(F32, 1e18))
            y_origin = bit_array(draw, lead + (h,), dtype, finite_bits(dtype, 1e18))
        else:
            weight = float_array(draw, wshape, F32, -2, 2)
            y_origin = float_array(draw, lead + (h,), dtype, -2, 2)
    group_index = None
    if groups and draw(st.booleans()):
        counts = st.one_of(
            st.lists(st.integers(0, max(rows, 1)), min_size=1, max_size=4),   # ordinary counts, often trunc < T
            st.lists(GROUP_VALUES, min_size=0, max_size=5),                   # negatives, wrap-around, G = 0
        )
        group_index = np.array(draw(counts), np.int64)
    clamp_limit = draw(clamp)
    p = dict(abi=abi, grad_y=gy, x=x, weight=weight, y_origin=y_origin, group_index=group_index,
             clamp_limit=clamp_limit)
    if with_layouts:
        apply_layouts(draw, p)
    return p


def apply_layouts(draw, p) -> None:
    """Gives each input array its own random layout (in place in p)."""
    garbage = draw(st.sampled_from([0xFFFFFFFF, 0x7FC00000, 0x7E00, 0]))
    for name in ("grad_y", "x", "weight", "y_origin"):
        if p[name] is not None:
            p[name] = with_layout(p[name], draw(st.sampled_from(LAYOUTS)), garbage)


@contextlib.contextmanager
def abi_env(abi: int):
    old = os.environ.get("ACL_SWIGLU_ABI")
    os.environ["ACL_SWIGLU_ABI"] = str(abi)
    try:
        yield
    finally:
        if old is None:
            del os.environ["ACL_SWIGLU_ABI"]
        else:
            os.environ["ACL_SWIGLU_ABI"] = old


ARGS = ("grad_y", "x", "weight", "y_origin", "group_index", "clamp_limit")


def classify(p) -> None:
    """Hypothesis events (see --hypothesis-show-statistics): what the examples covered."""
    x = p["x"]
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    event(f"dtype {x.dtype}, abi {p['abi']}")
    event("T = 0" if rows == 0 else ("T <= 8" if rows <= 8 else "T > 8"))
    event("trunc < T" if trunc_of(p) < rows else "trunc = T")
    event("clamp on" if p["clamp_limit"] is not None else "clamp off")
    event("weight" if p["weight"] is not None else "no weight")
    if not x.flags.c_contiguous:
        event("x not contiguous")
    if 0 in x.strides:
        event("x broadcast")
    if x.size and np.isnan(x.astype(np.float32)).any():
        event("NaN in x")


def run(p):
    """(emulator grad_x, grad_weight) and the model's, for problem p."""
    classify(p)
    args = [p[k] for k in ARGS]
    with abi_env(p["abi"]):
        got = acl_swiglu.swiglu_group_quant_grad(*args)
    want = device_model.swiglu_group_quant_grad_model(*args)
    return got, want


def raw(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(UINT[a.dtype] if a.dtype in UINT else np.uint32)


def describe(p) -> str:
    return (f"abi {p['abi']} {p['x'].dtype} x{p['x'].shape} strides {p['x'].strides} gy strides {p['grad_y'].strides} "
            f"weight {None if p['weight'] is None else (p['weight'].shape, p['weight'].strides)} "
            f"groups {None if p['group_index'] is None else p['group_index'].tolist()} clamp {p['clamp_limit']!r}")


def assert_bits_equal(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    g, w = raw(got).ravel(), raw(want).ravel()
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{what}: {bad.size} of {g.size} elements differ; first at flat index {bad[0]}: "
                           f"{int(g[bad[0]]):#x} vs model {int(w[bad[0]]):#x}")


def trunc_of(p) -> int:
    return device_model.trunc_of(p["group_index"], int(np.prod(p["x"].shape[:-1], dtype=np.int64)))


# ----------------------------------------------------------------------------- properties


@settings_for(160)
@given(problems())
def test_emulator_output_equals_device_model_bit_for_bit(p):
    note(describe(p))
    (gx, gw), (want_x, want_w) = run(p)
    assert_bits_equal(gx, want_x, "grad_x")
    assert (gw is None) == (p["weight"] is None)
    if gw is not None:
        assert_bits_equal(gw, want_w, "grad_weight")
    # every stored NaN is the canonical quiet NaN
    nan_bits = {F32: 0x7FC00000, F16: 0x7E00, BF16: 0x7FC0}[gx.dtype]
    assert np.all(raw(gx)[np.isnan(gx.astype(np.float32))] == nan_bits)


@settings_for(200)
@given(problems(values="moderate"))
def test_moderate_values_pass_the_reference_verdict(p):
    note(describe(p))
    (gx, gw), (want_x, want_w) = run(p)
    assert_bits_equal(gx, want_x, "grad_x")
    args = [p[k] for k in ARGS]
    ref_x, ref_w = reference.swiglu_group_quant_grad(*args)
    departures = reference.device_departures(p["x"], p["clamp_limit"], p["group_index"])
    assert not departures.any()   # |x| <= 30: exp never overflows
    verdict = reference.compare(gx, ref_x, departures=departures)
    assert verdict.passed, str(verdict)
    assert verdict.nan_mismatch == 0 and verdict.inf_mismatch == 0
    if gw is not None:
        assert_bits_equal(gw, want_w, "grad_weight")
        verdict_w = reference.compare(gw, ref_w)
        assert verdict_w.passed, str(verdict_w)


@st.composite
def overflow_problems(draw):
    """Moderate inputs, no clamp, and some x0 positions at or above 88.72284 (up to the dtype's
    max and +inf)."""
    p = draw(problems(values="moderate", clamp=st.none(), with_layouts=False))
    x = np.array(p["x"])   # a writable copy in C order
    h = x.shape[-1] // 2
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    dtype = x.dtype
    big_max = float(ml_dtypes.finfo(dtype).max if dtype == BF16 else np.finfo(dtype).max)
    x0 = x.reshape(rows, 2 * h)[:, :h]
    mask = draw(hnp.arrays(np.bool_, x0.shape))
    big = draw(hnp.arrays(np.float64, x0.shape,
                          elements=st.one_of(st.floats(X_OVF, big_max), st.just(np.inf), st.just(X_OVF))))
    with np.errstate(over="ignore"):
        big_cast = big.astype(np.float32).astype(dtype)
    # a value that rounds below the threshold in this dtype is not an overflow position
    mask &= big_cast.astype(np.float32) >= np.float32(X_OVF)
    x0[mask] = big_cast[mask]
    p["x"] = x
    apply_layouts(draw, p)
    return p


@settings_for(120)
@given(overflow_problems())
def test_x0_at_or_above_exp_overflow_without_clamp_gives_nan_in_both_columns(p):
    note(describe(p))
    (gx, gw), (want_x, _) = run(p)
    assert_bits_equal(gx, want_x, "grad_x")
    h = p["x"].shape[-1] // 2
    rows = int(np.prod(p["x"].shape[:-1], dtype=np.int64))
    # the positions as passed (a layout may have repeated rows)
    mask = device_model.widen(p["x"]).reshape(rows, 2 * h)[:, :h] >= np.float32(X_OVF)
    note(f"{int(mask.sum())} overflow positions")
    event("some x0 >= 88.72284" if mask[:trunc_of(p)].any() else "no overflow position before trunc")
    trunc = trunc_of(p)
    g = gx.astype(np.float32).reshape(rows, 2 * h)
    live = np.zeros_like(mask)
    live[:trunc] = True
    expect_nan = mask & live
    assert np.array_equal(np.isnan(g[:, :h]), expect_nan), "NaN positions in grad_x[..., :H]"
    assert np.array_equal(np.isnan(g[:, h:]), expect_nan), "NaN positions in grad_x[..., H:]"
    assert np.all(np.isfinite(g[~np.concatenate([expect_nan, expect_nan], axis=1)]))
    # the reference reports exactly these positions as device departures
    dep = reference.device_departures(p["x"], None, p["group_index"]).reshape(rows, 2 * h)
    assert np.array_equal(dep[:, :h], expect_nan) and np.array_equal(dep[:, h:], expect_nan)
    ref_x, _ = reference.swiglu_group_quant_grad(*[p[k] for k in ARGS])
    assert reference.compare(gx, ref_x, departures=dep.reshape(gx.shape)).passed


@st.composite
def masked_problems(draw):
    """Finite inputs (x of any size; the others up to 1e18 so that no product overflows;
    subnormals and -0.0 included), clamp on with c <= 80, some positions forced beyond the
    clamp: x0 >= c and |x1| >= c."""
    p = draw(problems(values="bounded", clamp=st.floats(min_value=1e-3, max_value=80.0), with_layouts=False))
    dtype = p["x"].dtype
    c = np.float32(p["clamp_limit"])
    x = np.array(p["x"])
    h = x.shape[-1] // 2
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    x2 = x.reshape(rows, 2 * h)
    beyond = draw(hnp.arrays(np.float32, (rows, 2 * h), elements=st.floats(1.0, 4.0, width=32)))
    force = draw(hnp.arrays(np.bool_, (rows, 2 * h)))
    sign = np.where(draw(hnp.arrays(np.bool_, (rows, 2 * h))), -1, 1).astype(np.float32)
    sign[:, :h] = 1   # x0 is masked from above only
    with np.errstate(over="ignore"):
        forced = (sign * c * beyond).astype(dtype)
    x2[force] = forced[force]
    p["x"] = x
    apply_layouts(draw, p)
    return p


def signbit_f32(a) -> np.ndarray:
    return np.signbit(np.asarray(a).astype(np.float32))


@settings_for(80)
@given(masked_problems())
def test_clamp_masked_positions_are_signed_zeros(p):
    """Masks multiply by 0: where x0 >= c (original) grad_x[..., h] is +-0, where |x1| >= c
    grad_x[..., H+h] is +-0, each with the sign of the unmasked product (a masked negative is
    -0.0). The inputs keep the unmasked products finite."""
    note(describe(p))
    (gx, _), (want_x, _) = run(p)
    assert_bits_equal(gx, want_x, "grad_x")
    dtype = p["x"].dtype
    c = np.float32(p["clamp_limit"])
    h = p["x"].shape[-1] // 2
    rows = int(np.prod(p["x"].shape[:-1], dtype=np.int64))
    trunc = trunc_of(p)
    x2 = device_model.widen(p["x"]).reshape(rows, 2 * h)[:trunc]
    gy = device_model.widen(p["grad_y"]).reshape(rows, h)[:trunc]
    x0, x1 = x2[:, :h], x2[:, h:]
    w_sign = np.zeros((trunc, 1), bool)
    if p["weight"] is not None:
        w_sign = signbit_f32(p["weight"]).reshape(rows, 1)[:trunc]
    a = np.minimum(x0, c)
    m0 = ~(x0 < c)
    m1 = ~((-c < x1) & (x1 < c))
    out = gx.reshape(rows, 2 * h)[:trunc]
    magnitude_mask = {F32: 0x7FFFFFFF, F16: 0x7FFF, BF16: 0x7FFF}[dtype]
    sign_bit = {F32: 0x80000000, F16: 0x8000, BF16: 0x8000}[dtype]
    out_bits = raw(out).astype(np.uint64)
    g0, g1 = out_bits[:, :h], out_bits[:, h:]
    assert np.all(g0[m0] & magnitude_mask == 0), "a masked grad_x[..., :H] is not zero"
    assert np.all(g1[m1] & magnitude_mask == 0), "a masked grad_x[..., H:] is not zero"
    want_sign0 = signbit_f32(gy) ^ w_sign ^ signbit_f32(x1)          # sign of (gy*w*b) * dsilu(c) > 0
    want_sign1 = signbit_f32(gy) ^ w_sign ^ signbit_f32(a)           # sign of gy*w * a*s, s >= 0
    assert np.array_equal((g0[m0] & sign_bit) != 0, want_sign0[m0]), "sign of masked grad_x[..., :H]"
    assert np.array_equal((g1[m1] & sign_bit) != 0, want_sign1[m1]), "sign of masked grad_x[..., H:]"
    event("masked x0 positions" if m0.any() else "no masked x0")
    event("masked x1 positions" if m1.any() else "no masked x1")
    event("a masked -0.0" if np.any((g0[m0] & sign_bit) != 0) or np.any((g1[m1] & sign_bit) != 0)
          else "no masked -0.0")


@settings_for(60)
@given(problems(values="any"), st.data())
def test_rows_past_trunc_are_positive_zero_bits(p, data):
    rows = int(np.prod(p["x"].shape[:-1], dtype=np.int64))
    # make truncation likely: counts summing (in uint32) to less than T
    if rows and data.draw(st.booleans()):
        p["group_index"] = np.array(data.draw(st.lists(st.integers(0, max(rows - 1, 0) // 2), min_size=1, max_size=3)),
                                    np.int64)
    note(describe(p))
    (gx, gw), (want_x, want_w) = run(p)
    assert_bits_equal(gx, want_x, "grad_x")
    trunc = trunc_of(p)
    h2 = p["x"].shape[-1]
    assert not np.any(raw(gx).reshape(rows, h2)[trunc:]), "a row past trunc is not all +0.0 bits"
    if gw is not None:
        assert not np.any(raw(gw).reshape(rows)[trunc:]), "a grad_weight past trunc is not +0.0"
        assert_bits_equal(gw, want_w, "grad_weight")


@settings_for(40)
@given(st.sampled_from(DTYPES), st.integers(1, 40), st.sampled_from([1, 2]))
def test_empty_group_index_computes_nothing(dtype, h, abi):
    """G = 0: trunc = 0, every output is +0 bits (including where inputs are NaN)."""
    lead = (2, 3)
    gy = np.full(lead + (h,), np.nan, dtype)
    x = np.full(lead + (2 * h,), np.inf, dtype)
    w = np.full(lead + (1,), np.nan, np.float32)
    p = dict(abi=abi, grad_y=gy, x=x, weight=w, y_origin=gy.copy(), group_index=np.zeros(0, np.int64),
             clamp_limit=None)
    (gx, gw), (want_x, want_w) = run(p)
    assert not np.any(raw(gx)) and not np.any(raw(gw))
    assert_bits_equal(gx, want_x, "grad_x")
    assert_bits_equal(gw, want_w, "grad_weight")
