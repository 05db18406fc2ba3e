"""Tests of the bit-exact emulator-kernel model (tests/device_model.py) and of its agreement with
the float64 reference under the SPEC section 5 verdict."""

import math
import os
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))

import device_model as M

from acl_swiglu import reference as R

BF16 = ml_dtypes.bfloat16
F32 = np.float32


def bits32(v):
    return np.asarray(v, np.float32).view(np.uint32)


def is_neg_zero(v):
    return float(v) == 0.0 and math.copysign(1.0, float(v)) == -1.0


def is_pos_zero(v):
    return float(v) == 0.0 and math.copysign(1.0, float(v)) == 1.0


# ----------------------------------------------------------------------------- exp


def test_model_exp_within_2_ulp_of_math_exp_dense():
    rng = np.random.default_rng(0)
    xs = np.concatenate(
        [
            np.linspace(-87.3, 88.72, 300001, dtype=np.float32),
            rng.uniform(-87.3, 88.72, 100000).astype(np.float32),
            rng.uniform(-1.0, 1.0, 50000).astype(np.float32),
            np.array([0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 0.34657359, -0.34657359], np.float32),
        ]
    )
    got = M.model_exp(xs).astype(np.float64)
    want = np.array([math.exp(float(v)) for v in xs])
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    err_ulp = np.abs(got - want) / ulp
    assert err_ulp.max() <= 2.0, (xs[np.argmax(err_ulp)], err_ulp.max())
    assert M.model_exp(np.array([0.0], F32))[0] == 1.0


def test_model_exp_special_values():
    below = np.nextafter(F32(88.72283935546875), F32(0))
    x = np.array([-87.4, -100.0, -1e30, -np.inf, 88.72283935546875, 89.0, np.inf, np.nan, below, -87.3], F32)
    e = M.model_exp(x)
    assert e.dtype == np.float32
    assert [is_pos_zero(v) for v in e[:4]] == [True] * 4  # subnormal results flush to +0
    assert np.isposinf(e[4:7]).all()
    assert np.isnan(e[7])
    assert np.isfinite(e[8]) and e[8] > F32(3.4e38)
    assert e[9] >= np.finfo(np.float32).tiny  # exp(-87.3) is still a normal float
    assert math.exp(-87.4) < np.finfo(np.float32).tiny  # ... and exp(-87.4) is not


def test_model_exp_is_float32_only():
    with pytest.raises(TypeError):
        M.model_exp(np.array([1.0]))


# ----------------------------------------------------------------------------- tree sum


def test_tree_sum_pairwise_order_differs_from_sequential():
    v = np.array([1e8, 1.0, -1e8, 1.0], F32)
    seq = F32(0)
    for a in v:
        seq = F32(seq + a)
    assert seq == 1.0  # (((1e8 + 1) - 1e8) + 1) in fp32
    assert M.tree_sum(v) == 0.0  # (1e8 + 1) + (-1e8 + 1) = 1e8 - 1e8


def test_tree_sum_odd_carry_and_ties():
    # [2^24, 1, 1, 1, 1] -> [2^24, 2, 1] -> [2^24 + 2, 1] -> 2^24 + 3, a tie, rounds to even 2^24 + 4.
    v = np.array([2.0**24, 1, 1, 1, 1], F32)
    assert M.tree_sum(v) == 2.0**24 + 4
    assert M.tree_sum(np.array([1, 2, 3], F32)) == 6.0
    assert M.tree_sum(np.array([7.5], F32)) == 7.5
    empty = M.tree_sum(np.zeros((3, 0), F32))
    assert empty.shape == (3,) and all(is_pos_zero(v) for v in empty)
    rows = M.tree_sum(np.array([[1e8, 1, -1e8, 1], [1, 2, 3, 4]], F32))
    assert rows.tolist() == [0.0, 10.0]


