"""Finding and loading the CANN libraries, or the bundled emulator (docs/loading.md).

Nothing is loaded at import time. ``libraries()`` loads the runtime and meta libraries once,
thread-safely; ``operator_library(symbol)`` finds, loads and keeps the library that exports one
operator's symbol; ``backend_info()`` reports the backend chosen, every path used and every file
checked.

Every file that decides what is loaded or how it is called (the libraries, each of their
dependencies inside the install, the operator header, the version files) is checked before it
is used, and used through the descriptor that was checked (acl_swiglu/_trust.py).
``ACL_SWIGLU_TRUST_LIBS=1`` accepts what fails the check, with a warning naming it. Search
variables must hold absolute paths: the current directory is never searched.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import glob
import json
import os
import platform
import stat
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union, cast

from . import _releases
from ._elf import ElfError, SharedObject
from ._trust import ENV_TRUST, Gate, TrustEntry, TrustReport, UntrustedLibraryError, link_problem, path_problem
from .errors import ConfigurationError, LibraryNotFoundError, warn_at_caller

__all__ = [
    "BackendInfo", "Libraries", "OperatorLibrary", "OperatorNotFoundError", "TrustEntry", "TrustReport",
    "TrustedText", "UntrustedLibraryError", "abi_revision", "backend_info", "call_revision", "libraries", "load",
    "loaded", "operator_header", "operator_library", "package_native_file", "setting_text", "settings_named",
    "link_problem", "path_problem",
]

ENV_BACKEND = "ACL_SWIGLU_BACKEND"
ENV_LIB_DIR = "ACL_SWIGLU_LIB_DIR"
ENV_ABI = "ACL_SWIGLU_ABI"
ENV_EMULATOR_DIR = "ACL_SWIGLU_EMULATOR_DIR"   # another build of the emulator's lib64 (development)
ENV_EMULATOR_ABI = "ACL_EMU_ABI"                # the emulator's own revision (it reads the same rules)
ROOT_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
HOME_VARIABLE = "ASCEND_HOME_PATH"              # the root aclsysGetCANNVersion reads its answer from
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
EMULATOR_CANARY = "aclEmuVersion"
VERSION_API = "aclsysGetCANNVersion"
ACL_PKG_NAME_CANN = 0
EMULATOR_RUNTIME = "_emulator/lib64/libascendcl.so"   # inside the package
DISTRIBUTION = "acl-swiglu"
_LOAD_MODE = os.RTLD_NOW | os.RTLD_GLOBAL   # the operator libraries resolve runtime and meta symbols from these

# ---- compatibility defaults: the backward operator, aclnnSwigluGroupQuantGrad ----
# Callers that predate operator_library() (Libraries.operator, BackendInfo.operator, header,
# abi_declared, abi_revision(), call_revision()) mean this operator. Its module will own its
# revision parse; until then it lives here, and nowhere else in this file names an operator.
OPERATOR_SYMBOL = "aclnnSwigluGroupQuantGradGetWorkspaceSize"
HEADER_NAME = "aclnn_swiglu_group_quant_grad.h"
DEFAULT_ABI = 2
_REVISION_TEXT = ("is not an ABI revision of aclnnSwigluGroupQuantGrad: use 1 (the first published form of the "
                  "operator: aclIntArray groupIndex, clamp 0 = off) or 2 (every CANN release: INT64 tensor "
                  "groupIndex, clamp -1.0 = off); blanks around the value are ignored and an empty value counts "
                  "as unset")
# ---- end of the compatibility defaults ----


class OperatorNotFoundError(LibraryNotFoundError):
    """No library of the install in use exports an operator's symbol."""


# ---- what the user set, and how messages name it ----

_option_names: Dict[str, str] = {}
_option_lock = threading.Lock()


@contextlib.contextmanager
def settings_named(options: Mapping[str, str]) -> Iterator[None]:
    """Within it, messages about each variable of `options` name the command-line option that set
    it: ``{"ACL_SWIGLU_BACKEND": "--backend"}`` makes them say ``--backend cann`` instead of
    ``ACL_SWIGLU_BACKEND=cann``. Pass only the options the user gave."""
    with _option_lock:
        saved = dict(_option_names)
        _option_names.update(options)
    try:
        yield
    finally:
        with _option_lock:
            _option_names.clear()
            _option_names.update(saved)


def setting_text(variable: str, value: str) -> str:
    """How a message names `variable` set to `value`: ``ACL_SWIGLU_BACKEND=cann``, or the option
    that set it (``--backend cann``) inside settings_named()."""
    option = _option_names.get(variable)
    return f"{option} {value}" if option else f"{variable}={value}"


def _suggest(variable: str, value: str) -> str:
    """'set ACL_SWIGLU_BACKEND=emulator', or 'use --backend emulator' inside settings_named()."""
    return f"{'use' if variable in _option_names else 'set'} {setting_text(variable, value)}"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _unset_text(variable: str) -> str:
    option = _option_names.get(variable)
    return f"leave out {option}" if option else f"unset {variable}"


