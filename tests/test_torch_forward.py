"""acl_swiglu.torch's forward: the torch.library operator torch.ops.acl_swiglu.swiglu_group_quant
(CPU kernel, the NPU kernel on emulator memory, the fake implementation), the tensor-level
swiglu_group_quant and dequantise, and swiglu_quant, the forward operator paired with the
backward operator for training; traced by torch.compile and torch.export."""

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="acl_swiglu.torch needs torch (pip install 'acl-swiglu[torch]')")

import acl_swiglu  # noqa: E402
import acl_swiglu.torch as at  # noqa: E402
from acl_swiglu import _torch_forward, bfloat16, formats, reference  # noqa: E402
from npu_stand_in import npu_stand_in as stand_in  # noqa: E402

OP = torch.ops.acl_swiglu.swiglu_group_quant.default
E8M0 = getattr(torch, "float8_e8m0fnu", torch.uint8)
TORCH_CODES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}


def _random(shape, dtype, seed, scale=2.0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * scale).to(dtype)


def _weight(rows, seed):
    return torch.rand(rows, generator=torch.Generator().manual_seed(seed)) + 0.5


def _numpy(tensor):
    """A copy of the tensor's values as NumPy (bfloat16 through its bits)."""
    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy().view(bfloat16).copy()
    return tensor.numpy().copy()


def _bytes(tensor):
    """The tensor's bytes, whatever its dtype."""
    return tensor.detach().contiguous().view(torch.uint8).numpy().copy()


# (dst_type, quant_mode): every destination type of modes 0 and 1
KINDS = [("float8_e4m3fn", 0), ("float8_e5m2", 0), ("float8_e4m3fn", 1), ("float8_e5m2", 1),
         ("float4_e2m1fn", 1), ("float4_e1m2", 1)]
OPTIONS = [dict(), dict(weighted=True), dict(clamp_limit=1.5),
           dict(weighted=True, clamp_limit=0.75, group_index=[3, 2]),
           dict(group_index=[9, 4]), dict(round_scale=True)]


def _call_options(option, rows, dst, mode):
    weight = _weight(rows, 7) if option.get("weighted") else None
    group = option.get("group_index")
    round_scale = mode == 1 or option.get("round_scale", False)
    return weight, (None if group is None else torch.tensor(group, dtype=torch.int64)), dict(
        dst_type=dst, quant_mode=mode, round_scale=round_scale, clamp_limit=option.get("clamp_limit"))


# ---- the operator on CPU tensors ----


