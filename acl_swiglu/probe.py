"""acl-swiglu-probe: measures what a device does where the operator's public source leaves a
question, so that a record made on a real Ascend 950 can become a test of the emulator
(docs/fidelity.md).

    acl-swiglu-probe [--out PATH] [--families A,B,...] [--unsafe] [--timeout S] [--jobs N]
    acl-swiglu-probe --check PATH [--families A,B,...] [--timeout S] [--jobs N]
    acl-swiglu-probe --list-families

A run builds seeded inputs for each case of each family, runs every case in a child process
with a time limit (through the package's public API only, outputs pre-filled with a sentinel so
that unwritten elements show), runs the same cases on the bundled emulator standing in for the
same release and core count, and writes one JSON record: the environment, a kernel fingerprint,
and per case its recipe, status, output bits (or a digest and samples for large outputs) and the
emulator's result beside it. On a host without a device the backend is the emulator itself.
``--check`` replays a record's cases on the emulator and reports, per family, how many agree
bit for bit with what the record's device did.

Exit status: 0 done (a run wrote its record; --check: every replayed case agrees), 1 --check
found a case that does not agree, 2 bad options, 3 the backend, a worker, the output file or
the record could not be used.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import math
import os
import platform
import select
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

EXIT_OK, EXIT_DIFFERS, EXIT_USAGE, EXIT_ENVIRONMENT = 0, 1, 2, 3
RECORD_FORMAT = "acl-swiglu-probe/1"
INLINE_BYTES = 1 << 15          # outputs up to this size are recorded whole; larger ones as a digest
SAMPLES = 16
PROTOCOL = b"ACL-SWIGLU-PROBE "   # marks the worker's lines (a library may print on stdout too)
DEFAULT_TIMEOUT = 120.0
START_TIMEOUT = 120.0

# Bits no case puts in an input and no kernel computes: signalling NaNs with odd payloads.
SENTINEL = {"fp32": 0x7FA5A5A5, "fp16": 0x7D5A, "bf16": 0x7FA5}
FP32_ONE = 0x3F800000

Json = Dict[str, Any]


# ============================================================================ inputs from recipes
#
# A recipe is JSON: shapes, dtype, a generator per operand, the options and the API to call. The
# generators use only integer arithmetic and IEEE + and * (no libm), so a recipe builds the same
# bits on every machine and NumPy version; the worker also returns a digest of what it built,
# which --check compares.


def _np_dtype(name: str) -> np.dtype:
    if name == "bf16":
        import ml_dtypes

        bf16: np.dtype = np.dtype(ml_dtypes.bfloat16)
        return bf16
    dtype: np.dtype = np.dtype({"fp32": np.float32, "fp16": np.float16}[name])
    return dtype


def _uint(dtype: np.dtype) -> type:
    return {2: np.uint16, 4: np.uint32, 8: np.uint64, 1: np.uint8}[dtype.itemsize]


def _random_u64(seed: int, n: int) -> np.ndarray:
    """n numbers of a splitmix64 stream (wrapping uint64 arithmetic)."""
    index = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = index * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed % (1 << 64))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _uniform01(seed: int, n: int) -> np.ndarray:
    return (_random_u64(seed, n) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 -> the dtype through float32 (round half to even at each step)."""
    return values.astype(np.float32).astype(dtype)


def _from_bits(bits: Sequence[Any], count: int, dtype: np.dtype) -> np.ndarray:
    words = np.array([int(b, 16) if isinstance(b, str) else int(b) for b in bits], dtype=np.uint64)
    if words.size == 0:
        words = np.zeros(1, np.uint64)
    tiled = np.resize(words, count) if count else words[:0]
    return tiled.astype(_uint(dtype)).view(dtype)


