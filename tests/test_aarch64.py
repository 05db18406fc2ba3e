"""The emulator on aarch64: cross-built with Debian's aarch64 gcc
(cmake/toolchain-aarch64-linux-gnu.cmake) and its C tests and C++ sample run by ctest under
qemu-user. test_golden and test_forward_golden among them check that the backward's and the
forward's kernels give the same bytes as on x86-64."""

import os
import shutil
import struct
from pathlib import Path

import pytest

from native_build import build_now, run_checked

ROOT = Path(__file__).resolve().parent.parent
TOOLCHAIN = ROOT / "cmake" / "toolchain-aarch64-linux-gnu.cmake"
TOOLS = {"aarch64-linux-gnu-gcc": "gcc-aarch64-linux-gnu", "aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu",
         "qemu-aarch64": "qemu-user"}
EM_AARCH64 = 183   # ELF e_machine
# slow: CI runs it as a step of its own, `pytest -m slow` (see README). Separate processes; nothing lives in this one.
pytestmark = [pytest.mark.slow, pytest.mark.allow_live_handles]


@pytest.fixture(scope="module")
def aarch64_build():
    missing = [f"{tool} (Debian package {package})" for tool, package in TOOLS.items() if shutil.which(tool) is None]
    if missing:
        reason = "the aarch64 cross toolchain or qemu-user is missing: " + ", ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(reason + "; .ci/run installs them, so in CI this is a broken setup")
        pytest.skip(reason)
    return build_now(ROOT / "build" / "pytest-aarch64", f"-DCMAKE_TOOLCHAIN_FILE={TOOLCHAIN}",
                  "-DCMAKE_BUILD_TYPE=Release")


def test_the_libraries_are_aarch64(aarch64_build):
    for name in ("libascendcl.so", "libnnopbase.so", "libopapi.so"):
        header = (aarch64_build / "emulator" / "lib64" / name).read_bytes()[:20]
        assert header[:4] == b"\x7fELF"
        assert struct.unpack_from("<H", header, 18)[0] == EM_AARCH64, name


def test_ctest_under_qemu(aarch64_build):
    listed = run_checked(["ctest", "--test-dir", str(aarch64_build), "-N"]).stdout
    for test in ("test_golden", "test_forward_golden", "test_forward_kernel", "test_kernel", "test_runtime",
                 "test_threads", "test_spec_dlopen", "cpp_sample"):
        assert f": {test}\n" in listed, f"{test} is not among the cross-built tests"
    result = run_checked(["ctest", "--test-dir", str(aarch64_build), "--output-on-failure", "-j", "2"], timeout=1800)
    assert "100% tests passed" in result.stdout