@pytest.mark.parametrize("dst,mode", KINDS)
@pytest.mark.parametrize("option", range(len(OPTIONS)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_operator_is_byte_identical_to_the_numpy_call(dst, mode, option, dtype):
    if mode == 1 and OPTIONS[option].get("round_scale") is not None:
        option = 0   # (mode 1 always rounds: that case is option 0)
    x = _random((2, 4, 512), dtype, option)
    weight, group_index, options = _call_options(OPTIONS[option], 8, dst, mode)
    clamp = options["clamp_limit"]
    y, y_scale, y_origin = OP(x, None if weight is None else weight.reshape(2, 4, 1), group_index,
                              dst_type=at.dst_type_code(dst), quant_mode=mode, round_scale=options["round_scale"],
                              clamp_limit=-1.0 if clamp is None else clamp)
    expect_y, expect_scale = acl_swiglu.swiglu_group_quant(
        _numpy(x), None if weight is None else weight.numpy(), None if group_index is None else group_index.numpy(),
        **options)
    kind = formats.DST_TYPES[dst]
    assert y.dtype == (torch.uint8 if kind.packed else getattr(torch, dst))
    assert tuple(y.shape) == expect_y.shape and tuple(y_scale.shape) == expect_scale.shape
    assert y_scale.dtype == (torch.float32 if mode == 0 else E8M0)
    np.testing.assert_array_equal(_bytes(y), expect_y.view(np.uint8))
    np.testing.assert_array_equal(_bytes(y_scale), expect_scale.view(np.uint8))
    assert y_origin.shape == (0,) and y_origin.dtype == dtype   # never written in modes 0 and 1
    # And the reference passes them, as it would a device's codes and scales.
    verdict = reference.compare_quantised(_bytes(y), _bytes(y_scale) if mode == 1 else y_scale.numpy(), _numpy(x),
                                          None if weight is None else weight.numpy(),
                                          None if group_index is None else group_index.numpy(), **options)
    assert verdict.passed, verdict


def test_rows_past_the_truncation_are_zero():
    x = _random((6, 256), torch.bfloat16, 1)
    y, y_scale = at.swiglu_group_quant(x, group_index=torch.tensor([2, 2]), dst_type="float8_e4m3fn")
    assert torch.count_nonzero(_bytes_tensor(y[:4])) > 0
    assert not _bytes_tensor(y[4:]).any() and not y_scale[4:].any()


def _bytes_tensor(tensor):
    return tensor.view(torch.uint8)


def test_outputs_are_fresh_and_inputs_untouched():
    x = _random((4, 256), torch.float16, 2)
    before = x.clone()
    first = at.swiglu_group_quant(x, dst_type="float8_e5m2")
    second = at.swiglu_group_quant(x, dst_type="float8_e5m2")
    assert torch.equal(x, before)
    assert first[0].data_ptr() != second[0].data_ptr()
    assert torch.equal(_bytes_tensor(first[0]), _bytes_tensor(second[0]))


@pytest.mark.parametrize("view", ["transposed", "offset_3d"])
def test_any_strides_and_storage_offset(view):
    if view == "transposed":
        x = _random((512, 6), torch.bfloat16, 3).t()
    else:
        x = _random((3, 4, 5, 512), torch.bfloat16, 3)[1, :, 1:4]
    assert not x.is_contiguous()
    y, y_scale = at.swiglu_group_quant(x, dst_type="float8_e4m3fn", quant_mode=1)
    expect_y, expect_scale = at.swiglu_group_quant(x.contiguous(), dst_type="float8_e4m3fn", quant_mode=1)
    assert torch.equal(_bytes_tensor(y), _bytes_tensor(expect_y))
    assert torch.equal(_bytes_tensor(y_scale), _bytes_tensor(expect_scale))


# ---- dst_type: names and torch dtypes for people, numbers for the schema ----


def test_dst_type_numbers_are_the_extensions():
    assert [at.dst_type_code(name) for name in ("float8_e5m2", "float8_e4m3fn", "float4_e2m1fn", "float4_e1m2")] == \
        [256 + 35, 256 + 36, 256 + 40, 256 + 41]
    assert at.dst_type_code(torch.float8_e4m3fn) == 292
    assert OP._schema.arguments[4].default_value == 291   # float8_e5m2 by default, as the extension's
    x = _random((2, 256), torch.float16, 4)
    by_default = OP(x)[0]
    for number in (291, 23):   # 23: torch's ScalarType number of float8_e5m2
        assert torch.equal(_bytes_tensor(OP(x, dst_type=number)[0]), _bytes_tensor(by_default))
    assert by_default.dtype == torch.float8_e5m2
    assert OP(x, dst_type=24)[0].dtype == torch.float8_e4m3fn


def test_dst_type_given_as_a_name_a_dtype_or_ml_dtypes_but_never_a_number():
    import ml_dtypes
    x = _random((2, 256), torch.bfloat16, 5)
    results = [at.swiglu_group_quant(x, dst_type=dst)[0] for dst in
               ("float8_e4m3fn", torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn)]
    assert all(torch.equal(_bytes_tensor(r), _bytes_tensor(results[0])) for r in results)
    with pytest.raises(TypeError, match="dst_type"):
        at.swiglu_group_quant(x, dst_type=292)
    with pytest.raises(acl_swiglu.ArgumentError, match="torch.float16 is not a destination type"):
        at.swiglu_group_quant(x, dst_type=torch.float16)
    with pytest.raises(acl_swiglu.ArgumentError, match="dst_type 7 is no destination type's number"):
        OP(x, dst_type=7)


def test_round_scale_defaults_by_mode_and_hifloat8_modes_are_refused():
    x = _random((2, 256), torch.bfloat16, 6) * 3
    plain = at.swiglu_group_quant(x, dst_type="float8_e4m3fn")[1]
    rounded = at.swiglu_group_quant(x, dst_type="float8_e4m3fn", round_scale=True)[1]
    mantissas = torch.frexp(rounded)[0]
    assert torch.all(mantissas == 0.5)   # powers of two
    assert not torch.all(torch.frexp(plain)[0] == 0.5)
    assert at.swiglu_group_quant(x, dst_type="float8_e4m3fn", quant_mode=1)[1].dtype == E8M0   # None: True in mode 1
    with pytest.raises(acl_swiglu.ArgumentError, match="round_scale must be True"):
        at.swiglu_group_quant(x, dst_type="float8_e4m3fn", quant_mode=1, round_scale=False)
    with pytest.raises(acl_swiglu.ArgumentError, match="quant_mode 3 .HiFloat8. needs scale"):
        at.swiglu_group_quant(x, dst_type="hifloat8", quant_mode=3)


BAD = [
    (lambda x: dict(x=x.float()), "x has dtype float32; quant_mode 0 takes float16 or bfloat16"),
    (lambda x: dict(x=x[:, :128]), "x's last dim is 128; it must be a multiple of 256"),
    (lambda x: dict(x=x[0]), "x has 1 dims"),
    (lambda x: dict(x=x[:0]), "is empty"),
    (lambda x: dict(x=x, weight=torch.ones(4, 1, dtype=torch.float16)), "weight has dtype float16"),
    (lambda x: dict(x=x, weight=torch.ones(5)), "weight has shape"),
    (lambda x: dict(x=x, group_index=torch.ones(2, dtype=torch.int32)), "group_index has dtype int32"),
    (lambda x: dict(x=x, group_index=torch.ones(2, 1, dtype=torch.int64)), "group_index must be 1-D"),
    (lambda x: dict(x=x, scale=torch.ones(1)), "scale is given but quant_mode 0 does not read it"),
    (lambda x: dict(x=x, dst_type=at.dst_type_code("float4_e2m1fn")), "is produced by quant_mode 1"),
    (lambda x: dict(x=x, output_origin=True), "output_origin must be False in quant_mode 0"),
    (lambda x: dict(x=x, block_size=64), "block_size must be 0 or 128"),
    (lambda x: dict(x=x, quant_mode=5), "quant_mode 5 belongs to aclnnSwigluGroupQuantV2"),
    (lambda x: dict(x=x, clamp_limit=0.0), "clamp_limit must be -1.0 .off. or > 0"),
    (lambda x: dict(x=x, dst_type_max=56.0), "dst_type_max is given but quant_mode 0 does not read it"),
    (lambda x: dict(x=x, weight=torch.ones(4, device="meta")), "weight is on meta but x is on cpu"),
    (lambda x: dict(x=x.to(torch.int16)), "x has dtype int16"),
]


@pytest.mark.parametrize("make,message", BAD)
def test_bad_arguments_are_refused_by_name(make, message):
    kwargs = make(_random((4, 256), torch.bfloat16, 8))
    with pytest.raises(acl_swiglu.ArgumentError, match=message):
        OP(kwargs.pop("x"), **kwargs)


@pytest.mark.parametrize("make,message", BAD)
def test_the_fake_implementation_refuses_as_the_kernel_does(make, message):
    from torch._subclasses.fake_tensor import FakeTensorMode
    kwargs = make(_random((4, 256), torch.bfloat16, 8))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fakes = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) and v.device.type != "meta" else v
                 for k, v in kwargs.items()}
        with pytest.raises(acl_swiglu.ArgumentError, match=message):
            OP(fakes.pop("x"), **fakes)


