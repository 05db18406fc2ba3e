"""The emulator's aclnnSwigluGroupQuant (called through ctypes, tests/forward_emulator.py) against
the bit-exact NumPy model (tests/forward_model.py) and the reference; the golden digest table of
native/tests/test_forward_golden.c against the model; the refusals and the emulated release as a
caller sees them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import forward_emulator as fe
import forward_model as fm
from forward_model import BF16, COMBINATION_IDS, COMBINATIONS, F32, NAMES
from acl_swiglu import emulator, formats, reference

pytestmark = pytest.mark.emulator_only

TESTS = Path(__file__).resolve().parent


def test_the_c_golden_table_is_the_models():
    """The digests native/tests/test_forward_golden.c checks on x86-64 and aarch64 are the
    model's, for every case it runs (and only those)."""
    table = fm.golden_table()
    cases = fm.golden_cases()
    assert sorted(table) == sorted(case.name for case in cases)
    assert len(cases) == 32
    for case in cases:
        assert fm.golden_digests(case) == table[case.name], case.name


def _problem(seed, x_dtype):
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(1, 10))
    hidden = int(rng.choice([128, 256, 640, 2176]))
    x = rng.uniform(-5, 5, (rows, 2 * hidden))
    where = rng.random(x.shape) < 0.02
    x[where] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0, 95.0, -95.0, 1e-5, 4e4, -4e4], where.sum())
    x = x.astype(x_dtype)
    if x_dtype == BF16 and seed % 3 == 0:   # bf16 subnormals too
        bits = x.view(np.uint16)
        bits[rng.random(x.shape) < 0.01] = 0x0003
    weight = rng.uniform(-3, 3, rows).astype(F32) if seed % 2 else None
    clamp = float(rng.choice([0.75, 4.0, 100.0])) if seed % 4 >= 2 else None
    groups = np.array([int(rng.integers(0, rows + 1)), int(rng.integers(-1, 3))], np.int64) if seed % 3 else None
    return x, weight, groups, clamp


