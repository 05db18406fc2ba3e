"""The package ships py.typed, so its annotations are a promise: `mypy --strict` (the [tool.mypy]
configuration in pyproject.toml) finds nothing in the source tree. mypy's cache lives under
build/, so a run after the first only re-checks what changed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "acl_swiglu"
TORCH_MODULE = PACKAGE / "torch.py"

pytestmark = pytest.mark.skipif(not (ROOT / "pyproject.toml").is_file() or not PACKAGE.is_dir(),
                                reason="needs the source tree (the package sources and pyproject.toml)")


def _mypy(targets: List[str]) -> subprocess.CompletedProcess:
    cache = ROOT / "build" / "mypy-cache"
    cache.parent.mkdir(exist_ok=True)
    # The configuration is pyproject.toml's; the sources are the tree's, not an installed copy.
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(cache), "--no-error-summary", *targets],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _modules_without_torch() -> List[str]:
    return sorted(str(path.relative_to(ROOT)) for path in PACKAGE.glob("*.py") if path != TORCH_MODULE)


def test_the_package_is_clean_under_mypy_strict():
    """Every module but acl_swiglu.torch (that one needs torch's own types: the next test)."""
    proc = _mypy(_modules_without_torch())
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_torch_module_is_clean_against_the_installed_torch():
    pytest.importorskip("torch", reason="acl_swiglu.torch is type-checked against torch "
                                        "(pip install 'acl-swiglu[torch]')")
    proc = _mypy([str(TORCH_MODULE.relative_to(ROOT))])
    assert proc.returncode == 0, proc.stdout + proc.stderr
