"""acl_swiglu.torch against hostile and careless callers: wrong types, dtypes, devices, layouts
and clamp limits; odd views; autograd corners (second derivatives, in-place changes, torch.func);
torch.compile and torch.export with bad inputs; the module's copies; threads and fork.

Every refusal names the argument, comes before the backend is asked for anything, and leaves the
caller's tensors as they were; every accepted odd input gives the NumPy one-shot call's bits."""

import copy
import io
import multiprocessing
import pickle
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="acl_swiglu.torch needs torch (pip install 'acl-swiglu[torch]')")

import acl_swiglu  # noqa: E402
import acl_swiglu.torch as at  # noqa: E402
from acl_swiglu import ArgumentError, bfloat16  # noqa: E402

OP = torch.ops.acl_swiglu.swiglu_group_quant_grad.default
INT_OF = {2: torch.int16, 4: torch.int32}
NO_DERIVATIVE = "has no derivative"


def _random(shape, dtype=torch.float32, seed=0, scale=2.0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _problem(dtype=torch.float32, rows=6, hidden=8, seed=0):
    """grad_y, x, weight [T, 1], y_origin."""
    weight = torch.rand(rows, 1, generator=torch.Generator().manual_seed(seed + 2)) + 0.5
    return (_random((rows, hidden), dtype, seed, 1.0), _random((rows, 2 * hidden), dtype, seed + 1), weight,
            _random((rows, hidden), dtype, seed + 3))


def _numpy(tensor):
    """A plain C-contiguous NumPy copy of a tensor's values (bfloat16 through its bits)."""
    tensor = tensor.detach().resolve_neg().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy().view(bfloat16).copy()
    return tensor.numpy().copy()


def _bits(tensor):
    tensor = tensor.detach().contiguous()
    return tensor.view(INT_OF[tensor.element_size()]) if tensor.is_floating_point() else tensor


def _one_shot(grad_y, x, weight=None, y_origin=None, group_index=None, clamp_limit=None):
    """The NumPy one-shot call on plain copies: the bits every torch call must give."""
    optional = [None if t is None else _numpy(t) for t in (weight, y_origin, group_index)]
    grad_x, grad_weight = acl_swiglu.swiglu_group_quant_grad(_numpy(grad_y), _numpy(x), *optional,
                                                             clamp_limit=clamp_limit)
    return at._from_numpy(grad_x), None if grad_weight is None else at._from_numpy(grad_weight)


def _assert_same_bits(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(_bits(got), _bits(expected))


@pytest.fixture
def backend_untouched(monkeypatch):
    """Fails the test if a refused call reached the NumPy call (and so the backend)."""
    calls = []
    real = acl_swiglu.swiglu_group_quant_grad
    monkeypatch.setattr(acl_swiglu, "swiglu_group_quant_grad", lambda *a, **k: calls.append(a) or real(*a, **k))
    yield calls
    assert calls == [], "a refused call reached the backend"


# ---- arguments of the wrong kind ----


def _wrapper_call(grad_y, x, **kwargs):
    return at.swiglu_group_quant_grad(grad_y, x, **kwargs)


NOT_TENSORS = [np.zeros((6, 8), np.float32), [[0.0] * 8] * 6, 1.5, "x"]


# None is refused only where an argument is required (elsewhere it is the valid "absent").
NOT_TENSOR_CASES = [(name, value) for name in ("grad_y", "x", "weight", "y_origin", "group_index")
                    for value in NOT_TENSORS + ([None] if name in ("grad_y", "x") else [])]


@pytest.mark.parametrize("name,value", NOT_TENSOR_CASES, ids=[f"{n}-{type(v).__name__}" for n, v in NOT_TENSOR_CASES])
def test_the_wrapper_refuses_what_is_not_a_tensor(name, value, backend_untouched):
    grad_y, x, weight, y_origin = _problem()
    arguments = dict(grad_y=grad_y, x=x, weight=weight, y_origin=y_origin)
    arguments[name] = value
    optional = name not in ("grad_y", "x")
    with pytest.raises(TypeError, match=f"^{name} must be a torch.Tensor{' or None' if optional else ''}, got "):
        _wrapper_call(arguments.pop("grad_y"), arguments.pop("x"), **arguments)


@pytest.mark.parametrize("name", ["grad_y", "x", "weight", "group_index"])
def test_the_raw_operator_names_the_argument_of_the_wrong_kind(name, backend_untouched):
    """The schema refuses a NumPy array for a Tensor argument (torch's own message names it)."""
    grad_y, x, weight, y_origin = _problem()
    arguments = dict(grad_y=grad_y, x=x, weight=weight, y_origin=y_origin)
    arguments[name] = np.zeros(3, np.int64)
    with pytest.raises(RuntimeError, match=f"for argument '{name}'"):
        OP(arguments.pop("grad_y"), arguments.pop("x"), **arguments)


def test_the_raw_operator_refuses_a_missing_required_tensor(backend_untouched):
    """The schema lets None through for a Tensor argument; the kernels refuse it by name."""
    grad_y, x, _, _ = _problem()
    with pytest.raises(TypeError, match="^grad_y must be a torch.Tensor, got NoneType"):
        OP(None, x)
    with pytest.raises(TypeError, match="^x must be a torch.Tensor, got NoneType"):
        OP(grad_y.requires_grad_(), None)


@pytest.mark.parametrize("name", ["weight", "group_index"])
@pytest.mark.parametrize("value", NOT_TENSORS, ids=lambda v: type(v).__name__)
def test_swiglu_refuses_what_is_not_a_tensor(name, value):
    x = _random((6, 16))
    with pytest.raises(TypeError, match=f"^{name} must be a torch.Tensor"):
        at.swiglu(x, **{name: value})
    with pytest.raises(TypeError, match="^x must be a torch.Tensor, got ndarray"):
        at.swiglu(x.numpy())


WRONG_DTYPES = [torch.float64, torch.int32, torch.bool, torch.complex64, torch.uint8]


@pytest.mark.parametrize("dtype", WRONG_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["grad_y", "x", "weight", "y_origin", "group_index"])
def test_wrong_dtypes_are_refused_by_name(name, dtype, backend_untouched):
    grad_y, x, weight, y_origin = _problem()
    arguments = dict(grad_y=grad_y, x=x, weight=weight, y_origin=y_origin, group_index=torch.tensor([2, 3]))
    arguments[name] = arguments[name].to(dtype)
    before = {key: t.clone() for key, t in arguments.items()}
    with pytest.raises(ArgumentError, match=f"^{name} (has dtype|is) {dtype}"):
        OP(arguments.pop("grad_y"), arguments.pop("x"), **arguments)
    for key, tensor in arguments.items():
        assert torch.equal(tensor, before[key])


def test_group_index_int32_and_2d_are_refused_by_swiglu_too():
    x = _random((6, 16))
    for group_index in (torch.tensor([1], dtype=torch.int32), torch.tensor([[1]]), torch.tensor(1)):
        with pytest.raises(ArgumentError, match="^group_index is .* it must be a 1-D torch.int64 tensor"):
            at.swiglu(x, group_index=group_index)


def test_recompute_y_origin_must_be_a_bool():
    with pytest.raises(TypeError, match="recompute_y_origin must be a bool, got str"):
        at.swiglu(_random((2, 8)), recompute_y_origin="no")
    with pytest.raises(TypeError, match="recompute_y_origin must be a bool, got int"):
        at.SwiGLU(recompute_y_origin=0)


# ---- devices and layouts ----


@pytest.mark.parametrize("name", ["grad_y", "weight", "y_origin", "group_index"])
def test_a_meta_tensor_among_cpu_ones_is_refused(name, backend_untouched):
    """torch runs a call that holds a meta tensor on the Meta kernel alone: without this check the
    'result' would be unwritten CPU memory."""
    grad_y, x, weight, y_origin = _problem()
    arguments = dict(grad_y=grad_y, x=x, weight=weight, y_origin=y_origin, group_index=torch.tensor([2, 3]))
    arguments[name] = arguments[name].to("meta")
    with pytest.raises(ArgumentError, match=f"^{name} is on meta but x is on cpu: all tensors must be on one device"):
        OP(arguments.pop("grad_y"), arguments.pop("x"), **arguments)


def test_cpu_tensors_with_a_meta_x_are_refused_and_all_meta_is_shape_only():
    grad_y, x, _, _ = _problem()
    with pytest.raises(ArgumentError, match="^grad_y is on cpu but x is on meta"):
        OP(grad_y, x.to("meta"))
    grad_x, grad_weight = OP(grad_y.to("meta"), x.to("meta"))
    assert grad_x.device.type == "meta" and grad_x.shape == x.shape and grad_weight.shape == (0,)
    with pytest.raises(ArgumentError, match="^weight is on meta but x is on cpu"):
        at.swiglu(x, torch.rand(6, device="meta"))
    with pytest.raises(ArgumentError, match="^group_index is on cpu but x is on meta"):
        at.swiglu(x.to("meta"), group_index=torch.tensor([3]))


def test_sparse_nested_and_quantized_tensors_are_refused():
    grad_y, x, weight, y_origin = _problem()
    with pytest.raises(ArgumentError, match=r"^x is a torch.sparse_coo tensor; the operator takes dense"):
        at.swiglu(x.to_sparse())
    with pytest.raises(ArgumentError, match=r"^weight is a torch.sparse_coo tensor"):
        at.swiglu(x, weight.to_sparse())
    # The raw operator has kernels for dense CPU (and NPU) tensors only: torch refuses the rest
    # by the backend's name before any kernel runs.
    for args, backend in (((grad_y.to_sparse(), x), "SparseCPU"), ((grad_y, x.to_sparse_csr()), "SparseCsrCPU"),
                          ((torch.quantize_per_tensor(grad_y, 0.1, 0, torch.qint8), x), "QuantizedCPU")):
        with pytest.raises(NotImplementedError, match=f"'{backend}' backend"):
            OP(*args)
    with pytest.raises((NotImplementedError, RuntimeError)):
        OP(torch.nested.nested_tensor([grad_y, grad_y]), torch.nested.nested_tensor([x, x]))


# ---- clamp_limit ----


REFUSED_SCHEMA_LIMITS = [
    (float("nan"), r"-1.0 \(off\) or > 0, got nan"), (0.0, r"-1.0 \(off\) or > 0, got 0.0"),
    (-2.0, r"-1.0 \(off\) or > 0, got -2.0"), (-0.9, r"got -0.9"), (float("-inf"), "got -inf"),
    (float("inf"), r"-1.0 \(off\) or a finite number > 0, got inf"), (1e-300, "rounds to 0 in float32"),
    (1e300, "beyond float32 range"), (3.5e38, "beyond float32 range"),
]


@pytest.mark.parametrize("value,message", REFUSED_SCHEMA_LIMITS, ids=[str(v) for v, _ in REFUSED_SCHEMA_LIMITS])
def test_schema_clamp_limits_are_refused_alike_by_the_real_and_the_fake_kernel(value, message, backend_untouched):
    from torch._subclasses.fake_tensor import FakeTensorMode
    grad_y, x, _, _ = _problem()
    with pytest.raises(ArgumentError, match=f"^clamp_limit.*{message}") as real:
        OP(grad_y, x, clamp_limit=value)
    with FakeTensorMode() as mode:
        with pytest.raises(ArgumentError) as fake:
            OP(mode.from_tensor(grad_y), mode.from_tensor(x), clamp_limit=value)
    assert str(fake.value) == str(real.value)


def test_the_off_value_is_decided_in_float32_and_tiny_limits_are_limits():
    grad_y, x, _, _ = _problem()
    x[0, :3] = torch.tensor([1e-44, 0.0, -1e-44])
    off = OP(grad_y, x)[0]
    # -1.0 + 2**-30 is -1.0 in fp32: the operator's "off", bit for bit.
    _assert_same_bits(OP(grad_y, x, clamp_limit=-1.0 + 2.0**-30)[0], off)
    _assert_same_bits(OP(grad_y, x, clamp_limit=1e-45)[0], _one_shot(grad_y, x, clamp_limit=1e-45)[0])
    assert not torch.equal(OP(grad_y, x, clamp_limit=1e-45)[0], off)


PYTHON_LIMITS_BY_TYPE = [True, np.bool_(True), "1.0", torch.tensor(1.0), [1.0], 1j]
PYTHON_LIMITS_BY_VALUE = [float("nan"), float("inf"), 0.0, -1.0, 1e-300, 1e300, 10**400, np.float32("nan")]


def _python_level_calls(clamp_limit):
    grad_y, x, _, _ = _problem()
    return {"wrapper": lambda: at.swiglu_group_quant_grad(grad_y, x, clamp_limit=clamp_limit),
            "swiglu": lambda: at.swiglu(x, clamp_limit=clamp_limit),
            "SwiGLU": lambda: at.SwiGLU(clamp_limit=clamp_limit)}


@pytest.mark.parametrize("api", ["wrapper", "swiglu", "SwiGLU"])
@pytest.mark.parametrize("value", PYTHON_LIMITS_BY_TYPE, ids=lambda v: type(v).__name__)
def test_python_level_clamp_limits_of_the_wrong_type(api, value, backend_untouched):
    with pytest.raises(TypeError, match=r"^clamp_limit must be None \(off\) or a real number > 0, got "):
        _python_level_calls(value)[api]()


@pytest.mark.parametrize("api", ["wrapper", "swiglu", "SwiGLU"])
@pytest.mark.parametrize("value", PYTHON_LIMITS_BY_VALUE, ids=lambda v: "10**400" if type(v) is int else str(v))
def test_python_level_clamp_limits_out_of_range(api, value, backend_untouched):
    """Refused where they are given, not in a backward much later (swiglu once took inf, 1e-300
    and 1e300 in its forward and failed only in backward, or with torch's overflow message)."""
    with pytest.raises(ArgumentError, match="^clamp_limit"):
        _python_level_calls(value)[api]()


def test_python_level_clamp_limits_of_other_number_types_are_the_same_limit():
    grad_y, x, _, _ = _problem()
    expected = at.swiglu_group_quant_grad(grad_y, x, clamp_limit=1.5)[0]
    for value in (np.float32(1.5), np.float64(1.5)):
        _assert_same_bits(at.swiglu_group_quant_grad(grad_y, x, clamp_limit=value)[0], expected)
    _assert_same_bits(at.swiglu(x, clamp_limit=2), at.swiglu(x, clamp_limit=2.0))
    assert at.SwiGLU(clamp_limit=np.float32(0.5)).clamp_limit == 0.5


# ---- the fake kernel refuses what the real one refuses ----


def _bad_calls():
    grad_y, x, weight, y_origin = _problem(rows=1)
    return {
        "weight-0d": (dict(weight=torch.tensor(1.0), y_origin=y_origin), "weight has 0 dims"),
        "weight-9d": (dict(weight=torch.ones([1] * 9), y_origin=y_origin), "weight has 9 dims"),
        "weight-count": (dict(weight=torch.ones(2), y_origin=y_origin), "weight has 2 elements"),
        "y_origin-alone": (dict(y_origin=y_origin), "y_origin is given without weight"),
        "weight-alone": (dict(weight=weight), "y_origin is required with weight"),
        "group_index-meta": (dict(group_index=torch.tensor([1], device="meta")), "group_index is on meta"),
        "clamp-inf": (dict(clamp_limit=float("inf")), "clamp_limit must be"),
    }, grad_y, x


@pytest.mark.parametrize("case", list(_bad_calls()[0]))
def test_fake_and_real_kernels_refuse_the_same_calls(case):
    from torch._subclasses.fake_tensor import FakeTensorMode
    calls, grad_y, x = _bad_calls()
    kwargs, message = calls[case]
    with pytest.raises(ArgumentError, match=message) as real:
        OP(grad_y, x, **kwargs)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_kwargs = {k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        with pytest.raises(ArgumentError) as fake:
            OP(mode.from_tensor(grad_y), mode.from_tensor(x), **fake_kwargs)
    assert str(fake.value) == str(real.value)


@pytest.mark.emulator_only
@pytest.mark.parametrize("abi", [1, 2], indirect=True)
def test_fake_and_real_kernels_follow_the_abi_revisions_shape_rules(abi):
    """Revision 1 takes ranks 2-3 and weight [..., 1] only; the fake kernel knows it too."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    calls = {"rank-1": (torch.zeros(8), torch.zeros(16), {}),
             "rank-4": (torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 16), {}),
             "weight-[T]": (torch.zeros(2, 8), torch.zeros(2, 16), dict(weight=torch.ones(2), y_origin=torch.zeros(2, 8)))}
    for name, (grad_y, x, kwargs) in calls.items():
        with FakeTensorMode() as mode:
            fake_kwargs = {k: mode.from_tensor(v) for k, v in kwargs.items()}
            try:
                fake = OP(mode.from_tensor(grad_y), mode.from_tensor(x), **fake_kwargs)[0].shape
            except ArgumentError as error:
                fake = str(error)
        try:
            real = OP(grad_y, x, **kwargs)[0].shape
        except ArgumentError as error:
            real = str(error)
        assert fake == real, name
        assert (real == x.shape) == (abi == 2), (name, real)
        if abi == 1:
            assert "ABI revision 1" in real
            if x.dim() != 2:
                with pytest.raises(ArgumentError, match="ABI revision 1"):   # swiglu too, in its forward
                    at.swiglu(x)
            else:   # the Python-level call gives the operator a flat weight as [T, 1] on either revision
                grad_x, grad_weight = at.swiglu_group_quant_grad(grad_y, x, **kwargs)
                assert grad_x.shape == x.shape and grad_weight.shape == kwargs["weight"].shape


# ---- odd but valid views: the one-shot bits, inputs untouched ----


def _odd_views(kind):
    """(grad_y, x, weight, y_origin, group_index) with one kind of odd memory layout."""
    grad_y, x, weight, y_origin = _problem(rows=6, hidden=8, seed=5)
    group_index = None
    if kind == "overlapping-x":   # rows overlapping in memory: x[t] starts 3 elements after x[t-1]
        x = _random(64, seed=6).as_strided((6, 16), (3, 1))
    elif kind == "stride-0":   # every row the same memory
        grad_y, x, y_origin = (_random((1, n), seed=7 + n).expand(6, n) for n in (8, 16, 8))
        weight = torch.tensor([[0.75]]).expand(6, 1)
    elif kind == "channels-last":
        grad_y, x, y_origin = (_random((2, 3, 1, n), seed=n).to(memory_format=torch.channels_last) for n in (8, 16, 8))
        weight = torch.rand(2, 3, 1, 1)
    elif kind == "large-offset":
        storage = _random(1_000_000 + 96, seed=9)
        x = storage[1_000_000:].view(6, 16)
    elif kind == "negative-bit":   # a lazily negated view: torch resolves it, the values are -x
        x = _random((6, 16), seed=10)._neg_view()
    elif kind == "group-index-views":   # stride 0, then a strided slice with an offset
        group_index = torch.tensor([1]).expand(3)
    elif kind == "group-index-strided":
        group_index = torch.arange(8, dtype=torch.int64)[1::3]   # [1, 4, 7]: sum beyond T
    return grad_y, x, weight, y_origin, group_index


ODD_VIEWS = ["overlapping-x", "stride-0", "channels-last", "large-offset", "negative-bit", "group-index-views",
             "group-index-strided"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ODD_VIEWS)
def test_odd_views_give_the_one_shot_bits_and_stay_untouched(kind, dtype):
    grad_y, x, weight, y_origin, group_index = _odd_views(kind)
    grad_y, x, y_origin = (t.to(dtype) if dtype != torch.float32 else t for t in (grad_y, x, y_origin))
    inputs = [grad_y, x, weight, y_origin] + ([group_index] if group_index is not None else [])
    before = [(t.clone(), t.stride(), t.storage_offset()) for t in inputs]
    got = at.swiglu_group_quant_grad(grad_y, x, weight=weight, y_origin=y_origin, group_index=group_index,
                                     clamp_limit=1.25)
    expected = _one_shot(grad_y, x, weight, y_origin, group_index, clamp_limit=1.25)
    _assert_same_bits(got[0], expected[0])
    _assert_same_bits(got[1], expected[1])
    for tensor, (values, stride, offset) in zip(inputs, before):
        assert torch.equal(_bits(tensor.resolve_neg()), _bits(values.resolve_neg()))
        assert tensor.stride() == stride and tensor.storage_offset() == offset


@pytest.mark.parametrize("shape", [(0, 8), (6, 0), (2, 0, 8)], ids=str)
def test_zero_size_dims(shape):
    grad_y = torch.zeros(shape)
    x = torch.zeros(*shape[:-1], 2 * shape[-1])
    rows = int(np.prod(shape[:-1]))
    weight, y_origin = torch.ones(rows), torch.zeros(shape)
    grad_x, grad_weight = at.swiglu_group_quant_grad(grad_y, x, weight=weight, y_origin=y_origin)
    assert grad_x.shape == x.shape and grad_weight.shape == (rows,)
    expected = _one_shot(grad_y, x, weight, y_origin)
    _assert_same_bits(grad_x, expected[0])
    _assert_same_bits(grad_weight, expected[1])


def test_shapes_past_memory_are_refused_before_allocating():
    storage = torch.zeros(16)
    grad_y = storage[:8].as_strided((2**40, 8), (0, 1))
    x = storage.as_strided((2**40, 16), (0, 1))
    with pytest.raises(acl_swiglu.HostMemoryError, match="grad_x"):
        at.swiglu_group_quant_grad(grad_y, x)


@pytest.mark.parametrize("counts", [[-1, 3], [2**63 - 1, 2**63 - 1], [2**32 + 2], [100], [], [0, 0]],
                         ids=str)
def test_group_index_counts_wrap_in_uint32_and_cap_at_rows(counts):
    grad_y, x, weight, y_origin = _problem(rows=6, hidden=8, seed=11)
    group_index = torch.tensor(counts, dtype=torch.int64)
    got = at.swiglu_group_quant_grad(grad_y, x, weight=weight, y_origin=y_origin, group_index=group_index)
    expected = _one_shot(grad_y, x, weight, y_origin, group_index)
    _assert_same_bits(got[0], expected[0])
    _assert_same_bits(got[1], expected[1])
    trunc = min(sum(c % 2**32 for c in counts) % 2**32, 6)
    golden_x, golden_w = acl_swiglu.reference.swiglu_group_quant_grad(
        _numpy(grad_y), _numpy(x), _numpy(weight), _numpy(y_origin), np.array(counts, np.int64))
    for actual, golden in ((got[0], golden_x), (got[1], golden_w)):
        assert acl_swiglu.reference.compare(_numpy(actual), golden).passed
    assert torch.all(got[0][trunc:] == 0) and torch.all(got[1][trunc:] == 0)


# ---- autograd ----


def test_the_raw_operator_is_not_differentiable_and_says_so():
    """Without a derivative of its own, torch once only warned and gave no gradient."""
    grad_y, x, weight, y_origin = _problem()
    grad_y.requires_grad_()
    grad_x, grad_weight = OP(grad_y, x, weight=weight, y_origin=y_origin)
    assert grad_x.requires_grad
    _assert_same_bits(grad_x, _one_shot(grad_y, x, weight, y_origin)[0])
    with pytest.raises(NotImplementedError, match=f"swiglu_group_quant_grad {NO_DERIVATIVE}"):
        grad_x.sum().backward()
    with torch.no_grad():
        assert not OP(grad_y, x)[0].requires_grad
    with torch.inference_mode():
        _assert_same_bits(OP(grad_y, x)[0], _one_shot(grad_y, x)[0])


def test_second_order_gradients_of_swiglu_are_refused():
    x = _random((6, 16), seed=12).requires_grad_()
    weight = (torch.rand(6) + 0.5).requires_grad_()
    first, = torch.autograd.grad(at.swiglu(x, weight, clamp_limit=1.0).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match=NO_DERIVATIVE):
        torch.autograd.grad(first.sum(), [x, weight])
    # The first-order gradient taken with create_graph=True is the usual one.
    plain, = torch.autograd.grad(at.swiglu(x, weight, clamp_limit=1.0).sum(), x)
    _assert_same_bits(first, plain)


def test_torch_func_first_order_works_and_second_order_is_refused():
    x = _random((6, 16), seed=13)

    def loss(a):
        return at.swiglu(a, clamp_limit=1.0).sum()

    eager = x.clone().requires_grad_()
    loss(eager).backward()
    _assert_same_bits(torch.func.grad(loss)(x), eager.grad)
    _, vjp = torch.func.vjp(lambda a: at.swiglu(a, clamp_limit=1.0), x)
    _assert_same_bits(vjp(torch.ones(6, 8))[0], eager.grad)
    with pytest.raises(NotImplementedError, match=NO_DERIVATIVE):
        torch.func.grad(lambda a: torch.func.grad(loss)(a).sum())(x)
    with pytest.raises(NotImplementedError, match=NO_DERIVATIVE):
        torch.func.grad(lambda gy: OP(gy, x)[0].sum())(torch.ones(6, 8))
    with pytest.raises(RuntimeError, match="vmap"):
        torch.func.vmap(at.swiglu)(x[None].expand(2, 6, 16))
    with pytest.raises(NotImplementedError, match="jvp"):
        torch.func.jvp(at.swiglu, (x,), (torch.ones_like(x),))


def test_vmap_of_the_operator_is_the_per_sample_loop():
    grad_y = _random((3, 6, 8), seed=14)
    x = _random((3, 6, 16), seed=15)
    batched, _ = torch.func.vmap(lambda gy, a: OP(gy, a, clamp_limit=2.0))(grad_y, x)
    for i in range(3):
        _assert_same_bits(batched[i], _one_shot(grad_y[i], x[i], clamp_limit=2.0)[0])


@pytest.mark.parametrize("x_grad,weight_grad", [(True, True), (True, False), (False, True)])
def test_swiglu_gradients_are_the_operator_on_whichever_inputs_require_grad(x_grad, weight_grad):
    x = _random((6, 16), torch.bfloat16, 16).requires_grad_(x_grad)
    weight = (torch.rand(6, 1, generator=torch.Generator().manual_seed(17)) + 0.5).requires_grad_(weight_grad)
    grad_out = _random((6, 8), torch.bfloat16, 18, 1.0)
    group_index = torch.tensor([4])
    at.swiglu(x, weight, clamp_limit=1.0, group_index=group_index).backward(grad_out)
    y_origin = at._unweighted(x.detach(), 1.0, group_index).to(torch.bfloat16)
    expect_x, expect_w = _one_shot(grad_out, x, weight, y_origin, group_index, clamp_limit=1.0)
    assert (x.grad is not None) == x_grad and (weight.grad is not None) == weight_grad
    if x_grad:
        _assert_same_bits(x.grad, expect_x)
    if weight_grad:
        _assert_same_bits(weight.grad, expect_w)


def test_retain_graph_gives_the_same_gradient_twice():
    x = _random((6, 16), seed=19).requires_grad_()
    out = at.swiglu(x, torch.rand(6).requires_grad_(), clamp_limit=1.0)
    first, = torch.autograd.grad(out.sum(), x, retain_graph=True)
    second, = torch.autograd.grad(out.sum(), x)
    _assert_same_bits(first, second)


@pytest.mark.parametrize("changed", ["x", "weight", "group_index"])
def test_inputs_changed_in_place_before_backward_are_caught(changed):
    x = _random((6, 16), seed=20).requires_grad_()
    weight = (torch.rand(6) + 0.5).requires_grad_()
    inputs = {"x": x.clone(), "weight": weight.clone(), "group_index": torch.tensor([3])}
    out = at.swiglu(inputs["x"], inputs["weight"], group_index=inputs["group_index"])
    with torch.no_grad():
        inputs[changed].add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_no_grad_and_inference_mode_give_the_same_values_without_a_graph():
    x = _random((6, 16), seed=21).requires_grad_()
    weight = torch.rand(6)
    expected = at.swiglu(x, weight, clamp_limit=1.0)
    assert expected.requires_grad
    with torch.no_grad():
        plain = at.swiglu(x, weight, clamp_limit=1.0)
    with torch.inference_mode():
        inference = at.swiglu(x, weight, clamp_limit=1.0)
    for result in (plain, inference):
        assert not result.requires_grad
        _assert_same_bits(result, expected)


# ---- torch.compile and torch.export with bad inputs ----


def test_compile_refuses_bad_inputs_with_the_message():
    torch._dynamo.reset()
    grad_y, x, _, y_origin = _problem()
    compiled = torch.compile(at.swiglu_group_quant_grad, backend="aot_eager")
    # Dynamo wraps what the fake kernel raises in its own RuntimeError; the message is ours.
    with pytest.raises(RuntimeError, match="y_origin is given without weight"):
        compiled(grad_y, x, y_origin=y_origin)
    with pytest.raises(RuntimeError, match="group_index is on meta but x is on cpu"):
        compiled(grad_y, x, group_index=torch.tensor([1], device="meta"))
    with pytest.raises(ArgumentError, match="clamp_limit must be None"):
        compiled(grad_y, x, clamp_limit=0.0)
    torch._dynamo.reset()


def test_compile_of_the_operator_on_tensors_that_require_grad_says_why_it_fails():
    torch._dynamo.reset()
    grad_y, x, _, _ = _problem()
    compiled = torch.compile(lambda a, b: OP(a, b)[0], backend="aot_eager")
    with pytest.raises(Exception, match=NO_DERIVATIVE):
        compiled(grad_y, x.requires_grad_())
    with torch.no_grad():
        _assert_same_bits(compiled(grad_y, x), _one_shot(grad_y, x)[0])
    torch._dynamo.reset()


class _Operator(torch.nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, grad_y, x):
        return OP(grad_y, x, **self.options)


@pytest.mark.parametrize("arguments,options,message", [
    (lambda gy, x: (gy.double(), x.double()), {}, "x has dtype torch.float64"),
    (lambda gy, x: (gy, x), {"clamp_limit": 0.0}, r"clamp_limit must be -1.0 \(off\) or > 0"),
    (lambda gy, x: (gy, x), {"clamp_limit": float("inf")}, "finite"),
    (lambda gy, x: (gy.to("meta"), x), {}, "grad_y is on meta"),
], ids=["float64", "clamp-0", "clamp-inf", "meta"])
def test_export_refuses_bad_inputs_with_argument_error(arguments, options, message):
    grad_y, x, _, _ = _problem()
    with pytest.raises(ArgumentError, match=message):
        torch.export.export(_Operator(**options), arguments(grad_y, x))


# ---- the module ----


def test_module_copies_and_state():
    module = at.SwiGLU(clamp_limit=7.0, recompute_y_origin=False)
    assert repr(module) == "SwiGLU(clamp_limit=7.0, recompute_y_origin=False)"
    assert dict(module.state_dict()) == {}
    x = _random((6, 16), torch.bfloat16, 22)
    weight = torch.rand(6)
    expected = module(x, weight)
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    copies = [copy.deepcopy(module), pickle.loads(pickle.dumps(module)), torch.load(buffer, weights_only=False)]
    for other in copies:
        assert (other.clamp_limit, other.recompute_y_origin) == (7.0, False)
        _assert_same_bits(other(x, weight), expected)
    module.load_state_dict({})   # nothing to load: the module has no parameters


def test_module_construction_validates_its_options():
    with pytest.raises(ArgumentError, match="clamp_limit"):
        at.SwiGLU(clamp_limit=float("inf"))
    with pytest.raises(TypeError, match="clamp_limit"):
        at.SwiGLU(clamp_limit="7")
    module = at.SwiGLU(clamp_limit=1.0)
    module.clamp_limit = -5.0   # changed behind the constructor's back: refused at the call
    with pytest.raises(ArgumentError, match="clamp_limit"):
        module(_random((2, 8)))


# ---- threads and fork ----


def test_threads_give_the_serial_bits():
    problems = [_problem(torch.bfloat16, rows=8, hidden=16, seed=s) for s in range(4)]

    def call(i):
        grad_y, x, weight, y_origin = problems[i % 4]
        return at.swiglu_group_quant_grad(grad_y, x, weight=weight, y_origin=y_origin, clamp_limit=1.0,
                                          group_index=torch.tensor([i % 4 + 3]))

    serial = [call(i) for i in range(4)]
    results, errors = {}, []

    def work(i):
        try:
            for k in range(4):
                results[(i, k)] = call(i)
        except BaseException as error:   # reported below: a thread's exception is otherwise lost
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads) and errors == []
    for (i, _), (grad_x, grad_weight) in results.items():
        _assert_same_bits(grad_x, serial[i % 4][0])
        _assert_same_bits(grad_weight, serial[i % 4][1])
    assert len(results) == 32


def _use_in_child(queue):
    try:
        grad_y, x, _, _ = _problem()
        at.swiglu_group_quant_grad(grad_y, x)
        queue.put(("worked", ""))
    except BaseException as error:
        queue.put((type(error).__name__, str(error)))


def _fork_and_use():
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_use_in_child, args=(queue,))
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the forked child hung")
    return queue.get(timeout=10)


@pytest.mark.emulator_only
@pytest.mark.parametrize("busy_threads", [0, 2])
def test_a_forked_child_gets_a_clear_error_not_a_hang(busy_threads):
    """Forked after the parent used the backend, also while other threads are inside calls."""
    grad_y, x, _, _ = _problem(rows=64, hidden=256)
    at.swiglu_group_quant_grad(grad_y, x)   # the parent has initialised the backend
    stop = threading.Event()
    started = threading.Barrier(busy_threads + 1)

    def busy():
        started.wait()
        while not stop.is_set():
            at.swiglu_group_quant_grad(grad_y, x, clamp_limit=1.0)

    threads = [threading.Thread(target=busy) for _ in range(busy_threads)]
    for thread in threads:
        thread.start()
    try:
        started.wait()
        outcomes = [_fork_and_use() for _ in range(3)]
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    for kind, message in outcomes:
        assert kind == "AclError" and "forked" in message and "'spawn'" in message, (kind, message)
    assert at.swiglu_group_quant_grad(grad_y, x)[0].shape == x.shape   # the parent still works
