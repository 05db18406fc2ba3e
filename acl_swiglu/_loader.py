"""Finding and loading the CANN libraries, or the bundled emulator.

Nothing is loaded at import time. ``libraries()`` loads once, thread-safely, and reports which
backend it chose and every path it used (``backend_info()``).
"""

from __future__ import annotations

import ctypes
import glob
import os
import platform
import threading
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import ConfigurationError, LibraryNotFoundError

ENV_BACKEND = "ACL_SWIGLU_BACKEND"
ENV_LIB_DIR = "ACL_SWIGLU_LIB_DIR"
ENV_ABI = "ACL_SWIGLU_ABI"
ENV_EMULATOR_DIR = "ACL_SWIGLU_EMULATOR_DIR"   # another build of the emulator's lib64 (development)

BACKENDS = ("auto", "cann", "emulator")
DEFAULT_ROOTS = ("/usr/local/Ascend/cann", "/usr/local/Ascend/ascend-toolkit/latest")
RUNTIME_NAMES = ("libascendcl.so", "libacl_rt.so")
META_NAME = "libnnopbase.so"
OPERATOR_NAMES = ("libopapi_nn.so", "libopapi.so")
CUSTOM_OPERATOR_NAME = "libcust_opapi.so"
OPERATOR_SYMBOL = "aclnnSwigluGroupQuantGradGetWorkspaceSize"
EMULATOR_CANARY = "aclEmuVersion"
EMULATOR_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_emulator")

_FIX = (
    "To use a real Ascend host: `source <CANN root>/set_env.sh` (or set ASCEND_HOME_PATH to the "
    "CANN root). To run on the CPU emulator instead: set ACL_SWIGLU_BACKEND=emulator."
)


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

    @property
    def abi(self) -> int:
        return abi_revision()

    def as_dict(self) -> Dict[str, object]:
        return {
            "backend": self.backend,
            "requested": self.requested,
            "abi": self.abi,
            "root": self.root,
            "runtime": self.runtime,
            "meta": self.meta,
            "operator": self.operator,
            "emulator_version": self.emulator_version,
            "header": self.header,
            "header_abi": self.header_abi,
            "searched": list(self.searched),
        }

    def __str__(self) -> str:
        name = "CPU emulator" if self.backend == "emulator" else "CANN"
        lines = [f"backend: {name} (requested: {self.requested}), ABI revision {self.abi}"]
        if self.emulator_version:
            lines.append(f"  emulator: {self.emulator_version}")
        lines.append(f"  root:     {self.root or '(system loader)'}")
        lines.append(f"  runtime:  {self.runtime}")
        lines.append(f"  meta:     {self.meta}")
        lines.append(f"  operator: {self.operator}")
        if self.header:
            lines.append(f"  header:   {self.header} (declares ABI revision {self.header_abi})")
        return "\n".join(lines)


def requested_backend() -> str:
    value = os.environ.get(ENV_BACKEND, "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ConfigurationError(
            f"{ENV_BACKEND}={os.environ.get(ENV_BACKEND)!r} is not one of {', '.join(BACKENDS)}"
        )
    return value


# os.environ encodes the key on every lookup; its bytes mapping (POSIX CPython) does not.
_ENVIRON_BYTES = getattr(os.environ, "_data", None)
_ABI_KEY = ENV_ABI.encode()


def abi_revision() -> int:
    """The operator ABI revision in use: ACL_SWIGLU_ABI, 2 by default (SPEC section 1)."""
    if _ENVIRON_BYTES is not None and isinstance(_ENVIRON_BYTES, dict):
        raw = _ENVIRON_BYTES.get(_ABI_KEY)
        if raw is None or raw == b"2":
            return 2
        if raw == b"1":
            return 1
    value = os.environ.get(ENV_ABI, "").strip()
    if value in ("", "2"):
        return 2
    if value == "1":
        return 1
    raise ConfigurationError(
        f"{ENV_ABI}={value!r} is not an ABI revision of aclnnSwigluGroupQuantGrad: use 1 (the "
        "seed document: aclIntArray groupIndex, clamp 0 = off) or 2 (default: INT64 tensor "
        "groupIndex, clamp -1.0 = off)"
    )


# ---- where to look ----


def _root_lib_dirs(root: str) -> List[str]:
    arch = platform.machine() or "x86_64"
    return [os.path.join(root, "lib64"), os.path.join(root, f"{arch}-linux", "lib64")]


def cann_roots(environ=os.environ) -> List[Tuple[str, List[str]]]:
    """The CANN roots to try, in order, each with its library directories.

    A root is configured by ACL_SWIGLU_LIB_DIR (a lib directory or a root), ASCEND_HOME_PATH,
    ASCEND_TOOLKIT_HOME, or is a default root that exists.
    """
    roots: List[Tuple[str, List[str]]] = []
    override = environ.get(ENV_LIB_DIR)
    if override:
        roots.append((override, [override] + _root_lib_dirs(override)))
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
        root = environ.get(var)
        if root:
            roots.append((root, _root_lib_dirs(root)))
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


def custom_operator_dirs(environ=os.environ) -> List[str]:
    """Directories that may hold a custom-built libcust_opapi.so, in search order."""
    dirs: List[str] = []
    for entry in filter(None, environ.get("ASCEND_CUSTOM_OPP_PATH", "").split(os.pathsep)):
        dirs.append(os.path.join(entry, "op_api", "lib"))
        dirs.extend(sorted(glob.glob(os.path.join(entry, "*", "op_api", "lib"))))
    opp = environ.get("ASCEND_OPP_PATH")
    if opp:
        dirs.extend(sorted(glob.glob(os.path.join(opp, "vendors", "*", "op_api", "lib"))))
    return dirs


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
    return fn().decode()


