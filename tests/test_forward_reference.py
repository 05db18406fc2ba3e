"""The forward's number formats (acl_swiglu.formats) and its reference
(acl_swiglu.reference.swiglu_group_quant, compare_quantised) against the bit-exact model of the
emulator (tests/forward_model.py): the reference agrees with the model under the comparison's
rules on many seeded problems and on the documented special blocks and groups, and the
comparison catches real errors."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import forward_model as fm
from forward_model import BF16, COMBINATION_IDS, COMBINATIONS, F32, NAMES
from acl_swiglu import formats, reference


# ----------------------------------------------------------------------------- formats


def test_the_destination_types_carry_their_codes_maxima_modes_and_storage():
    table = {name: (t.acl_code, t.max, t.quant_modes, t.bits, t.packed) for name, t in formats.DST_TYPES.items()}
    assert table == {
        "float8_e4m3fn": (36, 448.0, (0, 1), 8, False),
        "float8_e5m2": (35, 57344.0, (0, 1), 8, False),
        "float4_e2m1fn": (40, 6.0, (1,), 4, True),
        "float4_e1m2": (41, 1.75, (1,), 4, True),
        "hifloat8": (34, 32768.0, (2, 3), 8, False),
    }
    assert formats.DST_TYPES["float8_e4m3fn"].storage_dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert formats.DST_TYPES["float8_e5m2"].storage_dtype == np.dtype(ml_dtypes.float8_e5m2)
    for name in ("float4_e2m1fn", "float4_e1m2", "hifloat8"):
        assert formats.DST_TYPES[name].storage_dtype == np.uint8
    assert formats.DST_TYPES["float4_e1m2"].storage_shape((3, 256)) == (3, 128)
    assert formats.DST_TYPES["float8_e5m2"].storage_shape((3, 256)) == (3, 256)
    with pytest.raises(ValueError, match="even"):
        formats.DST_TYPES["float4_e2m1fn"].storage_shape((3, 5))


@pytest.mark.parametrize("value,name", [
    ("float8_e4m3fn", "float8_e4m3fn"), (ml_dtypes.float8_e4m3fn, "float8_e4m3fn"),
    (np.dtype(ml_dtypes.float8_e5m2), "float8_e5m2"), (ml_dtypes.float4_e2m1fn, "float4_e2m1fn"),
    ("float4_e1m2", "float4_e1m2"), ("hifloat8", "hifloat8"), (formats.DST_TYPES["float8_e5m2"], "float8_e5m2"),
])
def test_a_destination_type_is_named_or_given_as_its_ml_dtypes_dtype(value, name):
    assert formats.as_dst_type(value) is formats.DST_TYPES[name]


@pytest.mark.parametrize("value,error,words", [
    (36, TypeError, "not the number 36"), (np.int64(40), TypeError, "aclDataType codes are not accepted"),
    (True, TypeError, "number"), (None, TypeError, "NoneType"), (3.0, TypeError, "float"),
    ("e4m3", ValueError, "'e4m3' is not a destination type"), ("FLOAT8_E4M3FN", ValueError, "not a destination"),
    (np.float16, ValueError, "float16 is not a destination type"), (np.dtype(np.uint8), ValueError, "uint8"),
    (ml_dtypes.float8_e4m3fnuz, ValueError, "float8_e4m3fnuz"), (ml_dtypes.float8_e8m0fnu, ValueError, "e8m0"),
])
def test_anything_else_is_refused_naming_dst_type(value, error, words):
    with pytest.raises(error) as info:
        formats.as_dst_type(value)
    assert "dst_type" in str(info.value) and words in str(info.value)
    assert "float8_e4m3fn" in str(info.value)   # says what is accepted


def test_importing_the_package_and_formats_does_not_import_ml_dtypes():
    code = ("import sys, acl_swiglu, acl_swiglu.formats, acl_swiglu.reference\n"
            "assert 'ml_dtypes' not in sys.modules, 'imported ml_dtypes'\n"
            "acl_swiglu.formats.as_dst_type('float4_e1m2'); acl_swiglu.formats.pack_fp4([0.5, 1.0], 'float4_e1m2')\n"
            "assert 'ml_dtypes' not in sys.modules, 'FP4 packing imported ml_dtypes'\n"
            "acl_swiglu.formats.DST_TYPES['float8_e5m2'].storage_dtype\n"
            "assert 'ml_dtypes' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E1M2_VALUES = [0.25 * k for k in range(8)]


@pytest.mark.parametrize("name,values", [("float4_e2m1fn", E2M1_VALUES), ("float4_e1m2", E1M2_VALUES)])
def test_fp4_codes_round_trip_and_pack_low_nibble_first(name, values):
    codes = np.arange(16, dtype=np.uint8)
    expected = np.array(values + [-v for v in values], F32)
    packed = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)
    unpacked = formats.unpack_fp4(packed, name)
    assert unpacked.dtype == F32 and unpacked.shape == (16,)
    np.testing.assert_array_equal(unpacked, expected)
    assert np.signbit(unpacked[8])            # code 8 is -0.0
    np.testing.assert_array_equal(formats.pack_fp4(unpacked, name), packed)
    # element 0 in the low nibble of byte 0, element 1 in its high nibble
    assert formats.pack_fp4(np.array([values[1], values[2]], F32), name)[0] == 0x21
    assert formats.unpack_fp4(np.array([[0x21]], np.uint8), name).tolist() == [[values[1], values[2]]]


@pytest.mark.parametrize("name,cases", [
    ("float4_e2m1fn", [(0.25, 0x0), (0.75, 0x2), (1.25, 0x2), (1.75, 0x4), (2.5, 0x4), (3.5, 0x6), (5.0, 0x6),
                       (0.2500001, 0x1), (5.0000005, 0x7), (7.0, 0x7), (1e30, 0x7), (np.inf, 0x7), (-np.inf, 0xF),
                       (-0.0, 0x8), (np.nan, 0x0), (-1.3, 0xB), (1e-30, 0x0), (-1e-30, 0x8)]),
    ("float4_e1m2", [(0.125, 0x0), (0.375, 0x2), (0.625, 0x2), (0.875, 0x4), (1.125, 0x4), (1.375, 0x6),
                     (1.625, 0x6), (1.8, 0x7), (2.0, 0x7), (np.inf, 0x7), (np.nan, 0x0), (-0.4, 0xA)]),
])
def test_fp4_packing_rounds_half_to_even_saturates_and_stores_nan_as_zero(name, cases):
    values = np.array([v for v, _ in cases] + [0.0] * (len(cases) % 2), np.float64)
    codes = [c for _, c in cases] + [0] * (len(cases) % 2)
    packed = formats.pack_fp4(values, name)
    got = np.empty(2 * packed.size, np.uint8)
    got[0::2], got[1::2] = packed & 0x0F, packed >> 4
    assert got.tolist() == codes


def test_fp4_packing_agrees_with_ml_dtypes_e2m1_and_with_rint_for_e1m2():
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.uniform(-8, 8, 20000), rng.uniform(-0.01, 0.01, 2000),
                             np.repeat(np.arange(-14, 15) * 0.25, 2)]).astype(F32)
    values = values[: values.size // 2 * 2]
    e2m1 = formats.pack_fp4(values, "float4_e2m1fn")
    ml = values.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F
    np.testing.assert_array_equal(e2m1, ml[0::2] | (ml[1::2] << 4))
    e1m2 = formats.pack_fp4(values, "float4_e1m2")
    mags = np.minimum(np.rint(np.abs(values.astype(np.float64)) / 0.25), 7).astype(np.uint8) | \
        (np.signbit(values).astype(np.uint8) << 3)
    np.testing.assert_array_equal(e1m2, mags[0::2] | (mags[1::2] << 4))


def test_fp4_helpers_refuse_bad_arguments():
    with pytest.raises(ValueError, match="dst_type must be an FP4 type"):
        formats.unpack_fp4(np.zeros(2, np.uint8), "float8_e4m3fn")
    with pytest.raises(TypeError, match="dst_type"):
        formats.pack_fp4([0.5, 1.0], 40)
    with pytest.raises(TypeError, match="uint8"):
        formats.unpack_fp4(np.zeros(2, np.int16), "float4_e1m2")
    with pytest.raises(ValueError, match="even last dim"):
        formats.pack_fp4(np.zeros(3, F32), "float4_e1m2")
    with pytest.raises(TypeError, match="real numbers"):
        formats.pack_fp4(np.array(["a", "b"]), "float4_e1m2")


def test_e8m0_scales_are_powers_of_two_and_0xff_is_nan():
    b = np.arange(256, dtype=np.uint8)
    values = formats.e8m0_scales(b)
    assert values.dtype == F32
    for byte in range(255):
        assert values[byte] == np.ldexp(1.0, byte - 127), byte   # 2^-127 is an fp32 subnormal, exact
    assert np.isnan(values[255])
    np.testing.assert_array_equal(formats.e8m0_scales(b.reshape(16, 16)), values.reshape(16, 16))


def test_the_e8m0_view_shares_the_bytes_and_never_converts():
    b = np.array([0, 1, 127, 200, 254, 255], np.uint8)
    view = formats.e8m0_view(b)
    assert view.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
    assert np.shares_memory(view, b)
    np.testing.assert_array_equal(view.view(np.uint8), b)
    np.testing.assert_array_equal(view.astype(np.float64)[:-1], formats.e8m0_scales(b)[:-1])
    assert formats.e8m0_view(view) is view
    np.testing.assert_array_equal(formats.e8m0_scales(view), formats.e8m0_scales(b))
    with pytest.raises(TypeError, match="uint8"):
        formats.e8m0_view(np.zeros(3, F32))
    with pytest.raises(TypeError, match="uint8"):
        formats.e8m0_scales(np.zeros(3, np.int8))


# ----------------------------------------------------------------------------- reference vs model


def _random_problem(seed, x_dtype, rows=24, hidden=512, specials=False):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-6, 6, (rows, 2 * hidden))
    if specials:
        where = rng.random(x.shape) < 0.01
        x[where] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0, 100.0, -100.0, 1e-6, 3e4], where.sum())
    weight = rng.uniform(-2, 2, rows).astype(F32)
    return x.astype(x_dtype), weight


def _as_storage(codes, scales, dst, mode, x):
    d = formats.as_dst_type(NAMES[dst])
    lead = x.shape[:-1]
    y = codes.reshape(lead + (-1,))
    y = y if d.packed else y.view(d.storage_dtype)
    s = scales.reshape(lead + (-1,)) if mode == 0 else formats.e8m0_view(scales.reshape(lead + (-1, 2)))
    return y, s


@pytest.mark.parametrize("x_dtype", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("dst,mode,round_scale", COMBINATIONS, ids=COMBINATION_IDS)
@pytest.mark.parametrize("seed", range(4))
def test_the_model_passes_the_comparison_with_the_reference(x_dtype, dst, mode, round_scale, seed):
    options = seed % 4
    x, weight = _random_problem(seed * 101 + dst, x_dtype, specials=options >= 2)
    w = weight if options % 2 else None
    clamp = 2.5 if options % 2 else None
    groups = np.array([9, 7], np.int64) if options >= 2 else None
    codes, scales = fm.forward(x, w, groups, dst=dst, quant_mode=mode, round_scale=round_scale, clamp=clamp)
    y, s = _as_storage(codes, scales, dst, mode, x)
    verdict = reference.compare_quantised(y, s, x, w, groups, dst_type=NAMES[dst], quant_mode=mode,
                                          round_scale=round_scale, clamp_limit=clamp)
    assert verdict.passed, str(verdict)
    assert verdict.rows_judged == (16 if groups is not None else 24)
    assert verdict.count == verdict.rows_judged * 512
    # Nearly every code is the reference's own: the one-step allowance is the exception.
    assert verdict.near_midpoint <= verdict.count * 1e-3
    ry, rs = reference.swiglu_group_quant(x, w, groups, dst_type=NAMES[dst], quant_mode=mode,
                                          round_scale=round_scale, clamp_limit=clamp)
    if round_scale:   # power-of-two scales: the very bytes (no random problem sits on an exponent step)
        np.testing.assert_array_equal(np.asarray(rs).view(np.uint8), np.asarray(s).view(np.uint8))


def test_the_golden_problems_pass_the_comparison():
    """native/tests/test_forward_golden.c's inputs: special values in x (gates of -100, whose
    swish is -0 on the device, among them), weight, clamp, groups."""
    for case in fm.golden_cases():
        x, w, g, c, _, _ = fm.golden_problem(case)
        codes, scales = fm.forward(x, w, g, dst=case.dst, quant_mode=case.quant_mode,
                                   round_scale=case.round_scale, clamp=c)
        y, s = _as_storage(codes, scales, case.dst, case.quant_mode, x)
        verdict = reference.compare_quantised(y, s, x, w, g, dst_type=NAMES[case.dst], quant_mode=case.quant_mode,
                                              round_scale=case.round_scale, clamp_limit=c)
        assert verdict.passed, f"{case.name}\n{verdict}"


def _exact_y_rows(values, x_dtype):
    """x with x0 = 128 (exp(-128) is 0 in fp32 and the swish is exactly 128) and x1 = values / 128."""
    values = np.asarray(values, np.float64)
    x = np.empty(values.shape[:-1] + (2 * values.shape[-1],))
    h = values.shape[-1]
    x[..., :h] = 128.0
    x[..., h:] = values / 128.0
    out = x.astype(x_dtype)
    assert np.array_equal(out[..., h:].astype(np.float64) * 128, values, equal_nan=True)
    return out


@pytest.mark.parametrize("x_dtype", [np.float16, BF16], ids=["fp16", "bf16"])
def test_special_groups_in_mode_1_fp8(x_dtype):
    """amax = +inf: byte 0xFF and multiplier -inf; amax = NaN: byte 0x00 and multiplier -2^127;
    an all-zero group: the 1e-4 floor. The reference gives the documented bytes, as the model."""
    y = np.zeros((1, 128))
    y[0, :4] = [np.inf, 1.0, -2.0, 0.0]
    y[0, 32:36] = [np.nan, 1.0, -1.0, 0.0]
    y[0, 64:66] = [57344.0, 1.0]
    x = _exact_y_rows(y, x_dtype)
    ry, rs = reference.swiglu_group_quant(x, dst_type="float8_e5m2", quant_mode=1, round_scale=True)
    assert np.asarray(rs).view(np.uint8).reshape(-1).tolist() == [0xFF, 0x00, 127, 98]
    codes = ry.view(np.uint8)[0]
    assert codes[:4].tolist() == [0xFC, 0xFC, 0x7C, 0x7E]       # -inf, -inf, +inf, NaN
    assert codes[32:36].tolist() == [0x7E, 0xFC, 0x7C, 0x80]    # NaN, -inf, +inf, -0
    assert codes[64:66].tolist() == [0x7B, 0x3C]
    mc, ms = fm.forward(x, dst=fm.E5M2, quant_mode=1, round_scale=True)
    np.testing.assert_array_equal(codes, mc[0])
    np.testing.assert_array_equal(np.asarray(rs).view(np.uint8).reshape(-1), ms[0])


@pytest.mark.parametrize("x_dtype", [np.float16, BF16], ids=["fp16", "bf16"])
def test_special_blocks_in_mode_0(x_dtype):
    """inf and NaN count as 0 for amax and pass through; an all-zero block (of -0, made +0 by the
    +0 step) takes the floor's scale."""
    y = np.zeros((1, 256))
    y[0, :6] = [np.inf, -np.inf, np.nan, 2.0, 1.0, -2.0]
    y[0, 128:] = -0.0
    x = _exact_y_rows(y, x_dtype)
    for name, rounded, scales, codes in (
        ("float8_e4m3fn", True, [0x3C000000, 0x34800000], [0x7F, 0x7F, 0x7F, 0x78, 0x70, 0xF8]),
        ("float8_e4m3fn", False, [0x3B924925, 0x346FACAD], [0x7F, 0x7F, 0x7F, 0x7E, 0x76, 0xFE]),
        ("float8_e5m2", True, [0x38800000, 0x31000000], [0x7C, 0xFC, 0x7E, 0x78, 0x74, 0xF8]),
    ):
        ry, rs = reference.swiglu_group_quant(x, dst_type=name, quant_mode=0, round_scale=rounded)
        assert rs.dtype == F32 and rs.view(np.uint32)[0].tolist() == scales
        assert ry.view(np.uint8)[0, :6].tolist() == codes
        assert not ry.view(np.uint8)[0, 128:].any()     # +0, not -0


