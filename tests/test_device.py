"""Device tests: the whole test grid against real CANN on an Ascend 950 (950PR / 950DT) host.

Every test here is marked ``device``. tests/conftest.py skips them unless ACL_SWIGLU_BACKEND=cann,
and in that mode it neither forces the emulator nor runs its leak check. The tests use only the
public API (one-shot NumPy call, device arrays on a stream, a reused plan, the sample CLI) and
judge every result against the float64 reference with the docs/operator.md (judging a result) verdict
(``reference.compare`` with ``reference.device_departures``): nothing here needs the emulator.

Running them on an Ascend host
------------------------------
::

    cd <this repository>
    source /usr/local/Ascend/ascend-toolkit/set_env.sh     # or <CANN root>/set_env.sh
    python3 -m venv venv && venv/bin/pip install '.[test]'
    ACL_SWIGLU_BACKEND=cann venv/bin/pytest -m device -rs -v tests/test_device.py

Run pytest from the repository root with the venv's own ``pytest`` executable, so that the
installed package (with its compiled parts) is imported, not the source tree. Options:
ACL_SWIGLU_DEVICE_ID=<n> picks the device (default 0); ACL_SWIGLU_ABI=1 if the installed CANN has
revision 1 of the operator (its first published form: aclIntArray groupIndex, clamp 0 = off) instead of
revision 2 (INT64 tensor groupIndex, clamp -1 = off; the default); a custom operator package is
found through ASCEND_CUSTOM_OPP_PATH / ASCEND_OPP_PATH. ``test_backend_is_real_cann`` fails if
the libraries loaded are not CANN's.

When a test fails, please send back:

1. the failing test id(s), e.g. ``tests/test_device.py::test_grid[plan-fp16-clamp-weight-partial-3d-noncontig]``;
2. the output of ``ACL_SWIGLU_BACKEND=cann python -m acl_swiglu --json``;
3. the output of ``ACL_SWIGLU_BACKEND=cann python -c "import acl_swiglu; print(acl_swiglu.backend_info())"``;
4. the CANN version: ``cat <root>/version.cfg`` with the root printed by 3. (older installs:
   the ascend-toolkit version file, ``cat /usr/local/Ascend/ascend-toolkit/latest/*/ascend_toolkit_install.info``),
   and if you can, ``npu-smi info`` (chip and driver);
5. the full pytest output of the run (``-rs -v``, not truncated);
6. if you can, the fidelity probe's record: ``ACL_SWIGLU_BACKEND=cann acl-swiglu-probe --out probe.json``
   (docs/fidelity.md), which measures what these tests only judge with a tolerance.

Self-check without a device: the bundled emulator is laid out like a CANN root, so
``ACL_SWIGLU_BACKEND=cann ACL_SWIGLU_LIB_DIR=<site-packages>/acl_swiglu/_emulator pytest -m device
tests/test_device.py`` runs this whole file through the CANN loading path on the emulator.
"""

from __future__ import annotations

import json
import math
import os
import re
import zlib
from contextlib import ExitStack

import ml_dtypes
import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import _loader, cli, reference

pytestmark = pytest.mark.device

DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
CLAMPS = {"noclamp": None, "clamp": 2.5}
WEIGHTS = {"noweight": False, "weight": True}
# T = 37 / 33; H = 80 is not a multiple of 64 but is of 16: shapes whose H is not a multiple of 8
# (fp32) or 16 (fp16/bf16) with more rows than cores meet a suspected device hazard
# (docs/cann_releases.md), which the fidelity probe measures (its misaligned_h family), not these tests.
RANKS = {"2d": ((37,), 48), "3d": ((3, 11), 80)}
LAYOUTS = ("contiguous", "noncontig")
APIS = ("one_shot", "device_stream", "plan")
# group_index values for T rows, and the trunc = min(sum, T) worked out by hand
GROUPS = {
    "none": (lambda t: None, lambda t: t),
    "partial": (lambda t: np.array([3, 5, 2], np.int64), lambda t: 10),
    "overT": (lambda t: np.array([t, 7], np.int64), lambda t: t),
    "zero_groups": (lambda t: np.zeros(0, np.int64), lambda t: 0),
}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


# ----------------------------------------------------------------------------- inputs