def _emulator_bytes(x, weight, groups, clamp, dst, mode, round_scale):
    rows, hidden = x.shape[0], x.shape[1] // 2
    y = fe.output(dst, [rows, hidden])
    s = fe.output(0, [rows, hidden // 128]) if mode == 0 else fe.output(37, [rows, hidden // 64, 2])
    result = fe.call(fe.tensor_of(x), None if weight is None else fe.tensor_of(weight),
                     None if groups is None else fe.tensor_of(groups), dst_type=dst, quant_mode=mode, y=y,
                     y_scale=s, round_scale=round_scale, clamp_limit=-1.0 if clamp is None else clamp)
    assert result.status == 0, result.message
    return result.y, result.y_scale


@pytest.mark.parametrize("x_dtype", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("dst,mode,round_scale", COMBINATIONS, ids=COMBINATION_IDS)
def test_the_emulator_gives_the_models_bytes(x_dtype, dst, mode, round_scale):
    for seed in range(12):
        x, weight, groups, clamp = _problem(seed * 7 + dst + mode, x_dtype)
        y, s = _emulator_bytes(x, weight, groups, clamp, dst, mode, round_scale)
        rows, hidden = x.shape[0], x.shape[1] // 2
        y_out = np.full((rows, hidden // 2 if dst in fm.FP4 else hidden), 0xA5, np.uint8)
        s_raw = np.full(rows * hidden // (128 if mode == 0 else 32) * (4 if mode == 0 else 1), 0xA5, np.uint8)
        my, ms = fm.forward(x, weight, groups, dst=dst, quant_mode=mode, round_scale=round_scale, clamp=clamp,
                            y_out=y_out, scale_out=s_raw.view(F32) if mode == 0 else s_raw)
        np.testing.assert_array_equal(y, my.reshape(-1), err_msg=f"y, seed {seed}")
        np.testing.assert_array_equal(s, ms.view(np.uint8).reshape(-1), err_msg=f"y_scale, seed {seed}")


@pytest.mark.parametrize("dst,mode,round_scale", COMBINATIONS, ids=COMBINATION_IDS)
def test_the_emulator_passes_the_comparison_with_the_reference(dst, mode, round_scale):
    rng = np.random.default_rng(dst * 10 + mode)
    x = rng.uniform(-4, 4, (3, 4, 1024)).astype(BF16 if mode else np.float16)
    weight = rng.uniform(-2, 2, 12).astype(F32)
    groups = np.array([7, 3], np.int64)
    y, s = fe.quantise(x, weight, groups, dst_type=dst, quant_mode=mode, round_scale=round_scale, clamp_limit=3.0)
    d = formats.as_dst_type(NAMES[dst])
    y = y.reshape(3, 4, -1) if d.packed else y.view(d.storage_dtype).reshape(3, 4, -1)
    s = s.reshape(3, 4, -1) if mode == 0 else formats.e8m0_view(s).reshape(3, 4, -1, 2)
    verdict = reference.compare_quantised(y, s, x, weight, groups, dst_type=d, quant_mode=mode,
                                          round_scale=round_scale, clamp_limit=3.0)
    assert verdict.passed, str(verdict)
    assert verdict.rows_judged == 10


def test_the_scalar_kernel_and_any_thread_count_give_the_same_bytes():
    x, weight, groups, clamp = _problem(5, np.float16)
    x = np.tile(x, (64, 4))   # enough rows and columns for several threads
    weight = None if weight is None else np.tile(weight, 64)
    results = []
    try:
        for variant, threads in (("vector", 0), ("scalar", 1), ("vector", 1), ("vector", 2)):
            emulator.set_kernel_variant(variant)
            emulator.set_threads(threads)
            for dst, mode, round_scale in ((fm.E4M3FN, 0, False), (fm.E2M1, 1, True)):
                results.append(_emulator_bytes(x, weight, None, clamp, dst, mode, round_scale))
    finally:
        emulator.set_kernel_variant("vector")
        emulator.set_threads(0)
    for k in range(2, len(results)):
        np.testing.assert_array_equal(results[k][0], results[k % 2][0])
        np.testing.assert_array_equal(results[k][1], results[k % 2][1])


def _plain_call(**overrides):
    x = np.zeros((4, 512), np.float16)
    args = dict(dst_type=fm.E4M3FN, quant_mode=0, y=fe.output(fm.E4M3FN, [4, 256]), y_scale=fe.output(0, [4, 2]))
    args.update(overrides)
    return fe.call(fe.tensor_of(x), **args)


@pytest.mark.parametrize("mode,words", [(2, "static HiFloat8"), (3, "dynamic HiFloat8"), (5, "aclnnSwigluGroupQuantV2")])
def test_the_modes_that_are_not_emulated_are_refused_by_name(mode, words):
    result = _plain_call(quant_mode=mode, dst_type=34, y=fe.output(34, [4, 256]))
    assert result.status == 161002
    assert f"quantMode {mode}" in result.message and "not emulated" in result.message and words in result.message


def test_the_workspace_is_32_bytes_and_a_launch_without_it_fails():
    ok = _plain_call()
    assert ok.status == 0 and ok.workspace_size == 32
    missing = _plain_call(workspace=False)
    assert missing.status == 161002 and "workspace is NULL" in missing.message


_RELEASE_SCRIPT = textwrap.dedent("""
    import numpy as np
    import forward_emulator as fe
    x = np.zeros((512,), np.float16)          # rank 1: T = 1
    r = fe.call(fe.tensor_of(x), dst_type=36, quant_mode=0, y=fe.output(36, [256]), y_scale=fe.output(0, [2]))
    g = fe.call(fe.tensor_of(np.zeros((2, 512), np.float16)), group_index=fe.tensor_of(np.ones(100, np.int64)),
                dst_type=36, quant_mode=0, y=fe.output(36, [2, 256]), y_scale=fe.output(0, [2, 2]))
    print(r.status, g.status)
    import acl_swiglu; acl_swiglu.release_cached()
""")


@pytest.mark.parametrize("release,statuses", [
    (None, "561002 0"), ("9.2.0", "561002 0"), ("9.2.0-beta.2", "0 0"), ("9.2.0-beta.1", "0 0"),
    ("9.1.1", "0 161002"), ("9.1.0", "0 161002"),
])
def test_the_checks_follow_the_emulated_release(release, statuses, tmp_path):
    """x of rank 1 passes the checks before 9.2.0 only; 100 group counts (G mod 128 = 100) make
    9.1.0's and 9.1.1's group sum read past its data, which the emulator refuses."""
    env = {k: v for k, v in os.environ.items() if k != "ACL_EMU_CANN_VERSION"}
    env["PYTHONPATH"] = str(TESTS) + os.pathsep + env.get("PYTHONPATH", "")
    if release is not None:
        env["ACL_EMU_CANN_VERSION"] = release
    proc = subprocess.run([sys.executable, "-c", _RELEASE_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[-2] == statuses
