"""Finding and loading the CANN libraries, or the bundled emulator.

Nothing is loaded at import time. ``libraries()`` loads once, thread-safely, and reports which
backend it chose and every path it used (``backend_info()``).

Before a library is loaded, it and every directory from its root (the CANN root, or the custom
operator path entry it was found under) down to it must be writable by their owner alone and
owned by root or the current user; where a symlink leads elsewhere, the place it leads to is
checked as well, up to ``/``. ``ACL_SWIGLU_TRUST_LIBS=1`` loads such libraries anyway, with a
warning naming what was accepted. Search variables must hold absolute paths: the current
directory is never searched.
"""

from __future__ import annotations

import ctypes
import glob
import grp
import os
import platform
import pwd
import stat
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, cast

from . import _releases
from .errors import ConfigurationError, LibraryNotFoundError

ENV_BACKEND = "ACL_SWIGLU_BACKEND"
ENV_LIB_DIR = "ACL_SWIGLU_LIB_DIR"
ENV_ABI = "ACL_SWIGLU_ABI"
ENV_EMULATOR_DIR = "ACL_SWIGLU_EMULATOR_DIR"   # another build of the emulator's lib64 (development)
ENV_EMULATOR_ABI = "ACL_EMU_ABI"                # the emulator's own revision (it reads the same rules)
ENV_TRUST = "ACL_SWIGLU_TRUST_LIBS"             # 1: load libraries that fail the ownership check
ROOT_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
CUSTOM_PATH_VARIABLE = "ASCEND_CUSTOM_OPP_PATH"
OPP_PATH_VARIABLE = "ASCEND_OPP_PATH"
# The characters C's isspace() accepts in the "C" locale: the emulator strips exactly these too.
ASCII_BLANKS = " \t\n\r\v\f"

BACKENDS = ("auto", "cann", "emulator")
DEFAULT_ROOTS = ("/usr/local/Ascend/cann", "/usr/local/Ascend/ascend-toolkit/latest")
RUNTIME_NAMES = ("libascendcl.so", "libacl_rt.so")
META_NAME = "libnnopbase.so"
OPERATOR_NAMES = ("libopapi_nn.so", "libopapi.so")
CUSTOM_OPERATOR_NAME = "libcust_opapi.so"
OPERATOR_SYMBOL = "aclnnSwigluGroupQuantGradGetWorkspaceSize"
EMULATOR_CANARY = "aclEmuVersion"
EMULATOR_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_emulator")
DEFAULT_ABI = 2

_FIX = (
    "To use a real Ascend host: `source <CANN root>/set_env.sh` (or set ASCEND_HOME_PATH to the "
    "CANN root). To run on the CPU emulator instead: set ACL_SWIGLU_BACKEND=emulator."
)


class UntrustedLibraryError(LibraryNotFoundError):
    """A library (or a directory above it) could be replaced by another user, so it is not loaded."""


# ---- reading settings ----