@pytest.mark.parametrize("dst,mode", KINDS)
def test_the_fake_implementation_gives_the_kernels_shapes_and_dtypes(dst, mode):
    x = _random((3, 2, 512), torch.float16, 9)
    code = at.dst_type_code(dst)
    real = OP(x, dst_type=code, quant_mode=mode, round_scale=mode == 1)
    meta = OP(x.to("meta"), dst_type=code, quant_mode=mode, round_scale=mode == 1)   # no data: meta tensors
    for got, expected in zip(meta, real):
        assert got.device.type == "meta"
        assert (got.shape, got.dtype) == (expected.shape, expected.dtype)


def test_opcheck():
    x = _random((2, 3, 256), torch.bfloat16, 10)
    weight = _weight(6, 11).reshape(2, 3, 1)
    samples = [
        ((x,), dict(dst_type=at.dst_type_code("float8_e4m3fn"))),
        ((x, weight, torch.tensor([4])), dict(dst_type=at.dst_type_code("float8_e5m2"), clamp_limit=1.0,
                                              round_scale=True)),
        ((x, weight), dict(dst_type=at.dst_type_code("float8_e4m3fn"), quant_mode=1, round_scale=True)),
        ((x,), dict(dst_type=at.dst_type_code("float4_e2m1fn"), quant_mode=1, round_scale=True, block_size=32)),
    ]
    for args, kwargs in samples:
        results = torch.library.opcheck(OP, args, kwargs)
        assert set(results.values()) == {"SUCCESS"}, results


