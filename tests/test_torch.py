"""acl_swiglu.torch: the torch.library operator, the differentiable swiglu and its module, on CPU
tensors (the emulator) and, through the device path's own argument derivation, on the same bytes
in emulator device memory."""

import ctypes
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="acl_swiglu.torch needs torch (pip install 'acl-swiglu[torch]')")

import acl_swiglu  # noqa: E402
import acl_swiglu.torch as at  # noqa: E402
from acl_swiglu import bfloat16  # noqa: E402
from npu_stand_in import npu_stand_in as stand_in  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NUMPY_OF = {torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16), torch.bfloat16: bfloat16}
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
OP = torch.ops.acl_swiglu.swiglu_group_quant_grad.default


def _random(shape, dtype, seed, scale=2.0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * scale).to(dtype)


def _numpy(tensor):
    """A copy of the tensor's values as NumPy (bfloat16 through its bits)."""
    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy().view(bfloat16).copy()
    return tensor.numpy().copy()


def _bits(tensor):
    tensor = tensor.detach().contiguous()
    return tensor.view({2: torch.int16, 4: torch.int32}[tensor.element_size()]).numpy().copy()


def _problem(dtype, rows=12, hidden=24, weight=True, seed=0, leading=None):
    leading = leading or (rows,)
    grad_y = _random((*leading, hidden), dtype, seed, 1.0)
    x = _random((*leading, 2 * hidden), dtype, seed + 1)
    w = (torch.rand(math.prod(leading), generator=torch.Generator().manual_seed(seed + 2)) + 0.5) if weight else None
    y_origin = _random((*leading, hidden), dtype, seed + 3) if weight else None
    return grad_y, x, w, y_origin


OPTIONS = [
    dict(),
    dict(clamp_limit=1.5),
    dict(weighted=True),
    dict(weighted=True, clamp_limit=0.75, group_index=[5, 2]),
    dict(group_index=[3, -1, 0]),
    dict(group_index=[]),
]


def _options(option, w):
    group = option.get("group_index")
    return dict(weight=w.reshape(-1, 1) if option.get("weighted") else None,
                group_index=torch.tensor(group, dtype=torch.int64) if group is not None else None,
                clamp_limit=option.get("clamp_limit"))


# ---- the operator ----


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: ",".join(o) or "plain")
def test_operator_is_bit_identical_to_the_numpy_one_shot(dtype, option):
    grad_y, x, w, y_origin = _problem(dtype)
    kwargs = _options(option, w)
    weight = kwargs["weight"]
    y_origin = y_origin if weight is not None else None
    grad_x, grad_weight = at.swiglu_group_quant_grad(grad_y, x, y_origin=y_origin, **kwargs)
    expect_x, expect_w = acl_swiglu.swiglu_group_quant_grad(
        _numpy(grad_y), _numpy(x), None if weight is None else _numpy(weight),
        None if y_origin is None else _numpy(y_origin),
        None if kwargs["group_index"] is None else _numpy(kwargs["group_index"]), clamp_limit=kwargs["clamp_limit"])
    assert grad_x.dtype == dtype and grad_x.shape == x.shape
    np.testing.assert_array_equal(_bits(grad_x), expect_x.view({2: np.int16, 4: np.int32}[expect_x.itemsize]))
    if weight is None:
        assert grad_weight is None and expect_w is None
    else:
        assert grad_weight.shape == weight.shape and grad_weight.dtype == torch.float32
        np.testing.assert_array_equal(_bits(grad_weight), expect_w.view(np.int32))


def test_the_raw_operator_follows_the_schema():
    grad_y, x, w, y_origin = _problem(torch.float16)
    grad_x, grad_weight = OP(grad_y, x)   # clamp -1.0 = off, no weight: an empty [0] fp32 grad_weight
    assert grad_weight.shape == (0,) and grad_weight.dtype == torch.float32
    wrapped, none = at.swiglu_group_quant_grad(grad_y, x)
    assert none is None and torch.equal(wrapped, grad_x)
    clamped, _ = OP(grad_y, x, clamp_limit=1.0)
    assert torch.equal(clamped, at.swiglu_group_quant_grad(grad_y, x, clamp_limit=1.0)[0])
    assert not torch.equal(clamped, grad_x)
    arguments = {a.name: a for a in OP._schema.arguments}
    assert list(arguments) == ["grad_y", "x", "weight", "y_origin", "group_index", "clamp_limit"]
    assert [a.kwarg_only for a in arguments.values()] == [False, False, True, True, True, True]
    assert arguments["clamp_limit"].default_value == -1.0


def test_outputs_are_fresh_and_inputs_untouched():
    grad_y, x, w, y_origin = _problem(torch.bfloat16)
    before = [t.clone() for t in (grad_y, x, w, y_origin)]
    grad_x, grad_weight = at.swiglu_group_quant_grad(grad_y, x, weight=w, y_origin=y_origin, clamp_limit=2.0)
    for old, new in zip(before, (grad_y, x, w, y_origin)):
        assert torch.equal(old, new)
    assert grad_x.untyped_storage().data_ptr() not in {t.untyped_storage().data_ptr() for t in (grad_y, x)}


