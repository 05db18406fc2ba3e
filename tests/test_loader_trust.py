"""Loading only libraries that can be trusted (docs/architecture.md, "Trust").

Each scenario builds a real fake CANN root in tmp_path with the gcc-built fake libraries of
loader_cases.py, gives its files and directories explicit modes (never the machine's umask) and,
where a test needs a foreign owner, chowns them (possible as root; such tests skip otherwise), then
loads in a child interpreter. A refusal must name the path and what is wrong and load nothing from
the root; ACL_SWIGLU_TRUST_LIBS=1 must load and warn naming what it accepted; relative search
paths are refused before anything is looked at.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from loader_cases import (FOREIGN_UID, STANDARD, discover, expect_error, expect_info, fake_paths_mapped, make_root, shared_gid,
                         needs_chown, private_gid, runtime_warnings, safe_modes)

def standard_root(tmp_path: Path, fake_libs, layout=STANDARD) -> Path:
    return make_root(tmp_path / "cann", fake_libs, layout)


def assert_refused(result: dict, root: Path, *fragments: str) -> str:
    err = expect_error(result)
    assert err["type"] == "UntrustedLibraryError" and err["library_not_found"], err
    for fragment in fragments:
        assert fragment in err["message"], (fragment, err["message"])
    assert "ACL_SWIGLU_TRUST_LIBS=1" in err["message"] and "chmod go-w" in err["message"]
    assert not any("libopapi" in p or "libcust" in p for p in fake_paths_mapped(result, root)), \
        "an untrusted library was loaded"
    return err["message"]


def share_group(path: Path) -> None:
    os.chown(path, -1, shared_gid())   # root (the tests' user here) may give a file any group


# ---- modes ----

WHERE = {"root": "", "lib64": "lib64", "operator": "lib64/libopapi.so", "runtime": "lib64/libascendcl.so"}
UNSAFE_BITS = {"group-writable": (stat.S_IWGRP, "group"), "world-writable": (stat.S_IWOTH, "other users")}


@pytest.mark.parametrize("where", list(WHERE))
@pytest.mark.parametrize("unsafe", list(UNSAFE_BITS))
def test_a_file_or_directory_others_may_write_is_refused(tmp_path, fake_libs, where, unsafe):
    root = standard_root(tmp_path, fake_libs)
    target = root / WHERE[where]
    bit, who = UNSAFE_BITS[unsafe]
    share_group(target)
    target.chmod(stat.S_IMODE(target.stat().st_mode) | bit)
    mode = f"{stat.S_IMODE(target.stat().st_mode):04o}"
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    message = assert_refused(result, root, f"{target}: ", f"writable by {who}", f"mode {mode}")
    assert ("directory" if target.is_dir() else "file") in message
    if where == "runtime":
        assert fake_paths_mapped(result, root) == []          # refused before it was opened


def test_group_and_world_writable_together_are_named_together(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    (root / "lib64").chmod(0o777)
    assert_refused(discover(tmp_path, ASCEND_HOME_PATH=root), root,
                   f"{root / 'lib64'}: directory writable by group and other users (mode 0777)")


def test_a_sticky_world_writable_directory_is_accepted(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    (root / "lib64").chmod(0o1777)
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert info["trust"]["ran"] and info["trust"]["enforced"] and info["trust"]["problems"] == []
    assert str(root / "lib64") in info["trust"]["checked"]
    assert result["markers"] == {"runtime": "ascendcl", "meta": "nnopbase", "operator": "opapi"}


def test_a_sticky_bit_on_a_file_does_not_excuse_it(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    (root / "lib64/libopapi.so").chmod(0o1666)
    assert_refused(discover(tmp_path, ASCEND_HOME_PATH=root), root, "libopapi.so: file writable by group and other")


def test_safe_root_loads_and_reports_every_path_checked_and_why_it_passed(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    trust = info["trust"]
    assert {k: trust[k] for k in ("ran", "enforced", "problems", "note")} == {
        "ran": True, "enforced": True, "problems": [], "note": ""}
    expected = [str(root), str(root / "lib64"), str(root / "lib64/libascendcl.so"),
                str(root / "lib64/libnnopbase.so"), str(root / "lib64/libopapi.so")]
    assert trust["checked"] == expected
    files = {entry["path"]: entry for entry in trust["files"] if entry["path"] in expected}
    assert list(files) == expected
    assert files[str(root)]["why"] == "directory owned by root, writable by its owner only"
    assert files[str(root / "lib64/libascendcl.so")] == {
        "path": str(root / "lib64/libascendcl.so"), "role": "the CANN runtime library",
        "why": "regular file owned by root, writable by its owner only"}
    assert files[str(root / "lib64/libopapi.so")]["role"] == (
        "the library exporting aclnnSwigluGroupQuantGradGetWorkspaceSize")
    # What the libraries need from outside the install is the system loader's, and said to be.
    libc = [e for e in trust["files"] if os.path.basename(e["path"]).startswith("libc.so")]
    assert libc and all("the system loader" in e["why"] for e in libc)
    assert runtime_warnings(result) == []


# ---- owners ----


@needs_chown
@pytest.mark.parametrize("where", ["root", "lib64", "operator", "runtime"])
def test_a_path_owned_by_another_user_is_refused(tmp_path, fake_libs, where):
    root = standard_root(tmp_path, fake_libs)
    target = root / WHERE[where]
    os.chown(target, FOREIGN_UID, -1)
    assert_refused(discover(tmp_path, ASCEND_HOME_PATH=root), root,
                   f"{target}: owned by uid {FOREIGN_UID}", "neither root nor the current user")


@needs_chown
def test_another_users_file_in_a_sticky_directory_is_still_refused(tmp_path, fake_libs):
    # Sticky directories let anyone add a file: the file's owner is what protects it.
    root = standard_root(tmp_path, fake_libs, dict(STANDARD, **{"lib64/libopapi_nn.so": "opapi_nn"}))
    (root / "lib64").chmod(0o1777)
    os.chown(root / "lib64/libopapi_nn.so", FOREIGN_UID, FOREIGN_UID)
    assert_refused(discover(tmp_path, ASCEND_HOME_PATH=root), root, f"libopapi_nn.so: owned by uid {FOREIGN_UID}")


@needs_chown
def test_a_foreign_group_with_no_write_bit_is_fine(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    os.chown(root / "lib64/libopapi.so", -1, FOREIGN_UID)
    assert expect_info(discover(tmp_path, ASCEND_HOME_PATH=root))["trust"]["problems"] == []


# ---- ACL_SWIGLU_TRUST_LIBS ----


def test_trust_variable_loads_with_a_warning_naming_what_was_accepted(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    share_group(root / "lib64")
    (root / "lib64").chmod(0o775)
    (root / "lib64/libopapi.so").chmod(0o666)
    result = discover(tmp_path, ASCEND_HOME_PATH=root, ACL_SWIGLU_TRUST_LIBS="1")
    info = expect_info(result)
    assert result["markers"] == {"runtime": "ascendcl", "meta": "nnopbase", "operator": "opapi"}
    trust = info["trust"]
    assert trust["ran"] is True and trust["enforced"] is False
    assert trust["problems"] == [f"{root / 'lib64'}: directory writable by group (mode 0775)",
                                 f"{root / 'lib64/libopapi.so'}: file writable by group and other users (mode 0666)"]
    warned = [w["message"] for w in runtime_warnings(result) if "ACL_SWIGLU_TRUST_LIBS=1" in w["message"]]
    assert len(warned) == 1
    for problem in trust["problems"]:
        assert problem in warned[0]


def test_trust_variable_with_nothing_to_accept_is_silent(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    result = discover(tmp_path, ASCEND_HOME_PATH=root, ACL_SWIGLU_TRUST_LIBS="1")
    assert expect_info(result)["trust"]["problems"] == []
    assert runtime_warnings(result) == []


@pytest.mark.parametrize("value", ["0", "", " 0 "])
def test_trust_variable_off_values_keep_the_check(tmp_path, fake_libs, value):
    root = standard_root(tmp_path, fake_libs)
    (root / "lib64").chmod(0o777)
    assert_refused(discover(tmp_path, ASCEND_HOME_PATH=root, ACL_SWIGLU_TRUST_LIBS=value), root, "lib64")


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_trust_variable_with_another_value_is_a_configuration_error(tmp_path, fake_libs, value):
    root = standard_root(tmp_path, fake_libs)
    err = expect_error(discover(tmp_path, ASCEND_HOME_PATH=root, ACL_SWIGLU_TRUST_LIBS=value))
    assert err["configuration"] and "ACL_SWIGLU_TRUST_LIBS" in err["message"] and repr(value) in err["message"]


# ---- symlinks ----


def root_with_operator_linked_out(tmp_path: Path, fake_libs, subdir: str):
    """A safe root whose lib64/libopapi.so is a symlink to <tmp_path>/elsewhere/<subdir>/libopapi.so."""
    root = standard_root(tmp_path, fake_libs)
    elsewhere = make_root(tmp_path / "elsewhere", fake_libs, {f"{subdir}/libopapi.so": "opapi"})
    (root / "lib64/libopapi.so").unlink()
    (root / "lib64/libopapi.so").symlink_to(elsewhere / subdir / "libopapi.so")
    return root, elsewhere


def test_a_symlink_out_of_the_root_to_an_unsafe_place_is_refused(tmp_path, fake_libs):
    root, elsewhere = root_with_operator_linked_out(tmp_path, fake_libs, "drop")
    (elsewhere / "drop").chmod(0o777)
    assert_refused(discover(tmp_path, ASCEND_HOME_PATH=root), root,
                   f"refusing to load {root / 'lib64/libopapi.so'}",
                   f"{elsewhere / 'drop'}: directory writable by group and other users (mode 0777)")


def test_a_symlinked_directory_leading_to_an_unsafe_place_is_refused(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    real = tmp_path / "real-lib64"
    shutil.move(str(root / "lib64"), str(real))
    (root / "lib64").symlink_to(real)
    real.chmod(0o757)
    assert_refused(discover(tmp_path, ASCEND_HOME_PATH=root), root,
                   f"refusing to load {root / 'lib64/libascendcl.so'} (the real file: {real / 'libascendcl.so'})",
                   f"{real}: directory writable by other users (mode 0757)")


def test_a_symlink_out_of_the_root_to_a_safe_place_loads_and_checks_the_way_there(tmp_path, fake_libs):
    root, elsewhere = root_with_operator_linked_out(tmp_path, fake_libs, "lib")
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert result["markers"]["operator"] == "opapi"
    checked = info["trust"]["checked"]
    # Outside the root, every directory of the real path is examined, from / down.
    for path in ("/", str(tmp_path), str(elsewhere), str(elsewhere / "lib"), str(elsewhere / "lib/libopapi.so")):
        assert path in checked, path


def test_a_writable_directory_holding_a_symlink_is_refused_though_the_target_is_safe(tmp_path, fake_libs):
    # Whoever may write lib64 may point the link elsewhere.
    root, elsewhere = root_with_operator_linked_out(tmp_path, fake_libs, "lib")
    (root / "lib64").chmod(0o777)
    assert_refused(discover(tmp_path, ASCEND_HOME_PATH=root), root, f"{root / 'lib64'}: directory writable")


# ---- custom operator paths ----


def test_an_unsafe_custom_operator_entry_is_refused_naming_it(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    custom = make_root(tmp_path / "custom", fake_libs, {"acme/op_api/lib/libcust_opapi.so": "cust_opapi"})
    custom.chmod(0o777)
    result = discover(tmp_path, ASCEND_HOME_PATH=root, ASCEND_CUSTOM_OPP_PATH=custom)
    assert_refused(result, root, f"refusing to load {custom / 'acme/op_api/lib/libcust_opapi.so'}",
                   f"{custom}: directory writable by group and other users")
    assert fake_paths_mapped(result, custom) == []


def test_an_unsafe_vendors_directory_under_ascend_opp_path_is_refused(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs, dict(
        STANDARD, **{"opp/vendors/customize/op_api/lib/libcust_opapi.so": "cust_opapi"}))
    (root / "opp/vendors").chmod(0o777)
    assert_refused(discover(tmp_path, ASCEND_HOME_PATH=root, ASCEND_OPP_PATH=root / "opp"), root,
                   f"{root / 'opp/vendors'}: directory writable by group and other users")


def test_a_safe_custom_operator_entry_is_checked_from_the_entry_down(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    custom = make_root(tmp_path / "custom", fake_libs, {"acme/op_api/lib/libcust_opapi.so": "cust_opapi"})
    result = discover(tmp_path, ASCEND_HOME_PATH=root, ASCEND_CUSTOM_OPP_PATH=custom)
    info = expect_info(result)
    assert result["markers"]["operator"] == "cust_opapi"
    for path in (custom, custom / "acme", custom / "acme/op_api", custom / "acme/op_api/lib",
                 custom / "acme/op_api/lib/libcust_opapi.so"):
        assert str(path) in info["trust"]["checked"]
    assert str(tmp_path) not in info["trust"]["checked"]      # above the entry: not its business


# ---- relative paths ----


@pytest.mark.parametrize("variable", ["ACL_SWIGLU_LIB_DIR", "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME",
                                      "ASCEND_CUSTOM_OPP_PATH", "ASCEND_OPP_PATH"])
def test_a_relative_search_path_is_refused_even_where_it_would_find_libraries(tmp_path, fake_libs, variable):
    # The child's cwd is tmp_path, where "cann" holds a complete (safe) CANN root.
    root = standard_root(tmp_path, fake_libs, dict(
        STANDARD, **{"op_api/lib/libcust_opapi.so": "cust_opapi",
                     "vendors/v/op_api/lib/libcust_opapi.so": "cust_opapi"}))
    variables = {variable: "cann"}
    if variable.startswith("ASCEND_") and variable not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
        variables["ASCEND_HOME_PATH"] = root
    result = discover(tmp_path, **variables)
    err = expect_error(result)
    assert err["configuration"], err
    assert variable in err["message"] and "'cann'" in err["message"]
    assert "relative path" in err["message"] and str(root) in err["message"]   # says what the absolute one would be
    assert not result["loaded"] and fake_paths_mapped(result, root) == []


@pytest.mark.parametrize("value", ["./cann", "cann/lib64", "~/cann"])
def test_every_relative_form_is_refused(tmp_path, fake_libs, value):
    standard_root(tmp_path, fake_libs)
    err = expect_error(discover(tmp_path, ACL_SWIGLU_LIB_DIR=value))
    assert err["configuration"] and repr(value) in err["message"]


def test_one_relative_custom_entry_among_absolute_ones_is_refused(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    err = expect_error(discover(tmp_path, ASCEND_HOME_PATH=root,
                                ASCEND_CUSTOM_OPP_PATH=f"{tmp_path}{os.pathsep}vendor{os.pathsep}/opt/x"))
    assert err["configuration"] and "ASCEND_CUSTOM_OPP_PATH entry" in err["message"] and "'vendor'" in err["message"]


def test_empty_custom_entries_never_mean_the_current_directory(tmp_path, fake_libs):
    root = standard_root(tmp_path, fake_libs)
    make_root(tmp_path, fake_libs, {"op_api/lib/libcust_opapi.so": "cust_opapi"})
    result = discover(tmp_path, ASCEND_HOME_PATH=root,
                      ASCEND_CUSTOM_OPP_PATH=f"{os.pathsep}{os.pathsep}{tmp_path / 'nothing'}{os.pathsep}")
    info = expect_info(result)
    assert info["operator"] == str(root / "lib64/libopapi.so")
    assert not any("libcust_opapi" in p for p in info["searched"] if p.startswith(str(tmp_path / "op_api")))


def test_a_relative_emulator_dir_is_refused(tmp_path, installed):
    err = expect_error(discover(tmp_path, ACL_SWIGLU_BACKEND="emulator", ACL_SWIGLU_EMULATOR_DIR="lib64"))
    assert err["configuration"] and "ACL_SWIGLU_EMULATOR_DIR" in err["message"] and "'lib64'" in err["message"]


# ---- the emulator inside the installed package ----


def test_the_installed_emulator_passes_its_own_check(tmp_path, installed):
    result = discover(tmp_path, ACL_SWIGLU_BACKEND="emulator")
    trust = expect_info(result)["trust"]
    emulator_root = installed["emulator_root"]
    assert trust["ran"] and trust["enforced"] and trust["problems"] == []
    assert trust["checked"][:2] == [emulator_root, installed["lib64"]]
    assert os.path.join(installed["lib64"], "libopapi.so") in trust["checked"]


def test_an_emulator_build_others_may_write_is_refused(tmp_path, installed):
    lib64 = tmp_path / "emu" / "lib64"
    shutil.copytree(installed["lib64"], lib64)
    safe_modes(tmp_path / "emu")
    share_group(lib64 / "libnnopbase.so")
    (lib64 / "libnnopbase.so").chmod(0o664)
    result = discover(tmp_path, ACL_SWIGLU_BACKEND="emulator", ACL_SWIGLU_EMULATOR_DIR=lib64)
    assert_refused(result, tmp_path / "emu", f"{lib64 / 'libnnopbase.so'}: file writable by group (mode 0664)")


def test_group_write_through_the_owners_own_group_is_accepted(tmp_path, fake_libs):
    """umask 002 systems give every user a group of their own: group write through it lets
    nobody else write, so such an install loads without ACL_SWIGLU_TRUST_LIBS."""
    gid = private_gid()
    if gid is None:
        pytest.skip("the current user's group has other members here")
    root = standard_root(tmp_path, fake_libs)
    for path in (root, root / "lib64", root / "lib64/libopapi.so"):
        os.chown(path, -1, gid)
    (root / "lib64").chmod(0o775)
    (root / "lib64/libopapi.so").chmod(0o664)
    info = expect_info(discover(tmp_path, ASCEND_HOME_PATH=root))
    assert info["trust"]["ran"] and info["trust"]["enforced"] and info["trust"]["problems"] == []