def build_operand(spec: Json, shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The array a generator spec describes (docs/fidelity.md lists the generators)."""
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    gen = spec["gen"]
    if gen == "normal":
        u = _uniform01(int(spec["seed"]), 4 * n).reshape(4, n)
        values = (((u[0] + u[1]) + u[2]) + u[3] - 2.0) * 1.7320508075688772 * float(spec.get("scale", 1.0))
        out = _cast(values, dtype)
    elif gen == "uniform":
        low, high = float(spec["low"]), float(spec["high"])
        out = _cast(low + (high - low) * _uniform01(int(spec["seed"]), n), dtype)
    elif gen == "wide":   # +-(1 + u) * 2^e, e uniform in [emin, emax]: sums whose order shows
        r = _random_u64(int(spec["seed"]), n)
        span = int(spec["emax"]) - int(spec["emin"]) + 1
        exponent = (r % np.uint64(span)).astype(np.int64) + int(spec["emin"])
        mantissa = 1.0 + (r >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        sign = np.where((r >> np.uint64(7)) & np.uint64(1), -1.0, 1.0)
        out = _cast(sign * np.ldexp(mantissa, exponent), dtype)
    elif gen == "const":
        out = _from_bits([spec["bits"]], n, dtype)
    elif gen == "bits":
        out = _from_bits(spec["bits"], n, dtype)
    elif gen == "sweep":   # consecutive bit patterns: start, start + step, ...
        start, step = int(spec["start"], 16), int(spec["step"])
        width = 1 << (8 * dtype.itemsize)
        words = (start + step * np.arange(n, dtype=np.int64)) % width
        out = words.astype(_uint(dtype)).view(dtype)
    elif gen == "rows":   # row t holds values[t % len(values)] in every column
        values = np.array([float(v) for v in spec["values"]], np.float64)
        last = shape[-1] if shape else 1
        rows = n // last if last else 0
        out = _cast(np.repeat(np.resize(values, rows), last), dtype)
    elif gen == "overlay":   # the base, with the listed rows replaced by the tiled bits
        out = build_operand(spec["base"], shape, dtype).reshape(-1)
        last = shape[-1] if shape else 1
        grid = out.reshape(-1, last) if last else out.reshape(0, 0)
        patch = _from_bits(spec["bits"], last, dtype)
        for row in spec["rows"]:
            if 0 <= int(row) < grid.shape[0]:
                grid[int(row)] = patch
        out = grid.reshape(-1)
    else:
        raise ValueError(f"unknown generator {gen!r}")
    return np.ascontiguousarray(out.reshape(shape))


def _strided(a: Any) -> Any:
    """The same values as a view into a bigger NaN-filled array (rows and columns skipped)."""
    if a is None or a.ndim < 1 or a.size == 0:
        return a
    lead = a.shape[:-1]
    big = np.full((lead[0] + 3,) + lead[1:] + (a.shape[-1] + 5,) if lead else (a.shape[-1] + 5,), np.nan, a.dtype)
    index = ((slice(2, 2 + lead[0]),) + (slice(None),) * (len(lead) - 1) if lead else ()) + (slice(1, 1 + a.shape[-1]),)
    big[index] = a
    return big[index]


def build_inputs(recipe: Json) -> Json:
    """(grad_y, x, weight, y_origin, group_index, clamp_limit) of a recipe, as host arrays."""
    dtype = _np_dtype(recipe["dtype"])
    lead = tuple(int(d) for d in recipe["lead"])
    hidden = int(recipe["hidden"])
    shape = lead + (hidden,)
    grad_y = build_operand(recipe["grad_y"], shape, dtype)
    x = np.concatenate([build_operand(recipe["x0"], shape, dtype), build_operand(recipe["x1"], shape, dtype)],
                       axis=-1)
    weight = y_origin = None
    if recipe.get("weight") is not None:
        tokens = int(np.prod(lead, dtype=np.int64)) if lead else 1
        weight_shape = {"column": lead + (1,), "flat": (tokens,)}.get(recipe.get("weight_shape", "column"))
        if weight_shape is None:
            weight_shape = tuple(int(d) for d in recipe["weight_shape"])
        weight = build_operand(recipe["weight"], weight_shape, np.dtype(np.float32))
        y_origin = build_operand(recipe["y_origin"], shape, dtype)
    group = recipe.get("group_index")
    group_index = None if group is None else np.array([int(g) for g in group], np.int64)
    clamp = recipe.get("clamp_limit")
    clamp_limit = None if clamp is None else float.fromhex(clamp)
    if recipe.get("layout") == "strided":
        grad_y, x = _strided(grad_y), _strided(x)   # (never None: they exist)
        weight, y_origin = _strided(weight), _strided(y_origin)
    return {"grad_y": grad_y, "x": x, "weight": weight, "y_origin": y_origin, "group_index": group_index,
            "clamp_limit": clamp_limit}


def inputs_digest(inputs: Json) -> str:
    h = hashlib.sha256()
    for name in ("grad_y", "x", "weight", "y_origin", "group_index"):
        a = inputs[name]
        h.update(name.encode())
        if a is not None:
            h.update(repr((a.shape, a.dtype.name)).encode())
            h.update(np.ascontiguousarray(a).tobytes())
    h.update(repr(inputs["clamp_limit"]).encode())
    return h.hexdigest()


# ============================================================================ outputs as records


def _dtype_name(dtype: np.dtype) -> str:
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(dtype.name, dtype.name)


def encode(array: np.ndarray) -> Json:
    """An output's bits: whole (zlib, base64) up to INLINE_BYTES, else sha256 and SAMPLES values."""
    data = np.ascontiguousarray(array)
    raw = data.tobytes()
    record: Json = {"dtype": _dtype_name(data.dtype), "shape": list(data.shape)}
    if len(raw) <= INLINE_BYTES:
        record["bits_z"] = base64.b64encode(zlib.compress(raw, 9)).decode()
        return record
    flat: Optional[np.ndarray] = data.reshape(-1).view(_uint(data.dtype)) if data.dtype.itemsize in (1, 2, 4, 8) \
        else None
    record["sha256"] = hashlib.sha256(raw).hexdigest()
    if flat is not None and flat.size:
        picks = sorted({int(i) for i in np.linspace(0, flat.size - 1, SAMPLES)})
        record["samples"] = [[i, f"0x{int(flat[i]):0{2 * data.dtype.itemsize}x}"] for i in picks]
    return record


def decode_bits(record: Json) -> Optional[np.ndarray]:
    """The recorded bits as unsigned integers (None for a digest-only record)."""
    if "bits_z" not in record:
        return None
    raw = zlib.decompress(base64.b64decode(record["bits_z"]))
    count = math.prod(record["shape"])   # (the width from the data: FP8/E8M0 names need no ml_dtypes)
    itemsize = len(raw) // count if count else 1
    return np.frombuffer(raw, dtype=_uint(np.dtype(f"u{itemsize}")))


def _digest_of(record: Json) -> str:
    if "sha256" in record:
        return str(record["sha256"])
    return hashlib.sha256(zlib.decompress(base64.b64decode(record["bits_z"]))).hexdigest()


def compare_results(recorded: Json, replayed: Json) -> Optional[str]:
    """None when two results agree bit for bit (status, error code, outputs, repeat flags);
    else what differs first."""
    for key in ("status",):
        if recorded.get(key) != replayed.get(key):
            return f"status {recorded.get(key)} ({_error_text(recorded)}) vs {replayed.get(key)} ({_error_text(replayed)})"
    if recorded.get("status") in ("error", "refused"):
        a, b = recorded.get("error") or {}, replayed.get("error") or {}
        if (a.get("code"), a.get("type")) != (b.get("code"), b.get("type")):
            return f"error {a.get('type')} {a.get('code')} vs {b.get('type')} {b.get('code')}"
        return None
    for key in ("repeats_identical", "plan_repeat_identical"):
        if recorded.get(key) != replayed.get(key):
            return f"{key}: {recorded.get(key)} vs {replayed.get(key)}"
    outputs_a, outputs_b = recorded.get("outputs") or {}, replayed.get("outputs") or {}
    for name in sorted(set(outputs_a) | set(outputs_b)):
        a, b = outputs_a.get(name), outputs_b.get(name)
        if a is None or b is None:
            if a is not b:
                return f"{name}: present in one result only"
            continue
        if (a["dtype"], a["shape"]) != (b["dtype"], b["shape"]):
            return f"{name}: {a['dtype']} {a['shape']} vs {b['dtype']} {b['shape']}"
        bits_a, bits_b = decode_bits(a), decode_bits(b)
        if bits_a is not None and bits_b is not None:
            differ = np.flatnonzero(bits_a != bits_b)
            if differ.size:
                i = int(differ[0])
                width = 2 * bits_a.dtype.itemsize
                return (f"{name}: {differ.size} element(s) differ, first at flat index {i}: "
                        f"0x{int(bits_a[i]):0{width}x} vs 0x{int(bits_b[i]):0{width}x}")
        elif _digest_of(a) != _digest_of(b):
            return f"{name}: digests differ"
    return None


def _error_text(result: Json) -> str:
    error = result.get("error") or {}
    return " ".join(str(error[k]) for k in ("type", "code") if error.get(k) is not None) or "-"


# ============================================================================ the worker (a child process)


def _environment() -> Json:
    """What the backend says about itself (the worker's first message)."""
    import ctypes

    import acl_swiglu
    from . import _device_info, _ffi

    info = acl_swiglu.backend_info()
    package = os.path.dirname(os.path.abspath(acl_swiglu.__file__))

    def where(path: Optional[str]) -> Optional[str]:   # the bundled emulator's files, wherever installed
        if path and os.path.abspath(path).startswith(package + os.sep):
            return "<acl_swiglu>" + os.path.abspath(path)[len(package):]
        return path

    env: Json = {"backend": info.backend, "package_version": acl_swiglu.__version__,
                 "emulator_version": info.emulator_version, "abi_revision": acl_swiglu.abi_revision(),
                 "libraries": {"runtime": where(info.runtime), "meta": where(info.meta),
                               "operator": where(info.operator)},
                 "python": platform.python_version(), "numpy": np.__version__,
                 "platform": f"{platform.system()} {platform.machine()}"}
    cores = _device_info.current_vector_cores()
    env["vector_cores"], env["vector_cores_source"] = cores.cores, cores.source
    api = _ffi.api()
    env["cann_version"], env["cann_version_source"] = info.cann_version, info.cann_version_file
    env["driver"] = None
    query = api.raw.aclsysGetCANNVersion
    if query is not None:
        for name, key in ((0, "cann_version"), (7, "driver")):
            version = _ffi.aclCANNPackageVersion()
            if query(name, ctypes.byref(version)) == 0 and version.version:
                env[key] = version.version.decode(errors="replace")
                if key == "cann_version":
                    env["cann_version_source"] = "aclsysGetCANNVersion(ACL_PKG_NAME_CANN)"
            else:
                _ffi.drop_message(api.get_message)
    soc = getattr(api.libraries.runtime, "aclrtGetSocName", None)
    if soc is not None:
        soc.restype, soc.argtypes = ctypes.c_char_p, []
        name = soc()
        env["soc"] = name.decode(errors="replace") if name else None
    else:
        env["soc"] = "emulator" if info.backend == "emulator" else None
    forward = getattr(acl_swiglu, "swiglu_group_quant", None)
    if forward is None:
        env["forward"] = {"available": False, "reason": "the installed package has no acl_swiglu.swiglu_group_quant"}
    elif not hasattr(api.libraries.operator, "aclnnSwigluGroupQuantGetWorkspaceSize"):
        env["forward"] = {"available": False, "reason": f"{info.operator} does not export aclnnSwigluGroupQuant"}
    else:
        env["forward"] = {"available": True, "reason": None}
    return env


def _sentinel_fill(shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.full(shape, SENTINEL[_dtype_name(dtype)], _uint(dtype)).view(dtype)


def _unwritten(array: np.ndarray) -> int:
    bits: np.ndarray = np.ascontiguousarray(array).reshape(-1).view(_uint(array.dtype))
    return int(np.count_nonzero(bits == SENTINEL[_dtype_name(array.dtype)]))


class _Outputs:
    """Device outputs pre-filled with the sentinel: contiguous arrays, or (strided layout) every
    other row of a bigger buffer, so that writes outside the view would show as well."""

    def __init__(self, stack: contextlib.ExitStack, shape: Tuple[int, ...], dtype: np.dtype, strided: bool):
        import acl_swiglu

        self.shape, self.dtype, self.strided = shape, dtype, strided and len(shape) >= 1 and int(np.prod(shape)) > 0
        if self.strided:
            rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
            self.filler = _sentinel_fill((2 * rows * shape[-1],), dtype)
            self.buffer = stack.enter_context(acl_swiglu.DeviceBuffer(self.filler.nbytes))
            strides = [1] * len(shape)
            step = 2 * shape[-1]
            for i in range(len(shape) - 2, -1, -1):
                strides[i] = step
                step *= shape[i]
            self.array = stack.enter_context(acl_swiglu.DeviceArray.wrap(self.buffer.ptr, shape, dtype,
                                                                         strides=tuple(strides)))
        else:
            self.array = stack.enter_context(acl_swiglu.DeviceArray.empty(shape, dtype))
        self.refill()

    def refill(self) -> None:
        if self.strided:
            self.buffer.copy_from_host(self.filler)
        elif self.array.size:
            self.array.copy_from(_sentinel_fill(self.shape, self.dtype))


def _run_device(inputs: Json, recipe: Json, api_name: str) -> List[Dict[str, np.ndarray]]:
    """The device-level call (or a plan), once per repeat; the host copies of the outputs."""
    import acl_swiglu

    strided = recipe.get("layout") == "strided"
    runs: List[Dict[str, np.ndarray]] = []
    with contextlib.ExitStack() as stack:
        stream = stack.enter_context(acl_swiglu.Stream())
        grad_y, x_dev, weight, y_origin = (
            None if inputs[n] is None else stack.enter_context(acl_swiglu.to_device(inputs[n]))
            for n in ("grad_y", "x", "weight", "y_origin"))
        assert grad_y is not None and x_dev is not None
        group = inputs["group_index"]
        if group is not None and acl_swiglu.abi_revision() == 2:
            group = stack.enter_context(acl_swiglu.to_device(group))
        elif group is not None:
            group = [int(g) for g in group]
        x = inputs["x"]
        grad_x = _Outputs(stack, x.shape, x.dtype, strided)
        grad_w = None if inputs["weight"] is None else _Outputs(stack, inputs["weight"].shape,
                                                                 np.dtype(np.float32), strided)
        outputs = {"grad_x": grad_x, "grad_weight": grad_w}
        plan = None
        if api_name == "plan":
            plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(
                grad_y, x_dev, weight, y_origin, group, inputs["clamp_limit"], grad_x=grad_x.array,
                grad_weight=None if grad_w is None else grad_w.array, stream=stream))
        repeats = max(1, int(recipe.get("repeat", 1))) if plan is None else 2
        for _ in range(repeats):
            for out in outputs.values():
                if out is not None:
                    out.refill()
            if plan is not None:
                plan(synchronize=True)
            else:
                acl_swiglu.swiglu_group_quant_grad_device(
                    grad_y, x_dev, weight, y_origin, group, inputs["clamp_limit"], grad_x=grad_x.array,
                    grad_weight=None if grad_w is None else grad_w.array, stream=stream)
                stream.synchronize()
            runs.append({name: out.array.to_numpy() for name, out in outputs.items() if out is not None})
    return runs


def _run_forward(inputs: Json, recipe: Json) -> List[Dict[str, np.ndarray]]:
    import acl_swiglu

    function = getattr(acl_swiglu, "swiglu_group_quant")
    kwargs = dict(recipe.get("forward_kwargs") or {})
    if inputs["clamp_limit"] is not None:
        kwargs["clamp_limit"] = inputs["clamp_limit"]
    result = function(inputs["x"], inputs["weight"], inputs["group_index"], **kwargs)
    items = result if isinstance(result, tuple) else (result,)
    return [{name: np.asarray(a) for name, a in zip(("y", "y_scale", "y_origin"), items) if a is not None}]


def execute(recipe: Json) -> Json:
    """Runs one case: builds its inputs, calls the operator as the recipe says, and describes
    what came back (status, error, output bits, unwritten elements)."""
    import acl_swiglu

    started = time.monotonic()
    inputs = build_inputs(recipe)
    result: Json = {"inputs_sha256": inputs_digest(inputs)}
    api_name = recipe.get("api", "device")
    try:
        if api_name == "forward":
            runs = _run_forward(inputs, recipe)
        elif api_name == "one_shot":
            gx, gw = acl_swiglu.swiglu_group_quant_grad(*(inputs[n] for n in (
                "grad_y", "x", "weight", "y_origin", "group_index", "clamp_limit")))
            runs = [{"grad_x": gx} if gw is None else {"grad_x": gx, "grad_weight": gw}]
        else:
            runs = _run_device(inputs, recipe, api_name)
    except acl_swiglu.AclError as exc:
        result.update(status="error", error={"type": type(exc).__name__, "code": exc.code, "name": exc.name,
                                             "api": exc.api, "message": exc.message[:2000]})
        return result
    except acl_swiglu.AclSwigluError as exc:
        status = "refused" if type(exc).__name__ == "ReleaseLimitationError" else "error"
        result.update(status=status, error={"type": type(exc).__name__, "code": None, "message": str(exc)[:2000]})
        return result
    except (TypeError, ValueError, NotImplementedError) as exc:   # a call the installed API does not take
        result.update(status="error", error={"type": type(exc).__name__, "code": None, "message": str(exc)[:2000]})
        return result
    first = runs[0]
    result["status"] = "ok"
    result["outputs"] = {name: encode(a) for name, a in first.items()}
    if api_name in ("device", "plan"):
        result["unwritten"] = {name: _unwritten(a) for name, a in first.items()}
    if len(runs) > 1:
        same = all(all(np.array_equal(np.ascontiguousarray(r[n]).view(_uint(r[n].dtype)),
                                      np.ascontiguousarray(first[n]).view(_uint(first[n].dtype))) for n in first)
                   for r in runs[1:])
        result["plan_repeat_identical" if api_name == "plan" else "repeats_identical"] = same
        if api_name == "plan":   # the second launch is the one a reused plan gives
            result["outputs"] = {name: encode(a) for name, a in runs[-1].items()}
    result["seconds"] = round(time.monotonic() - started, 4)
    return result


def _worker_main() -> None:
    """The child's loop: one JSON request per line on stdin, one answer per case."""
    protocol = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)   # anything a library prints on stdout goes to stderr, not into the protocol
    sys.stdout = sys.stderr

    def send(message: Json) -> None:
        protocol.write(PROTOCOL + json.dumps(message).encode() + b"\n")

    try:
        send({"ready": _environment()})
    except Exception as exc:   # no backend: the parent reports it
        send({"failed": f"{type(exc).__name__}: {exc}"})
        return
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        request = json.loads(line)
        send({"id": request["id"], "result": execute(request["recipe"])})


