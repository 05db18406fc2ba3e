"""The NumPy reference: time and peak resident memory at growing sizes up to
T=16384, H=4096 bf16 with weight, y_origin and clamp, beside the emulator kernel on the same
inputs (plan call + synchronize).

    python benchmarks/reference_cost.py [--quick] [--json]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import benchmark_main, run_child_on_emulator, table, verdict  # noqa: E402

SIZES = ((4096, 4096), (8192, 4096), (16384, 4096))
QUICK_SIZES = ((512, 1024), (1024, 1024), (2048, 1024))
TIME_TARGET = 10.0     # reference within 10x of the emulator kernel's time
MEMORY_TARGET = 3.0    # peak within 3x of the inputs' size


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(quick: bool) -> dict:
    import ml_dtypes

    import acl_swiglu as acl
    from acl_swiglu import reference
    from _common import make_inputs

    out = []
    stream = acl.Stream()
    for rows, hidden in (QUICK_SIZES if quick else SIZES):
        gy, x, w, yo = make_inputs(rows, hidden, ml_dtypes.bfloat16, True)
        input_bytes = gy.nbytes + x.nbytes + w.nbytes + yo.nbytes
        output_bytes = 8 * (x.size + w.size)   # the reference returns float64
        # Peak resident memory of the process during the call, outputs included: clear_refs
        # resets the high-water mark (large outputs are mappings tracemalloc does not see).
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        before = _status_kib("VmRSS")
        start = time.perf_counter()
        grad_x, grad_weight = reference.swiglu_group_quant_grad(gy, x, w, yo, None, 1.0)
        seconds = time.perf_counter() - start
        peak = (_status_kib("VmHWM") - before) * 1024
        # Like for like with the kernel, which writes into device memory allocated before it is
        # timed: the same call into the (now resident) outputs of the first one.
        into_out = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            reference.swiglu_group_quant_grad(gy, x, w, yo, None, 1.0, out=(grad_x, grad_weight))
            into_out = min(into_out, time.perf_counter() - t0)
        del grad_x, grad_weight
        arrays = [acl.to_device(a) for a in (gy, x, w, yo)]
        try:
            with acl.SwigluGroupQuantGradPlan(*arrays, None, 1.0, stream=stream) as plan:
                plan()
                stream.synchronize()
                kernel = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    plan()
                    stream.synchronize()
                    kernel = min(kernel, time.perf_counter() - t0)
        finally:
            for a in arrays:
                a.close()
        out.append({"rows": rows, "hidden": hidden, "reference_s": seconds, "reference_out_s": into_out,
                    "kernel_s": kernel, "ratio": into_out / kernel, "ratio_fresh": seconds / kernel, "input_bytes": input_bytes, "output_bytes": output_bytes,
                    "peak_bytes": peak, "peak_over_inputs": peak / input_bytes,
                    "peak_beyond_outputs": peak - output_bytes})
    stream.close()
    return {"sizes": out}


def measure(quick: bool) -> dict:
    data = run_child_on_emulator(__file__, quick)
    largest = data["sizes"][-1]
    data["targets"] = {
        "time_vs_kernel": {"value": largest["ratio"], "target": f"<= {TIME_TARGET:.0f}x the kernel",
                           "met": largest["ratio"] <= TIME_TARGET},
        "peak_memory": {"value": largest["peak_over_inputs"], "target": f"<= {MEMORY_TARGET:.0f}x the inputs",
                        "met": largest["peak_over_inputs"] <= MEMORY_TARGET},
    }
    return data


def report(data: dict) -> str:
    rows = [[f"T={e['rows']} H={e['hidden']}", f"{e['reference_s']:.2f}", f"{e['reference_out_s']:.2f}",
             f"{e['kernel_s'] * 1e3:.1f}", f"{e['ratio']:.1f}x", f"{e['ratio_fresh']:.1f}x",
             f"{e['input_bytes'] / 2**20:.0f}", f"{e['peak_bytes'] / 2**20:.0f}",
             f"{e['peak_over_inputs']:.2f}x"] for e in data["sizes"]]
    lines = ["NumPy reference, bf16 with weight, y_origin and clamp. 'fresh': a call that allocates its float64 "
             "outputs (the first touch of their pages included); 'out=': the same call into outputs that "
             "already exist, as the kernel writes into device memory allocated before it is timed. Peak: "
             "resident memory the fresh call adds, its outputs included.",
             table(["size", "fresh s", "out= s", "kernel ms", "out= / kernel", "fresh / kernel", "inputs MiB",
                    "peak MiB", "peak / inputs"], rows), ""]
    t = data["targets"]
    lines.append(f"target time (largest, out=): {t['time_vs_kernel']['value']:.1f}x the kernel, {t['time_vs_kernel']['target']}: "
                 f"{verdict(t['time_vs_kernel']['met'])}")
    lines.append(f"target memory (largest): {t['peak_memory']['value']:.2f}x the inputs, {t['peak_memory']['target']}: "
                 f"{verdict(t['peak_memory']['met'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    return benchmark_main(__doc__, measure, report, child, argv)


if __name__ == "__main__":
    sys.exit(main())
