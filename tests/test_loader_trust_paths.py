"""Everything that decides what is loaded or how it is called is checked, and what is used is what was
checked (docs/loading.md): symbolic links as links, the libraries' dependencies inside the install, the
operator header, the version files; only regular files opened; nothing swapped after the check takes
effect.

Each scenario is a real fake CANN root in tmp_path (the gcc-built fakes of loader_cases.py, plus
libraries that need other libraries, built here), with explicit owners (another uid through
os.chown: these tests run as root) and modes, loaded in a child interpreter. Every fake's
constructor leaves a marker file when FAKE_MARKER_DIR is set, so a test sees whose code ran.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import textwrap
from pathlib import Path
from typing import Dict

import pytest

from loader_cases import (ARCH, DISCOVER, FOREIGN_UID, MARKER_C, OPERATOR_C, PRELUDE, RUNTIME_C, STANDARD, child_env,
                         expect_error, expect_info, fake_paths_mapped, make_root, needs_chown, private_gid,
                         run_child, runtime_warnings, shared_gid)

HEADER_PATH = "include/aclnnop/aclnn_swiglu_group_quant_grad.h"
REVISION_1_HEADER = ("aclnnStatus aclnnSwigluGroupQuantGradGetWorkspaceSize(const aclTensor *gradY, const aclTensor *x, "
                     "const aclTensor *w, const aclTensor *y, const aclIntArray *groupIndexOptional, double c, "
                     "const aclTensor *gx, const aclTensor *gw, uint64_t *ws, aclOpExecutor **e);\n")
REVISION_2_HEADER = REVISION_1_HEADER.replace("aclIntArray *groupIndexOptional", "aclTensor *groupIndexOptional")
OPS_NN_VERSION = "share/info/ops_nn/version.info"
RUNTIME_VERSION = "share/info/runtime/version.info"


def protected_symlinks() -> bool:
    """fs.protected_symlinks=1 makes the kernel itself refuse to follow another user's link in a
    sticky world-writable directory, whatever this package accepts."""
    try:
        return Path("/proc/sys/fs/protected_symlinks").read_text().strip() == "1"
    except OSError:
        return False


# ---- libraries that need other libraries ----

LEAF_C = MARKER_C + 'int leaf_value(void) { return 7; }\n'
MIDDLE_C = MARKER_C + 'extern int leaf_value(void);\nint middle_value(void) { return leaf_value() + 1; }\n'
NEIGHBOUR_C = MARKER_C + 'int neighbour_value(void) { return 3; }\n'
NEEDS_NEIGHBOUR = '\nextern int neighbour_value(void);\nint uses_neighbour(void) { return neighbour_value(); }\n'
NEEDS_MIDDLE = '\nextern int middle_value(void);\nint uses_middle(void) { return middle_value(); }\n'


def _gcc(out: Path, name: str, source: str, role: str, *extra: str) -> Path:
    gcc = shutil.which("gcc")
    assert gcc, "gcc is required to build the fake CANN libraries for the loader tests"
    src = out / f"{name}.c"
    src.write_text(source)
    lib = out / name
    cmd = [gcc, "-shared", "-fPIC", "-O1", f'-DROLE="{role}"', str(src), "-o", str(lib), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr}"
    return lib


@pytest.fixture(scope="session")
def dep_libs(tmp_path_factory) -> Dict[str, Path]:
    return _built_dep_libs(tmp_path_factory)


def _built_dep_libs(tmp_path_factory) -> Dict[str, Path]:
    """Libraries whose DT_NEEDED entries resolve through $ORIGIN, as CANN's do. Each is linked
    against a copy named as the install names it, so DT_NEEDED holds that name."""
    out = tmp_path_factory.mktemp("dep-libs")
    link = out / "link"
    link.mkdir()
    libs: Dict[str, Path] = {}
    origin = ["-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags"]          # DT_RUNPATH $ORIGIN
    libs["neighbour"] = _gcc(link, "libneighbour.so", NEIGHBOUR_C, "neighbour", "-Wl,-soname,libneighbour.so")
    libs["leaf"] = _gcc(link, "libleaf.so", LEAF_C, "leaf", "-Wl,-soname,libleaf.so")
    libs["middle"] = _gcc(link, "libmiddle.so", MIDDLE_C, "middle", "-Wl,-soname,libmiddle.so",
                          f"-L{link}", "-lleaf", *origin)
    libs["runtime_neighbour"] = _gcc(out, "runtime_neighbour.so", RUNTIME_C + NEEDS_NEIGHBOUR, "runtime_neighbour",
                                     "-DWITH_VERSION_API", f"-L{link}", "-lneighbour", *origin)
    libs["runtime_rpath"] = _gcc(out, "runtime_rpath.so", RUNTIME_C + NEEDS_NEIGHBOUR, "runtime_rpath",
                                 f"-L{link}", "-lneighbour", "-Wl,-rpath,$ORIGIN", "-Wl,--disable-new-dtags")
    libs["runtime_chain"] = _gcc(out, "runtime_chain.so", RUNTIME_C + NEEDS_MIDDLE, "runtime_chain",
                                 "-DWITH_VERSION_API", f"-L{link}", "-lmiddle", *origin)
    libs["operator_neighbour"] = _gcc(out, "operator_neighbour.so", OPERATOR_C + NEEDS_NEIGHBOUR, "operator_neighbour",
                                      f"-L{link}", "-lneighbour", *origin)
    # DT_NEEDED libodd.so (linked against a copy without a soname), installed as a file whose
    # DT_SONAME is libodd.so.7: the system loader cannot tell it is loaded by its name.
    odd_link = out / "odd"
    odd_link.mkdir()
    _gcc(odd_link, "libodd.so", NEIGHBOUR_C, "odd")
    libs["odd"] = _gcc(out, "odd.so", NEIGHBOUR_C, "odd", "-Wl,-soname,libodd.so.7")
    libs["runtime_odd"] = _gcc(out, "runtime_odd.so", RUNTIME_C + NEEDS_NEIGHBOUR, "runtime_odd",
                               f"-L{odd_link}", "-lodd", *origin)
    return libs


def dep_root(root: Path, fake_libs, dep_libs, layout: Dict[str, str]) -> Path:
    """make_root with the dependency fakes as well (roles of either set)."""
    return make_root(root, {**fake_libs, **dep_libs}, layout)


WITH_NEIGHBOUR = {"lib64/libascendcl.so": "runtime_neighbour", "lib64/libneighbour.so": "neighbour",
                  "lib64/libnnopbase.so": "nnopbase", "lib64/libopapi.so": "opapi"}


def ran(markers: Path, role: str) -> bool:
    return (markers / role).exists()


def refused(result: dict, *fragments: str) -> str:
    err = expect_error(result)
    assert err["type"] == "UntrustedLibraryError" and err["library_not_found"], err
    for fragment in fragments:
        assert fragment in err["message"], (fragment, err["message"])
    assert "ACL_SWIGLU_TRUST_LIBS=1" in err["message"]
    return err["message"]


def accepted(result: dict, *fragments: str) -> dict:
    """Loaded with ACL_SWIGLU_TRUST_LIBS=1: one warning, naming each fragment."""
    info = expect_info(result)
    assert info["trust"]["enforced"] is False
    warned = [w for w in runtime_warnings(result) if "ACL_SWIGLU_TRUST_LIBS=1" in w["message"]]
    assert len(warned) == 1, result["warnings"]
    assert warned[0]["package"]
    for fragment in fragments:
        assert fragment in warned[0]["message"], (fragment, warned[0]["message"])
        assert any(fragment in p for p in info["trust"]["problems"]), (fragment, info["trust"]["problems"])
    return info


def load(tmp_path: Path, markers: Path = None, timeout: float = 120, **variables) -> dict:
    env = child_env(FAKE_MARKER_DIR=markers, **variables)
    return run_child(DISCOVER, env, tmp_path, timeout=timeout)


@pytest.fixture
def markers(tmp_path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


# ---- symbolic links ----


@needs_chown
@pytest.mark.parametrize("directory_mode", [0o1777, 0o755], ids=["sticky-world-writable", "owner-only"])
def test_a_library_reached_through_another_users_symlink_is_refused(tmp_path, fake_libs, markers, directory_mode):
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{"real/libopapi.so": "opapi"}))
    link = root / "lib64/libopapi.so"
    link.unlink()
    link.symlink_to(root / "real/libopapi.so")
    os.lchown(link, FOREIGN_UID, FOREIGN_UID)
    (root / "lib64").chmod(directory_mode)
    message = refused(load(tmp_path, markers, ASCEND_HOME_PATH=root),
                      f"refusing to load {link} (the real file: {root / 'real/libopapi.so'})",
                      f"{link}: symbolic link owned by uid {FOREIGN_UID}", "can point it elsewhere")
    assert "real/libopapi.so:" not in message           # the file it leads to is fine; the link is not
    assert not ran(markers, "opapi")

    result = load(tmp_path, markers, ASCEND_HOME_PATH=root, ACL_SWIGLU_TRUST_LIBS="1")
    if directory_mode == 0o1777 and protected_symlinks():
        # The kernel refuses to follow it for us: the library is not loaded, whatever was accepted.
        assert result["info"]["operator"] is None and not ran(markers, "opapi")
        return
    info = accepted(result, f"{link}: symbolic link owned by uid {FOREIGN_UID}")
    assert info["operator"] == str(link) and result["markers"]["operator"] == "opapi"


@needs_chown
def test_a_link_on_the_way_to_a_link_is_checked_as_well(tmp_path, fake_libs, markers):
    """lib64/libopapi.so -> ../hop/libopapi.so, and hop/libopapi.so -> the real file: the second link
    belongs to another user (a realpath() of the first would never have seen it)."""
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{"real/libopapi.so": "opapi", "hop/.keep": b""}))
    (root / "lib64/libopapi.so").unlink()
    (root / "lib64/libopapi.so").symlink_to("../hop/libopapi.so")
    (root / "hop/libopapi.so").symlink_to(root / "real/libopapi.so")
    os.lchown(root / "hop/libopapi.so", FOREIGN_UID, -1)
    refused(load(tmp_path, markers, ASCEND_HOME_PATH=root),
            f"{root / 'hop/libopapi.so'}: symbolic link owned by uid {FOREIGN_UID}")
    assert not ran(markers, "opapi")
    os.lchown(root / "hop/libopapi.so", 0, 0)
    result = load(tmp_path, markers, ASCEND_HOME_PATH=root)
    checked = expect_info(result)["trust"]["checked"]
    for path in (root / "lib64/libopapi.so", root / "hop", root / "hop/libopapi.so", root / "real/libopapi.so"):
        assert str(path) in checked, path
    assert result["markers"]["operator"] == "opapi"


@needs_chown
def test_a_root_that_is_another_users_symlink_is_refused(tmp_path, fake_libs, markers):
    """The older layout's <toolkit>/latest -> <version>: the link is checked as a link."""
    make_root(tmp_path / "toolkit/9.2.0", fake_libs, STANDARD)
    latest = tmp_path / "toolkit/latest"
    latest.symlink_to("9.2.0")
    os.lchown(latest, FOREIGN_UID, -1)
    refused(load(tmp_path, markers, ASCEND_HOME_PATH=latest), f"{latest}: symbolic link owned by uid {FOREIGN_UID}")
    assert not ran(markers, "ascendcl")
    os.lchown(latest, 0, 0)
    info = expect_info(load(tmp_path, markers, ASCEND_HOME_PATH=latest))
    assert info["runtime"] == str(latest / "lib64/libascendcl.so")
    assert info["trust"]["checked"][:2] == [str(latest), str(tmp_path / "toolkit/9.2.0")]


