"""Tests of acl_swiglu.reference: the float64 math, departures and the verdict.

Expected values are worked out here with Python's math module, independently of the code under test.
"""

import json
import math

import ml_dtypes
import numpy as np
import pytest

from acl_swiglu import reference as R

BF16 = ml_dtypes.bfloat16


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"/proc/self/status has no {field}")


def sig(v):
    return 1.0 / (1.0 + math.exp(-v))


def silu(v):
    return v * sig(v)


def dsilu(v):
    s = sig(v)
    return s * (1.0 + v * (1.0 - s))


def f32(v):
    """The double value of float32(v) (what a fp32 clamp limit becomes)."""
    return float(np.float32(v))


def expected_row(gy, x0, x1, w=1.0, c=None):
    """Hand formula for one row, plain Python floats."""
    gx0, gx1 = [], []
    for g, a0, a1 in zip(gy, x0, x1):
        g = g * w
        if c is None:
            gx0.append(g * a1 * dsilu(a0))
            gx1.append(g * silu(a0))
        else:
            a = min(a0, c)
            b = min(max(a1, -c), c)
            m0 = 1.0 if a0 < c else 0.0
            m1 = 1.0 if (-c < a1 < c) else 0.0
            gx0.append(g * b * dsilu(a) * m0)
            gx1.append(g * silu(a) * m1)
    return gx0 + gx1


# ----------------------------------------------------------------------------- hand-computed


def test_hand_computed_two_rows_no_clamp():
    gy = np.array([[0.5, -1.25], [2.0, 0.75]], dtype=np.float32)
    x = np.array([[1.0, -0.5, 2.0, 3.0], [-3.0, 0.25, -0.375, 1.5]], dtype=np.float32)
    gx, gw = R.swiglu_group_quant_grad(gy, x)
    assert gw is None
    assert gx.dtype == np.float64 and gx.shape == (2, 4)
    # Row 0 spelled out: gx0 = gy*x1*dsilu(x0), gx1 = gy*silu(x0).
    s1 = 1.0 / (1.0 + math.exp(-1.0))
    assert gx[0, 0] == pytest.approx(0.5 * 2.0 * (s1 * (1.0 + 1.0 * (1.0 - s1))), rel=1e-14)
    assert gx[0, 2] == pytest.approx(0.5 * 1.0 * s1, rel=1e-14)
    sm = 1.0 / (1.0 + math.exp(0.5))
    assert gx[0, 1] == pytest.approx(-1.25 * 3.0 * (sm * (1.0 + (-0.5) * (1.0 - sm))), rel=1e-14)
    assert gx[0, 3] == pytest.approx(-1.25 * (-0.5) * sm, rel=1e-14)
    exp1 = expected_row([2.0, 0.75], [-3.0, 0.25], [-0.375, 1.5])
    np.testing.assert_allclose(gx[1], exp1, rtol=1e-14, atol=0)


def test_weight_scales_grad_and_grad_weight_uses_raw_grad_y():
    gy = np.array([[0.5, -1.25], [2.0, 0.75]], dtype=np.float32)
    x = np.array([[1.0, -0.5, 2.0, 3.0], [-3.0, 0.25, -0.375, 1.5]], dtype=np.float32)
    yo = np.array([[4.0, 0.5], [-1.0, 8.0]], dtype=np.float32)  # deliberately not swiglu(x)
    w = np.array([[0.25], [3.0]], dtype=np.float32)
    gx, gw = R.swiglu_group_quant_grad(gy, x, w, yo)
    assert gw.shape == (2, 1) and gw.dtype == np.float64
    assert gw[0, 0] == 0.5 * 4.0 + (-1.25) * 0.5
    assert gw[1, 0] == 2.0 * -1.0 + 0.75 * 8.0
    np.testing.assert_allclose(gx[0], expected_row([0.5, -1.25], [1.0, -0.5], [2.0, 3.0], w=0.25), rtol=1e-14)
    np.testing.assert_allclose(gx[1], expected_row([2.0, 0.75], [-3.0, 0.25], [-0.375, 1.5], w=3.0), rtol=1e-14)


def test_grad_weight_has_no_clamp_mask():
    gy = np.array([[1.5, -2.0]], dtype=np.float32)
    x = np.array([[9.0, 9.0, 9.0, -9.0]], dtype=np.float32)  # all masked with c = 1
    yo = np.array([[2.0, 0.25]], dtype=np.float32)
    w = np.array([[2.0]], dtype=np.float32)
    gx, gw = R.swiglu_group_quant_grad(gy, x, w, yo, clamp_limit=1.0)
    assert gw[0, 0] == 1.5 * 2.0 - 2.0 * 0.25
    assert np.all(gx == 0.0)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_narrow_inputs_widened_exactly(dtype):
    # 1 + 2**-7 and -3 * 2**-5 are exact in fp16 and bf16.
    gy = np.array([[1.0078125]], dtype=dtype)
    x = np.array([[-0.09375, 1.0078125]], dtype=dtype)
    gx, _ = R.swiglu_group_quant_grad(gy, x)
    np.testing.assert_allclose(gx[0], expected_row([1.0078125], [-0.09375], [1.0078125]), rtol=1e-14)


def test_fp16_subnormal_input():
    v = float(np.float16(2.0 ** -20))  # subnormal in fp16, exact
    gy = np.array([[1.0]], dtype=np.float16)
    x = np.array([[v, 1.0]], dtype=np.float16)
    gx, _ = R.swiglu_group_quant_grad(gy, x)
    assert gx[0, 1] == pytest.approx(silu(2.0 ** -20), rel=1e-14)
    assert gx[0, 0] == pytest.approx(dsilu(2.0 ** -20), rel=1e-14)


