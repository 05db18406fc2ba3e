"""The package ships py.typed, so its annotations are a promise: `mypy --strict` (the [tool.mypy]
configuration in pyproject.toml) finds nothing in the source tree. So is its Python version
promise (requires-python, the version classifiers, the README): the sources are type-checked for
every promised version and use no syntax newer than the oldest one. mypy's cache lives under
build/ (one subdirectory per target version, mypy's own layout), so a run after the first only
re-checks what changed."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "acl_swiglu"
TORCH_MODULE = PACKAGE / "torch.py"
PYPROJECT = ROOT / "pyproject.toml"
# Scripts users run with their own Python besides the package: README's benchmarks and the wheel tools.
SCRIPTS = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "tools").glob("*.py")])

pytestmark = pytest.mark.skipif(not PYPROJECT.is_file() or not PACKAGE.is_dir(),
                                reason="needs the source tree (the package sources and pyproject.toml)")


def _promise() -> Tuple[int, List[int]]:
    """(the minor version requires-python starts at, the minor versions the classifiers list).
    Read with patterns rather than tomllib, which the oldest promised Python lacks."""
    text = PYPROJECT.read_text()
    floor = re.search(r'^requires-python = ">=3\.(\d+)"$', text, flags=re.M)
    assert floor, 'pyproject.toml must say requires-python = ">=3.N"'
    listed = [int(minor) for minor in re.findall(r'"Programming Language :: Python :: 3\.(\d+)"', text)]
    return int(floor.group(1)), listed


FLOOR, PROMISED = _promise() if PYPROJECT.is_file() else (0, [])
# The running interpreter's version is checked in the default run; the other promised versions
# (a cold mypy cache costs about 10 s each) in the slow tier, which CI runs as well.
VERSIONS = [pytest.param(f"3.{minor}", marks=() if minor == sys.version_info[1] else pytest.mark.slow)
            for minor in PROMISED]
# acl_swiglu.torch against torch's own annotations: mypy reads torch's whole typed API first (about
# 10 s per version with a cold cache), so every version of that check is in the slow tier.
TORCH_VERSIONS = [pytest.param(f"3.{minor}", marks=pytest.mark.slow) for minor in PROMISED]


def _mypy(targets: List[str], python_version: str) -> subprocess.CompletedProcess:
    cache = ROOT / "build" / "mypy-cache"
    cache.parent.mkdir(exist_ok=True)
    # The configuration is pyproject.toml's; the sources are the tree's, not an installed copy.
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT),
                           "--python-version", python_version,
                           "--cache-dir", str(cache), "--no-error-summary", *targets],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _modules_without_torch() -> List[str]:
    return sorted(str(path.relative_to(ROOT)) for path in PACKAGE.glob("*.py") if path != TORCH_MODULE)


def test_the_python_promise_is_one_range_stated_alike_everywhere():
    """The classifiers list every version from requires-python's floor on, none skipped, so
    that checking the listed ones checks the whole range; the README states the same range."""
    assert PROMISED and PROMISED == list(range(FLOOR, FLOOR + len(PROMISED))), \
        f"the classifiers' 3.x versions {PROMISED} must run on from requires-python's 3.{FLOOR} without a gap"
    readme = (ROOT / "README.md").read_text()
    assert re.findall(r"Python 3\.(\d+)\+", readme) == [str(FLOOR)], \
        f"README must say once that it needs Python 3.{FLOOR}+"
    assert re.findall(r"type-checked for 3\.(\d+) to 3\.(\d+)", readme) == [(str(FLOOR), str(PROMISED[-1]))], \
        f"README must say the sources are type-checked for 3.{FLOOR} to 3.{PROMISED[-1]}"


@pytest.mark.parametrize("python_version", VERSIONS)
def test_the_package_is_clean_under_mypy_strict(python_version):
    """Every module but acl_swiglu.torch (that one needs torch's own types: the next test)."""
    proc = _mypy(_modules_without_torch(), python_version)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("python_version", TORCH_VERSIONS)
def test_the_torch_module_is_clean_against_the_installed_torch(python_version):
    pytest.importorskip("torch", reason="acl_swiglu.torch is type-checked against torch "
                                        "(pip install 'acl-swiglu[torch]')")
    proc = _mypy([str(TORCH_MODULE.relative_to(ROOT))], python_version)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_syntax_newer_than_the_oldest_promised_python():
    """The running interpreter's parser held to the floor's grammar rejects syntax the floor
    lacks (except* before 3.11, for one), in the package and in the scripts mypy does not check.
    Warnings are errors too: an invalid escape sequence warns today and is a SyntaxError later."""
    refused = []
    for source in [*sorted(PACKAGE.rglob("*.py")), *SCRIPTS]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                ast.parse(source.read_text(), filename=str(source), feature_version=(3, FLOOR))
            except (SyntaxError, Warning) as error:
                refused.append(f"{source.relative_to(ROOT)}: {error!r}")
    assert not refused, "\n".join(refused)
