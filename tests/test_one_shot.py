"""The one-shot NumPy call (swiglu_group_quant_grad) on every kind of host array a user may hand
it: strided, read-only, reversed, Fortran-ordered, broadcast, non-native byte order, every dtype,
empty; NumPy subclasses (with a __dict__, with __slots__, np.matrix, np.memmap read-write and
read-only); transparent proxies whose __class__ says ndarray; objects that merely claim to be
ndarrays; wrong dtypes (one a foreign dtype named "bfloat16"); outputs too large for the host;
an input resized from another thread. Each call gives the bits of the plain array it stands for,
or is refused with a clear error before anything is allocated: never a misread.
"""

from __future__ import annotations

import gc
import threading

import ml_dtypes
import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import emulator, errors

from swiglu_cases import (CLAMP, Proxy, case, check_clamp_types, idle_counts, model, same_bits, want,
                          weighted_case)

PHASE1 = "aclnnSwigluGroupQuantGradGetWorkspaceSize"
PHASE2 = "aclnnSwigluGroupQuantGrad"
BF16 = np.dtype(ml_dtypes.bfloat16)


def one_shot(*args, **kw):
    return acl_swiglu.swiglu_group_quant_grad(*args, **kw)


# ---- layouts and dtypes ----


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["fp32", "fp16", "bf16"])
def test_strided_readonly_and_reversed_inputs_of_every_dtype(dtype):
    gy, x, weight, y_origin = weighted_case(5, 8, seed=12, dtype=dtype)
    gy, x, y_origin = (a.reshape(5, 1, -1).repeat(2, axis=1) for a in (gy, x, y_origin))   # rank 3
    weight = np.repeat(weight, 2).reshape(5, 2, 1)
    groups = np.array([4, 3], np.int64)
    want_x, want_w = model(gy, x, weight, y_origin, groups, CLAMP)
    readonly = x.copy()
    readonly.flags.writeable = False
    strided = np.repeat(gy, 2, axis=-1)[..., ::2]            # positive strides: staged as they are
    flipped = np.ascontiguousarray(weight[::-1])[::-1]      # negative strides: copied in C order
    for _ in range(2):   # the second call of the layout
        grad_x, grad_w = one_shot(strided, readonly, flipped, y_origin, groups, CLAMP)
        assert same_bits(grad_x, want_x) and same_bits(grad_w, want_w)
    empty_x, empty_w = one_shot(gy[:0], x[:0])
    assert empty_x.shape == (0, 2, 16) and empty_x.dtype == np.dtype(dtype) and empty_w is None


@pytest.mark.parametrize("kind", ["plain", "sliced", "readonly", "reversed", "bf16", "empty", "scalar-weight-rows"])
def test_host_array_kinds_give_the_bits_of_their_values(kind):
    gy, x, weight, y_origin = weighted_case(6, 8, seed=35)
    if kind == "sliced":
        gy, x = np.repeat(gy, 2, axis=0)[::2], np.repeat(x, 2, axis=0)[::2]
    elif kind == "readonly":
        for array in (gy, x, weight, y_origin):
            array.flags.writeable = False
    elif kind == "reversed":
        gy, x = gy[::-1], x[::-1]
    elif kind == "bf16":
        gy, x, y_origin = (a.astype(BF16) for a in (gy, x, y_origin))
    elif kind == "empty":
        gy, x, weight, y_origin = gy[:0], x[:0], weight[:0], y_origin[:0]
    elif kind == "scalar-weight-rows":
        weight = np.broadcast_to(np.float32(0.75), weight.shape)
    expected = model(gy, x, weight, y_origin, clamp=0.5)
    for _ in range(2):
        got = one_shot(gy, x, weight, y_origin, clamp_limit=0.5)
        assert got[0].shape == expected[0].shape and got[1].shape == expected[1].shape
        assert same_bits(got[0], expected[0]) and same_bits(got[1], expected[1]), kind


def _variants(gy, x):
    swapped = (gy.astype(gy.dtype.newbyteorder(">")), x.astype(x.dtype.newbyteorder(">")))
    readonly = (gy.copy(), x.copy())
    for array in readonly:
        array.flags.writeable = False
    return {"swapped": swapped, "readonly": readonly,
            "strided": (np.repeat(gy, 2, axis=-1)[..., ::2], np.repeat(x, 3, axis=0)[::3]),
            "flipped": (np.ascontiguousarray(gy[::-1])[::-1], np.ascontiguousarray(x[:, ::-1])[:, ::-1]),
            "fortran": (np.asfortranarray(gy), np.asfortranarray(x)),
            "broadcast": (np.broadcast_to(gy[:1], gy.shape), np.broadcast_to(x[:1], x.shape)),
            "swapped-strided": (swapped[0][::-1][::-1], np.repeat(swapped[1], 2, axis=0)[::2])}


