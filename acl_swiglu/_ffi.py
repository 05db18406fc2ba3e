"""ctypes declarations of every C function the package calls: one row per function.

Each handle type is its own pointer type, so passing a tensor where a stream is expected is a
ctypes.ArgumentError instead of a crash. Every row is bound once with its exact prototype
(``api.raw.<symbol>``); ``api.<symbol>`` is the same function wrapped so that a failure raises
(a non-zero status, or NULL from a constructor, with aclGetRecentErrMsg text). Rows flagged
``fast`` are also bound without a prototype (``api.hot.<symbol>``) for hot paths that build
their ctypes arguments once: the conversions a prototype makes on every call are the largest
part of a call's cost.

The libraries: "runtime" (libascendcl), "meta" (libnnopbase), "helper" (the package's own
libaclswiglu_hotpath.so) are bound when the API is first used; each operator's rows ("operator")
are bound when the operator is first called (``bind_operator``), from the library that exports
them, so an install that lacks one operator still serves another.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from ctypes import POINTER, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from types import SimpleNamespace
from typing import Any, Callable, List, NamedTuple, NoReturn, Optional, Sequence, Tuple, Type

from . import _loader
from .errors import AclError, error_class


class aclCANNPackageVersion(ctypes.Structure):
    """aclsysGetCANNVersion's out-parameter (acl.h)."""

    _fields_ = [("version", ctypes.c_char * 128), ("major", ctypes.c_char * 64), ("minor", ctypes.c_char * 64),
                ("release", ctypes.c_char * 64), ("patch", ctypes.c_char * 64), ("reserved", ctypes.c_char * 128)]


def _opaque(name: str) -> Type["ctypes._Pointer[Any]"]:
    return POINTER(type(name, (ctypes.Structure,), {}))


aclTensor_p = _opaque("aclTensor")
aclIntArray_p = _opaque("aclIntArray")
aclOpExecutor_p = _opaque("aclOpExecutor")
aclrtStream_p = _opaque("aclrtStreamObject")   # aclrtStream is void* in C; NULL = default stream

aclError = c_int
aclnnStatus = c_int32

STATUS = "status"   # non-zero return raises
HANDLE = "handle"   # NULL return raises
PLAIN = "plain"     # no check


class Declaration(NamedTuple):
    """One C function: where it lives, its prototype, how a failure shows, and whether hot
    paths call it (``fast``). ``optional`` functions may be missing from the library (then
    they are bound as None)."""

    library: str    # "runtime", "meta", "helper" or "operator"
    symbol: str
    restype: Any            # a ctypes type, or None for void
    argtypes: Tuple[Any, ...]
    check: str
    fast: bool = False
    optional: bool = False


