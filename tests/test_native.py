"""The emulator's C tests and the C++ sample, built with CMake and run by ctest, so that the
one test command (pytest) covers the native side too."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.allow_live_handles   # separate processes; nothing lives in this one


def _run(cmd, **kwargs):
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n{result.stdout[-6000:]}\n"
                    f"{result.stderr[-6000:]}")
    return result


def _build(build_dir: Path, *options):
    if shutil.which("cmake") is None:
        pytest.fail("cmake is required to build the emulator's C tests")
    _run(["cmake", "-S", str(ROOT), "-B", str(build_dir), *options])
    _run(["cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 2)])
    return build_dir


@pytest.fixture(scope="module")
def release_build():
    return _build(ROOT / "build" / "pytest-release", "-DCMAKE_BUILD_TYPE=Release")


def test_ctest_release(release_build):
    result = _run(["ctest", "--test-dir", str(release_build), "--output-on-failure", "-j", "2"], timeout=1800)
    assert "100% tests passed" in result.stdout


def test_cpp_sample_prints_the_documented_lines(release_build):
    sample = release_build / "samples" / "cpp" / "swiglu_sample"
    result = _run([str(sample)], timeout=120)
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
    cpp = _run([str(sample)], timeout=120).stdout.splitlines()
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
