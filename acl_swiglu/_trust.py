"""Checking every file that decides what is loaded or how it is called, and using exactly the file checked.

The rule (docs/loading.md): a file, and every directory from its root (the CANN root, the custom
operator path entry, or the emulator's directory) down to it, must be owned by root or the current
user and writable by its owner alone (a sticky directory may be writable by all, and group write
through a group nobody else is in counts as the owner's). A symbolic link on the way is checked as
a link (its owner; its directory like any other) and then followed, and the place it leads to is
checked the same way: from the root down when it leads back inside the root, from ``/`` down when
it leads outside. Only regular files are opened.

A file is checked, then opened once (``O_NONBLOCK``, so that nothing can make the open block) and
``fstat`` on the descriptor must show the regular file the check examined; what is loaded or read
is then that descriptor: a library through ``/proc/self/fd/N``, a text file by reading it. A
library's dependencies that resolve inside the install (DT_NEEDED through DT_RPATH,
LD_LIBRARY_PATH and DT_RUNPATH, ``$ORIGIN`` expanded, read from the file before anything is
loaded) are checked the same way and loaded first, in dependency order, each through its own
descriptor, so that the system loader finds them already loaded by their DT_SONAME. The
descriptors stay open for the life of the process.
"""

from __future__ import annotations

import ctypes
import grp
import os
import pwd
import stat
import threading
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from ._elf import ElfError, SharedObject
from .errors import LibraryNotFoundError

__all__ = ["ENV_TRUST", "Gate", "Opened", "TrustEntry", "TrustReport", "UntrustedLibraryError", "link_problem",
           "path_problem"]

ENV_TRUST = "ACL_SWIGLU_TRUST_LIBS"   # 1: use files that fail the check, with a warning
_MAX_LINKS = 40                       # as the kernel's limit on symbolic links in one lookup
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_DESCRIPTOR_DIR = "/proc/self/fd"


class UntrustedLibraryError(LibraryNotFoundError):
    """A library, or a file that decides what is loaded or how it is called (an operator header,
    a version file), could be replaced by another user, or is not a regular file, so it is not used."""


# ---- the rule ----


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "no such user"


def _owner_text(uid: int) -> str:
    return "root" if uid == 0 else f"you (uid {uid})"


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


def _foreign_owner(path: str, what: str, info: os.stat_result) -> Optional[str]:
    me = os.geteuid()
    if info.st_uid in (0, me):
        return None
    return (f"{path}: {what}owned by uid {info.st_uid} ({_owner_name(info.st_uid)}), neither root nor the "
            f"current user (uid {me})")


