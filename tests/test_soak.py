"""benchmarks/soak.py in a shortened form (3000 plan calls, 500 one-shot calls), in a subprocess,
judged from its --json figures; plus its argument handling and its own pass/fail logic."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tracemalloc
from contextlib import ExitStack

import numpy as np
import pytest

import acl_swiglu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOAK = os.path.join(ROOT, "benchmarks", "soak.py")
PLAN_CALLS, ONE_SHOT_CALLS = 3000, 500
MIB = 1 << 20

pytestmark = pytest.mark.emulator_only


def run_soak(tmp_path, *args, timeout=300):
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator")
    env.pop("ACL_EMU_FAIL", None)
    # cwd outside the repository: the installed package (with its compiled emulator) is imported
    return subprocess.run([sys.executable, SOAK, *args], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=timeout)


def soak_figures(tmp, *extra):
    proc = run_soak(tmp, "--plan-calls", str(PLAN_CALLS), "--one-shot-calls", str(ONE_SHOT_CALLS), "--json", *extra)
    try:
        figures = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"soak printed no JSON (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc, figures


@pytest.fixture(scope="module")
def short_soak(tmp_path_factory):
    """The shortened soak as CI runs it (live counts, RSS, results)."""
    return soak_figures(tmp_path_factory.mktemp("soak"))


@pytest.fixture(scope="module")
def traced_soak(tmp_path_factory):
    """The same with --trace-python-heap (tracemalloc per phase; slower calls)."""
    return soak_figures(tmp_path_factory.mktemp("soak-traced"), "--trace-python-heap")


def test_soak_counts_and_checks_every_call(short_soak):
    proc, f = short_soak
    assert f["backend"] == "emulator"
    assert f["plan_calls"] == PLAN_CALLS and f["one_shot_calls"] == ONE_SHOT_CALLS
    assert f["shape"] == {"T": 8, "H": 64, "dtype": "bfloat16", "weight": True, "clamp_limit": 3.0,
                          "group_index": [5, 2]}
    assert f["mismatches"] == 0, proc.stderr[-3000:]
    phases = {}
    for sample in f["samples"]:
        phases.setdefault(sample["phase"], []).append(sample["calls"])
    # start, about every 10%, and the end of each measured phase
    assert phases["plan"][0] == 0 and phases["plan"][-1] == PLAN_CALLS and len(phases["plan"]) == 11, phases["plan"]
    assert phases["one-shot"][-1] == ONE_SHOT_CALLS and len(phases["one-shot"]) == 11, phases["one-shot"]
    assert {"start", "warmed-up", "end"} <= set(phases)
    # progress lines are human-readable on stderr when --json is given
    progress = [ln for ln in proc.stderr.splitlines() if ln.startswith("[plan     ]") and " rss " in ln]
    assert len(progress) == 11 and "rss" in progress[0] and "live tensor" in progress[0], progress[:2]
    assert f["us_per_call"]["plan"] > 0 and f["us_per_call"]["one_shot"] > 0


def test_soak_live_counts_return_to_the_start(short_soak):
    proc, f = short_soak
    assert f["live_start"] == f["live_end"], (f["live_start"], f["live_end"])
    assert not any(f["live_end"].values()), f["live_end"]
    assert f["live_grew_in_loop"] == [], f["live_grew_in_loop"]
    # inside a phase the counts are what that phase holds, at every sample
    plan = [s["live"] for s in f["samples"] if s["phase"] == "plan"]
    assert all(counts == plan[0] for counts in plan), plan
    assert plan[0]["executor"] == 1 and plan[0]["tensor"] == 7, plan[0]   # one repeatable executor, 7 tensors
    one_shot = [s["live"] for s in f["samples"] if s["phase"] == "one-shot"]
    assert all(c == {"tensor": 0, "int_array": 0, "executor": 0, "stream": 1, "allocation": 0, "bytes": 0}
               for c in one_shot), one_shot   # only the cached per-thread stream (the workspace is in the arena)


def test_soak_rss_stays_within_its_bound(short_soak):
    proc, f = short_soak
    assert f["rss_bound"] == 16 * MIB
    assert f["rss_start"] > 0 and f["rss_after_warmup"] > 0 and f["rss_end"] > 0
    assert f["rss_growth_after_warmup"] == f["rss_end"] - f["rss_after_warmup"]
    assert f["rss_growth_after_warmup"] <= f["rss_bound"], f["rss_growth_after_warmup"] / MIB


def test_soak_python_heap_does_not_grow_per_call(traced_soak):
    """tracemalloc over each measured phase: a plan call or a one-shot call must not leave
    Python objects behind (a few bytes per call of noise at most). Too small for the RSS bound
    in a short run, such a leak grows without limit in a long-running process."""
    proc, f = traced_soak
    assert f["mismatches"] == 0 and f["live_start"] == f["live_end"]
    heap = f["python_heap"]
    assert set(heap) == {"plan", "one-shot"}, heap
    assert heap["plan"]["bytes_per_call"] <= f["heap_bound_per_call"], heap["plan"]
    assert heap["one-shot"]["bytes_per_call"] <= f["heap_bound_per_call"], (
        f"one-shot calls leak {heap['one-shot']['bytes_per_call']} bytes of Python heap each; top sites: "
        f"{heap['one-shot']['top']}")


def _heap_growth_per_call(call, calls=1000, warmup=200) -> tuple:
    """Python heap growth (tracemalloc, allocations made in acl_swiglu's files) per call."""
    package = os.path.dirname(acl_swiglu.__file__)
    for _ in range(warmup):
        call()
    gc.collect()
    tracemalloc.start(1)
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(calls):
            call()
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    only = [tracemalloc.Filter(True, os.path.join(package, "*"))]
    stats = after.filter_traces(only).compare_to(before.filter_traces(only), "lineno")
    growth = sum(s.size_diff for s in stats)
    top = [(f"{os.path.basename(s.traceback[0].filename)}:{s.traceback[0].lineno}", s.size_diff, s.count_diff)
           for s in sorted(stats, key=lambda s: -s.size_diff)[:3]]
    return growth / calls, top


@pytest.mark.parametrize("path", ["one-shot", "device-level", "two-phase"])
def test_repeated_calls_do_not_grow_the_python_heap(path):
    """In-process, per call path, 1000 calls after a warm-up: the package must not keep Python
    objects per call (the bound leaves room for ctypes' caches; one kept object per call is
    over 100 bytes)."""
    gy = np.linspace(-1, 1, 8 * 64, dtype=np.float32).reshape(8, 64)
    x = np.linspace(-4, 4, 8 * 128, dtype=np.float32).reshape(8, 128)
    with ExitStack() as stack:
        if path == "one-shot":
            def call():
                acl_swiglu.swiglu_group_quant_grad(gy, x)
        else:
            stream = stack.enter_context(acl_swiglu.Stream())
            d = [stack.enter_context(acl_swiglu.to_device(a)) for a in (gy, x)]
            out = stack.enter_context(acl_swiglu.DeviceArray.empty(x.shape, np.float32))
            if path == "device-level":
                def call():
                    acl_swiglu.swiglu_group_quant_grad_device(*d, grad_x=out, stream=stream)
                    stream.synchronize()
            else:
                def call():
                    executor = acl_swiglu.get_workspace_size(*d, grad_x=out)
                    executor.launch(stream)
                    stream.synchronize()
        per_call, top = _heap_growth_per_call(call)
        assert per_call <= 32, f"{path}: the Python heap grows by {per_call:.1f} bytes per call; top sites {top}"


def test_soak_exit_status(short_soak):
    proc, f = short_soak
    assert f["python_heap"] == {} and f["heap_bound_per_call"] is None   # not traced in this run
    assert f["ok"] is (f["problems"] == []), f
    assert proc.returncode == (0 if f["ok"] else 1)
    assert proc.returncode == 0, f["problems"]
    assert "soak: OK" in proc.stderr


def import_soak():
    """benchmarks/soak.py as a module, for the tests that call its main() in this process."""
    sys.path.insert(0, os.path.dirname(SOAK))
    try:
        import soak
    finally:
        sys.path.remove(os.path.dirname(SOAK))
    return soak


def test_soak_rejects_bad_arguments(capsys):
    """In this process: a usage error is argparse's SystemExit(2), which the script's
    `sys.exit(main())` passes on as its exit status (the fixtures above run it as a process)."""
    soak = import_soak()
    for argv, words in ((["--plan-calls", "-5"], "--plan-calls must be >= 0"),
                        (["--one-shot-calls", "many"], "invalid int value")):
        with pytest.raises(SystemExit) as exit_:
            soak.main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and words in err, err


def test_soak_fails_when_handles_leak_or_rss_grows(tmp_path, monkeypatch):
    """The script's own judgement: a live count that is not back at the end, or RSS beyond
    the bound, makes it exit 1 (run in-process on a tiny soak, with its probes faked)."""
    soak = import_soak()
    real_live = soak.live
    calls = {"n": 0}

    def leaky_live():
        counts = dict(real_live())
        calls["n"] += 1
        counts["tensor"] += calls["n"] // 3   # a handle appears now and then
        return counts

    monkeypatch.setattr(soak, "live", leaky_live)
    assert soak.main(["--plan-calls", "20", "--one-shot-calls", "10", "--progress-steps", "2"]) == 1
    monkeypatch.setattr(soak, "live", real_live)

    real_rss = soak.rss_bytes
    grown = {"n": 0}

    def growing_rss():
        grown["n"] += 1
        return real_rss() + grown["n"] * 4 * MIB

    monkeypatch.setattr(soak, "rss_bytes", growing_rss)
    assert soak.main(["--plan-calls", "20", "--one-shot-calls", "10", "--progress-steps", "2",
                      "--rss-bound-mib", "16"]) == 1
    monkeypatch.setattr(soak, "rss_bytes", real_rss)
    assert soak.main(["--plan-calls", "20", "--one-shot-calls", "10", "--progress-steps", "2"]) == 0
