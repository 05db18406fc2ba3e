"""ctypes declarations of every C function the package calls, in one flat table.

Each handle type is its own pointer type, so passing a tensor where a stream is expected is a
ctypes.ArgumentError instead of a crash. Status-returning functions raise the status's
exception (with aclGetRecentErrMsg text); constructors raise when they return NULL. ``raw``
holds the same functions without checks, for hot paths that check the status themselves.
"""

from __future__ import annotations

import ctypes
import re
import threading
from ctypes import POINTER, c_char_p, c_double, c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from types import SimpleNamespace
from typing import Optional

from . import _loader
from .errors import AclError, error_class


def _opaque(name: str):
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

OPERATOR_PHASE1 = "aclnnSwigluGroupQuantGradGetWorkspaceSize"

# (library, Python name, C symbol, restype, argtypes, check)
DECLARATIONS = (
    ("runtime", "aclInit", "aclInit", aclError, (c_char_p,), STATUS),
    ("runtime", "aclFinalize", "aclFinalize", aclError, (), STATUS),
    ("runtime", "aclrtSetDevice", "aclrtSetDevice", aclError, (c_int32,), STATUS),
    ("runtime", "aclrtResetDevice", "aclrtResetDevice", aclError, (c_int32,), STATUS),
    ("runtime", "aclrtGetDeviceCount", "aclrtGetDeviceCount", aclError, (POINTER(c_uint32),), STATUS),
    ("runtime", "aclrtCreateStream", "aclrtCreateStream", aclError, (POINTER(aclrtStream_p),), STATUS),
    ("runtime", "aclrtDestroyStream", "aclrtDestroyStream", aclError, (aclrtStream_p,), STATUS),
    ("runtime", "aclrtSynchronizeStream", "aclrtSynchronizeStream", aclError, (aclrtStream_p,), STATUS),
    ("runtime", "aclrtSynchronizeDevice", "aclrtSynchronizeDevice", aclError, (), STATUS),
    ("runtime", "aclrtMalloc", "aclrtMalloc", aclError, (POINTER(c_void_p), c_size_t, c_int), STATUS),
    ("runtime", "aclrtFree", "aclrtFree", aclError, (c_void_p,), STATUS),
    ("runtime", "aclrtMemcpy", "aclrtMemcpy", aclError, (c_void_p, c_size_t, c_void_p, c_size_t, c_int), STATUS),
    ("runtime", "aclrtMemcpyAsync", "aclrtMemcpyAsync", aclError,
     (c_void_p, c_size_t, c_void_p, c_size_t, c_int, aclrtStream_p), STATUS),
    ("runtime", "aclrtMemset", "aclrtMemset", aclError, (c_void_p, c_size_t, c_int32, c_size_t), STATUS),
    ("runtime", "aclGetRecentErrMsg", "aclGetRecentErrMsg", c_char_p, (), PLAIN),
    ("meta", "aclCreateTensor", "aclCreateTensor", aclTensor_p,
     (POINTER(c_int64), c_uint64, c_int, POINTER(c_int64), c_int64, c_int, POINTER(c_int64), c_uint64, c_void_p),
     HANDLE),
    ("meta", "aclDestroyTensor", "aclDestroyTensor", aclnnStatus, (aclTensor_p,), STATUS),
    ("meta", "aclCreateIntArray", "aclCreateIntArray", aclIntArray_p, (POINTER(c_int64), c_uint64), HANDLE),
    ("meta", "aclDestroyIntArray", "aclDestroyIntArray", aclnnStatus, (aclIntArray_p,), STATUS),
    ("meta", "aclSetAclOpExecutorRepeatable", "aclSetAclOpExecutorRepeatable", aclnnStatus, (aclOpExecutor_p,), STATUS),
    ("meta", "aclDestroyAclOpExecutor", "aclDestroyAclOpExecutor", aclnnStatus, (aclOpExecutor_p,), STATUS),
    ("meta", "aclSetInputTensorAddr", "aclSetInputTensorAddr", aclnnStatus,
     (aclOpExecutor_p, c_size_t, aclTensor_p, c_void_p), STATUS),
    ("meta", "aclSetOutputTensorAddr", "aclSetOutputTensorAddr", aclnnStatus,
     (aclOpExecutor_p, c_size_t, aclTensor_p, c_void_p), STATUS),
    ("meta", "aclSetRawTensorAddr", "aclSetRawTensorAddr", aclnnStatus, (aclTensor_p, c_void_p), STATUS),
    # ABI revision 2: groupIndex is an INT64 aclTensor (device memory).
    ("operator", "aclnnSwigluGroupQuantGradGetWorkspaceSize", OPERATOR_PHASE1, aclnnStatus,
     (aclTensor_p, aclTensor_p, aclTensor_p, aclTensor_p, aclTensor_p, c_double, aclTensor_p, aclTensor_p,
      POINTER(c_uint64), POINTER(aclOpExecutor_p)), STATUS),
    # ABI revision 1 (the seed document): the same symbol with an aclIntArray groupIndex.
    ("operator", "aclnnSwigluGroupQuantGradGetWorkspaceSize_rev1", OPERATOR_PHASE1, aclnnStatus,
     (aclTensor_p, aclTensor_p, aclTensor_p, aclTensor_p, aclIntArray_p, c_double, aclTensor_p, aclTensor_p,
      POINTER(c_uint64), POINTER(aclOpExecutor_p)), STATUS),
    ("operator", "aclnnSwigluGroupQuantGrad", "aclnnSwigluGroupQuantGrad", aclnnStatus,
     (c_void_p, c_uint64, aclOpExecutor_p, aclrtStream_p), STATUS),
)