def test_grad_weight_chunks_of_64_then_tree():
    # p = [2^25, 1 x 64], H = 65. Chunk 0: level 1 loses p[1] (2^25 + 1 -> 2^25), level 2 loses 2
    # (2^25 + 2 ties to even 2^25), then exact: 2^25 + 60. Chunk 1 = 1. 2^25 + 61 -> 2^25 + 60.
    # Sequential fp32 would give 2^25, the exact sum is 2^25 + 64.
    H = 65
    yo = np.ones((1, H), F32)
    yo[0, 0] = 2.0**25
    gy = np.ones((1, H), F32)
    x = np.zeros((1, 2 * H), F32)
    w = np.ones((1, 1), F32)
    _, gw = M.swiglu_group_quant_grad_model(gy, x, w, yo)
    assert gw.dtype == np.float32 and gw[0, 0] == 2.0**25 + 60
    _, rw = R.swiglu_group_quant_grad(gy, x, w, yo)
    assert rw[0, 0] == 2.0**25 + 64


def test_grad_weight_h_zero_is_positive_zero():
    gx, gw = M.swiglu_group_quant_grad_model(
        np.zeros((2, 0), F32), np.zeros((2, 0), F32), np.ones((2, 1), F32), np.zeros((2, 0), F32)
    )
    assert gx.shape == (2, 0) and gw.shape == (2, 1) and all(is_pos_zero(v) for v in gw.ravel())


# ----------------------------------------------------------------------------- narrowing


def _round_by_table(v, codes_f64, max_code):
    """Return the non-negative code nearest |v| (ties to even code) using the sorted magnitudes."""
    a = np.abs(v.astype(np.float64))
    hi = np.searchsorted(codes_f64, a, side="left")
    hi = np.minimum(hi, max_code)
    lo = np.maximum(hi - 1, 0)
    dlo = a - codes_f64[lo]
    dhi = codes_f64[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo)
    code = np.where(a >= codes_f64[max_code], max_code, code)
    return code.astype(np.uint16)


def _check_narrowing(fn, out_dtype, inf_code, virtual_next):
    rng = np.random.default_rng(11)
    raw = rng.integers(0, 2**32, 400000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # Values in and around the target's range, including ties (low bits exactly half).
    scales = rng.uniform(-30, 17, 200000) if out_dtype == np.float16 else rng.uniform(-135, 127.99, 200000)
    around = (np.sign(rng.standard_normal(200000)) * np.exp2(scales)).astype(np.float32)
    b = around.view(np.uint32)
    shift = 13 if out_dtype == np.float16 else 16
    ties = ((b >> shift) << shift) | np.uint32(1 << (shift - 1))
    v = np.concatenate([raw, around, ties.view(np.float32)])
    v = v[~np.isnan(v)]
    v = np.concatenate([v, np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.99, 65520, -65520, 3.3895e38,
                                     3.4e38, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-133], np.float32)])
    codes = np.arange(inf_code + 1, dtype=np.uint16)
    mags = codes.view(out_dtype).astype(np.float64)
    mags[-1] = virtual_next  # the code after the largest finite has an even mantissa and means inf
    code = _round_by_table(v, mags, inf_code)
    sign = np.where(np.signbit(v), np.uint16(0x8000), np.uint16(0))
    want = (code | sign).astype(np.uint16)
    got = fn(v).view(np.uint16)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (v[bad[:5]], got[bad[:5]], want[bad[:5]])


def test_to_f16_round_half_even_against_table():
    _check_narrowing(M.to_f16, np.float16, 0x7C00, 65536.0)


def test_to_bf16_round_half_even_against_table():
    _check_narrowing(M.to_bf16, BF16, 0x7F80, 2.0**128)


def test_narrowing_nan():
    v = np.array([np.nan, -np.nan], F32)
    v = np.concatenate([v, np.array([0x7F800001, 0xFF812345], np.uint32).view(F32)])  # signalling payloads
    # Every NaN is stored as the canonical positive quiet NaN of its format (docs/kernel.md).
    h = M.to_f16(v).view(np.uint16)
    assert h.tolist() == [0x7E00] * 4
    assert M.to_bf16(v).view(np.uint16).tolist() == [0x7FC0] * 4
    assert M.canonical_f32(v).view(np.uint32).tolist() == [0x7FC00000] * 4


