#!/usr/bin/env python3
"""Soak test: many plan calls and one-shot calls on a small shape, watching for leaks.

Runs --plan-calls calls of a reusable plan (every call rebinds all addresses, alternating
between two input sets, then synchronises) and --one-shot-calls one-shot calls, on T=8, H=64,
bf16 with weight, clamp and group_index. It prints the emulator's live handle counts and the
process RSS at the start, after warm-up, about every 10% of each phase, and at the end, and
checks results along the way (the first result of each input set against the float64 reference
with the docs/operator.md (judging a result) verdict; every later one bit for bit against the first).

Exit status: 0 when the live counts at the end (after release_cached) equal those at the start,
no live count grew inside a phase, RSS grew by at most --rss-bound-mib after warm-up and every
result was right (and, with --trace-python-heap, the Python heap grew by at most
--heap-bound-per-call bytes per call in each phase: a slow leak of Python objects, far below
the RSS bound in a short run, shows there); 1 otherwise. With --json, progress goes to stderr
and one JSON document with every figure to stdout.

Needs the CPU emulator (live counts); ACL_SWIGLU_BACKEND defaults to "emulator" here.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
import tracemalloc
from contextlib import ExitStack

os.environ.setdefault("ACL_SWIGLU_BACKEND", "emulator")

import numpy as np  # noqa: E402

import acl_swiglu  # noqa: E402
from acl_swiglu import emulator, reference  # noqa: E402

MIB = 1 << 20
LEAD, H = (8,), 64
CLAMP = 3.0
GROUPS = (5, 2)   # trunc = 7 of T = 8


def rss_bytes() -> int:
    """Resident set size now (from /proc/self/statm; peak RSS from getrusage elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB (a peak)


def live() -> dict:
    gc.collect()
    return emulator.live_counts()


def make_inputs(seed: int):
    rng = np.random.default_rng(seed)
    dtype = acl_swiglu.bfloat16
    x = rng.uniform(-5, 5, LEAD + (2 * H,)).astype(np.float32).astype(dtype)
    gy = rng.uniform(-2, 2, LEAD + (H,)).astype(np.float32).astype(dtype)
    w = rng.uniform(0.2, 1.5, LEAD + (1,)).astype(np.float32)
    yo = reference.swiglu(x, CLAMP).astype(np.float32).astype(dtype)
    return gy, x, w, yo, np.array(GROUPS, np.int64)


def judge_first(result, inputs, what: str) -> None:
    """The first result of an input set must pass the docs/operator.md (judging a result) verdict."""
    ref_x, ref_w = reference.swiglu_group_quant_grad(*inputs, CLAMP)
    for got, golden, name in ((result[0], ref_x, "grad_x"), (result[1], ref_w, "grad_weight")):
        verdict = reference.compare(got, golden)
        if not verdict.passed:
            raise SystemExit(f"soak: {what} {name} fails the reference verdict:\n{verdict}")


class Soak:
    def __init__(self, args):
        self.args = args
        self.out = sys.stderr if args.json else sys.stdout
        self.samples = []
        self.mismatches = 0
        self.loop_growth = []
        self.heap = {}

    def heap_begin(self):
        if not self.args.trace_python_heap:
            return None
        gc.collect()
        return tracemalloc.take_snapshot()

    def heap_end(self, phase: str, before, middle, calls: int) -> None:
        """Python heap growth over a phase (tracemalloc): in all, and per call over the second
        half (the steady state: one-time caches fill in the first half), with the top sites.
        Allocations of this script and of the emulator helpers it samples with are left out."""
        if before is None:
            return
        gc.collect()
        after = tracemalloc.take_snapshot()
        skip = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__),
                tracemalloc.Filter(False, emulator.__file__)]

        def diff(old):
            return after.filter_traces(skip).compare_to(old.filter_traces(skip), "lineno")

        total = sum(stat.size_diff for stat in diff(before))
        stats = diff(middle)
        growth = sum(stat.size_diff for stat in stats)
        half = calls - calls // 2
        top = [{"site": f"{stat.traceback[0].filename}:{stat.traceback[0].lineno}", "bytes": stat.size_diff,
                "count": stat.count_diff} for stat in sorted(stats, key=lambda st: -st.size_diff)[:5]
               if stat.size_diff > 0]
        self.heap[phase] = {"bytes": total, "calls": calls, "second_half_bytes": growth, "second_half_calls": half,
                            "bytes_per_call": round(growth / max(half, 1), 2), "top": top}
        self.say(f"[{phase:9s}] python heap {total:+d} bytes over {calls} calls; second half {growth:+d} bytes "
                 f"({growth / max(half, 1):+.1f} per call); top: "
                 + ", ".join(f"{t['site']} {t['bytes']:+d} B / {t['count']:+d}" for t in top[:3]))

    def heap_middle(self, i: int, calls: int, before, middle):
        if before is not None and middle is None and i == calls // 2:
            gc.collect()
            return tracemalloc.take_snapshot()
        return middle

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def sample(self, phase: str, done: int, total: int) -> dict:
        entry = {"phase": phase, "calls": done, "of": total, "live": live(), "rss": rss_bytes(),
                 "t": round(time.perf_counter() - self.t0, 3)}
        self.samples.append(entry)
        counts = entry["live"]
        self.say(f"[{phase:9s}] {done:>7}/{total:<7} rss {entry['rss'] / MIB:8.2f} MiB  live tensor {counts['tensor']} "
                 f"int_array {counts['int_array']} executor {counts['executor']} stream {counts['stream']} "
                 f"allocation {counts['allocation']} bytes {counts['bytes']}  t={entry['t']:.1f}s")
        return entry

    def checkpoints(self, total: int):
        steps = max(1, self.args.progress_steps)
        return sorted({max(1, round(total * k / steps)) for k in range(1, steps + 1)}) if total else []

    def check_same(self, phase: str, i: int, k: int, result, first) -> None:
        """Counts call i's result if its bits differ from the first result of input set k."""
        gx, gw = result
        if not (np.array_equal(gx.view(np.uint16), first[k][0]) and np.array_equal(gw.view(np.uint32), first[k][1])):
            self.mismatches += 1
            self.say(f"[{phase}] call {i}: result differs from the first result of input set {k}")

    def at_checkpoint(self, phase: str, i: int, calls: int, marks: list, base: dict) -> None:
        """At the next checkpoint, samples memory and records live handles that grew since `base`."""
        if marks and i == marks[0]:
            marks.pop(0)
            entry = self.sample(phase, i, calls)
            if entry["live"] != base["live"]:
                self.loop_growth.append((phase, i, base["live"], entry["live"]))

    # -- phases --

    def plan_phase(self, calls: int, warmup: bool) -> None:
        phase = "plan-warm" if warmup else "plan"
        abi = acl_swiglu.abi_revision()
        inputs = [make_inputs(1), make_inputs(2)]
        with ExitStack() as stack:
            stream = stack.enter_context(acl_swiglu.Stream())
            sets = []
            for gy, x, w, yo, g in inputs:
                d = [stack.enter_context(acl_swiglu.to_device(a)) for a in (gy, x, w, yo)]
                dg = stack.enter_context(acl_swiglu.to_device(g)) if abi == 2 else list(GROUPS)
                gx = stack.enter_context(acl_swiglu.DeviceArray.empty(x.shape, x.dtype))
                gw = stack.enter_context(acl_swiglu.DeviceArray.empty(w.shape, np.float32))
                sets.append((d, dg, gx, gw))
            d, dg, gx, gw = sets[0]
            plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(*d, dg, CLAMP, grad_x=gx, grad_weight=gw,
                                                                           stream=stream))
            first = []
            for k in range(2):
                d, dg, gx, gw = sets[k]
                plan(*d, group_index=dg, grad_x=gx, grad_weight=gw)
                result = (gx.to_numpy(), gw.to_numpy())
                judge_first(result, inputs[k], f"plan input set {k}")
                first.append((result[0].view(np.uint16).copy(), result[1].view(np.uint32).copy()))
            base = self.sample(phase, 0, calls)
            marks = self.checkpoints(calls)
            check_every = max(1, self.args.check_every)
            heap = None if warmup else self.heap_begin()
            heap_mid = heap if calls // 2 == 0 else None
            host_x = np.empty(inputs[0][1].shape, inputs[0][1].dtype)
            host_w = np.empty(inputs[0][2].shape, np.float32)
            for i in range(1, calls + 1):
                k = i % 2
                d, dg, gx, gw = sets[k]
                plan(*d, group_index=dg, grad_x=gx, grad_weight=gw)
                stream.synchronize()
                heap_mid = self.heap_middle(i, calls, heap, heap_mid)
                if i % check_every == 0 or i == calls:
                    gx.buffer.copy_to_host(host_x)
                    gw.buffer.copy_to_host(host_w)
                    self.check_same(phase, i, k, (host_x, host_w), first)
                self.at_checkpoint(phase, i, calls, marks, base)
            stream.synchronize()
            self.heap_end(phase, heap, heap_mid, calls)

    def one_shot_phase(self, calls: int, warmup: bool) -> None:
        phase = "oneshot-warm" if warmup else "one-shot"
        inputs = [make_inputs(3), make_inputs(4)]
        first = []
        for k in range(2):
            result = acl_swiglu.swiglu_group_quant_grad(*inputs[k], CLAMP)
            judge_first(result, inputs[k], f"one-shot input set {k}")
            first.append((result[0].view(np.uint16).copy(), result[1].view(np.uint32).copy()))
        base = self.sample(phase, 0, calls)
        marks = self.checkpoints(calls)
        heap = None if warmup else self.heap_begin()
        heap_mid = heap if calls // 2 == 0 else None
        for i in range(1, calls + 1):
            k = i % 2
            gx, gw = acl_swiglu.swiglu_group_quant_grad(*inputs[k], CLAMP)
            heap_mid = self.heap_middle(i, calls, heap, heap_mid)
            self.check_same(phase, i, k, (gx, gw), first)
            self.at_checkpoint(phase, i, calls, marks, base)
        self.heap_end(phase, heap, heap_mid, calls)

    # -- the run --

    def run(self) -> int:
        args = self.args
        self.t0 = time.perf_counter()
        info = acl_swiglu.backend_info()
        if info.backend != "emulator":
            raise SystemExit("soak: live counts need the CPU emulator backend (ACL_SWIGLU_BACKEND=emulator)")
        acl_swiglu.release_cached()
        start = self.sample("start", 0, 0)
        warm_plan = args.warmup_plan_calls if args.warmup_plan_calls is not None else min(2000, max(100, args.plan_calls // 50))
        warm_one = (args.warmup_one_shot_calls if args.warmup_one_shot_calls is not None
                    else min(500, max(50, args.one_shot_calls // 50)))
        self.say(f"soak: backend {info.backend}, ABI revision {acl_swiglu.abi_revision()}, shape T={LEAD[0]} H={H} bf16 "
                 f"weight+clamp {CLAMP}+groups {list(GROUPS)}; warm-up {warm_plan} plan + {warm_one} one-shot calls, "
                 f"then {args.plan_calls} plan + {args.one_shot_calls} one-shot calls; RSS bound {args.rss_bound_mib} MiB")
        t = time.perf_counter()
        self.plan_phase(warm_plan, warmup=True)
        self.one_shot_phase(warm_one, warmup=True)
        warm = self.sample("warmed-up", 0, 0)
        if args.trace_python_heap:
            tracemalloc.start(1)
        t_plan = time.perf_counter()
        self.plan_phase(args.plan_calls, warmup=False)
        t_one = time.perf_counter()
        self.one_shot_phase(args.one_shot_calls, warmup=False)
        t_end = time.perf_counter()
        if args.trace_python_heap:
            tracemalloc.stop()
        acl_swiglu.release_cached()
        end = self.sample("end", 0, 0)

        growth = end["rss"] - warm["rss"]
        bound = int(args.rss_bound_mib * MIB)
        problems = []
        if end["live"] != start["live"]:
            problems.append(f"live counts at the end {end['live']} differ from the start {start['live']}")
        for phase, i, before, after in self.loop_growth:
            problems.append(f"live counts grew inside the {phase} loop by call {i}: {before} -> {after}")
        if growth > bound:
            problems.append(f"RSS grew by {growth / MIB:.2f} MiB after warm-up (bound {args.rss_bound_mib} MiB)")
        if self.mismatches:
            problems.append(f"{self.mismatches} results differed from the first result of their input set")
        for phase, heap in self.heap.items():
            if heap["calls"] and heap["bytes_per_call"] > args.heap_bound_per_call:
                where = heap["top"][0]["site"] if heap["top"] else "?"
                problems.append(f"the Python heap grew by {heap['bytes_per_call']} bytes per {phase} call in the "
                                f"second half "
                                f"(bound {args.heap_bound_per_call}; top site {where})")
        summary = {
            "ok": not problems,
            "problems": problems,
            "backend": info.backend,
            "abi": acl_swiglu.abi_revision(),
            "shape": {"T": LEAD[0], "H": H, "dtype": "bfloat16", "weight": True, "clamp_limit": CLAMP,
                      "group_index": list(GROUPS)},
            "plan_calls": args.plan_calls,
            "one_shot_calls": args.one_shot_calls,
            "warmup": {"plan_calls": warm_plan, "one_shot_calls": warm_one},
            "live_start": start["live"],
            "live_end": end["live"],
            "live_grew_in_loop": [list(g) for g in self.loop_growth],
            "rss_start": start["rss"],
            "rss_after_warmup": warm["rss"],
            "rss_end": end["rss"],
            "rss_growth": end["rss"] - start["rss"],
            "rss_growth_after_warmup": growth,
            "rss_bound": bound,
            "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,   # getrusage peak (counted apart from statm)
            "mismatches": self.mismatches,
            "python_heap": self.heap,
            "heap_bound_per_call": args.heap_bound_per_call if args.trace_python_heap else None,
            "seconds": {"warmup": round(t_plan - t, 3), "plan": round(t_one - t_plan, 3),
                        "one_shot": round(t_end - t_one, 3), "total": round(time.perf_counter() - self.t0, 3)},
            "us_per_call": {"plan": round(1e6 * (t_one - t_plan) / max(args.plan_calls, 1), 2),
                            "one_shot": round(1e6 * (t_end - t_one) / max(args.one_shot_calls, 1), 2)},
            "samples": self.samples,
        }
        self.say(f"soak: live start {start['live']} end {end['live']}")
        self.say(f"soak: RSS start {start['rss'] / MIB:.2f} MiB, after warm-up {warm['rss'] / MIB:.2f} MiB, "
                 f"end {end['rss'] / MIB:.2f} MiB, growth after warm-up {growth / MIB:+.3f} MiB "
                 f"(bound {args.rss_bound_mib} MiB), total growth {(end['rss'] - start['rss']) / MIB:+.3f} MiB")
        self.say(f"soak: {summary['us_per_call']['plan']} us per plan call, {summary['us_per_call']['one_shot']} us "
                 f"per one-shot call, {self.mismatches} mismatches")
        self.say("soak: " + ("OK" if not problems else "FAILED: " + "; ".join(problems)))
        if args.json:
            print(json.dumps(summary, indent=1))
        return 0 if not problems else 1


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--plan-calls", type=int, default=100000, help="plan calls to make")
    ap.add_argument("--one-shot-calls", type=int, default=10000, help="one-shot calls to make")
    ap.add_argument("--json", action="store_true", help="print every figure as JSON on stdout (progress to stderr)")
    ap.add_argument("--rss-bound-mib", type=float, default=16.0, help="allowed RSS growth after warm-up, MiB")
    ap.add_argument("--warmup-plan-calls", type=int, default=None,
                    help="plan calls before the RSS baseline (default: 2%% of --plan-calls, 100..2000)")
    ap.add_argument("--warmup-one-shot-calls", type=int, default=None,
                    help="one-shot calls before the RSS baseline (default: 2%% of --one-shot-calls, 50..500)")
    ap.add_argument("--trace-python-heap", action="store_true",
                    help="measure Python heap growth per phase with tracemalloc (slower calls)")
    ap.add_argument("--heap-bound-per-call", type=float, default=64.0,
                    help="with --trace-python-heap: allowed Python heap growth per call over the second half of "
                         "a phase, bytes (ctypes' object caches move a few KiB up and down)")
    ap.add_argument("--check-every", type=int, default=100, help="read back and check every Nth plan call")
    ap.add_argument("--progress-steps", type=int, default=10, help="progress lines per phase")
    args = ap.parse_args(argv)
    for name in ("plan_calls", "one_shot_calls"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    return args


def main(argv=None) -> int:
    return Soak(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