# Only the emulator has these (acl_emu/acl_emu.h).
EMULATOR_DECLARATIONS = (
    ("runtime", "aclEmuVersion", "aclEmuVersion", c_char_p, (), PLAIN),
    ("runtime", "aclEmuLiveCount", "aclEmuLiveCount", c_int64, (c_int,), PLAIN),
    ("runtime", "aclEmuLiveBytes", "aclEmuLiveBytes", c_int64, (), PLAIN),
    ("runtime", "aclEmuSetFaults", "aclEmuSetFaults", aclError, (c_char_p,), STATUS),
    ("runtime", "aclEmuFaultsInjected", "aclEmuFaultsInjected", c_int64, (), PLAIN),
    ("runtime", "aclEmuSetThreads", "aclEmuSetThreads", aclError, (c_int32,), STATUS),
    ("runtime", "aclEmuSetKernelVariant", "aclEmuSetKernelVariant", aclError, (c_int32,), STATUS),
)

_STATUS_IN_TEXT = re.compile(r"\[status (-?\d+)\]")


def _recent_message(get_message) -> str:
    text = get_message()
    return text.decode("utf-8", "replace") if text else ""


def raise_status(code: int, api: str, get_message, describe_arguments=None) -> None:
    """Raises the exception for a failed call; call it on the failing thread, right away.
    `describe_arguments(message)` may say which Python arguments the message's names are."""
    message = _recent_message(get_message)
    arguments = describe_arguments(message) if describe_arguments else ""
    raise error_class(code)(code, api, message, arguments)


def _status_checker(api: str, get_message):
    def check(result, func, args):
        if result != 0:
            raise_status(result, api, get_message)
        return result

    return check


def _handle_checker(api: str, get_message):
    def check(result, func, args):
        if not result:
            message = _recent_message(get_message)
            found = _STATUS_IN_TEXT.search(message)
            # A constructor reports failure only as NULL; use the code its message names, if any.
            code = int(found.group(1)) if found else 561103
            raise error_class(code)(code, api, message or f"{api} returned NULL")
        return result

    return check


def _bind(lib: ctypes.CDLL, symbol: str, restype, argtypes):
    prototype = ctypes.CFUNCTYPE(restype, *argtypes)
    return prototype((symbol, lib))


# Hot paths call these without argtypes, with ctypes arguments they build once: the
# conversions a prototype makes on every call are the largest part of a call's cost.
HOT_PATH = (
    ("operator", "aclnnSwigluGroupQuantGrad", aclnnStatus),
    ("runtime", "aclrtSynchronizeStream", aclError),
    ("meta", "aclSetInputTensorAddr", aclnnStatus),
    ("meta", "aclSetOutputTensorAddr", aclnnStatus),
    ("operator", "aclnnSwigluGroupQuantGradGetWorkspaceSize", aclnnStatus),
)


def bind_all(libs: _loader.Libraries) -> SimpleNamespace:
    """Binds every declaration; returns a namespace of checked functions with ``.raw``."""
    checked = SimpleNamespace()
    raw = SimpleNamespace()
    by_library = {"runtime": libs.runtime, "meta": libs.meta, "operator": libs.operator}
    get_message = _bind(libs.runtime, "aclGetRecentErrMsg", c_char_p, ())
    declarations = DECLARATIONS + (EMULATOR_DECLARATIONS if libs.is_emulator else ())
    for library, name, symbol, restype, argtypes, check in declarations:
        fn = _bind(by_library[library], symbol, restype, argtypes)
        setattr(raw, name, fn)
        fn_checked = _bind(by_library[library], symbol, restype, argtypes)
        if check == STATUS:
            fn_checked.errcheck = _status_checker(symbol, get_message)
        elif check == HANDLE:
            fn_checked.errcheck = _handle_checker(symbol, get_message)
        setattr(checked, name, fn_checked)
    checked.raw = raw
    checked.hot = SimpleNamespace()
    for library, symbol, restype in HOT_PATH:
        fn = by_library[library]._FuncPtr((symbol, by_library[library]))
        fn.restype = restype
        setattr(checked.hot, symbol, fn)
    checked.get_message = get_message
    checked.libraries = libs
    return checked


_lock = threading.Lock()
_api: Optional[SimpleNamespace] = None


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


def int64_array(values) -> ctypes.Array:
    return (c_int64 * len(values))(*values)


__all__ = [
    "aclTensor_p", "aclIntArray_p", "aclOpExecutor_p", "aclrtStream_p", "DECLARATIONS",
    "EMULATOR_DECLARATIONS", "api", "bind_all", "raise_status", "int64_array", "AclError",
]