@pytest.mark.parametrize("x_dtype", [np.float16, BF16], ids=["fp16", "bf16"])
def test_special_groups_in_mode_1_fp4(x_dtype):
    """inf or NaN in a group: byte 0xFF, every code +0; no +0 step: -0 stays -0 (0x8); the ST
    pattern (x0 = 1, x1 = +-1) gives bytes 0xF7 / 0xE6 with scales 124 / 126."""
    y = np.zeros((1, 128))
    y[0, 0:2] = [np.inf, 4.0]
    y[0, 33:35] = [np.nan, -1.0]
    y[0, 64:67] = [0.5, 1.0, -0.0]
    x = _exact_y_rows(y, x_dtype)
    ry, rs = reference.swiglu_group_quant(x, dst_type="float4_e2m1fn", quant_mode=1, round_scale=True)
    assert np.asarray(rs).view(np.uint8).reshape(-1).tolist() == [0xFF, 0xFF, 125, 0]
    assert ry.dtype == np.uint8 and ry.shape == (1, 64)
    assert not ry[0, :32].any()
    assert ry[0, 32:34].tolist() == [0x64, 0x08]
    st = np.ones((4, 512), x_dtype)
    st[:, 256:] = np.where(np.arange(256) % 2 == 0, 1.0, -1.0)
    for name, byte, scale in (("float4_e2m1fn", 0xF7, 124), ("float4_e1m2", 0xE6, 126)):
        ry, rs = reference.swiglu_group_quant(st, dst_type=name, quant_mode=1, round_scale=True)
        assert (ry == byte).all() and (np.asarray(rs).view(np.uint8) == scale).all()


