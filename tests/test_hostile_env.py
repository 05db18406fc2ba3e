"""Junk in the environment variables the package and the emulator read: each is refused with a
message naming the variable (the package) or ignored with a warning saying so (the emulator),
and a call made meanwhile still gives the right bytes."""

import os
import subprocess
import sys

import pytest

_CALL = (
    "import warnings; warnings.simplefilter('ignore')\n"
    "import numpy as np, acl_swiglu as a\n"
    "gy = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)\n"
    "x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)\n"
    "try:\n"
    "    g = a.swiglu_group_quant_grad(gy, x)[0]\n"
    "    want = a.reference.swiglu_group_quant_grad(gy, x)[0]\n"
    "    print('ok', bool(np.allclose(g, want, rtol=1e-5, atol=1e-6)))\n"
    "except a.AclSwigluError as e:\n"
    "    print('refused', type(e).__name__, e)\n"
)


def _run(tmp_path, **env):
    full = dict(os.environ, ACL_SWIGLU_BACKEND="emulator")
    for name in ("ACL_SWIGLU_DEVICE_ID", "ACL_SWIGLU_ABI", "ACL_EMU_ABI", "ACL_EMU_THREADS", "ACL_EMU_DEVICES",
                 "ACL_EMU_KERNEL"):
        full.pop(name, None)
    full.update(env)
    done = subprocess.run([sys.executable, "-c", _CALL], capture_output=True, text=True, timeout=120, env=full,
                          cwd=tmp_path, start_new_session=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr


@pytest.mark.parametrize("name, value, words", [
    ("ACL_SWIGLU_DEVICE_ID", "abc", "not a device id"),
    ("ACL_SWIGLU_DEVICE_ID", "0x0", "not a device id"),
    ("ACL_SWIGLU_DEVICE_ID", "-1", "between 0 and 2147483647"),
    ("ACL_SWIGLU_DEVICE_ID", str(2**64), "between 0 and 2147483647"),
    ("ACL_SWIGLU_BACKEND", "junk", "is not one of auto, cann, emulator"),
    ("ACL_SWIGLU_ABI", "\x1f1", "is not an ABI revision"),   # not ASCII whitespace for C's isspace
    ("ACL_SWIGLU_ABI", "\xa01", "is not an ABI revision"),
    ("ACL_SWIGLU_ABI", "01", "is not an ABI revision"),
])
def test_package_variables_with_junk_are_refused_naming_them(tmp_path, name, value, words):
    out, _ = _run(tmp_path, **{name: value})
    assert out.startswith("refused ConfigurationError") and name in out and words in out, out


@pytest.mark.parametrize("name, value", [
    ("ACL_SWIGLU_DEVICE_ID", ""), ("ACL_SWIGLU_BACKEND", ""), ("ACL_SWIGLU_ABI", " \t"), ("ACL_SWIGLU_ABI", "\v2\f"),
    ("ACL_EMU_ABI", "\n1 "),
])
def test_empty_or_blank_values_mean_unset(tmp_path, name, value):
    out, _ = _run(tmp_path, **{name: value})
    assert out == "ok True", out


@pytest.mark.parametrize("name, value", [
    ("ACL_EMU_THREADS", "99999999999"), ("ACL_EMU_THREADS", "4294967297"), ("ACL_EMU_THREADS", "257"),
    ("ACL_EMU_THREADS", "-3"), ("ACL_EMU_DEVICES", "0"), ("ACL_EMU_DEVICES", "abc"), ("ACL_EMU_KERNEL", "junk"),
])
def test_emulator_variables_with_junk_are_ignored_with_a_warning(tmp_path, name, value):
    out, err = _run(tmp_path, **{name: value})
    assert out == "ok True", out + err
    assert f"acl-swiglu emulator: ignoring {name}={value}" in err
