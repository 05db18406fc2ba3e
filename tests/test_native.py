"""The emulator's C tests and the C++ sample, built with CMake and run by ctest, so that the
one test command (pytest) covers the native side too. The build and ctest run as one sequence
that the session starts early (tests/native_build.py); the tests here judge its outcome."""

import os
import subprocess

import pytest

import native_build

pytestmark = pytest.mark.allow_live_handles   # separate processes; nothing lives in this one


@pytest.fixture(scope="module")
def native_outcomes():
    native_build.need_cmake()
    outcomes = native_build.outcomes()
    for step in ("configure", "build"):
        native_build.passed(**outcomes[step])
    return outcomes


@pytest.fixture(scope="module")
def release_build(native_outcomes):
    return native_build.BUILD


def test_ctest_release(native_outcomes):
    ctest = native_outcomes["ctest"]
    native_build.passed(**ctest)
    assert "100% tests passed" in ctest["stdout"]


def test_cpp_sample_prints_the_documented_lines(release_build):
    sample = release_build / "samples" / "cpp" / "swiglu_sample"
    result = native_build.run_checked([str(sample)], timeout=120)
    lines = result.stdout.splitlines()
    assert "gradX output (first 10 elements):" in lines
    assert "gradWeight output (first 10 elements):" in lines
    assert sum(line.startswith("gradX[") for line in lines) == 10
    assert sum(line.startswith("gradWeight[") for line in lines) == 10


def test_cpp_sample_matches_the_python_sample(release_build):
    """The C++ sample and `acl-swiglu-sample` run the same documented example: same 20 values."""
    import json
    import sys

    sample = release_build / "samples" / "cpp" / "swiglu_sample"
    cpp = native_build.run_checked([str(sample)], timeout=120).stdout.splitlines()
    cpp_x = [float(line.split("=")[1]) for line in cpp if line.startswith("gradX[")]
    cpp_w = [float(line.split("=")[1]) for line in cpp if line.startswith("gradWeight[")]
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator")
    cli = subprocess.run([sys.executable, "-m", "acl_swiglu", "--json"], capture_output=True, text=True, env=env,
                         cwd=str(release_build), timeout=300)
    assert cli.returncode == 0, cli.stderr
    report = json.loads(cli.stdout)
    # The C++ sample prints with %f (6 decimals); the CLI reports full precision.
    assert cpp_x == [float(f"{v:f}") for v in report["grad_x_first"]]
    assert cpp_w == [float(f"{v:f}") for v in report["grad_weight_first"]]