# ---- dependencies ----


@pytest.mark.parametrize("unsafe", ["mode-0666", "foreign-owner"])
def test_a_dependency_others_could_replace_is_refused_before_any_code_runs(tmp_path, fake_libs, dep_libs, markers,
                                                                           unsafe):
    if unsafe == "foreign-owner" and os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    root = dep_root(tmp_path / "cann", fake_libs, dep_libs, WITH_NEIGHBOUR)
    neighbour = root / "lib64/libneighbour.so"
    if unsafe == "mode-0666":
        neighbour.chmod(0o666)
        problem = f"{neighbour}: file writable by group and other users (mode 0666)"
    else:
        os.chown(neighbour, FOREIGN_UID, -1)
        problem = f"{neighbour}: owned by uid {FOREIGN_UID}"
    result = load(tmp_path, markers, ASCEND_HOME_PATH=root)
    refused(result, f"refusing to load {neighbour}, dependency libneighbour.so of {root / 'lib64/libascendcl.so'}",
            problem)
    assert not ran(markers, "neighbour") and not ran(markers, "runtime_neighbour")
    assert fake_paths_mapped(result, root) == []

    result = load(tmp_path, markers, ASCEND_HOME_PATH=root, ACL_SWIGLU_TRUST_LIBS="1")
    info = accepted(result, problem)
    assert ran(markers, "neighbour") and result["markers"]["runtime"] == "runtime_neighbour"
    entry = [e for e in info["trust"]["files"] if e["path"] == str(neighbour)]
    assert entry and entry[0]["why"].startswith("accepted because ACL_SWIGLU_TRUST_LIBS=1: ")