WORKER_CODE = "from acl_swiglu import probe; probe._worker_main()"


# ============================================================================ workers seen from the parent


class WorkerGone(Exception):
    """The worker died, timed out or could not start; ``status`` says which."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class Worker:
    """A child process that runs cases one at a time; killed (by its own process id) when a case
    outlives its time limit."""

    def __init__(self, env: Dict[str, str], command: Optional[Sequence[str]] = None):
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(list(command or (sys.executable, "-c", WORKER_CODE)), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        self.buffer = b""
        self.ready: Optional[Json] = None

    def fileno(self) -> int:
        assert self.process.stdout is not None
        return self.process.stdout.fileno()

    def stderr_tail(self, limit: int = 2000) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-limit:]

    def read_message(self, deadline: float) -> Json:
        while True:
            line_end = self.buffer.find(b"\n")
            while line_end >= 0:
                line, self.buffer = self.buffer[:line_end], self.buffer[line_end + 1:]
                if line.startswith(PROTOCOL):
                    return dict(json.loads(line[len(PROTOCOL):]))
                line_end = self.buffer.find(b"\n")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerGone("timeout", "no answer within the time limit")
            ready, _, _ = select.select([self.fileno()], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self.fileno(), 1 << 16)
            if not chunk:
                self.process.wait()
                raise WorkerGone("crashed", f"the worker exited with {self.process.returncode}: {self.stderr_tail()}")
            self.buffer += chunk

    def start(self, timeout: float) -> Json:
        message = self.read_message(time.monotonic() + timeout)
        if "failed" in message:
            self.close()
            raise WorkerGone("failed", str(message["failed"]))
        self.ready = message["ready"]
        return self.ready

    def send(self, request: Json) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            self.process.wait()
            raise WorkerGone("crashed", f"the worker exited with {self.process.returncode}: {self.stderr_tail()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def close(self) -> None:
        if self.process.poll() is None and self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.kill()
        self.stderr.close()


@dataclass
class Job:
    key: int
    recipe: Json
    result: Optional[Json] = None


class Pool:
    """Up to `jobs` workers with one environment; each case has `timeout` seconds. A worker
    that times out, dies, or reports a runtime failure (a device may be left unusable by one)
    is replaced for the next case."""

    def __init__(self, env: Dict[str, str], jobs: int, timeout: float, command: Optional[Sequence[str]] = None):
        self.env, self.jobs, self.timeout, self.command = env, max(1, jobs), timeout, command
        self.idle: List[Worker] = []
        self.ready: Optional[Json] = None

    def _new_worker(self) -> Worker:
        worker = Worker(self.env, self.command)
        try:
            ready = worker.start(max(START_TIMEOUT, self.timeout))
        except WorkerGone:
            worker.close()
            raise
        if self.ready is None:
            self.ready = ready
        return worker

    def environment(self) -> Json:
        """The first worker's report of its backend (starts it)."""
        if self.ready is None:
            self.idle.append(self._new_worker())
        assert self.ready is not None
        return self.ready

    def run(self, jobs: Sequence[Job], done: Optional[Callable[[Job], None]] = None) -> None:
        pending = list(jobs)[::-1]
        busy: Dict[int, Tuple[Worker, Job, float]] = {}
        try:
            while pending or busy:
                while pending and len(busy) < self.jobs:
                    try:
                        worker = self.idle.pop() if self.idle else self._new_worker()
                    except WorkerGone as gone:   # e.g. a device left unusable: nothing more can run
                        for job in reversed(pending):
                            job.result = {"status": "not run", "error": {
                                "type": "worker", "code": None, "message": f"no worker could start: {gone.detail}"}}
                            if done:
                                done(job)
                        pending.clear()
                        break
                    job = pending.pop()
                    try:
                        worker.send({"id": job.key, "recipe": job.recipe})
                    except WorkerGone as gone:
                        job.result = {"status": gone.status, "error": {"type": "worker", "message": gone.detail}}
                        worker.close()
                        if done:
                            done(job)
                        continue
                    busy[worker.fileno()] = (worker, job, time.monotonic() + self.timeout)
                if not busy:
                    continue
                nearest = min(deadline for _, _, deadline in busy.values())
                readable, _, _ = select.select(list(busy), [], [], max(0.0, nearest - time.monotonic()))
                finished = readable or [fd for fd, (_, _, deadline) in busy.items() if deadline <= time.monotonic()]
                for fd in finished:
                    worker, job, deadline = busy.pop(fd)
                    try:
                        message = worker.read_message(deadline)
                        job.result = message["result"]
                        error = (job.result or {}).get("error") or {}
                        if job.result.get("status") == "error" and str(error.get("code") or "").startswith("5"):
                            worker.close()   # a runtime failure: a fresh process for the next case
                        else:
                            self.idle.append(worker)
                    except WorkerGone as gone:
                        limit = f" ({self.timeout:g} s)" if gone.status == "timeout" else ""
                        job.result = {"status": gone.status,
                                      "error": {"type": "worker", "code": None, "message": gone.detail + limit}}
                        worker.close()
                    if done:
                        done(job)
        finally:
            for worker, _, _ in busy.values():
                worker.close()

    def close(self) -> None:
        for worker in self.idle:
            worker.close()
        self.idle.clear()