def _fix() -> str:
    return ("To use a real Ascend host: `source <CANN root>/set_env.sh` (or set ASCEND_HOME_PATH to the CANN "
            f"root). To run on the CPU emulator instead: {_suggest(ENV_BACKEND, 'emulator')}.")


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
    raise ConfigurationError(f"{setting_text(variable, repr(value))} {_REVISION_TEXT}")


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
            f"{setting_text(ENV_BACKEND, repr(os.environ.get(ENV_BACKEND)))} is not one of {', '.join(BACKENDS)}"
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


# ---- warnings ----

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


_pending_warnings: List[str] = []


def _flush_warnings() -> None:
    """Gives the warnings collected while loading (under the lock), at the caller's line: what
    ACL_SWIGLU_TRUST_LIBS=1 accepted first, then the others."""
    libs = _loaded
    accepted = libs._source.gate.take_warning() if libs is not None else None
    if accepted:
        warn_at_caller(accepted)
    while _pending_warnings:
        warn_at_caller(_pending_warnings.pop(0))


# ---- the package's own compiled files ----


def _package_dirs() -> List[str]:
    """Where the package's files are: its import path (an editable install adds the directory the
    compiled files were installed to), then this file's directory."""
    package = sys.modules.get(__package__ or "acl_swiglu")
    dirs = [os.path.abspath(d) for d in (getattr(package, "__path__", None) or [])]
    if _PACKAGE_DIR not in dirs:
        dirs.append(_PACKAGE_DIR)
    return dirs


def _editable_distribution_dir() -> Optional[str]:
    """The package directory of an editable install of this very source tree, if it is one."""
    try:
        from importlib import metadata

        distribution = metadata.distribution(DISTRIBUTION)
        record = json.loads(distribution.read_text("direct_url.json") or "{}")
    except Exception:   # (no such distribution, or a record this cannot read: not an editable install)
        return None
    url = str(record.get("url", ""))
    if not record.get("dir_info", {}).get("editable") or not url.startswith("file://"):
        return None
    if os.path.realpath(url[len("file://"):]) != os.path.realpath(os.path.dirname(_PACKAGE_DIR)):
        return None
    return str(distribution.locate_file("acl_swiglu"))


def package_native_file(relative_path: str) -> Optional[str]:
    """The package's installed file at `relative_path` (``"_native/libaclswiglu_hotpath.so"``,
    ``"_emulator/lib64/libascendcl.so"``), wherever the install put it: beside the Python files
    (``pip install .``), or in site-packages while the Python files load from the source tree
    (``pip install -e .``). None when it is not installed."""
    parts = relative_path.split("/")
    if os.path.isabs(relative_path) or ".." in parts or not all(parts):
        raise ValueError(f"{relative_path!r} is not a path inside the package")
    for directory in _package_dirs():
        candidate = os.path.join(directory, *parts)
        if os.path.isfile(candidate):
            return candidate
    editable = _editable_distribution_dir()
    if editable:
        candidate = os.path.join(editable, *parts)
        if os.path.isfile(candidate):
            return candidate
    return None


def _emulator_root() -> str:
    found = package_native_file(EMULATOR_RUNTIME)
    return os.path.dirname(os.path.dirname(found)) if found else os.path.join(_PACKAGE_DIR, "_emulator")


EMULATOR_ROOT = _emulator_root()


def _missing_native_hint() -> str:
    """Why the package has no compiled files, and what to do: the usual cause is running from a
    source checkout, which Python imports ahead of the installed copy."""
    checkout = os.path.dirname(_PACKAGE_DIR)
    is_checkout = os.path.isfile(os.path.join(checkout, "pyproject.toml")) and os.path.isdir(
        os.path.join(checkout, "native"))
    installed: Optional[str] = None
    try:
        from importlib import metadata

        init = metadata.distribution(DISTRIBUTION).locate_file("acl_swiglu/__init__.py")
        if os.path.isfile(str(init)):
            installed = os.path.dirname(os.path.abspath(str(init)))
    except Exception:   # (not installed)
        installed = None
    if installed and os.path.realpath(installed) != os.path.realpath(_PACKAGE_DIR):
        return (f"acl_swiglu was imported from {_PACKAGE_DIR}, a source checkout, and not from the installed "
                f"copy in {installed}: the current directory (or PYTHONPATH) puts the checkout first, and a "
                "checkout has no compiled emulator. Run from another directory, or install the checkout in "
                "editable mode (`pip install -e .`), which finds its compiled files from the source tree.")
    if is_checkout:
        return (f"acl_swiglu was imported from the source checkout {_PACKAGE_DIR}, which is not installed: "
                "install it with `pip install .` (or `pip install -e .` to work on it), which compiles the "
                "emulator, and run from another directory")
    return ("the package was installed without its native part (install it with `pip install .`, which "
            "compiles it with CMake)")


# ---- the ABI revision (compatibility: the backward operator's) ----

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
    if value is None and _install_revision is not None:
        return _install_revision   # (_revision_with's common case)
    return _revision_with(value)


