"""Exceptions: one class per ACL / aclnn status code, generated from a table, plus the
package's own argument, library and lifetime errors."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Dict, Tuple, Type

__all__ = [
    "AclSwigluError",
    "AclSwigluWarning",
    "ArgumentError",
    "ConfigurationError",
    "LibraryNotFoundError",
    "HandleClosedError",
    "HostMemoryError",
    "AclError",
    "AclParameterError",
    "AclResourceError",
    "AclRuntimeFailure",
    "AclInternalError",
    "STATUS_NAMES",
    "error_class",
    "status_name",
]


class AclSwigluError(Exception):
    """Base of every exception this package raises on purpose."""


class AclSwigluWarning(RuntimeWarning):
    """Base of every warning this package gives (filter it with ``-W ignore::acl_swiglu.AclSwigluWarning``)."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def warn_at_caller(message: str, category: Type[Warning] = AclSwigluWarning) -> None:
    """warnings.warn pointing at the first frame outside this package: the caller's own line."""
    level = 1
    frame = sys._getframe(0)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame = frame.f_back   # type: ignore[assignment]
        level += 1
    warnings.warn(message, category, stacklevel=level)


class ArgumentError(AclSwigluError, ValueError):
    """An argument broke a rule; the message names the argument and the rule."""


class ConfigurationError(AclSwigluError, ValueError):
    """An environment variable or setting has a value the package cannot use."""


class LibraryNotFoundError(AclSwigluError, OSError):
    """The CANN libraries (or the operator in them) could not be found or loaded."""


class HandleClosedError(AclSwigluError, RuntimeError):
    """An object was used after close(): its native handle is gone."""


class HostMemoryError(AclSwigluError, MemoryError):
    """The host cannot hold an array the call needs (for example a huge result)."""


class AclError(AclSwigluError, RuntimeError):
    """A CANN call returned a non-zero status.

    Attributes: ``code`` (int), ``name`` (e.g. ``ACLNN_ERR_PARAM_INVALID``), ``api`` (the C
    function), ``message`` (``aclGetRecentErrMsg`` text, possibly empty).
    """

    code = -1
    name = "UNKNOWN"

    def __init__(self, code: int, api: str, message: str = "", arguments: str = ""):
        self.code = int(code)
        self.name = status_name(code)
        self.api = api
        self.message = message or ""
        self.arguments = arguments   # which Python arguments the C parameter names stand for
        text = f"{api} failed with {self.name} ({self.code})"
        if self.message:
            text += f": {self.message}"
        if arguments:
            text += f" ({arguments})"
        super().__init__(text)

    def __reduce__(self) -> Tuple[type, Tuple[int, str, str, str]]:
        return (error_class(self.code), (self.code, self.api, self.message, self.arguments))


class AclParameterError(AclError):
    """1xxxxx: a parameter or usage error."""


class AclResourceError(AclError):
    """2xxxxx: a resource (memory, device, handle) error."""


class AclRuntimeFailure(AclError):
    """3xxxxx: a runtime error."""


class AclInternalError(AclError):
    """5xxxxx: an internal error (also tiling: shapes the operator rejects)."""


_FAMILIES = {1: AclParameterError, 2: AclResourceError, 3: AclRuntimeFailure, 5: AclInternalError}

# Status codes from CANN's documentation (docs/c_abi.md): every code the emulator returns is here.
STATUS_NAMES = {
    100000: "ACL_ERROR_INVALID_PARAM",
    100001: "ACL_ERROR_UNINITIALIZE",
    100002: "ACL_ERROR_REPEAT_INITIALIZE",
    100003: "ACL_ERROR_INVALID_FILE",   # aclsysGetCANNVersion: the package is not installed
    100037: "ACL_ERROR_REPEAT_FINALIZE",
    107000: "ACL_ERROR_RT_PARAM_INVALID",
    107001: "ACL_ERROR_RT_INVALID_DEVICEID",
    107002: "ACL_ERROR_RT_CONTEXT_NULL",
    107003: "ACL_ERROR_RT_STREAM_CONTEXT",   # a stream used while another device is current
    161001: "ACLNN_ERR_PARAM_NULLPTR",
    161002: "ACLNN_ERR_PARAM_INVALID",
    200000: "ACL_ERROR_BAD_ALLOC",
    200002: "ACL_ERROR_INVALID_DEVICE",
    200005: "ACL_ERROR_INVALID_RESOURCE_HANDLE",
    207001: "ACL_ERROR_RT_MEMORY_ALLOCATION",
    207018: "ACL_ERROR_RT_DEVICE_OOM",
    361001: "ACLNN_ERR_RUNTIME_ERROR",
    500000: "ACL_ERROR_INTERNAL_ERROR",
    507000: "ACL_ERROR_RT_INTERNAL_ERROR",
    507015: "ACL_ERROR_RT_AICORE_EXCEPTION",
    507034: "ACL_ERROR_RT_VECTOR_CORE_TIMEOUT",
    561000: "ACLNN_ERR_INNER",
    561001: "ACLNN_ERR_INNER_INFERSHAPE_ERROR",
    561002: "ACLNN_ERR_INNER_TILING_ERROR",
    561003: "ACLNN_ERR_INNER_FIND_KERNEL_ERROR",
    561101: "ACLNN_ERR_INNER_CREATE_EXECUTOR",
    561102: "ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR",
    561103: "ACLNN_ERR_INNER_NULLPTR",
    561107: "ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND",
    561112: "ACLNN_ERR_INNER_OPP_KERNEL_PKG_NOT_FOUND",
}


def status_name(code: int) -> str:
    """The documented name of a status code, or ``UNKNOWN_<code>``."""
    return STATUS_NAMES.get(int(code), f"UNKNOWN_{int(code)}")


def _class_name(status: str) -> str:
    # ACLNN_ERR_PARAM_NULLPTR -> AclnnErrParamNullptr; ACL_ERROR_RT_... -> AclErrorRt...
    return "".join(part.capitalize() for part in status.lower().split("_"))


def _family(code: int) -> Type[AclError]:
    return _FAMILIES.get(int(code) // 100000, AclError)


_BY_CODE: Dict[int, Type[AclError]] = {}
for _code, _status in STATUS_NAMES.items():
    _cls = type(
        _class_name(_status),
        (_family(_code),),
        {"__doc__": f"Status {_code} ({_status}).", "code": _code, "name": _status, "__module__": __name__},
    )
    _BY_CODE[_code] = _cls
    globals()[_cls.__name__] = _cls
    __all__.append(_cls.__name__)
del _code, _status, _cls


def error_class(code: int) -> Type[AclError]:
    """The exception class for a status code: its own class when documented, else its family."""
    return _BY_CODE.get(int(code), _family(code))
