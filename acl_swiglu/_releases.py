"""CANN releases that ship aclnnSwigluGroupQuantGrad: reading the installed version, and what is
known about the releases that behave differently (docs/cann_releases.md).

Where the version is read from, first found wins (``<root>`` is the CANN root in use, ``<arch>``
the machine, e.g. ``aarch64``):

1. ``<root>/share/info/ops_nn/version.info``, ``Version=`` -- the operator package's own record
   (newer ``cann-<v>`` layout, where each package installs under ``share/info/<package>/``; the
   behaviours below belong to ops-nn releases).
2. ``<root>/share/info/runtime/version.info``, ``Version=`` -- the runtime package's record
   (newer layout; what the runtime's own version query reads).
3. ``<root>/<arch>-linux/ascend_all_cann_install.info``, ``version=`` (newer ``cann-<v>`` layout).
4. ``<root>/<arch>-linux/ascend_toolkit_install.info``, ``version=`` (older
   ``ascend-toolkit/<v>`` layout, the toolkit's install record).
5. ``<root>/version.cfg``, ``toolkit_running_version=[<build>:<release>]`` (older layout; the
   release after the colon).
6. ``<root>/compiler/version.info``, ``Version=`` (older layout; last, since some older releases
   write a build number there rather than the release name).

The loader asks the runtime first (``aclsysGetCANNVersion``, acl_swiglu/_loader.py) and reads these
files only when it cannot answer, each one checked and read through the descriptor it checked.
"""

from __future__ import annotations

import os
import platform
import re
import stat
import threading
import warnings
from typing import Callable, Iterable, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from .errors import ArgumentError

#: Releases whose kernel predates the group_index deadlock fix and the fp16/bf16 widening fix.
AFFECTED_RELEASES = ("9.1.0", "9.2.0-beta.1")
FIXED_IN = "9.2.0-beta.2"

#: Vector (AIV) cores of an Ascend 950, the kernel's block count limit: the operator's tiling runs
#: min(T, vector cores) blocks. Published platform data for the 950's architecture (3510) gives
#: 28 cube and 56 vector cores; the count cannot be read on the host without a device call.
AIV_CORES_950 = 56


class ReleaseLimitationError(ArgumentError):
    """A call the installed CANN release is known to mishandle (for example, to hang the device)."""


def _arch() -> str:
    return platform.machine() or "x86_64"


def version_files(root: str) -> Tuple[Tuple[str, str], ...]:
    """(path, key) pairs where an install records its version, in the order they are read."""
    arch_dir = os.path.join(root, f"{_arch()}-linux")
    return (
        (os.path.join(root, "share", "info", "ops_nn", "version.info"), "Version"),
        (os.path.join(root, "share", "info", "runtime", "version.info"), "Version"),
        (os.path.join(arch_dir, "ascend_all_cann_install.info"), "version"),
        (os.path.join(arch_dir, "ascend_toolkit_install.info"), "version"),
        (os.path.join(root, "version.cfg"), "toolkit_running_version"),
        (os.path.join(root, "compiler", "version.info"), "Version"),
    )


def _value(lines: Iterable[str], key: str) -> Optional[str]:
    for line in lines:
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            value = value.strip().strip('"').strip()
            if value.startswith("[") and value.endswith("]"):   # version.cfg: [<build>:<release>]
                value = value[1:-1].rpartition(":")[2].strip()
            if value:
                return value
    return None