def _revision_with(value: Optional[int]) -> int:
    """The revision in use, given ACL_SWIGLU_ABI's (None: unset)."""
    if value is None:
        revision = _install_revision
        return revision if revision is not None else _declared_revision()
    declared = _declaration
    if declared is not None and declared.revision is not None and value != declared.revision \
            and value not in _override_warned:
        _override_warned.add(value)
        _warn_override(declared.revision, declared.by or "the install", value)
    return value


def _warn_override(declared: int, by: str, chosen: int) -> None:
    warn_at_caller(
        f"acl_swiglu: {setting_text(ENV_ABI, str(chosen))} overrides ABI revision {declared} declared by "
        f"{by}; calls use revision {chosen}. {_capital(_unset_text(ENV_ABI))} to follow the install.")


def header_abi_text(text: str) -> Optional[int]:
    """The ABI revision an operator header's text declares: 1 when groupIndex is an aclIntArray,
    2 when it is an aclTensor; None when the header does not say."""
    start = text.find(OPERATOR_SYMBOL + "(")
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


def header_abi(path: str) -> Optional[int]:
    """header_abi_text of the regular file at `path` (None when it is absent or not a regular file)."""
    text = _releases.read_text_file(path)
    return header_abi_text(text) if text is not None else None


def header_candidates(header_name: str, root: Optional[str], library_path: Optional[str]) -> List[Tuple[str, str]]:
    """(top, path) pairs where an operator header may be, in search order: the CANN root's include
    directories, then beside a custom operator library (``.../op_api/lib/x.so`` ->
    ``.../op_api/include``); `top` is where the trust check of that path starts."""
    candidates: List[Tuple[str, str]] = []
    if root:
        arch = platform.machine() or "x86_64"
        candidates += [(root, os.path.join(root, "include", "aclnnop", header_name)),
                       (root, os.path.join(root, f"{arch}-linux", "include", "aclnnop", header_name)),
                       (root, os.path.join(root, "include", "aclnnop", "level2", header_name))]
    if library_path and os.path.basename(os.path.dirname(library_path)) == "lib":
        op_dir = os.path.dirname(os.path.dirname(library_path))   # .../op_api/lib -> .../op_api
        candidates += [(op_dir, os.path.join(op_dir, "include", header_name)),
                       (op_dir, os.path.join(op_dir, "include", "aclnnop", header_name))]
    return candidates


def find_operator_header(root: Optional[str], operator_path: str, header_name: str = HEADER_NAME) -> Optional[str]:
    """The first regular file among header_candidates (no trust check: see operator_header)."""
    return next((path for _, path in header_candidates(header_name, root, operator_path)
                 if os.path.isfile(path)), None)


# ---- what the loader reports ----


@dataclass(frozen=True)
class TrustedText:
    """A checked regular file's path and the text read through the descriptor that was checked."""

    path: str
    text: str


@dataclass(frozen=True)
class OperatorLibrary:
    """The library that exports an operator's symbol, where it was found, and the operator's
    header when one was asked for and found."""

    library: ctypes.CDLL
    path: str
    header: Optional[TrustedText] = None


def _versions() -> Dict[str, Optional[str]]:
    """What a bug report needs besides the backend: this package, Python, NumPy, and torch if it is
    already imported (it is never imported for this)."""
    package = sys.modules.get(__package__ or "acl_swiglu")
    version = getattr(package, "__version__", None)
    numpy = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    return {"package_version": str(version) if version else None,
            "python_version": platform.python_version(),
            "numpy_version": str(getattr(numpy, "__version__", "")) or None,
            "torch_version": str(getattr(torch, "__version__", "")) or None if torch is not None else None}