def test_widen_exact():
    b = np.arange(0, 2**16, dtype=np.uint16).view(BF16)
    np.testing.assert_array_equal(M.widen(b), b.astype(np.float32))
    h = np.arange(0, 2**16, dtype=np.uint16).view(np.float16)
    w = M.widen(h)
    fin = np.isfinite(h)
    np.testing.assert_array_equal(w[fin].astype(np.float64), h[fin].astype(np.float64))


# ----------------------------------------------------------------------------- hand-computed model values


def test_model_hand_values_at_zero_and_one():
    # x0 = 0: e = 1 exactly, s = 1/2, silu = 0, dsilu = 1/2 -> gx0 = gy*x1/2 exactly, gx1 = +0.
    gy = np.array([[3.0, -2.0]], F32)
    x = np.array([[0.0, 0.0, 5.0, 0.75]], F32)
    gx, gw = M.swiglu_group_quant_grad_model(gy, x)
    assert gw is None
    assert gx[0, 0] == 7.5 and gx[0, 1] == -0.75
    assert is_pos_zero(gx[0, 2]) and is_neg_zero(gx[0, 3])  # 3 * 0 and -2 * 0
    # x0 = 1 in fp32 step by step from the emulator's e.
    e = M.model_exp(np.array([1.0], F32))[0]
    assert abs(float(e) - math.e) <= 2 * float(np.spacing(F32(math.e)))
    gx, _ = M.swiglu_group_quant_grad_model(np.array([[2.0]], F32), np.array([[1.0, 3.0]], F32))
    s = F32(e / F32(e + F32(1)))
    dsilu = F32(s * F32(F32(F32(F32(1) - s) * F32(1)) + F32(1)))
    assert gx[0, 0] == F32(F32(F32(2) * F32(3)) * dsilu)
    assert gx[0, 1] == F32(F32(2) * s)
    # And it is close to the math.
    sm = 1 / (1 + math.exp(-1))
    assert float(gx[0, 1]) == pytest.approx(2 * sm, rel=1e-6)


def test_model_device_sigmoid_differs_from_math_sigmoid_somewhere():
    x = np.linspace(-10, 10, 20001, dtype=np.float32)
    e = M.model_exp(x)
    dev = e / (e + F32(1))
    with np.errstate(over="ignore"):
        alt = F32(1) / (F32(1) + M.model_exp(-x))
    frac = np.mean(dev != alt)
    assert 0.2 < frac < 0.8  # "about half of all values"


# ----------------------------------------------------------------------------- special cases in the model


def _m1(x0, x1, gy=1.0, c=1.5, dtype=F32):
    gx, _ = M.swiglu_group_quant_grad_model(
        np.array([[gy]], dtype), np.array([[x0, x1]], dtype), clamp_limit=c
    )
    return gx[0, 0], gx[0, 1]


def test_model_clamp_masks_strict_on_original_values():
    g0, g1 = _m1(1.5, 0.5, gy=2.0)
    assert g0 == 0.0 and g1 != 0.0
    g0, g1 = _m1(0.5, 1.5)
    assert g1 == 0.0 and g0 != 0.0
    g0, g1 = _m1(0.5, -1.5)
    assert g1 == 0.0
    g0, g1 = _m1(0.5, 1.4375)
    assert g1 != 0.0 and g0 != 0.0
    # Clipped x1 = c feeds gx0; clamped x0 = c feeds gx1.
    ga, _ = _m1(0.5, 3.0)
    gb, _ = _m1(0.5, 1.5)
    assert ga == gb
    _, gc = _m1(3.0, 0.5)
    _, gd = _m1(1.5, 0.5)
    assert gc == gd