def test_a_dependency_found_through_dt_rpath_is_checked_too(tmp_path, fake_libs, dep_libs, markers):
    root = dep_root(tmp_path / "cann", fake_libs, dep_libs, dict(WITH_NEIGHBOUR, **{
        "lib64/libascendcl.so": "runtime_rpath"}))
    (root / "lib64/libneighbour.so").chmod(0o646)
    refused(load(tmp_path, markers, ASCEND_HOME_PATH=root),
            f"{root / 'lib64/libneighbour.so'}: file writable by other users (mode 0646)")
    assert not ran(markers, "neighbour")


def test_an_operator_librarys_dependency_is_checked_too(tmp_path, fake_libs, dep_libs, markers):
    root = dep_root(tmp_path / "cann", fake_libs, dep_libs, {
        "lib64/libascendcl.so": "ascendcl", "lib64/libnnopbase.so": "nnopbase",
        "lib64/libopapi.so": "operator_neighbour", "lib64/libneighbour.so": "neighbour"})
    (root / "lib64/libneighbour.so").chmod(0o666)
    result = load(tmp_path, markers, ASCEND_HOME_PATH=root)
    refused(result, f"dependency libneighbour.so of {root / 'lib64/libopapi.so'}",
            f"{root / 'lib64/libneighbour.so'}: file writable by group and other users (mode 0666)")
    assert ran(markers, "ascendcl") and not ran(markers, "neighbour") and not ran(markers, "operator_neighbour")