@dataclass(frozen=True)
class BackendInfo:
    """Which libraries were loaded and why."""

    backend: str                  # "cann" or "emulator"
    requested: str                # the ACL_SWIGLU_BACKEND value that chose it
    root: Optional[str]           # the CANN-like root, when there is one
    runtime: str                  # path of libascendcl.so / libacl_rt.so
    meta: str                     # path of libnnopbase.so
    operator: Optional[str]       # the backward operator's library (compatibility); None when not found
    searched: Tuple[str, ...] = field(default_factory=tuple)
    emulator_version: Optional[str] = None
    header: Optional[str] = None          # the backward operator's header found, if any
    header_abi: Optional[int] = None      # the ABI revision that header declares
    abi_declared: Optional[int] = None    # the revision the install declares (header, or ACL_EMU_ABI)
    abi_declared_by: Optional[str] = None  # the header path, or "ACL_EMU_ABI"
    cann_version: Optional[str] = None    # the CANN release the install reports
    cann_version_file: Optional[str] = None   # the file it was read from, when it came from a file
    trust: Optional[TrustReport] = None
    operators: Mapping[str, str] = field(default_factory=dict)          # symbol -> library path, found so far
    operators_missing: Mapping[str, str] = field(default_factory=dict)  # symbol -> why it was not found
    cann_version_source: Optional[str] = None   # "aclsysGetCANNVersion", a file path, or None
    cann_version_note: Optional[str] = None     # what to keep in mind about that source
    package_version: Optional[str] = None
    python_version: Optional[str] = None
    numpy_version: Optional[str] = None
    torch_version: Optional[str] = None       # None when torch is not imported

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
            "operators": dict(self.operators),
            "operators_missing": dict(self.operators_missing),
            "emulator_version": self.emulator_version,
            "cann_version": self.cann_version,
            "cann_version_file": self.cann_version_file,
            "cann_version_source": self.cann_version_source,
            "cann_version_note": self.cann_version_note,
            "header": self.header,
            "header_abi": self.header_abi,
            "trust": self.trust.as_dict() if self.trust else None,
            "searched": list(self.searched),
            "package_version": self.package_version,
            "python_version": self.python_version,
            "numpy_version": self.numpy_version,
            "torch_version": self.torch_version,
        }

    def __str__(self) -> str:
        name = "CPU emulator" if self.backend == "emulator" else "CANN"
        lines = [f"backend: {name} (requested: {self.requested}), ABI revision {self.abi} ({self.abi_source})"]
        if self.emulator_version:
            lines.append(f"  emulator: {self.emulator_version}")
        if self.cann_version or self.backend != "emulator":
            where = f" (from {self.cann_version_source})" if self.cann_version_source else ""
            lines.append(f"  version:  {self.cann_version or 'unknown'}{where}")
            if self.cann_version_note:
                lines.append(f"            {self.cann_version_note}")
        lines.append(f"  root:     {self.root or '(system loader)'}")
        lines.append(f"  runtime:  {self.runtime}")
        lines.append(f"  meta:     {self.meta}")
        lines.append(f"  operator: {self.operator or '(not found)'}")
        for symbol, path in self.operators.items():
            lines.append(f"    {symbol}: {path}")
        for symbol, why in self.operators_missing.items():
            lines.append(f"    {symbol}: not found ({why.splitlines()[0]})")
        if self.header:
            lines.append(f"  header:   {self.header} (declares ABI revision {self.header_abi})")
        if self.trust is not None:
            lines.append(f"  trust:    {self.trust}")
        versions = ", ".join(f"{label} {value}" for label, value in (
            ("acl-swiglu", self.package_version), ("Python", self.python_version),
            ("NumPy", self.numpy_version), ("torch", self.torch_version)) if value)
        lines.append(f"  versions: {versions}")
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


def _first_existing(names: Sequence[str], dirs: Sequence[str], searched: List[str]) -> Optional[str]:
    for name in names:
        for d in dirs:
            path = os.path.join(d, name)
            searched.append(path)
            if os.path.lexists(path):
                return path
    return None


# ---- the CANN version ----


class _PackageVersion(ctypes.Structure):
    """aclsysGetCANNVersion's out-parameter (acl.h: aclCANNPackageVersion)."""

    _fields_ = [("version", ctypes.c_char * 128), ("major", ctypes.c_char * 64), ("minor", ctypes.c_char * 64),
                ("release", ctypes.c_char * 64), ("patch", ctypes.c_char * 64), ("reserved", ctypes.c_char * 128)]


def release_from_api(text: str) -> str:
    """A release as this package spells it, from aclsysGetCANNVersion's answer, which drops the
    dash and the dot of a pre-release ('9.2.0-beta.1' is answered as '9.2.0.beta1')."""
    parts = text.split(".")
    if len(parts) == 4 and all(p.isdigit() for p in parts[:3]):
        tail = parts[3]
        for tag in ("alpha", "beta", "rc"):
            if tail.lower().startswith(tag) and tail[len(tag):].isdigit():
                return f"{'.'.join(parts[:3])}-{tail[:len(tag)]}.{int(tail[len(tag):])}"
    return text


_OPS_NN_NOTE = ("read from ops-nn's own version file: a self-built ops-nn labels itself 9.1.0 whatever source "
                "it was built from, so 9.1.0 here may stand for a later source (9.2.0-beta or master)")


@dataclass(frozen=True)
class _Version:
    value: Optional[str] = None
    source: Optional[str] = None   # "aclsysGetCANNVersion" or the file
    file: Optional[str] = None
    note: Optional[str] = None


