"""The caller's floating-point rounding mode does not change the emulator's results: a one-shot
call made while libc's fesetround has set each directed mode gives the bytes of the call made in
round-to-nearest, and the caller's mode is still set when the call returns."""

import ctypes
import ctypes.util
import platform

import ml_dtypes
import numpy as np
import pytest

import acl_swiglu

# <fenv.h> values of glibc: x86-64 keeps the mode in bits 10-11 (x87) and 13-14 (MXCSR) and
# takes the x87 encoding; aarch64 takes FPCR.RMode's bits 22-23.
_MODES = {
    "x86_64": {"downward": 0x400, "upward": 0x800, "toward_zero": 0xC00, "nearest": 0},
    "aarch64": {"upward": 0x400000, "downward": 0x800000, "toward_zero": 0xC00000, "nearest": 0},
}
MODES = _MODES.get(platform.machine())
pytestmark = pytest.mark.skipif(MODES is None, reason=f"no rounding-mode constants for {platform.machine()}")


def _libm():
    lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    lib.fesetround.argtypes = [ctypes.c_int]
    lib.fesetround.restype = ctypes.c_int
    lib.fegetround.restype = ctypes.c_int
    return lib


def _inputs(dtype):
    rng = np.random.default_rng(17)
    T, H = 16, 2048  # bf16 + weight + clamp at H = 2048: two tiles
    gy = rng.standard_normal((T, H), dtype=np.float32).astype(dtype)
    x = (rng.standard_normal((T, 2 * H), dtype=np.float32) * 3).astype(dtype)
    w = rng.uniform(0.1, 1.5, (T, 1)).astype(np.float32)
    yo = rng.standard_normal((T, H), dtype=np.float32).astype(dtype)
    return gy, x, w, yo, np.array([9, 5], np.int64)


def _call_in_mode(libm, mode, args, clamp):
    assert libm.fesetround(mode) == 0
    try:
        result = acl_swiglu.swiglu_group_quant_grad(*args, clamp)
        mode_after = libm.fegetround()
    finally:
        libm.fesetround(MODES["nearest"])
    assert mode_after == mode  # the caller's mode is put back
    return result


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["downward", "upward", "toward_zero"])
def test_rounding_mode_does_not_change_results(dtype, mode):
    libm = _libm()
    args = _inputs(dtype)
    # 1.1 is no float: its conversion to the kernel's fp32 limit depends on the rounding mode
    want_x, want_w = acl_swiglu.swiglu_group_quant_grad(*args, 1.1)
    got_x, got_w = _call_in_mode(libm, MODES[mode], args, 1.1)
    assert got_x.tobytes() == want_x.tobytes()
    assert got_w.tobytes() == want_w.tobytes()


def test_the_modes_are_real():
    """fesetround through ctypes really sets the mode: libm's rint(2.5) is 2 to nearest, 3 upward,
    2 downward and toward zero."""
    libm = _libm()
    libm.rint.argtypes = [ctypes.c_double]
    libm.rint.restype = ctypes.c_double
    seen = {}
    for name in ("nearest", "upward", "downward", "toward_zero"):
        libm.fesetround(MODES[name])
        try:
            seen[name] = libm.rint(2.5)
        finally:
            libm.fesetround(MODES["nearest"])
    assert seen == {"nearest": 2.0, "upward": 3.0, "downward": 2.0, "toward_zero": 2.0}


@pytest.mark.parametrize("limit, accepted", [(1e-40, True), (1.5e-45, True), (7.006492321624085e-46, False),
                                             (1e-50, False)])
def test_flush_denormal_mode_does_not_change_the_clamp_rule(limit, accepted):
    """torch.set_flush_denormal(True) turns on flush-to-zero and denormals-are-zero for the whole
    thread; the clamp limit's fp32 rule and the results stay those of the default mode."""
    torch = pytest.importorskip("torch", reason="torch.set_flush_denormal sets the mode portably")
    args = _inputs(np.float32)

    def call():
        try:
            return acl_swiglu.swiglu_group_quant_grad(*args, limit)
        except acl_swiglu.ArgumentError as error:
            assert "rounds to 0 in float32" in str(error)
            return None

    plain = call()
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-denormal mode")
    try:
        flushed = call()
    finally:
        torch.set_flush_denormal(False)
    assert (plain is not None) is accepted
    assert (flushed is not None) is accepted
    if accepted:
        assert plain[0].tobytes() == flushed[0].tobytes()
        assert plain[1].tobytes() == flushed[1].tobytes()
