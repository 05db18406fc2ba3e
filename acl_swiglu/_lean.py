"""A device-level call repeated with the same arguments, made as one call into the package's C
helper (binding/lean.c): phase 1 through the operator's thunk, then phase 2. The record it reads
is built once per repeated call and never changes, so threads may share it."""

from __future__ import annotations

import ctypes
import operator
from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple

from ._scratch import helper_library, is_c_function

MAX_HANDLES, MAX_SCALARS = 16, 4   # binding/lean.h

# What a call's result says in its upper 32 bits (the lower 32: a failed call's status).
PHASE1_FAILED, PHASE2_FAILED, NO_WORKSPACE = 1, 2, 3


class _LeanRecord(ctypes.Structure):
    """binding/lean.h's lean_call."""

    _fields_ = [("thunk", ctypes.c_void_p), ("phase1", ctypes.c_void_p), ("launch", ctypes.c_void_p),
                ("destroy", ctypes.c_void_p), ("workspace", ctypes.c_void_p), ("workspace_capacity", ctypes.c_uint64),
                ("stream", ctypes.c_void_p), ("handles", ctypes.c_void_p * MAX_HANDLES),
                ("scalars", ctypes.c_uint64 * MAX_SCALARS)]


class LeanCall(NamedTuple):
    """One repeated call, ready: ``call(argument)`` makes both phases. It stands only while
    ``current(api.hot)`` is still ``functions`` (a wrapper put in their place must see each call)."""

    call: Callable[[Any], int]
    argument: Any              # a byref of the record
    record: _LeanRecord        # (kept alive with the argument)
    current: Callable[[Any], Tuple[Any, Any]]
    functions: Tuple[Any, Any]  # phase 1 and phase 2, as they were in api.hot


def status_of(result: int) -> int:
    """The failed call's status (a C int32) in a lean call's result."""
    return ctypes.c_int32(result & 0xFFFFFFFF).value


def lean_call(api: Any, phase1: str, phase2: str, thunk: Optional[str], handles: Sequence[Optional[ctypes.c_void_p]],
              scalars: Sequence[Any], workspace_address: Optional[int], workspace_capacity: int,
              stream_address: ctypes.c_void_p) -> Optional[LeanCall]:
    """The record of a repeated call, or None: without the helper or the operator's thunk, with
    too many arguments for the record, or when an ACL function it would call is not a plain C
    function."""
    library = helper_library()
    if library is None or thunk is None or len(handles) > MAX_HANDLES or len(scalars) > MAX_SCALARS:
        return None
    current = operator.attrgetter(phase1, phase2)
    functions = current(api.hot)
    destroy = api.raw.aclDestroyAclOpExecutor
    if not all(is_c_function(f) for f in (*functions, destroy)):
        return None
    try:
        entry, thunk_function = library.acl_swiglu_lean_call, getattr(library, thunk)
    except AttributeError:
        return None
    entry.restype = ctypes.c_int64
    address = ctypes.cast
    record = _LeanRecord(address(thunk_function, ctypes.c_void_p).value, address(functions[0], ctypes.c_void_p).value,
                         address(functions[1], ctypes.c_void_p).value, address(destroy, ctypes.c_void_p).value,
                         workspace_address, workspace_capacity, stream_address.value)
    for index, handle in enumerate(handles):
        record.handles[index] = None if handle is None else handle.value
    base = ctypes.addressof(record.scalars)
    for index, scalar in enumerate(scalars):
        size = ctypes.sizeof(scalar)
        if size > ctypes.sizeof(ctypes.c_uint64):
            return None
        ctypes.memmove(base + index * ctypes.sizeof(ctypes.c_uint64), ctypes.addressof(scalar), size)
    return LeanCall(entry, ctypes.byref(record), record, current, functions)
