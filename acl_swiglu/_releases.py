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

import functools
import os
import platform
import re
import stat
import threading
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

import numpy as np

from .errors import ArgumentError, warn_at_caller


#: Vector-core counts of the Ascend 950 parts in the platform configurations.
FAMILY_VECTOR_CORES = (8, 16, 56, 64, 72)
#: The count assumed when the runtime cannot tell.
ASSUMED_VECTOR_CORES = max(FAMILY_VECTOR_CORES)

ASSUMED = "assumed"


class CoreCount(NamedTuple):
    """A device's vector cores and where the figure came from."""

    cores: int
    source: str   # "aclGetDeviceCapability(ACL_DEVICE_INFO_VECTOR_CORE_NUM)", ... or "assumed: ..."

    @property
    def from_device(self) -> bool:
        """False when the figure is the assumed largest of the family."""
        return not self.source.startswith(ASSUMED)

    def describe(self) -> str:
        """'56 vector cores (from aclGetDeviceCapability(...))' for messages."""
        return f"{self.cores} vector cores (from {self.source})" if self.from_device else \
            f"{self.cores} vector cores ({self.source})"



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


# ---- the releases and what is known about them (docs/cann_releases.md) ----


class Release(NamedTuple):
    """What one CANN release's aclnnSwigluGroupQuantGrad does differently (from its public source;
    none of it seen on hardware yet)."""

    name: str
    kernel: str                     # "9.1.0": UB factor 12, no dtype terms; "current": 14, +2 fp16/bf16
    hangs_on_partial_trunc: bool    # 0 < trunc < min(T, vector cores) deadlocks the device
    unwritten_at_trunc_0: bool      # trunc = 0 leaves every row unwritten
    narrow_inputs_corrupted: bool   # fp16/bf16 inputs may be corrupted (before the widening fix)
    weight_needs_rank: bool         # weight must have grad_y's rank with last dim 1
    clamp_off_band: bool            # |c + 1| <= 1e-6 (fp32) is "off", not only c == -1
    driver: Optional[str]           # the driver the release notes pair it with, where they say
    quant_counts_overread: bool = False   # aclnnSwigluGroupQuant sums G counts past their end (G mod 128 >= 97)


#: Every release that ships the operator, oldest first.
RELEASES: Dict[str, Release] = {r.name: r for r in (
    Release("9.1.0", "9.1.0", True, True, True, True, False, None, True),
    Release("9.1.1", "9.1.0", True, True, True, True, False, "26.1.1", True),    # no fix known: as 9.1.0
    Release("9.2.0-beta.1", "9.1.0", True, True, True, False, False, None),
    Release("9.2.0-beta.2", "current", False, False, False, False, False, None),
    Release("9.2.0", "current", False, False, False, False, True, "26.2.RC1"),
)}
#: Releases whose kernel predates the group_index deadlock fix and the fp16/bf16 widening fix.
AFFECTED_RELEASES = tuple(name for name, r in RELEASES.items() if r.hangs_on_partial_trunc)
FIXED_IN = "9.2.0-beta.2"
NEWEST_RELEASE = "9.2.0"


@functools.lru_cache(maxsize=64)   # the guards ask on every call: one dict lookup after the first
def release_info(version: Optional[str]) -> Optional[Release]:
    """The known release a version string names (any spelling normalise() accepts), else None."""
    return RELEASES.get(normalise(version)) if version else None


def is_affected(version: Optional[str]) -> bool:
    """True for the releases of AFFECTED_RELEASES (in any spelling normalise() accepts)."""
    info = release_info(version)
    return info is not None and info.hangs_on_partial_trunc


def known_issues(version: str) -> str:
    """What goes wrong on a release, and the fix ('' for a release with no known issue)."""
    info = release_info(version)
    if info is None or not info.hangs_on_partial_trunc:
        return ""
    text = (f"CANN {version} ships an aclnnSwigluGroupQuantGrad kernel from before the fixes of {FIXED_IN}: "
            "a call with group_index giving 0 < trunc < min(T, the device's vector cores) hangs the device, "
            "with trunc = 0 the rows are never written, and fp16/bf16 inputs may be corrupted")
    if info.weight_needs_rank:
        text += "; weight must also have grad_y's rank with last dim 1"
    return text + f". Upgrade to CANN {FIXED_IN} or later."


_warned: Set[str] = set()
_warn_lock = threading.Lock()
_installed_release: Optional[str] = None   # the loaded CANN's version (None: none read)