def test_the_tensor_level_calls_refuse_sparse_tensors_by_name():
    x = _random((4, 256), torch.bfloat16, 8)
    sparse = torch.ones(2, dtype=torch.int64).to_sparse()
    for call in (at.swiglu_group_quant, at.swiglu_quant):
        with pytest.raises(acl_swiglu.ArgumentError, match="group_index is a torch.sparse_coo tensor"):
            call(x, None, sparse, dst_type="float8_e4m3fn")
        with pytest.raises(TypeError, match="weight must be a torch.Tensor or None, got list"):
            call(x, [1.0] * 4, dst_type="float8_e4m3fn")


def test_the_operator_has_no_derivative():
    x = _random((2, 256), torch.bfloat16, 12).requires_grad_()
    y, y_scale, _ = OP(x, dst_type=at.dst_type_code("float8_e4m3fn"))
    with pytest.raises(NotImplementedError, match="has no derivative"):
        y.float().sum().backward()


# ---- dequantise ----


@pytest.mark.parametrize("dst,mode", KINDS)
def test_dequantise_gives_the_values_codes_and_scales_stand_for(dst, mode):
    x = _random((5, 512), torch.bfloat16, 13)
    y, y_scale = at.swiglu_group_quant(x, dst_type=dst, quant_mode=mode)
    kind = formats.DST_TYPES[dst]
    got = at.dequantise(y, y_scale, dst_type=dst if kind.packed else None)
    # From the NumPy side: codes decoded by ml_dtypes / formats.unpack_fp4, scales per block or group.
    codes = formats.unpack_fp4(_bytes(y), dst) if kind.packed else _bytes(y).view(kind.storage_dtype).astype(np.float32)
    scales = formats.e8m0_scales(_bytes(y_scale)).reshape(5, -1) if mode == 1 else y_scale.numpy()
    per = 32 if mode == 1 else 128
    expected = (codes.reshape(5, -1, per) * scales[..., None]).reshape(5, 256)
    np.testing.assert_array_equal(got.numpy(), expected)
    # And they are SwiGLU's values to within the format's precision, relative to each block's
    # largest value amax. Mode 0 scales amax to the largest code: the error is at most half the
    # code step at the top, over the largest code (E4M3: 16 / 448 = 1/28; E5M2: 4096 / 57344 =
    # 1/14). Mode 1's power-of-two scale puts amax in the top binade, [2^emax, 2^(emax+1)):
    # half a step there is 2^-(m+1) of amax, m the mantissa bits (E4M3 1/16, E5M2 and E1M2 1/8,
    # E2M1 1/4). A small slack covers y's own fp32 (and, for FP4, x-format) rounding.
    exact = reference.swiglu(_numpy(x)).astype(np.float32).reshape(5, -1, per)
    amax = np.abs(exact).max(axis=-1, keepdims=True)
    bound = {("float8_e4m3fn", 0): 1 / 28, ("float8_e5m2", 0): 1 / 14, ("float8_e4m3fn", 1): 1 / 16,
             ("float8_e5m2", 1): 1 / 8, ("float4_e2m1fn", 1): 1 / 4, ("float4_e1m2", 1): 1 / 8}[dst, mode]
    assert np.all(np.abs(expected.reshape(5, -1, per) - exact) <= bound * (1 + 2.0**-6) * amax)


