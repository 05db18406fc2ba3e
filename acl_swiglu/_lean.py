"""A device-level call repeated with the same arguments, made as one call into the package's C
helper (binding/lean.c): phase 1 through the operator's thunk, then phase 2. The record it reads
is built once per repeated call and never changes, so threads may share it."""

from __future__ import annotations

import ctypes
import operator
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

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
    ``current(api.hot)`` is still ``functions`` (a wrapper put in their place must see each
    call); that is checked again only after api.hot was rebound (``seen``: its ``rebound`` count
    when last checked)."""

    call: Callable[[Any], int]
    argument: Any              # a byref of the record
    record: _LeanRecord        # (kept alive with the argument)
    current: Callable[[Any], Tuple[Any, Any]]
    functions: Tuple[Any, Any]  # phase 1 and phase 2, as they were in api.hot
    seen: List[int]

    def stands(self, hot: Any) -> bool:
        """Whether phase 1 and phase 2 in `hot` are still the functions the record calls."""
        rebound = hot.rebound
        if rebound == self.seen[0]:
            return True
        if self.current(hot) != self.functions:
            return False
        self.seen[0] = rebound
        return True


def status_of(result: int) -> int:
    """The failed call's status (a C int32) in a lean call's result."""
    return ctypes.c_int32(result & 0xFFFFFFFF).value


def _scalar_bytes(slots: "ctypes.Array[ctypes.c_uint64]", scalars: Sequence[Any]) -> bool:
    """Copies each ctypes scalar's bytes into its slot; False when one does not fit."""
    base = ctypes.addressof(slots)
    width = ctypes.sizeof(ctypes.c_uint64)
    for index, scalar in enumerate(scalars):
        size = ctypes.sizeof(scalar)
        if size > width:
            return False
        ctypes.memmove(base + index * width, ctypes.addressof(scalar), size)
    return True


def _helper_entries(thunk: Optional[str], functions: Sequence[Any], *entries: str) -> Optional[Tuple[Any, ...]]:
    """(the operator's phase-1 thunk's address, then the helper's functions named), when the
    helper has them all and every ACL function the call would make is a plain C function."""
    library = helper_library()
    if library is None or thunk is None or not all(is_c_function(f) for f in functions):
        return None
    try:
        return (_address(getattr(library, thunk)), *(getattr(library, name) for name in entries))
    except AttributeError:
        return None


def _address(function: Any) -> Optional[int]:
    return ctypes.cast(function, ctypes.c_void_p).value


def lean_call(api: Any, phase1: str, phase2: str, thunk: Optional[str], handles: Sequence[Optional[ctypes.c_void_p]],
              scalars: Sequence[Any], workspace_address: Optional[int], workspace_capacity: int,
              stream_address: ctypes.c_void_p) -> Optional[LeanCall]:
    """The record of a repeated call, or None: without the helper or the operator's thunk, with
    too many arguments for the record, or when an ACL function it would call is not a plain C
    function."""
    current = operator.attrgetter(phase1, phase2)
    functions = current(api.hot)
    destroy = api.raw.aclDestroyAclOpExecutor
    found = _helper_entries(thunk, (*functions, destroy), "acl_swiglu_lean_call")
    if found is None or len(handles) > MAX_HANDLES or len(scalars) > MAX_SCALARS:
        return None
    thunk_address, entry = found
    entry.restype = ctypes.c_int64
    record = _LeanRecord(thunk_address, _address(functions[0]), _address(functions[1]), _address(destroy),
                         workspace_address, workspace_capacity, stream_address.value)
    for index, handle in enumerate(handles):
        record.handles[index] = None if handle is None else handle.value
    if not _scalar_bytes(record.scalars, scalars):
        return None
    return LeanCall(entry, ctypes.byref(record), record, current, functions, [api.hot.rebound])


class _ArenaPhase1(ctypes.Structure):
    """binding/arena.c's arena_phase1."""

    _fields_ = [("thunk", ctypes.c_void_p), ("phase1", ctypes.c_void_p), ("slot_count", ctypes.c_uint32),
                ("slots", ctypes.c_int32 * MAX_HANDLES), ("scalars", ctypes.c_uint64 * MAX_SCALARS)]


class ArenaPhase1(NamedTuple):
    """Phase 1 of one one-shot layout for the helper's acl_swiglu_arena_run, standing while
    ``api.hot``'s phase 1 is still ``function`` (a wrapper put in its place must see each call)."""

    argument: Any   # a byref of the record
    record: _ArenaPhase1
    api: Any
    function: Any


def arena_phase1(api: Any, phase1: str, thunk: Optional[str], slots: Sequence[int],
                 scalars: Sequence[Any]) -> Optional[ArenaPhase1]:
    """The record of a one-shot layout's phase 1 (`slots`: per operator slot, its arena index or
    -1), or None when the helper cannot make it."""
    function = getattr(api.hot, phase1)
    found = _helper_entries(thunk, (function,))
    if found is None or len(slots) > MAX_HANDLES or len(scalars) > MAX_SCALARS:
        return None
    thunk_address, = found
    record = _ArenaPhase1(thunk_address, _address(function), len(slots))
    for index, slot in enumerate(slots):
        record.slots[index] = slot
    if not _scalar_bytes(record.scalars, scalars):
        return None
    return ArenaPhase1(ctypes.byref(record), record, api, function)