def test_rank1_input():
    gy = np.array([0.5, 2.0], dtype=np.float32)
    x = np.array([1.0, -2.0, 0.25, 4.0], dtype=np.float32)
    w = np.array([2.0], dtype=np.float32)
    yo = np.array([1.0, 1.0], dtype=np.float32)
    gx, gw = R.swiglu_group_quant_grad(gy, x, w, yo)
    assert gx.shape == (4,) and gw.shape == (1,)
    assert gw[0] == 2.5
    np.testing.assert_allclose(gx, expected_row([0.5, 2.0], [1.0, -2.0], [0.25, 4.0], w=2.0), rtol=1e-14)


# ----------------------------------------------------------------------------- clamp


def _one(x0, x1, gy=1.0, c=1.5, dtype=np.float32):
    g = np.array([[gy]], dtype=dtype)
    xx = np.array([[x0, x1]], dtype=dtype)
    gx, _ = R.swiglu_group_quant_grad(g, xx, clamp_limit=c)
    return gx[0, 0], gx[0, 1]


def test_clamp_x0_equal_limit_is_masked():
    g0, g1 = _one(1.5, 0.5, gy=2.0)
    assert g0 == 0.0
    assert g1 == pytest.approx(2.0 * silu(1.5), rel=1e-14)


def test_clamp_x0_above_limit_uses_clamped_x0_in_gx1():
    g0, g1 = _one(3.0, 0.5, gy=2.0)
    assert g0 == 0.0
    assert g1 == pytest.approx(2.0 * silu(1.5), rel=1e-14)


@pytest.mark.parametrize("x1", [1.5, -1.5])
def test_clamp_abs_x1_equal_limit_is_masked(x1):
    g0, g1 = _one(0.5, x1, gy=2.0)
    assert g1 == 0.0
    assert g0 == pytest.approx(2.0 * x1 * dsilu(0.5), rel=1e-14)


@pytest.mark.parametrize("x1, used", [(3.0, 1.5), (-2.0, -1.5)])
def test_clamp_x1_outside_is_clipped_in_gx0_and_masked_in_gx1(x1, used):
    g0, g1 = _one(0.5, x1, gy=2.0)
    assert g1 == 0.0
    assert g0 == pytest.approx(2.0 * used * dsilu(0.5), rel=1e-14)


@pytest.mark.parametrize("x1", [-1.4375, 0.0, 1.4375])
def test_clamp_x1_strictly_inside_passes(x1):
    g0, g1 = _one(-0.75, x1, gy=-0.5)
    assert g1 == pytest.approx(-0.5 * silu(-0.75), rel=1e-14)
    assert g0 == pytest.approx(-0.5 * x1 * dsilu(-0.75), rel=1e-14, abs=0.0)


def test_masked_negative_is_negative_zero():
    g0, _ = _one(2.0, 1.0, gy=-1.0)  # gx0 = -dsilu(1.5) * 0
    assert g0 == 0.0 and math.copysign(1.0, g0) == -1.0
    _, g1 = _one(1.0, 2.0, gy=-1.0)  # gx1 = -silu(1) * 0
    assert g1 == 0.0 and math.copysign(1.0, g1) == -1.0
    g0p, _ = _one(2.0, 1.0, gy=1.0)
    assert g0p == 0.0 and math.copysign(1.0, g0p) == 1.0


def test_clamp_limit_is_used_as_float32():
    # float32(0.1) > 0.1, so x0 = float32(0.1) equals the fp32 limit and is masked.
    c32 = np.float32(0.1)
    g0, g1 = _one(c32, 0.05, gy=1.0, c=0.1)
    assert g0 == 0.0
    assert g1 == pytest.approx(silu(float(c32)), rel=1e-14)


def test_clamp_matches_hand_formula_on_grid():
    vals = [-3.0, -1.5, -1.0, 0.0, 0.5, 1.5, 2.0]
    x0 = [a for a in vals for _ in vals]
    x1 = [b for _ in vals for b in vals]
    gy = [0.5 + 0.25 * i for i in range(len(x0))]
    gx, _ = R.swiglu_group_quant_grad(
        np.array([gy], np.float32), np.array([x0 + x1], np.float32), clamp_limit=1.5
    )
    np.testing.assert_allclose(gx[0], expected_row(gy, x0, x1, c=1.5), rtol=1e-14, atol=0)


# ----------------------------------------------------------------------------- NaN / large


def test_nan_x0_gives_nan_both_columns_with_and_without_clamp():
    for c in (None, 2.0):
        g0, g1 = _one(np.nan, 0.5, c=c)
        assert math.isnan(g0) and math.isnan(g1)


def test_nan_x1():
    g0, g1 = _one(0.5, np.nan, gy=2.0, c=None)
    assert math.isnan(g0)
    assert g1 == pytest.approx(2.0 * silu(0.5), rel=1e-14)
    g0, g1 = _one(0.5, np.nan, gy=2.0, c=2.0)  # NaN compares false: gx1 masked to 0
    assert math.isnan(g0)
    assert g1 == 0.0


def test_nan_grad_y_propagates_to_grad_weight():
    gy = np.array([[np.nan, 1.0]], np.float32)
    x = np.array([[0.5, 0.5, 1.0, 1.0]], np.float32)
    yo = np.ones((1, 2), np.float32)
    gx, gw = R.swiglu_group_quant_grad(gy, x, np.ones((1, 1), np.float32), yo)
    assert math.isnan(gx[0, 0]) and math.isnan(gx[0, 2])
    assert np.isfinite(gx[0, 1]) and np.isfinite(gx[0, 3])
    assert math.isnan(gw[0, 0])