def test_dequantise_in_other_dtypes_and_refusals():
    x = _random((2, 512), torch.float16, 14)
    y, y_scale = at.swiglu_group_quant(x, dst_type="float8_e4m3fn")   # two scales a row
    assert torch.equal(at.dequantise(y, y_scale, dtype=torch.bfloat16), at.dequantise(y, y_scale).bfloat16())
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype"):
        at.dequantise(y, y_scale, dtype=torch.int32)
    with pytest.raises(acl_swiglu.ArgumentError, match="does not match y's dtype"):
        at.dequantise(y, y_scale, dst_type="float8_e5m2")
    with pytest.raises(acl_swiglu.ArgumentError, match="dst_type must say which FP4 type"):
        at.dequantise(y.view(torch.uint8), y_scale)
    with pytest.raises(acl_swiglu.ArgumentError, match="y_scale has shape"):
        at.dequantise(y, y_scale[:, :1])
    with pytest.raises(acl_swiglu.ArgumentError, match="y_scale is torch.float16"):
        at.dequantise(y, y_scale.half())


def test_dequantise_reads_e8m0_bytes_exactly():
    scales = torch.tensor([[[0, 1], [127, 254]]], dtype=torch.uint8)   # 2^-127 (subnormal) ... 2^127
    codes = torch.ones((1, 128), dtype=torch.float32).to(torch.float8_e4m3fn)
    values = at.dequantise(codes, scales)
    assert values[0, ::32].tolist() == [2.0**-127, 2.0**-126, 1.0, 2.0**127]
    nan = at.dequantise(codes, torch.full((1, 2, 2), 255, dtype=torch.uint8))
    assert torch.isnan(nan).all()


# ---- swiglu_quant: the forward operator, differentiated through the backward operator ----


def _plain_swiglu(x, weight, clamp_limit, trunc):
    """weight * silu(x0c) * x1c in float64 by plain torch ops (clamp by strict masks, as the
    backward operator's), rows from trunc on zero: its autograd gradient is the reference."""
    gate, value = x.double().chunk(2, dim=-1)
    if clamp_limit is not None:
        c = torch.tensor(clamp_limit, dtype=torch.float64)
        gate = torch.where(gate < c, gate, c)
        value = torch.where(value < c, torch.where(value > -c, value, -c), c)
    y = gate * torch.sigmoid(gate) * value
    if weight is not None:
        y = y * weight.double().reshape(*x.shape[:-1], 1)
    rows = torch.arange(math.prod(x.shape[:-1])).reshape(*x.shape[:-1], 1)
    return torch.where(rows < trunc, y, torch.zeros((), dtype=torch.float64))


