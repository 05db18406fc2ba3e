"""Shared helpers of the benchmark scripts: building the C drivers, timing, inputs, printing."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "bench"


def build_native(build: Path = BUILD) -> Path:
    """Builds the emulator and the C drivers (Release); returns the build directory."""
    for cmd in (["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", "host_overhead",
                 "emu_opapi"]):
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return build


def emulator_env(build: Path = BUILD) -> Dict[str, str]:
    """Environment for a Python child that must use the build's emulator libraries (the same
    files the C drivers are linked with)."""
    env = dict(os.environ)
    env["ACL_SWIGLU_BACKEND"] = "emulator"
    env["ACL_SWIGLU_EMULATOR_DIR"] = str(build / "emulator" / "lib64")
    return env


def run_json(cmd: List[str], env: Optional[Dict[str, str]] = None, timeout: int = 3600) -> dict:
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return json.loads(result.stdout)


def run_child_on_emulator(script: str, quick: bool) -> dict:
    """Builds the emulator, then runs `script --child [--quick]` on it in a fresh Python and
    returns what the child printed as JSON (the measuring half of a benchmark script)."""
    build = build_native()
    return run_json([sys.executable, script, "--child"] + (["--quick"] if quick else []), env=emulator_env(build))


def time_calls(fn: Callable[[], object], repeats: int, warmup: int = 3, batch: int = 1) -> List[float]:
    """Seconds per call: each sample is the mean of `batch` calls in a row (so the clock's own
    cost is spread over them), as the C drivers do."""
    for _ in range(warmup):
        fn()
    samples = []
    clock = time.perf_counter
    calls = range(batch)
    for _ in range(repeats):
        start = clock()
        for _ in calls:
            fn()
        samples.append((clock() - start) / batch)
    return samples


def median_us(samples: List[float]) -> float:
    return statistics.median(samples) * 1e6


def make_inputs(rows: int, hidden: int, dtype, weight: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    grad_y = rng.standard_normal((rows, hidden), dtype=np.float32).astype(dtype)
    x = rng.standard_normal((rows, 2 * hidden), dtype=np.float32).astype(dtype)
    w = (rng.random((rows, 1), dtype=np.float32) + np.float32(0.5)) if weight else None
    y_origin = rng.standard_normal((rows, hidden), dtype=np.float32).astype(dtype) if weight else None
    return grad_y, x, w, y_origin


def table(headers: List[str], rows: List[List[object]]) -> str:
    cells = [[str(c) for c in row] for row in [headers] + rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def verdict(met: bool) -> str:
    return "met" if met else "NOT MET"


def benchmark_main(doc: str, measure, report, child, argv=None, child_nargs=None, child_type=None) -> int:
    """The command line of a benchmark script: --quick, --json, and the hidden --child that the
    script runs in a subprocess (with the emulator libraries it must use)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds")
    parser.add_argument("--json", action="store_true", help="print JSON")
    if child_nargs:
        parser.add_argument("--child", nargs=child_nargs, type=child_type, help=argparse.SUPPRESS)
    else:
        parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = child(*args.child) if child_nargs else child(args.quick)
        print(json.dumps(result))
        return 0
    data = measure(args.quick)
    print(json.dumps(data, indent=2) if args.json else report(data))
    return 0