D = Declaration
DECLARATIONS = (
    D("runtime", "aclInit", aclError, (c_char_p,), STATUS),
    D("runtime", "aclFinalize", aclError, (), STATUS),
    D("runtime", "aclrtSetDevice", aclError, (c_int32,), STATUS),
    D("runtime", "aclrtResetDevice", aclError, (c_int32,), STATUS),
    D("runtime", "aclrtGetDevice", aclError, (POINTER(c_int32),), STATUS, optional=True),
    D("runtime", "aclrtGetDeviceCount", aclError, (POINTER(c_uint32),), STATUS),
    D("runtime", "aclrtCreateStream", aclError, (POINTER(aclrtStream_p),), STATUS),
    D("runtime", "aclrtDestroyStream", aclError, (aclrtStream_p,), STATUS),
    D("runtime", "aclrtSynchronizeStream", aclError, (aclrtStream_p,), STATUS, fast=True),
    D("runtime", "aclrtSynchronizeDevice", aclError, (), STATUS),
    D("runtime", "aclrtMalloc", aclError, (POINTER(c_void_p), c_size_t, c_int), STATUS),
    D("runtime", "aclrtFree", aclError, (c_void_p,), STATUS),
    D("runtime", "aclrtMemcpy", aclError, (c_void_p, c_size_t, c_void_p, c_size_t, c_int), STATUS),
    D("runtime", "aclrtMemcpyAsync", aclError, (c_void_p, c_size_t, c_void_p, c_size_t, c_int, aclrtStream_p),
      STATUS),
    D("runtime", "aclrtMemset", aclError, (c_void_p, c_size_t, c_int32, c_size_t), STATUS),
    D("runtime", "aclGetRecentErrMsg", c_char_p, (), PLAIN),
    # Questions to the install and the device; older runtimes lack them (then the answers come
    # from files, or a guard assumes the largest device of the family).
    D("runtime", "aclsysGetCANNVersion", aclError, (c_int, POINTER(aclCANNPackageVersion)), STATUS, optional=True),
    D("runtime", "aclGetDeviceCapability", aclError, (c_uint32, c_int, POINTER(c_int64)), STATUS, optional=True),
    D("runtime", "aclrtGetDeviceInfo", aclError, (c_uint32, c_int, POINTER(c_int64)), STATUS, optional=True),
    D("meta", "aclCreateTensor", aclTensor_p,
      (POINTER(c_int64), c_uint64, c_int, POINTER(c_int64), c_int64, c_int, POINTER(c_int64), c_uint64, c_void_p),
      HANDLE),
    D("meta", "aclDestroyTensor", aclnnStatus, (aclTensor_p,), STATUS),
    D("meta", "aclCreateIntArray", aclIntArray_p, (POINTER(c_int64), c_uint64), HANDLE),
    D("meta", "aclDestroyIntArray", aclnnStatus, (aclIntArray_p,), STATUS),
    D("meta", "aclSetAclOpExecutorRepeatable", aclnnStatus, (aclOpExecutor_p,), STATUS),
    D("meta", "aclDestroyAclOpExecutor", aclnnStatus, (aclOpExecutor_p,), STATUS),
    D("meta", "aclSetInputTensorAddr", aclnnStatus, (aclOpExecutor_p, c_size_t, aclTensor_p, c_void_p), STATUS,
      fast=True),
    D("meta", "aclSetOutputTensorAddr", aclnnStatus, (aclOpExecutor_p, c_size_t, aclTensor_p, c_void_p), STATUS,
      fast=True),
    D("meta", "aclSetRawTensorAddr", aclnnStatus, (aclTensor_p, c_void_p), STATUS),
)

# The package's helper (binding/): the one-crossing launch of a bound executor (and the making of
# it repeatable, recorded where the launch reads it), a one-shot call's whole device side, and a
# free that clears the package's copy of the handle. Each operator's phase-1 thunk is a helper
# row of its own description.
HELPER_DECLARATIONS = (
    D("helper", "acl_swiglu_launch", c_int64, (c_void_p, c_int32), PLAIN, fast=True),
    D("helper", "acl_swiglu_make_repeatable", c_int32, (c_void_p, c_void_p), PLAIN, fast=True),
    D("helper", "acl_swiglu_destroy", c_int32, (c_void_p, c_void_p), PLAIN, fast=True),
    D("helper", "acl_swiglu_one_shot", c_int32, (c_void_p, c_void_p, c_char_p, c_void_p, POINTER(c_uint64)), PLAIN,
      fast=True),
    D("helper", "acl_swiglu_one_shot_message", c_char_p, (), PLAIN, fast=True),
)


class HelperLaunch(ctypes.Structure):
    """binding/launch.c's helper_launch: what acl_swiglu_launch calls."""

    _fields_ = [("phase2", c_void_p), ("synchronize", c_void_p), ("workspace", c_void_p),
                ("workspace_size", c_uint64), ("executor", c_void_p), ("stream", c_void_p),
                ("repeatable", c_int64)]


# What acl_swiglu_launch's result says in its upper 32 bits (the lower 32: the failed call's status).
LAUNCH_PHASE2_FAILED = 1   # (2: the synchronisation failed)


class OneShotApi(ctypes.Structure):
    """binding/one_shot.c's one_shot_api: the functions acl_swiglu_one_shot calls."""

    _fields_ = [(name, c_void_p) for name in (
        "malloc", "free", "copy", "zero", "create_tensor", "destroy_tensor", "create_int_array", "destroy_int_array",
        "destroy_executor", "synchronize", "get_message", "thunk", "phase1", "phase2")]


class OneShotArray(ctypes.Structure):
    """binding/one_shot.c's one_shot_array."""

    _fields_ = [("dims", c_void_p), ("strides", c_void_p), ("ndim", c_uint64), ("storage_numel", c_int64),
                ("offset", c_int64), ("nbytes", c_uint64), ("dtype", c_int32), ("is_output", c_int32)]