# ============================================================================ the families


@dataclass
class Case:
    family: str
    name: str
    recipe: Json
    skip: Optional[str] = None
    role: Optional[str] = None   # "tiling": a split-row discriminator for the fingerprint


@dataclass
class Family:
    name: str
    decides: str
    build: Callable[[Json], List[Case]]
    unsafe: bool = False


def _hex(value: float) -> str:
    return float(value).hex()


def _f32_bits(values: Sequence[float]) -> List[str]:
    return [f"0x{int(b):08x}" for b in np.array(values, np.float64).astype(np.float32).view(np.uint32)]


def N(seed: int, scale: float = 1.0) -> Json:
    return {"gen": "normal", "seed": seed, "scale": scale}


def U(seed: int, low: float, high: float) -> Json:
    return {"gen": "uniform", "seed": seed, "low": low, "high": high}


def W(seed: int, emin: int = -20, emax: int = 20) -> Json:
    return {"gen": "wide", "seed": seed, "emin": emin, "emax": emax}


def C(bits: int) -> Json:
    return {"gen": "const", "bits": f"0x{bits:x}"}


def B(bits: Sequence[str]) -> Json:
    return {"gen": "bits", "bits": list(bits)}


ONE = {"fp32": C(0x3F800000), "fp16": C(0x3C00), "bf16": C(0x3F80)}
ZERO = C(0)


def recipe(dtype: str = "fp32", lead: Sequence[int] = (4,), hidden: int = 16, *, grad_y: Optional[Json] = None,
           x0: Optional[Json] = None, x1: Optional[Json] = None, weight: Optional[Json] = None,
           y_origin: Optional[Json] = None, weight_shape: Any = "column", group_index: Optional[Sequence[int]] = None,
           clamp: Optional[float] = None, api: str = "device", layout: str = "contiguous", repeat: int = 1,
           seed: int = 1, **extra: Any) -> Json:
    r: Json = {"dtype": dtype, "lead": list(lead), "hidden": hidden,
               "grad_y": grad_y or N(seed), "x0": x0 or N(seed + 1, 2.0), "x1": x1 or N(seed + 2, 2.0),
               "weight": weight, "y_origin": (y_origin or N(seed + 3)) if weight is not None else None,
               "weight_shape": weight_shape, "group_index": None if group_index is None else list(group_index),
               "clamp_limit": None if clamp is None else _hex(clamp), "api": api, "layout": layout, "repeat": repeat}
    r.update(extra)
    return r


def _weight(seed: int) -> Json:
    return U(seed, 0.5, 1.5)


def _family_determinism(env: Json) -> List[Case]:
    f = "determinism"
    return [
        Case(f, "fp32-weight-clamp", recipe("fp32", (24,), 64, weight=_weight(4), clamp=2.5, repeat=3, seed=10)),
        Case(f, "bf16-weight", recipe("bf16", (17,), 80, weight=_weight(5), repeat=3, seed=20)),
        Case(f, "fp16-split-row", recipe("fp16", (2,), 2560, grad_y=W(30), weight=_weight(6), y_origin=W(31),
                                         clamp=2.0, repeat=3, seed=30)),
    ]


# Split rows whose two tilings (9.1.0 factors, current factors) give different gradWeight orders.
_SPLITS = (("bf16-weight-clamp-H2560", "bf16", 2560, 2.0), ("fp32-weight-H4096", "fp32", 4096, None),
           ("fp16-weight-H2800", "fp16", 2800, None))


def _family_fingerprint(env: Json) -> List[Case]:
    f = "fingerprint"
    cases = [Case(f, name, recipe(dtype, (2,), hidden, grad_y=W(40 + i, -12, 12), weight=_weight(41 + i),
                                  y_origin=W(50 + i, -12, 12), clamp=clamp, seed=40 + i), role="tiling")
             for i, (name, dtype, hidden, clamp) in enumerate(_SPLITS)]
    # rows spread over the device's cores with an H no core-aligned copy covers
    cores = int(env["vector_cores"])
    cases.append(Case(f, f"rows-per-core-T{3 * cores + 1}-H9", recipe("fp32", (3 * cores + 1,), 9, seed=60)))
    return cases


_REDUCE_N = (1, 2, 3, 5, 8, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 160, 192, 193, 224, 255, 256, 257, 320,
             1000, 2047, 2049, 3408)