def _asked_version(runtime: ctypes.CDLL, root: Optional[str], gate: Gate, emulator: bool) -> Optional[str]:
    """The runtime's own answer to aclsysGetCANNVersion(ACL_PKG_NAME_CANN), where it has the
    function and the answer is about the install in use; None otherwise. The function needs no
    aclInit. Real runtimes read it from <ASCEND_HOME_PATH>/share/info/runtime/version.info, so
    that file is checked (and must be a regular file, or the call would block on it) first, and
    an ASCEND_HOME_PATH naming another root than the one in use means the answer is not asked."""
    if not hasattr(runtime, VERSION_API):
        return None
    if not emulator:
        home = _setting(HOME_VARIABLE)
        if not home or not os.path.isabs(home) or root is None:
            return None
        if os.path.realpath(home) != os.path.realpath(root):
            return None
        answered_from = os.path.join(root, "share", "info", "runtime", "version.info")
        if not os.path.lexists(answered_from):
            gate.note_absent(answered_from, root, "the file aclsysGetCANNVersion reads the version from")
            return None
        opened = gate.open_file(answered_from, root, "the file aclsysGetCANNVersion reads the version from",
                                verb="have the runtime read")
        if opened is None:
            return None
        os.close(opened.fd)
    function = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(_PackageVersion))(
        (VERSION_API, runtime))
    answer = _PackageVersion()
    if function(ACL_PKG_NAME_CANN, ctypes.byref(answer)) != 0:
        _drop_error_text(runtime)
        return None
    text = answer.version.decode("utf-8", "replace").strip(ASCII_BLANKS)
    return release_from_api(text) if text else None


def _drop_error_text(runtime: ctypes.CDLL) -> None:
    """A failed question leaves its text for aclGetRecentErrMsg: read it so that it cannot be
    taken for the next call's."""
    if hasattr(runtime, "aclGetRecentErrMsg"):
        getter = ctypes.CFUNCTYPE(ctypes.c_char_p)(("aclGetRecentErrMsg", runtime))
        getter()


def _install_version(runtime: ctypes.CDLL, root: Optional[str], gate: Gate, bundled: bool,
                     emulator: bool) -> _Version:
    """Where the CANN version comes from: the runtime's answer, else the install's version files
    (each one read checked, through its descriptor; never for the bundled emulator)."""
    asked = _asked_version(runtime, root, gate, emulator)
    if asked:
        return _Version(asked, VERSION_API)
    if bundled or root is None:
        return _Version()

    def read(path: str) -> Optional[str]:
        if not os.path.lexists(path):
            gate.note_absent(path, root, "a version file")
            return None
        found = gate.read_text(path, root, "a version file", limit=1 << 16)
        return found[0] if found else None

    value, path = _releases.read_install_version(root, read=read)
    if value is None or path is None:
        return _Version()
    note = _OPS_NN_NOTE if path.endswith(os.path.join("share", "info", "ops_nn", "version.info")) else None
    return _Version(value, path, path, note)


# ---- loading ----


@dataclass
class _Source:
    """Where one backend's libraries come from, and what was learnt on the way."""

    kind: str                      # "root" or "system"
    requested: str
    root: Optional[str]
    dirs: List[str]
    bundled: bool                  # the package's own emulator (its headers are generic)
    gate: Gate
    searched: List[str]
    version: _Version = field(default_factory=_Version)
    operators: Dict[str, OperatorLibrary] = field(default_factory=dict)
    missing: Dict[str, OperatorNotFoundError] = field(default_factory=dict)
    headers: Dict[Tuple[str, str], Optional[TrustedText]] = field(default_factory=dict)


class Libraries:
    """The runtime and meta libraries, how they were found, and the operator libraries found since."""

    def __init__(self, runtime: ctypes.CDLL, meta: ctypes.CDLL, base: BackendInfo, source: _Source) -> None:
        self.runtime = runtime
        self.meta = meta
        self._base = base
        self._source = source

    @property
    def info(self) -> BackendInfo:
        """What is loaded now (the operator libraries found so far included)."""
        with _lock:
            return _current_info(self)

    @property
    def operator(self) -> ctypes.CDLL:
        """The backward operator's library (compatibility: operator_library(OPERATOR_SYMBOL))."""
        return operator_library(OPERATOR_SYMBOL).library

    @property
    def is_emulator(self) -> bool:
        """True when these are the bundled CPU emulator's libraries."""
        return self._base.backend == "emulator"


def _emulator_version(runtime: ctypes.CDLL) -> Optional[str]:
    if not hasattr(runtime, EMULATOR_CANARY):
        return None
    fn = getattr(runtime, EMULATOR_CANARY)
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return str(fn().decode())


def _load_checked(gate: Gate, path: str, top: str, tops: Sequence[str], role: str) -> ctypes.CDLL:
    """Checks, opens and loads one library file (its in-install dependencies first)."""
    opened = gate.open_file(path, top, role)
    if opened is None:
        raise LibraryNotFoundError(f"{path} ({role}) is not a regular file, so it cannot be loaded\n{_fix()}")
    try:
        return gate.load(opened, tops, role, _LOAD_MODE, dict(os.environ))
    except OSError as exc:
        if isinstance(exc, LibraryNotFoundError):
            raise
        raise LibraryNotFoundError(f"cannot load {role} {path}: {exc}\n{_fix()}") from exc