class OneShotLayout(ctypes.Structure):
    """binding/one_shot.c's one_shot_layout."""

    _fields_ = [("arrays", c_void_p), ("array_count", c_uint32), ("handle_count", c_uint32), ("handles", c_void_p),
                ("host_list_count", c_uint32), ("arena_bytes", c_uint64), ("scalars", c_char_p)]


# one_shot_layout.handles: an absent parameter, and the first host list (the next: -3, ...).
ONE_SHOT_ABSENT, ONE_SHOT_FIRST_HOST_LIST = -1, -2
ONE_SHOT_INPUT, ONE_SHOT_OUTPUT, ONE_SHOT_OUTPUT_PRESET = 0, 1, 2   # one_shot_array.is_output
# binding/one_shot.c's one_shot_step, as the call each one names (the operator's own phases are
# named by the caller, with the operator's argument names).
ONE_SHOT_STEP_PHASE1, ONE_SHOT_STEP_LAUNCH = 5, 7
ONE_SHOT_STEP_APIS = {1: "aclrtMalloc", 2: "aclrtMemcpy", 3: "aclCreateTensor", 4: "aclCreateIntArray",
                      6: "aclrtMalloc", 8: "aclrtSynchronizeStream", 9: "aclrtMemcpy", 10: "acl_swiglu_one_shot",
                      11: "aclrtMemset"}
ONE_SHOT_MADE_NULL = (3, 4)   # constructors that returned NULL: their message holds the code


def operator_declarations(phase1: str, phase2: str, thunk: str,
                          phase1_params: Sequence[Any]) -> Tuple[Declaration, ...]:
    """An operator's rows: its two phases (phase 1 taking `phase1_params`, then workspaceSize and
    executor), and its phase-1 thunk in the helper (binding/<operator>.c)."""
    return (Declaration("operator", phase1, aclnnStatus, (*phase1_params, POINTER(c_uint64), POINTER(aclOpExecutor_p)),
                        STATUS, fast=True),
            Declaration("operator", phase2, aclnnStatus, (c_void_p, c_uint64, aclOpExecutor_p, aclrtStream_p), STATUS,
                        fast=True),
            Declaration("helper", thunk, c_int32, (c_void_p,) * 5, PLAIN))


def one_shot_api(bound: SimpleNamespace, thunk: str, phase1: str, phase2: str) -> OneShotApi:
    """The one_shot_api of one operator: the functions acl_swiglu_one_shot calls, from the loaded
    libraries."""
    symbols = ("aclrtMalloc", "aclrtFree", "aclrtMemcpy", "aclrtMemset", "aclCreateTensor", "aclDestroyTensor",
               "aclCreateIntArray", "aclDestroyIntArray", "aclDestroyAclOpExecutor", "aclrtSynchronizeStream",
               "aclGetRecentErrMsg", thunk, phase1, phase2)
    return OneShotApi(*(c_address(bound, symbol, phase1) for symbol in symbols))


# Only the emulator has these (acl_emu/acl_emu.h).
EMULATOR_DECLARATIONS = (
    D("runtime", "aclEmuVersion", c_char_p, (), PLAIN),
    D("runtime", "aclEmuLiveCount", c_int64, (c_int,), PLAIN),
    D("runtime", "aclEmuLiveHandles", c_int64, (c_int, POINTER(c_void_p), c_int64), PLAIN),
    D("runtime", "aclEmuLiveBytes", c_int64, (), PLAIN),
    D("runtime", "aclEmuSetFaults", aclError, (c_char_p,), STATUS),
    D("runtime", "aclEmuFaultsInjected", c_int64, (), PLAIN),
    D("runtime", "aclEmuSetThreads", aclError, (c_int32,), STATUS),
    D("runtime", "aclEmuSetKernelVariant", aclError, (c_int32,), STATUS),
)
del D

_operator_declarations: List[Declaration] = []


def declare(rows: Sequence[Declaration]) -> None:
    """Records an operator's rows (bound when the operator is first called: bind_operator)."""
    _operator_declarations.extend(row for row in rows if row not in _operator_declarations)