def _setting(variable: str, environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """A variable's value without leading and trailing ASCII blanks; None when unset or blank."""
    value = environ.get(variable)
    if value is None:
        return None
    value = value.strip(ASCII_BLANKS)
    return value or None


def parse_revision(variable: str, value: Optional[str]) -> Optional[int]:
    """An ABI revision setting: blanks around it ignored, empty = unset (None), else exactly 1 or 2."""
    if value is None:
        return None
    text = value.strip(ASCII_BLANKS)
    if text == "":
        return None
    if text in ("1", "2"):
        return int(text)
    raise ConfigurationError(
        f"{variable}={value!r} is not an ABI revision of aclnnSwigluGroupQuantGrad: use 1 (the first "
        "published form of the operator: aclIntArray groupIndex, clamp 0 = off) or 2 (every CANN release: "
        "INT64 tensor groupIndex, clamp -1.0 = off); blanks around the value are ignored and an empty "
        "value counts as unset"
    )


def _flag(variable: str) -> bool:
    value = os.environ.get(variable)
    text = (value or "").strip(ASCII_BLANKS)
    if text in ("", "0"):
        return False
    if text == "1":
        return True
    raise ConfigurationError(f"{variable}={value!r} must be 1 (on) or 0 / empty (off)")


def requested_backend() -> str:
    value = os.environ.get(ENV_BACKEND, "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ConfigurationError(
            f"{ENV_BACKEND}={os.environ.get(ENV_BACKEND)!r} is not one of {', '.join(BACKENDS)}"
        )
    return value


def _absolute(variable: str, value: str) -> str:
    """A search path from the environment: it must be absolute (the current directory is never searched)."""
    if not os.path.isabs(value):
        raise ConfigurationError(
            f"{variable} holds the relative path {value!r}: library search paths must be absolute, so that "
            "what is loaded does not depend on the current directory. Set it to the absolute path "
            f"(for example {os.path.abspath(os.path.expanduser(value))!r} from here)."
        )
    return value


# ---- the ABI revision ----

_override_warned: Set[int] = set()
# The last ACL_SWIGLU_ABI value seen (bytes) and its revision: calls read the variable every time
# (it may change between calls), and parse it only when it changed.
_abi_setting: Tuple[Optional[bytes], Optional[int]] = (None, None)
_abi_text_setting: Tuple[Optional[str], Optional[int]] = (None, None)   # the same, as os.environ gives it
_ENV_ABI_BYTES = ENV_ABI.encode()


def _process_getenv() -> Callable[[bytes], Optional[bytes]]:
    """The C library's getenv: the process environment as the emulator reads it, which
    os.environ writes through to. Once per call it is much cheaper than os.environ.get, which
    raises and catches two KeyErrors when the variable is unset."""
    function = ctypes.CDLL(None).getenv
    function.restype = ctypes.c_char_p   # (no argtypes: a bytes argument goes as its char * unconverted)
    return cast(Callable[[bytes], Optional[bytes]], function)


_getenv = _process_getenv()


def abi_revision() -> int:
    """The operator ABI revision calls use.

    ACL_SWIGLU_ABI when set (a warning when it disagrees with what the install declares), else the
    revision the install declares (its operator header; ACL_EMU_ABI for the bundled emulator), else
    2. Without ACL_SWIGLU_ABI this loads the libraries, since the answer depends on them.
    """
    global _abi_text_setting
    raw = os.environ.get(ENV_ABI)   # (the form torch.compile can trace, for acl_swiglu.torch)
    seen, value = _abi_text_setting
    if raw != seen:
        value = parse_revision(ENV_ABI, raw)   # raises for a bad value, every call, caching nothing
        _abi_text_setting = (raw, value)
    return _revision_with(value)


def call_revision() -> int:
    """abi_revision() for the call paths: the same variable, read with the C library's getenv."""
    global _abi_setting
    raw = _getenv(_ENV_ABI_BYTES)
    seen, value = _abi_setting
    if raw != seen:
        # (parsed as os.environ would give it; raises for a bad value, every call, caching nothing)
        value = parse_revision(ENV_ABI, None if raw is None else os.fsdecode(raw))
        _abi_setting = (raw, value)
    if value is None and _loaded is not None:
        return _install_revision   # (_revision_with's common case)
    return _revision_with(value)


def _revision_with(value: Optional[int]) -> int:
    """The revision in use, given ACL_SWIGLU_ABI's (None: unset)."""
    libs = _loaded
    if value is None:
        return _install_revision if libs is not None else libraries().info.abi_declared or DEFAULT_ABI
    if libs is not None and value != _install_revision and value not in _override_warned \
            and libs.info.abi_declared is not None:
        _override_warned.add(value)
        _warn_override(libs.info, value, stacklevel=4)
    return value


def _warn_override(info: "BackendInfo", chosen: int, stacklevel: int) -> None:
    warnings.warn(
        f"acl_swiglu: {ENV_ABI}={chosen} overrides ABI revision {info.abi_declared} declared by "
        f"{info.abi_declared_by}; calls use revision {chosen}. Unset {ENV_ABI} to follow the install.",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


# ---- the trust check ----


@dataclass(frozen=True)
class TrustReport:
    """What the ownership and permission check of the loaded libraries found."""

    ran: bool                              # False: the libraries were opened by name (system loader)
    enforced: bool                         # False: ACL_SWIGLU_TRUST_LIBS=1 accepted what failed
    checked: Tuple[str, ...] = ()          # every file and directory examined
    problems: Tuple[str, ...] = ()         # "path: what is wrong", accepted when not enforced
    note: str = ""

    def as_dict(self) -> Dict[str, object]:
        return {"ran": self.ran, "enforced": self.enforced, "checked": list(self.checked),
                "problems": list(self.problems), "note": self.note}

    def __str__(self) -> str:
        if not self.ran:
            return f"not checked ({self.note})"
        if not self.problems:
            return f"passed ({len(self.checked)} paths owned by root or you, writable by their owner only)"
        return (f"{len(self.problems)} problem(s) accepted because {ENV_TRUST}=1: " + "; ".join(self.problems))


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "no such user"


def _group_is_the_owner_alone(gid: int, uid: int) -> bool:
    """True when no user but `uid` is in group `gid` (a user private group, as umask 002 systems
    give every user): group write then lets nobody else write."""
    try:
        owner = pwd.getpwuid(uid).pw_name
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return False
    if members - {owner}:
        return False
    return all(user.pw_uid == uid for user in pwd.getpwall() if user.pw_gid == gid)


def path_problem(path: str, info: os.stat_result) -> Optional[str]:
    """Why a file or directory is unsafe to load code through, or None when it is fine."""
    me = os.geteuid()
    if info.st_uid not in (0, me):
        return (f"{path}: owned by uid {info.st_uid} ({_owner_name(info.st_uid)}), neither root nor the "
                f"current user (uid {me})")
    writable = [who for who, bit in (("group", stat.S_IWGRP), ("other users", stat.S_IWOTH))
                if info.st_mode & bit]
    if writable == ["group"] and _group_is_the_owner_alone(info.st_gid, info.st_uid):
        writable = []
    if writable and not (stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
        kind = "directory" if stat.S_ISDIR(info.st_mode) else "file"
        return (f"{path}: {kind} writable by {' and '.join(writable)} "
                f"(mode {stat.S_IMODE(info.st_mode):04o})")
    return None


def _descent(top: str, path: str) -> List[str]:
    """`top`, every directory below it on the way to `path`, and `path` (which lies under `top`)."""
    rel = os.path.relpath(path, top)
    chain = [top]
    if rel != ".":
        for part in rel.split(os.sep):
            chain.append(os.path.join(chain[-1], part))
    return chain


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def trust_chain(path: str, root: str) -> List[Tuple[str, bool]]:
    """The paths whose owner and mode decide whether `path` may be loaded, each with whether a
    symlink there should be followed: root down to the file as named, and, where symlinks lead
    elsewhere, the real file's directories (up to the real root, or to / outside it)."""
    named = [(p, True) for p in _descent(root, path)]
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    top = real_root if _inside(real, real_root) else os.sep
    return named + [(p, False) for p in _descent(top, real)]


class _TrustGate:
    """Checks each library before it is opened; refuses, or with ACL_SWIGLU_TRUST_LIBS=1 records."""

    def __init__(self) -> None:
        self.enforced = not _flag(ENV_TRUST)
        self.checked: List[str] = []
        self.problems: List[str] = []

    def admit(self, path: str, root: str) -> None:
        found = []
        for candidate, follow in trust_chain(path, root):
            key = os.path.realpath(candidate) if follow else candidate
            if key in self.checked:
                continue
            self.checked.append(key)
            try:
                info = os.stat(candidate) if follow else os.lstat(candidate)
            except OSError as exc:
                found.append(f"{candidate}: cannot be examined ({exc.strerror})")
                continue
            shown = candidate if key == candidate else f"{candidate} (a symlink to {key})"
            problem = path_problem(shown, info)
            if problem:
                found.append(problem)
        if not found:
            return
        if self.enforced:
            raise UntrustedLibraryError(
                f"refusing to load {path}: another user could replace it, and loading a library runs its code.\n  "
                + "\n  ".join(found)
                + "\nFix: make each path above owned by root or by you and writable only by its owner "
                "(`chmod go-w PATH`, and `chown` as its owner or root), or remove what does not belong. "
                f"If you trust these files as they are, set {ENV_TRUST}=1 to load them with a warning."
            )
        self.problems.extend(p for p in found if p not in self.problems)

    def report(self) -> TrustReport:
        if self.problems:
            warnings.warn(
                f"acl_swiglu: {ENV_TRUST}=1: loading libraries that other users could replace: "
                + "; ".join(self.problems),
                RuntimeWarning,
                stacklevel=5,
            )
        return TrustReport(True, self.enforced, tuple(self.checked), tuple(self.problems))


# ---- what the loader reports ----


@dataclass(frozen=True)
class BackendInfo:
    """Which libraries were loaded and why."""

    backend: str                  # "cann" or "emulator"
    requested: str                # the ACL_SWIGLU_BACKEND value that chose it
    root: Optional[str]           # the CANN-like root, when there is one
    runtime: str                  # path of libascendcl.so / libacl_rt.so
    meta: str                     # path of libnnopbase.so
    operator: str                 # path of the library exporting the operator
    searched: Tuple[str, ...] = field(default_factory=tuple)
    emulator_version: Optional[str] = None
    header: Optional[str] = None          # the operator header found beside the libraries
    header_abi: Optional[int] = None      # the ABI revision that header declares
    abi_declared: Optional[int] = None    # the revision the install declares (header, or ACL_EMU_ABI)
    abi_declared_by: Optional[str] = None  # the header path, or "ACL_EMU_ABI"
    cann_version: Optional[str] = None    # the CANN release read from the install (None on the emulator)
    cann_version_file: Optional[str] = None
    trust: Optional[TrustReport] = None

    @property
    def abi(self) -> int:
        """The ABI revision calls use now (abi_revision(): ACL_SWIGLU_ABI, else the install's, else 2)."""
        return abi_revision()

    @property
    def abi_source(self) -> str:
        """Where the ABI revision in use comes from."""
        if parse_revision(ENV_ABI, os.environ.get(ENV_ABI)) is not None:
            return ENV_ABI
        if self.abi_declared is not None and self.abi_declared_by is not None:
            return self.abi_declared_by
        return "default"

    @property
    def version(self) -> Optional[str]:
        """The release of what runs the operator: the CANN version, or the emulator's."""
        return self.emulator_version if self.backend == "emulator" else self.cann_version

    def as_dict(self) -> Dict[str, object]:
        return {
            "backend": self.backend,
            "requested": self.requested,
            "abi": self.abi,
            "abi_source": self.abi_source,
            "root": self.root,
            "runtime": self.runtime,
            "meta": self.meta,
            "operator": self.operator,
            "emulator_version": self.emulator_version,
            "cann_version": self.cann_version,
            "cann_version_file": self.cann_version_file,
            "header": self.header,
            "header_abi": self.header_abi,
            "trust": self.trust.as_dict() if self.trust else None,
            "searched": list(self.searched),
        }

    def __str__(self) -> str:
        name = "CPU emulator" if self.backend == "emulator" else "CANN"
        lines = [f"backend: {name} (requested: {self.requested}), ABI revision {self.abi} ({self.abi_source})"]
        if self.emulator_version:
            lines.append(f"  emulator: {self.emulator_version}")
        else:
            where = f" (from {self.cann_version_file})" if self.cann_version_file else ""
            lines.append(f"  version:  {self.cann_version or 'unknown'}{where}")
        lines.append(f"  root:     {self.root or '(system loader)'}")
        lines.append(f"  runtime:  {self.runtime}")
        lines.append(f"  meta:     {self.meta}")
        lines.append(f"  operator: {self.operator}")
        if self.header:
            lines.append(f"  header:   {self.header} (declares ABI revision {self.header_abi})")
        if self.trust is not None:
            lines.append(f"  trust:    {self.trust}")
        return "\n".join(lines)


# ---- where to look ----


def _root_lib_dirs(root: str) -> List[str]:
    arch = platform.machine() or "x86_64"
    return [os.path.join(root, "lib64"), os.path.join(root, f"{arch}-linux", "lib64")]


def cann_roots(environ: Mapping[str, str] = os.environ) -> List[Tuple[str, List[str]]]:
    """The CANN roots to try, in order, each with its library directories.

    A root is configured by ACL_SWIGLU_LIB_DIR (a lib directory or a root), ASCEND_HOME_PATH,
    ASCEND_TOOLKIT_HOME, or is a default root that exists. Relative values are refused.
    """
    roots: List[Tuple[str, List[str]]] = []
    override = _setting(ENV_LIB_DIR, environ)
    if override:
        _absolute(ENV_LIB_DIR, override)
        roots.append((override, [override] + _root_lib_dirs(override)))
    for var in ROOT_VARIABLES:
        root = _setting(var, environ)
        if root:
            roots.append((_absolute(var, root), _root_lib_dirs(root)))
    for root in DEFAULT_ROOTS:
        if os.path.isdir(root):
            roots.append((root, _root_lib_dirs(root)))
    seen = set()
    unique = []
    for root, dirs in roots:
        if root not in seen:
            seen.add(root)
            unique.append((root, dirs))
    return unique


def custom_operator_locations(environ: Mapping[str, str] = os.environ) -> List[Tuple[str, str]]:
    """(path entry, directory) pairs that may hold a custom-built libcust_opapi.so, in search order.

    Empty entries of ASCEND_CUSTOM_OPP_PATH (a trailing ':' that set_env.sh scripts leave) are
    skipped, never read as the current directory; relative entries are refused.
    """
    found: List[Tuple[str, str]] = []
    for entry in environ.get(CUSTOM_PATH_VARIABLE, "").split(os.pathsep):
        entry = entry.strip(ASCII_BLANKS)
        if not entry:
            continue
        _absolute(f"{CUSTOM_PATH_VARIABLE} entry", entry)
        found.append((entry, os.path.join(entry, "op_api", "lib")))
        found.extend((entry, d) for d in sorted(glob.glob(os.path.join(glob.escape(entry), "*", "op_api", "lib"))))
    opp = _setting(OPP_PATH_VARIABLE, environ)
    if opp:
        _absolute(OPP_PATH_VARIABLE, opp)
        found.extend((opp, d) for d in sorted(glob.glob(os.path.join(glob.escape(opp), "vendors", "*", "op_api", "lib"))))
    return found


def custom_operator_dirs(environ: Mapping[str, str] = os.environ) -> List[str]:
    """Directories that may hold a custom-built libcust_opapi.so, in search order."""
    return [d for _, d in custom_operator_locations(environ)]


HEADER_NAME = "aclnn_swiglu_group_quant_grad.h"


def header_abi(path: str) -> Optional[int]:
    """The ABI revision an operator header declares: 1 when groupIndex is an aclIntArray,
    2 when it is an aclTensor; None when the header does not say."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    start = text.find("aclnnSwigluGroupQuantGradGetWorkspaceSize(")
    if start < 0:
        return None
    prototype = text[start:text.find(")", start)]
    group = [part for part in prototype.split(",") if "groupIndex" in part]
    if not group:
        return None
    if "aclIntArray" in group[0]:
        return 1
    if "aclTensor" in group[0]:
        return 2
    return None


def find_operator_header(root: Optional[str], operator_path: str) -> Optional[str]:
    """The operator's header in a CANN root or beside a custom operator library, if any."""
    candidates = []
    if root:
        arch = platform.machine() or "x86_64"
        candidates += [os.path.join(root, "include", "aclnnop", HEADER_NAME),
                       os.path.join(root, f"{arch}-linux", "include", "aclnnop", HEADER_NAME),
                       os.path.join(root, "include", "aclnnop", "level2", HEADER_NAME)]
    op_dir = os.path.dirname(os.path.dirname(operator_path))   # .../op_api/lib -> .../op_api
    candidates += [os.path.join(op_dir, "include", HEADER_NAME), os.path.join(op_dir, "include", "aclnnop", HEADER_NAME)]
    return next((c for c in candidates if os.path.isfile(c)), None)


def _first_existing(names: Sequence[str], dirs: Sequence[str], searched: List[str]) -> Optional[str]:
    for name in names:
        for d in dirs:
            path = os.path.join(d, name)
            searched.append(path)
            if os.path.isfile(path):
                return path
    return None


# ---- loading ----


@dataclass
class Libraries:
    """The three loaded libraries and how they were found."""

    runtime: ctypes.CDLL
    meta: ctypes.CDLL
    operator: ctypes.CDLL
    info: BackendInfo

    @property
    def is_emulator(self) -> bool:
        """True when these are the bundled CPU emulator's libraries."""
        return self.info.backend == "emulator"


def _open(path: str) -> ctypes.CDLL:
    # RTLD_GLOBAL: the operator library resolves runtime and meta symbols from these.
    return ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)


def _emulator_version(runtime: ctypes.CDLL) -> Optional[str]:
    if not hasattr(runtime, EMULATOR_CANARY):
        return None
    fn = getattr(runtime, EMULATOR_CANARY)
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return str(fn().decode())


def _declared_abi(header: Optional[str], bundled_emulator: bool) -> Tuple[Optional[int], Optional[str]]:
    """The revision the install declares and who declares it: the operator header of a CANN root;
    for the bundled emulator, whose header is generic, ACL_EMU_ABI when it is set."""
    if bundled_emulator:
        revision = parse_revision(ENV_EMULATOR_ABI, os.environ.get(ENV_EMULATOR_ABI))
        return (revision, ENV_EMULATOR_ABI) if revision is not None else (None, None)
    revision = header_abi(header) if header else None
    return (revision, header) if revision is not None else (None, None)


def _admit_and_open(gate: "_TrustGate", what: str, path: str, root: str) -> ctypes.CDLL:
    gate.admit(path, root)
    try:
        return _open(path)
    except OSError as exc:
        raise LibraryNotFoundError(f"cannot load the CANN {what} library {path}: {exc}\n{_FIX}") from exc


def _load_root(root: str, dirs: List[str], requested: str, searched: List[str],
               bundled_emulator: bool = False) -> Libraries:
    """Loads runtime, meta and operator libraries, all from one root (plus custom operators)."""
    gate = _TrustGate()
    runtime_path = _first_existing(RUNTIME_NAMES, dirs, searched)
    meta_path = _first_existing((META_NAME,), dirs, searched)
    missing = [n for n, p in (("/".join(RUNTIME_NAMES), runtime_path), (META_NAME, meta_path)) if p is None]
    if missing or runtime_path is None or meta_path is None:
        raise LibraryNotFoundError(
            f"CANN libraries not found under {root}: no {' and no '.join(missing)} in any of:\n  "
            + "\n  ".join(dirs) + f"\n{_FIX}"
        )
    runtime, meta = (_admit_and_open(gate, what, path, root)
                     for what, path in (("runtime", runtime_path), ("meta API", meta_path)))

    candidates = [] if bundled_emulator else [
        (entry, os.path.join(d, CUSTOM_OPERATOR_NAME)) for entry, d in custom_operator_locations()]
    candidates += [(root, os.path.join(d, name)) for name in OPERATOR_NAMES for d in dirs]
    checked: List[str] = []
    operator: Optional[ctypes.CDLL] = None
    operator_path: Optional[str] = None
    for entry, path in candidates:
        searched.append(path)
        if not os.path.isfile(path):
            checked.append(f"{path} (absent)")
            continue
        gate.admit(path, entry)
        try:
            lib = _open(path)
        except OSError as exc:
            checked.append(f"{path} (cannot load: {exc})")
            continue
        if hasattr(lib, OPERATOR_SYMBOL):
            operator, operator_path = lib, path
            break
        checked.append(f"{path} (does not export {OPERATOR_SYMBOL})")
    if operator is None or operator_path is None:
        raise LibraryNotFoundError(
            f"the CANN install at {root} does not provide {OPERATOR_SYMBOL}. "
            "aclnnSwigluGroupQuantGrad exists only for Ascend 950PR/950DT, in a CANN (or a custom "
            "operator package, ASCEND_CUSTOM_OPP_PATH) that ships it.\nChecked:\n  "
            + "\n  ".join(checked) + f"\n{_FIX}"
        )
    version = _emulator_version(runtime)
    header = None if bundled_emulator else find_operator_header(root, operator_path)
    declared, declared_by = _declared_abi(header, bundled_emulator)
    cann_version, version_file = (None, None) if version else _releases.read_install_version(root)
    info = BackendInfo(
        backend="emulator" if version else "cann",
        requested=requested,
        root=root,
        runtime=runtime_path,
        meta=meta_path,
        operator=operator_path,
        searched=tuple(searched),
        emulator_version=version,
        header=header,
        header_abi=header_abi(header) if header else None,
        abi_declared=declared,
        abi_declared_by=declared_by,
        cann_version=cann_version,
        cann_version_file=version_file,
        trust=gate.report(),
    )
    _warn_abi_mismatch(info)
    _releases.record_install(cann_version)
    return Libraries(runtime, meta, operator, info)


def _warn_abi_mismatch(info: BackendInfo) -> None:
    """ACL_SWIGLU_ABI set to another revision than the install declares: it wins, and says so."""
    chosen = parse_revision(ENV_ABI, os.environ.get(ENV_ABI))
    if chosen is not None and info.abi_declared is not None and info.abi_declared != chosen:
        _override_warned.add(chosen)
        _warn_override(info, chosen, stacklevel=5)


def _load_cann(roots: List[Tuple[str, List[str]]], requested: str) -> Libraries:
    """The first configured root that holds a runtime library provides every library."""
    searched: List[str] = []
    for root, dirs in roots:
        probe: List[str] = []
        if _first_existing(RUNTIME_NAMES, dirs, probe) is not None:
            return _load_root(root, dirs, requested, searched)
        searched.extend(probe)
    raise LibraryNotFoundError(
        "CANN libraries not found: no " + " or ".join(RUNTIME_NAMES) + " in any configured root. Searched:\n  "
        + "\n  ".join(searched) + f"\n{_FIX}"
    )


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _path_of(library: ctypes.CDLL, symbol: str, fallback: str) -> str:
    """The file a library opened by name was loaded from (dladdr on one of its symbols)."""
    try:
        libc = ctypes.CDLL(None)
        dladdr = libc.dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        dladdr.restype = ctypes.c_int
        info = _DlInfo()
        address = ctypes.cast(getattr(library, symbol), ctypes.c_void_p)
        if dladdr(address, ctypes.byref(info)) and info.dli_fname:
            file_name: bytes = info.dli_fname
            return os.path.realpath(file_name.decode())
    except (AttributeError, OSError):
        pass
    return fallback


_SYSTEM_LOADER_NOTE = ("opened by name through the system loader (LD_LIBRARY_PATH, ld.so.cache), which "
                       "picks the files; set ASCEND_HOME_PATH to have them checked")


def _load_system(requested: str) -> Optional[Libraries]:
    """The system loader's view (LD_LIBRARY_PATH, ld.so.conf), or None when it has no CANN."""
    try:
        runtime = _open(RUNTIME_NAMES[0])
        runtime_path = RUNTIME_NAMES[0]
    except OSError:
        try:
            runtime = _open(RUNTIME_NAMES[1])
            runtime_path = RUNTIME_NAMES[1]
        except OSError:
            return None
    try:
        meta = _open(META_NAME)
    except OSError as exc:
        raise LibraryNotFoundError(f"the system loader finds {runtime_path} but not {META_NAME}: {exc}\n{_FIX}") from exc
    for name in (CUSTOM_OPERATOR_NAME,) + OPERATOR_NAMES:
        try:
            lib = _open(name)
        except OSError:
            continue
        if hasattr(lib, OPERATOR_SYMBOL):
            version = _emulator_version(runtime)
            paths = (_path_of(runtime, "aclInit", runtime_path), _path_of(meta, "aclCreateTensor", META_NAME),
                     _path_of(lib, OPERATOR_SYMBOL, name))
            info = BackendInfo("emulator" if version else "cann", requested, None, *paths, paths, version,
                               trust=TrustReport(False, False, note=_SYSTEM_LOADER_NOTE))
            return Libraries(runtime, meta, lib, info)
    raise LibraryNotFoundError(
        f"the system loader finds the CANN runtime but no library exporting {OPERATOR_SYMBOL}; "
        f"aclnnSwigluGroupQuantGrad needs Ascend 950PR/950DT and a CANN that ships it.\n{_FIX}"
    )


def _load_emulator(requested: str) -> Libraries:
    chosen = _setting(ENV_EMULATOR_DIR)
    lib_dir = _absolute(ENV_EMULATOR_DIR, chosen) if chosen else os.path.join(EMULATOR_ROOT, "lib64")
    if not os.path.isfile(os.path.join(lib_dir, "libascendcl.so")):
        if chosen:
            raise LibraryNotFoundError(f"{ENV_EMULATOR_DIR}={lib_dir} holds no libascendcl.so")
        raise LibraryNotFoundError(
            f"the bundled emulator is missing from {lib_dir}: the package was not built with its "
            "native part (install it with `pip install .`, which compiles it with CMake)"
        )
    root = EMULATOR_ROOT if lib_dir == os.path.join(EMULATOR_ROOT, "lib64") else os.path.dirname(lib_dir)
    return _load_root(root, [lib_dir], requested, [], bundled_emulator=True)


def load(requested: Optional[str] = None) -> Libraries:
    """Loads the libraries for the requested backend (see ACL_SWIGLU_BACKEND)."""
    requested = requested or requested_backend()
    parse_revision(ENV_ABI, os.environ.get(ENV_ABI))            # a bad value fails before anything loads
    parse_revision(ENV_EMULATOR_ABI, os.environ.get(ENV_EMULATOR_ABI))
    _flag(ENV_TRUST)
    if requested == "emulator":
        return _load_emulator(requested)
    roots = cann_roots()
    custom_operator_locations()                                  # relative entries fail here too
    if roots:
        return _load_cann(roots, requested)
    system = _load_system(requested)
    if system is not None:
        return system
    if requested == "cann":
        raise LibraryNotFoundError(
            f"ACL_SWIGLU_BACKEND=cann but no CANN was found: {ENV_LIB_DIR}, ASCEND_HOME_PATH and "
            f"ASCEND_TOOLKIT_HOME are unset, none of {', '.join(DEFAULT_ROOTS)} exists, and the "
            f"system loader has no libascendcl.so.\n{_FIX}"
        )
    libs = _load_emulator(requested)
    warnings.warn(
        "acl_swiglu: no CANN installation found; running on the bundled CPU emulator "
        f"({libs.info.root}). Set ACL_SWIGLU_BACKEND=emulator to silence this, or source "
        "set_env.sh to use an Ascend device.",
        RuntimeWarning,
        stacklevel=3,
    )
    return libs


_lock = threading.Lock()
_loaded: Optional[Libraries] = None
_install_revision = DEFAULT_ABI   # the loaded install's declared revision, or the default


def libraries() -> Libraries:
    """The loaded libraries, loading them on first use."""
    global _loaded, _install_revision
    libs = _loaded
    if libs is None:
        with _lock:
            if _loaded is None:
                libs = load()
                _install_revision = libs.info.abi_declared or DEFAULT_ABI
                _loaded = libs
            libs = _loaded
    return libs


def loaded() -> Optional[Libraries]:
    """The libraries if they were loaded already, else None (loads nothing)."""
    return _loaded


def backend_info() -> BackendInfo:
    """Which backend runs the operator and the path of every library (loads them if needed)."""
    return libraries().info