def make_inputs(seed, lead, h, dtype, with_weight, clamp):
    """Random inputs, with one row whose x0 overflows exp (89, 100: NaN on the device without
    clamp, a departure from the math) and flushes it (-100), and yOrigin = swiglu(x)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(lead + (2 * h,)) * 2.0
    if h >= 3 and math.prod(lead) >= 2:
        x.reshape(-1, 2 * h)[1, :3] = [89.0, 100.0, -100.0]   # exact in fp32, fp16 and bf16
    x = x.astype(dtype)
    grad_y = rng.standard_normal(lead + (h,)).astype(dtype)
    if not with_weight:
        return grad_y, x, None, None
    weight = (rng.random(lead + (1,)) + 0.5).astype(np.float32)
    y_origin = reference.swiglu(x, clamp).astype(dtype)
    return grad_y, x, weight, y_origin


def noncontig(a):
    """The same values as a strided view into a bigger NaN-filled array (rows and columns
    skipped), so that reading outside the view would show."""
    if a is None:
        return None
    big = np.full((a.shape[0] + 3,) + a.shape[1:-1] + (a.shape[-1] + 5,), np.nan, dtype=a.dtype)
    index = (slice(2, 2 + a.shape[0]),) + (slice(None),) * (a.ndim - 2) + (slice(1, 1 + a.shape[-1]),)
    big[index] = a
    view = big[index]
    assert not view.flags.c_contiguous and np.array_equal(view.view(UINT[a.itemsize]), a.view(UINT[a.itemsize]))
    return view


def every_other_row_strides(shape):
    strides = [1] * len(shape)
    step = 2 * shape[-1]
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = step
        step *= shape[i]
    return tuple(strides)


# ----------------------------------------------------------------------------- the verdict


def judge(what, inputs, grad_x, grad_weight, trunc):
    """docs/operator.md (judging a result) against the float64 reference, plus the operator's documented +0.0 rows."""
    grad_y, x, weight, y_origin, group_index, clamp = inputs
    golden_x, golden_w = reference.swiglu_group_quant_grad(grad_y, x, weight, y_origin, group_index, clamp)
    assert isinstance(grad_x, np.ndarray) and grad_x.shape == x.shape and grad_x.dtype == x.dtype, what
    departures = reference.device_departures(x, clamp, group_index)
    verdict = reference.compare(grad_x, golden_x, departures=departures)
    assert verdict.passed, f"{what}: gradX {verdict}"
    assert verdict.count + verdict.departures == x.size
    rows = math.prod(x.shape[:-1])
    tail = np.ascontiguousarray(grad_x).reshape(rows, x.shape[-1])[trunc:]
    assert np.all(tail.view(UINT[tail.itemsize]) == 0), f"{what}: gradX rows >= trunc {trunc} must be +0.0"
    if weight is None:
        assert grad_weight is None, what
        return verdict, None
    assert grad_weight.shape == weight.shape and grad_weight.dtype == np.float32, what
    verdict_w = reference.compare(grad_weight, golden_w)
    assert verdict_w.passed, f"{what}: gradWeight {verdict_w}"
    w_tail = np.ascontiguousarray(grad_weight).reshape(rows)[trunc:]
    assert np.all(w_tail.view(np.uint32) == 0), f"{what}: gradWeight rows >= trunc {trunc} must be +0.0"
    return verdict, verdict_w


# ----------------------------------------------------------------------------- the three APIs


def nan_device_array(stack, shape, dtype):
    """A fresh contiguous device array filled with NaN, so unwritten elements show."""
    array = stack.enter_context(acl_swiglu.DeviceArray.empty(shape, dtype))
    if array.size:
        array.copy_from(np.full(shape, np.nan, dtype=dtype))
    return array


def strided_nan_output(stack, shape, dtype):
    """A non-contiguous output: every other row of a bigger NaN-filled device buffer."""
    rows = math.prod(shape[:-1])
    filler = np.full(2 * rows * shape[-1], np.nan, dtype=dtype)
    buffer = stack.enter_context(acl_swiglu.DeviceBuffer(filler.nbytes))
    buffer.copy_from_host(filler)
    return stack.enter_context(acl_swiglu.DeviceArray.wrap(buffer.ptr, shape, dtype,
                                                           strides=every_other_row_strides(shape)))