def test_the_fp4_sticky_bit_rounds_fp16_values_just_above_a_tie_up():
    """0x3D01 (1.25 + 2^-10) truncated to bf16 would be the tie 1.25 (-> 1.0); bit 3 keeps its
    low bits, so it rounds up to 1.5. The exact tie 0x3D00 goes to 1.0."""
    v = np.zeros(128, np.float16)
    v[:3] = np.array([0x4600, 0x3D01, 0x3D00], np.uint16).view(np.float16)   # 6.0 sets the multiplier to 1
    x = _exact_y_rows(v.astype(np.float64)[None], np.float16)
    ry, rs = reference.swiglu_group_quant(x, dst_type="float4_e2m1fn", quant_mode=1, round_scale=True)
    assert ry[0, 0] == 0x37 and ry[0, 1] & 0x0F == 0x2
    mc, _ = fm.forward(x, dst=fm.E2M1, quant_mode=1, round_scale=True)
    np.testing.assert_array_equal(ry[0], mc[0])


def test_rows_past_trunc_are_zero_or_left_in_the_given_buffers():
    x, w = _random_problem(3, np.float16, rows=6, hidden=256)
    groups = np.array([2, 1, 0], np.int64)
    y, s = reference.swiglu_group_quant(x, w, groups, dst_type="float8_e4m3fn", quant_mode=1, round_scale=True)
    assert y.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and s.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
    assert s.shape == (6, 4, 2)
    assert not y.view(np.uint8)[3:].any() and not s.view(np.uint8)[3:].any()
    assert y.view(np.uint8)[:3].any()
    y_out = np.full((6, 256), 0xA5, np.uint8).view(ml_dtypes.float8_e4m3fn)
    s_out = np.full((6, 4, 2), 0xA5, np.uint8)
    y2, s2 = reference.swiglu_group_quant(x, w, groups, dst_type="float8_e4m3fn", quant_mode=1, round_scale=True,
                                          out=(y_out, s_out))
    assert y2 is y_out and np.shares_memory(s2, s_out)
    assert (y_out.view(np.uint8)[3:] == 0xA5).all() and (s_out[3:] == 0xA5).all()
    np.testing.assert_array_equal(y_out.view(np.uint8)[:3], y.view(np.uint8)[:3])
    for bad in ([0], [-5, 2]):   # a sum of 0 or below: nothing is computed
        y, _ = reference.swiglu_group_quant(x, w, np.array(bad), dst_type="float8_e5m2")
        assert not y.view(np.uint8).any()


