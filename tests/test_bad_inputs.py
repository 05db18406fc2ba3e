"""Tests generated from the bad-input catalogue (tests/bad_inputs.py, rendered as
docs/bad_inputs.md).

Each bad case must raise its exception class with its names in the message; the NumPy arrays it
was given must be byte-identical afterwards (read-only ones included) and their device copies
must still hold their values; the emulator's live handle counts must be the same right after the
failing call (for library-side failures, aclTensor handles cached on the caller's own
DeviceArrays are the only difference allowed) and back to the start once the caller's objects
are closed. Each valid unusual input must give the same bits as the plain contiguous copy.
"""

from __future__ import annotations

import copy
import gc
import os
import re
import subprocess
import sys
import tempfile
from contextlib import ExitStack

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import bad_inputs as catalogue  # noqa: E402

import acl_swiglu  # noqa: E402
from acl_swiglu import cli, emulator  # noqa: E402

pytestmark = pytest.mark.emulator_only

DEVICE_CHECK_LIMIT = 1 << 20   # device inputs larger than this (zero-stride huge views) are not read back


# ----------------------------------------------------------------------------- helpers


def _contains(message: str, fragment: str) -> bool:
    """Identifiers must appear as whole words (so `x` is not found in `max`); other text as is."""
    if fragment.isidentifier():
        return re.search(rf"(?<!\w){re.escape(fragment)}(?!\w)", message) is not None
    return fragment in message


def _root(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _snapshot(array: np.ndarray):
    """Everything about a NumPy array a call could change: its geometry, flags and every byte of
    the memory it lives in (the root array's, so a view's neighbourhood counts too)."""
    return (array.shape, array.strides, array.dtype.str, bool(array.flags.writeable),
            array.__array_interface__["data"][0], _root(array).tobytes())


def _cached_tensors(arrays) -> int:
    """aclTensor handles the package caches on the caller's DeviceArrays (freed with them)."""
    count = 0
    for array in arrays:
        tensor = getattr(array, "_tensor", None)
        if tensor is not None and not tensor.closed:
            count += 1
    return count


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"


def _bits(a):
    return None if a is None else (a.shape, np.dtype(a.dtype).str, np.ascontiguousarray(a).tobytes())


# ----------------------------------------------------------------------------- the catalogue itself


def test_catalogue_covers_every_api_and_argument():
    apis = {c.api for c in catalogue.BAD_CASES}
    assert apis == set(catalogue.APIS)
    arguments = {c.argument for c in catalogue.BAD_CASES}
    for name in ("grad_y", "x", "weight", "y_origin", "group_index", "clamp_limit", "grad_x", "grad_weight",
                 "stream", "workspace", "executor", "plan", "shape"):
        assert name in arguments, name
    for case in catalogue.BAD_CASES:
        assert case.fragments and case.rule and case.bad_input, case.id
        assert case.id == f"{case.api}-{case.slug}", case.id
        if case.api == "cli":
            assert case.exception is SystemExit and case.exit_status in (2, 3), case.id
    for case in catalogue.VALID_CASES:
        assert case.api in catalogue.APIS and case.api != "cli", case.id


def test_doc_is_rendered_from_the_catalogue():
    with open(catalogue.DOC_PATH, encoding="utf-8") as f:
        text = f.read()
    assert text == catalogue.render_markdown(), \
        "docs/bad_inputs.md is out of date: regenerate it with `python tests/bad_inputs.py`"


# ----------------------------------------------------------------------------- bad inputs


def _run_cli(case, call, capsys, monkeypatch):
    if call.subprocess:
        env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator", ACL_EMU_DEVICES="1")
        # from a neutral directory, so the installed package is imported, not the source tree
        proc = subprocess.run([sys.executable, "-m", "acl_swiglu", *call.argv], capture_output=True, text=True,
                              timeout=120, cwd=tempfile.gettempdir(), env=env)
        return proc.returncode, proc.stderr
    # main() sets these from --backend/--abi: whatever it does, monkeypatch restores them
    monkeypatch.setenv("ACL_SWIGLU_BACKEND", os.environ.get("ACL_SWIGLU_BACKEND", "emulator"))
    capsys.readouterr()
    try:
        status = cli.main(call.argv)
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


def _check_cli(case, capsys, monkeypatch):
    acl_swiglu.release_cached()
    before = emulator.live_counts()
    call = case.factory(None)
    status, err = _run_cli(case, call, capsys, monkeypatch)
    after = emulator.live_counts()
    problems = []
    if status != case.exit_status:
        problems.append(f"exit status {status}, expected {case.exit_status}")
    for fragment in case.fragments:
        if not _contains(err, fragment):
            problems.append(f"stderr does not name {fragment!r}")
    if after != before:
        problems.append(f"live handles changed from {before} to {after}")
    assert not problems, f"{case.id} (`{' '.join(call.argv)}`): " + "; ".join(problems) + f"\nstderr: {err!r}"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in catalogue.BAD_CASES])
