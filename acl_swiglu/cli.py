"""acl-swiglu-sample: the operator documentation's example, done correctly, then checked against
the NumPy reference. Options change the shapes, data, options, backend and ABI; --repeat times the
phases; --json prints everything as one JSON object (failures included). ``--op forward`` runs the
forward operator, aclnnSwigluGroupQuant, on the example's x, weight and groups instead, and judges
its codes and scales against the reference's.

Exit status (docs/cli.md):
  0    the check passed (or was skipped with --no-check)
  1    the check failed
  2    bad options or settings (a usage error)
  3    the libraries could not be found or loaded, or an ACL call failed
  4    an internal error (a bug: please report it with the traceback printed)
  5    not enough memory for the problem asked for: host memory, or device memory
  130  interrupted (Ctrl-C)
  141  the reader of the output went away (e.g. `| head`)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import resource
import statistics
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple, Union

import numpy as np

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_ACL, EXIT_INTERNAL, EXIT_MEMORY = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130   # Ctrl-C, as a shell reports SIGINT
EXIT_BROKEN_PIPE = 141   # the reader went away (e.g. `| head`), as a shell reports SIGPIPE
EXIT_STATUSES = {
    EXIT_OK: "the check passed (or was skipped with --no-check)",
    EXIT_CHECK_FAILED: "the check failed",
    EXIT_USAGE: "bad options or settings",
    EXIT_ACL: "the libraries could not be found or loaded, or an ACL call failed",
    EXIT_INTERNAL: "an internal error (a bug: please report it)",
    EXIT_MEMORY: "not enough host or device memory for the problem asked for",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
    EXIT_BROKEN_PIPE: "the reader of the output went away",
}
# ACL status codes that mean the device ran out of memory: a resource limit, exit 5.
DEVICE_MEMORY_CODES = {200000: "ACL_ERROR_BAD_ALLOC", 207001: "ACL_ERROR_RT_MEMORY_ALLOCATION",
                       207018: "ACL_ERROR_RT_DEVICE_OOM"}
INT64_MAX = 2**63 - 1
SHOWN = 10
OPERATORS = ("backward", "forward")
DST_TYPE_NAMES = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "float4_e1m2")
FORWARD_ONLY = ("--dst-type", "--quant-mode", "--round-scale")


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number no smaller than `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _clamp(text: str) -> Optional[float]:
    from ._validate import check_clamp_limit
    from .errors import ArgumentError

    if text.lower() in ("none", "off"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (or 'none')") from None
    try:
        return check_clamp_limit(value)   # the API's rules: finite, > 0, a non-zero float32
    except ArgumentError:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0 within float32 range (not rounding "
                                         f"to 0), or 'none' for off; got {text}") from None


NO_GROUPS = "none"


def _groups(text: str) -> Union[str, List[int]]:
    if text.lower() in ("none", "off"):
        return NO_GROUPS
    if text.strip() == "":
        return []
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints (or 'none')") from None
    if any(not -INT64_MAX - 1 <= c <= INT64_MAX for c in counts):
        raise argparse.ArgumentTypeError(f"{text!r} has a count outside int64")
    return counts


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are also printed as JSON when --json was asked for."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        if self.json_errors:
            print(_error_report({}, EXIT_USAGE, {"kind": "usage", "message": message}))
        self.exit(EXIT_USAGE)


def _asks_for_json(argv: List[str]) -> bool:
    """Whether the command line has --json before any '--' (abbreviations are not accepted)."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    return "--json" in words


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