def declarations() -> Tuple[Declaration, ...]:
    """Every C function declared: the runtime, meta and helper rows, then each operator's."""
    return DECLARATIONS + HELPER_DECLARATIONS + tuple(_operator_declarations)


_STATUS_IN_TEXT = re.compile(r"\[status (-?\d+)\]")


GetMessage = Callable[[], Optional[bytes]]   # aclGetRecentErrMsg: reads and clears the thread's text


def _recent_message(get_message: GetMessage) -> str:
    text = get_message()
    return text.decode("utf-8", "replace") if text else ""


def drop_message(get_message: GetMessage) -> None:
    """Reads and drops this thread's pending error text. aclGetRecentErrMsg clears what it returns
    and texts pile up until read: after a failure the package ignores on purpose (a cleanup call),
    reading once keeps that text out of the next error."""
    get_message()


def raise_status(code: int, api: str, get_message: GetMessage,
                 describe_arguments: Optional[Callable[[str], str]] = None) -> NoReturn:
    """Raises the exception for a failed call; call it on the failing thread, right away.
    `describe_arguments(message)` may say which Python arguments the message's names are."""
    message = _recent_message(get_message)
    arguments = describe_arguments(message) if describe_arguments else ""
    raise error_class(code)(code, api, message, arguments)


def raise_null(api: str, get_message: GetMessage) -> NoReturn:
    """Raises for a constructor that returned NULL, with the code its message names, if any."""
    message = _recent_message(get_message)
    found = _STATUS_IN_TEXT.search(message)
    code = int(found.group(1)) if found else 561103
    raise error_class(code)(code, api, message or f"{api} returned NULL")


def raise_launch_failure(result: int, phase2: str, get_message: GetMessage,
                         describe_arguments: Callable[[str], str]) -> NoReturn:
    """Raises for a failed acl_swiglu_launch (`result`: LAUNCH_* in the upper 32 bits, the failed
    call's status in the lower)."""
    status = ctypes.c_int32(result & 0xFFFFFFFF).value
    if result >> 32 == LAUNCH_PHASE2_FAILED:
        raise_status(status, phase2, get_message, describe_arguments)
    raise_status(status, "aclrtSynchronizeStream", get_message)


def raise_one_shot_failure(status: int, step: int, phase1: str, phase2: str,
                           describe_arguments: Callable[[str], str]) -> NoReturn:
    """Raises for a failed acl_swiglu_one_shot, naming the call that failed first (its step), with
    the message it left (read by the helper right after the failure)."""
    message = api().hot.acl_swiglu_one_shot_message
    if step == ONE_SHOT_STEP_PHASE1 or step == ONE_SHOT_STEP_LAUNCH:
        raise_status(status, phase1 if step == ONE_SHOT_STEP_PHASE1 else phase2, message, describe_arguments)
    if step in ONE_SHOT_MADE_NULL:
        raise_null(ONE_SHOT_STEP_APIS[step], message)
    raise_status(status, ONE_SHOT_STEP_APIS.get(step, "acl_swiglu_one_shot"), message)


def check(api: SimpleNamespace, status: int, name: str) -> None:
    """Raises for a non-zero status of the call `name` just made on this thread."""
    if status != 0:
        raise_status(status, name, api.get_message)


def _checked(function: Callable[..., Any], declaration: Declaration,
             get_message: GetMessage) -> Callable[..., Any]:
    symbol = declaration.symbol
    call: Callable[..., Any]
    if declaration.check == STATUS:
        def call(*args: Any) -> Any:
            status = function(*args)
            if status != 0:
                raise_status(status, symbol, get_message)
            return status
    elif declaration.check == HANDLE:
        def call(*args: Any) -> Any:
            handle = function(*args)
            if not handle:
                raise_null(symbol, get_message)
            return handle
    else:
        return function
    call.__name__ = call.__qualname__ = symbol
    return call


def _bind_one(namespace: SimpleNamespace, library: ctypes.CDLL, declaration: Declaration) -> None:
    function: Optional[Callable[..., Any]]
    try:
        function = ctypes.CFUNCTYPE(declaration.restype, *declaration.argtypes)((declaration.symbol, library))
    except AttributeError:
        if not declaration.optional:
            raise
        function = None
    setattr(namespace.raw, declaration.symbol, function)
    checked = _checked(function, declaration, namespace.get_message) if function is not None else None
    setattr(namespace, declaration.symbol, checked)
    if declaration.fast and function is not None:
        # CDLL item access makes a fresh function object without argtypes: ctypes then
        # converts each argument only by its own ctypes type.
        fast = library[declaration.symbol]
        fast.restype = declaration.restype
        setattr(namespace.hot, declaration.symbol, fast)


