"""The PyTorch snippets of README.md and docs/*.md run as written (tests/doc_snippets.py), and
docs/pytorch.md shows each of its differences from a plain PyTorch SwiGLU with a snippet."""

import os
import re
import sys

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch snippets need torch (pip install '.[torch]')")

sys.path.insert(0, os.path.dirname(__file__))

from doc_snippets import ROOT, python_chains, run_chain, section, snippets  # noqa: E402

PYTORCH = ROOT / "docs" / "pytorch.md"


@pytest.mark.parametrize("page,blocks", python_chains(torch=True), ids=lambda v: getattr(v, "name", ""))
def test_torch_snippets_run(page, blocks, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    namespace = run_chain(blocks)
    if page == PYTORCH:   # the training step trained, and through the operator
        assert namespace["y"].dtype == torch.bfloat16 and namespace["y"].shape == (64, 48)
        assert namespace["w_in"].weight.grad.abs().sum() > 0 and torch.isfinite(namespace["loss"])


def test_each_difference_has_its_snippet():
    """Each bold-led paragraph of the differences section is followed by a snippet before the next."""
    text = section(PYTORCH, "Differences from a plain PyTorch SwiGLU")
    parts = re.split(r"^\*\*(.+?)\*\*", text, flags=re.M)[1:]
    differences = dict(zip(parts[0::2], parts[1::2]))
    assert len(differences) >= 7, list(differences)
    for title, body in differences.items():
        assert "```python\n" in body, f"'{title}' has no snippet"


def test_the_torchrun_verdict_printed_is_the_one_shown():
    """The output shown under the torchrun command is what tests/torchrun_moe.py prints (the slow
    tier's tests/test_torch_distributed.py runs the command and compares, line by line)."""
    blocks = snippets(PYTORCH)
    command = next(i for i, b in enumerate(blocks) if "torchrun" in b.code and b.marker
                   and b.marker[0] == "run by")
    shown = blocks[command + 1]
    assert shown.language == "text" and shown.code.strip().splitlines()[-1] == "verdict: PASS"


def test_the_routing_weight_is_not_called_the_gate():
    """x's first half is the gate; the MoE router's per-token weight is the routing weight, and no
    snippet passes a tensor called gate as swiglu's weight."""
    from doc_snippets import all_snippets

    for snippet in all_snippets():
        if snippet.language == "python":
            assert not re.search(r"\b(swiglu|act|SwiGLU\([^)]*\))\([^,()]+,\s*gates?\b", snippet.code), snippet.where
            assert not re.search(r"\bgates?\s*,\s*_\s*=\s*torch\.softmax", snippet.code), snippet.where