def test_host_array_variants_alternating_with_the_plain_layout():
    """Each variant gives the bits of its values, alternating with plain arrays of the same
    shape (whose layout calls keep using), and leaves its inputs as they were."""
    gy, x = case(6, 16, seed=7)
    plain = want(gy, x)
    variants = _variants(gy, x)
    for round_ in range(2):
        for name, (v_gy, v_x) in variants.items():
            before = (v_gy.copy(), v_x.copy())
            got = one_shot(v_gy, v_x, clamp_limit=CLAMP)[0]
            assert same_bits(got, want(v_gy.astype(np.float32), v_x.astype(np.float32))), (round_, name)
            assert all(same_bits(a, b) for a, b in zip(before, (v_gy, v_x))), name   # inputs untouched
            assert same_bits(one_shot(gy, x, clamp_limit=CLAMP)[0], plain)


class Tagged(np.ndarray):
    """A subclass with a __dict__."""

    def __array_finalize__(self, obj):
        self.tag = getattr(obj, "tag", "tagged")


class Slotted(np.ndarray):
    """A subclass with __slots__."""

    __slots__ = ("first", "second")


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")   # (np.matrix)
def test_numpy_subclasses_give_the_bits_of_their_values(tmp_path):
    gy, x = case(6, 16, seed=23)
    expected = want(gy, x)
    before = idle_counts()
    memmaps = []
    for name, array in (("g", gy), ("x", x)):
        mapped = np.memmap(tmp_path / name, dtype=np.float32, mode="w+", shape=array.shape)
        mapped[:] = array
        mapped.flush()
        memmaps.append(mapped)
    readonly = [np.memmap(tmp_path / n, dtype=np.float32, mode="r", shape=a.shape) for n, a in (("g", gy), ("x", x))]
    cases = {"tagged": (gy.view(Tagged), x.view(Tagged)), "slotted": (gy.view(Slotted), x.view(Slotted)),
             "matrix": (np.matrix(gy), np.matrix(x)), "memmap": tuple(memmaps), "memmap-readonly": tuple(readonly),
             "tagged-strided": (np.repeat(gy, 2, axis=0)[::2].view(Tagged), x.view(Tagged)),
             "slotted-swapped": (gy.astype(">f4").view(Slotted), x.view(Slotted)),
             "memmap-column-slice": (np.memmap(tmp_path / "x", dtype=np.float32, mode="r",
                                               shape=x.shape)[:, :16], x)}
    for name, (v_gy, v_x) in cases.items():
        grad_x, grad_w = one_shot(v_gy, v_x, clamp_limit=CLAMP)
        assert type(grad_x) is np.ndarray and grad_w is None, name
        assert same_bits(grad_x, want(np.asarray(v_gy, np.float32), np.asarray(v_x, np.float32))), name
    assert same_bits(one_shot(*cases["memmap-readonly"], clamp_limit=CLAMP)[0], expected)
    del memmaps, readonly, cases
    gc.collect()
    assert idle_counts() == before


# ---- proxies and impostors ----


