"""An expert-parallel MoE step under torchrun (two ranks, gloo, one emulated device each)
matches the same model run in one process, and each rank's ACL work ran on its own device.
Slow tier: three interpreters that each import torch (about 6 s on 2 cores); CI runs it as
`pytest -m slow`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="acl_swiglu.torch needs torch (pip install 'acl-swiglu[torch]')")
pytest.importorskip("torch.distributed", reason="this torch build has no torch.distributed")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import doc_snippets  # noqa: E402
import torchrun_moe  # noqa: E402

ROOT = doc_snippets.ROOT
PYTORCH = ROOT / "docs" / "pytorch.md"

RANKS = 2


@pytest.mark.slow
@pytest.mark.emulator_only
def test_torchrun_expert_parallel_step_matches_one_process(tmp_path):
    if not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")
    # The command docs/pytorch.md shows, as shown (from the clone's root, torchrun next to this
    # Python), saving the ranks' results too; its output is the one the page shows after it.
    blocks = doc_snippets.snippets(PYTORCH)
    at = next(i for i, b in enumerate(blocks) if b.marker == ("run by", "tests/test_torch_distributed.py"))
    command, shown = blocks[at].code.strip(), blocks[at + 1].code.strip()
    assert f"--nproc-per-node={RANKS}" in command
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator", OMP_NUM_THREADS="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", f"{command} --out {tmp_path}"], cwd=ROOT,
                            capture_output=True, text=True, env=env, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert result.stdout.strip().splitlines()[-len(shown.splitlines()):] == shown.splitlines(), result.stdout

    expected = torchrun_moe.single_process(RANKS)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(RANKS)]
    rows = torchrun_moe.TOKENS_PER_RANK
    for rank, got in enumerate(ranks):
        assert got["rank"] == rank
        torch.testing.assert_close(got["out"], expected["out"][rank * rows:(rank + 1) * rows])
        torch.testing.assert_close(got["loss"], expected["loss"])
        torch.testing.assert_close(got["router_grad"], expected["router_grad"])   # all_reduced
        torch.testing.assert_close(got["w1_grad"], expected["w1_grad"][rank])     # this rank's expert
        torch.testing.assert_close(got["w2_grad"], expected["w2_grad"][rank])
    assert expected["w1_grad"].abs().sum() > 0 and expected["router_grad"].abs().sum() > 0
    for rank, got in enumerate(ranks):
        assert got["acl_device"] == rank, f"rank {rank}'s ACL work ran on device {got['acl_device']!r}"


def test_the_verdict_compares_every_result_of_a_rank():
    """What rank r checks against one process: its outputs, the loss, the all_reduced router
    gradient and its expert's gradients; a difference in any one is reported by name."""
    expected = torchrun_moe.single_process(RANKS)
    rows = torchrun_moe.TOKENS_PER_RANK
    rank = 1
    got = {"out": expected["out"][rows:2 * rows].clone(), "loss": expected["loss"].clone(),
           "router_grad": expected["router_grad"].clone(), "w1_grad": expected["w1_grad"][rank].clone(),
           "w2_grad": expected["w2_grad"][rank].clone(), "acl_device": rank}
    assert torchrun_moe.compare(rank, RANKS, got, expected, "cpu") == []
    for name in ("out", "loss", "router_grad", "w1_grad", "w2_grad"):
        changed = dict(got, **{name: got[name] + 1e-3 * (got[name].abs().max() + 1)})
        problems = torchrun_moe.compare(rank, RANKS, changed, expected, "cpu")
        assert [line.split(":")[0] for line in problems] == [name], problems
    assert torchrun_moe.compare(rank, RANKS, dict(got, acl_device=0), expected, "cpu") == [
        "acl_device: rank 1's ACL work ran on device 0"]