def device_inputs(stack, inputs):
    """Device copies of the inputs (strided views stay strided) and groupIndex as this ABI takes it."""
    grad_y, x, weight, y_origin, group_index, _ = inputs
    arrays = [None if a is None else stack.enter_context(acl_swiglu.to_device(a))
              for a in (grad_y, x, weight, y_origin)]
    for host, dev in zip((grad_y, x, weight, y_origin), arrays):
        if host is not None and host.size:
            assert dev.is_contiguous == host.flags.c_contiguous
    if group_index is None or acl_swiglu.abi_revision() == 1:
        group = group_index            # revision 1: host values
    else:
        group = stack.enter_context(acl_swiglu.to_device(group_index))
    return arrays, group


def device_outputs(stack, x, weight, layout):
    if layout == "noncontig" and x.size:
        grad_x = strided_nan_output(stack, x.shape, x.dtype)
        grad_weight = strided_nan_output(stack, weight.shape, np.float32) if weight is not None else None
    else:
        grad_x = nan_device_array(stack, x.shape, x.dtype)
        grad_weight = nan_device_array(stack, weight.shape, np.float32) if weight is not None else None
    return grad_x, grad_weight


def run_one_shot(inputs, layout, trunc, what):
    grad_x, grad_weight = acl_swiglu.swiglu_group_quant_grad(*inputs)
    judge(what, inputs, grad_x, grad_weight, trunc)


def run_device_stream(inputs, layout, trunc, what):
    x, weight = inputs[1], inputs[2]
    with ExitStack() as stack:
        stream = stack.enter_context(acl_swiglu.Stream())
        arrays, group = device_inputs(stack, inputs)
        out_x, out_w = device_outputs(stack, x, weight, layout)
        got_x, got_w = acl_swiglu.swiglu_group_quant_grad_device(*arrays, group, inputs[5], grad_x=out_x,
                                                                 grad_weight=out_w, stream=stream)
        assert got_x is out_x and got_w is out_w
        stream.synchronize()
        judge(what, inputs, got_x.to_numpy(), None if got_w is None else got_w.to_numpy(), trunc)
        # the device inputs are left as they were
        for host, dev in zip(inputs[:4], arrays):
            if host is not None:
                assert np.array_equal(dev.to_numpy().view(UINT[host.itemsize]),
                                      np.ascontiguousarray(host).view(UINT[host.itemsize])), what
        # outputs the call allocates itself, on the same stream
        own_x, own_w = acl_swiglu.swiglu_group_quant_grad_device(*arrays, group, inputs[5], stream=stream)
        stack.enter_context(own_x)
        if own_w is not None:
            stack.enter_context(own_w)
        judge(what + " (allocated outputs)", inputs, own_x.to_numpy(),
              None if own_w is None else own_w.to_numpy(), trunc)


def run_plan(inputs_a, inputs_b, layout, trunc, what):
    """One plan, three launches: set A, set B (every address rebound), set A again."""
    x, weight, clamp = inputs_a[1], inputs_a[2], inputs_a[5]
    with ExitStack() as stack:
        stream = stack.enter_context(acl_swiglu.Stream())
        arrays_a, group_a = device_inputs(stack, inputs_a)
        arrays_b, group_b = device_inputs(stack, inputs_b)
        outs_a = device_outputs(stack, x, weight, layout)
        outs_b = device_outputs(stack, x, weight, layout)
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(
            *arrays_a, group_a, clamp, grad_x=outs_a[0], grad_weight=outs_a[1], stream=stream))
        names = ("grad_y", "x", "weight", "y_origin")

        def bind(arrays, group, outs):
            kwargs = {n: a for n, a in zip(names, arrays) if a is not None}
            if group is not None:
                kwargs["group_index"] = group
            kwargs["grad_x"] = outs[0]
            if outs[1] is not None:
                kwargs["grad_weight"] = outs[1]
            return kwargs

        for call, (arrays, group, outs, inputs) in enumerate((
                (arrays_a, group_a, outs_a, inputs_a),
                (arrays_b, group_b, outs_b, inputs_b),
                (arrays_a, group_a, outs_a, inputs_a))):
            if call == 2:   # make stale results show: refill set A's outputs with NaN
                for out in outs_a:
                    if out is not None and out.size and out.is_contiguous:
                        out.copy_from(np.full(out.shape, np.nan, out.dtype))
            got_x, got_w = plan(**bind(arrays, group, outs)) if call else plan()
            assert got_x is outs[0] and got_w is outs[1]
            stream.synchronize()
            judge(f"{what} (plan call {call + 1})", inputs, got_x.to_numpy(),
                  None if got_w is None else got_w.to_numpy(), trunc)


