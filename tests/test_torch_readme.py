"""The README's PyTorch section: its example runs as written and trains."""

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch section needs torch (pip install 'acl-swiglu[torch]')")

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_pytorch_section_example_runs(monkeypatch):
    section = re.search(r"^## PyTorch\n.*?(?=^## )", README, flags=re.S | re.M).group(0)
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the PyTorch section has no example"
    monkeypatch.chdir(ROOT)
    namespace = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["y"].dtype == torch.bfloat16 and namespace["y"].shape == (64, 48)
    assert torch.all(namespace["y"][40 + 16:] == 0) and torch.all(namespace["y"][:56].abs().sum(-1) > 0)
    assert namespace["w_in"].weight.grad.abs().sum() > 0 and namespace["router"].weight.grad.abs().sum() > 0
    assert torch.isfinite(namespace["loss"])