def record_install(version: Optional[str]) -> None:
    """Called by the loader with the version of the CANN it loaded: remembered as the default of
    the checks below, and a warning once per process and release when it is one of
    AFFECTED_RELEASES."""
    global _installed_release
    _installed_release = version
    if version is None or not is_affected(version):
        return
    with _warn_lock:
        if normalise(version) in _warned:
            return
        _warned.add(normalise(version))
    warn_at_caller(f"acl_swiglu: {known_issues(version)}")


class _Unset:
    """The default of `version` arguments: the loaded CANN's version."""


_UNSET = _Unset()
GroupCounts = Union[np.ndarray, Sequence[int]]
#: A core count as the checks take it: the device's (count, source), a bare count, or None to
#: ask the calling thread's device.
#: A core count as the guard takes it: a CoreCount, (count, source), a count, a function that asks
#: the device (called only when the answer matters), or None (the largest part's, assumed).
Cores = Union[CoreCount, Tuple[int, str], int, Callable[[], CoreCount], None]


def _version(version: Union[Optional[str], _Unset]) -> Optional[str]:
    return _installed_release if isinstance(version, _Unset) else version


def _core_count(cores: Cores) -> CoreCount:
    if isinstance(cores, CoreCount):
        return cores
    if cores is None:
        return CoreCount(ASSUMED_VECTOR_CORES, f"{ASSUMED}: the largest Ascend 950 part; the device was not asked")
    if isinstance(cores, tuple):
        return CoreCount(int(cores[0]), str(cores[1]))
    if callable(cores):
        return cores()
    return CoreCount(int(cores), "the caller")


def host_trunc(group_index: GroupCounts, tokens: int) -> int:
    """trunc as the operator computes it from host counts: each cast to uint32, summed in uint32."""
    counts = np.asarray(group_index)
    total = int(np.sum(counts.astype(np.uint32), dtype=np.uint32)) if counts.size else 0
    return min(total, int(tokens))


def guard_active() -> bool:
    """Whether the loaded CANN's release is one that a group_index can hang: then calls check
    the counts' values every time."""
    global _affected
    version, affected = _affected
    if version is not _installed_release:   # (normalising the text costs more than a call may)
        version = _installed_release
        affected = is_affected(version)
        _affected = (version, affected)
    return affected


_affected: Tuple[Optional[str], bool] = (None, False)   # guard_active()'s last answer, and for which version


def quant_counts_overread() -> Optional[str]:
    """The loaded CANN's version when its aclnnSwigluGroupQuant sums group counts past their end
    for some G (the forward refuses those G), else None."""
    info = release_info(_installed_release)
    return _installed_release if info is not None and info.quant_counts_overread else None


def check_trunc(trunc: int, tokens: int, *, version: Union[Optional[str], _Unset] = _UNSET,
                cores: Cores = None) -> None:
    """Refuses a call the release is known to hang on: 0 < trunc < min(tokens, vector cores).

    ``trunc`` is min(sum of group_index as uint32, T) as the host sees it, ``tokens`` is T.
    ``version`` defaults to the loaded CANN's; ``cores`` to the calling thread's device's count
    (asked only when the release and the values could hang). Raises ReleaseLimitationError.
    """
    version = _version(version)
    if not is_affected(version):
        return
    trunc, tokens = int(trunc), int(tokens)
    if trunc <= 0 or trunc >= tokens:   # no partial truncation: safe whatever the core count
        return
    count = _core_count(cores)
    limit = min(tokens, count.cores)
    if trunc < limit:
        raise ReleaseLimitationError(
            f"group_index gives trunc = {trunc} of T = {tokens} rows: on CANN {version} a call with "
            f"0 < trunc < min(T, vector cores) hangs the device, and this device has {count.describe()}, "
            f"so the limit is min({tokens}, {count.cores}) = {limit} and the call is refused. Safe on {version}: "
            f"no group_index, or group_index summing to 0 or to at least {limit} rows. The fix: upgrade CANN to "
            f"{FIXED_IN} or later."
        )


def check_group_counts(counts: Optional[GroupCounts], tokens: int, *,
                       version: Union[Optional[str], _Unset] = _UNSET, cores: Cores = None) -> None:
    """check_trunc for group_index counts the host can see (revision 1's host values, a NumPy
    call's array, a plan's rebinding with host values); returns at once when there are none or
    the release is not affected."""
    if counts is None or not is_affected(_version(version)):
        return
    check_trunc(host_trunc(counts, tokens), tokens, version=version, cores=cores)


def check_call(trunc: int, tokens: int, version: Union[Optional[str], _Unset] = _UNSET, cores: Cores = None) -> None:
    """check_trunc with the version as a positional argument (the earlier form)."""
    check_trunc(trunc, tokens, version=version, cores=cores)