def _family_reduce_tree(env: Json) -> List[Case]:
    # gradWeight = ReduceSum of gy * yOrigin with yOrigin = 1: the products are gy itself, of widely
    # spread magnitudes, so every tree shape rounds differently. fp32 + weight fits one tile to 3412.
    return [Case("reduce_tree", f"n{n}", recipe("fp32", (4,), n, grad_y=W(100 + n, -24, 24), weight=_weight(7),
                                                y_origin=ONE["fp32"], x0=ZERO, x1=ZERO, seed=100 + n))
            for n in _REDUCE_N]


def _family_zero_sign(env: Json) -> List[Case]:
    # every product is -1 * +0 = -0.0: the sum is -0.0 only where no +0.0 padding lane takes part
    minus_one = C(0xBF800000)
    return [Case("reduce_zero_sign", f"n{n}", recipe("fp32", (2,), n, grad_y=minus_one, weight=_weight(8),
                                                     y_origin=ZERO, x0=ZERO, x1=ZERO))
            for n in (1, 2, 63, 64, 65, 128, 129, 200, 256, 257, 1000, 3408)]


def _family_exp_bits(env: Json) -> List[Case]:
    # gy = 1, x1 = 1: gx1 = x0 * s and gx0 = dsilu, with s = e / (e + 1) = e where e + 1 rounds to 1
    f, one = "exp_bits", ONE["fp32"]
    threshold = int(np.array(-87.40, np.float32).view(np.uint32))
    return [
        Case(f, "s-equals-e", recipe("fp32", (1,), 1024, grad_y=one, x1=one, x0=U(200, -104.0, -17.4))),
        Case(f, "flush-threshold", recipe("fp32", (1,), 1024, grad_y=one, x1=one,
                                          x0={"gen": "sweep", "start": f"0x{threshold:08x}", "step": -16})),
        Case(f, "e-plus-1-rounds", recipe("fp32", (1,), 1024, grad_y=one, x1=one, x0=U(201, -17.5, -15.5))),
        Case(f, "general", recipe("fp32", (1,), 1024, grad_y=one, x1=one, x0=U(202, -17.4, 88.7))),
    ]


def _family_div_rounding(env: Json) -> List[Case]:
    f, one = "div_rounding", ONE["fp32"]
    powers = [s * 2.0 ** k for k in range(-30, 8) for s in (1.0, -1.0)]
    near = [s * 2.0 ** k * (1.0 + d * 2.0 ** -23) for k in range(-12, 7) for s in (1.0, -1.0) for d in (-1, 1)]
    return [Case(f, "powers-of-two", recipe("fp32", (1,), len(powers), grad_y=one, x1=one, x0=B(_f32_bits(powers)))),
            Case(f, "next-to-powers", recipe("fp32", (1,), len(near), grad_y=one, x1=one, x0=B(_f32_bits(near))))]


def _family_overflow_edge(env: Json) -> List[Case]:
    f = "overflow_edge"
    edge = int(np.array(88.72283935546875, np.float32).view(np.uint32))
    sweep = {"gen": "sweep", "start": f"0x{edge - 64:08x}", "step": 1}
    extremes = B(_f32_bits([88.0, 88.5, 88.7, 88.72, 88.73, 88.8, 89.0, 100.0, 1e30, float("inf"), -float("inf")]))
    return [
        Case(f, "sweep-noclamp", recipe("fp32", (1,), 128, x0=sweep, grad_y=ONE["fp32"], x1=ONE["fp32"])),
        Case(f, "sweep-clamp-100", recipe("fp32", (1,), 128, x0=sweep, grad_y=ONE["fp32"], x1=ONE["fp32"],
                                          clamp=100.0)),
        Case(f, "extremes", recipe("fp32", (2,), 11, x0=extremes, seed=70)),
        Case(f, "bf16-near-edge", recipe("bf16", (1,), 64, x0={"gen": "sweep", "start": "0x42b0", "step": 1},
                                         grad_y=ONE["bf16"], x1=ONE["bf16"])),
        Case(f, "fp16-large", recipe("fp16", (1,), 64, x0=U(71, 60.0, 65504.0), grad_y=ONE["fp16"], x1=ONE["fp16"])),
    ]


_PAYLOADS = {"fp32": ["0x7fc00000", "0xffc00000", "0x7fc00001", "0x7fffffff", "0x7f800001", "0xff800001",
                      "0x7fa00000", "0x7fd23456"],
             "fp16": ["0x7e00", "0xfe00", "0x7e01", "0x7fff", "0x7c01", "0xfc01", "0x7d00", "0x7e55"],
             "bf16": ["0x7fc0", "0xffc0", "0x7fc1", "0x7fff", "0x7f81", "0xff81", "0x7fa0", "0x7fd5"]}


def _family_nan_payloads(env: Json) -> List[Case]:
    # row 0: NaN in gy; 1: in x0; 2: in x1; 3: in yOrigin; 4: in the weight; 5: none
    cases = []
    for dtype, payloads in _PAYLOADS.items():
        def with_nan(base: Json, row: int) -> Json:
            return {"gen": "overlay", "base": base, "rows": [row], "bits": payloads}

        weight = {"gen": "overlay", "base": _weight(81), "rows": [4], "bits": _PAYLOADS["fp32"][:1]}
        for clamp in (None, 2.0):
            name = f"{dtype}-{'clamp' if clamp else 'noclamp'}"
            cases.append(Case("nan_payloads", name, recipe(
                dtype, (6,), 16, grad_y=with_nan(N(82), 0), x0=with_nan(N(83, 2.0), 1), x1=with_nan(N(84, 2.0), 2),
                y_origin=with_nan(N(85), 3), weight=weight, weight_shape="flat", clamp=clamp)))
    return cases


def _family_subnormals(env: Json) -> List[Case]:
    f, one = "subnormals", ONE["fp32"]
    tiny = 2.0 ** -126
    # Mul: normal gy times silu(1) ~ 0.731 lands below 2^-126 (an output a flush-to-zero multiply drops)
    gy_normal = B(_f32_bits([tiny * (1.0 + k / 64.0) for k in range(64)]))
    # Mul with a subnormal input (what denormals-are-zero drops)
    gy_sub = B(_f32_bits([tiny * k / 64.0 for k in range(1, 65)]))
    # Add: two normal products whose sum is subnormal, then the tree's +0.0 lanes
    pair_gy = B(_f32_bits([1.5 * 2.0 ** -63, -1.0 * 2.0 ** -63]))
    pair_yo = B(_f32_bits([2.0 ** -63, 2.0 ** -63]))
    return [
        Case(f, "mul-normal-operands-subnormal-product", recipe("fp32", (1,), 64, grad_y=gy_normal, x0=one, x1=one)),
        Case(f, "mul-subnormal-operand", recipe("fp32", (1,), 64, grad_y=gy_sub, x0=one, x1=one)),
        Case(f, "add-subnormal-sum", recipe("fp32", (4,), 2, grad_y=pair_gy, y_origin=pair_yo, weight=_weight(90),
                                            x0=one, x1=one)),
        Case(f, "reduce-subnormal-products", recipe("fp32", (2,), 256, grad_y=gy_sub, y_origin=one,
                                                    weight=_weight(91), x0=one, x1=one)),
        Case(f, "bf16-subnormal-inputs", recipe("bf16", (1,), 64, grad_y={"gen": "sweep", "start": "0x0001", "step": 2},
                                                x0=ONE["bf16"], x1={"gen": "sweep", "start": "0x0040", "step": 1})),
    ]


def _family_widening_rint(env: Json) -> List[Case]:
    # x0 = 0: s = 0.5, silu = 0, so gx0 = (gy * x1) * 0.5 and gx1 = +-0: chosen products land on ties
    f = "widening_rint"
    cases = []
    for dtype, step, three, big in (("fp16", 2.0 ** -10, 0x4200, 0x7BFF), ("bf16", 2.0 ** -7, 0x4040, 0x7F7F)):
        odd = [1.0 + k * step for k in range(1, 256, 2)]
        ties_x1 = {"gen": "bits", "bits": [f"0x{int(b):04x}" for b in
                                           _cast(np.array(odd), _np_dtype(dtype)).view(np.uint16)]}
        cases += [
            Case(f, f"{dtype}-specials", recipe(dtype, (2,), 256, grad_y=ONE[dtype], x0=ZERO,
                                                x1={"gen": "sweep", "start": "0x0000", "step": 257})),
            Case(f, f"{dtype}-ties", recipe(dtype, (1,), len(odd), grad_y=C(three), x0=ZERO, x1=ties_x1)),
            Case(f, f"{dtype}-overflow", recipe(dtype, (1,), 128, grad_y=C(big), x0=ZERO,
                                                x1=U(92, 1.99, 2.01))),
        ]
    return cases