def test_large_x0_without_clamp_reference_finite_and_listed_as_departure():
    gy = np.array([[2.0, 1.0]], np.float32)
    x = np.array([[89.0, 1.0, 0.5, 3.0]], np.float32)
    gx, _ = R.swiglu_group_quant_grad(gy, x)
    assert gx[0, 0] == pytest.approx(2.0 * 0.5 * dsilu(89.0), rel=1e-14)
    assert gx[0, 2] == pytest.approx(2.0 * 89.0, rel=1e-14)
    dep = R.device_departures(x)
    assert dep.tolist() == [[True, False, True, False]]


def test_device_departures_boundary_clamp_trunc_and_nan():
    below = float(np.nextafter(np.float32(R.EXP_OVERFLOW_X), np.float32(0)))
    x = np.array(
        [
            [R.EXP_OVERFLOW_X, below, np.nan, 1e30, 0.0, 0.0, 0.0, 0.0],
            [95.0, 95.0, 95.0, 95.0, 0.0, 0.0, 0.0, 0.0],
        ],
        np.float32,
    )
    assert R.device_departures(x).tolist() == [
        [True, False, False, True, True, False, False, True],
        [True, True, True, True, True, True, True, True],
    ]
    # Clamp below the overflow point removes every departure ...
    assert not R.device_departures(x, clamp_limit=10.0).any()
    # ... a clamp above it keeps the clamped x0 >= 88.72 ones.
    assert R.device_departures(x, clamp_limit=100.0).tolist() == R.device_departures(x).tolist()
    assert R.device_departures(x, clamp_limit=88.0).sum() == 0
    # Rows past trunc are zero on the device, so no departure there.
    assert R.device_departures(x, group_index=np.array([1], np.int64))[1].sum() == 0
    assert R.device_departures(x, group_index=np.array([], np.int64)).sum() == 0


# ----------------------------------------------------------------------------- trunc


@pytest.mark.parametrize(
    "gi, trunc",
    [
        ([1, 1], 2),
        ([10], 4),
        ([-1, 2], 1),  # 0xFFFFFFFF + 2 wraps to 1
        ([2**32 - 1, 3], 2),
        ([2**32], 0),
        ([2**31, 2**31, 3], 3),
        ([-(2**32) + 3], 3),
        ([0, 0, 0], 0),
        ([], 0),  # G = 0
    ],
)
def test_trunc_wraps_in_uint32_and_zeroes_rows(gi, trunc):
    rng = np.random.default_rng(5)
    gy = rng.standard_normal((4, 3)).astype(np.float32)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (4, 1)).astype(np.float32)
    yo = rng.standard_normal((4, 3)).astype(np.float32)
    full_x, full_w = R.swiglu_group_quant_grad(gy, x, w, yo)
    gx, gw = R.swiglu_group_quant_grad(gy, x, w, yo, group_index=np.array(gi, dtype=np.int64))
    np.testing.assert_array_equal(gx[:trunc], full_x[:trunc])
    np.testing.assert_array_equal(gw[:trunc], full_w[:trunc])
    assert np.all(gx[trunc:] == 0.0) and not np.signbit(gx[trunc:]).any()
    assert np.all(gw[trunc:] == 0.0) and not np.signbit(gw[trunc:]).any()
    if trunc < 4:
        assert np.any(full_x[trunc:] != 0.0)


def test_rows_past_trunc_are_zero_even_with_nan():
    gy = np.full((3, 2), np.nan, np.float32)
    x = np.full((3, 4), np.nan, np.float32)
    gx, _ = R.swiglu_group_quant_grad(gy, x, group_index=np.array([1], np.int64))
    assert np.isnan(gx[0]).all()
    assert np.all(gx[1:] == 0.0)


# ----------------------------------------------------------------------------- shapes


def test_three_d_with_weight_bs1():
    rng = np.random.default_rng(2)
    B, S, H = 2, 3, 5
    gy = rng.standard_normal((B, S, H)).astype(np.float32)
    x = rng.standard_normal((B, S, 2 * H)).astype(np.float32)
    w = rng.uniform(0, 1, (B, S, 1)).astype(np.float32)
    yo = R.swiglu(x).astype(np.float32)
    gx, gw = R.swiglu_group_quant_grad(gy, x, w, yo, group_index=np.array([2, 2], np.int64))
    assert gx.shape == (B, S, 2 * H) and gw.shape == (B, S, 1)
    fx, fw = R.swiglu_group_quant_grad(
        gy.reshape(6, H), x.reshape(6, 2 * H), w.reshape(6, 1), yo.reshape(6, H), group_index=np.array([4])
    )
    np.testing.assert_array_equal(gx.reshape(6, 2 * H), fx)
    np.testing.assert_array_equal(gw.reshape(6, 1), fw)
    assert np.all(gx.reshape(6, 2 * H)[4:] == 0.0)
    # Row (1, 0) spelled out.
    np.testing.assert_allclose(
        gx[1, 0],
        expected_row(gy[1, 0].tolist(), x[1, 0, :H].tolist(), x[1, 0, H:].tolist(), w=float(w[1, 0, 0])),
        rtol=1e-13,
    )
    assert gw[1, 0, 0] == pytest.approx(sum(float(a) * float(b) for a, b in zip(gy[1, 0], yo[1, 0])), rel=1e-13)