@pytest.mark.parametrize("rows", [64, 2048])
def test_transparent_proxies_give_the_bits_of_the_arrays_they_stand_for(rows):
    """A proxy whose __class__ answers ndarray is an ndarray to isinstance(), but its own memory
    is a small Python object: the call must read the array it stands for (or refuse it)."""
    gy, x, weight, y_origin = weighted_case(rows, 64, seed=rows)
    groups = np.array([rows // 2, rows // 4], np.int64)
    assert isinstance(Proxy(gy), np.ndarray) and type(Proxy(gy)) is Proxy
    expected = model(gy, x, weight, y_origin, groups, CLAMP)
    plain = one_shot(gy, x, weight, y_origin, groups, CLAMP)
    assert same_bits(plain[0], expected[0]) and same_bits(plain[1], expected[1])
    for proxied in ({0, 1}, {0, 1, 2, 3, 4}, {1}, {4}):
        arguments = [Proxy(a) if i in proxied else a for i, a in enumerate((gy, x, weight, y_origin, groups))]
        for _ in range(2):
            grad_x, grad_w = one_shot(*arguments, CLAMP)
            assert same_bits(grad_x, expected[0]) and same_bits(grad_w, expected[1]), proxied
    assert same_bits(one_shot(Proxy(Proxy(gy)), x, clamp_limit=CLAMP)[0], want(gy, x))   # a proxy of a proxy


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")   # (np.matrix)
@pytest.mark.parametrize("kind", ["strided", "readonly", "swapped", "float16", "reversed", "matrix"])
def test_proxies_of_other_array_kinds(kind):
    gy, x = case(8, 16, seed=41)
    if kind == "strided":
        gy = np.repeat(gy, 2, axis=0)[::2]
    elif kind == "readonly":
        gy = gy.copy()
        gy.flags.writeable = False
    elif kind == "swapped":
        gy = gy.astype(">f4")
    elif kind == "float16":
        gy, x = gy.astype(np.float16), x.astype(np.float16)
    elif kind == "reversed":
        gy = gy[::-1]
    elif kind == "matrix":
        gy = np.matrix(gy)
    expected = one_shot(np.array(gy), np.array(x), clamp_limit=CLAMP)[0]
    for _ in range(2):
        assert same_bits(one_shot(Proxy(gy), Proxy(x), clamp_limit=CLAMP)[0], expected), kind
    with acl_swiglu.to_device(Proxy(gy)) as device:
        assert same_bits(device.to_numpy(), np.asarray(np.array(gy), np.array(gy).dtype.newbyteorder("=")))


def test_a_proxy_of_a_bfloat16_array_is_never_misread():
    gy, x = case(6, 16, seed=43, dtype=BF16)
    expected = one_shot(gy, x, clamp_limit=CLAMP)[0]
    for arguments in ((Proxy(gy), x), (gy, Proxy(x)), (Proxy(gy), Proxy(x))):
        try:
            got = one_shot(*arguments, clamp_limit=CLAMP)[0]
        except (TypeError, errors.ArgumentError):
            continue
        assert same_bits(got, expected)


def test_a_proxy_of_a_bfloat16_array_gives_its_bits_or_a_refusal_that_names_the_proxy():
    gy, x = case(6, 16, seed=43, dtype=BF16)
    expected = one_shot(gy, x, clamp_limit=CLAMP)[0]
    try:
        got = one_shot(Proxy(gy), x, clamp_limit=CLAMP)[0]
    except (TypeError, errors.ArgumentError) as exc:
        assert "void" not in str(exc) and "Proxy" in str(exc), str(exc)
    else:
        assert same_bits(got, expected)


class _Impostor:
    """Claims to be an ndarray of float32 [6, 16] and has no data."""

    @property  # type: ignore[misc]
    def __class__(self):
        return np.ndarray

    shape, ndim, size, dtype, strides = (6, 16), 2, 96, np.dtype(np.float32), (64, 4)


class _SequenceImpostor(_Impostor):
    """... and reads as a nested sequence of Python floats."""

    def __len__(self):
        return 6

    def __getitem__(self, index):
        if index >= 6:
            raise IndexError(index)
        return [0.5] * 16


@pytest.mark.parametrize("impostor", [_Impostor, _SequenceImpostor])
def test_objects_that_merely_claim_to_be_ndarrays_are_refused(impostor):
    _, x = case(6, 16, seed=45)
    one_shot(np.ones((6, 16), np.float32), x)   # (the thread's stream exists)
    before = emulator.live_counts()
    for position in (0, 1):
        arguments = [np.ones((6, 16), np.float32), x]
        arguments[position] = impostor()
        with pytest.raises((TypeError, errors.ArgumentError), match="grad_y|x"):
            one_shot(*arguments)
    assert emulator.live_counts() == before


# ---- refusals ----


@pytest.mark.parametrize("bad", ["object", "float64", "int32", "structured", "foreign-bfloat16-name",
                                 "complex64"])
def test_wrong_dtypes_are_refused_before_anything_is_allocated(bad):
    gy, x = case(3, 8, seed=29)

    class bfloat16(np.void):   # a dtype whose name is "bfloat16" and is not ml_dtypes' one
        pass

    arrays = {"object": gy.astype(object), "float64": gy.astype(np.float64), "int32": gy.astype(np.int32),
              "structured": np.zeros(gy.shape, [("bfloat16", "<u2")]),
              "foreign-bfloat16-name": np.zeros(gy.shape, np.dtype(bfloat16)), "complex64": gy.astype(np.complex64)}
    assert np.dtype(bfloat16).name == "bfloat16"
    before = idle_counts()
    with pytest.raises(errors.ArgumentError, match="grad_y has dtype"):
        one_shot(arrays[bad], x, clamp_limit=CLAMP)
    with pytest.raises(errors.ArgumentError, match="grad_y has dtype"):
        one_shot(Proxy(arrays[bad]), x, clamp_limit=CLAMP)
    assert emulator.live_counts() == before   # (no thread stream made either)


@pytest.mark.parametrize("wrap", ["plain", "subclass", "proxy"])
def test_outputs_too_large_for_the_host_are_refused_with_host_memory_error(wrap):
    gy = np.broadcast_to(np.float32(1), (2**31, 2**20))
    x = np.broadcast_to(np.float32(1), (2**31, 2**21))
    if wrap == "subclass":
        gy, x = gy.view(Tagged), x.view(Tagged)
    elif wrap == "proxy":
        gy, x = Proxy(gy), Proxy(x)
    before = idle_counts()
    with pytest.raises(acl_swiglu.HostMemoryError, match="grad_x") as info:
        one_shot(gy, x)
    assert isinstance(info.value, MemoryError) and "bytes" in str(info.value)
    assert emulator.live_counts() == before


def test_zero_rows_and_a_resize_attempt_during_calls():
    """Zero rows give an empty result; a thread that tries to resize an input while calls read
    it is refused by NumPy (the caller and the call hold references), and every call keeps the
    bits."""
    grad_x, grad_w = one_shot(np.zeros((0, 16), np.float32), np.zeros((0, 32), np.float32), clamp_limit=CLAMP)
    assert grad_x.shape == (0, 32) and grad_x.dtype == np.float32 and grad_w is None
    gy, x = case(64, 64, seed=31)
    expected = want(gy, x)
    shared = [x]
    refused, problems = [], []
    stop = threading.Event()

    def resizer():
        while not stop.is_set():
            try:
                shared[0].resize((1,))
            except ValueError:
                refused.append(1)

    thread = threading.Thread(target=resizer, daemon=True)
    thread.start()
    try:
        for _ in range(20):
            if not same_bits(one_shot(gy, x, clamp_limit=CLAMP)[0], expected):
                problems.append("bits")
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive() and refused and not problems and x.shape == (64, 128)


def test_clamp_by_type_and_value():
    gy, x = case(6, 16, seed=9)
    check_clamp_types(lambda clamp: one_shot(gy, x, clamp_limit=clamp)[0], gy, x)


# ---- what a call leaves, and how it fails ----


def test_a_call_leaves_nothing_but_its_threads_stream():
    """The first call of a layout and later ones: only the thread's one-shot stream stays."""
    gy, x = case(5, 24, seed=47)   # a layout no other test here uses
    expected = want(gy, x, 0.75)
    base = idle_counts()
    for _ in range(3):
        assert same_bits(one_shot(gy, x, clamp_limit=0.75)[0], expected)
        after = emulator.live_counts()
        assert after == dict(base, stream=base["stream"] + 1), (base, after)


@pytest.mark.emulator_only
@pytest.mark.parametrize("fault,api,code", [
    ("aclrtMalloc:1:207001", "aclrtMalloc", 207001),                 # the arena
    ("aclrtMemcpy:2:507000", "aclrtMemcpy", 507000),                 # the second copy in
    ("aclCreateTensor:3:561103", "aclCreateTensor", 561103),
    (f"{PHASE1}:1:161002", PHASE1, 161002),
    (f"{PHASE2}:1:561103", PHASE2, 561103),
    ("aclrtSynchronizeStream:1:507035", "aclrtSynchronizeStream", 507035),
    ("aclrtMemcpy:5:507000", "aclrtMemcpy", 507000),                 # the copy back of grad_x
    ("aclrtMemcpy:6:507000", "aclrtMemcpy", 507000),                 # the copy back of grad_weight
])
@pytest.mark.parametrize("nth_call", [1, 2], ids=["first-of-layout", "later"])
def test_a_failed_step_is_named_and_leaves_nothing(fault, api, code, nth_call):
    """The error names the step that failed first and carries its message alone; everything the
    call made is released; nothing of it shows in the thread's next error; the next call works."""
    gy, x, weight, y_origin = weighted_case(5, 8 + nth_call, seed=nth_call)
    one_shot(gy[:1], x[:1])   # (the thread's stream exists)
    for _ in range(nth_call - 1):
        one_shot(gy, x, weight, y_origin, None, CLAMP)
    before = emulator.live_counts()
    with emulator.inject_faults(fault):
        with pytest.raises(errors.AclError) as info:
            one_shot(gy, x, weight, y_origin, None, CLAMP)
    assert info.value.api == api and info.value.code == code
    assert info.value.message.count("injected fault") == 1, info.value.message
    assert emulator.live_counts() == before
    with pytest.raises(errors.ArgumentError):
        one_shot(gy, x[:, :1], weight, y_origin, None, CLAMP)
    with emulator.inject_faults("aclrtMemcpy:1:507000"):
        with pytest.raises(errors.AclError) as later:
            one_shot(gy, x, weight, y_origin, None, CLAMP)
    assert later.value.api == "aclrtMemcpy" and later.value.message.count("injected fault") == 1, later.value.message
    expected = model(gy, x, weight, y_origin, None, CLAMP)
    got = one_shot(gy, x, weight, y_origin, None, CLAMP)
    assert same_bits(got[0], expected[0]) and same_bits(got[1], expected[1])