# ----------------------------------------------------------------------------- the comparison


def _model_result(dst=fm.E4M3FN, mode=1, round_scale=True, seed=11):
    x, w = _random_problem(seed, np.float16, rows=8, hidden=256)
    codes, scales = fm.forward(x, w, dst=dst, quant_mode=mode, round_scale=round_scale)
    return x, w, codes.copy(), scales.copy()


def _judge(x, w, codes, scales, dst=fm.E4M3FN, mode=1, round_scale=True):
    y, s = _as_storage(codes, scales, dst, mode, x)
    return reference.compare_quantised(y, s, x, w, dst_type=NAMES[dst], quant_mode=mode, round_scale=round_scale)


def test_the_comparison_fails_a_code_two_steps_off_or_one_step_off_away_from_a_midpoint():
    x, w, codes, scales = _model_result()
    assert _judge(x, w, codes, scales).passed
    magnitudes = codes & 0x7F
    t, h = np.argwhere((magnitudes > 8) & (magnitudes < 0x70))[0]
    for step in (1, 2):
        bad = codes.copy()
        bad[t, h] += step
        verdict = _judge(x, w, bad, scales)
        assert not verdict.passed and verdict.code_mismatches == 1
        assert verdict.worst_index == (int(t), int(h))
        assert "FAIL" in str(verdict)