def test_weight_any_shape_with_t_elements():
    gy = np.ones((2, 3, 2), np.float32)
    x = np.zeros((2, 3, 4), np.float32)
    w = np.arange(6, dtype=np.float32)  # flat [T]
    yo = np.ones((2, 3, 2), np.float32)
    gx, gw = R.swiglu_group_quant_grad(gy, x, w, yo)
    assert gw.shape == (6,)
    np.testing.assert_array_equal(gw, np.full(6, 2.0))
    # x = 0: dsilu(0) = 1/2, silu(0) = 0, x1 = 0 -> gx is all zero.
    np.testing.assert_array_equal(gx, 0.0)


@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3)])
def test_empty_t(lead):
    gy = np.zeros(lead + (4,), BF16)
    x = np.zeros(lead + (8,), BF16)
    w = np.zeros(lead + (1,), np.float32)
    yo = np.zeros(lead + (4,), BF16)
    gx, gw = R.swiglu_group_quant_grad(gy, x, w, yo, group_index=np.array([3], np.int64), clamp_limit=1.0)
    assert gx.shape == lead + (8,) and gx.dtype == np.float64
    assert gw.shape == lead + (1,)
    assert R.device_departures(x).shape == lead + (8,)
    assert R.swiglu(x).shape == lead + (4,)


def test_chunking_does_not_change_results(monkeypatch):
    rng = np.random.default_rng(9)
    gy = rng.standard_normal((37, 11)).astype(BF16)
    x = (rng.standard_normal((37, 22)) * 4).astype(BF16)
    w = rng.uniform(0, 1, (37, 1)).astype(np.float32)
    yo = R.swiglu(x, 3.0).astype(BF16)
    big = R.swiglu_group_quant_grad(gy, x, w, yo, np.array([30]), 3.0)
    monkeypatch.setattr(R, "_CHUNK_ELEMENTS", 30)  # one row per chunk
    small = R.swiglu_group_quant_grad(gy, x, w, yo, np.array([30]), 3.0)
    np.testing.assert_array_equal(big[0], small[0])
    np.testing.assert_allclose(big[1], small[1], rtol=1e-15)
    np.testing.assert_array_equal(R.swiglu(x, 3.0), R.swiglu(x, 3.0))


def _out_case():
    rng = np.random.default_rng(21)
    gy = rng.standard_normal((6, 5)).astype(BF16)
    x = (rng.standard_normal((6, 10)) * 3).astype(BF16)
    w = rng.uniform(0, 1, (6, 1)).astype(np.float32)
    yo = R.swiglu(x, 2.0).astype(BF16)
    return gy, x, w, yo


def test_out_writes_the_same_results_into_the_given_arrays():
    gy, x, w, yo = _out_case()
    fresh = R.swiglu_group_quant_grad(gy, x, w, yo, np.array([4]), 2.0)
    # Stale contents (NaN everywhere, truncated rows included) must all be overwritten.
    gx_out = np.full(x.shape, np.nan)
    gw_out = np.full(w.shape, np.nan)
    got = R.swiglu_group_quant_grad(gy, x, w, yo, np.array([4]), 2.0, out=[gx_out, gw_out])
    assert got[0] is gx_out and got[1] is gw_out
    np.testing.assert_array_equal(gx_out, fresh[0])
    np.testing.assert_array_equal(gw_out, fresh[1])
    assert not np.isnan(gx_out).any() and np.all(gx_out[4:] == 0.0) and np.all(gw_out[4:] == 0.0)
    # Without weight the second slot is None and stays None.
    gx_only = np.full(x.shape, np.nan)
    got = R.swiglu_group_quant_grad(gy, x, out=(gx_only, None))
    assert got[0] is gx_only and got[1] is None
    np.testing.assert_array_equal(gx_only, R.swiglu_group_quant_grad(gy, x)[0])


def test_out_validation_names_the_slot_and_leaves_arrays_untouched():
    gy, x, w, yo = _out_case()
    gw_ok = np.full(w.shape, 7.0)
    bad = [
        (np.full(x.shape, 7.0), TypeError, "pair"),
        ((np.full(x.shape, 7.0),), TypeError, "pair"),
        ((np.full(x.shape, 7.0, np.float32), gw_ok), TypeError, r"out\[0\].*float64"),
        ((np.full((6, 11), 7.0), gw_ok), ValueError, r"out\[0\].*shape \(6, 10\)"),
        ((np.full((10, 6), 7.0).T, gw_ok), ValueError, r"out\[0\].*C-contiguous"),
        ((np.full(x.shape, 7.0), None), TypeError, r"out\[1\].*ndarray"),
        ((np.full(x.shape, 7.0), np.full((6,), 7.0)), ValueError, r"out\[1\].*shape \(6, 1\)"),
        ((x.tolist(), gw_ok), TypeError, r"out\[0\].*ndarray"),
    ]
    readonly = np.full(x.shape, 7.0)
    readonly.flags.writeable = False
    bad.append(((readonly, gw_ok), ValueError, "writeable"))
    shared = np.full(x.shape, 7.0)
    bad.append(((shared, shared.reshape(-1)[:6].reshape(6, 1)), ValueError, r"out\[1\].*share memory"))
    for out, exc, pattern in bad:
        with pytest.raises(exc, match=pattern):
            R.swiglu_group_quant_grad(gy, x, w, yo, None, 2.0, out=out)
        if isinstance(out, tuple):
            for arr in out:
                if isinstance(arr, np.ndarray):
                    assert np.all(arr == 7.0)
    assert np.all(gw_ok == 7.0)
    with pytest.raises(ValueError, match=r"out\[1\].*None when weight is None"):
        R.swiglu_group_quant_grad(gy, x, out=(np.zeros(x.shape), np.zeros(w.shape)))
    # An output over an input's memory would read results back as inputs.
    buf = np.zeros(x.shape)
    x32 = buf.view(np.float32)[:, :10]      # x's values in the first half of buf's bytes
    x32[...] = x.astype(np.float32)
    with pytest.raises(ValueError, match=r"out\[0\].*share memory"):
        R.swiglu_group_quant_grad(gy.astype(np.float32), x32, out=(buf, None))
    np.testing.assert_array_equal(x32, x.astype(np.float32))