def test_model_masked_negative_is_negative_zero_and_matches_reference():
    for dtype in (F32, np.float16, BF16):
        g0, _ = _m1(2.0, 1.0, gy=-1.0, dtype=dtype)
        _, g1 = _m1(1.0, 2.0, gy=-1.0, dtype=dtype)
        assert is_neg_zero(g0) and is_neg_zero(g1)
        gy = np.array([[-1.0]], dtype)
        r0 = R.swiglu_group_quant_grad(gy, np.array([[2.0, 1.0]], dtype), clamp_limit=1.5)[0][0, 0]
        r1 = R.swiglu_group_quant_grad(gy, np.array([[1.0, 2.0]], dtype), clamp_limit=1.5)[0][0, 1]
        assert is_neg_zero(r0) and is_neg_zero(r1)


def test_model_clamp_limit_used_as_float32():
    g0, g1 = _m1(np.float32(0.1), 0.05, c=0.1)
    assert g0 == 0.0 and g1 != 0.0


def test_model_nan_inputs():
    g0, g1 = _m1(np.nan, 0.5, c=None)
    assert np.isnan(g0) and np.isnan(g1)
    g0, g1 = _m1(np.nan, 0.5, c=2.0)  # masked NaN stays NaN
    assert np.isnan(g0) and np.isnan(g1)
    g0, g1 = _m1(0.5, np.nan, c=None)
    assert np.isnan(g0) and np.isfinite(g1) and g1 != 0
    g0, g1 = _m1(0.5, np.nan, c=2.0)
    assert np.isnan(g0) and g1 == 0.0
    for dtype in (np.float16, BF16):
        g0, g1 = _m1(np.nan, 0.5, c=None, dtype=dtype)
        assert np.isnan(np.float32(g0)) and np.isnan(np.float32(g1))


def test_model_large_x0_gives_nan_and_is_a_listed_departure():
    gy = np.array([[2.0, 1.0, 1.0]], F32)
    x = np.array([[88.73, 1.0, 88.72, 0.5, 3.0, 1.0]], F32)
    gx, _ = M.swiglu_group_quant_grad_model(gy, x)
    assert np.isnan(gx[0, [0, 3]]).all()
    assert np.isfinite(gx[0, [1, 2, 4, 5]]).all()
    dep = R.device_departures(x)
    assert dep.tolist() == [[True, False, False, True, False, False]]
    ref, _ = R.swiglu_group_quant_grad(gy, x)
    assert np.isfinite(ref).all()
    assert ref[0, 3] == pytest.approx(2.0 * float(F32(88.73)), rel=1e-12)
    assert not R.compare(gx, ref).passed
    v = R.compare(gx, ref, departures=dep)
    assert v.passed and v.departures == 2 and v.departures_nan == 2
    # A clamp below the overflow point removes the NaN.
    gxc, _ = M.swiglu_group_quant_grad_model(gy, x, clamp_limit=50.0)
    assert np.isfinite(gxc).all() and not R.device_departures(x, clamp_limit=50.0).any()


def test_model_very_negative_x0_flushes_e_to_zero():
    gy = np.array([[1.0]], F32)
    x = np.array([[-90.0, 1.0]], F32)
    gx, _ = M.swiglu_group_quant_grad_model(gy, x)
    # e = 0 -> s = 0 -> silu = -90 * 0 = -0, dsilu = 0 * (-89) = -0.
    assert is_neg_zero(gx[0, 0]) and is_neg_zero(gx[0, 1])
    ref, _ = R.swiglu_group_quant_grad(gy, x)
    assert ref[0, 1] == pytest.approx(-90.0 * math.exp(-90.0) / (1 + math.exp(-90.0)), rel=1e-12)
    assert ref[0, 1] != 0.0
    assert R.compare(gx, ref).passed
    e = M.model_exp(np.array([-87.4, -87.5, -88.0], F32))
    assert (e == 0).all()


