"""The forward's public calls (acl_swiglu.swiglu_group_quant, the device-level call, phase 1 and
the plan) on the bundled emulator: their bytes against the bit-exact model (tests/forward_model.py)
and the reference's comparison, their output forms, the rows they leave alone, and the rules they
check before anything is allocated."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import acl_swiglu
import forward_model as fm
from acl_swiglu import ArgumentError, DeviceArray, emulator, formats, reference, to_device
from acl_swiglu.errors import AclParameterError
from acl_swiglu.forward import get_workspace_size

pytestmark = pytest.mark.emulator_only

BF16 = np.dtype(ml_dtypes.bfloat16)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
CODES = {"float8_e4m3fn": fm.E4M3FN, "float8_e5m2": fm.E5M2, "float4_e2m1fn": fm.E2M1, "float4_e1m2": fm.E1M2}
COMBINATIONS = [("float8_e4m3fn", 0, False), ("float8_e4m3fn", 0, True), ("float8_e5m2", 0, False),
                ("float8_e5m2", 0, True), ("float8_e4m3fn", 1, True), ("float8_e5m2", 1, True),
                ("float4_e2m1fn", 1, True), ("float4_e1m2", 1, True)]
IDS = [f"{d}-mode{m}{'-round' if r and m == 0 else ''}" for d, m, r in COMBINATIONS]
TESTS = Path(__file__).resolve().parent


def _problem(seed, x_dtype, lead=(3, 5)):
    rng = np.random.default_rng(seed)
    hidden = int(rng.choice([128, 384, 1024]))
    x = rng.uniform(-6, 6, lead + (2 * hidden,))
    special = rng.random(x.shape) < 0.01
    x[special] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0, 95.0, -95.0], special.sum())
    rows = int(np.prod(lead))
    weight = rng.uniform(-2, 2, rows).astype(np.float32) if seed % 2 else None
    groups = np.array([int(rng.integers(0, rows + 1)), 1], np.int64) if seed % 3 else None
    clamp = float(rng.choice([0.5, 3.0])) if seed % 4 >= 2 else None
    return x.astype(x_dtype), weight, groups, clamp


def _model(x, weight, groups, clamp, dst, mode, round_scale, y_out=None, s_out=None):
    """The model's bytes, shaped as the package returns them."""
    t = formats.as_dst_type(dst)
    y, s = fm.forward(x, weight, groups, dst=CODES[dst], quant_mode=mode, round_scale=round_scale, clamp=clamp,
                      y_out=y_out, scale_out=s_out)
    lead = x.shape[:-1]
    y = y.reshape(lead + (-1,)) if t.packed else y.view(t.storage_dtype).reshape(lead + (-1,))
    s = s.reshape(lead + (-1,)) if mode == 0 else s.view(E8M0).reshape(lead + (-1, 2))
    return y, s


def _same_bytes(actual, expected, what):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    np.testing.assert_array_equal(np.ascontiguousarray(actual).view(np.uint8),
                                  np.ascontiguousarray(expected).view(np.uint8), err_msg=what)


# ---- the three forms compute the model's bytes ----