def test_bad_input(case, monkeypatch, capsys):
    monkeypatch.setenv("ACL_SWIGLU_ABI", str(case.abi))
    if case.api == "cli":
        _check_cli(case, capsys, monkeypatch)
        return
    acl_swiglu.release_cached()
    baseline = emulator.live_counts()
    problems = []
    with ExitStack() as stack:
        call = case.factory(stack)
        host_before = {name: _snapshot(a) for name, a in call.host.items()}
        other_before = copy.deepcopy(call.other)
        cached_before = _cached_tensors(call.device_arrays)
        before = emulator.live_counts()
        kind, text = None, None
        try:
            text = call.run()
        except Exception as exc:   # anything but a crash: the class is checked below
            kind, text = type(exc), _describe(exc)
            exc.__traceback__ = None   # a kept frame would keep native handles alive
            del exc
        after = emulator.live_counts()
        cached_after = _cached_tensors(call.device_arrays)

        # the exception: class and names
        if kind is None:
            problems.append(f"no exception ({text}); expected {case.exception.__name__}")
        else:
            if not issubclass(kind, case.exception):
                problems.append(f"raised {kind.__module__}.{kind.__qualname__}, expected "
                                f"{case.exception.__module__}.{case.exception.__qualname__}")
            for fragment in case.fragments:
                if not _contains(text, fragment):
                    problems.append(f"message does not name {fragment!r}")

        # nothing allocated by a Python-side rejection; for a library-side one, only the caller's
        # own cached tensors may remain (they go with the caller's arrays)
        expected = dict(before)
        if case.side == "library":
            expected["tensor"] += cached_after - cached_before
        if after != expected:
            problems.append(f"live handles {before} -> {after} across the failing call")

        # inputs unchanged: host arrays byte for byte, device copies value for value
        for name, array in call.host.items():
            if _snapshot(array) != host_before[name]:
                problems.append(f"the NumPy array given as {name} was modified")
        if call.other != other_before:
            problems.append(f"a list argument was modified: {other_before} -> {call.other}")
        for name, (device_array, source) in call.device.items():
            if device_array.closed or device_array.buffer is None or device_array.size > DEVICE_CHECK_LIMIT:
                continue
            if device_array.to_numpy().tobytes() != catalogue.plain(source).tobytes():
                problems.append(f"the device copy of {name} was modified")
        call = None
    acl_swiglu.release_cached()
    final = emulator.live_counts()
    if final != baseline:   # only reference cycles left to collect? then it is no leak
        gc.collect()
        acl_swiglu.release_cached()
        final = emulator.live_counts()
    if final != baseline:
        problems.append(f"live handles {baseline} -> {final} once the caller's objects were closed")
    assert not problems, f"{case.id}: " + "; ".join(problems) + f"\n  raised: {text}"


# ----------------------------------------------------------------------------- valid unusual inputs


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in catalogue.VALID_CASES])
def test_valid_unusual_input(case, monkeypatch):
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    args = case.make()
    arrays = {name: a for name, a in args.items() if isinstance(a, np.ndarray)}
    before = {name: _snapshot(a) for name, a in arrays.items()}
    plain_args = {name: catalogue.plain(value) for name, value in args.items()}
    want_x, want_w = acl_swiglu.swiglu_group_quant_grad(**plain_args)
    with ExitStack() as stack:
        got_x, got_w = catalogue.run_valid(case, stack, args)
    assert _bits(got_x) == _bits(want_x), f"{case.id}: grad_x differs from the contiguous call"
    assert _bits(got_w) == _bits(want_w), f"{case.id}: grad_weight differs from the contiguous call"
    for name, array in arrays.items():
        assert _snapshot(array) == before[name], f"{case.id}: {name} was modified"


# ----------------------------------------------------------------------------- afterwards


def test_zz_process_still_usable_after_every_bad_input(monkeypatch):
    """After all the failures above, a valid call works through every API with the same bits."""
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    args = catalogue.base_args()
    want_x, want_w = acl_swiglu.swiglu_group_quant_grad(**args)
    assert np.isfinite(want_x).all() and want_w is not None
    for api in ("device", "plan-build", "phases"):
        case = catalogue.ValidCase(f"{api}-base", api, "all", "the base call", catalogue.base_args)
        with ExitStack() as stack:
            got_x, got_w = catalogue.run_valid(case, stack, catalogue.base_args())
        assert _bits(got_x) == _bits(want_x), api
        assert _bits(got_w) == _bits(want_w), api
    assert catalogue.BAD_CASES[0].api == "one-shot"
