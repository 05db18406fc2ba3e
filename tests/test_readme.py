"""The README's commands and examples work as written, and its pasted sample output is what the
sample prints."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# The PyTorch section's examples need torch (an optional extra): tests/test_torch_readme.py runs them.
TORCH_SECTION = re.search(r"^## PyTorch\n.*?(?=^## )", README, flags=re.S | re.M).group(0)


def _blocks(language: str, text: str = README.replace(TORCH_SECTION, "")):
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_two_commands_are_the_ci_commands():
    commands = [b.strip() for b in _blocks("") if b.strip().startswith("python3 -m venv")]
    assert commands == [
        "python3 -m venv .venv && . .venv/bin/activate && pip install . && acl-swiglu-sample",
        "python3 -m venv .venv && . .venv/bin/activate && pip install -c constraints/ci.txt '.[test,torch]' && pytest",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci, ".ci/run must run exactly the README's test command"
    # the default run deselects the slow tier; CI runs it right after, and the README says so
    lines = ci.splitlines()
    test_step = next(i for i, line in enumerate(lines) if commands[1] in line)
    assert lines[test_step + 1] == "pytest -m slow", ".ci/run must run the slow tier after the test command"
    assert "pytest -m slow" in README


def test_python_examples_run(monkeypatch):
    monkeypatch.chdir(ROOT)
    namespace = {}
    for block in _blocks("python"):
        exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["grad_x"].shape == (512, 1024)
    assert namespace["result"].shape == (512, 1024)


def test_pasted_sample_output_is_what_the_sample_prints(tmp_path):
    pasted = next(b for b in _blocks("") if b.startswith("backend: CPU emulator"))
    script = shutil.which("acl-swiglu-sample", path=os.path.dirname(sys.executable))
    assert script, "the acl-swiglu-sample console script is not installed next to this Python"
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator")
    result = subprocess.run([script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr

    def normalise(text):   # the install path differs from machine to machine
        return re.sub(r"(root |library: )\S*site-packages", r"\1/…/site-packages", text).strip()

    assert normalise(result.stdout) == normalise(pasted)