def _clamp_points(c: float) -> List[float]:
    c32 = float(np.float32(c))
    with np.errstate(over="ignore"):   # past FLT_MAX is inf
        up, down = (float(np.nextafter(np.float32(c32), np.float32(np.inf))),
                    float(np.nextafter(np.float32(c32), np.float32(-np.inf))))
    points = [c32, up, down, -c32, -up, -down, 0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e30, -1e30]
    return points


def _family_clamp_boundaries(env: Json) -> List[Case]:
    f = "clamp_boundaries"
    limits = (("2.5", 2.5), ("1e-3", 1e-3), ("3.3", 3.3), ("1+2^-24-tie-down", 1.0 + 2.0 ** -24),
              ("1+3x2^-24-tie-up", 1.0 + 3 * 2.0 ** -24), ("3e38", 3e38), ("FLT_MAX", 3.4028234663852886e38),
              ("2^-149", 2.0 ** -149))
    cases = []
    for name, c in limits:
        points = _clamp_points(c)
        x = B(_f32_bits(points))
        cases.append(Case(f, name, recipe("fp32", (2,), len(points), x0=x, x1=x, grad_y=N(93), clamp=c)))
    return cases


def _family_misaligned_h(env: Json) -> List[Case]:
    # several rows per core (T > cores) with H off the 32-byte copy unit
    f, cores = "misaligned_h", int(env["vector_cores"])
    tokens = cores + 3
    return [Case(f, f"{dtype}-H{h}-T{tokens}", recipe(dtype, (tokens,), h, weight=_weight(94 + h),
                                                    clamp=clamp, seed=94 + h))
            for dtype, h, clamp in (("fp32", 9, None), ("fp32", 12, 2.5), ("bf16", 24, None), ("fp16", 10, 2.5),
                                    ("bf16", 16, None))]   # (the last is aligned: the control)


def _family_group_index(env: Json) -> List[Case]:
    f, cores = "group_index_edges", int(env["vector_cores"])
    tokens = cores + 8
    counts = {"none": None, "G0": [], "zero": [0], "T": [tokens], "beyond-T": [tokens, 5], "cores": [cores],
              "cores-minus-1": [cores - 1], "one": [1], "T-minus-1": [tokens - 1], "wraps-to-3": [2 ** 32 - 1, 4],
              "negative": [-1, 5], "many-zero-groups": [0] * 999 + [cores], "sum-2^32": [2 ** 31, 2 ** 31]}
    cases = [Case(f, name, recipe("fp32", (tokens,), 8, weight=_weight(95), group_index=groups, seed=95))
             for name, groups in counts.items()]
    cases += [Case(f, f"small-T4-{groups}", recipe("fp32", (4,), 16, group_index=groups, seed=96))
              for groups in ([3], [4])]
    return cases


def _family_zero_fill(env: Json) -> List[Case]:
    # rows past trunc on long rows: trunc = the core count, so no release's deadlock is involved
    f, cores = "zero_fill_large_h", int(env["vector_cores"])
    tokens = cores + 2
    return [Case(f, f"{dtype}-H{h}", recipe(dtype, (tokens,), h, group_index=[cores], seed=97))
            for dtype, h in (("fp32", 8192), ("fp32", 8191), ("bf16", 16384), ("bf16", 16383))]


def _family_weight_semantics(env: Json) -> List[Case]:
    f = "weight_semantics"
    weights = B(_f32_bits([1.0, 0.0, -0.0, -2.0, 0.5, float("inf"), float("nan"), 1e-30]))
    return [
        Case(f, "special-weights", recipe("fp32", (8,), 32, weight=weights, weight_shape="flat", seed=110)),
        Case(f, "special-weights-clamp", recipe("fp32", (8,), 32, weight=weights, weight_shape="flat", clamp=1.5,
                                                seed=111)),
        Case(f, "weight-column", recipe("fp32", (8,), 32, weight=_weight(112), weight_shape="column", seed=112)),
        Case(f, "weight-3d", recipe("bf16", (2, 4), 32, weight=_weight(113), weight_shape="column", seed=113)),
        Case(f, "weight-3d-flat", recipe("bf16", (2, 4), 32, weight=_weight(113), weight_shape="flat", seed=113)),
    ]


def _family_layouts(env: Json) -> List[Case]:
    f = "layouts_shapes"
    return [
        Case(f, "strided-in-and-out", recipe("fp32", (6,), 24, weight=_weight(120), clamp=2.0, layout="strided",
                                             seed=120)),
        Case(f, "strided-bf16-3d", recipe("bf16", (2, 3), 32, weight=_weight(121), layout="strided", seed=121)),
        Case(f, "one-shot", recipe("fp16", (5,), 40, weight=_weight(122), clamp=3.0, api="one_shot", seed=122)),
        Case(f, "plan-twice", recipe("fp32", (5,), 40, weight=_weight(123), api="plan", seed=123)),
        Case(f, "rank-1", recipe("fp32", (), 48, seed=124)),
        Case(f, "rank-8", recipe("fp32", (1, 1, 1, 1, 1, 2, 2), 8, weight=_weight(125), seed=125)),
        Case(f, "T0", recipe("fp32", (0,), 16, weight=_weight(126), seed=126)),
        Case(f, "H0", recipe("fp32", (5,), 0, weight=_weight(127), seed=127)),
        Case(f, "long-T", recipe("fp32", (300,), 4, seed=128)),
    ]


def _family_forward(env: Json) -> List[Case]:
    f = "forward_quant"
    forward = env.get("forward") or {}
    skip = None if forward.get("available") else forward.get("reason") or "the forward operator is not available"
    cases = []
    for dtype in ("bf16", "fp16"):
        for name, kwargs in (("e4m3fn-mode0", {"dst_type": "float8_e4m3fn", "quant_mode": 0}),
                             ("e5m2-mode0", {"dst_type": "float8_e5m2", "quant_mode": 0}),
                             ("e4m3fn-mode1", {"dst_type": "float8_e4m3fn", "quant_mode": 1, "block_size": 32})):
            cases.append(Case(f, f"{dtype}-{name}", recipe(dtype, (8,), 256, weight=_weight(130), weight_shape="flat",
                                                           api="forward", forward_kwargs=kwargs, seed=130), skip=skip))
    return cases


def _family_large_offsets(env: Json) -> List[Case]:
    # T x 2H = 2^32 + 2H elements: rows past 2^32 elements, each row a distinct constant
    rows = {"gen": "rows", "values": [1.0 + k / 256.0 for k in range(251)]}
    skip = None
    if env.get("backend") == "emulator":
        skip = ("the emulator computes the clean result here (docs/emulator.md) and would need about 24 GiB; "
                "this family is for a device")
    return [Case("large_offsets", "fp16-T65537-H32768", recipe("fp16", (65537,), 32768, grad_y=rows, x0=rows, x1=rows),
                 skip=skip)]