LOAD_ORDER = PRELUDE + textwrap.dedent("""
    import acl_swiglu
    from acl_swiglu import _loader
    opened_as = []
    record_opens(opened_as)
    info = acl_swiglu.backend_info()
    libs = _loader.libraries()
    uses = libs.runtime.uses_middle if hasattr(libs.runtime, "uses_middle") else libs.runtime.uses_neighbour
    print(RESULT + json.dumps({"info": info.as_dict(), "order": opened_as, "maps": mapped(), "value": uses(),
                               "runtime": marker(libs.runtime)}))
""")


def test_dependencies_load_first_from_the_install_each_checked(tmp_path, fake_libs, dep_libs, markers):
    """runtime -> libmiddle.so -> libleaf.so, through DT_RUNPATH $ORIGIN: each checked, each loaded
    before what needs it, each the install's own file."""
    root = dep_root(tmp_path / "cann", fake_libs, dep_libs, {
        "lib64/libascendcl.so": "runtime_chain", "lib64/libmiddle.so": "middle", "lib64/libleaf.so": "leaf",
        "lib64/libnnopbase.so": "nnopbase", "lib64/libopapi.so": "opapi"})
    result = run_child(LOAD_ORDER, child_env(ASCEND_HOME_PATH=root, FAKE_MARKER_DIR=markers), tmp_path)
    lib64 = root / "lib64"
    assert result["order"][:3] == [str(lib64 / "libleaf.so"), str(lib64 / "libmiddle.so"), str(lib64 / "libascendcl.so")]
    assert result["value"] == 8 and result["runtime"] == "runtime_chain"
    assert {str(lib64 / "libleaf.so"), str(lib64 / "libmiddle.so")} <= set(result["maps"])
    trust = result["info"]["trust"]
    roles = {e["path"]: e["role"] for e in trust["files"]}
    assert roles[str(lib64 / "libmiddle.so")] == f"dependency libmiddle.so of {lib64 / 'libascendcl.so'}"
    assert roles[str(lib64 / "libleaf.so")] == f"dependency libleaf.so of {lib64 / 'libmiddle.so'}"
    assert str(lib64 / "libleaf.so") in trust["checked"] and trust["problems"] == []