# ----------------------------------------------------------------------------- validation


def test_validation_errors_name_the_argument():
    gy = np.zeros((2, 3), np.float32)
    x = np.zeros((2, 6), np.float32)
    w = np.zeros((2, 1), np.float32)
    yo = np.zeros((2, 3), np.float32)
    cases = [
        (TypeError, "grad_y", {"grad_y": [[0.0]] , "x": x}),
        (TypeError, "grad_y", {"grad_y": gy.astype(np.float64), "x": x}),
        (TypeError, "x", {"grad_y": gy, "x": x.astype(np.int32)}),
        (TypeError, "same dtype", {"grad_y": gy.astype(np.float16), "x": x}),
        (ValueError, "x", {"grad_y": gy, "x": np.zeros((2, 5), np.float32)}),
        (ValueError, "grad_y", {"grad_y": np.zeros((2, 4), np.float32), "x": x}),
        (ValueError, "grad_y", {"grad_y": np.zeros((3, 3), np.float32), "x": x}),
        (ValueError, "grad_y", {"grad_y": np.zeros((1, 2, 3), np.float32), "x": x}),
        (ValueError, "y_origin", {"grad_y": gy, "x": x, "weight": w}),
        (TypeError, "weight", {"grad_y": gy, "x": x, "weight": w.astype(np.float16), "y_origin": yo}),
        (ValueError, "weight", {"grad_y": gy, "x": x, "weight": np.zeros(3, np.float32), "y_origin": yo}),
        (ValueError, "y_origin", {"grad_y": gy, "x": x, "weight": w, "y_origin": np.zeros((2, 4), np.float32)}),
        (TypeError, "y_origin", {"grad_y": gy, "x": x, "weight": w, "y_origin": yo.astype(np.float16)}),
        (TypeError, "group_index", {"grad_y": gy, "x": x, "group_index": np.array([1.0])}),
        (ValueError, "group_index", {"grad_y": gy, "x": x, "group_index": np.array([[1]])}),
        (ValueError, "clamp_limit", {"grad_y": gy, "x": x, "clamp_limit": 0.0}),
        (ValueError, "clamp_limit", {"grad_y": gy, "x": x, "clamp_limit": -1.0}),
        (ValueError, "clamp_limit", {"grad_y": gy, "x": x, "clamp_limit": float("nan")}),
        (ValueError, "clamp_limit", {"grad_y": gy, "x": x, "clamp_limit": float("inf")}),
        (TypeError, "clamp_limit", {"grad_y": gy, "x": x, "clamp_limit": "1"}),
        (TypeError, "clamp_limit", {"grad_y": gy, "x": x, "clamp_limit": True}),
        (ValueError, "rank", {"grad_y": np.zeros((1,) * 9, np.float32), "x": np.zeros((1,) * 8 + (2,), np.float32)}),
    ]
    for exc, word, kwargs in cases:
        with pytest.raises(exc, match=word):
            R.swiglu_group_quant_grad(**kwargs)
    with pytest.raises(ValueError, match="x"):
        R.swiglu(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="clamp_limit"):
        R.device_departures(x, clamp_limit=0)


def test_clamp_limit_accepts_int_and_numpy_scalars():
    gy = np.ones((1, 1), np.float32)
    x = np.array([[3.0, 0.5]], np.float32)
    a, _ = R.swiglu_group_quant_grad(gy, x, clamp_limit=2)
    b, _ = R.swiglu_group_quant_grad(gy, x, clamp_limit=np.float64(2.0))
    np.testing.assert_array_equal(a, b)
    assert a[0, 1] == pytest.approx(silu(2.0), rel=1e-14)


# ----------------------------------------------------------------------------- forward


def test_swiglu_forward_hand_computed():
    x = np.array([[1.0, -2.0, 0.5, 3.0], [4.0, 0.0, -5.0, 2.0]], np.float32)
    y = R.swiglu(x)
    assert y.shape == (2, 2) and y.dtype == np.float64
    np.testing.assert_allclose(y[0], [silu(1.0) * 0.5, silu(-2.0) * 3.0], rtol=1e-14)
    np.testing.assert_allclose(y[1], [silu(4.0) * -5.0, 0.0], rtol=1e-14)
    yc = R.swiglu(x, clamp_limit=2.5)
    np.testing.assert_allclose(yc[0], [silu(1.0) * 0.5, silu(-2.0) * 2.5], rtol=1e-14)
    np.testing.assert_allclose(yc[1], [silu(2.5) * -2.5, 0.0], rtol=1e-14)
    assert math.isnan(R.swiglu(np.array([np.nan, 1.0], np.float32))[0])
    assert R.swiglu(np.array([-800.0, 1.0]))[0] == pytest.approx(-800.0 * math.exp(-800.0), abs=1e-300)


# ----------------------------------------------------------------------------- compare


def test_compare_pass_exact_cast():
    rng = np.random.default_rng(0)
    g = rng.standard_normal((50, 40))
    r = R.compare(g.astype(np.float32), g)
    assert r.passed and r.failures == 0 and r.count == 2000
    assert r.dtype == "float32" and r.tol == 1e-4 and r.allowed_fraction == 1e-4
    assert r.threshold == 2.0**-13 and r.mere_ok and r.mare_ok
    assert r.max_abs_error < 1e-6
    assert bool(r) is True