def _load_root(root: str, dirs: List[str], requested: str, searched: List[str], bundled: bool = False) -> Libraries:
    """Loads the runtime and meta libraries of one root; operators come from it later."""
    gate = Gate(enforced=not _flag(ENV_TRUST))
    runtime_path = _first_existing(RUNTIME_NAMES, dirs, searched)
    meta_path = _first_existing((META_NAME,), dirs, searched)
    missing = [n for n, p in (("/".join(RUNTIME_NAMES), runtime_path), (META_NAME, meta_path)) if p is None]
    if missing or runtime_path is None or meta_path is None:
        raise LibraryNotFoundError(
            f"CANN libraries not found under {root}: no {' and no '.join(missing)} in any of:\n  "
            + "\n  ".join(dirs) + f"\n{_fix()}"
        )
    runtime = _load_checked(gate, runtime_path, root, [root], "the CANN runtime library")
    meta = _load_checked(gate, meta_path, root, [root], "the CANN meta API library")
    emulator = _emulator_version(runtime)
    source = _Source("root", requested, root, dirs, bundled, gate, searched)
    source.version = _install_version(runtime, root, gate, bundled, emulator is not None)
    base = BackendInfo(
        backend="emulator" if emulator else "cann", requested=requested, root=root, runtime=runtime_path,
        meta=meta_path, operator=None, emulator_version=emulator, cann_version=source.version.value,
        cann_version_file=source.version.file, cann_version_source=source.version.source,
        cann_version_note=source.version.note)
    _releases.record_install(source.version.value)
    return Libraries(runtime, meta, base, source)


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
        + "\n  ".join(searched) + f"\n{_fix()}"
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
    runtime: Optional[ctypes.CDLL] = None
    runtime_name = RUNTIME_NAMES[0]
    for runtime_name in RUNTIME_NAMES:
        try:
            runtime = ctypes.CDLL(runtime_name, mode=_LOAD_MODE)
            break
        except OSError:
            continue
    if runtime is None:
        return None
    try:
        meta = ctypes.CDLL(META_NAME, mode=_LOAD_MODE)
    except OSError as exc:
        raise LibraryNotFoundError(
            f"the system loader finds {runtime_name} but not {META_NAME}: {exc}\n{_fix()}") from exc
    gate = Gate(enforced=False, ran=False, note=_SYSTEM_LOADER_NOTE)
    emulator = _emulator_version(runtime)
    source = _Source("system", requested, None, [], False, gate, [])
    source.version = _install_version(runtime, None, gate, False, emulator is not None)
    paths = (_path_of(runtime, "aclInit", runtime_name), _path_of(meta, "aclCreateTensor", META_NAME))
    base = BackendInfo("emulator" if emulator else "cann", requested, None, paths[0], paths[1], None, (),
                       emulator, cann_version=source.version.value, cann_version_file=source.version.file,
                       cann_version_source=source.version.source, cann_version_note=source.version.note)
    _releases.record_install(source.version.value)
    return Libraries(runtime, meta, base, source)


def _load_emulator(requested: str) -> Libraries:
    chosen = _setting(ENV_EMULATOR_DIR)
    if chosen:
        lib_dir = _absolute(ENV_EMULATOR_DIR, chosen)
        if not os.path.isfile(os.path.join(lib_dir, "libascendcl.so")):
            raise LibraryNotFoundError(f"{ENV_EMULATOR_DIR}={lib_dir} holds no libascendcl.so")
        return _load_root(os.path.dirname(lib_dir), [lib_dir], requested, [], bundled=True)
    found = package_native_file(EMULATOR_RUNTIME)
    if found is None:
        raise LibraryNotFoundError(
            f"the bundled emulator is missing: no {EMULATOR_RUNTIME} in {' or '.join(_package_dirs())}. "
            + _missing_native_hint()
        )
    lib_dir = os.path.dirname(found)
    return _load_root(os.path.dirname(lib_dir), [lib_dir], requested, [], bundled=True)


def load(requested: Optional[str] = None) -> Libraries:
    """Loads the runtime and meta libraries for the requested backend (see ACL_SWIGLU_BACKEND)."""
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
            f"{setting_text(ENV_BACKEND, 'cann')} but no CANN was found: {ENV_LIB_DIR}, ASCEND_HOME_PATH and "
            f"ASCEND_TOOLKIT_HOME are unset, none of {', '.join(DEFAULT_ROOTS)} exists, and the "
            f"system loader has no libascendcl.so.\n{_fix()}"
        )
    libs = _load_emulator(requested)
    _pending_warnings.append(
        "acl_swiglu: no CANN installation found; running on the bundled CPU emulator "
        f"({libs._base.root}). {_capital(_suggest(ENV_BACKEND, 'emulator'))} to silence this, or source "
        "set_env.sh to use an Ascend device."
    )
    return libs


_lock = threading.RLock()
_loaded: Optional[Libraries] = None
_install_revision: Optional[int] = None   # the backward's revision calls use without ACL_SWIGLU_ABI, once known
_info_cache: Tuple[Optional[Tuple[int, ...]], Optional[BackendInfo]] = (None, None)


def _reset_after_fork() -> None:
    global _lock
    _lock = threading.RLock()   # another thread may have held it at the fork
    if _loaded is not None:
        _loaded._source.gate.reset_lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _libraries_locked() -> Libraries:
    global _loaded
    if _loaded is None:
        _loaded = load()
    return _loaded