@pytest.mark.parametrize(
    "gi, trunc", [([-1, 2], 1), ([2**32 - 1, 3], 2), ([2**32], 0), ([], 0), ([2, 1], 3), ([100], 4)]
)
def test_model_trunc_wrap_rows_zero(gi, trunc):
    rng = np.random.default_rng(4)
    gy = np.full((4, 3), np.nan, F32)  # NaN everywhere: rows past trunc must still be +0
    gy[:, :2] = rng.standard_normal((4, 2))
    x = rng.standard_normal((4, 6)).astype(F32)
    w = np.ones((4, 1), F32)
    gx, gw = M.swiglu_group_quant_grad_model(gy, x, w, gy.copy(), np.array(gi, np.int64))
    assert (bits32(gx[trunc:]) == 0).all() and (bits32(gw[trunc:]) == 0).all()
    assert np.isnan(gx[:trunc, [2, 5]]).all() and np.isnan(gw[:trunc]).all()
    full_x, _ = M.swiglu_group_quant_grad_model(gy, x, w, gy.copy())
    np.testing.assert_array_equal(bits32(gx[:trunc]), bits32(full_x[:trunc]))


def test_model_3d_weight_bs1_and_empty():
    rng = np.random.default_rng(6)
    gy = rng.standard_normal((2, 3, 70)).astype(BF16)
    x = rng.standard_normal((2, 3, 140)).astype(BF16)
    w = rng.uniform(0, 1, (2, 3, 1)).astype(F32)
    yo = R.swiglu(x).astype(BF16)
    gx, gw = M.swiglu_group_quant_grad_model(gy, x, w, yo, np.array([5], np.int64), 4.0)
    assert gx.shape == (2, 3, 140) and gx.dtype == BF16 and gw.shape == (2, 3, 1) and gw.dtype == F32
    flat, flat_w = M.swiglu_group_quant_grad_model(
        gy.reshape(6, 70), x.reshape(6, 140), w.reshape(6, 1), yo.reshape(6, 70), np.array([5]), 4.0
    )
    np.testing.assert_array_equal(gx.reshape(6, 140).view(np.uint16), flat.view(np.uint16))
    np.testing.assert_array_equal(gw.reshape(6, 1), flat_w)
    assert (gx[1, 2].view(np.uint16) == 0).all() and gw[1, 2, 0] == 0
    ex, ew = M.swiglu_group_quant_grad_model(
        np.zeros((0, 4), np.float16), np.zeros((0, 8), np.float16), np.zeros((0, 1), F32), np.zeros((0, 4), np.float16)
    )
    assert ex.shape == (0, 8) and ex.dtype == np.float16 and ew.shape == (0, 1)


def test_model_deterministic():
    rng = np.random.default_rng(8)
    gy = rng.standard_normal((16, 100)).astype(np.float16)
    x = (rng.standard_normal((16, 200)) * 5).astype(np.float16)
    w = rng.uniform(0, 2, (16, 1)).astype(F32)
    yo = R.swiglu(x).astype(np.float16)
    a = M.swiglu_group_quant_grad_model(gy, x, w, yo, None, 3.0)
    b = M.swiglu_group_quant_grad_model(gy, x, w, yo, None, 3.0)
    np.testing.assert_array_equal(a[0].view(np.uint16), b[0].view(np.uint16))
    np.testing.assert_array_equal(bits32(a[1]), bits32(b[1]))


# ----------------------------------------------------------------------------- model vs reference