def read_text_file(path: str, limit: int = 1 << 20) -> Optional[str]:
    """The text of the regular file at `path` (at most `limit` bytes), or None when it is absent or
    not a regular file. Never opened in a way that can block: a FIFO, a device or a directory is
    refused from its stat, and the open is non-blocking and checked again on the descriptor."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: List[bytes] = []
        size = 0
        while size < limit:
            chunk = os.read(fd, min(1 << 16, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_install_version(root: Optional[str], read: Optional[Callable[[str], Optional[str]]] = None,
                         ) -> Tuple[Optional[str], Optional[str]]:
    """(version, file it was read from), or (None, None) when the install records none.

    `read(path)` gives a file's text, or None when it is absent or is not to be read; the loader
    passes one that checks each file (acl_swiglu/_trust.py) and reads it through the descriptor it
    checked. The default reads regular files only.
    """
    if not root:
        return None, None
    reader = read or read_text_file
    for path, key in version_files(root):
        text = reader(path)
        if text is None:
            continue
        value = _value(text.splitlines(), key)
        if value:
            return value, path
    return None, None


def normalise(version: str) -> str:
    """Lower case, without a leading 'v' and blanks: '9.2.0-BETA.1' -> '9.2.0-beta.1'."""
    text = version.strip().lower()
    return text[1:] if re.match(r"v\d", text) else text


def is_affected(version: Optional[str]) -> bool:
    """True for the releases of AFFECTED_RELEASES (in any spelling normalise() accepts)."""
    return version is not None and normalise(version) in AFFECTED_RELEASES


def known_issues(version: str) -> str:
    """What goes wrong on an affected release, and the fix."""
    text = (f"CANN {version} ships an aclnnSwigluGroupQuantGrad kernel from before the fixes of {FIXED_IN}: "
            f"a call with group_index giving 0 < trunc < min(T, {AIV_CORES_950}) hangs the device, with "
            "trunc = 0 the rows are never written, and fp16/bf16 inputs may be corrupted")
    if normalise(version) == "9.1.0":
        text += "; weight must also have grad_y's rank with last dim 1"
    return text + f". Upgrade to CANN {FIXED_IN} or later."


_warned: Set[str] = set()
_warn_lock = threading.Lock()
_installed_release: Optional[str] = None   # the loaded CANN's version (None: none read, or the emulator)


def record_install(version: Optional[str]) -> None:
    """Called by the loader with the version of the CANN it loaded: remembered for check_call, and
    a warning once per process and release when it is one of AFFECTED_RELEASES."""
    global _installed_release
    _installed_release = version
    if version is None or not is_affected(version):
        return
    with _warn_lock:
        if normalise(version) in _warned:
            return
        _warned.add(normalise(version))
    warnings.warn(f"acl_swiglu: {known_issues(version)}", RuntimeWarning, stacklevel=6)


class _Unset:
    """The default of `version` arguments: the loaded CANN's version."""


_UNSET = _Unset()
GroupCounts = Union[np.ndarray, Sequence[int]]


def check_call(trunc: int, tokens: int, version: Union[Optional[str], _Unset] = _UNSET) -> None:
    """Refuses a call the installed release is known to hang on: 0 < trunc < min(tokens, AI cores).

    ``trunc`` is min(sum of group_index as uint32, T) as the host sees it, ``tokens`` is T.
    ``version`` defaults to the loaded CANN's (None on the emulator: nothing to check).
    """
    if isinstance(version, _Unset):
        version = _installed_release
    if not is_affected(version):
        return
    limit = min(int(tokens), AIV_CORES_950)
    if 0 < trunc < limit:
        raise ReleaseLimitationError(
            f"group_index gives trunc = {trunc} of T = {tokens} rows: on CANN {version} a call with "
            f"0 < trunc < min(T, {AIV_CORES_950} AI cores) = {limit} hangs the device, so it is refused. "
            f"Upgrade CANN to {FIXED_IN} or later (the fix of this deadlock); on {version} only calls "
            f"whose group_index sums to at least {limit} rows, or calls without group_index, are safe."
        )


def host_trunc(group_index: GroupCounts, tokens: int) -> int:
    """trunc as the operator computes it from host counts: each cast to uint32, summed in uint32."""
    counts = np.asarray(group_index)
    total = int(np.sum(counts.astype(np.uint32), dtype=np.uint32)) if counts.size else 0
    return min(total, int(tokens))


def guard_active() -> bool:
    """Whether the loaded CANN's release is one that a group_index can hang: then calls check
    the counts' values every time."""
    return is_affected(_installed_release)


def check_group_index(group_index: Optional[GroupCounts], tokens: int,
                      version: Union[Optional[str], _Unset] = _UNSET) -> None:
    """check_call for a call whose group_index counts are on the host (revision 1, or the NumPy
    one-shot call); returns at once when there is none or the release is not affected."""
    if isinstance(version, _Unset):
        version = _installed_release
    if group_index is not None and version is not None and is_affected(version):
        check_call(host_trunc(group_index, tokens), tokens, version)