def test_the_comparison_fails_nan_and_inf_positions_and_scales():
    x, w, codes, scales = _model_result(dst=fm.E5M2)
    bad = codes.copy()
    bad[0, 0] = 0x7E                     # NaN where the reference has a number
    assert _judge(x, w, bad, scales, dst=fm.E5M2).nan_mismatch == 1
    bad = codes.copy()
    bad[0, 0] = 0x7C if codes[0, 0] & 0x80 else 0xFC   # inf of the wrong sign... or where there is none
    assert _judge(x, w, bad, scales, dst=fm.E5M2).inf_mismatch == 1
    bad_scales = scales.copy()
    bad_scales[1, 2] += 1
    verdict = _judge(x, w, codes, bad_scales, dst=fm.E5M2)
    assert not verdict.passed and verdict.scale_mismatches == 1


def test_the_comparison_allows_mode_0_exact_scales_a_few_ulps_apart_only():
    x, w, codes, scales = _model_result(mode=0, round_scale=False)
    near = scales.copy()
    near.view(np.uint32)[0, 0] += 3
    assert _judge(x, w, codes, near, mode=0, round_scale=False).passed
    far = scales.copy()
    far.view(np.uint32)[0, 0] += 40
    assert _judge(x, w, codes, far, mode=0, round_scale=False).scale_mismatches == 1