def test_compare_fail_by_fraction():
    g = np.linspace(-1, 1, 10000)
    a = g.astype(np.float32)
    a[17] += 0.01
    one = R.compare(a, g)
    assert one.passed and one.failures == 1 and one.fail_fraction == 1e-4  # at the limit passes
    assert one.worst_index == (17,)
    a[4000] -= 0.01
    two = R.compare(a, g)
    assert not two.passed and two.failures == 2 and two.fail_fraction == pytest.approx(2e-4)
    assert two.nan_mismatch == 0 and two.inf_mismatch == 0


def test_compare_tolerance_edge_relative_and_absolute():
    g = np.array([0.0, 100.0])
    ok = np.array([1e-4 * 0.99, 100.0 + 0.0101 * 0.99], np.float32)
    r = R.compare(ok, g, dtype=np.float32)
    assert r.failures == 0
    bad = np.array([0.0, 100.0 + 0.0102], np.float32)  # bound = 1e-4 + 1e-2
    assert R.compare(bad, g).failures == 1


def test_compare_nan_mismatch_fails_regardless_of_fraction():
    g = np.ones(100000)
    a = np.ones(100000, np.float32)
    a[5] = np.nan
    r = R.compare(a, g)
    assert not r.passed and r.nan_mismatch == 1 and r.inf_mismatch == 0
    assert r.fail_fraction <= r.allowed_fraction
    assert r.worst_index == (5,)
    # The other way: golden NaN, actual finite.
    g2 = np.ones(10)
    g2[3] = np.nan
    r2 = R.compare(np.ones(10, np.float32), g2)
    assert not r2.passed and r2.nan_mismatch == 1
    # Matching NaN positions pass.
    a3 = np.ones(10, np.float32)
    a3[3] = np.nan
    assert R.compare(a3, g2).passed


def test_compare_inf_sign_mismatch():
    g = np.array([1.0, np.inf, -np.inf])
    assert R.compare(np.array([1.0, np.inf, -np.inf], np.float32), g).passed
    r = R.compare(np.array([1.0, -np.inf, -np.inf], np.float32), g)
    assert not r.passed and r.inf_mismatch == 1 and r.nan_mismatch == 0
    r = R.compare(np.array([1.0, 3e38, -np.inf], np.float32), g)
    assert not r.passed and r.inf_mismatch == 1


def test_compare_fp16_golden_overflows_to_inf():
    g = np.array([70000.0, -70000.0, 65519.0, 1.0])  # 65519 rounds to 65504, still finite
    a = np.array([np.inf, -np.inf, 65504.0, 1.0], np.float16)
    r = R.compare(a, g)
    assert r.passed and r.dtype == "float16" and r.inf_mismatch == 0 and r.count == 4
    a_bad = np.array([65504.0, -np.inf, 65504.0, 1.0], np.float16)
    r = R.compare(a_bad, g)
    assert not r.passed and r.inf_mismatch == 1
    # The same golden judged as fp32 output: 70000 is finite there.
    r32 = R.compare(a.astype(np.float32), g)
    assert not r32.passed and r32.inf_mismatch == 2


def test_compare_bf16_dtype_argument_and_figures():
    g = np.array([1.0, 2.0, 3.0, 1000.0])
    a = g.astype(BF16)
    r = R.compare(a, g)
    assert r.passed and r.dtype == "bfloat16" and r.tol == 4e-3 and r.threshold == 2.0**-7
    r2 = R.compare(a.astype(np.float32), g, dtype="bfloat16")
    assert r2.dtype == "bfloat16" and r2.allowed_fraction == 1e-3


def test_compare_departures_excluded_and_counted():
    g = np.arange(1.0, 21.0).reshape(4, 5)
    a = g.astype(np.float32)
    dep = np.zeros((4, 5), bool)
    dep[1, 2] = dep[3, 4] = dep[0, 0] = True
    a[1, 2] = np.nan
    a[3, 4] = np.nan
    a[0, 0] = 1.0  # departure position where the actual happens to be fine
    r = R.compare(a, g, departures=dep)
    assert r.passed and r.count == 17 and r.departures == 3 and r.departures_nan == 2
    assert r.nan_mismatch == 0
    assert not R.compare(a, g).passed


def test_compare_mere_mare_constructed():
    g = np.array([1.0, 2.0, 0.5, 4.0])
    a = np.array([1.0 + 2.0**-10, 2.0, 0.5, 4.0 - 2.0**-9], np.float32)
    r = R.compare(a, g)
    rel0 = 2.0**-10 / (1.0 + 1e-7)
    rel3 = 2.0**-9 / (4.0 + 1e-7)
    assert r.mere == pytest.approx((rel0 + rel3) / 4, rel=1e-12)
    assert r.mare == pytest.approx(rel0, rel=1e-12)
    assert r.max_abs_error == 2.0**-9
    assert r.mere_ok is False and r.mare_ok is True  # 2**-10 < 10 * 2**-13
    assert r.failures == 2 and not r.passed
    assert r.worst_index == (0,)  # error/bound: 2**-10 / 2e-4 beats 2**-9 / 5e-4


def test_compare_zero_golden_relative_error_uses_epsilon():
    r = R.compare(np.array([1e-5], np.float32), np.array([0.0]))
    assert r.mere == pytest.approx(float(np.float32(1e-5)) / 1e-7, rel=1e-12)
    assert r.passed  # absolute term of the tolerance covers it


