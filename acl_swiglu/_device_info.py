"""What the device says about itself: its vector-core count, the figure the operator's tiling
splits rows over (min(T, vector cores) blocks) and the one the release guards depend on.

Asked, in this order, until one answers: ``aclGetDeviceCapability(id,
ACL_DEVICE_INFO_VECTOR_CORE_NUM)``, then ``aclrtGetDeviceInfo(id, ACL_DEV_ATTR_VECTOR_CORE_NUM)``
(older runtimes have neither; both are optional declarations in ``_ffi``). When neither can
say, the largest part of the Ascend 950 family is assumed (72 vector cores): the guards refuse
more rather than less. A device's answer is kept for the life of the process.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Dict, Optional

from . import _ffi
from ._releases import ASSUMED, ASSUMED_VECTOR_CORES, FAMILY_VECTOR_CORES, CoreCount

__all__ = ["ASSUMED", "ASSUMED_VECTOR_CORES", "FAMILY_VECTOR_CORES", "CoreCount", "current_vector_cores",
           "vector_cores"]

ACL_DEVICE_INFO_VECTOR_CORE_NUM = 1
ACL_DEV_ATTR_VECTOR_CORE_NUM = 201


_lock = threading.Lock()
_answers: Dict[int, CoreCount] = {}


def _ask(function: Optional[object], device_id: int, which: int, get_message: _ffi.GetMessage) -> Optional[int]:
    if function is None:
        return None
    value = ctypes.c_int64(0)
    status = function(ctypes.c_uint32(device_id), which, ctypes.byref(value))  # type: ignore[operator]
    if status != 0:
        _ffi.drop_message(get_message)   # the next question may answer; this text is nobody's error
        return None
    return int(value.value) if value.value > 0 else None


def vector_cores(device_id: int) -> CoreCount:
    """(count, source) of device `device_id`'s vector cores: the device's own answer when the
    runtime gives one (kept for the process), else the family's largest (asked again next time)."""
    device_id = int(device_id)
    known = _answers.get(device_id)
    if known is not None:
        return known
    reason = "the runtime has neither aclGetDeviceCapability nor aclrtGetDeviceInfo"
    try:
        from . import runtime

        api = runtime.runtime_api()   # both questions need aclInit
    except Exception as exc:   # no runtime to ask: the cautious figure, with the reason
        return CoreCount(ASSUMED_VECTOR_CORES, f"{ASSUMED}: the largest Ascend 950 part; the runtime could not be "
                                               f"asked ({type(exc).__name__}: {exc})")
    raw = api.raw
    for name, which, label in (
            ("aclGetDeviceCapability", ACL_DEVICE_INFO_VECTOR_CORE_NUM,
             "aclGetDeviceCapability(ACL_DEVICE_INFO_VECTOR_CORE_NUM)"),
            ("aclrtGetDeviceInfo", ACL_DEV_ATTR_VECTOR_CORE_NUM, "aclrtGetDeviceInfo(ACL_DEV_ATTR_VECTOR_CORE_NUM)")):
        function = getattr(raw, name, None)
        count = _ask(function, device_id, which, api.get_message)
        if count is not None:
            answer = CoreCount(count, label)
            with _lock:
                _answers.setdefault(device_id, answer)
            return answer
        if function is not None:
            reason = "the runtime's aclGetDeviceCapability and aclrtGetDeviceInfo gave no vector-core count"
    return CoreCount(ASSUMED_VECTOR_CORES, f"{ASSUMED}: the largest Ascend 950 part; {reason}")


def current_device() -> int:
    """The calling thread's device (binding one as the package does when it has none)."""
    from . import runtime

    api = runtime.runtime_api()
    get_device = api.raw.aclrtGetDevice
    if get_device is not None:
        device = ctypes.c_int32(-1)
        if get_device(ctypes.byref(device)) == 0:
            return int(device.value)
        _ffi.drop_message(api.get_message)
    # A runtime without aclrtGetDevice: the device the package bound on this thread.
    bound = getattr(runtime._runtime.local, "device", None)
    return int(bound) if bound is not None else 0


def current_vector_cores() -> CoreCount:
    """vector_cores() of the calling thread's device."""
    try:
        device = current_device()
    except Exception as exc:   # no runtime: the cautious figure
        return CoreCount(ASSUMED_VECTOR_CORES, f"{ASSUMED}: the largest Ascend 950 part; no device could be "
                                               f"bound ({type(exc).__name__}: {exc})")
    return vector_cores(device)


def forget() -> None:
    """Drops the kept answers (for tests that change the device under the process)."""
    with _lock:
        _answers.clear()