def libraries() -> Libraries:
    """The loaded runtime and meta libraries, loading them on first use."""
    libs = _loaded
    if libs is None:
        try:
            with _lock:
                libs = _libraries_locked()
        finally:
            _flush_warnings()
    return libs


def loaded() -> Optional[Libraries]:
    """The libraries if they were loaded already, else None (loads nothing)."""
    return _loaded


# ---- operators ----


def _not_found(symbol: str, source: _Source, checked: List[str]) -> OperatorNotFoundError:
    where = f"the CANN install at {source.root}" if source.root else "the system loader's libraries"
    return OperatorNotFoundError(
        f"no library of {where} exports {symbol}. This package's operators exist only for Ascend 950PR/950DT, "
        "in a CANN release (or a custom operator package, ASCEND_CUSTOM_OPP_PATH) that ships them; install one "
        "that does, or check which libraries it provides.\nSearched:\n  " + "\n  ".join(checked) + f"\n{_fix()}"
    )


def _find_in_root(symbol: str, source: _Source) -> OperatorLibrary:
    root = source.root
    assert root is not None
    candidates = [] if source.bundled else [
        (entry, os.path.join(d, CUSTOM_OPERATOR_NAME)) for entry, d in custom_operator_locations()]
    candidates += [(root, os.path.join(d, name)) for name in OPERATOR_NAMES for d in source.dirs]
    checked: List[str] = []
    for top, path in candidates:
        source.searched.append(path)
        if not os.path.lexists(path):
            checked.append(f"{path} (absent)")
            continue
        exports = _exports(path, symbol)
        if isinstance(exports, str):
            checked.append(f"{path} ({exports})")
            continue
        if exports is False:
            checked.append(f"{path} (does not export {symbol})")
            continue
        role = f"the library exporting {symbol}"
        try:
            library = _load_checked(source.gate, path, top, [top, root], role)
        except UntrustedLibraryError:
            raise
        except LibraryNotFoundError as exc:
            checked.append(f"{path} (cannot load: {exc.args[0].splitlines()[0] if exc.args else exc})")
            continue
        if hasattr(library, symbol):
            return OperatorLibrary(library, path)
        checked.append(f"{path} (does not export {symbol})")
    raise _not_found(symbol, source, checked)