OPENED_BY_DESCRIPTOR_ALONE = PRELUDE + textwrap.dedent("""
    import sys
    fd = os.open(sys.argv[1] if len(sys.argv) > 1 else os.environ["LIBRARY"], os.O_RDONLY)
    try:
        ctypes.CDLL(f"/proc/self/fd/{fd}", mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        out = {"loaded": True}
    except OSError as exc:
        out = {"loaded": False, "error": str(exc)}
    print(RESULT + json.dumps(out))
""")


def test_loading_through_the_descriptor_works_although_origin_then_means_proc_self_fd(tmp_path, fake_libs, dep_libs):
    """A library opened as /proc/self/fd/N has $ORIGIN = /proc/self/fd: on its own it cannot find
    its $ORIGIN dependencies (the first child shows it). The loader loads them first, through their
    own descriptors, and the system loader then finds them loaded by their DT_SONAME."""
    root = dep_root(tmp_path / "cann", fake_libs, dep_libs, WITH_NEIGHBOUR)
    alone = run_child(OPENED_BY_DESCRIPTOR_ALONE, child_env(LIBRARY=root / "lib64/libascendcl.so"), tmp_path)
    assert alone["loaded"] is False and "libneighbour.so" in alone["error"]
    result = run_child(LOAD_ORDER, child_env(ASCEND_HOME_PATH=root), tmp_path)
    assert result["value"] == 3 and result["runtime"] == "runtime_neighbour"
    assert result["order"][:2] == [str(root / "lib64/libneighbour.so"), str(root / "lib64/libascendcl.so")]
    assert str(root / "lib64/libneighbour.so") in result["maps"]


def test_a_dependency_whose_soname_differs_from_its_name_loads_by_path_and_says_so(tmp_path, fake_libs, dep_libs):
    root = dep_root(tmp_path / "cann", fake_libs, dep_libs, {
        "lib64/libascendcl.so": "runtime_odd", "lib64/libodd.so": "odd",
        "lib64/libnnopbase.so": "nnopbase", "lib64/libopapi.so": "opapi"})
    result = run_child(LOAD_ORDER, child_env(ASCEND_HOME_PATH=root), tmp_path)
    assert result["value"] == 3
    notes = [e for e in result["info"]["trust"]["files"]
             if e["path"] == str(root / "lib64/libascendcl.so") and "loaded by its path" in e["why"]]
    assert notes and "it needs libodd.so, whose DT_SONAME is libodd.so.7" in notes[0]["why"]
    assert str(root / "lib64/libodd.so") in result["info"]["trust"]["checked"]