@pytest.mark.parametrize("dst,mode", [("float8_e4m3fn", 0), ("float8_e5m2", 1), ("float4_e2m1fn", 1)])
@pytest.mark.parametrize("weighted,clamp_limit,group", [(False, None, None), (True, None, None), (True, 1.0, [5, 1])])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gradients_are_the_unquantised_swiglus_straight_through(dst, mode, weighted, clamp_limit, group, dtype):
    rows = 8
    x = _random((rows, 512), dtype, 20).requires_grad_()
    weight = _weight(rows, 21).requires_grad_() if weighted else None
    group_index = None if group is None else torch.tensor(group, dtype=torch.int64)
    result = at.swiglu_quant(x, weight, group_index, dst_type=dst, quant_mode=mode, clamp_limit=clamp_limit)
    assert not result.y.requires_grad and not result.y_scale.requires_grad
    assert result.dequantised.dtype == dtype
    kind = formats.DST_TYPES[dst]
    expect_values = at.dequantise(result.y, result.y_scale, dst_type=dst if kind.packed else None, dtype=dtype)
    assert torch.equal(result.dequantised.detach(), expect_values)   # the values of the codes, rounded once
    upstream = _random((rows, 256), dtype, 22, scale=1.0)
    (result.dequantised.float() * upstream.float()).sum().backward()

    x64 = x.detach().double().requires_grad_()
    w64 = None if weight is None else weight.detach().double().requires_grad_()
    trunc = rows if group is None else min(sum(group), rows)
    (_plain_swiglu(x64, w64, clamp_limit, trunc) * upstream.double()).sum().backward()
    # The backward operator computes in fp32 from x, weight and the upstream gradient (rounded
    # to x's dtype, as grad_y is): its grad_x is then rounded once to x's dtype, so it is within
    # a few units of x's rounding (2^-11 fp16, 2^-8 bf16) of the float64 gradient, relative to
    # the gradient's scale per row (elements that nearly cancel carry an absolute error of that
    # scale, not a relative one).
    unit = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
    scale = x64.grad.abs().amax(dim=-1, keepdim=True) + 1e-30
    assert torch.all((x.grad.double() - x64.grad).abs() <= 4 * unit * scale), (x.grad.double() - x64.grad).abs().max()
    if weighted:
        # grad_weight: a row's sum over H of upstream * y_origin in fp32, where y_origin is the
        # unweighted output rounded to x's dtype (one unit of its rounding per element); the sum
        # of H = 256 such terms is then within a unit of the sum of absolute terms.
        terms = (_plain_swiglu(x64.detach(), None, clamp_limit, trunc) * upstream.double()).abs().sum(dim=-1)
        assert torch.all((weight.grad.double() - w64.grad).abs() <= 2 * unit * terms + 1e-6)
    if group is not None:
        assert not x.grad[trunc:].any()   # rows past the truncation get no gradient


def test_weights_of_other_dtypes_and_shapes_get_gradients_in_kind():
    x = _random((2, 3, 256), torch.bfloat16, 23).requires_grad_()
    flat = _weight(6, 24).bfloat16().requires_grad_()
    by_rows = flat.detach().float().reshape(2, 3, 1).requires_grad_()
    for weight in (flat, by_rows):
        at.swiglu_quant(x, weight, dst_type="float8_e4m3fn").dequantised.float().sum().backward()
    assert flat.grad.dtype == torch.bfloat16 and flat.grad.shape == (6,)
    assert torch.equal(flat.grad, by_rows.grad.reshape(6).bfloat16())


def test_swiglu_quant_refuses_bad_arguments():
    x = _random((2, 256), torch.bfloat16, 25)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        at.swiglu_quant(_numpy(x), dst_type="float8_e4m3fn")
    with pytest.raises(TypeError, match="dst_type"):
        at.swiglu_quant(x, dst_type=36)
    with pytest.raises(acl_swiglu.ArgumentError, match="clamp_limit must be None .off. or > 0"):
        at.swiglu_quant(x, dst_type="float8_e4m3fn", clamp_limit=-1.0)
    with pytest.raises(acl_swiglu.ArgumentError, match="weight has 3 elements"):
        at.swiglu_quant(x, torch.ones(3), dst_type="float8_e4m3fn")


# ---- torch.compile and torch.export ----


def _training_step(x, weight, group_index):
    result = at.swiglu_quant(x, weight, group_index, dst_type=torch.float8_e4m3fn, quant_mode=1, clamp_limit=2.0)
    return result.dequantised.float().square().sum(), result.y, result.y_scale


def test_compile_a_training_step_fullgraph_with_dynamic_rows():
    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_training_step, fullgraph=True, dynamic=True, backend=counter)
    frames = None
    for rows in (12, 20, 7):
        grads = []
        for fn in (compiled, _training_step):
            x = _random((rows, 256), torch.bfloat16, rows).requires_grad_()
            weight = _weight(rows, rows).requires_grad_()
            loss, y, y_scale = fn(x, weight, torch.tensor([rows - 2], dtype=torch.int64))
            loss.backward()
            grads.append((loss.detach(), _bytes_tensor(y), _bytes_tensor(y_scale), x.grad, weight.grad))
        for got, expected in zip(*grads):
            assert torch.equal(got, expected)   # the same operators on the same values
        frames = frames or counter.frame_count
        assert counter.frame_count == frames, f"T={rows} recompiled: the graph is not dynamic"
    torch._dynamo.reset()


