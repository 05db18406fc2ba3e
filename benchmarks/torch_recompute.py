"""What recompute_y_origin costs: acl_swiglu.torch.swiglu with a routing weight, its forward and
its backward timed with recompute_y_origin=True (y_origin recomputed in the backward) and False
(kept from the forward), side by side, with the activation memory each keeps between forward and
backward. Needs torch (the 'torch' extra).

    python benchmarks/torch_recompute.py [--quick] [--json]

Samples of the two settings alternate so that both see the same machine load; each figure is a
median. 'one expression' times the same forward and recompute as the single torch expression
torch.compile traces (run eagerly here), which the eager CPU path replaced by row blocks.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import benchmark_main, table  # noqa: E402

SIZES = ((4096, 2048), (16384, 1024))
QUICK_SIZES = ((1024, 512), (2048, 256))
CLAMP = 7.0


def _saved_bytes(fn) -> int:
    """Bytes of the tensors autograd keeps for the backward while fn() runs its forward."""
    import torch

    seen = {}

    def pack(tensor):
        seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return sum(seen.values())


def measure(quick: bool) -> dict:
    import torch

    import acl_swiglu.torch as acl_torch

    results = {}
    for rows, hidden in (QUICK_SIZES if quick else SIZES):
        generator = torch.Generator().manual_seed(0)
        x0 = torch.randn(rows, 2 * hidden, generator=generator).to(torch.bfloat16)
        weight0 = torch.rand(rows, generator=generator) + 0.5
        grad = torch.randn(rows, hidden, generator=generator).to(torch.bfloat16)
        variants = {"recompute": (True, True), "keep": (False, True), "recompute, one expression": (True, False)}
        samples = {name: {"forward": [], "backward": []} for name in variants}
        saved = {}
        blocks = acl_torch._in_blocks
        for round_ in range(3 if quick else 9):
            for name, (recompute, in_blocks) in variants.items():
                acl_torch._in_blocks = blocks if in_blocks else (lambda x: False)
                try:
                    x, weight = x0.clone().requires_grad_(), weight0.clone().requires_grad_()
                    start = time.perf_counter()
                    out = acl_torch.swiglu(x, weight, clamp_limit=CLAMP, recompute_y_origin=recompute)
                    middle = time.perf_counter()
                    out.backward(grad)
                    end = time.perf_counter()
                    if round_:   # the first round warms up (loading, allocator)
                        samples[name]["forward"].append((middle - start) * 1e3)
                        samples[name]["backward"].append((end - middle) * 1e3)
                    if name not in saved:
                        saved[name] = _saved_bytes(lambda: acl_torch.swiglu(
                            x0.clone().requires_grad_(), weight0.clone().requires_grad_(), clamp_limit=CLAMP,
                            recompute_y_origin=recompute))
                finally:
                    acl_torch._in_blocks = blocks
        figures = {name: {"forward_ms": statistics.median(s["forward"]), "backward_ms": statistics.median(s["backward"]),
                          "saved_mib": saved[name] / 2**20} for name, s in samples.items()}
        keep, recompute = figures["keep"], figures["recompute"]
        figures["recompute_extra_ms"] = recompute["backward_ms"] - keep["backward_ms"]
        figures["saved_fraction"] = 1 - recompute["saved_mib"] / keep["saved_mib"]
        results[f"T={rows} H={hidden}"] = figures
    return {"sizes": results, "targets": {}}


def report(data: dict) -> str:
    rows = []
    for size, f in data["sizes"].items():
        for name in ("recompute", "keep", "recompute, one expression"):
            v = f[name]
            rows.append([size, name, f"{v['forward_ms']:.1f}", f"{v['backward_ms']:.1f}", f"{v['saved_mib']:.1f}"])
    lines = ["swiglu bf16 with a routing weight and clamp: recompute_y_origin=True ('recompute') against False "
             "('keep'); median ms; MiB kept between forward and backward",
             table(["size", "y_origin", "forward ms", "backward ms", "kept MiB"], rows), ""]
    for size, f in data["sizes"].items():
        lines.append(f"{size}: recomputing adds {f['recompute_extra_ms']:.1f} ms to a "
                     f"{f['keep']['backward_ms']:.1f} ms backward and keeps {100 * f['saved_fraction']:.0f}% less")
    return "\n".join(lines)


def main(argv=None) -> int:
    return benchmark_main(__doc__, measure, report, lambda quick: measure(quick), argv)


if __name__ == "__main__":
    sys.exit(main())