def test_compare_empty_and_errors():
    r = R.compare(np.zeros((0, 3), np.float32), np.zeros((0, 3)))
    assert r.passed and r.count == 0 and r.failures == 0 and r.mere == 0.0 and r.mare == 0.0
    assert r.worst_index is None and r.fail_fraction == 0.0
    with pytest.raises(ValueError, match="shape"):
        R.compare(np.zeros(3, np.float32), np.zeros(4))
    with pytest.raises(TypeError, match="dtype"):
        R.compare(np.zeros(3, np.float32), np.zeros(3), dtype=np.float64)
    with pytest.raises(ValueError, match="departures"):
        R.compare(np.zeros(3, np.float32), np.zeros(3), departures=np.zeros(4, bool))


def test_compare_str_and_to_dict():
    g = np.linspace(-1, 1, 1000)
    a = g.astype(np.float16)
    a[3] = np.nan
    dep = np.zeros(1000, bool)
    dep[10] = True
    r = R.compare(a, g, departures=dep)
    s = str(r)
    assert s.startswith("FAIL float16")
    assert "MERE" in s and "MARE" in s and "NaN mismatches 1" in s and "departures 1" in s
    assert len(s.splitlines()) == 2
    d = r.to_dict()
    back = json.loads(json.dumps(d))
    assert back["passed"] is False and back["nan_mismatch"] == 1 and back["dtype"] == "float16"
    assert back["worst_index"] == [3] and back["count"] == 999 and back["departures"] == 1
    assert set(back) == {
        "passed", "dtype", "count", "failures", "fail_fraction", "allowed_fraction", "tol",
        "max_abs_error", "mere", "mare", "mere_ok", "mare_ok", "threshold", "nan_mismatch",
        "inf_mismatch", "departures", "departures_nan", "worst_index",
    }
    assert str(R.compare(g.astype(np.float32), g)).startswith("PASS float32")


# ----------------------------------------------------------------------------- memory


def test_memory_bounded_on_large_bf16_input():
    T, H = 4096, 4096
    rng = np.random.default_rng(3)
    gy = rng.standard_normal((T, H), dtype=np.float32).astype(BF16)
    x = (rng.standard_normal((T, 2 * H), dtype=np.float32) * 3).astype(BF16)
    yo = rng.standard_normal((T, H), dtype=np.float32).astype(BF16)
    w = rng.random((T, 1), dtype=np.float32)
    in_bytes = gy.nbytes + x.nbytes + yo.nbytes + w.nbytes
    # Peak resident memory of the whole process during the call (large outputs are anonymous
    # mappings that tracemalloc does not see): /proc/self/clear_refs resets the high-water mark.
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    before = _status_kib("VmRSS")
    gx, gw = R.swiglu_group_quant_grad(gy, x, w, yo, group_index=np.array([T]), clamp_limit=7.0)
    peak = (_status_kib("VmHWM") - before) * 1024
    out_bytes = gx.nbytes + gw.nbytes
    assert gx.nbytes == 2 * (gy.nbytes + x.nbytes + yo.nbytes)  # float64 grad_x alone is 2x the bf16 data
    assert peak < 3 * in_bytes
    assert peak - out_bytes < 32 * 2**20  # temporaries are bounded, not input-sized
    # Spot-check a few rows against the hand formula.
    for t in (0, 1234, T - 1):
        exp_row = expected_row(
            gy[t, :8].astype(np.float64).tolist(),
            x[t, :8].astype(np.float64).tolist(),
            x[t, H : H + 8].astype(np.float64).tolist(),
            w=float(w[t, 0]),
            c=7.0,
        )
        np.testing.assert_allclose(gx[t, :8], exp_row[:8], rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(gx[t, H : H + 8], exp_row[8:], rtol=1e-12, atol=1e-300)


# ----------------------------------------------------------------------------- departures, step by step
#
# Each case is one row, H = 2: column 0 of each half hits a step of the device's fp32 sequence that
# gives inf, NaN or 0 where the real-number math does not; column 1 is ordinary. The emulator (the
# public one-shot call) shows what the device does; the hand formula says what the math gives.

F32 = np.float32
DEPARTURE_CASES = {
    # name: (dtype, gy, x0, x1, weight, clamp, {column: what the device gives}, unmarked columns)
    "exp overflow without clamp": (F32, [2.0, 1.0], [89.0, 0.5], [0.0, 1.0], None, None,
                                   {0: "nan", 2: "nan"}, [1, 3]),
    "flushed exp meets x1 = +inf": (F32, [1.0, 1.0], [-90.0, 0.5], [np.inf, 1.0], None, None,
                                    {0: "nan"}, [1, 2, 3]),
    "flushed exp meets x1 = -inf": (BF16, [2.0, 1.0], [-100.0, 0.5], [-np.inf, 1.0], None, None,
                                    {0: "nan"}, [1, 2, 3]),
    "gy * x1 beyond fp32, true result finite": (F32, [1e30, 1.0], [-20.0, 0.5], [1e10, 1.0], None, None,
                                                {0: "-inf"}, [1, 2, 3]),
    "gy * weight beyond fp32, true result finite": (F32, [1e30, 1.0], [0.5, 0.5], [1e-5, 1.0], 1e10, None,
                                                    {0: "inf"}, [1, 3]),
    "masked gy * x1 overflow": (F32, [1e37, 1.0], [85.0, 0.5], [80.0, 1.0], None, 81.0, {0: "nan"}, [1, 3]),
    "masked gy * silu overflow": (F32, [1e37, 1.0], [50.0, 0.5], [90.0, 1.0], None, 81.0, {2: "nan"}, [1, 3]),
    "masked weight overflow": (F32, [3e38, 1.0], [5.0, 0.5], [1.0, 1.0], 10.0, 2.0, {0: "nan"}, [1, 3]),
    "flushed exp, gy * x1 large but finite": (F32, [1e20, 1.0], [-88.0, 0.5], [1e18, 1.0], None, None,
                                              {0: "zero"}, [1, 2, 3]),
}


def _math_row(gy, x0, x1, w, c):
    """The real-number gradient, in Python floats (inf where the math itself is infinite)."""
    row = []
    for g, a0, a1 in zip(gy, x0, x1):
        g = g * (w if w is not None else 1.0)
        a, b = (a0, a1) if c is None else (min(a0, c), min(max(a1, -c), c))
        s = sig(a)
        d = s * (1.0 + a * (1.0 - s))
        m0 = 1.0 if c is None or a0 < c else 0.0
        m1 = 1.0 if c is None or -c < a1 < c else 0.0
        row.append((g * b * d * m0) if m0 else 0.0)
    for g, a0, a1 in zip(gy, x0, x1):
        g = g * (w if w is not None else 1.0)
        a = a0 if c is None else min(a0, c)
        s = sig(a)
        m1 = 1.0 if c is None or -c < a1 < c else 0.0
        row.append(g * a * s * m1 if m1 else 0.0)
    return row


@pytest.mark.parametrize("case", list(DEPARTURE_CASES))
def test_each_departure_matches_the_emulator(case):
    import acl_swiglu

    dtype, gy, x0, x1, w, clamp, device_gives, unmarked = DEPARTURE_CASES[case]
    grad_y = np.array([gy], np.float32).astype(dtype)
    x = np.array([x0 + x1], np.float32).astype(dtype)
    weight = None if w is None else np.array([[w]], np.float32)
    y_origin = None if w is None else np.zeros_like(grad_y)
    grad_x, _ = acl_swiglu.swiglu_group_quant_grad(grad_y, x, weight, y_origin, None, clamp)
    device = grad_x.astype(np.float64)[0]
    math_row = _math_row([float(v) for v in grad_y[0]], [float(v) for v in x[0, :2]],
                         [float(v) for v in x[0, 2:]], w, None if clamp is None else f32(clamp))
    dep = R.device_departures(x, clamp, None, grad_y=grad_y, weight=weight)
    for column, gives in device_gives.items():
        value = device[column]
        assert {"nan": math.isnan(value), "inf": value == math.inf, "-inf": value == -math.inf,
                "zero": value == 0}[gives], (case, column, value)
        # ... where the math does not
        expected = math_row[column]
        assert not math.isnan(expected)
        if gives == "zero":
            assert abs(expected) > 1.0, expected
        elif gives != "nan":
            assert math.isfinite(expected), expected
        assert dep[0, column], (case, column)
    for column in unmarked:
        assert not dep[0, column], (case, column)
    golden, _ = R.swiglu_group_quant_grad(grad_y, x, weight, y_origin, None, clamp)
    assert R.compare(grad_x, golden, departures=dep).passed
    assert not R.compare(grad_x, golden).passed
    assert not R.compare(grad_x, golden, departures=R.device_departures(x, clamp)).passed or case in (
        "exp overflow without clamp", "flushed exp meets x1 = +inf", "flushed exp meets x1 = -inf")


def test_departures_never_mark_rows_past_trunc_or_ordinary_values():
    rng = np.random.default_rng(5)
    gy = rng.standard_normal((16, 32)).astype(np.float32)
    x = (rng.standard_normal((16, 64)) * 4).astype(np.float32)
    x[3, 0] = 95.0
    x[12, 1] = 95.0                          # past trunc
    dep = R.device_departures(x, None, np.array([10], np.int64), grad_y=gy)
    assert np.flatnonzero(dep.reshape(-1)).tolist() == [3 * 64 + 0, 3 * 64 + 32]


def test_departures_check_grad_y_and_weight():
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="grad_y must have shape"):
        R.device_departures(x, grad_y=np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="weight must be a float32"):
        R.device_departures(x, grad_y=np.zeros((2, 2), np.float32), weight=np.zeros(3, np.float32))