class _Formatter(argparse.HelpFormatter):
    """argparse's help layout, except for the exit statuses after the options: a table, kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("exit status:"):
            return text
        return super()._fill_text(text, width, indent)


def build_parser() -> _Parser:
    parser = _Parser(
        prog="acl-swiglu-sample",
        # An abbreviation would be taken for its option on success but not seen by the JSON
        # error reporting of a usage error: options are spelt in full.
        allow_abbrev=False,
        formatter_class=_Formatter,
        description="Run aclnnSwigluGroupQuantGrad like the CANN documentation's example "
                    "(gradY [512,512], x [512,1024], weight [512,1], groupIndex {256,256}, clamp 1.0, fp16) "
                    "and check the result against the NumPy reference.",
        epilog="exit status:\n" + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_STATUSES.items()))
    parser.add_argument("--op", choices=OPERATORS, default="backward",
                        help="the operator: backward (aclnnSwigluGroupQuantGrad, the default) or forward "
                             "(aclnnSwigluGroupQuant: SwiGLU then FP8/FP4 quantisation)")
    parser.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp16",
                        help="dtype of gradY, x, yOrigin and gradX (default fp16; the forward takes fp16 or bf16)")
    parser.add_argument("--tokens", type=_non_negative_int, default=512, help="tokens T, or S with --batch (default 512)")
    parser.add_argument("--hidden", type=_non_negative_int, default=512, help="hidden size H; x has 2H columns (default 512)")
    parser.add_argument("--batch", type=_positive_int, default=None, help="make inputs 3-D [B, tokens, H]")
    parser.add_argument("--clamp", type=_clamp, default=1.0, metavar="LIMIT",
                        help="clamp limit > 0, or 'none' for no clamp (default 1.0)")
    parser.add_argument("--no-weight", action="store_true", help="no weight/yOrigin, so no gradWeight")
    parser.add_argument("--dst-type", choices=DST_TYPE_NAMES, default=None,
                        help="forward only: the codes' type (default float8_e4m3fn)")
    parser.add_argument("--quant-mode", type=int, choices=(0, 1), default=None,
                        help="forward only: 0, a float32 scale per 128 elements (default); 1 (MX), an E8M0 "
                             "scale per 32 (the FP4 types need it)")
    parser.add_argument("--round-scale", action="store_true",
                        help="forward only, quant mode 0: scales rounded to powers of two (mode 1 always is)")
    parser.add_argument("--group-index", type=_groups, default=None, metavar="N,N,...",
                        help="per-group token counts, or 'none' (default: two halves of all rows, "
                             "256,256 for 512 rows)")
    parser.add_argument("--random", action="store_true", help="normal random data instead of the example's patterns")
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="random seed for --random (default 0)")
    parser.add_argument("--abi", choices=("1", "2"), default=None,
                        help="operator ABI revision, overriding what the install declares (with a warning when "
                             "they differ). Default: the revision the install's operator header declares (2 "
                             "without one); ACL_SWIGLU_ABI, when set, overrides that the same way")
    parser.add_argument("--backend", choices=("auto", "cann", "emulator"), default=None,
                        help="library backend: auto (a CANN when one is found, else the emulator, saying so), "
                             "cann or emulator (default: ACL_SWIGLU_BACKEND, else auto)")
    parser.add_argument("--device-id", type=_non_negative_int, default=None, help="device to use (default 0)")
    parser.add_argument("--no-check", action="store_true", help="skip the comparison with the reference")
    parser.add_argument("--repeat", type=_positive_int, default=None, metavar="N",
                        help="also time phase 1, phase 2 + synchronize, and a plan call, N times each")
    parser.add_argument("--progress-after", type=_seconds, default=1.0, metavar="SECONDS",
                        help="with --repeat on a terminal, show a progress bar once a phase has run this long "
                             "(default 1; 0 shows it from the first call)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


def make_inputs(args: argparse.Namespace, rng: Optional[np.random.Generator] = None) -> Dict[str, Any]:
    """The example's inputs (or random ones) as NumPy arrays, converted properly to the dtype."""
    from ._dtypes import parse_dtype

    dtype = parse_dtype(args.dtype)
    lead = (args.batch, args.tokens) if args.batch else (args.tokens,)
    rows = int(np.prod(lead))
    hidden = args.hidden
    if args.random:
        rng = rng or np.random.default_rng(args.seed)
        grad_y = rng.standard_normal(lead + (hidden,))
        x = rng.standard_normal(lead + (2 * hidden,))
        weight = rng.random(lead + (1,)) + 0.5
        y_origin = rng.standard_normal(lead + (hidden,))
    else:
        def pattern(shape: Tuple[int, ...], fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
            i = np.arange(int(np.prod(shape)), dtype=np.float64)
            return fn(i).reshape(shape)

        grad_y = pattern(lead + (hidden,), lambda i: (i % 10) * 0.1)
        x = pattern(lead + (2 * hidden,), lambda i: ((i % 20) - 10) * 0.5)
        weight = pattern(lead + (1,), lambda i: ((i % 5) + 1) * 0.2)
        y_origin = pattern(lead + (hidden,), lambda i: ((i % 8) + 1) * 0.3)
    inputs = {
        "grad_y": grad_y.astype(dtype),
        "x": x.astype(dtype),
        "weight": None if args.no_weight else weight.astype(np.float32),
        "y_origin": None if args.no_weight else y_origin.astype(dtype),
    }
    groups = args.group_index
    if groups is None:   # the default: two halves of all rows, like the example's {256, 256}
        groups = [rows // 2, rows - rows // 2]
    elif groups == NO_GROUPS:
        groups = None
    inputs["group_index"] = None if groups is None else np.asarray(groups, dtype=np.int64)
    inputs["clamp_limit"] = args.clamp
    return inputs


class _Progress:
    """A one-line progress bar on stderr, shown once a run has taken `after` seconds."""

    def __init__(self, label: str, total: int, enabled: bool, after: float = 1.0):
        self.label, self.total, self.enabled, self.after = label, total, enabled, after
        self.start = time.perf_counter()
        self.shown = False

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        if elapsed < self.after or (done % max(1, self.total // 100) and done != self.total):
            return
        self.shown = True
        width = 30
        filled = int(width * done / self.total)
        eta = elapsed / done * (self.total - done) if done else 0.0
        sys.stderr.write(f"\r{self.label:<22} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} "
                         f"eta {eta:5.1f}s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _summary(samples: List[float]) -> Dict[str, float]:
    us = [s * 1e6 for s in samples]
    return {"n": len(us), "min_us": min(us), "median_us": statistics.median(us), "max_us": max(us)}


def _time_calls(phase_1: Callable[[], Any], plan: Callable[[], Any], stream: Any, repeat: int, progress: bool,
                after: float) -> Dict[str, Any]:
    """`repeat` runs each of phase 1 (`phase_1` makes an executor), phase 2 + synchronize of a
    fresh executor, and a plan call + synchronize on `stream`; their summaries by step."""
    def phase1_run() -> float:
        t0 = time.perf_counter()
        executor = phase_1()
        elapsed = time.perf_counter() - t0
        executor.close()
        return elapsed

    def phase2_run() -> float:
        executor = phase_1()
        t0 = time.perf_counter()
        executor.launch(stream)
        stream.synchronize()
        return time.perf_counter() - t0

    def plan_run() -> float:
        t0 = time.perf_counter()
        plan()
        stream.synchronize()
        return time.perf_counter() - t0

    timing: Dict[str, Any] = {}
    for key, label, run in (("phase1", "phase 1", phase1_run), ("phase2_sync", "phase 2 + synchronize", phase2_run),
                            ("plan_sync", "plan + synchronize", plan_run)):
        samples: List[float] = []
        bar = _Progress(label, repeat, progress, after)
        for i in range(repeat):
            samples.append(run())
            bar.update(i + 1)
        bar.close()
        timing[key] = _summary(samples)
    return timing


def time_phases(inputs: Dict[str, Any], repeat: int, progress: bool, after: float = 1.0) -> Dict[str, Any]:
    """Times phase 1, phase 2 + synchronize, and a plan call + synchronize on device copies."""
    import acl_swiglu as acl

    names = ("grad_y", "x", "weight", "y_origin", "group_index")
    abi = acl.abi_revision()
    device: Dict[str, Any] = {}
    results: Dict[str, Any] = {}
    stream = acl.Stream()
    try:
        for name in names:
            value = inputs[name]
            if value is None:
                device[name] = None
            elif name == "group_index" and abi == 1:
                device[name] = value
            else:
                device[name] = acl.to_device(value)
        grad_x = acl.DeviceArray.empty(inputs["x"].shape, inputs["x"].dtype)
        grad_weight = (acl.DeviceArray.empty(inputs["weight"].shape, np.float32)
                       if inputs["weight"] is not None else None)
        args = [device[n] for n in names] + [inputs["clamp_limit"]]

        with acl.SwigluGroupQuantGradPlan(*args, grad_x=grad_x, grad_weight=grad_weight, stream=stream) as plan:
            results = _time_calls(lambda: acl.get_workspace_size(*args, grad_x=grad_x, grad_weight=grad_weight),
                                  plan, stream, repeat, progress, after)
    finally:
        stream.close()
        for name in names:
            if isinstance(device.get(name), acl.DeviceArray):
                device[name].close()
        if "grad_x" in locals():
            grad_x.close()
        made_weight = locals().get("grad_weight")
        if made_weight is not None:
            made_weight.close()
    return results


def _first(values: Optional[np.ndarray]) -> List[float]:
    if values is None:
        return []
    return [float(v) for v in values.reshape(-1)[:SHOWN].astype(np.float64)]


def _version_text(info: Any) -> str:
    """What runs the operator, by release: the emulator's version, or the CANN one and its source."""
    if info.backend == "emulator":
        return info.emulator_version or "emulator"
    if info.cann_version:
        return f"CANN {info.cann_version}, from {info.cann_version_file}"
    return "CANN version unknown: the install records none this package can read"


# Bytes per gradY element (T x H) that building the inputs holds at its peak: the float64 patterns
# of gradY, x (2H) and yOrigin plus x's index array (8 * (1 + 2 + 1 + 2)), and the converted copies.
_PEAK_BYTES_PER_ELEMENT = 48


def _memory_limit() -> Tuple[int, str]:
    """The host memory this process can use at most, and what sets it."""
    limit, what = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "the host's physical memory"
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            with open("/proc/self/statm") as handle:
                used = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            used = 0
        if soft - used < limit:
            limit, what = max(0, soft - used), "this process's address-space limit (ulimit -v)"
    return limit, what


def _check_host_memory(args: argparse.Namespace) -> None:
    """Refuses, before allocating, a problem larger than the host can hold (a resource error)."""
    from .errors import HostMemoryError

    rows = args.tokens * (args.batch or 1)
    itemsize = 4 if args.dtype == "fp32" else 2
    needed = rows * args.hidden * (_PEAK_BYTES_PER_ELEMENT + 4 * itemsize)
    limit, what = _memory_limit()
    if needed > limit:
        shape = f"--tokens {args.tokens} --hidden {args.hidden}" + (f" --batch {args.batch}" if args.batch else "")
        raise HostMemoryError(
            f"{shape} ({rows} x {args.hidden} elements of gradY, x twice that) needs about {needed / 2**30:.3g} GiB "
            f"of host memory to build and check its inputs, more than {what} ({limit / 2**30:.3g} GiB); "
            "choose smaller sizes")


def run(args: argparse.Namespace, report: Dict[str, Any]) -> int:
    """The sample; fills `report` as it goes (main prints it, with an error if one occurs)."""
    import acl_swiglu as acl
    from acl_swiglu import _loader, reference
    from acl_swiglu.errors import ConfigurationError

    loaded = _loader.loaded()
    if args.backend and args.backend != "auto" and loaded is not None and loaded.info.backend != args.backend:
        raise ConfigurationError(f"this process already loaded the {loaded.info.backend} libraries; "
                                 f"--backend {args.backend} needs a new process")
    _check_operator_options(args)
    out: Optional[List[str]] = [] if args.json else None

    def say(line: str = "") -> None:
        if out is None:
            print(line, flush=True)

    info = acl.backend_info()
    report["backend"] = info.as_dict()
    say(f"backend: {'CPU emulator' if info.backend == 'emulator' else 'CANN'} (ABI revision {info.abi}), "
        f"root {info.root or '(system loader)'}")
    say(f"  operator library: {info.operator} ({_version_text(info)})")
    if args.device_id is not None:
        acl.set_device(args.device_id)
    report["op"] = args.op

    _check_host_memory(args)
    if args.op == "forward":
        return run_forward(args, report, say)
    inputs = make_inputs(args)
    shapes = {k: list(v.shape) for k, v in inputs.items() if isinstance(v, np.ndarray)}
    report["inputs"] = {"dtype": args.dtype, "shapes": shapes, "clamp_limit": inputs["clamp_limit"],
                        "group_index": None if inputs["group_index"] is None else inputs["group_index"].tolist(),
                        "data": "random (seed %d)" % args.seed if args.random else "documented patterns"}
    say(f"gradY {shapes['grad_y']} x {shapes['x']} {args.dtype}, "
        f"weight {shapes.get('weight', 'none')}, groupIndex {report['inputs']['group_index']}, "
        f"clamp {inputs['clamp_limit']}")

    call_args = {k: inputs[k] for k in ("grad_y", "x", "weight", "y_origin", "group_index", "clamp_limit")}
    grad_x, grad_weight = acl.swiglu_group_quant_grad(**call_args)
    report["grad_x_first"] = _first(grad_x)
    report["grad_weight_first"] = _first(grad_weight)
    say("gradX output (first 10 elements):")
    for i, value in enumerate(report["grad_x_first"]):
        say(f"gradX[{i}] = {value:f}")
    if grad_weight is not None:
        say("gradWeight output (first 10 elements):")
        for i, value in enumerate(report["grad_weight_first"]):
            say(f"gradWeight[{i}] = {value:f}")

    status = EXIT_OK
    if not args.no_check:
        golden_x, golden_w = reference.swiglu_group_quant_grad(**call_args)
        departures = reference.device_departures(inputs["x"], inputs["clamp_limit"], inputs["group_index"],
                                                 grad_y=inputs["grad_y"], weight=inputs["weight"])
        check_x = reference.compare(grad_x, golden_x, departures=departures)
        report["check"] = {"grad_x": check_x.to_dict()}
        say(f"check gradX against acl_swiglu.reference: {check_x}")
        passed = check_x.passed
        if grad_weight is not None and golden_w is not None:   # (both, or neither: weight was given)
            check_w = reference.compare(grad_weight, golden_w)
            report["check"]["grad_weight"] = check_w.to_dict()
            say(f"check gradWeight against acl_swiglu.reference: {check_w}")
            passed = passed and check_w.passed
        report["check"]["passed"] = passed
        say(f"verdict: {'PASS' if passed else 'FAIL'}")
        status = EXIT_OK if passed else EXIT_CHECK_FAILED

    if args.repeat:
        _report_timing(time_phases(inputs, args.repeat, progress=not args.json and sys.stderr.isatty(),
                                   after=args.progress_after), args.repeat, report, say)
    return _finish(report, status, args)


# ---- --op forward: aclnnSwigluGroupQuant ----


def _check_operator_options(args: argparse.Namespace) -> None:
    """Options of one operator given for the other are usage errors, not silently ignored."""
    from .errors import ArgumentError

    if args.op == "forward":
        if args.abi:
            raise ArgumentError("--abi chooses the backward's ABI revision; the forward has one ABI (drop --abi)")
        if args.dtype == "fp32":
            raise ArgumentError("--dtype fp32: the forward's quant modes 0 and 1 take fp16 or bf16 x")
        return
    given = [name for name, value in (("--dst-type", args.dst_type), ("--quant-mode", args.quant_mode),
                                      ("--round-scale", args.round_scale or None)) if value is not None]
    if given:
        raise ArgumentError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to the forward "
                            "only: add --op forward")


def forward_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The forward's options from the command line (defaults: float8_e4m3fn, quant mode 0)."""
    dst_type = args.dst_type or "float8_e4m3fn"
    quant_mode = 0 if args.quant_mode is None else args.quant_mode
    if args.quant_mode is None and dst_type.startswith("float4"):
        quant_mode = 1   # (the FP4 types come from MX quantisation only)
    return {"dst_type": dst_type, "quant_mode": quant_mode, "round_scale": quant_mode == 1 or args.round_scale,
            "clamp_limit": args.clamp}


def make_forward_inputs(args: argparse.Namespace) -> Dict[str, Any]:
    """x, weight and group_index as the backward's sample makes them (same patterns, same seeds)."""
    inputs = make_inputs(args)
    return {"x": inputs["x"], "weight": inputs["weight"], "group_index": inputs["group_index"]}


def _value_list(values: np.ndarray) -> List[float]:
    return [float(v) for v in values.reshape(-1)[:SHOWN]]


def _code_values(y: np.ndarray, dst_type: str) -> np.ndarray:
    """float32 values of the codes (FP4 unpacked), without their scales."""
    from . import formats

    if formats.DST_TYPES[dst_type].packed:
        return formats.unpack_fp4(y, dst_type)
    return y.astype(np.float32)


def _scale_values(y_scale: np.ndarray, quant_mode: int) -> np.ndarray:
    from . import formats

    return formats.e8m0_scales(y_scale) if quant_mode == 1 else y_scale


def run_forward(args: argparse.Namespace, report: Dict[str, Any], say: Callable[[str], None]) -> int:
    """The forward's sample: its codes and scales, judged against the reference."""
    import acl_swiglu as acl
    from acl_swiglu import reference

    options = forward_options(args)
    inputs = make_forward_inputs(args)
    shapes = {k: list(v.shape) for k, v in inputs.items() if isinstance(v, np.ndarray)}
    groups = None if inputs["group_index"] is None else inputs["group_index"].tolist()
    report["inputs"] = {"dtype": args.dtype, "shapes": shapes, "clamp_limit": options["clamp_limit"],
                        "group_index": groups, "dst_type": options["dst_type"], "quant_mode": options["quant_mode"],
                        "round_scale": options["round_scale"],
                        "data": "random (seed %d)" % args.seed if args.random else "documented patterns"}
    say(f"x {shapes['x']} {args.dtype}, weight {shapes.get('weight', 'none')}, groupIndex {groups}, "
        f"clamp {options['clamp_limit']}; {options['dst_type']}, quant mode {options['quant_mode']}"
        f"{', round scale' if options['round_scale'] else ''}")
    y, y_scale = acl.swiglu_group_quant(inputs["x"], inputs["weight"], inputs["group_index"], **options)[:2]
    report["y_first"] = _value_list(_code_values(y, options["dst_type"]))
    report["y_scale_first"] = _value_list(_scale_values(y_scale, options["quant_mode"]))
    say(f"y output (first {SHOWN} codes' values, before their scales):")
    for i, value in enumerate(report["y_first"]):
        say(f"y[{i}] = {value:g}")
    say(f"yScale output (first {SHOWN}):")
    for i, value in enumerate(report["y_scale_first"]):
        say(f"yScale[{i}] = {value:g}")

    status = EXIT_OK
    if not args.no_check:
        verdict = reference.compare_quantised(y, y_scale, inputs["x"], inputs["weight"], inputs["group_index"],
                                              **options)
        report["check"] = {"y": verdict.to_dict(), "passed": verdict.passed}
        say(f"check y and yScale against acl_swiglu.reference: {verdict}")
        say(f"verdict: {'PASS' if verdict.passed else 'FAIL'}")
        status = EXIT_OK if verdict.passed else EXIT_CHECK_FAILED

    if args.repeat:
        _report_timing(time_forward(inputs, options, args.repeat, progress=not args.json and sys.stderr.isatty(),
                                    after=args.progress_after), args.repeat, report, say)
    return _finish(report, status, args)


def _report_timing(timing: Dict[str, Any], repeat: int, report: Dict[str, Any], say: Callable[[str], None]) -> None:
    report["timing"] = timing
    say(f"timing over {repeat} runs (microseconds, min / median):")
    for key, label in (("phase1", "phase 1"), ("phase2_sync", "phase 2 + synchronize"),
                       ("plan_sync", "plan call + synchronize")):
        say(f"  {label:<24} {timing[key]['min_us']:10.1f} / {timing[key]['median_us']:10.1f}")


def _finish(report: Dict[str, Any], status: int, args: argparse.Namespace) -> int:
    """The report's verdict fields, printed as JSON with --json; the exit status."""
    report["ok"] = status == EXIT_OK
    report["exit_status"] = status
    if args.json:
        print(json.dumps(report, indent=2, default=float))
    return status


def time_forward(inputs: Dict[str, Any], options: Dict[str, Any], repeat: int, progress: bool,
                 after: float = 1.0) -> Dict[str, Any]:
    """The forward's phase 1, phase 2 + synchronize, and a plan call + synchronize, on device copies."""
    import acl_swiglu as acl
    from acl_swiglu import forward

    made: List[Any] = []
    stream = acl.Stream()
    try:
        device: Dict[str, Any] = {}
        for name in ("x", "weight", "group_index"):
            value = inputs[name]
            device[name] = None if value is None else acl.to_device(value)
            if device[name] is not None:
                made.append(device[name])
        with forward.SwigluGroupQuantPlan(device["x"], device["weight"], device["group_index"], stream=stream,
                                          **options) as plan:
            outputs: Dict[str, Any] = {"y": plan.y, "y_scale": plan.y_scale,
                                       "y_origin": acl.DeviceArray.empty((0,), inputs["x"].dtype)}
            made.append(outputs["y_origin"])

            def phase_1() -> Any:
                return forward.get_workspace_size(device["x"], device["weight"], device["group_index"], **options,
                                                  **outputs)

            timing = _time_calls(phase_1, plan, stream, repeat, progress, after)
    finally:
        stream.close()
        for array in made:
            array.close()
    return timing


def versions() -> Dict[str, Optional[str]]:
    """The versions a bug report needs: this package, Python, NumPy, ml_dtypes and torch (None
    when not installed; read from the install's metadata, so torch is not imported), and the platform."""
    from . import __version__

    def installed(name: str) -> Optional[str]:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {"acl_swiglu": __version__, "python": platform.python_version(), "numpy": np.__version__,
            "ml_dtypes": installed("ml_dtypes"), "torch": installed("torch"), "platform": platform.platform()}


def _error_report(report: Dict[str, Any], status: int, error: Dict[str, Any]) -> str:
    """What --json prints on a failure: what was known before it, and the error."""
    partial = {key: report[key] for key in ("backend", "inputs", "warnings") if key in report}
    return json.dumps({"ok": False, "exit_status": status, "versions": versions(), **partial, "error": error},
                      indent=2, default=float)


def as_the_user_set_it(text: str, args: argparse.Namespace) -> str:
    """A message about ACL_SWIGLU_BACKEND or ACL_SWIGLU_ABI, for a run where the user gave
    --backend or --abi instead (the CLI passes them on through those variables): it names the
    option the user gave."""
    if args.backend:
        text = re.sub(r"\b([Ss])et ACL_SWIGLU_BACKEND=['\"]?(\w+)['\"]?",
                      lambda m: ("U" if m.group(1) == "S" else "u") + f"se --backend {m.group(2)}", text)
        text = re.sub(r"ACL_SWIGLU_BACKEND=['\"]?(\w+)['\"]?", r"--backend \1", text)
    if args.abi:
        text = re.sub(r"\b([Uu])nset ACL_SWIGLU_ABI\b",
                      lambda m: ("D" if m.group(1) == "U" else "d") + "rop --abi", text)
        text = re.sub(r"ACL_SWIGLU_ABI=['\"]?(\d+)['\"]?", r"--abi \1", text)
    return text


def _memory_problem(args: argparse.Namespace) -> str:
    return (f"--tokens {args.tokens} --hidden {args.hidden}" + (f" --batch {args.batch}" if args.batch else ""))


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser.json_errors = _asks_for_json(argv)
    args = parser.parse_args(argv)
    from .errors import AclError, AclSwigluError, ArgumentError, ConfigurationError, HostMemoryError

    report: Dict[str, Any] = {"ok": False, "versions": versions(), "warnings": []}
    saved = {name: os.environ.get(name) for name in ("ACL_SWIGLU_BACKEND", "ACL_SWIGLU_ABI")}

    def said(text: object) -> str:
        return as_the_user_set_it(str(text), args)

    def note(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        # A warning (e.g. "no CANN found, running on the emulator") is one plain line on
        # stderr, in the JSON report too, whichever line of the package gave it.
        text = said(message)
        if text not in report["warnings"]:
            report["warnings"].append(text)
            print(f"note: {text}", file=sys.stderr, flush=True)

    def fail(status: int, text: str, error: Dict[str, Any]) -> int:
        print(f"{parser.prog}: {text}", file=sys.stderr, flush=True)
        if args.json:
            print(_error_report(report, status, error))
        return status

    with warnings.catch_warnings():
        warnings.showwarning = note
        try:
            if args.backend:
                os.environ["ACL_SWIGLU_BACKEND"] = args.backend
            if args.abi:
                os.environ["ACL_SWIGLU_ABI"] = args.abi
            return run(args, report)
        except (ArgumentError, ConfigurationError) as exc:
            parser.print_usage(sys.stderr)
            kind = "configuration" if isinstance(exc, ConfigurationError) else "argument"
            return fail(EXIT_USAGE, f"error: {said(exc)}", {"kind": kind, "message": said(exc)})
        except AclError as exc:
            status = EXIT_MEMORY if exc.code in DEVICE_MEMORY_CODES else EXIT_ACL
            what = "device memory" if status == EXIT_MEMORY else "ACL error"
            text = f"{what}: {exc.api} failed with {exc.name} ({exc.code})"
            if exc.message:
                text += f"\n  {said(exc.message)}"
            if status == EXIT_MEMORY:
                text += f"\n  not enough device memory for this problem ({_memory_problem(args)}): choose smaller sizes"
            return fail(status, text, {"kind": "acl", "api": exc.api, "code": exc.code, "name": exc.name,
                                       "message": said(exc.message)})
        except HostMemoryError as exc:   # refused up front: more than the host can hold
            return fail(EXIT_MEMORY, said(exc), {"kind": "HostMemoryError", "message": said(exc)})
        except AclSwigluError as exc:   # the libraries could not be found or loaded, and the like
            return fail(EXIT_ACL, said(exc), {"kind": type(exc).__name__, "message": said(exc)})
        except MemoryError as exc:   # an allocation failed: a resource limit, not a bug
            message = (f"not enough host memory for this problem ({_memory_problem(args)}): "
                       f"{exc or 'allocation failed'}; choose smaller sizes")
            return fail(EXIT_MEMORY, message, {"kind": "HostMemoryError", "message": message})
        except KeyboardInterrupt:
            return fail(EXIT_INTERRUPTED, "interrupted", {"kind": "interrupted", "message": "interrupted (Ctrl-C)"})
        except BrokenPipeError:
            # Whoever read our output stopped (`| head`): say nothing more, not even at exit.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except Exception as exc:   # a bug: say so plainly, with the traceback to report
            import traceback

            traceback.print_exc(file=sys.stderr)
            print(f"{parser.prog}: internal error ({type(exc).__name__}: {exc}); please report it with the "
                  "traceback above and the output of `python -m acl_swiglu --json`", file=sys.stderr)
            return EXIT_INTERNAL
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