def test_the_comparison_judges_rows_before_trunc_only():
    x, w = _random_problem(5, BF16, rows=6, hidden=256)
    groups = np.array([4], np.int64)
    codes, scales = fm.forward(x, w, groups, dst=fm.E2M1, quant_mode=1, round_scale=True)
    codes[4:] = 0xA5
    scales[4:] = 0x5A
    y, s = _as_storage(codes, scales, fm.E2M1, 1, x)
    verdict = reference.compare_quantised(y, s, x, w, groups, dst_type="float4_e2m1fn", quant_mode=1,
                                          round_scale=True)
    assert verdict.passed and verdict.rows_judged == 4 and verdict.scale_count == 4 * 8
    codes[3, 0] ^= 0x22
    y, s = _as_storage(codes, scales, fm.E2M1, 1, x)
    assert not reference.compare_quantised(y, s, x, w, groups, dst_type="float4_e2m1fn", quant_mode=1,
                                           round_scale=True).passed


@pytest.mark.parametrize("kwargs,error,words", [
    (dict(dst_type=36), TypeError, "dst_type"),
    (dict(dst_type="hifloat8", quant_mode=2), ValueError, "quant_mode 2 (static HiFloat8) is not emulated"),
    (dict(dst_type="float8_e4m3fn", quant_mode=5), ValueError, "not emulated"),
    (dict(dst_type="hifloat8", quant_mode=0), ValueError, "hifloat8"),
    (dict(dst_type="float4_e2m1fn", quant_mode=0), ValueError, "needs quant_mode 1"),
    (dict(dst_type="float8_e4m3fn", quant_mode=1), ValueError, "round_scale must be True"),
    (dict(dst_type="float8_e4m3fn", quant_mode=4), ValueError, "quant_mode must be 0"),
    (dict(dst_type="float8_e4m3fn", quant_mode=True), TypeError, "quant_mode"),
    (dict(dst_type="float8_e4m3fn", block_size=32), ValueError, "block_size must be 0 or 128"),
    (dict(dst_type="float8_e5m2", quant_mode=1, round_scale=True, block_size=128), ValueError, "0 or 32"),
    (dict(dst_type="float8_e4m3fn", round_scale=1), TypeError, "round_scale"),
    (dict(dst_type="float8_e4m3fn", clamp_limit=0.0), Exception, "clamp_limit"),
])
def test_the_reference_refuses_what_the_operator_refuses(kwargs, error, words):
    x = np.zeros((2, 512), np.float16)
    with pytest.raises(error) as info:
        reference.swiglu_group_quant(x, **kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize("x,words", [
    (np.zeros((2, 512), np.float32), "float16 or bfloat16"), (np.zeros((2, 384), np.float16), "multiple of 256"),
    (np.zeros((512,), np.float16), "rank"), (np.zeros((0, 512), np.float16), "empty"),
])
def test_the_reference_checks_x(x, words):
    with pytest.raises((TypeError, ValueError), match=words):
        reference.swiglu_group_quant(x, dst_type="float8_e4m3fn")


def test_the_reference_checks_weight_groups_and_out():
    x = np.zeros((2, 512), np.float16)
    with pytest.raises(ValueError, match="T = 2"):
        reference.swiglu_group_quant(x, np.zeros(3, F32), dst_type="float8_e4m3fn")
    with pytest.raises(TypeError, match="float32"):
        reference.swiglu_group_quant(x, np.zeros(2, np.float64), dst_type="float8_e4m3fn")
    with pytest.raises(ValueError, match="1-D"):
        reference.swiglu_group_quant(x, None, np.zeros((1, 2), np.int64), dst_type="float8_e4m3fn")
    with pytest.raises(ValueError, match=r"out\[0\] \(y\) must have shape \(2, 128\)"):
        reference.swiglu_group_quant(x, dst_type="float4_e1m2", quant_mode=1, round_scale=True,
                                     out=(np.zeros((2, 256), np.uint8), np.zeros((2, 4, 2), np.uint8)))


def test_a_power_of_two_scale_on_an_exponent_step_may_be_the_next_one():
    """A group whose max is 448 has s = fp32(448 * fp32(1/448)) = 1.0 exactly, and a max a few
    ulps higher gives scale 2: a device whose y is that much larger writes byte 128 and codes at
    that scale. The comparison allows it (scale_boundary) and judges the codes at the result's
    scale; the same change in a group away from a step fails."""
    y = np.zeros((1, 128))
    y[0, :2] = [448.0, 1.0]
    y[0, 32:34] = [300.0, 1.0]
    x = _exact_y_rows(y, np.float16)
    codes, scales = fm.forward(x, dst=fm.E4M3FN, quant_mode=1, round_scale=True)
    assert scales[0].tolist()[:2] == [127, 127]
    assert _judge(x, None, codes, scales).passed
    stepped_codes, stepped_scales = codes.copy(), scales.copy()
    stepped_scales[0, 0] = 128                  # scale 2: 448 -> 224, 1 -> 0.5
    stepped_codes[0, :2] = [0x76, 0x30]
    verdict = _judge(x, None, stepped_codes, stepped_scales)
    assert verdict.passed and verdict.scale_boundary == 1, str(verdict)
    stepped_codes[0, 1] = 0x38                  # codes still at scale 1 do not fit scale 2
    assert _judge(x, None, stepped_codes, stepped_scales).code_mismatches == 1
    away_codes, away_scales = codes.copy(), scales.copy()
    away_scales[0, 1] = 129                     # 300 is nowhere near a step
    away_codes[0, 32:34] = [0x71, 0x30]
    verdict = _judge(x, None, away_codes, away_scales)
    assert not verdict.passed and verdict.scale_mismatches == 1