def test_flush_threshold_is_where_the_emulator_flushes():
    import acl_swiglu

    below = float(np.nextafter(np.float32(R.EXP_FLUSH_X), np.float32(-100)))
    x = np.array([[below, R.EXP_FLUSH_X, 1.0, 1.0]], np.float32)
    gx, _ = acl_swiglu.swiglu_group_quant_grad(np.ones((1, 2), np.float32), x)
    assert gx[0, 2] == 0 and np.signbit(gx[0, 2])        # silu = x0 * 0 = -0.0
    assert gx[0, 3] < 0                                   # x0 * FLT_MIN-ish: not flushed


@pytest.mark.parametrize("value", [1e-50, 1e-46, 5e-324])
def test_a_clamp_that_rounds_to_zero_in_fp32_is_refused_like_a_call(value):
    import acl_swiglu
    from acl_swiglu.errors import ArgumentError

    gy = np.ones((1, 1), np.float32)
    x = np.ones((1, 2), np.float32)
    with pytest.raises(ArgumentError, match="rounds to 0 in float32") as ref_error:
        R.swiglu_group_quant_grad(gy, x, clamp_limit=value)
    with pytest.raises(ArgumentError) as call_error:
        acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=value)
    assert str(ref_error.value) == str(call_error.value)
    for fn in (lambda: R.swiglu(x, value), lambda: R.device_departures(x, value)):
        with pytest.raises(ArgumentError, match="rounds to 0 in float32"):
            fn()


def test_a_clamp_beyond_fp32_is_refused_like_a_call():
    from acl_swiglu.errors import ArgumentError

    with pytest.raises(ArgumentError, match="beyond float32 range"):
        R.swiglu_group_quant_grad(np.ones((1, 1), np.float32), np.ones((1, 2), np.float32), clamp_limit=1e39)