def check_group_index(group_index: Optional[GroupCounts], tokens: int,
                      version: Union[Optional[str], _Unset] = _UNSET, cores: Cores = None) -> None:
    """check_group_counts with the version as a positional argument (the earlier form)."""
    check_group_counts(group_index, tokens, version=version, cores=cores)


# ---- device hazards the public kernel source shows (unverified; docs/cann_releases.md) ----

MISALIGNED_H = "misaligned-h"
ZERO_FILL_WRAP = "zero-fill-wrap"
OFFSET_WRAP = "offset-wrap"
HAZARD_CLASSES = (MISALIGNED_H, ZERO_FILL_WRAP, OFFSET_WRAP)
_PROBE_FAMILY = {MISALIGNED_H: "misaligned_h", ZERO_FILL_WRAP: "zero_fill_large_h", OFFSET_WRAP: "large_offsets"}


def _probe_advice(hazard: str) -> str:
    unsafe = " --unsafe" if hazard == OFFSET_WRAP else ""
    return (f"To see what this device does, run `acl-swiglu-probe --families {_PROBE_FAMILY[hazard]}{unsafe} "
            "--out probe.json` and send probe.json (docs/fidelity.md).")


def hazards(tokens: int, hidden: int, itemsize: int, trunc_possible: bool, cores: Cores) -> List[Tuple[str, str]]:
    """The device hazards a call of this shape may meet, as (class, text) pairs (HAZARD_CLASSES).

    ``tokens`` is T, ``hidden`` H, ``itemsize`` the bytes of an element of grad_y and x (4, or 2
    for fp16/bf16), ``trunc_possible`` whether rows past trunc may exist (a group_index that may
    sum to less than T), ``cores`` the device's vector cores (a count, (count, source), or None
    when unknown: then the smallest part of the family, 8, is assumed, which packs the most rows
    on a core). Pure: it asks nothing.
    """
    tokens, hidden, itemsize = int(tokens), int(hidden), int(itemsize)
    found: List[Tuple[str, str]] = []
    if tokens <= 0 or hidden <= 0:
        return found
    if cores is None:
        count, known = 0, False
    else:
        given = _core_count(cores)
        count, known = given.cores, given.from_device
    if not known:
        count = min(FAMILY_VECTOR_CORES)
    align, dtype = (8, "fp32") if itemsize == 4 else (16, "fp16/bf16")
    if hidden % align and tokens > count:
        where = f"this device's {count} vector cores" if known else             f"a part with {count} vector cores (this device's count is not known)"
        found.append((MISALIGNED_H, (
            f"aclnnSwigluGroupQuantGrad: H = {hidden} is not a multiple of {align} ({dtype}) and T = {tokens} rows put "
            f"more than one row on {where}. The public kernel source pads x's rows in on-chip memory but not "
            "grad_y's, so a core's later rows may be paired with shifted grad_y values (not yet seen on hardware). "
            + _probe_advice(MISALIGNED_H))))
    row_bytes = 2 * hidden * itemsize
    if trunc_possible and row_bytes >= 1 << 16:
        found.append((ZERO_FILL_WRAP, (
            f"aclnnSwigluGroupQuantGrad: rows past trunc are zero-filled with a 16-bit copy length in the public "
            f"kernel source, and a grad_x row here is 2H x {itemsize} = {row_bytes} bytes >= 65536, so that length "
            "wraps and those rows are likely left unwritten (not yet seen on hardware); fill grad_x with zeros "
            "yourself if you rely on them. " + _probe_advice(ZERO_FILL_WRAP))))
    if tokens * 2 * hidden >= 1 << 32:
        found.append((OFFSET_WRAP, (
            f"aclnnSwigluGroupQuantGrad: T x 2H = {tokens} x {2 * hidden} = {tokens * 2 * hidden} elements >= 2^32, "
            "and the public kernel source computes element offsets in 32 bits, so rows past 2^32 elements likely "
            "read and write the wrong places (not yet seen on hardware); split the call along T. "
            + _probe_advice(OFFSET_WRAP))))
    return found


_hazards_warned: Set[str] = set()


def warn_hazards(tokens: int, hidden: int, itemsize: int, trunc_possible: bool, cores: Cores, *,
                 emulator: bool) -> List[Tuple[str, str]]:
    """hazards(), each class warned once per process with AclSwigluWarning, on a real install
    only (``emulator``: whether the loaded backend is the emulator, which computes the clean
    result for these shapes, docs/emulator.md). Returns the hazards found."""
    found = hazards(tokens, hidden, itemsize, trunc_possible, cores)
    if not found or emulator:
        return found
    for hazard, text in found:
        with _warn_lock:
            if hazard in _hazards_warned:
                continue
            _hazards_warned.add(hazard)
        warn_at_caller(f"acl_swiglu: {text}")
    return found