def test_a_dependency_outside_the_install_is_the_system_loaders_and_reported_so(tmp_path, fake_libs, dep_libs):
    root = dep_root(tmp_path / "cann", fake_libs, dep_libs, dict(WITH_NEIGHBOUR))
    (root / "lib64/libneighbour.so").unlink()
    elsewhere = make_root(tmp_path / "elsewhere", {**fake_libs, **dep_libs}, {"libneighbour.so": "neighbour"})
    result = run_child(LOAD_ORDER, child_env(ASCEND_HOME_PATH=root, LD_LIBRARY_PATH=elsewhere), tmp_path)
    assert result["value"] == 3
    entries = [e for e in result["info"]["trust"]["files"] if e["path"] == str(elsewhere / "libneighbour.so")]
    assert entries and "outside the install" in entries[0]["why"] and "not checked here" in entries[0]["why"]
    assert entries[0]["role"] == f"dependency libneighbour.so of {root / 'lib64/libascendcl.so'}"
    assert str(elsewhere / "libneighbour.so") not in result["info"]["trust"]["checked"]


# ---- the operator header ----


def header_root(tmp_path: Path, fake_libs, header: bytes = REVISION_1_HEADER.encode()) -> Path:
    return make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{HEADER_PATH: header}))


@pytest.mark.parametrize("where", ["file-0666", "directory-0777", "directory-0777-header-absent"])
def test_an_operator_header_others_could_change_is_refused(tmp_path, fake_libs, where):
    root = header_root(tmp_path, fake_libs)
    header = root / HEADER_PATH
    if where == "file-0666":
        header.chmod(0o666)
        problem = f"{header}: file writable by group and other users (mode 0666)"
    else:
        header.parent.chmod(0o777)
        problem = f"{header.parent}: directory writable by group and other users (mode 0777)"
        if where.endswith("absent"):
            header.unlink()   # whoever may write there decides that the default revision is used
    result = load(tmp_path, ASCEND_HOME_PATH=root)
    refused(result, str(header), problem)
    result = load(tmp_path, ASCEND_HOME_PATH=root, ACL_SWIGLU_TRUST_LIBS="1")
    info = accepted(result, problem)
    assert info["abi"] == (2 if where.endswith("absent") else 1)


@needs_chown
def test_an_operator_header_of_another_user_or_through_their_link_is_refused(tmp_path, fake_libs):
    root = header_root(tmp_path, fake_libs)
    header = root / HEADER_PATH
    os.chown(header, FOREIGN_UID, -1)
    refused(load(tmp_path, ASCEND_HOME_PATH=root), f"{header}: owned by uid {FOREIGN_UID}")
    os.chown(header, 0, 0)
    real = root / "include/real.h"
    header.rename(real)
    header.symlink_to(real)
    os.lchown(header, FOREIGN_UID, -1)
    refused(load(tmp_path, ASCEND_HOME_PATH=root), f"{header}: symbolic link owned by uid {FOREIGN_UID}")


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_an_operator_header_that_is_not_a_regular_file_is_refused_by_name_without_blocking(tmp_path, fake_libs, kind):
    root = header_root(tmp_path, fake_libs)
    header = root / HEADER_PATH
    header.unlink()
    if kind == "fifo":
        os.mkfifo(header, 0o644)
        what = "a FIFO"
    else:
        header.mkdir(0o755)
        what = "a directory"
    problem = f"{header}: {what}, not a regular file, so it is not opened"
    refused(load(tmp_path, timeout=60, ASCEND_HOME_PATH=root), problem)
    info = accepted(load(tmp_path, timeout=60, ASCEND_HOME_PATH=root, ACL_SWIGLU_TRUST_LIBS="1"), problem)
    assert info["header"] is None and (info["abi"], info["abi_source"]) == (2, "default")


# ---- the version files ----


def _a_fifo_is_refused_unless_trusted(tmp_path, root, file, refusal):
    """With a FIFO in place of `file`, loading is refused (`refusal`, "{fifo}" in it the FIFO's
    path) without blocking on it; with ACL_SWIGLU_TRUST_LIBS=1 it loads with a warning of the FIFO
    and takes the version from version.cfg (9.2.0)."""
    fifo = root / file
    fifo.unlink()
    os.mkfifo(fifo, 0o644)
    problem = f"{fifo}: a FIFO, not a regular file, so it is not opened"
    refused(load(tmp_path, timeout=60, ASCEND_HOME_PATH=root), refusal.format(fifo=fifo), problem)
    info = accepted(load(tmp_path, timeout=60, ASCEND_HOME_PATH=root, ACL_SWIGLU_TRUST_LIBS="1"), problem)
    assert (info["cann_version"], info["cann_version_source"]) == ("9.2.0", str(root / "version.cfg"))