@pytest.mark.parametrize("x_dtype", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("dst,mode,round_scale", COMBINATIONS, ids=IDS)
def test_the_one_shot_call_gives_the_models_bytes(x_dtype, dst, mode, round_scale):
    for seed in range(6):
        x, weight, groups, clamp = _problem(seed, x_dtype)
        y, s = acl_swiglu.swiglu_group_quant(x, weight, groups, dst_type=dst, quant_mode=mode,
                                             round_scale=round_scale, clamp_limit=clamp)
        my, ms = _model(x, weight, groups, clamp, dst, mode, round_scale)
        _same_bytes(y, my, f"y, seed {seed}")
        _same_bytes(s, ms, f"y_scale, seed {seed}")


@pytest.mark.parametrize("dst,mode,round_scale", COMBINATIONS, ids=IDS)
def test_the_device_call_and_the_plan_give_the_one_shot_bytes(dst, mode, round_scale):
    x, weight, groups, clamp = _problem(11, BF16, lead=(2, 3, 4))
    expected = acl_swiglu.swiglu_group_quant(x, weight, groups, dst_type=dst, quant_mode=mode,
                                             round_scale=round_scale, clamp_limit=clamp)
    dx, dw, dg = (None if a is None else to_device(a) for a in (x, weight, groups))
    y, s = acl_swiglu.swiglu_group_quant_device(dx, dw, dg, dst_type=dst, quant_mode=mode, round_scale=round_scale,
                                                clamp_limit=clamp)
    _same_bytes(y.to_numpy(), expected[0], "device y")
    _same_bytes(s.to_numpy(), expected[1], "device y_scale")
    with acl_swiglu.SwigluGroupQuantPlan(dx, dw, dg, dst_type=dst, quant_mode=mode, round_scale=round_scale,
                                         clamp_limit=clamp) as plan:
        for _ in range(3):
            outputs = plan(synchronize=True)
            assert len(outputs) == 2 and outputs[0] is plan.y and outputs[1] is plan.y_scale
            _same_bytes(plan.y.to_numpy(), expected[0], "plan y")
            _same_bytes(plan.y_scale.to_numpy(), expected[1], "plan y_scale")
        other = np.flip(x, axis=0).copy()
        plan(to_device(other), synchronize=True)
        again = acl_swiglu.swiglu_group_quant(other, weight, groups, dst_type=dst, quant_mode=mode,
                                              round_scale=round_scale, clamp_limit=clamp)
        _same_bytes(plan.y.to_numpy(), again[0], "plan y after rebinding x")


def test_the_outputs_pass_the_comparison_with_the_float64_reference():
    rng = np.random.default_rng(3)
    x = rng.uniform(-4, 4, (6, 2048)).astype(np.float16)
    weight = rng.uniform(-2, 2, 6).astype(np.float32)
    for dst, mode, round_scale in COMBINATIONS:
        y, s = acl_swiglu.swiglu_group_quant(x, weight, dst_type=dst, quant_mode=mode, round_scale=round_scale,
                                             clamp_limit=2.5)
        verdict = reference.compare_quantised(y, s, x, weight, dst_type=dst, quant_mode=mode,
                                              round_scale=round_scale, clamp_limit=2.5)
        assert verdict.passed, f"{dst} mode {mode}: {verdict}"
        assert verdict.rows_judged == 6


def test_fp4_codes_unpack_to_the_dequantised_values_the_scales_give():
    x = np.linspace(-3, 3, 2 * 512, dtype=np.float32).reshape(2, 512).astype(np.float16)
    y, s = acl_swiglu.swiglu_group_quant(x, dst_type="float4_e2m1fn", quant_mode=1)
    assert y.dtype == np.uint8 and y.shape == (2, 128) and s.dtype == E8M0 and s.shape == (2, 4, 2)
    values = formats.unpack_fp4(y, "float4_e2m1fn") * np.repeat(formats.e8m0_scales(s).reshape(2, -1), 32, axis=1)
    exact = reference.swiglu(x.astype(np.float32))
    # E2M1 keeps 1 mantissa bit: within a quarter of the group's largest magnitude of the exact value
    groups_max = np.repeat(np.abs(exact).reshape(2, -1, 32).max(axis=2), 32, axis=1)
    assert np.all(np.abs(values - exact) <= 0.25 * groups_max + 1e-6)


# ---- rows past the truncation, y_scale bytes, phase 1 ----

def test_rows_past_the_truncation_are_left_as_they_were():
    x, weight, _, _ = _problem(5, np.float16, lead=(8,))
    groups = np.array([2, 1], np.int64)
    hidden = x.shape[-1] // 2
    y = to_device(np.full((8, hidden), 0x5A, np.uint8).view(ml_dtypes.float8_e5m2))
    s = to_device(np.full((8, hidden // 32 // 2, 2), 0xC3, np.uint8))   # E8M0 scales given as bytes
    acl_swiglu.swiglu_group_quant_device(to_device(x), to_device(weight), to_device(groups), dst_type="float8_e5m2",
                                         quant_mode=1, y=y, y_scale=s)
    my, ms = _model(x, weight, groups, None, "float8_e5m2", 1, True, y_out=np.full((8, hidden), 0x5A, np.uint8),
                    s_out=np.full((8, hidden // 32), 0xC3, np.uint8))
    _same_bytes(y.to_numpy(), my, "y")
    np.testing.assert_array_equal(s.to_numpy(), ms.view(np.uint8))
    assert np.all(y.to_numpy()[3:].view(np.uint8) == 0x5A) and np.all(s.to_numpy()[3:] == 0xC3)
    # the one-shot call's rows past the truncation are zero
    y1, s1 = acl_swiglu.swiglu_group_quant(x, weight, groups, dst_type="float8_e5m2", quant_mode=1)
    assert not y1[3:].view(np.uint8).any() and not s1[3:].view(np.uint8).any()


def test_phase_1_asks_for_32_bytes_and_its_executor_launches():
    x, weight, _, _ = _problem(1, np.float16, lead=(4,))
    hidden = x.shape[-1] // 2
    y = DeviceArray.empty((4, hidden), ml_dtypes.float8_e4m3fn)
    s = DeviceArray.empty((4, hidden // 128), np.float32)
    origin = DeviceArray.empty((0,), np.float16)
    with get_workspace_size(to_device(x), to_device(weight), dst_type="float8_e4m3fn", y=y, y_scale=s,
                            y_origin=origin) as executor:
        assert executor.workspace_size == 32
        executor.launch()
    my, ms = _model(x, weight, None, None, "float8_e4m3fn", 0, False)
    _same_bytes(y.to_numpy(), my, "y")
    _same_bytes(s.to_numpy(), ms, "y_scale")


def test_a_dst_type_may_be_the_ml_dtypes_dtype_but_never_a_number():
    x, _, _, _ = _problem(2, np.float16, lead=(2,))
    by_name = acl_swiglu.swiglu_group_quant(x, dst_type="float8_e4m3fn")
    by_dtype = acl_swiglu.swiglu_group_quant(x, dst_type=ml_dtypes.float8_e4m3fn)
    _same_bytes(by_name[0], by_dtype[0], "y")
    with pytest.raises(TypeError, match="dst_type.*number 36"):
        acl_swiglu.swiglu_group_quant(x, dst_type=36)


# ---- what is refused, by whom ----

def _x(shape=(2, 512), dtype=np.float16):
    return np.zeros(shape, dtype)


REFUSED = [
    (dict(x=_x(dtype=np.float32)), ArgumentError, "x has dtype float32; quant_mode 0 takes float16 or bfloat16"),
    (dict(x=_x((512,))), ArgumentError, "x has 1 dims"),
    (dict(x=_x((2, 1, 1, 1, 1, 1, 1, 512)), quant_mode=1), ArgumentError, "quant_mode 1 takes 2 to 7 dims"),
    (dict(x=_x((0, 512))), ArgumentError, "empty"),
    (dict(x=_x((2, 384))), ArgumentError, "multiple of 256"),
    (dict(weight=np.ones(3, np.float32)), ArgumentError, "T = 2 elements"),
    (dict(weight=np.ones(2, np.float16)), ArgumentError, "weight has dtype float16"),
    (dict(group_index=np.ones(2, np.int32)), ArgumentError, "group_index has dtype int32"),
    (dict(group_index=np.ones((1, 2), np.int64)), ArgumentError, r"1-D \[G\]"),
    (dict(group_index=np.ones(0, np.int64)), ArgumentError, "G > 0"),
    (dict(dst_type="float4_e2m1fn"), ArgumentError, "produced by quant_mode 1"),
    (dict(dst_type="bfloat16"), ArgumentError, "not a destination type"),
    (dict(quant_mode=4), ArgumentError, "quant_mode must be 0"),
    (dict(quant_mode=5), ArgumentError, "aclnnSwigluGroupQuantV2"),
    (dict(quant_mode=True), ArgumentError, "quant_mode must be a whole number"),
    (dict(block_size=64), ArgumentError, "block_size must be 0 or 128"),
    (dict(quant_mode=1, block_size=128), ArgumentError, "block_size must be 0 or 32"),
    (dict(quant_mode=1, round_scale=False), ArgumentError, "round_scale must be True"),
    (dict(round_scale=1), TypeError, "round_scale must be True or False"),
    (dict(output_origin=True), ArgumentError, "output_origin must be False in quant_mode 0"),
    (dict(clamp_limit=0.0), ArgumentError, "clamp_limit must be > 0"),
    (dict(clamp_limit=float("nan")), ArgumentError, "clamp_limit must be a finite number"),
    (dict(scale=np.ones(1, np.float32)), ArgumentError, "only quant_mode 2"),
    (dict(dst_type_max=224.0), ArgumentError, "only quant_mode 3"),
    (dict(x=[[0.0] * 512]), TypeError, "x must be a numpy.ndarray"),
    (dict(dst_type="hifloat8", quant_mode=2), ArgumentError, "quant_mode 2 needs scale"),
    (dict(dst_type="hifloat8", quant_mode=2, scale=np.ones(2, np.float32)), ArgumentError, r"float32 \(1,\)"),
    (dict(dst_type="hifloat8", quant_mode=3, dst_type_max=0.0), ArgumentError, "dst_type_max must be"),
    (dict(dst_type="hifloat8", quant_mode=3, x=_x((2, 5))), ArgumentError, "must be even"),
]


@pytest.mark.parametrize("changes,error,words", REFUSED, ids=[w[:40] for _, _, w in REFUSED])
def test_bad_arguments_are_refused_before_anything_is_allocated(changes, error, words):
    arguments = dict(x=_x(), dst_type="float8_e4m3fn")
    arguments.update(changes)
    x = arguments.pop("x")
    before = {kind: len(emulator.live_handles(kind)) for kind in emulator.KINDS}
    with pytest.raises(error, match=words):
        acl_swiglu.swiglu_group_quant(x, **arguments)
    assert {kind: len(emulator.live_handles(kind)) for kind in emulator.KINDS} == before


DEVICE_OUTPUTS_REFUSED = [
    (dict(y=((2, 256), np.uint8)), r"y is \(2, 256\) uint8; the operator writes \(2, 256\) float8_e4m3fn here"),
    (dict(y=((2, 128), ml_dtypes.float8_e4m3fn)), r"y is \(2, 128\) float8_e4m3fn; the operator writes \(2, 256\)"),
    (dict(y_scale=((2, 4), np.float32)), r"y_scale is \(2, 4\) float32; the operator writes \(2, 2\)"),
    (dict(y_origin=((2, 256), np.float16)), r"y_origin is \(2, 256\)"),
    (dict(quant_mode=1, y_scale=((2, 2), np.float32)), "float8_e8m0fnu or uint8"),
    (dict(dst_type="float4_e2m1fn", quant_mode=1, y=((2, 256), np.uint8)), r"\(2, 128\) uint8"),
]


@pytest.mark.parametrize("changes,words", DEVICE_OUTPUTS_REFUSED, ids=[w[:30] for _, w in DEVICE_OUTPUTS_REFUSED])
def test_a_device_call_refuses_outputs_the_operator_would_not_fill(changes, words):
    arguments = dict(dst_type="float8_e4m3fn")
    for name, value in changes.items():
        arguments[name] = DeviceArray.empty(*value) if name.startswith("y") else value
    try:
        with pytest.raises(ArgumentError, match=words):
            acl_swiglu.swiglu_group_quant_device(to_device(_x()), **arguments)
    finally:
        for value in arguments.values():
            if isinstance(value, DeviceArray):
                value.close()


@pytest.mark.parametrize("mode,words", [(2, "static HiFloat8"), (3, "dynamic HiFloat8")])
def test_the_emulator_refuses_hifloat8_with_its_status_after_the_python_checks_pass(mode, words):
    extra = dict(scale=np.ones(1, np.float32)) if mode == 2 else {}
    with pytest.raises(AclParameterError, match=f"quantMode {mode} .*{words}.* is not emulated") as caught:
        acl_swiglu.swiglu_group_quant(_x(), dst_type="hifloat8", quant_mode=mode, **extra)
    assert caught.value.code == 161002 and caught.value.api == "aclnnSwigluGroupQuantGetWorkspaceSize"
    assert "quant_mode argument" in str(caught.value)


_RELEASE_SCRIPT = textwrap.dedent("""
    import numpy as np, acl_swiglu
    x = np.zeros((2, 512), np.float16)
    for count in (96, 97, 127, 128):
        try:
            acl_swiglu.swiglu_group_quant(x, group_index=np.zeros(count, np.int64), dst_type="float8_e4m3fn")
            print(count, "ran")
        except acl_swiglu.ArgumentError as error:
            print(count, type(error).__name__, "G mod 128 =" in str(error) and "Pad group_index" in str(error))
    acl_swiglu.release_cached()
""")


@pytest.mark.parametrize("release,refused", [("9.1.0", True), ("9.1.1", True), ("9.2.0-beta.1", False), (None, False)])
def test_group_counts_a_release_would_sum_past_their_end_are_refused(release, refused, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ACL_EMU_CANN_VERSION"}
    env["ACL_SWIGLU_BACKEND"] = "emulator"
    if release is not None:
        env["ACL_EMU_CANN_VERSION"] = release
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", _RELEASE_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")[:4]
    verdict = "ReleaseLimitationError True"
    assert lines == ["96 ran", f"97 {verdict if refused else 'ran'}", f"127 {verdict if refused else 'ran'}", "128 ran"]


# ---- both operators in one process ----

def test_forward_then_backward_with_the_recomputed_y_origin():
    """The training step FP8 MoE layers use: the quantised forward, then the backward with
    y_origin recomputed (modes 0 and 1 cannot output it)."""
    rng = np.random.default_rng(8)
    x = rng.uniform(-3, 3, (16, 512)).astype(np.float16)
    weight = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    groups = np.array([10, 2], np.int64)
    y, s = acl_swiglu.swiglu_group_quant(x, weight, groups, dst_type="float8_e4m3fn", round_scale=True)
    dequantised = y.astype(np.float32) * np.repeat(s, 128, axis=1)
    grad_y = rng.uniform(-1, 1, (16, 256)).astype(np.float16)
    y_origin = reference.swiglu(x).astype(np.float16)
    grad_x, grad_weight = acl_swiglu.swiglu_group_quant_grad(grad_y, x, weight.reshape(16, 1), y_origin, groups)
    exact = reference.swiglu(x.astype(np.float32)) * weight[:, None]
    assert np.all(np.abs(dequantised[:12] - exact[:12]) <= np.abs(exact[:12]) / 16 + 2 ** -9 * np.repeat(s[:12], 128, axis=1))
    assert not dequantised[12:].any() and not grad_x[12:].any()
    golden_x, golden_w = reference.swiglu_group_quant_grad(grad_y, x, weight.reshape(16, 1), y_origin, groups)
    assert reference.compare(grad_x, golden_x).passed
    assert reference.compare(grad_weight, golden_w).passed