# ----------------------------------------------------------------------------- the grid


def _case(api, dtype, clamp, weight, group, rank, layout):
    return pytest.param(api, dtype, clamp, weight, group, rank, layout,
                        id=f"{api}-{dtype}-{clamp}-{weight}-{group}-{rank}-{layout}")


GRID = [_case(api, dtype, clamp, weight, group, rank, layout)
        for api in APIS for dtype in DTYPES for clamp in CLAMPS for weight in WEIGHTS for group in GROUPS
        for rank in RANKS for layout in LAYOUTS]


@pytest.mark.parametrize("api,dtype,clamp,weight,group,rank,layout", GRID)
def test_grid(api, dtype, clamp, weight, group, rank, layout):
    lead, h = RANKS[rank]
    rows = math.prod(lead)
    values, trunc_of = GROUPS[group]
    group_index, trunc = values(rows), trunc_of(rows)
    seed = zlib.crc32(f"{dtype}-{clamp}-{weight}-{group}-{rank}".encode())

    def inputs_for(seed):
        grad_y, x, w, y_origin = make_inputs(seed, lead, h, DTYPES[dtype], WEIGHTS[weight], CLAMPS[clamp])
        if layout == "noncontig":
            grad_y, x, w, y_origin = map(noncontig, (grad_y, x, w, y_origin))
        return (grad_y, x, w, y_origin, group_index, CLAMPS[clamp])

    inputs = inputs_for(seed)
    what = f"{api} {dtype} {clamp} {weight} groups={group} {rank} {layout}"
    if api == "one_shot":
        run_one_shot(inputs, layout, trunc, what)
    elif api == "device_stream":
        run_device_stream(inputs, layout, trunc, what)
    else:
        run_plan(inputs, inputs_for(seed + 1), layout, trunc, what)


# ----------------------------------------------------------------------------- empty inputs

EMPTY = {"T0_2d": ((0,), 16), "B0_3d": ((0, 3), 16), "S0_3d": ((2, 0), 16), "H0_2d": ((5,), 0), "H0_3d": ((2, 3), 0)}


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("weight", list(WEIGHTS))
@pytest.mark.parametrize("case", list(EMPTY))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_empty_inputs(api, weight, case, dtype):
    lead, h = EMPTY[case]
    rows = math.prod(lead)
    dt = DTYPES[dtype]
    grad_y = np.ones(lead + (h,), dt)
    x = np.ones(lead + (2 * h,), dt)
    w = np.full(lead + (1,), 0.5, np.float32) if WEIGHTS[weight] else None
    y_origin = np.ones(lead + (h,), dt) if WEIGHTS[weight] else None
    for clamp, group_index in ((None, None), (1.5, np.array([2], np.int64))):
        inputs = (grad_y, x, w, y_origin, group_index, clamp)
        trunc = rows if group_index is None else min(2, rows)
        what = f"{api} {dtype} {case} {weight} clamp={clamp}"
        if api == "one_shot":
            run_one_shot(inputs, "contiguous", trunc, what)
        elif api == "device_stream":
            run_device_stream(inputs, "contiguous", trunc, what)
        else:
            run_plan(inputs, inputs, "contiguous", trunc, what)
        if w is not None and h == 0:
            # an empty sum: gradWeight is +0.0 for every row
            gx, gw = acl_swiglu.swiglu_group_quant_grad(*inputs)
            assert gw.shape == w.shape and np.all(gw.view(np.uint32) == 0)
            assert gx.size == 0


# ----------------------------------------------------------------------------- backend and CLI


