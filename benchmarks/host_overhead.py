"""Host overhead of the binding: microseconds per call of the one-shot NumPy call, the
device-level call and a plan call (each until results are ready: with synchronisation; the
plan call as plan(synchronize=True), one Python call for launch + synchronize),
beside the C driver making the same ACL calls against the same emulator libraries.

    python benchmarks/host_overhead.py [--quick] [--json]

Rounds alternate C and Python so that both see the same machine load; each figure is the median
over rounds of per-round medians, each sample the mean of a batch of calls in a row.
"""

from __future__ import annotations

import functools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BUILD, benchmark_main, build_native, emulator_env, run_json, table, verdict  # noqa: E402

SIZES = ((1, 16), (64, 256), (512, 512))
SCENARIOS = ("one_shot", "device_call", "plan_call", "plan_rebind")
# Python only (the C driver has no such scenario): device-level calls taking turns among eight
# argument sets of the same layout (a model's layers, each with its own buffers), against the exact repeat of
# one (device_call).
ALTERNATING = "device_call_alternating"
TURNS = 8
ALTERNATING_TARGET = 1.5
# Tiny shape (T=1 H=16), each Python path at most this many times the C driver making the same calls.
RATIO_TARGETS = (("one_shot", "one-shot NumPy call", 6.0),
                 ("device_call", "device-level call on existing arrays + synchronize", 5.0),
                 ("plan_call", "plan(synchronize=True)", 2.2))


