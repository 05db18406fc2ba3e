"""The PyTorch call beside the NumPy call it wraps: acl_swiglu.torch.swiglu_group_quant_grad on CPU
tensors against acl_swiglu.swiglu_group_quant_grad on NumPy views of the same memory (bf16, with
weight, y_origin, group_index and clamp), median microseconds per call, both until results are
ready. Needs torch (the 'torch' extra).

    python benchmarks/torch_overhead.py [--quick] [--json]

The two calls alternate sample by sample so that both see the same machine load. At the large
size the torch call must cost at most 1.1x the NumPy call (no extra copies); at the tiny size
the difference is the torch dispatch overhead.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import benchmark_main, make_inputs, table, verdict  # noqa: E402

SIZES = ((1, 16), (4096, 2048))
RATIO_TARGET = 1.1   # torch call / NumPy call at the large size


def _alternating(calls, rounds: int, batch: int):
    """Per call: samples (seconds per call, each the mean of `batch` calls), taken in turns."""
    for call in calls.values():
        call()   # warm-up (first-use loading, allocator pools)
    samples = {name: [] for name in calls}
    clock = time.perf_counter
    for _ in range(rounds):
        for name, call in calls.items():
            start = clock()
            for _ in range(batch):
                call()
            samples[name].append((clock() - start) / batch)
    return samples


def measure(quick: bool) -> dict:
    import numpy as np
    import torch

    import acl_swiglu
    import acl_swiglu.torch as acl_torch

    results = {}
    for rows, hidden in SIZES:
        grad_y, x, weight, y_origin = make_inputs(rows, hidden, acl_swiglu.bfloat16, weight=True)
        groups = np.array([rows - rows // 4, rows // 4], np.int64)

        def tensor(array):
            if array.dtype == acl_swiglu.bfloat16:
                return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
            return torch.from_numpy(array)

        t_gy, t_x, t_w, t_yo, t_groups = map(tensor, (grad_y, x, weight, y_origin, groups))
        calls = {
            "numpy": lambda: acl_swiglu.swiglu_group_quant_grad(grad_y, x, weight, y_origin, groups, 1.0),
            "torch": lambda: acl_torch.swiglu_group_quant_grad(t_gy, t_x, weight=t_w, y_origin=t_yo,
                                                               group_index=t_groups, clamp_limit=1.0),
        }
        tiny = rows * hidden < 100000
        rounds = (30 if quick else 200) if tiny else (4 if quick else 15)
        samples = _alternating(calls, rounds, batch=20 if tiny else 1)
        figures = {name: statistics.median(s) * 1e6 for name, s in samples.items()}
        figures["ratio"] = figures["torch"] / figures["numpy"]
        figures["overhead_us"] = figures["torch"] - figures["numpy"]
        results[f"T={rows} H={hidden}"] = figures
    tiny, large = (results[f"T={r} H={h}"] for r, h in SIZES)
    targets = {
        "large_ratio": {"value": large["ratio"], "target": f"<= {RATIO_TARGET}x the NumPy call",
                        "met": large["ratio"] <= RATIO_TARGET},
        "tiny_overhead_us": {"value": tiny["overhead_us"], "target": "reported (torch dispatch, us per call)",
                             "met": True},
    }
    return {"sizes": results, "targets": targets}


def report(data: dict) -> str:
    rows = [[size, f"{f['numpy']:.1f}", f"{f['torch']:.1f}", f"{f['ratio']:.3f}x", f"{f['overhead_us']:+.1f}"]
            for size, f in data["sizes"].items()]
    t = data["targets"]
    return "\n".join([
        "PyTorch call beside the NumPy call (bf16, weight + y_origin + group_index + clamp; median us per call)",
        table(["size", "NumPy us", "torch us", "torch / NumPy", "torch - NumPy us"], rows), "",
        f"target large size: {t['large_ratio']['value']:.3f}x, {t['large_ratio']['target']}: "
        f"{verdict(t['large_ratio']['met'])}",
        f"tiny size: the torch call adds {t['tiny_overhead_us']['value']:.1f} us of dispatch per call",
    ])


def main(argv=None) -> int:
    return benchmark_main(__doc__, measure, report, lambda quick: measure(quick), argv)


if __name__ == "__main__":
    sys.exit(main())