HELPER_FILE = "_native/libaclswiglu_hotpath.so"


def helper_path() -> str:
    """Where the package's own helper is installed (beside the Python files, or where an
    editable install put it)."""
    return _loader.package_native_file(HELPER_FILE) or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                     *HELPER_FILE.split("/"))


def _helper_library() -> ctypes.CDLL:
    """The package's own helper: built and installed with the package (never searched for)."""
    from .errors import LibraryNotFoundError
    path = helper_path()
    try:
        return ctypes.CDLL(path)
    except OSError as exc:
        raise LibraryNotFoundError(f"the package's native helper {path} cannot be loaded ({exc}): the package was "
                                   "not built with its native part (install it with `pip install .`, which compiles "
                                   "it with CMake)") from None


def bind_all(libs: _loader.Libraries) -> SimpleNamespace:
    """Binds the runtime, meta and helper rows; returns a namespace of checked functions with
    ``.raw`` and ``.hot``. Operators' rows are bound by ``bind_operator``."""
    bound = SimpleNamespace(raw=SimpleNamespace(), hot=SimpleNamespace(), libraries=libs, operators={}, addresses={})
    bound.get_message = ctypes.CFUNCTYPE(c_char_p)(("aclGetRecentErrMsg", libs.runtime))
    bound.helper = _helper_library()
    libraries = {"runtime": libs.runtime, "meta": libs.meta, "helper": bound.helper}
    for declaration in DECLARATIONS + HELPER_DECLARATIONS + (EMULATOR_DECLARATIONS if libs.is_emulator else ()):
        _bind_one(bound, libraries[declaration.library], declaration)
    return bound


_lock = threading.Lock()
_api: Optional[SimpleNamespace] = None


def bind_operator(rows: Sequence[Declaration], symbol: str) -> SimpleNamespace:
    """Binds an operator's rows once (the "operator" ones from the library that exports
    `symbol`, its phase 1; the "helper" ones from the helper) and returns the API."""
    bound = api()
    if symbol in bound.operators:
        return bound
    library = _loader.operator_library(symbol).library
    with _lock:
        if symbol not in bound.operators:
            for declaration in rows:
                _bind_one(bound, bound.helper if declaration.library == "helper" else library, declaration)
            bound.operators[symbol] = library
    return bound


def c_address(bound: SimpleNamespace, symbol: str, operator_symbol: Optional[str] = None) -> int:
    """The address of a C function in the library the API binds it from (whatever Python object
    stands in api.raw for it): what the helper, which calls C from C, is handed. An operator's
    functions are looked up in the library of its `operator_symbol`. Looked up once per API."""
    key = (symbol, operator_symbol)
    address: Optional[int] = bound.addresses.get(key)
    if address is None:
        row = next(d for d in declarations() if d.symbol == symbol)
        if row.library == "operator":
            library = bound.operators[operator_symbol or symbol]
        else:
            library = {"runtime": bound.libraries.runtime, "meta": bound.libraries.meta,
                       "helper": bound.helper}[row.library]
        address = ctypes.cast(library[symbol], c_void_p).value or 0
        with _lock:
            bound.addresses[key] = address
    return address


def api() -> SimpleNamespace:
    """The bound C API (loads the libraries on first use)."""
    global _api
    bound = _api
    if bound is None:
        with _lock:
            if _api is None:
                _api = bind_all(_loader.libraries())
            bound = _api
    return bound


def _reset_after_fork() -> None:
    global _lock
    _lock = threading.Lock()   # another thread may have held it at the fork


__all__ = [
    "aclTensor_p", "aclIntArray_p", "aclOpExecutor_p", "aclrtStream_p", "Declaration", "DECLARATIONS",
    "EMULATOR_DECLARATIONS", "HELPER_DECLARATIONS", "api", "bind_all", "bind_operator", "c_address", "check",
    "declarations",
    "declare", "raise_null",
    "raise_status", "AclError",
]