@pytest.mark.parametrize("file", [OPS_NN_VERSION, f"{ARCH}-linux/ascend_toolkit_install.info"],
                         ids=["ops_nn", "toolkit"])
def test_a_version_file_that_is_a_fifo_is_refused_by_name_without_blocking(tmp_path, fake_libs, file):
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{
        "version.cfg": b"toolkit_running_version=[1.0:9.2.0]\n", file: b""}))
    _a_fifo_is_refused_unless_trusted(tmp_path, root, file, "refusing to read {fifo}, a version file")


def test_a_version_file_others_could_change_or_remove_is_refused(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{OPS_NN_VERSION: b"Version=9.1.0\n"}))
    version = root / OPS_NN_VERSION
    version.chmod(0o664)
    os.chown(version, -1, shared_or_skip())
    refused(load(tmp_path, ASCEND_HOME_PATH=root), f"{version}: file writable by group (mode 0664)")
    # The guard of 9.1.0 must not be lifted by someone who deletes its record: with the record gone
    # from a directory others may write, the absence is not relied on.
    version.unlink()
    version.parent.chmod(0o777)
    refused(load(tmp_path, ASCEND_HOME_PATH=root), f"refusing to rely on the absence of {version}",
            f"{version.parent}: directory writable by group and other users (mode 0777)")


def shared_or_skip() -> int:
    return shared_gid()


def test_the_file_aclsysgetcannversion_reads_is_checked_before_the_runtime_reads_it(tmp_path, fake_libs, markers):
    """The runtime reads <ASCEND_HOME_PATH>/share/info/runtime/version.info by path (the fake as
    CANN does, with fopen: a FIFO there would block it for good): it is checked first."""
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{
        RUNTIME_VERSION: b"", "version.cfg": b"toolkit_running_version=[1:9.2.0]\n"}))
    _a_fifo_is_refused_unless_trusted(tmp_path, root, RUNTIME_VERSION, "refusing to have the runtime read {fifo}")


# ---- nothing swapped after the check takes effect ----

SWAP_AFTER_CHECK = PRELUDE + textwrap.dedent("""
    import acl_swiglu
    from acl_swiglu import _loader, _trust
    target, replacement, hook = os.environ["SWAP_TARGET"], os.environ["SWAP_WITH"], os.environ["SWAP_HOOK"]
    after = os.environ.get("SWAP_WHEN") == "after"
    swapped = []
    owner = _trust
    for part in hook.split(".")[:-1]:
        owner = getattr(owner, part)
    real = getattr(owner, hook.split(".")[-1])

    def swap(path):
        if path == target and not swapped:
            os.replace(replacement, target)     # what another user could do, if anyone could
            swapped.append(target)

    def swap_then(*args, **kwargs):
        path = next(a if isinstance(a, str) else a.path for a in args if isinstance(a, str) or hasattr(a, "path"))
        if not after:
            swap(path)
        done = real(*args, **kwargs)
        if after:
            swap(path)
        return done

    setattr(owner, hook.split(".")[-1], swap_then)
    try:
        info = acl_swiglu.backend_info().as_dict()
        out = {"info": info, "operator": marker(_loader.operator_library(_loader.OPERATOR_SYMBOL).library)}
    except Exception as exc:
        out = {"error": error(exc)}
    out["swapped"] = swapped
    print(RESULT + json.dumps(out))
""")