FAMILIES: Tuple[Family, ...] = (
    Family("determinism", "whether repeated runs give identical bits (split rows included)", _family_determinism),
    Family("fingerprint", "which UB factors the installed kernel tiles split rows with (9.1.0 or current), and "
           "whether many rows per core with an unaligned H stay clean", _family_fingerprint),
    Family("reduce_tree", "the ReduceSum tree of gradWeight for n = 1 ... 3408 (the lane folding of 65-256, the "
           "64-element chunks past 256)", _family_reduce_tree),
    Family("reduce_zero_sign", "the sign of a sum of -0.0 products (where +0.0 padding lanes take part)",
           _family_zero_sign),
    Family("exp_bits", "the device exp's bits where s = e (x0 < -17.4), its flush-to-zero threshold near -87.34, and "
           "e/(e+1) elsewhere", _family_exp_bits),
    Family("div_rounding", "the rounding of e/(e+1) and dsilu at x0 = +-2^k and next to them", _family_div_rounding),
    Family("overflow_edge", "where exp overflows (88.72284) and the NaN it gives, with and without clamp",
           _family_overflow_edge),
    Family("nan_payloads", "which NaN bits come out of NaNs in gy, x0, x1, yOrigin and weight, per dtype and clamp",
           _family_nan_payloads),
    Family("subnormals", "whether Mul and Add keep subnormal inputs and results (no flush-to-zero) on the vector "
           "units", _family_subnormals),
    Family("widening_rint", "exact fp16/bf16 widening (subnormals, inf) and round-half-even narrowing, overflow to "
           "inf", _family_widening_rint),
    Family("clamp_boundaries", "the strict masks at +-c and the double limit's rounding to fp32 (ties, inf, "
           "subnormal)", _family_clamp_boundaries),
    Family("misaligned_h", "whether H off the 32-byte unit with several rows per core pairs rows with shifted gradY",
           _family_misaligned_h),
    Family("group_index_edges", "trunc from the group counts (G = 0, wraps, negatives, beyond T) and the rows past it",
           _family_group_index),
    Family("zero_fill_large_h", "whether rows past trunc are zero-filled when 2H x element size >= 65536 bytes",
           _family_zero_fill),
    Family("weight_semantics", "gradWeight from the raw gy without clamp mask, special weights, weight shapes",
           _family_weight_semantics),
    Family("layouts_shapes", "strided inputs and outputs, the one-shot and plan paths, ranks 1 and 8, empty shapes",
           _family_layouts),
    Family("forward_quant", "aclnnSwigluGroupQuant's quantisation (when the installed package offers it)",
           _family_forward),
    Family("large_offsets", "whether T x 2H >= 2^32 elements wraps the kernel's 32-bit offsets (needs ~24 GiB)",
           _family_large_offsets, unsafe=True),
)
FAMILY_NAMES = tuple(f.name for f in FAMILIES)


def _hang_reason(env: Json, r: Json) -> Optional[str]:
    """Why a case must not run on this device: its groups leave 0 < trunc < min(T, cores) on a
    release that deadlocks there (or on a release nobody could name)."""
    from ._releases import host_trunc, is_affected

    if r.get("group_index") is None or r.get("api") == "forward":
        return None
    lead = r["lead"]
    tokens = int(np.prod(lead, dtype=np.int64)) if lead else 1
    trunc = host_trunc(r["group_index"], tokens)
    cores = int(env["vector_cores"])
    if not 0 < trunc < min(tokens, cores):
        return None
    release = env.get("cann_version")
    if release is None:
        return (f"trunc = {trunc} < min(T = {tokens}, {cores} cores) would hang the device on CANN 9.1.0, 9.1.1 or "
                "9.2.0-beta.1, and this install's release is unknown")
    if is_affected(release):
        return f"trunc = {trunc} < min(T = {tokens}, {cores} cores) hangs the device on CANN {release}"
    return None


def build_cases(env: Json, families: Sequence[str], unsafe: bool) -> List[Case]:
    cases: List[Case] = []
    for family in FAMILIES:
        if family.name not in families:
            continue
        for case in family.build(env):
            if case.skip is None and family.unsafe and not unsafe:
                case.skip = "a risky family: it runs only with --unsafe"
            if case.skip is None:
                case.skip = _hang_reason(env, case.recipe)
            cases.append(case)
    return cases


# ============================================================================ running and recording