def path_problem(path: str, info: os.stat_result) -> Optional[str]:
    """Why a file or directory is unsafe to load code through, or None when it is fine."""
    kind = "directory" if stat.S_ISDIR(info.st_mode) else "file"
    foreign = _foreign_owner(path, "", info)
    if foreign:
        return foreign
    writable = [who for who, bit in (("group", stat.S_IWGRP), ("other users", stat.S_IWOTH))
                if info.st_mode & bit]
    if writable == ["group"] and _group_is_the_owner_alone(info.st_gid, info.st_uid):
        writable = []
    if writable and not (stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
        return (f"{path}: {kind} writable by {' and '.join(writable)} "
                f"(mode {stat.S_IMODE(info.st_mode):04o})")
    return None


def link_problem(path: str, info: os.stat_result) -> Optional[str]:
    """Why a symbolic link is unsafe to follow (its owner may point it elsewhere at any time; its
    mode means nothing), or None."""
    problem = _foreign_owner(path, "symbolic link ", info)
    return f"{problem}: its owner can point it elsewhere at any time" if problem else None


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def _why_accepted(kind: str, info: os.stat_result) -> str:
    owner = _owner_text(info.st_uid)
    if kind == "link":
        return f"symbolic link owned by {owner} (followed; where it leads is checked too)"
    if kind == "directory":
        mode = info.st_mode
        if mode & stat.S_IWOTH and mode & stat.S_ISVTX:
            return f"sticky directory owned by {owner}: others may add entries but not replace another's"
        if mode & stat.S_IWGRP:
            return f"directory owned by {owner}, group-writable through a group nobody else is in"
        return f"directory owned by {owner}, writable by its owner only"
    if info.st_mode & stat.S_IWGRP:
        return f"regular file owned by {owner}, group-writable through a group nobody else is in"
    return f"regular file owned by {owner}, writable by its owner only"


# ---- walking a path ----


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def _descent(top: str, path: str) -> List[str]:
    """`top`, every directory below it on the way to `path`, and `path` (which lies under `top`)."""
    rel = os.path.relpath(path, top)
    chain = [top]
    if rel != ".":
        for part in rel.split(os.sep):
            chain.append(os.path.join(chain[-1], part))
    return chain


class _Walk(NamedTuple):
    links: List[str]          # real locations of the links followed, in order
    final: Optional[str]      # the real path reached; None when something on the way is missing
    last_dir: str             # the deepest real directory reached
    error: Optional[str]      # why the path does not resolve (None: it does, or it is simply absent)


def _resolve(start: str, parts: List[str]) -> _Walk:
    """Follows `parts` from the real directory `start` as the kernel would, one component at a time."""
    pending = list(reversed(parts))
    current, count = start, 0
    links: List[str] = []
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        try:
            info = os.lstat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            return _Walk(links, None, current, None)
        except OSError as exc:
            return _Walk(links, None, current, f"{candidate}: cannot be examined ({exc.strerror})")
        if stat.S_ISLNK(info.st_mode):
            count += 1
            if count > _MAX_LINKS:
                return _Walk(links, None, current, f"{candidate}: too many levels of symbolic links")
            try:
                target = os.readlink(candidate)
            except OSError as exc:
                return _Walk(links, None, current, f"{candidate}: cannot read the symbolic link ({exc.strerror})")
            links.append(candidate)
            if target.startswith(os.sep):
                current = os.sep
            pending.extend(reversed(target.split(os.sep)))
            continue
        if pending and not stat.S_ISDIR(info.st_mode):
            return _Walk(links, None, current, None)
        current = candidate
    return _Walk(links, current, os.path.dirname(current) if current != os.sep else current, None)


class _Plan(NamedTuple):
    """What the check of one path examines, in order, each with its kind."""

    examined: List[Tuple[str, str]]   # (real path, "link" | "directory" | "final")
    final: Optional[str]
    error: Optional[str]


def _plan(path: str, top: str) -> _Plan:
    top = os.path.normpath(top)
    path = os.path.normpath(path)
    parent = os.path.realpath(os.path.dirname(top))   # above the root: not checked
    top_walk = _resolve(parent, [os.path.basename(top)])
    if top_walk.final is None:
        return _Plan([(link, "link") for link in top_walk.links], None, top_walk.error)
    top_real = top_walk.final
    rel = os.path.relpath(path, top)
    walk = _resolve(top_real, [] if rel == "." else rel.split(os.sep))

    examined: List[Tuple[str, str]] = []
    seen: Set[str] = set()

    def add(where: str, kind: str) -> None:
        if where not in seen:
            seen.add(where)
            examined.append((where, kind))

    def chain(directory: str) -> None:
        base = top_real if _inside(directory, top_real) else os.sep
        for step in _descent(base, directory):
            add(step, "directory")

    for link in top_walk.links:
        add(link, "link")
    chain(top_real)
    for link in walk.links:
        chain(os.path.dirname(link))
        add(link, "link")
    if walk.final is None:
        chain(walk.last_dir)
        return _Plan(examined, None, walk.error)
    if walk.final != top_real:
        chain(os.path.dirname(walk.final))
    add(walk.final, "final")
    return _Plan(examined, walk.final, None)


# ---- what a check reports ----


@dataclass(frozen=True)
class TrustEntry:
    """One path examined: what it is to the package, and why it was accepted (or what was wrong
    with it, when ACL_SWIGLU_TRUST_LIBS=1 accepted it anyway)."""

    path: str
    role: str
    why: str

    def as_dict(self) -> Dict[str, str]:
        return {"path": self.path, "role": self.role, "why": self.why}


@dataclass(frozen=True)
class TrustReport:
    """What the ownership and permission check of everything used found."""

    ran: bool                              # False: the libraries were opened by name (system loader)
    enforced: bool                         # False: ACL_SWIGLU_TRUST_LIBS=1 accepted what failed
    checked: Tuple[str, ...] = ()          # every file, link and directory examined, in order
    problems: Tuple[str, ...] = ()         # "path: what is wrong", accepted when not enforced
    note: str = ""
    files: Tuple[TrustEntry, ...] = ()     # each path examined (and each dependency left to the system)

    def as_dict(self) -> Dict[str, object]:
        return {"ran": self.ran, "enforced": self.enforced, "checked": list(self.checked),
                "problems": list(self.problems), "note": self.note, "files": [f.as_dict() for f in self.files]}

    def __str__(self) -> str:
        if not self.ran:
            return f"not checked ({self.note})"
        if not self.problems:
            return f"passed ({len(self.checked)} paths owned by root or you, writable by their owner only)"
        return f"{len(self.problems)} problem(s) accepted because {ENV_TRUST}=1: " + "; ".join(self.problems)


# ---- using what was checked ----


class Opened:
    """A checked regular file, open: `fd` is what is used from now on."""

    def __init__(self, path: str, real: str, fd: int, info: os.stat_result, top: str) -> None:
        self.path, self.real, self.fd, self.info, self.top = path, real, fd, info, top
        self._elf: Optional[SharedObject] = None

    @property
    def key(self) -> Tuple[int, int]:
        return (self.info.st_dev, self.info.st_ino)

    def elf(self) -> SharedObject:
        if self._elf is None:
            self._elf = SharedObject(self.fd, self.path)
        return self._elf


def _dlopen(opened: Opened, mode: int) -> ctypes.CDLL:
    """Loads a checked library through its descriptor (by path where /proc is not mounted)."""
    name = os.path.join(_DESCRIPTOR_DIR, str(opened.fd))
    if not os.path.exists(name):
        name = opened.path
    return ctypes.CDLL(name, mode=mode)


def _dlopen_by_path(opened: Opened, mode: int) -> ctypes.CDLL:
    return ctypes.CDLL(opened.path, mode=mode)


def _read_descriptor(opened: Opened, limit: int) -> bytes:
    chunks, total = [], 0
    while total < limit:
        chunk = os.read(opened.fd, min(1 << 16, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


_loaded_names_cache: Dict[Tuple[str, int, int], Optional[str]] = {}


def _loaded_names() -> Dict[str, str]:
    """The names the system loader would match a DT_NEEDED entry against among the libraries this
    process has loaded already: each mapped library's DT_SONAME and file name, with its path."""
    names: Dict[str, str] = {}
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as maps:
            paths = []
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith(os.sep) and ".so" in fields[5]:
                    path = fields[5].rstrip("\n")
                    if path.endswith(" (deleted)"):
                        path = path[:-len(" (deleted)")]
                    if path not in paths:
                        paths.append(path)
    except OSError:
        return names
    for path in paths:
        names.setdefault(os.path.basename(path), path)
        soname = _soname_of(path)
        if soname:
            names.setdefault(soname, path)
    return names


def _soname_of(path: str) -> Optional[str]:
    try:
        info = os.stat(path)
    except OSError:
        return None
    key = (path, info.st_dev, info.st_ino)
    if key not in _loaded_names_cache:
        soname = None
        if stat.S_ISREG(info.st_mode):
            try:
                fd = os.open(path, _OPEN_FLAGS)
            except OSError:
                fd = -1
            if fd >= 0:
                try:
                    soname = SharedObject(fd, path).soname
                except (ElfError, OSError):
                    soname = None
                finally:
                    os.close(fd)
        _loaded_names_cache[key] = soname
    return _loaded_names_cache[key]


def _expand(entry: str, origin: str) -> Optional[str]:
    """A DT_RPATH/DT_RUNPATH entry with $ORIGIN expanded; None for an entry this reader cannot
    expand ($LIB, $PLATFORM) or one relative to the current directory."""
    text = entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
    if "$" in text or not os.path.isabs(text):
        return None
    return text


def _search(name: str, elf: SharedObject, origin: str, environ: Dict[str, str]) -> Tuple[Optional[str], str]:
    """Where the system loader would find the DT_NEEDED `name` of a library whose $ORIGIN is
    `origin`, short of its cache and default directories: DT_RPATH (only without DT_RUNPATH),
    LD_LIBRARY_PATH, DT_RUNPATH. Returns (path or None, how it was found)."""
    dirs: List[Tuple[str, str]] = []
    if not elf.runpath:
        dirs += [(entry, "DT_RPATH") for entry in elf.rpath]
    dirs += [(entry, "LD_LIBRARY_PATH") for entry in environ.get("LD_LIBRARY_PATH", "").split(":")]
    dirs += [(entry, "DT_RUNPATH") for entry in elf.runpath]
    for entry, how in dirs:
        directory = _expand(entry, origin) if how != "LD_LIBRARY_PATH" else (entry if os.path.isabs(entry) else None)
        if directory is None:
            continue
        candidate = os.path.join(directory, name)
        if os.path.exists(candidate):
            return candidate, f"{how} {entry}"
    return None, ""


_kept_descriptors: List[int] = []   # the descriptors libraries were loaded through: open for good


class Gate:
    """Checks each file before it is used; refuses, or with ACL_SWIGLU_TRUST_LIBS=1 records and
    has the caller warn. Keeps the report of everything examined."""

    def __init__(self, enforced: bool, ran: bool = True, note: str = "") -> None:
        self.enforced, self.ran, self.note = enforced, ran, note
        self._lock = threading.RLock()
        self._verdicts: Dict[str, Optional[str]] = {}   # path -> its problem (None: fine)
        self._checked: List[str] = []
        self._entries: List[TrustEntry] = []
        self._problems: List[str] = []
        self._unwarned: List[str] = []
        self._libraries: Dict[Tuple[int, int], ctypes.CDLL] = {}
        self._final_stats: Dict[str, os.stat_result] = {}   # what each examined file was

    def reset_lock(self) -> None:
        """A new lock, in a forked child (another thread may have held this one at the fork)."""
        self._lock = threading.RLock()

    # ---- the check of one path ----

    def _examine(self, where: str, kind: str, role: str) -> Optional[str]:
        if where in self._verdicts:
            return self._verdicts[where]
        try:
            info = os.lstat(where)
        except OSError as exc:
            problem: Optional[str] = f"{where}: cannot be examined ({exc.strerror})"
            why = problem or ""
        else:
            if kind == "link":
                problem = (link_problem(where, info) if stat.S_ISLNK(info.st_mode)
                           else f"{where}: was a symbolic link a moment ago (it changed during the check)")
                why = _why_accepted("link", info)
            elif kind == "directory":
                problem = (path_problem(where, info) if stat.S_ISDIR(info.st_mode)
                           else f"{where}: was a directory a moment ago (it changed during the check)")
                why = _why_accepted("directory", info)
            else:
                problem = (path_problem(where, info) if stat.S_ISREG(info.st_mode)
                           else f"{where}: {_file_kind(info.st_mode)}, not a regular file, so it is not opened")
                why = _why_accepted("file", info)
                self._final_stats[where] = info
        self._verdicts[where] = problem
        self._checked.append(where)
        role_here = role if kind == "final" else (
            f"symbolic link on the way to {role}" if kind == "link" else f"directory on the way to {role}")
        self._entries.append(TrustEntry(where, role_here, why if problem is None else
                                        f"accepted because {ENV_TRUST}=1: {problem}"))
        return problem

    def _check(self, path: str, top: str, role: str, verb: str) -> _Plan:
        """Examines everything that decides what `path` is; raises or records problems."""
        plan = _plan(path, top)
        found = [p for p in (self._examine(where, kind, role) for where, kind in plan.examined) if p]
        if plan.error:
            found.append(plan.error)
        self._settle(path, plan.final, found, role, verb)
        return plan

    def _settle(self, path: str, real: Optional[str], found: List[str], role: str, verb: str) -> None:
        if not found:
            return
        shown = path if real is None or real == path else f"{path} (the real file: {real})"
        if self.enforced:
            raise UntrustedLibraryError(
                f"refusing to {verb} {shown}, {role}: another user could replace it, or it is not a regular "
                "file.\n  " + "\n  ".join(found)
                + "\nFix: make each path above owned by root or by you and writable only by its owner "
                "(`chmod go-w PATH`, and `chown` as its owner or root), replace what is not a regular file, "
                f"or remove what does not belong. If you trust these files as they are, set {ENV_TRUST}=1 to "
                "use them with a warning."
            )
        for problem in found:
            if problem not in self._problems:
                self._problems.append(problem)
                self._unwarned.append(problem)

    def _open(self, path: str, plan: _Plan, role: str, verb: str) -> Optional[Opened]:
        """Opens the checked final file; None when it is not a regular file (accepted by the
        variable: it is then not used) or it vanished."""
        final = plan.final
        before = self._final_stats.get(final) if final is not None else None
        if final is None or before is None or not stat.S_ISREG(before.st_mode):
            return None
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as exc:
            self._settle(path, plan.final, [f"{path}: cannot be opened ({exc.strerror})"], role, verb)
            return None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != (before.st_dev, before.st_ino):
            os.close(fd)
            self._settle(path, plan.final, [f"{path}: is not the file that was checked (it changed between "
                                            "the check and the open); try again"], role, verb)
            return None
        problem = path_problem(final, info)   # the descriptor's own owner and mode
        if problem:
            self._settle(path, final, [problem], role, verb)
        return Opened(path, final, fd, info, top="")

    # ---- what callers use ----

    def open_file(self, path: str, top: str, role: str, verb: str = "load") -> Optional[Opened]:
        """The checked, open regular file at `path` (which lies under `top`); None when absent,
        or when it failed the check and ACL_SWIGLU_TRUST_LIBS=1 accepted that but it cannot be
        used (not a regular file). Raises UntrustedLibraryError for a failed check otherwise."""
        with self._lock:
            plan = self._check(path, top, role, verb)
            opened = self._open(path, plan, role, verb)
            if opened is not None:
                opened.top = top
            return opened

    def note_absent(self, path: str, top: str, role: str) -> None:
        """`path` was looked for and is not there: the directories that decide that are checked,
        since whoever may write them decides what is found instead."""
        with self._lock:
            self._check(path, top, role, "rely on the absence of")

    def read_text(self, path: str, top: str, role: str, limit: int = 1 << 20) -> Optional[Tuple[str, str]]:
        """(text, real path) of a checked regular file read through its own descriptor; None when
        it is absent or not used. At most `limit` bytes are read."""
        with self._lock:
            opened = self.open_file(path, top, role, verb="read")
            if opened is None:
                return None
            try:
                data = _read_descriptor(opened, limit)
            except OSError as exc:
                self._settle(path, opened.real, [f"{path}: cannot be read ({exc.strerror})"], role, "read")
                return None
            finally:
                os.close(opened.fd)
            return data.decode("utf-8", "replace"), opened.real

    def record(self, path: str, role: str, why: str) -> None:
        """An entry for something used but not checked here (a dependency left to the system loader)."""
        with self._lock:
            entry = TrustEntry(path, role, why)
            if entry not in self._entries:
                self._entries.append(entry)

    def load(self, opened: Opened, tops: Sequence[str], role: str, mode: int,
             environ: Dict[str, str]) -> ctypes.CDLL:
        """Loads a checked library after its in-install dependencies (checked, loaded through their
        own descriptors first). Raises LibraryNotFoundError when the system loader refuses one."""
        with self._lock:
            if opened.key in self._libraries:
                os.close(opened.fd)
                return self._libraries[opened.key]
            opens: List[Opened] = [opened]
            try:
                order = self._dependency_order(opened, tops, role, environ, opens)
                library: Optional[ctypes.CDLL] = None
                for item, by_path in order:
                    library = self._load_one(item, by_path, mode if item is opened else mode | os.RTLD_GLOBAL,
                                             item is opened)
                    self._libraries[item.key] = library
                    _kept_descriptors.append(item.fd)
                assert library is not None
                return library
            finally:
                for item in opens:   # the descriptors of what was not loaded (a failure on the way)
                    if item.fd not in _kept_descriptors:
                        os.close(item.fd)

    def _load_one(self, item: Opened, by_path: Optional[str], mode: int, top_level: bool) -> ctypes.CDLL:
        opener = _dlopen if by_path is None else _dlopen_by_path
        try:
            return opener(item, mode)
        except OSError as exc:
            if top_level or "undefined symbol" not in str(exc):
                raise
            # A dependency that uses symbols of the library needing it (found through the global
            # scope once that one is loaded): bind its functions on first call instead.
            lazy = (mode & ~os.RTLD_NOW) | os.RTLD_LAZY
            return opener(item, lazy)

    def _dependency_order(self, root: Opened, tops: Sequence[str], role: str, environ: Dict[str, str],
                          opens: List[Opened]) -> List[Tuple[Opened, Optional[str]]]:
        """`root`'s in-install dependencies, each before what needs it, then `root`; each with why
        it must be loaded by path instead of through its descriptor (None: it need not). Every
        file opened on the way is added to `opens`."""
        loaded = _loaded_names()
        planned: Dict[str, str] = {}          # DT_NEEDED names this order already provides
        order: List[Tuple[Opened, Optional[str]]] = []
        done: Set[Tuple[int, int]] = set(self._libraries)
        visiting: Set[Tuple[int, int]] = set()

        def inside_install(path: str) -> Optional[str]:
            for top in tops:
                if _inside(os.path.normpath(path), os.path.normpath(top)) or _inside(
                        os.path.realpath(path), os.path.realpath(top)):
                    return top
            return None

        def visit(library: Opened) -> None:
            visiting.add(library.key)
            try:
                elf = library.elf()
            except ElfError as exc:
                raise LibraryNotFoundError(f"cannot load {library.path}: {exc}") from exc
            by_path: Optional[str] = None
            origin = os.path.dirname(library.path)
            for name in elf.needed:
                needed_by = f"dependency {name} of {library.path}"
                if name in planned:
                    continue
                if name in loaded:
                    self.record(loaded[name], needed_by, "already loaded in this process; the system loader uses it")
                    continue
                if os.sep in name:
                    found, how = (name, "its absolute name") if os.path.isabs(name) else (None, "")
                else:
                    found, how = _search(name, elf, origin, environ)
                top = inside_install(found) if found else None
                if found is None or top is None:
                    where = (f"found through {how} at {found}, outside the install" if found else
                             "not in its DT_RPATH, DT_RUNPATH or LD_LIBRARY_PATH")
                    self.record(found or name, needed_by,
                                f"{where}: the system loader's to find (ld.so.cache, default directories); "
                                "not checked here")
                    continue
                dependency = self.open_file(found, top, needed_by)
                if dependency is None:
                    if os.path.lexists(found):   # accepted by the variable, but the system loader would block on it
                        raise LibraryNotFoundError(
                            f"cannot load {library.path}: its dependency {name} is {found}, which is not a regular "
                            "file (the system loader would open it as one)")
                    continue
                opens.append(dependency)
                if dependency.key in done:
                    planned[name] = dependency.real
                    continue
                if dependency.key in visiting:
                    by_path = f"it needs {name}, which needs it in turn"
                    continue
                soname = dependency.elf().soname
                if soname != name:
                    by_path = (f"it needs {name}, whose DT_SONAME is {soname or 'missing'}, so the system loader "
                               "would not recognise it as loaded")
                visit(dependency)
                planned[name] = dependency.real
            if by_path is not None:
                self.record(library.path, role if library is root else f"a dependency of {root.path}",
                            f"loaded by its path, not through its descriptor: {by_path}")
            visiting.discard(library.key)
            done.add(library.key)
            order.append((library, by_path))

        visit(root)
        return order

    # ---- reporting ----

    def take_warning(self) -> Optional[str]:
        """The problems accepted since the last call, as one warning text (None: nothing new)."""
        with self._lock:
            if not self._unwarned:
                return None
            text = (f"acl_swiglu: {ENV_TRUST}=1: using files that other users could replace or that are not "
                    "regular files: " + "; ".join(self._unwarned))
            self._unwarned = []
            return text

    def report(self) -> TrustReport:
        with self._lock:
            return TrustReport(self.ran, self.enforced, tuple(self._checked), tuple(self._problems), self.note,
                               tuple(self._entries))