def test_compile_the_wrapper_and_the_operator():
    torch._dynamo.reset()
    x = _random((9, 512), torch.float16, 30)
    weight = _weight(9, 31)
    wrapper = torch.compile(at.swiglu_group_quant, fullgraph=True, dynamic=True, backend="aot_eager")
    got = wrapper(x, weight, dst_type="float4_e2m1fn", quant_mode=1)
    expected = at.swiglu_group_quant(x, weight, dst_type="float4_e2m1fn", quant_mode=1)
    assert all(torch.equal(_bytes_tensor(g), _bytes_tensor(e)) for g, e in zip(got, expected))
    torch._dynamo.reset()


class _Quantise(torch.nn.Module):
    def forward(self, x, weight):
        y, y_scale = at.swiglu_group_quant(x, weight, dst_type="float8_e5m2", clamp_limit=1.5)
        return at.dequantise(y, y_scale, dtype=torch.bfloat16)


def test_export():
    rows = torch.export.Dim("rows", min=2)
    x, weight = _random((10, 256), torch.bfloat16, 32), _weight(10, 33)
    program = torch.export.export(_Quantise(), (x, weight), dynamic_shapes=({0: rows}, {0: rows}))
    assert "acl_swiglu.swiglu_group_quant.default" in str(program.graph)
    x2, weight2 = _random((13, 256), torch.bfloat16, 34), _weight(13, 35)
    assert torch.equal(program.module()(x2, weight2), _Quantise()(x2, weight2))


# Tracing as the first thing a fresh process does: the traces load no library (the fake
# implementation checks the rules on shapes and dtypes alone), the compiled or exported code
# loads them when the operator first runs, and gives the eager result.
FIRST_USE_PRELUDE = textwrap.dedent("""
    import torch
    from torch._dynamo.backends.common import aot_autograd
    from acl_swiglu import _loader
    import acl_swiglu.torch as at

    def loaded():
        return _loader.loaded() is not None

    def problem(rows, seed):
        generator = torch.Generator().manual_seed(seed)
        x = (torch.randn(rows, 512, generator=generator) * 2).to(torch.bfloat16).requires_grad_()
        weight = (torch.rand(rows, generator=generator) + 0.5).requires_grad_()
        return x, weight, torch.tensor([rows - 2], dtype=torch.int64)
""")

COMPILE_FIRST = FIRST_USE_PRELUDE + textwrap.dedent("""
    def step(x, weight, group_index):
        result = at.swiglu_quant(x, weight, group_index, dst_type="float8_e4m3fn", quant_mode=1, clamp_limit=1.0)
        return result.dequantised.float().square().sum()

    loaded_when_traced = []

    def compiler(graph, example_inputs):   # called with each graph once it is traced
        loaded_when_traced.append(loaded())
        return graph.forward

    backend = aot_autograd(fw_compiler=compiler, bw_compiler=compiler)
    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=backend)
    x, weight, group_index = problem(12, 0)
    loss = compiled(x, weight, group_index)   # traced, then run: the forward operator loads the libraries
    assert loaded_when_traced and not any(loaded_when_traced), loaded_when_traced
    assert loaded()
    loss.backward()
    x_eager, weight_eager, _ = problem(12, 0)
    loss_eager = step(x_eager, weight_eager, group_index)
    loss_eager.backward()
    assert torch.equal(loss, loss_eager)
    assert torch.equal(x.grad.view(torch.int16), x_eager.grad.view(torch.int16))
    assert torch.equal(weight.grad, weight_eager.grad)
    print("compile first: ok")
""")

EXPORT_FIRST = FIRST_USE_PRELUDE + textwrap.dedent("""
    class Quantise(torch.nn.Module):
        def forward(self, x, weight):
            return at.swiglu_group_quant(x, weight, dst_type=torch.float8_e5m2, quant_mode=1)

    x, weight, _ = problem(10, 1)
    x, weight = x.detach(), weight.detach()
    program = torch.export.export(Quantise(), (x, weight), dynamic_shapes=({0: torch.export.Dim("rows")},) * 2)
    assert not loaded(), "torch.export loaded the libraries"
    for got, expected in zip(program.module()(x, weight), Quantise()(x, weight)):
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
    assert loaded()
    print("export first: ok")
""")