def _load_root(root: str, dirs: List[str], requested: str, searched: List[str],
               custom_operators: bool = True) -> Libraries:
    """Loads runtime, meta and operator libraries, all from one root (plus custom operators)."""
    runtime_path = _first_existing(RUNTIME_NAMES, dirs, searched)
    meta_path = _first_existing((META_NAME,), dirs, searched)
    missing = [n for n, p in (("/".join(RUNTIME_NAMES), runtime_path), (META_NAME, meta_path)) if p is None]
    if missing:
        raise LibraryNotFoundError(
            f"CANN libraries not found under {root}: no {' and no '.join(missing)} in any of:\n  "
            + "\n  ".join(dirs) + f"\n{_FIX}"
        )
    for what, path in (("runtime", runtime_path), ("meta API", meta_path)):
        try:
            library = _open(path)
        except OSError as exc:
            raise LibraryNotFoundError(f"cannot load the CANN {what} library {path}: {exc}\n{_FIX}") from exc
        if what == "runtime":
            runtime = library
        else:
            meta = library

    candidates = [os.path.join(d, CUSTOM_OPERATOR_NAME) for d in custom_operator_dirs()] if custom_operators else []
    candidates += [os.path.join(d, name) for name in OPERATOR_NAMES for d in dirs]
    checked: List[str] = []
    operator = operator_path = None
    for path in candidates:
        searched.append(path)
        if not os.path.isfile(path):
            checked.append(f"{path} (absent)")
            continue
        try:
            lib = _open(path)
        except OSError as exc:
            checked.append(f"{path} (cannot load: {exc})")
            continue
        if hasattr(lib, OPERATOR_SYMBOL):
            operator, operator_path = lib, path
            break
        checked.append(f"{path} (does not export {OPERATOR_SYMBOL})")
    if operator is None:
        raise LibraryNotFoundError(
            f"the CANN install at {root} does not provide {OPERATOR_SYMBOL}. "
            "aclnnSwigluGroupQuantGrad exists only for Ascend 950PR/950DT, in a CANN (or a custom "
            "operator package, ASCEND_CUSTOM_OPP_PATH) that ships it.\nChecked:\n  "
            + "\n  ".join(checked) + f"\n{_FIX}"
        )
    version = _emulator_version(runtime)
    header = None if version else find_operator_header(root, operator_path)
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
    )
    _warn_abi_mismatch(info)
    return Libraries(runtime, meta, operator, info)


def _warn_abi_mismatch(info: BackendInfo) -> None:
    """A CANN whose header declares another revision than ACL_SWIGLU_ABI would be called wrongly."""
    try:
        chosen = abi_revision()
    except ConfigurationError:
        return
    if info.header_abi is not None and info.header_abi != chosen:
        warnings.warn(
            f"acl_swiglu: {info.header} declares ABI revision {info.header_abi} but ACL_SWIGLU_ABI selects "
            f"{chosen}; set ACL_SWIGLU_ABI={info.header_abi} to call this CANN correctly.",
            RuntimeWarning,
            stacklevel=4,
        )


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
            return os.path.realpath(info.dli_fname.decode())
    except (AttributeError, OSError):
        pass
    return fallback


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
            info = BackendInfo("emulator" if version else "cann", requested, None, *paths, paths, version)
            return Libraries(runtime, meta, lib, info)
    raise LibraryNotFoundError(
        f"the system loader finds the CANN runtime but no library exporting {OPERATOR_SYMBOL}; "
        f"aclnnSwigluGroupQuantGrad needs Ascend 950PR/950DT and a CANN that ships it.\n{_FIX}"
    )


def _load_emulator(requested: str) -> Libraries:
    lib_dir = os.environ.get(ENV_EMULATOR_DIR) or os.path.join(EMULATOR_ROOT, "lib64")
    if not os.path.isfile(os.path.join(lib_dir, "libascendcl.so")):
        if os.environ.get(ENV_EMULATOR_DIR):
            raise LibraryNotFoundError(f"{ENV_EMULATOR_DIR}={lib_dir} holds no libascendcl.so")
        raise LibraryNotFoundError(
            f"the bundled emulator is missing from {lib_dir}: the package was not built with its "
            "native part (install it with `pip install .`, which compiles it with CMake)"
        )
    root = EMULATOR_ROOT if lib_dir == os.path.join(EMULATOR_ROOT, "lib64") else os.path.dirname(lib_dir)
    return _load_root(root, [lib_dir], requested, [], custom_operators=False)


def load(requested: Optional[str] = None) -> Libraries:
    """Loads the libraries for the requested backend (see ACL_SWIGLU_BACKEND)."""
    requested = requested or requested_backend()
    if requested == "emulator":
        return _load_emulator(requested)
    roots = cann_roots()
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


def libraries() -> Libraries:
    """The loaded libraries, loading them on first use."""
    global _loaded
    libs = _loaded
    if libs is None:
        with _lock:
            if _loaded is None:
                _loaded = load()
            libs = _loaded
    return libs


def loaded() -> Optional[Libraries]:
    """The libraries if they were loaded already, else None (loads nothing)."""
    return _loaded


def backend_info() -> BackendInfo:
    """Which backend runs the operator and the path of every library (loads them if needed)."""
    return libraries().info