def test_a_library_swapped_right_after_its_check_is_not_what_loads(tmp_path, fake_libs, markers):
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{"evil.so": "evil"}))
    target = root / "lib64/libopapi.so"
    result = run_child(SWAP_AFTER_CHECK, child_env(
        ASCEND_HOME_PATH=root, FAKE_MARKER_DIR=markers, SWAP_TARGET=target, SWAP_WITH=root / "evil.so",
        SWAP_HOOK="_dlopen"), tmp_path)
    assert result["swapped"] == [str(target)]
    assert result["operator"] == "opapi" and ran(markers, "opapi")
    assert not ran(markers, "evil")     # the replacement's code never ran


def test_a_header_swapped_right_after_its_check_is_not_what_is_read(tmp_path, fake_libs):
    root = header_root(tmp_path, fake_libs)
    replacement = root / "revision-2.h"
    replacement.write_text(REVISION_2_HEADER)
    result = run_child(SWAP_AFTER_CHECK, child_env(
        ASCEND_HOME_PATH=root, SWAP_TARGET=root / HEADER_PATH, SWAP_WITH=replacement, SWAP_HOOK="_read_descriptor"),
        tmp_path)
    assert result["swapped"] == [str(root / HEADER_PATH)]
    assert (result["info"]["abi"], result["info"]["header_abi"]) == (1, 1)   # the checked header's revision


def test_a_library_swapped_between_its_check_and_its_open_is_refused(tmp_path, fake_libs, markers):
    """The open must find the file the check examined (same device and inode), or nothing is used."""
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{"evil.so": "evil"}))
    target = root / "lib64/libopapi.so"
    result = run_child(SWAP_AFTER_CHECK, child_env(
        ASCEND_HOME_PATH=root, FAKE_MARKER_DIR=markers, SWAP_TARGET=target, SWAP_WITH=root / "evil.so",
        SWAP_HOOK="Gate._check", SWAP_WHEN="after"), tmp_path)
    assert result["swapped"] == [str(target)]
    err = result["error"]
    assert err["type"] == "UntrustedLibraryError"
    assert f"{target}: is not the file that was checked (it changed between the check and the open)" in err["message"]
    assert not ran(markers, "evil") and not ran(markers, "opapi")


# ---- a clean install needs no setting ----


def test_a_clean_install_made_with_umask_002_loads_without_any_setting(tmp_path, fake_libs, dep_libs, markers):
    """Directories 0775 and files 0664 of the owner's own group (umask 002 systems give each user
    a group nobody else is in), with dependencies, a header and version files: loads, silently."""
    if private_gid() is None:
        pytest.skip("the current user's group has other members here, so group write is another user's write")
    previous = os.umask(0o002)
    try:
        root = tmp_path / "cann"
        layout = dict(WITH_NEIGHBOUR, **{"lib64/libascendcl.so": "runtime_chain", "lib64/libmiddle.so": "middle",
                                         "lib64/libleaf.so": "leaf"})
        libs = {**fake_libs, **dep_libs}
        for rel, role in layout.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(libs[role], root / rel)
        for rel, text in ((HEADER_PATH, REVISION_1_HEADER), (RUNTIME_VERSION, "Version=9.2.0\n")):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    finally:
        os.umask(previous)
    for path in [root, *root.rglob("*")]:
        os.chown(path, -1, private_gid())
    assert stat.S_IMODE((root / "lib64").stat().st_mode) == 0o775
    assert stat.S_IMODE((root / "lib64/libleaf.so").stat().st_mode) == 0o664
    result = load(tmp_path, markers, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert info["trust"]["enforced"] and info["trust"]["problems"] == []
    assert runtime_warnings(result) == []
    assert (info["abi"], info["cann_version"], info["cann_version_source"]) == (1, "9.2.0", "aclsysGetCANNVersion")
    assert result["markers"] == {"runtime": "runtime_chain", "meta": "nnopbase", "operator": "opapi"}
    assert ran(markers, "leaf") and ran(markers, "middle")
    group_written = [e for e in info["trust"]["files"] if "group-writable through a group nobody else is in" in e["why"]]
    assert {str(root / "lib64"), str(root / "lib64/libleaf.so"), str(root / HEADER_PATH)} <= {e["path"] for e in group_written}