class Progress:
    """Lines on stderr when it is a terminal; nothing in a pipe."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        if self.enabled:
            print(f"[{time.monotonic() - self.started:7.1f} s] {text}", file=sys.stderr, flush=True)


def _child_env(**updates: Optional[str]) -> Dict[str, str]:
    env = dict(os.environ)
    for key, value in updates.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def emulator_env(release: Optional[str], cores: int, abi: Optional[int]) -> Dict[str, str]:
    """A worker environment where the bundled emulator stands in for a device: its release (when
    the emulator knows it), its core count and its ABI revision; one kernel thread each."""
    from ._releases import RELEASES, normalise

    known = normalise(release) if release and normalise(release) in RELEASES else None
    return _child_env(ACL_SWIGLU_BACKEND="emulator", ACL_EMU_CANN_VERSION=known, ACL_EMU_VECTOR_CORES=str(cores),
                      ACL_SWIGLU_ABI=None if abi is None else str(abi),
                      ACL_EMU_THREADS=os.environ.get("ACL_EMU_THREADS", "1"))


def _run_cases(pool: Pool, cases: Sequence[Case], progress: Progress, what: str) -> Dict[int, Json]:
    jobs = [Job(i, c.recipe) for i, c in enumerate(cases) if c.skip is None]
    results: Dict[int, Json] = {}
    counts: Dict[str, int] = {}
    totals: Dict[str, int] = {}
    for i, c in enumerate(cases):
        if c.skip is None:
            totals[c.family] = totals.get(c.family, 0) + 1

    def done(job: Job) -> None:
        assert job.result is not None
        results[job.key] = job.result
        family = cases[job.key].family
        counts[family] = counts.get(family, 0) + 1
        if job.result.get("status") not in ("ok", "error", "refused"):
            progress.say(f"{what}: {family}/{cases[job.key].name}: {job.result.get('status')}: "
                         f"{(job.result.get('error') or {}).get('message', '')[:200]}")
        if counts[family] == totals[family]:
            progress.say(f"{what}: {family}: {counts[family]} case(s) done")

    pool.run(jobs, done)
    return results


def _fingerprint(env: Json, cases: Sequence[Case], device: Dict[int, Json], jobs: int, timeout: float,
                 progress: Progress) -> Json:
    """The release and cores the device reports, and which tiling its split rows follow: each
    discriminator's output against the emulator's under both tilings."""
    found: Json = {"release": env.get("cann_version"), "vector_cores": env.get("vector_cores"),
                   "vector_cores_source": env.get("vector_cores_source"), "tiling": "not measured"}
    keys = [i for i, c in enumerate(cases) if c.role == "tiling" and c.skip is None
            and (device.get(i) or {}).get("status") == "ok"]
    if not keys:
        return found
    verdicts = []
    for release, tiling in (("9.1.0", "9.1.0 factors"), ("9.2.0", "current factors")):
        pool = Pool(emulator_env(release, int(env["vector_cores"]), env.get("abi_revision")), min(jobs, len(keys)),
                    timeout)
        try:
            results = _run_cases(pool, [cases[i] for i in keys], progress, f"fingerprint ({tiling})")
        finally:
            pool.close()
        matches = [compare_results(device[k], results[j]) is None for j, k in enumerate(keys)]
        verdicts.append((tiling, all(matches)))
    fits = [tiling for tiling, ok in verdicts if ok]
    found["tiling"] = fits[0] if len(fits) == 1 else ("inconclusive" if fits else "neither")
    return found


def probe(args: argparse.Namespace) -> int:
    progress = Progress(sys.stderr.isatty())
    device_pool = Pool(_child_env(), args.jobs, args.timeout)
    try:
        env = device_pool.environment()
    except WorkerGone as gone:
        device_pool.close()
        print(f"acl-swiglu-probe: the backend could not be used ({gone.status}): {gone.detail}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    progress.say(f"backend {env['backend']}, CANN {env.get('cann_version')} ({env.get('cann_version_source')}), "
                 f"{env['vector_cores']} vector cores ({env['vector_cores_source']})")
    cases = build_cases(env, args.families, args.unsafe)
    for c in cases:
        if c.skip:
            progress.say(f"skipped {c.family}/{c.name}: {c.skip}")
    started = time.monotonic()
    try:
        device = _run_cases(device_pool, cases, progress, env["backend"])
    finally:
        device_pool.close()
    elapsed = time.monotonic() - started
    same_run = env["backend"] == "emulator"
    if same_run:
        emulated = device
    else:
        pool = Pool(emulator_env(env.get("cann_version"), int(env["vector_cores"]), env.get("abi_revision")),
                    args.jobs, args.timeout)
        try:
            emulated = _run_cases(pool, cases, progress, "emulator")
        except WorkerGone as gone:
            print(f"acl-swiglu-probe: the emulator could not be used ({gone.status}): {gone.detail}", file=sys.stderr)
            emulated = {}
        finally:
            pool.close()
    fingerprint = _fingerprint(env, cases, device, args.jobs, args.timeout, progress)
    record = _record(args, env, cases, device, emulated, same_run, fingerprint, elapsed)
    text = json.dumps(record, indent=1, sort_keys=False) + "\n"
    try:
        if args.out == "-":
            sys.stdout.write(text)
        else:
            with open(args.out, "w", encoding="utf-8") as handle:
                handle.write(text)
    except OSError as exc:
        print(f"acl-swiglu-probe: cannot write {args.out}: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    if args.out != "-":
        ran = sum(1 for c in record["cases"] if c["status"] != "skipped")
        agree = sum(1 for c in record["cases"] if (c.get("emulator") or {}).get("agrees"))
        print(f"acl-swiglu-probe: {ran} case(s) run, {len(record['cases']) - ran} skipped, {agree} agree with the "
              f"emulator; tiling {fingerprint['tiling']}; record written to {args.out}")
    return EXIT_OK


def _record(args: argparse.Namespace, env: Json, cases: Sequence[Case], device: Dict[int, Json],
            emulated: Dict[int, Json], same_run: bool, fingerprint: Json, elapsed: float) -> Json:
    entries = []
    families: Json = {}
    for family in FAMILIES:
        if family.name in args.families:
            families[family.name] = {"decides": family.decides, "unsafe": family.unsafe, "cases": 0, "skipped": 0,
                                     "agree": 0}
    for i, c in enumerate(cases):
        summary = families[c.family]
        summary["cases"] += 1
        entry: Json = {"family": c.family, "name": c.name, "recipe": c.recipe}
        if c.skip is not None:
            summary["skipped"] += 1
            entry.update(status="skipped", skip_reason=c.skip)
            entries.append(entry)
            continue
        result = device.get(i) or {"status": "crashed", "error": {"type": "worker", "message": "no result"}}
        entry["status"] = result.get("status")
        entry["device"] = result
        if same_run:
            entry["emulator"] = {"agrees": True, "same_run": True}
        elif i in emulated:
            differs = compare_results(result, emulated[i])
            entry["emulator"] = {"agrees": differs is None, "same_run": False}
            if differs is not None:
                entry["emulator"].update(differs=differs, result=emulated[i])
        summary["agree"] += int(bool((entry.get("emulator") or {}).get("agrees")))
        entries.append(entry)
    return {"format": RECORD_FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "options": {"families": list(args.families), "unsafe": args.unsafe, "timeout": args.timeout,
                        "jobs": args.jobs},
            "environment": env, "fingerprint": fingerprint, "seconds": round(elapsed, 2), "families": families,
            "cases": entries}


def load_record(path: str) -> Json:
    """A probe record, checked for its format; ValueError (with the reason) otherwise."""
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ValueError(f"{path} is not an acl-swiglu-probe record (format {RECORD_FORMAT!r})")
    if not isinstance(record.get("cases"), list) or not isinstance(record.get("environment"), dict):
        raise ValueError(f"{path} has no cases or no environment")
    return record


REPLAYABLE = ("ok", "error", "refused")


def check(args: argparse.Namespace) -> int:
    try:
        record = load_record(args.check)
    except ValueError as exc:
        print(f"acl-swiglu-probe: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    progress = Progress(sys.stderr.isatty())
    env = record["environment"]
    cases = [c for c in record["cases"] if c.get("family") in args.families]
    replay = [(i, c) for i, c in enumerate(cases) if c.get("status") in REPLAYABLE]
    from ._releases import RELEASES, normalise

    release = env.get("cann_version")
    if release and normalise(release) not in RELEASES:
        print(f"note: the emulator does not know CANN {release}; it replays as its default", file=sys.stderr)
    pool = Pool(emulator_env(release, int(env.get("vector_cores") or 56), env.get("abi_revision")), args.jobs,
                args.timeout)
    results: Dict[int, Json] = {}

    def on_replayed(job: Job) -> None:
        results[job.key] = job.result or {}
        progress.say(f"replayed {cases[job.key]['family']}/{cases[job.key]['name']}: {results[job.key].get('status')}")

    try:
        pool.run([Job(i, c["recipe"]) for i, c in replay], on_replayed)
    except WorkerGone as gone:
        print(f"acl-swiglu-probe: the emulator could not be used ({gone.status}): {gone.detail}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    finally:
        pool.close()
    table: Dict[str, List[int]] = {name: [0, 0, 0, 0] for name in FAMILY_NAMES if name in args.families}
    differences = []
    for i, c in enumerate(cases):
        row = table.setdefault(c["family"], [0, 0, 0, 0])
        row[0] += 1
        if i not in results:
            row[3] += 1
            continue
        recorded = c.get("device") or {}
        replayed = results[i]
        why = None
        if recorded.get("inputs_sha256") and replayed.get("inputs_sha256") != recorded.get("inputs_sha256"):
            why = "the recipe built other inputs here than where it was recorded"
        else:
            why = compare_results(recorded, replayed)
        if why is None:
            row[1] += 1
        else:
            row[2] += 1
            differences.append(f"{c['family']}/{c['name']}: {why}")
    print(f"record: {args.check} ({env.get('backend')}, CANN {release}, {env.get('vector_cores')} vector cores, "
          f"{env.get('soc')})")
    for line in differences:
        print(f"differs: {line}")
    print(f"{'family':<20} {'cases':>6} {'agree':>6} {'differ':>7} {'not replayed':>13}")
    totals = [0, 0, 0, 0]
    for name, row in table.items():
        if row[0] == 0:
            continue
        print(f"{name:<20} {row[0]:>6} {row[1]:>6} {row[2]:>7} {row[3]:>13}")
        totals = [a + b for a, b in zip(totals, row)]
    print(f"{'total':<20} {totals[0]:>6} {totals[1]:>6} {totals[2]:>7} {totals[3]:>13}")
    return EXIT_DIFFERS if differences else EXIT_OK


# ============================================================================ the command line


def _families(text: str) -> Tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in FAMILY_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown famil{'ies' if len(unknown) > 1 else 'y'} "
                                         f"{', '.join(unknown) or '(none given)'}; known: {', '.join(FAMILY_NAMES)}")
    return names


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be 1..64, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acl-swiglu-probe", description="Measure what this device does where the operator's public source "
        "leaves a question, and record it (docs/fidelity.md); or replay a record on the emulator (--check).",
        epilog="Exit status: 0 done (--check: all agree), 1 --check found a difference, 2 bad options, "
               "3 the backend, a worker, the output or the record could not be used.")
    parser.add_argument("--out", default="acl-swiglu-probe.json", metavar="PATH",
                        help="where to write the record (default acl-swiglu-probe.json; '-' for stdout)")
    parser.add_argument("--check", metavar="PATH", help="replay the record at PATH on the emulator and report, per "
                        "family, how many cases agree bit for bit")
    parser.add_argument("--families", type=_families, default=FAMILY_NAMES, metavar="A,B,...",
                        help="the families to run or replay (default: all; see --list-families)")
    parser.add_argument("--unsafe", action="store_true", help="also run the risky families (large_offsets: ~24 GiB)")
    parser.add_argument("--timeout", type=_timeout, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"time limit of each case (default {DEFAULT_TIMEOUT:g}); a case past it is killed and "
                             "recorded as a timeout")
    parser.add_argument("--jobs", type=_jobs, default=1, metavar="N", help="cases run at once, each in its own "
                        "child process (default 1)")
    parser.add_argument("--list-families", action="store_true", help="list the families and what each decides")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.list_families:
        for family in FAMILIES:
            print(f"{family.name:<20} {'(--unsafe) ' if family.unsafe else ''}{family.decides}")
        return EXIT_OK
    if args.check and args.unsafe:
        parser.error("--unsafe applies to a probe run, not to --check")
    try:
        return check(args) if args.check else probe(args)
    except KeyboardInterrupt:
        print("acl-swiglu-probe: interrupted", file=sys.stderr)
        return EXIT_ENVIRONMENT


if __name__ == "__main__":
    sys.exit(main())
