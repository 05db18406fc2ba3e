"""The picture of a benchmarks/run.py run (docs/performance.png): what one call costs on each path
against problem size, beside the C driver making the same ACL calls, and the emulator kernel's
throughput beside a memory copy's. Needs matplotlib (the 'plot' extra); run.py imports this
module only for --plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

PATHS = (("one_shot", "one-shot NumPy call", "tab:blue"), ("device_call", "device-level call", "tab:orange"),
         ("plan_call", "plan(synchronize=True)", "tab:green"))
DTYPE_COLOURS = {"float32": "tab:purple", "float16": "tab:red", "bfloat16": "tab:blue"}


class PlotUnavailable(RuntimeError):
    """matplotlib cannot be imported."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("--plot draws with matplotlib, which is not installed: pip install '.[plot]' "
                              "(or pip install matplotlib)") from None
    matplotlib.use("Agg")   # a file, never a window
    import matplotlib.pyplot as pyplot
    return pyplot


def _size(label: str) -> Tuple[int, int]:
    """'T=512 H=512' -> (512, 512)."""
    fields = dict(part.split("=") for part in label.split())
    return int(fields["T"]), int(fields["H"])


def _call_costs(host: Dict[str, Any]) -> Tuple[List[Tuple[int, int]], Dict[str, Dict[str, List[float]]]]:
    sizes = sorted(host["sizes"], key=lambda label: _size(label)[0] * _size(label)[1])
    costs = {path: {"python": [host["sizes"][s][path]["python_us"] for s in sizes],
                    "c": [host["sizes"][s][path]["c_us"] for s in sizes]} for path, _, _ in PATHS}
    return [_size(label) for label in sizes], costs


def _size_axis(axis: Any, shapes: List[Tuple[int, int]]) -> None:
    """A log axis of T x H elements, ticked at the sizes measured and labelled with their shapes."""
    from matplotlib.ticker import NullFormatter, NullLocator

    axis.set_xscale("log")
    axis.xaxis.set_minor_locator(NullLocator())
    axis.xaxis.set_minor_formatter(NullFormatter())
    axis.set_xticks([rows * hidden for rows, hidden in shapes])
    axis.set_xticklabels([f"T={rows}\nH={hidden}" for rows, hidden in shapes], fontsize=8)


def draw(results: Dict[str, Any], path: Path) -> None:
    """Writes the two panels of `results` (run.py's JSON) to `path` as a PNG."""
    pyplot = _pyplot()
    figure, (calls, kernel) = pyplot.subplots(1, 2, figsize=(11, 4.2), dpi=100)

    shapes, costs = _call_costs(results["host_overhead"])
    elements = [rows * hidden for rows, hidden in shapes]
    for name, label, colour in PATHS:
        calls.plot(elements, costs[name]["python"], "o-", color=colour, label=label)
        calls.plot(elements, costs[name]["c"], "s--", color=colour, alpha=0.7, label="_nolegend_")
    calls.plot([], [], "s--", color="grey", label="the same ACL calls from C")
    _size_axis(calls, shapes)
    calls.set_yscale("log")
    calls.set_xlabel("problem size (bf16, weight, y_origin, groups, clamp)")
    calls.set_ylabel("microseconds per call, with synchronisation")
    calls.set_title("One call, Python (solid) beside C (dashed)")
    calls.grid(True, which="both", alpha=0.3)
    calls.legend(fontsize=7, loc="upper left")

    entries = [e for e in results["kernel"]["sizes"] if e["options"] == "weight+clamp"]
    copies: Dict[Tuple[int, int], List[float]] = {}
    for dtype, colour in DTYPE_COLOURS.items():
        rows = sorted((e for e in entries if e["dtype"] == dtype), key=lambda e: e["rows"] * e["hidden"])
        if not rows:
            continue
        kernel.plot([e["rows"] * e["hidden"] for e in rows], [e["kernel_gbs"] for e in rows], "o-", color=colour,
                    label=f"kernel, {dtype}")
        for e in rows:
            copies.setdefault((e["rows"], e["hidden"]), []).append(e["memcpy_gbs"])
    measured = sorted(copies, key=lambda shape: shape[0] * shape[1])
    kernel.plot([rows * hidden for rows, hidden in measured], [max(copies[s]) for s in measured], "k--",
                label="np.copyto of as many bytes (best)")
    _size_axis(kernel, measured)
    kernel.set_ylim(bottom=0)
    kernel.set_xlabel("problem size")
    kernel.set_ylabel("GB/s moved (bytes read + written)")
    kernel.set_title("Emulator kernel with weight, y_origin, groups, clamp")
    kernel.grid(True, which="both", alpha=0.3)
    kernel.legend(fontsize=7, loc="best")

    machine = results.get("machine", {})
    figure.suptitle(f"acl-swiglu on the CPU emulator: {machine.get('processor', '')}, Python {machine.get('python', '')}"
                    f", {machine.get('date', '')}" + (" (quick run)" if machine.get("quick") else ""), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, format="png")
    pyplot.close(figure)
