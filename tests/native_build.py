"""The emulator's C tests and the C++ sample built with CMake and the C tests run by ctest
(tests/test_native.py judges the outcome), as one sequence of commands in a child process.

The test session starts the sequence as soon as it knows that tests/test_native.py is selected
(tests/conftest.py), so the build and ctest run beside the Python tests collected before it
instead of in front of its checks, which wait for the sequence to end. The commands are the same
wherever they run, and nothing is judged before they have all finished. A sequence still running
when the session ends (a run stopped early) is stopped with it.

Run as a script, it runs the sequence and writes each command's outcome to the file it is given.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "pytest-release"
# Beside the build directory, not in it: the sequence creates that directory.
REPORT = ROOT / "build" / "pytest-release-steps.json"
LOG = REPORT.with_suffix(".log")


def build_commands(build: Path, *options: str) -> List[List[str]]:
    """Configuring the project into `build` with the CMake options given, and building it."""
    return [["cmake", "-S", str(ROOT), "-B", str(build), *options],
            ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)]]


def sequence() -> List[tuple]:
    """(name, command, timeout in seconds or None) of each step, in order."""
    configure, build = build_commands(BUILD, "-DCMAKE_BUILD_TYPE=Release")
    return [("configure", configure, None), ("build", build, None),
            ("ctest", ["ctest", "--test-dir", str(BUILD), "--output-on-failure", "-j", "2"], 1800)]


def _run_sequence(report: Path) -> None:
    """Runs the steps until one fails; writes {name: outcome} for the steps that ran."""
    outcomes: Dict[str, dict] = {}
    for name, command, timeout in sequence():
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            outcome = {"command": command, "returncode": done.returncode, "stdout": done.stdout,
                       "stderr": done.stderr}
        except (OSError, subprocess.TimeoutExpired) as error:
            outcome = {"command": command, "returncode": None, "stdout": "", "stderr": repr(error)}
        outcomes[name] = outcome
        if outcome["returncode"] != 0:
            break
    partial = report.with_suffix(".partial")
    partial.write_text(json.dumps(outcomes))
    partial.replace(report)   # whole or absent: never a half-written report


_child: Optional[subprocess.Popen] = None


def start() -> None:
    """Starts the sequence, once per session."""
    global _child
    if _child is not None:
        return
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.unlink(missing_ok=True)
    with open(LOG, "w") as log:
        # A session of its own, so that stop() ends cmake, make and the compilers with it.
        _child = subprocess.Popen([sys.executable, __file__, str(REPORT)], cwd=ROOT, stdin=subprocess.DEVNULL,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def outcomes() -> Dict[str, dict]:
    """Waits for the sequence (starting it when the session has not) and returns the outcome of
    each step that ran: the steps after a failed one do not run."""
    start()
    assert _child is not None
    returncode = _child.wait()
    if returncode != 0 or not REPORT.is_file():
        raise RuntimeError(f"{' '.join(_child.args)} exited with {returncode} without a report:\n"
                           f"{LOG.read_text()[-6000:]}")
    return json.loads(REPORT.read_text())


def stop() -> None:
    """Ends a sequence that is still running (the session ended before waiting for it)."""
    if _child is not None and _child.poll() is None:
        os.killpg(_child.pid, signal.SIGTERM)
        try:
            _child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(_child.pid, signal.SIGKILL)
            _child.wait()


# ---- for the tests that build here and now (tests/test_native.py, tests/test_aarch64.py) ----


def passed(command, returncode, stdout, stderr):
    if returncode != 0:
        import pytest
        pytest.fail(f"{' '.join(map(str, command))} failed ({returncode}):\n{stdout[-6000:]}\n{stderr[-6000:]}")


def run_checked(cmd, **kwargs):
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kwargs)
    passed(cmd, result.returncode, result.stdout, result.stderr)
    return result


def need_cmake():
    if shutil.which("cmake") is None:
        import pytest
        pytest.fail("cmake is required to build the emulator's C tests")


def build_now(build_dir, *options):
    """Builds the project into build_dir here and now (the release build is native_build's)."""
    need_cmake()
    for command in build_commands(build_dir, *options):
        run_checked(command)
    return build_dir


if __name__ == "__main__":
    _run_sequence(Path(sys.argv[1]))