@pytest.mark.parametrize("view", ["rows", "columns", "transposed", "offset_3d", "expanded_weight"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_any_strides_and_storage_offset_on_cpu(dtype, view):
    grad_y, x, w, y_origin = _views(view, dtype)
    grad_x, grad_weight = at.swiglu_group_quant_grad(grad_y, x, weight=w, y_origin=y_origin, clamp_limit=1.25)
    contiguous = [t.contiguous() for t in (grad_y, x, w, y_origin)]
    expect_x, expect_w = at.swiglu_group_quant_grad(contiguous[0], contiguous[1], weight=contiguous[2],
                                                    y_origin=contiguous[3], clamp_limit=1.25)
    assert torch.equal(_as_int(grad_x), _as_int(expect_x)) and torch.equal(grad_weight, expect_w)


def _as_int(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _views(view, dtype, hidden=16):
    """grad_y, x, weight, y_origin as non-contiguous views into bigger storages."""
    if view == "rows":   # every other row, from an offset
        big = _problem(dtype, rows=21, hidden=hidden, seed=4)
        return big[0][1::2], big[1][1::2], big[2][1::2], big[3][1::2]
    if view == "columns":   # a column window of wider rows
        gy = _random((10, hidden + 5), dtype, 5)[:, 3:3 + hidden]
        x = _random((10, 2 * hidden + 7), dtype, 6)[:, 4:4 + 2 * hidden]
        return gy, x, torch.rand(10, 3)[:, 1], _random((10, hidden + 2), dtype, 7)[:, 2:]
    if view == "transposed":   # column-major
        gy = _random((hidden, 9), dtype, 8).t()
        x = _random((2 * hidden, 9), dtype, 9).t()
        return gy, x, torch.rand(1, 9).t(), _random((hidden, 9), dtype, 10).t()
    if view == "offset_3d":   # [B, S, .] from a slice of a 4-D block
        gy = _random((3, 2, 5, hidden), dtype, 11)[1:, 1]
        x = _random((3, 2, 5, 2 * hidden), dtype, 12)[1:, 0]
        return gy, x, torch.rand(2, 5, 1) + 0.5, _random((2, 5, hidden), dtype, 13)
    gy, x, w, yo = _problem(dtype, rows=6, hidden=hidden, seed=14)   # one weight for every row, stride 0
    return gy, x, torch.tensor([0.75]).expand(6), yo


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_tensors_reach_numpy_as_views_of_their_memory(dtype):
    big = _random((6, 40), dtype, 15)
    view = big[1:, 4:36].t()   # storage offset and transposed strides
    array = at._as_numpy(view)
    assert array.__array_interface__["data"][0] == view.data_ptr()
    assert array.strides == tuple(s * view.element_size() for s in view.stride())
    assert array.dtype == NUMPY_OF[dtype]
    result = at._from_numpy(array.copy())
    assert result.dtype == dtype and torch.equal(_as_int(result), _as_int(view.contiguous()))


def test_the_fake_implementation_checks_without_reading_data():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        grad_y = torch.empty(7, 3, 10, dtype=torch.bfloat16)
        x = torch.empty(7, 3, 20, dtype=torch.bfloat16)
        grad_x, grad_weight = OP(grad_y, x, weight=torch.empty(21), y_origin=torch.empty_like(grad_y))
        assert grad_x.shape == x.shape and grad_x.dtype == torch.bfloat16
        assert grad_weight.shape == (21,) and grad_weight.dtype == torch.float32
        assert OP(grad_y, x)[1].shape == (0,)
        with pytest.raises(acl_swiglu.ArgumentError, match="y_origin is required with weight"):
            OP(grad_y, x, weight=torch.empty(21))


BAD = [
    (lambda gy, x: dict(grad_y=gy.float(), x=x), "grad_y has dtype torch.float32; it must be x's dtype"),
    (lambda gy, x: dict(grad_y=gy, x=x[..., :-1]), "last dim must be even"),
    (lambda gy, x: dict(grad_y=gy[:, :-1], x=x), "it must be x's last dim / 2"),
    (lambda gy, x: dict(grad_y=gy[:-1], x=x), "grad_y has shape"),
    (lambda gy, x: dict(grad_y=gy.long(), x=x.long()), "x has dtype torch.int64"),
    (lambda gy, x: dict(grad_y=gy, x=x, weight=torch.ones(4, 1), y_origin=gy), "weight has 4 elements"),
    (lambda gy, x: dict(grad_y=gy, x=x, weight=torch.ones(4, 1, dtype=torch.float16), y_origin=gy),
     "weight has dtype torch.float16"),
    (lambda gy, x: dict(grad_y=gy, x=x, y_origin=gy), "y_origin is given without weight"),
    (lambda gy, x: dict(grad_y=gy, x=x, group_index=torch.tensor([1], dtype=torch.int32)), "group_index is"),
    (lambda gy, x: dict(grad_y=gy, x=x, clamp_limit=0.0), r"clamp_limit must be -1.0 \(off\) or > 0, got 0.0"),
    (lambda gy, x: dict(grad_y=gy, x=x, clamp_limit=float("nan")), "clamp_limit must be"),
]


@pytest.mark.parametrize("make,message", BAD, ids=[m for _, m in BAD])
def test_bad_arguments_are_refused_by_name(make, message):
    grad_y, x, _, _ = _problem(torch.float16, rows=5, hidden=8)
    kwargs = make(grad_y, x)
    with pytest.raises(acl_swiglu.ArgumentError, match=message):
        OP(kwargs.pop("grad_y"), kwargs.pop("x"), **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype):
    grad_y, x, w, y_origin = _problem(dtype, rows=6, hidden=8, leading=(2, 3))
    samples = [
        ((grad_y, x), {}),
        ((grad_y, x), dict(clamp_limit=0.5)),
        ((grad_y, x), dict(weight=w.reshape(2, 3, 1), y_origin=y_origin, group_index=torch.tensor([4]))),
    ]
    for args, kwargs in samples:
        results = torch.library.opcheck(OP, args, kwargs)
        assert set(results.values()) == {"SUCCESS"}, results


# ---- the differentiable forward ----


def _golden_forward(x, weight, clamp_limit, trunc):
    """The forward in float64 with the clamp as torch.where on strict masks (x0 < c, -c < x1 < c
    on the original values), so autograd's gradient is the operator's masks exactly."""
    gate, value = x.chunk(2, dim=-1)
    if clamp_limit is not None:
        c = torch.tensor(clamp_limit, dtype=torch.float64)
        gate = torch.where(gate < c, gate, c)
        value = torch.where(value < c, torch.where(value > -c, value, -c), c)
    y = gate * torch.sigmoid(gate) * value
    if weight is not None:
        y = y * weight.reshape(*x.shape[:-1], 1)
    rows = torch.arange(math.prod(x.shape[:-1])).reshape(*x.shape[:-1], 1)
    return torch.where(rows < trunc, y, torch.zeros((), dtype=torch.float64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("clamp_limit", [None, 1.0])
@pytest.mark.parametrize("weighted,group", [(False, None), (True, None), (True, [4, 3]), (False, [9, -1])])
def test_gradients_match_float64_autograd(dtype, clamp_limit, weighted, group):
    rows, hidden = 16, 32
    x = _random((2, rows // 2, 2 * hidden), dtype, 20, scale=1.5)
    if clamp_limit is not None:   # values on the clamp boundaries, where only strict masks are right
        x[0, 0, :4] = torch.tensor([clamp_limit, -clamp_limit, clamp_limit, 0.5], dtype=dtype)
        x[0, 0, hidden:hidden + 4] = torch.tensor([clamp_limit, -clamp_limit, 0.25, -clamp_limit], dtype=dtype)
    weight = (torch.rand(2, rows // 2, 1, generator=torch.Generator().manual_seed(21)) + 0.5) if weighted else None
    group_index = torch.tensor(group, dtype=torch.int64) if group is not None else None
    trunc = min(sum(v % 2**32 for v in group) % 2**32, rows) if group is not None else rows
    grad_out = _random((2, rows // 2, hidden), dtype, 22, 1.0)

    x_ours = x.clone().requires_grad_()
    w_ours = weight.clone().requires_grad_() if weighted else None
    out = at.swiglu(x_ours, w_ours, clamp_limit=clamp_limit, group_index=group_index)
    out.backward(grad_out)

    x64 = x.double().requires_grad_()
    w64 = weight.double().requires_grad_() if weighted else None
    golden = _golden_forward(x64, w64, clamp_limit, trunc)
    golden.backward(grad_out.double())

    assert out.dtype == dtype
    for actual, expected in ((out, golden), (x_ours.grad, x64.grad)):
        verdict = acl_swiglu.reference.compare(_numpy(actual), expected.detach().numpy())
        assert verdict.passed, verdict
    assert torch.all(out.detach()[torch.arange(rows).reshape(2, rows // 2) >= trunc] == 0)
    if weighted:
        # The operator sums grad_y * y_origin, y_origin being the forward rounded to x's dtype:
        # each term carries that rounding (unit roundoff u), plus fp32 accumulation.
        x64d = x.double()
        gate, value = x64d.chunk(2, dim=-1)
        magnitude = (grad_out.double() * (gate * torch.sigmoid(gate) * value)).abs().sum(-1, keepdim=True)
        bound = (2 * UNIT_ROUNDOFF[dtype] + 2 * hidden * 2.0**-24) * magnitude + 1e-30
        error = (w_ours.grad.double() - w64.grad).abs()
        assert torch.all(error <= bound), (error / bound).max()


def test_swiglu_forward_rounds_once_from_fp32():
    x = _random((64, 2 * 40), torch.bfloat16, 30)
    weight = torch.rand(64) + 0.5
    gate, value = x.float()[:, :40].clamp(max=2.0), x.float()[:, 40:].clamp(-2.0, 2.0)
    expected = (torch.nn.functional.silu(gate) * value * weight[:, None]).to(torch.bfloat16)
    assert torch.equal(_as_int(at.swiglu(x, weight, clamp_limit=2.0)), _as_int(expected))
    assert torch.equal(at.SwiGLU(clamp_limit=2.0)(x, weight), at.swiglu(x, weight, clamp_limit=2.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_recomputing_y_origin_gives_the_same_bits(dtype):
    grads = []
    for recompute in (True, False):
        x = _random((10, 48), dtype, 40).requires_grad_()
        weight = (torch.rand(10, 1, generator=torch.Generator().manual_seed(42)) + 0.5).requires_grad_()
        out = at.SwiGLU(clamp_limit=3.0, recompute_y_origin=recompute)(x, weight)
        out.backward(_random((10, 24), dtype, 41))
        grads.append((_as_int(x.grad), weight.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_backward_runs_the_operator(monkeypatch):
    calls = []
    real = at.swiglu_group_quant_grad
    monkeypatch.setattr(at, "swiglu_group_quant_grad", lambda *a, **k: calls.append(k) or real(*a, **k))
    x = _random((4, 16), torch.float32, 50).requires_grad_()
    at.swiglu(x, torch.rand(4).requires_grad_(), clamp_limit=1.0).sum().backward()
    assert len(calls) == 1 and calls[0]["clamp_limit"] == 1.0 and calls[0]["y_origin"] is not None


def test_swiglu_refuses_bad_arguments():
    x = torch.zeros(4, 6)
    with pytest.raises(acl_swiglu.ArgumentError, match="last dim must be even"):
        at.swiglu(torch.zeros(4, 5))
    with pytest.raises(acl_swiglu.ArgumentError, match="weight has 3 elements"):
        at.swiglu(x, torch.ones(3))
    with pytest.raises(acl_swiglu.ArgumentError, match="weight has dtype torch.float64"):
        at.swiglu(x, torch.ones(4, dtype=torch.float64))
    with pytest.raises(acl_swiglu.ArgumentError, match="clamp_limit must be None"):
        at.SwiGLU(clamp_limit=0.0)


def _plain_forward(x, weight, clamp_limit, trunc):
    """The forward as one torch expression in fp32, rounded once to x's dtype."""
    gate, value = x.float().chunk(2, dim=-1)
    if clamp_limit is not None:
        gate, value = gate.clamp(max=clamp_limit), value.clamp(-clamp_limit, clamp_limit)
    y = torch.nn.functional.silu(gate) * value
    rows = torch.arange(math.prod(x.shape[:-1])).reshape(*x.shape[:-1], 1)
    y = torch.where(rows < trunc, y, torch.zeros(()))
    if weight is not None:
        y = y * weight.float().reshape(*x.shape[:-1], 1)
    return y.to(x.dtype)


@pytest.fixture
def one_thread():
    """torch in one thread: the split of an elementwise loop between threads decides which
    elements get torch's vectorised exp and which its scalar one, which differ in the last bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,group", [((9000, 2 * 40), [5000, 1300]), ((3, 1100, 2 * 96), None),
                                         ((2000, 2 * 33), [1999]), ((0, 2 * 8), None), ((5, 0), [2])])
def test_the_eager_forward_is_the_one_expression_form_bit_for_bit(dtype, shape, group, one_thread):
    """The eager CPU forward runs a block of rows at a time (the first three shapes span several
    blocks) with the one expression's fp32 operations, in its order and on its layouts: the same
    bits, NaN, inf, -0.0 and truncated rows included."""
    x = _random(shape, dtype, 70, scale=4.0)
    rows = math.prod(shape[:-1])
    flat = x.view(rows, shape[-1])
    if flat.numel():
        flat[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
        flat[1, :2] = torch.tensor([2.0, -2.0], dtype=dtype)   # on the clamp limit
    weight = torch.rand(rows, generator=torch.Generator().manual_seed(71)) - 0.25   # some negative
    if rows:
        weight[-1] = float("nan")
    group_index = torch.tensor(group, dtype=torch.int64) if group else None
    trunc = min(sum(group), rows) if group else rows
    strided = torch.cat([x, x], dim=-1)[..., :shape[-1]]     # a view with a row stride of 2 rows
    for clamp_limit in (None, 2.0):
        for w in (None, weight):
            for source in (x, strided):
                got = at.swiglu(source, w, clamp_limit=clamp_limit, group_index=group_index)
                expected = _plain_forward(source, w, clamp_limit, trunc)
                assert got.shape == expected.shape
                assert torch.equal(_as_int(got), _as_int(expected)), (clamp_limit, w is None, source is x)


@pytest.mark.parametrize("weight_dtype", [torch.float16, torch.bfloat16])
def test_half_and_bfloat16_weights_are_widened_and_their_gradient_rounded_back(weight_dtype):
    x = _random((12, 48), torch.bfloat16, 80)
    weight = (torch.rand(12, 1, generator=torch.Generator().manual_seed(81)) + 0.5).to(weight_dtype)
    grad_out = _random((12, 24), torch.bfloat16, 82, 1.0)
    results = []
    for w in (weight, weight.float()):   # the widened copy holds exactly the same values
        x_leaf, w_leaf = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = at.swiglu(x_leaf, w_leaf, clamp_limit=3.0)
        out.backward(grad_out)
        results.append((out, x_leaf.grad, w_leaf.grad))
    (out, grad_x, grad_w), (out32, grad_x32, grad_w32) = results
    assert torch.equal(_as_int(out), _as_int(out32)) and torch.equal(_as_int(grad_x), _as_int(grad_x32))
    assert grad_w.dtype == weight_dtype and grad_w.shape == weight.shape
    assert torch.equal(grad_w, grad_w32.to(weight_dtype))   # computed in fp32, rounded once
    # the Python-level operator call too
    y_origin = _random((12, 24), torch.bfloat16, 83)
    got = at.swiglu_group_quant_grad(grad_out, x, weight=weight, y_origin=y_origin)
    expected = at.swiglu_group_quant_grad(grad_out, x, weight=weight.float(), y_origin=y_origin)
    assert torch.equal(_as_int(got[0]), _as_int(expected[0]))
    assert got[1].dtype == weight_dtype and torch.equal(got[1], expected[1].to(weight_dtype))
    with pytest.raises(acl_swiglu.ArgumentError, match="weight has dtype torch.float16; the operator takes"):
        OP(grad_out, x, weight=weight.half(), y_origin=y_origin)   # the raw operator keeps its fp32 rule


@pytest.mark.parametrize("abi", [1, 2], indirect=True)
def test_weights_shaped_t_or_by_leading_dims_give_the_same_gradients(abi):
    """[T], [T, 1], x's leading dims and those followed by 1 are one weight per row in x's row
    order, on either ABI revision; a shape that could be read in another order is refused."""
    x = _random((2, 3, 32), torch.float32, 90)
    grad_out = _random((2, 3, 16), torch.float32, 91, 1.0)
    base = torch.rand(6, generator=torch.Generator().manual_seed(92)) + 0.5
    results = []
    for shape in [(6,), (6, 1), (2, 3), (2, 3, 1)]:
        x_leaf, w_leaf = x.clone().requires_grad_(), base.reshape(shape).clone().requires_grad_()
        out = at.swiglu(x_leaf, w_leaf, clamp_limit=1.0)
        out.backward(grad_out)
        assert w_leaf.grad.shape == shape
        direct = at.swiglu_group_quant_grad(grad_out, x, weight=w_leaf.detach(),
                                            y_origin=at.swiglu(x, clamp_limit=1.0), clamp_limit=1.0)
        assert direct[1].shape == shape and torch.equal(direct[1], w_leaf.grad)
        results.append((out, x_leaf.grad, w_leaf.grad.reshape(-1)))
    for out, grad_x, grad_w in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(grad_x, results[0][1])
        assert torch.equal(grad_w, results[0][2])
    message = r"weight has shape \[3, 2\]; for x of shape \[2, 3, 32\] it must be one of \[6\], \[6, 1\], \[2, 3\]"
    with pytest.raises(acl_swiglu.ArgumentError, match=message):
        at.swiglu(x, base.reshape(3, 2))
    with pytest.raises(acl_swiglu.ArgumentError, match=message):
        at.swiglu_group_quant_grad(grad_out, x, weight=base.reshape(3, 2), y_origin=grad_out)


def test_compile_with_a_bfloat16_flat_weight():
    torch._dynamo.reset()
    module = at.SwiGLU(clamp_limit=1.0)
    compiled = torch.compile(_train_step(module), fullgraph=True, dynamic=True, backend="aot_eager")
    grads = []
    for fn in (compiled, _train_step(module)):
        x = _random((10, 32), torch.bfloat16, 95).requires_grad_()
        weight = (torch.rand(10, generator=torch.Generator().manual_seed(96)) + 0.5).bfloat16().requires_grad_()
        fn(x, weight, torch.tensor([8], dtype=torch.int64)).backward()
        grads.append((x.grad, weight.grad))
    assert grads[0][1].dtype == torch.bfloat16
    assert torch.equal(_as_int(grads[0][0]), _as_int(grads[1][0])) and torch.equal(grads[0][1], grads[1][1])
    torch._dynamo.reset()


# ---- torch.compile and torch.export ----


def _train_step(module):
    def step(x, weight, group_index):
        return module(x, weight, group_index).float().square().sum()
    return step


# Inductor generates and compiles C++ for the forward (about 10 s on 2 cores): slow tier. The
# aot_eager runs check the same graph capture (full graph, no recompile across T) in the default run.
@pytest.mark.parametrize("backend,recompute", [("aot_eager", True), ("aot_eager", False),
                                               pytest.param("inductor", True, marks=pytest.mark.slow)])
def test_compile_fullgraph_dynamic_shapes(backend, recompute):
    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    module = at.SwiGLU(clamp_limit=1.0, recompute_y_origin=recompute)
    compiled = torch.compile(_train_step(module), fullgraph=True, dynamic=True, backend=counter)
    compiled_after_first = None
    for rows in (12, 20, 7):
        results = []
        for fn in (compiled, _train_step(module)):
            x = _random((rows, 32), torch.bfloat16, rows).requires_grad_()
            weight = (torch.rand(rows, generator=torch.Generator().manual_seed(rows)) + 0.5).requires_grad_()
            loss = fn(x, weight, torch.tensor([rows - 2], dtype=torch.int64))
            loss.backward()
            results.append((loss.detach(), x.grad, weight.grad))
        (loss_c, gx_c, gw_c), (loss_e, gx_e, gw_e) = results
        # Inductor fuses the forward and may keep its fp32 result where eager rounds it to bf16
        # (up to one bf16 rounding, 2^-8 relative); the backward is the operator either way.
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-5 if backend == "aot_eager" else 2.0**-8, atol=0)
        torch.testing.assert_close(gx_c.float(), gx_e.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(gw_c, gw_e, rtol=1e-3, atol=1e-3)
        if backend == "aot_eager":
            assert torch.equal(_as_int(gx_c), _as_int(gx_e)) and torch.equal(gw_c, gw_e)
        compiled_after_first = compiled_after_first or counter.frame_count
        assert counter.frame_count == compiled_after_first, f"T={rows} recompiled: the graph is not dynamic"
    torch._dynamo.reset()


def test_compile_the_operator_directly():
    torch._dynamo.reset()
    compiled = torch.compile(at.swiglu_group_quant_grad, fullgraph=True, dynamic=True, backend="aot_eager")
    grad_y, x, w, y_origin = _problem(torch.float16, rows=9, hidden=8)
    got = compiled(grad_y, x, weight=w, y_origin=y_origin, clamp_limit=2.0)
    expected = at.swiglu_group_quant_grad(grad_y, x, weight=w, y_origin=y_origin, clamp_limit=2.0)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    torch._dynamo.reset()


class _Backward(torch.nn.Module):
    def forward(self, grad_y, x, weight, y_origin):
        return at.swiglu_group_quant_grad(grad_y, x, weight=weight, y_origin=y_origin, clamp_limit=1.5)


def test_export():
    rows = torch.export.Dim("rows", min=2)
    grad_y, x, w, y_origin = _problem(torch.bfloat16, rows=10, hidden=16)
    program = torch.export.export(_Backward(), (grad_y, x, w, y_origin),
                                  dynamic_shapes=({0: rows}, {0: rows}, {0: rows}, {0: rows}))
    assert "acl_swiglu.swiglu_group_quant_grad.default" in str(program.graph)
    other = _problem(torch.bfloat16, rows=13, hidden=16, seed=3)
    for got, expected in zip(program.module()(*other), _Backward()(*other)):
        assert torch.equal(got, expected)

    forward = torch.export.export(at.SwiGLU(clamp_limit=1.0), (x, w), dynamic_shapes=({0: rows}, {0: rows}))
    x2 = _random((5, 32), torch.bfloat16, 60)
    w2 = torch.rand(5)
    assert torch.equal(forward.module()(x2, w2), at.SwiGLU(clamp_limit=1.0)(x2, w2))


# ---- the device path's derivation, on the same bytes in emulator memory ----


def _storage_on_device(tensor):
    """The tensor's whole storage, byte for byte, in new emulator device memory."""
    flat = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
    return acl_swiglu.to_device(flat.numpy())


def _read_view(device_storage, layout):
    """The view `layout` describes, read back from the storage copy in device memory."""
    raw = device_storage.to_numpy().view(layout.dtype)
    itemsize = layout.dtype.itemsize
    return np.lib.stride_tricks.as_strided(raw[layout.offset:], layout.shape,
                                           tuple(s * itemsize for s in layout.strides)).copy()


def test_tensor_layout_describes_storage_offset_and_element_strides():
    base = torch.zeros(4, 30, dtype=torch.bfloat16)
    view = base[1:, 3:27].t()
    layout = at.tensor_layout(view)
    assert layout.base == base.untyped_storage().data_ptr()
    assert layout.offset == 33 and layout.strides == (1, 30) and layout.shape == (24, 3)
    assert layout.dtype == bfloat16 and layout.storage_nbytes == 240
    with pytest.raises(acl_swiglu.ArgumentError, match="dtype torch.int8"):
        at.tensor_layout(torch.zeros(3, dtype=torch.int8))


@pytest.mark.parametrize("view", ["contiguous", "rows", "columns", "transposed", "offset_3d", "expanded_weight"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_path_derivation_gives_the_one_shot_result(dtype, view):
    if view == "contiguous":
        grad_y, x, w, y_origin = _problem(dtype, rows=8, hidden=16)
    else:
        grad_y, x, w, y_origin = _views(view, dtype)
    group_index = torch.arange(1, 4, dtype=torch.int64)[1:]   # a view with an offset too: [2, 3]
    inputs = {"grad_y": grad_y, "x": x, "weight": w, "y_origin": y_origin, "group_index": group_index}
    outputs = {"grad_x": torch.empty(x.shape, dtype=dtype), "grad_weight": torch.empty(w.shape)}
    storages, arrays, layouts, workspaces = {}, {}, {}, []
    with acl_swiglu.Stream() as stream:
        try:
            for name, tensor in {**inputs, **outputs}.items():
                layouts[name] = at.tensor_layout(tensor)
                storages[name] = _storage_on_device(tensor)
                arrays[name] = layouts[name].wrap(base=storages[name].ptr)

            def workspace(nbytes):
                workspaces.append(acl_swiglu.DeviceBuffer(nbytes))
                return workspaces[-1]

            at.run_device_arrays(arrays, 1.0, stream, workspace)
            stream.synchronize()
            got_x = _read_view(storages["grad_x"], layouts["grad_x"])
            got_w = _read_view(storages["grad_weight"], layouts["grad_weight"])
        finally:
            for buffer in [*storages.values(), *workspaces]:
                buffer.close()
    expect_x, expect_w = acl_swiglu.swiglu_group_quant_grad(
        _numpy(grad_y), _numpy(x), _numpy(w), _numpy(y_origin), _numpy(group_index), clamp_limit=1.0)
    np.testing.assert_array_equal(got_x.view(np.uint8), expect_x.view(np.uint8))
    np.testing.assert_array_equal(got_w.view(np.uint8), expect_w.view(np.uint8))


@pytest.fixture
def npu_stand_in(monkeypatch):
    with stand_in(monkeypatch, at) as parts:
        yield parts


@pytest.mark.emulator_only
def test_npu_kernel_keeps_the_device_torch_npu_made_current(npu_stand_in, monkeypatch):
    """The package adopts the thread's current device: it never sets one behind torch_npu."""
    import concurrent.futures
    import contextlib

    from acl_swiglu import _ffi, runtime

    torch_npu, memory, stream = npu_stand_in
    api = _ffi.api()

    @contextlib.contextmanager
    def npu_device(device):
        assert api.raw.aclrtSetDevice(0) == 0   # what torch_npu.npu.device does on this thread
        yield

    torch_npu.npu.device = npu_device
    set_by_package = []
    real_set = api.aclrtSetDevice
    monkeypatch.setattr(api, "aclrtSetDevice", lambda device: (set_by_package.append(device), real_set(device))[1])
    monkeypatch.setattr(runtime._runtime, "set_device", lambda device: set_by_package.append(("set_device", device)))
    grad_y, x, w, y_origin = _views("rows", torch.float32)
    expect_x, _ = at.swiglu_group_quant_grad(grad_y, x, weight=w, y_origin=y_origin)
    on_device = [memory.holding(t) for t in (grad_y, x, w, y_origin)]

    def work():   # a fresh thread: no device until torch_npu sets one
        grad_x, _ = at._npu(*on_device[:2], weight=on_device[2], y_origin=on_device[3])
        stream.synchronize()
        device = ctypes.c_int32(-1)
        return grad_x.clone(), (api.raw.aclrtGetDevice(ctypes.byref(device)), device.value)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        grad_x, current = pool.submit(work).result(timeout=120)
    assert set_by_package == []
    assert current == (0, 0)
    np.testing.assert_array_equal(_numpy(grad_x).view(np.uint8), _numpy(expect_x).view(np.uint8))


@pytest.mark.emulator_only
@pytest.mark.parametrize("view", ["rows", "transposed", "offset_3d"])
def test_npu_kernel_on_emulator_memory_queues_on_the_current_stream(npu_stand_in, view):
    torch_npu, memory, stream = npu_stand_in
    grad_y, x, w, y_origin = _views(view, torch.bfloat16)
    group_index = torch.tensor([3, 4], dtype=torch.int64)
    expect_x, expect_w = at.swiglu_group_quant_grad(grad_y, x, weight=w, y_origin=y_origin,
                                                    group_index=group_index, clamp_limit=1.0)
    on_device = [memory.holding(t) for t in (grad_y, x, w, y_origin, group_index)]
    assert on_device[1].stride() == x.stride() and on_device[1].storage_offset() == x.storage_offset()
    for call in range(2):
        grad_x, grad_weight = at._npu(*on_device[:2], weight=on_device[2], y_origin=on_device[3],
                                      group_index=on_device[4], clamp_limit=1.0)
        assert torch_npu.stream_reads == call + 1   # the current stream, read at every call
        stream.synchronize()   # the emulator runs queued work here: it was on that stream
        assert torch.equal(_as_int(grad_x), _as_int(expect_x)) and torch.equal(grad_weight, expect_w)
    # The workspace came from the same allocator as the outputs (none from aclrtMalloc per call).
    assert len(memory.buffers) == 5 + 2 * 3


@pytest.mark.emulator_only
def test_npu_kernel_refuses_mixed_devices_and_private_formats(npu_stand_in):
    torch_npu, memory, _ = npu_stand_in
    grad_y, x, _, _ = (memory.holding(t) if t is not None else None for t in _problem(torch.float16, weight=False))
    with pytest.raises(acl_swiglu.ArgumentError, match="group_index is on meta but x is on cpu"):
        at._npu(grad_y, x, group_index=torch.empty(2, dtype=torch.int64, device="meta"))
    torch_npu.formats[x.untyped_storage().data_ptr()] = 29   # FRACTAL_NZ
    with pytest.raises(acl_swiglu.ArgumentError, match="x has the private NPU format 29"):
        at._npu(grad_y, x)
    assert len(memory.buffers) == 2   # refused before anything was allocated


# ---- real NPU tensors (torch_npu on an Ascend 950 host) ----


def _torch_npu():
    return pytest.importorskip("torch_npu", reason="needs torch_npu on an Ascend host")


@pytest.mark.device
@pytest.mark.parametrize("dtype", DTYPES)
def test_npu_tensors_match_cpu_tensors(dtype):
    _torch_npu()
    big = _problem(dtype, rows=21, hidden=16, seed=4)
    group_index = torch.tensor([7, 2], dtype=torch.int64)
    on_npu_storage = [t.to("npu") for t in big] + [group_index.to("npu")]
    views_cpu = [t[1::2] for t in big] + [group_index]       # every other row, from an offset
    views_npu = [t[1::2] for t in on_npu_storage[:4]] + [on_npu_storage[4]]
    assert views_npu[1].storage_offset() == views_cpu[1].storage_offset() > 0
    on_cpu = at.swiglu_group_quant_grad(views_cpu[0], views_cpu[1], weight=views_cpu[2], y_origin=views_cpu[3],
                                        group_index=views_cpu[4], clamp_limit=1.0)
    on_npu = at.swiglu_group_quant_grad(views_npu[0], views_npu[1], weight=views_npu[2], y_origin=views_npu[3],
                                        group_index=views_npu[4], clamp_limit=1.0)
    assert on_npu[0].device.type == "npu"
    assert torch.equal(_as_int(on_npu[0].cpu()), _as_int(on_cpu[0])) and torch.equal(on_npu[1].cpu(), on_cpu[1])


@pytest.mark.device
def test_npu_training_step_on_the_current_stream():
    torch_npu = _torch_npu()
    stream = torch_npu.npu.Stream()
    x = _random((64, 256), torch.bfloat16, 70).to("npu").requires_grad_()
    weight = (torch.rand(64) + 0.5).to("npu").requires_grad_()
    with torch_npu.npu.stream(stream):
        at.swiglu(x, weight, clamp_limit=7.0).float().sum().backward()
    stream.synchronize()
    x_cpu = x.detach().cpu().requires_grad_()
    w_cpu = weight.detach().cpu().requires_grad_()
    at.swiglu(x_cpu, w_cpu, clamp_limit=7.0).float().sum().backward()
    assert torch.equal(_as_int(x.grad.cpu()), _as_int(x_cpu.grad)) and torch.equal(weight.grad.cpu(), w_cpu.grad)


@pytest.mark.device
def test_npu_refuses_mixed_devices_and_private_formats():
    torch_npu = _torch_npu()
    grad_y, x, _, _ = _problem(torch.float16, rows=16, hidden=16)
    with pytest.raises(acl_swiglu.ArgumentError, match="all tensors must be on one device"):
        at.swiglu_group_quant_grad(grad_y.to("npu"), x.to("npu"), group_index=torch.tensor([3]))
    nz = torch_npu.npu_format_cast(x.to("npu"), 29)
    with pytest.raises(acl_swiglu.ArgumentError, match="private NPU format 29"):
        at.swiglu_group_quant_grad(grad_y.to("npu"), nz)


# ---- the benchmark script ----


def _quick_benchmark_json(name):
    """What benchmarks/<name> --quick --json prints, parsed; the run must succeed."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "benchmarks" / name
    result = subprocess.run([sys.executable, str(script), "--quick", "--json"], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.allow_live_handles   # it runs in a child process
@pytest.mark.slow   # a timed benchmark run in a child process, like tests/test_benchmarks.py
def test_torch_overhead_benchmark_reports_both_calls():
    data = _quick_benchmark_json("torch_overhead.py")
    assert set(data["sizes"]) == {"T=1 H=16", "T=4096 H=2048"}
    for figures in data["sizes"].values():
        assert figures["numpy"] > 0 and figures["torch"] > 0
        assert figures["ratio"] == pytest.approx(figures["torch"] / figures["numpy"])
    assert set(data["targets"]) == {"large_ratio", "tiny_overhead_us"}


@pytest.mark.emulator_only
@pytest.mark.parametrize("abi", [1], indirect=True)
def test_revision_1_takes_the_same_calls(abi, npu_stand_in):
    """Revision 1 (host group counts, clamp off as 0): the torch calls do not change."""
    _, memory, stream = npu_stand_in
    grad_y, x, w, y_origin = _problem(torch.float16, rows=10, hidden=16)
    group_index = torch.tensor([4, 3], dtype=torch.int64)
    for clamp_limit in (None, 0.5):
        expect_x, expect_w = acl_swiglu.swiglu_group_quant_grad(
            _numpy(grad_y), _numpy(x), _numpy(w.reshape(10, 1)), _numpy(y_origin), _numpy(group_index),
            clamp_limit=clamp_limit)
        on_cpu = at.swiglu_group_quant_grad(grad_y, x, weight=w.reshape(10, 1), y_origin=y_origin,
                                            group_index=group_index, clamp_limit=clamp_limit)
        on_device = at._npu(*(memory.holding(t) for t in (grad_y, x)), weight=memory.holding(w.reshape(10, 1)),
                            y_origin=memory.holding(y_origin), group_index=memory.holding(group_index),
                            clamp_limit=at.CLAMP_OFF if clamp_limit is None else clamp_limit)
        stream.synchronize()
        for grad_x, grad_weight in (on_cpu, on_device):
            np.testing.assert_array_equal(_numpy(grad_x).view(np.int16), expect_x.view(np.int16))
            np.testing.assert_array_equal(_numpy(grad_weight), expect_w)


@pytest.mark.allow_live_handles   # it runs in a child process
@pytest.mark.slow   # a timed benchmark run in a child process, like tests/test_benchmarks.py
def test_recompute_benchmark_reports_both_settings_and_the_memory_they_keep():
    data = _quick_benchmark_json("torch_recompute.py")
    assert set(data["sizes"]) == {"T=1024 H=512", "T=2048 H=256"}
    for size, figures in data["sizes"].items():
        rows, hidden = (int(part.split("=")[1]) for part in size.split())
        x_mib, y_mib, weight_mib = rows * 2 * hidden * 2 / 2**20, rows * hidden * 2 / 2**20, rows * 4 / 2**20
        # what autograd keeps: x and the fp32 weight; with recompute_y_origin=False y_origin too
        assert figures["recompute"]["saved_mib"] == pytest.approx(x_mib + weight_mib)
        assert figures["keep"]["saved_mib"] == pytest.approx(x_mib + weight_mib + y_mib)
        for name in ("recompute", "keep", "recompute, one expression"):
            assert figures[name]["forward_ms"] > 0 and figures[name]["backward_ms"] > 0
