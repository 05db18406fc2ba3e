"""A run of the device tests stops with one clear error before any test when it cannot work: no
CANN behind ACL_SWIGLU_BACKEND=cann, or device tests only without ACL_SWIGLU_BACKEND=cann (where
each would be skipped), instead of a failure or a skip per test."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NO_CANN = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ACL_SWIGLU_LIB_DIR", "ASCEND_CUSTOM_OPP_PATH",
           "ASCEND_OPP_PATH", "LD_LIBRARY_PATH")


def _pytest(tmp_path, backend, *args):
    env = {k: v for k, v in os.environ.items() if k not in NO_CANN and k != "ACL_SWIGLU_BACKEND"}
    if backend is not None:
        env["ACL_SWIGLU_BACKEND"] = backend
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
               "-c", str(ROOT / "pyproject.toml"), *args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.emulator_only
def test_a_device_run_without_cann_is_one_early_error(tmp_path):
    if any(os.path.exists(root) for root in ("/usr/local/Ascend/cann", "/usr/local/Ascend/ascend-toolkit/latest")):
        pytest.skip("a CANN is installed here")
    result = _pytest(tmp_path, "cann", "-m", "device", str(ROOT / "tests" / "test_device.py"))
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, output[-3000:]
    assert "ACL_SWIGLU_BACKEND=cann, but the CANN libraries cannot be loaded, so none of the" in output
    assert "but no CANN was found" in output and "source <CANN root>/set_env.sh" in output
    assert not re.search(r"\d+ (failed|passed|error)", output) and "FAILED" not in output


def test_device_tests_alone_without_a_device_run_are_one_early_error(tmp_path):
    result = _pytest(tmp_path, None, "-m", "device", str(ROOT / "tests" / "test_device.py"))
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, output[-3000:]
    assert "the selected tests all need a real Ascend 950 device, and ACL_SWIGLU_BACKEND is not 'cann'" in output
    assert "ACL_SWIGLU_BACKEND=cann pytest -m device -rs" in output
    assert not re.search(r"\d+ (skipped|passed)", output)


def test_a_mixed_selection_still_skips_the_device_tests(tmp_path):
    result = _pytest(tmp_path, None, str(ROOT / "tests" / "test_device.py") + "::test_backend_is_real_cann",
                     str(ROOT / "tests" / "test_readme.py") + "::test_the_two_commands_are_the_ci_commands", "-rs")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "1 passed, 1 skipped" in output and "needs a real Ascend 950 device" in output