@pytest.mark.parametrize("dtype", [F32, np.float16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("clamp", [None, 5.0], ids=["noclamp", "clamp"])
@pytest.mark.parametrize("with_weight", [False, True], ids=["noweight", "weight"])
def test_model_agrees_with_reference_random(dtype, clamp, with_weight):
    seed = ["float32", "float16", "bfloat16"].index(np.dtype(dtype).name) * 4 + 2 * (clamp is not None) + with_weight
    rng = np.random.default_rng(seed)
    T, H = 48, 160  # H not a multiple of 64: a short last chunk in gradWeight
    gy = rng.standard_normal((T, H)).astype(dtype)
    x = (rng.standard_normal((T, 2 * H)) * 4).astype(dtype)
    gi = np.array([20, 21], np.int64)
    w = yo = None
    if with_weight:
        w = rng.uniform(0.05, 1.0, (T, 1)).astype(F32)
        yo = R.swiglu(x, clamp).astype(dtype)
    gx, gw = M.swiglu_group_quant_grad_model(gy, x, w, yo, gi, clamp)
    rx, rw = R.swiglu_group_quant_grad(gy, x, w, yo, gi, clamp)
    assert gx.dtype == np.dtype(dtype)
    v = R.compare(gx, rx, departures=R.device_departures(x, clamp, gi))
    assert v.passed, str(v)
    assert v.count == T * 2 * H and v.departures == 0
    assert v.max_abs_error > 0  # the fp32 formula really differs from the float64 math
    if clamp is not None:
        # the clamp must have masked something
        assert np.count_nonzero(rx[:41] == 0.0) > 100
    if with_weight:
        vw = R.compare(gw, rw)
        assert vw.passed, str(vw)
        assert (gw[41:] == 0).all()
    else:
        assert gw is None and rw is None


@pytest.mark.parametrize("dtype", [F32, np.float16, BF16], ids=["fp32", "fp16", "bf16"])
def test_model_agrees_with_reference_when_departures_are_excluded(dtype):
    rng = np.random.default_rng(12)
    T, H = 8, 64
    gy = (rng.standard_normal((T, H)) * 0.01).astype(dtype)
    x = rng.standard_normal((T, 2 * H)).astype(dtype)
    hot = rng.random((T, H)) < 0.1
    x[:, :H][hot] = 95.0
    gx, _ = M.swiglu_group_quant_grad_model(gy, x)
    rx, _ = R.swiglu_group_quant_grad(gy, x)
    dep = R.device_departures(x)
    assert dep.sum() == 2 * hot.sum()
    assert np.isnan(gx.astype(np.float32)[dep]).all()
    assert not np.isnan(gx.astype(np.float32)[~dep]).any()
    assert np.isfinite(rx).all()
    v = R.compare(gx, rx, departures=dep)
    assert v.passed and v.departures == 2 * hot.sum() and v.departures_nan == v.departures, str(v)
    assert not R.compare(gx, rx).passed


# ----------------------------------------------------------------------------- property


_DTYPES = {"fp32": F32, "fp16": np.float16, "bf16": BF16}


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(sorted(_DTYPES)),
    lead=st.lists(st.integers(0, 4), min_size=0, max_size=2),
    h=st.integers(1, 140),
    clamp=st.one_of(st.none(), st.floats(0.25, 120.0)),
    with_weight=st.booleans(),
    groups=st.one_of(st.none(), st.lists(st.integers(-(2**33), 2**33), max_size=3)),
    seed=st.integers(0, 2**31),
)
def test_model_reference_verdict_property(dtype, lead, h, clamp, with_weight, groups, seed):
    dt = _DTYPES[dtype]
    rng = np.random.default_rng(seed)
    shape = (*lead, h)
    gy = (rng.standard_normal(shape) * 3).astype(dt)
    x = (rng.standard_normal((*lead, 2 * h)) * 12).astype(dt)
    if x.size:
        # No infinities: inf * (exp flushed to 0) is NaN on the device but inf in the math, an edge
        # outside device_departures' definition.
        x.reshape(-1)[rng.integers(0, x.size, 3)] = rng.choice([np.nan, 95.0, -95.0, 60.0], 3)
    w = yo = None
    if with_weight:
        w = rng.uniform(0, 1, (*lead, 1)).astype(F32)
        yo = (rng.standard_normal(shape) * 2).astype(dt)
    gi = None if groups is None else np.array(groups, np.int64)
    gx, gw = M.swiglu_group_quant_grad_model(gy, x, w, yo, gi, clamp)
    rx, rw = R.swiglu_group_quant_grad(gy, x, w, yo, gi, clamp)
    dep = R.device_departures(x, clamp, gi)
    v = R.compare(gx, rx, departures=dep)
    assert v.passed, str(v)
    assert v.departures_nan == v.departures
    if with_weight:
        assert R.compare(gw, rw).passed
    trunc = M.trunc_of(gi, int(np.prod(lead, dtype=np.int64)))
    rows = gx.reshape(-1, 2 * h)
    assert (rows[trunc:].view(np.uint16 if rows.itemsize == 2 else np.uint32) == 0).all()