def python_side(rows: int, hidden: int, repeats: int, batch: int) -> dict:
    """Runs in a child: the same scenarios as benchmarks/c/host_overhead.c, in Python."""
    import ml_dtypes
    import numpy as np

    import acl_swiglu as acl
    from _common import median_us, time_calls

    bf16 = ml_dtypes.bfloat16
    grad_y = np.full((rows, hidden), 1.0, bf16)
    x = np.where(np.arange(2 * rows * hidden).reshape(rows, 2 * hidden) % 3, 1.0, -1.0).astype(bf16)
    weight = np.full((rows, 1), 0.5, np.float32)
    y_origin = np.full((rows, hidden), 0.5, bf16)
    groups = np.array([rows // 2, rows - rows // 2], np.int64)
    stream = acl.Stream()
    arrays = [acl.to_device(a) for a in (grad_y, x, weight, y_origin, groups)]
    second = [acl.to_device(a) for a in (grad_y, x)]
    grad_x = acl.DeviceArray.empty(x.shape, bf16)
    grad_x2 = acl.DeviceArray.empty(x.shape, bf16)
    others = [(acl.to_device(grad_y), acl.to_device(x), acl.DeviceArray.empty(x.shape, bf16))
              for _ in range(TURNS - 2)]
    grad_weight = acl.DeviceArray.empty(weight.shape, np.float32)
    results = {}
    try:
        results["one_shot"] = median_us(time_calls(
            functools.partial(acl.swiglu_group_quant_grad, grad_y, x, weight, y_origin, groups, 1.0), repeats,
            batch=batch))

        def device_call():
            acl.swiglu_group_quant_grad_device(*arrays, 1.0, grad_x=grad_x, grad_weight=grad_weight, stream=stream)
            stream.synchronize()

        results["device_call"] = median_us(time_calls(device_call, repeats, batch=batch))
        alternate = [(arrays[0], arrays[1], grad_x), (second[0], second[1], grad_x2), *others]
        turn = [0]

        def device_call_alternating():
            gy, xx, gx = alternate[turn[0] % TURNS]
            turn[0] += 1
            acl.swiglu_group_quant_grad_device(gy, xx, *arrays[2:], 1.0, grad_x=gx, grad_weight=grad_weight,
                                               stream=stream)
            stream.synchronize()

        results[ALTERNATING] = median_us(time_calls(device_call_alternating, repeats, batch=batch))
        with acl.SwigluGroupQuantGradPlan(*arrays, 1.0, grad_x=grad_x, grad_weight=grad_weight,
                                          stream=stream) as plan:
            # (the call itself, as a user's loop makes it: no wrapper frame the C driver does not have)
            results["plan_call"] = median_us(time_calls(functools.partial(plan, synchronize=True), repeats,
                                                        batch=batch))
            sets = [(arrays[0], arrays[1], grad_x), (second[0], second[1], grad_x2)]
            state = [0]

            def plan_rebind():
                gy, xx, gx = sets[state[0] & 1]
                state[0] += 1
                plan(gy, xx, grad_x=gx, synchronize=True)

            results["plan_rebind"] = median_us(time_calls(plan_rebind, repeats, batch=batch))
    finally:
        for array in arrays + second + [grad_x, grad_x2, grad_weight] + [a for trio in others for a in trio]:
            array.close()
        stream.close()
    return results


def measure(quick: bool) -> dict:
    build = build_native()
    driver = str(BUILD / "benchmarks" / "c" / "host_overhead")
    rounds = 3 if quick else 5
    results = {}
    for rows, hidden in SIZES:
        repeats = 60 if quick else 200
        batch = 20 if rows * hidden <= 100000 else 5
        c_rounds, py_rounds = [], []
        for _ in range(rounds):
            c = run_json([driver, str(rows), str(hidden), str(repeats), str(batch)])
            c_rounds.append({k: v["median_us"] for k, v in c.items()})
            py_rounds.append(run_json([sys.executable, __file__, "--child", str(rows), str(hidden), str(repeats),
                                       str(batch)], env=emulator_env(build)))
        size = f"T={rows} H={hidden}"
        results[size] = {
            scenario: {"python_us": statistics.median(r[scenario] for r in py_rounds),
                       "c_us": statistics.median(r[scenario] for r in c_rounds)}
            for scenario in SCENARIOS
        }
        for figures in results[size].values():
            figures["ratio"] = figures["python_us"] / figures["c_us"]
        alternating = statistics.median(r[ALTERNATING] for r in py_rounds)
        results[size][ALTERNATING] = {"python_us": alternating, "c_us": results[size]["device_call"]["python_us"],
                                      "ratio": alternating / results[size]["device_call"]["python_us"]}
    tiny = results[f"T={SIZES[0][0]} H={SIZES[0][1]}"]
    targets = {f"{scenario}_ratio": {"value": tiny[scenario]["ratio"], "target": f"<= {limit}x C",
                                     "label": label, "met": tiny[scenario]["ratio"] <= limit}
               for scenario, label, limit in RATIO_TARGETS}
    ratio = tiny[ALTERNATING]["ratio"]
    targets[f"{ALTERNATING}_ratio"] = {"value": ratio, "target": f"<= {ALTERNATING_TARGET}x an exact repeat",
                                       "label": f"device-level calls taking turns among {TURNS} argument sets",
                                       "met": ratio <= ALTERNATING_TARGET}
    return {"sizes": results, "targets": targets}


def report(data: dict) -> str:
    rows = []
    for size, scenarios in data["sizes"].items():
        for name, f in scenarios.items():
            rows.append([size, name, f"{f['python_us']:.1f}", f"{f['c_us']:.1f}", f"{f['ratio']:.2f}x"])
    lines = ["Host overhead per call, with synchronisation (median microseconds; Python vs C, same libraries;",
             f"{ALTERNATING}: its 'C us' column is the Python exact repeat, device_call)",
             table(["size", "call", "Python us", "C us", "Python / C"], rows), ""]
    for t in data["targets"].values():
        lines.append(f"target {t['label']} (T=1 H=16): {t['value']:.2f}x, {t['target']}: {verdict(t['met'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    return benchmark_main(__doc__, measure, report, python_side, argv, child_nargs=4, child_type=int)


if __name__ == "__main__":
    sys.exit(main())