def _self_check_mode() -> bool:
    """ACL_SWIGLU_LIB_DIR deliberately points at the bundled emulator (the docstring's self-check)."""
    lib_dir = os.environ.get("ACL_SWIGLU_LIB_DIR")
    return bool(lib_dir) and os.path.realpath(lib_dir) == os.path.realpath(_loader.EMULATOR_ROOT)


def test_backend_is_real_cann():
    info = acl_swiglu.backend_info()
    assert info.requested == "cann"
    for path in (info.runtime, info.meta, info.operator):
        assert os.path.isabs(path) and os.path.isfile(path), path
    assert os.path.basename(info.operator) in ("libcust_opapi.so", "libopapi_nn.so", "libopapi.so")
    if _self_check_mode():
        assert info.backend == "emulator" and info.emulator_version.startswith("acl-swiglu-emulator")
        assert os.path.realpath(info.root) == os.path.realpath(_loader.EMULATOR_ROOT)
    else:
        assert info.backend == "cann", f"the device tests loaded {info}"
        assert info.emulator_version is None
        assert info.root is None or not os.path.realpath(info.root).startswith(
            os.path.realpath(_loader.EMULATOR_ROOT))


def _example_inputs():
    i = np.arange(512 * 1024, dtype=np.float64)
    grad_y = ((np.arange(512 * 512) % 10) * 0.1).reshape(512, 512).astype(np.float16)
    x = (((i % 20) - 10) * 0.5).reshape(512, 1024).astype(np.float16)
    weight = (((np.arange(512) % 5) + 1) * 0.2).reshape(512, 1).astype(np.float32)
    y_origin = (((np.arange(512 * 512) % 8) + 1) * 0.3).reshape(512, 512).astype(np.float16)
    return grad_y, x, weight, y_origin, np.array([256, 256], np.int64), 1.0


def test_documented_example_cli(capsys):
    rc = cli.main([])
    out = capsys.readouterr().out
    lines = out.splitlines()
    info = acl_swiglu.backend_info()
    name = "CPU emulator" if info.backend == "emulator" else "CANN"
    assert lines[0] == (f"backend: {name} (ABI revision {acl_swiglu.abi_revision()}), "
                        f"root {info.root or '(system loader)'}")
    assert lines[2] == "gradY [512, 512] x [512, 1024] fp16, weight [512, 1], groupIndex [256, 256], clamp 1.0"
    assert lines[-1] == "verdict: PASS", out
    assert rc == 0
    golden_x, golden_w = reference.swiglu_group_quant_grad(*_example_inputs())
    printed = {}
    for line in lines:
        m = re.match(r"^(gradX|gradWeight)\[(\d)\] = (-?\d+\.\d{6})$", line)
        if m:
            printed.setdefault(m.group(1), []).append(float(m.group(3)))
    assert len(printed["gradX"]) == 10 and len(printed["gradWeight"]) == 10
    for value, golden in zip(printed["gradX"], golden_x.reshape(-1)[:10]):
        assert abs(value - golden) <= 1e-3 + 1e-3 * abs(golden) + 0.5e-6, (value, golden)
    for value, golden in zip(printed["gradWeight"], golden_w.reshape(-1)[:10]):
        assert abs(value - golden) <= 1e-4 + 1e-4 * abs(golden) + 0.5e-6, (value, golden)


def test_documented_example_cli_json(capsys):
    rc = cli.main(["--json", "--repeat", "5"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["ok"] is True and report["exit_status"] == 0
    assert report["backend"] == acl_swiglu.backend_info().as_dict()
    assert report["check"]["passed"] is True
    assert report["check"]["grad_x"]["count"] + report["check"]["grad_x"]["departures"] == 512 * 1024
    assert report["check"]["grad_weight"]["count"] == 512
    for key in ("phase1", "phase2_sync", "plan_sync"):
        assert report["timing"][key]["n"] == 5
        assert 0 < report["timing"][key]["min_us"] <= report["timing"][key]["median_us"]
    # the one-shot API gives what the CLI printed
    gx, gw = acl_swiglu.swiglu_group_quant_grad(*_example_inputs())
    assert [float(v) for v in gx.reshape(-1)[:10].astype(np.float64)] == report["grad_x_first"]
    assert [float(v) for v in gw.reshape(-1)[:10]] == report["grad_weight_first"]