def _exports(path: str, symbol: str) -> Union[None, bool, str]:
    """Whether the library file at `path` defines `symbol`, read from its dynamic symbol table
    without loading it (a library that does not is never loaded); None when its tables cannot
    tell (then it is loaded and asked); a reason text when it is no shared object at all."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return "not a regular file"
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot be opened: {exc.strerror}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a regular file"
        return SharedObject(fd, path).defines(symbol)
    except ElfError as exc:
        return f"cannot be read as a shared object: {exc}"
    finally:
        os.close(fd)


def _find_by_name(symbol: str, source: _Source) -> OperatorLibrary:
    checked: List[str] = []
    for name in (CUSTOM_OPERATOR_NAME,) + OPERATOR_NAMES:
        try:
            library = ctypes.CDLL(name, mode=_LOAD_MODE)
        except OSError as exc:
            checked.append(f"{name} (the system loader cannot load it: {exc})")
            continue
        if hasattr(library, symbol):
            return OperatorLibrary(library, _path_of(library, symbol, name))
        checked.append(f"{name} (does not export {symbol})")
    raise _not_found(symbol, source, checked)


def _operator_locked(symbol: str) -> OperatorLibrary:
    source = _libraries_locked()._source
    found = source.operators.get(symbol)
    if found is not None:
        return found
    missing = source.missing.get(symbol)
    if missing is not None:
        raise OperatorNotFoundError(*missing.args)
    try:
        found = _find_in_root(symbol, source) if source.kind == "root" else _find_by_name(symbol, source)
    except OperatorNotFoundError as exc:
        source.missing[symbol] = exc
        raise
    source.operators[symbol] = found
    return found


def _header_locked(header_name: str, symbol: str) -> Optional[TrustedText]:
    source = _libraries_locked()._source
    key = (symbol, header_name)
    if key in source.headers:
        return source.headers[key]
    found: Optional[TrustedText] = None
    if source.kind == "root" and not source.bundled:
        try:
            library_path: Optional[str] = _operator_locked(symbol).path
        except OperatorNotFoundError:
            library_path = None
        role = f"the operator header {header_name}"
        for top, path in header_candidates(header_name, source.root, library_path):
            if not os.path.lexists(path):
                source.gate.note_absent(path, top, role)
                continue
            read = source.gate.read_text(path, top, role)
            if read is not None:
                found = TrustedText(path, read[0])
                break
    source.headers[key] = found
    return found


def operator_library(symbol: str, header_name: Optional[str] = None) -> OperatorLibrary:
    """The library that exports `symbol`, found, checked and loaded once (thread-safely): a custom
    libcust_opapi.so (ASCEND_CUSTOM_OPP_PATH entries, then ASCEND_OPP_PATH vendors) first, then
    libopapi_nn.so, then libopapi.so in the root's library directories (by name through the system
    loader when no root is configured; the bundled emulator's own only). With `header_name`, the
    result also carries that operator header (operator_header). Raises OperatorNotFoundError (a
    LibraryNotFoundError) naming the symbol, what was searched and what to do."""
    try:
        with _lock:
            found = _operator_locked(symbol)
            if header_name is not None:
                found = dataclasses.replace(found, header=_header_locked(header_name, symbol))
            return found
    finally:
        _flush_warnings()


def operator_header(header_name: str, symbol: str) -> Optional[TrustedText]:
    """The operator header `header_name` of the install in use, checked and read through its
    descriptor: in the CANN root's include directories, else beside the custom library that exports
    `symbol`; None when there is none (or for the bundled emulator, whose headers are generic)."""
    try:
        with _lock:
            return _header_locked(header_name, symbol)
    finally:
        _flush_warnings()


# ---- the backward operator's declared revision (compatibility) ----


@dataclass(frozen=True)
class _Declaration:
    revision: Optional[int]
    by: Optional[str]            # the header path, or "ACL_EMU_ABI"
    header: Optional[str]
    header_revision: Optional[int]


_declaration: Optional[_Declaration] = None


def _declare_locked() -> _Declaration:
    """The backward operator's declared revision and where it comes from, worked out once: the
    operator header of a CANN root (beside its library); for the bundled emulator, whose header is
    generic, ACL_EMU_ABI when it is set."""
    global _declaration, _install_revision
    if _declaration is not None:
        return _declaration
    libs = _libraries_locked()
    source = libs._source
    try:
        _operator_locked(OPERATOR_SYMBOL)
    except OperatorNotFoundError:
        pass   # (reported by backend_info(); a call that needs it raises)
    if source.bundled:
        revision = parse_revision(ENV_EMULATOR_ABI, os.environ.get(ENV_EMULATOR_ABI))
        declared = _Declaration(revision, ENV_EMULATOR_ABI if revision is not None else None, None, None)
    else:
        header = _header_locked(HEADER_NAME, OPERATOR_SYMBOL)
        header_revision = header_abi_text(header.text) if header is not None else None
        declared = _Declaration(header_revision, header.path if header_revision is not None and header else None,
                                header.path if header else None, header_revision)
    _declaration = declared
    _install_revision = declared.revision or DEFAULT_ABI
    chosen = parse_revision(ENV_ABI, os.environ.get(ENV_ABI))
    if chosen is not None and declared.revision is not None and declared.revision != chosen:
        _override_warned.add(chosen)
        _pending_warnings.append(
            f"acl_swiglu: {setting_text(ENV_ABI, str(chosen))} overrides ABI revision {declared.revision} "
            f"declared by {declared.by}; calls use revision {chosen}. {_capital(_unset_text(ENV_ABI))} to "
            "follow the install.")
    return declared


def _declared_revision() -> int:
    try:
        with _lock:
            return _declare_locked().revision or DEFAULT_ABI
    finally:
        _flush_warnings()


def _warn_abi_mismatch(info: BackendInfo) -> None:
    """ACL_SWIGLU_ABI set to another revision than the install declares: it wins, and says so."""
    chosen = parse_revision(ENV_ABI, os.environ.get(ENV_ABI))
    if chosen is not None and info.abi_declared is not None and info.abi_declared != chosen:
        _override_warned.add(chosen)
        _warn_override(info.abi_declared, info.abi_declared_by or "the install", chosen)


# ---- the report ----


def _current_info(libs: Libraries) -> BackendInfo:
    """The base report with what has been learnt since: operators, the backward's header, trust."""
    global _info_cache
    source = libs._source
    trust = source.gate.report()
    declared = _declaration
    key = (id(libs), len(source.operators), len(source.missing), len(trust.checked), len(trust.files),
           len(trust.problems), len(source.searched), id(declared), "torch" in sys.modules)
    cached_key, cached = _info_cache
    if cached is not None and cached_key == key:
        return cached
    backward = source.operators.get(OPERATOR_SYMBOL)
    versions: Dict[str, Any] = _versions()
    info = dataclasses.replace(
        libs._base,
        operator=backward.path if backward else None,
        searched=tuple(source.searched),
        header=declared.header if declared else None,
        header_abi=declared.header_revision if declared else None,
        abi_declared=declared.revision if declared else None,
        abi_declared_by=declared.by if declared else None,
        trust=trust,
        operators={s: o.path for s, o in source.operators.items()},
        operators_missing={s: str(e) for s, e in source.missing.items()},
        **versions,
    )
    _info_cache = (key, info)
    return info


def backend_info() -> BackendInfo:
    """Which backend runs the operators and the path of every library (loads them if needed; for
    the callers that predate operator_library, this looks for the backward operator's library too,
    and reports it missing rather than failing when the install lacks it)."""
    try:
        with _lock:
            libs = _libraries_locked()
            _declare_locked()
            return _current_info(libs)
    finally:
        _flush_warnings()