@pytest.mark.parametrize("script", [pytest.param(COMPILE_FIRST, id="compile-swiglu_quant"),
                                    pytest.param(EXPORT_FIRST, id="export-swiglu_group_quant")])
def test_tracing_first_loads_nothing_and_runs(tmp_path, script):
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-6000:]
    assert result.stdout.strip().endswith(": ok")


# ---- the NPU kernel, on emulator memory with a stand-in torch_npu ----


@pytest.fixture
def npu_stand_in(monkeypatch):
    with stand_in(monkeypatch, _torch_forward) as parts:
        yield parts


@pytest.mark.emulator_only
@pytest.mark.parametrize("dst,mode", [("float8_e4m3fn", 0), ("float8_e5m2", 1), ("float4_e1m2", 1)])
def test_npu_kernel_on_emulator_memory_queues_on_the_current_stream(npu_stand_in, dst, mode):
    torch_npu, memory, stream = npu_stand_in
    x = _random((3, 4, 5, 512), torch.bfloat16, 40)[1, :, 1:4]   # a strided view with an offset
    weight, group_index = _weight(12, 41).reshape(4, 3, 1), torch.tensor([4, 3], dtype=torch.int64)
    options = dict(dst_type=at.dst_type_code(dst), quant_mode=mode, round_scale=True, clamp_limit=1.0)
    expected = OP(x, weight, group_index, **options)
    on_device = [memory.holding(t) for t in (x, weight, group_index)]
    for call in range(2):
        got = _torch_forward._npu(*on_device, **options)
        assert torch_npu.stream_reads == call + 1   # the current stream, read at every call
        stream.synchronize()   # the emulator runs queued work here: it was on that stream
        for g, e in zip(got, expected):
            assert (g.shape, g.dtype) == (e.shape, e.dtype)
            assert torch.equal(_bytes_tensor(g), _bytes_tensor(e))   # rows past trunc zeroed, as on CPU
    # Outputs and workspace from the same allocator (y, y_scale, y_origin, workspace a call).
    assert len(memory.buffers) == 3 + 2 * 4


@pytest.mark.emulator_only
def test_npu_kernel_refuses_mixed_devices_and_private_formats(npu_stand_in):
    torch_npu, memory, _ = npu_stand_in
    x = memory.holding(_random((2, 256), torch.float16, 42))
    code = at.dst_type_code("float8_e4m3fn")
    with pytest.raises(acl_swiglu.ArgumentError, match="group_index is on meta but x is on cpu"):
        _torch_forward._npu(x, None, torch.empty(2, dtype=torch.int64, device="meta"), dst_type=code)
    torch_npu.formats[x.untyped_storage().data_ptr()] = 29   # FRACTAL_NZ
    with pytest.raises(acl_swiglu.ArgumentError, match="x has the private NPU format 29"):
        _torch_forward._npu(x, dst_type=code)
    assert len(memory.buffers) == 1   # refused before anything was allocated


# ---- real NPU tensors (torch_npu on an Ascend host) ----


@pytest.mark.device
def test_npu_tensors_match_cpu_tensors():
    torch_npu = pytest.importorskip("torch_npu")  # noqa: F841
    x = _random((16, 1024), torch.bfloat16, 50)
    weight = _weight(16, 51)
    for dst, mode in KINDS:
        on_cpu = at.swiglu_group_quant(x, weight, dst_type=dst, quant_mode=mode)
        on_npu = at.swiglu_group_quant(x.npu(), weight.npu(), dst_type=dst, quant_mode=mode)
        verdict = reference.compare_quantised(_bytes(on_npu[0].cpu()),
                                              _bytes(on_npu[1].cpu()) if mode == 1 else on_npu[1].cpu().numpy(),
                                              _numpy(x), weight.numpy(), dst_type=dst, quant_mode=mode,
                                              round_scale=mode == 1)
        assert verdict.passed, verdict
        assert on_npu[0].dtype == on_cpu[0].dtype and on_npu[1].shape == on_cpu[1].shape
