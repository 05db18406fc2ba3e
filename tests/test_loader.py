"""The loader (acl_swiglu/_loader.py) against FAKE CANN roots built in tmp_path.

docs/c_abi.md and docs/architecture.md: backend selection by ACL_SWIGLU_BACKEND (auto | cann | emulator); search
order ACL_SWIGLU_LIB_DIR, ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME (each <root>/lib64 and
<root>/<arch>-linux/lib64), the default roots, the system loader; runtime libascendcl.so else
libacl_rt.so; meta libnnopbase.so; operator from a custom libcust_opapi.so, then libopapi_nn.so,
then libopapi.so, whichever exports aclnnSwigluGroupQuantGradGetWorkspaceSize.

The fake libraries are tiny shared objects compiled with gcc once per session. Each exports the
symbol names of its role plus ``const char *fake_lib_name(void)`` returning the role, so a child can
tell which file is behind each loaded handle. Fake runtimes do not export the emulator canary
``aclEmuVersion`` (except the one made to test it), so they count as "cann".

Loaded shared libraries stay in a process, so every scenario runs in a child interpreter (the same
sys.executable, cwd = tmp_path so that the installed package is imported, not the source tree) with a
controlled environment: every ACL_SWIGLU_* and ASCEND_* variable, LD_LIBRARY_PATH and PYTHONPATH
removed, then only what the scenario needs set. Nothing is loaded in the pytest process.
"""

import os
import shutil
import textwrap
from pathlib import Path
from typing import Dict

import pytest

from loader_cases import (ARCH, DEFAULT_ROOTS, Layout, NOT_ELF, PRELUDE, STANDARD, SYMBOL, child_env, discover,
                         expect_error, expect_info, fake_paths_mapped, make_root, no_default_roots, run_child,
                         runtime_warnings, safe_modes)


def test_fake_root_via_ascend_home_path_lib64(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert info["backend"] == "cann"
    assert info["requested"] == "auto"
    assert info["root"] == str(root)
    assert info["runtime"] == str(root / "lib64/libascendcl.so")
    assert info["meta"] == str(root / "lib64/libnnopbase.so")
    assert info["operator"] == str(root / "lib64/libopapi.so")
    assert info["emulator_version"] is None
    assert info["abi"] == 2
    assert result["markers"] == {"runtime": "ascendcl", "meta": "nnopbase", "operator": "opapi"}
    assert runtime_warnings(result) == []
    assert info["searched"][0] == str(root / "lib64/libascendcl.so")
    assert str(root / "lib64/libopapi.so") in info["searched"]
    # The fake files are what is mapped, and nothing of the bundled emulator.
    assert sorted(fake_paths_mapped(result, root)) == sorted(
        [info["runtime"], info["meta"], info["operator"]])
    assert not any(p.startswith(result["emulator_root"]) for p in result["maps"])


def test_fake_root_via_ascend_home_path_arch_lib64(tmp_path, fake_libs):
    arch = f"{ARCH}-linux/lib64"
    root = make_root(tmp_path / "toolkit", fake_libs, {
        f"{arch}/libascendcl.so": "ascendcl", f"{arch}/libnnopbase.so": "nnopbase", f"{arch}/libopapi.so": "opapi"})
    info = expect_info(result := discover(tmp_path, ASCEND_HOME_PATH=root))
    assert info["backend"] == "cann"
    assert info["root"] == str(root)
    assert info["runtime"] == str(root / arch / "libascendcl.so")
    assert info["meta"] == str(root / arch / "libnnopbase.so")
    assert info["operator"] == str(root / arch / "libopapi.so")
    assert result["markers"] == {"runtime": "ascendcl", "meta": "nnopbase", "operator": "opapi"}
    # <root>/lib64 is searched before <root>/<arch>-linux/lib64.
    searched = info["searched"]
    assert searched.index(str(root / "lib64/libascendcl.so")) < searched.index(str(root / arch / "libascendcl.so"))


def test_lib64_before_arch_lib64_in_one_root(tmp_path, fake_libs):
    arch = f"{ARCH}-linux/lib64"
    layout = dict(STANDARD)
    layout.update({f"{arch}/libascendcl.so": "ascendcl", f"{arch}/libnnopbase.so": "nnopbase",
                   f"{arch}/libopapi.so": "opapi"})
    root = make_root(tmp_path / "cann", fake_libs, layout)
    info = expect_info(discover(tmp_path, ASCEND_HOME_PATH=root))
    assert (info["runtime"], info["meta"], info["operator"]) == (
        str(root / "lib64/libascendcl.so"), str(root / "lib64/libnnopbase.so"), str(root / "lib64/libopapi.so"))


def test_fake_root_via_ascend_toolkit_home(tmp_path, fake_libs):
    root = make_root(tmp_path / "toolkit", fake_libs, STANDARD)
    result = discover(tmp_path, ASCEND_TOOLKIT_HOME=root)
    info = expect_info(result)
    assert info["backend"] == "cann"
    assert info["root"] == str(root)
    assert info["runtime"] == str(root / "lib64/libascendcl.so")
    assert info["meta"] == str(root / "lib64/libnnopbase.so")
    assert info["operator"] == str(root / "lib64/libopapi.so")
    assert result["markers"] == {"runtime": "ascendcl", "meta": "nnopbase", "operator": "opapi"}


def test_ascend_home_path_before_ascend_toolkit_home(tmp_path, fake_libs):
    home = make_root(tmp_path / "home", fake_libs, STANDARD)
    toolkit = make_root(tmp_path / "toolkit", fake_libs, STANDARD)
    info = expect_info(discover(tmp_path, ASCEND_HOME_PATH=home, ASCEND_TOOLKIT_HOME=toolkit))
    assert info["root"] == str(home)
    assert (info["runtime"], info["meta"], info["operator"]) == (
        str(home / "lib64/libascendcl.so"), str(home / "lib64/libnnopbase.so"), str(home / "lib64/libopapi.so"))


def test_stale_ascend_home_path_reports_the_root_actually_used(tmp_path, fake_libs):
    """ASCEND_HOME_PATH names a root that is gone; the libraries come from ASCEND_TOOLKIT_HOME, and
    backend_info().root must say so (docs/architecture.md: it never hides which libraries are used)."""
    toolkit = make_root(tmp_path / "toolkit", fake_libs, STANDARD)
    gone = tmp_path / "uninstalled-cann"
    info = expect_info(discover(tmp_path, ASCEND_HOME_PATH=gone, ASCEND_TOOLKIT_HOME=toolkit))
    assert info["runtime"] == str(toolkit / "lib64/libascendcl.so")
    assert info["meta"] == str(toolkit / "lib64/libnnopbase.so")
    assert info["operator"] == str(toolkit / "lib64/libopapi.so")
    assert info["root"] == str(toolkit)


@pytest.mark.parametrize("override_kind", ["lib_dir", "root"])
def test_acl_swiglu_lib_dir_wins_over_ascend_home_path(tmp_path, fake_libs, override_kind):
    home = make_root(tmp_path / "home", fake_libs, STANDARD)
    override_root = make_root(tmp_path / "override", fake_libs, STANDARD)
    override = override_root / "lib64" if override_kind == "lib_dir" else override_root
    result = discover(tmp_path, ACL_SWIGLU_LIB_DIR=override, ASCEND_HOME_PATH=home, ASCEND_TOOLKIT_HOME=home)
    info = expect_info(result)
    assert info["backend"] == "cann"
    assert info["root"] == str(override)
    assert info["runtime"] == str(override_root / "lib64/libascendcl.so")
    assert info["meta"] == str(override_root / "lib64/libnnopbase.so")
    assert info["operator"] == str(override_root / "lib64/libopapi.so")
    # The override may name a lib directory or a root: it is searched itself first, then as a root.
    searched = info["searched"]
    assert searched[0] == str(override / "libascendcl.so")
    if override_kind == "root":
        assert searched[1] == str(override / "lib64/libascendcl.so")
    assert all(not p.startswith(str(home)) for p in searched[:searched.index(info["runtime"]) + 1])
    assert fake_paths_mapped(result, home) == []


def test_acl_swiglu_lib_dir_wins_even_when_a_later_root_has_the_preferred_names(tmp_path, fake_libs):
    """The override is a newer install (libacl_rt.so, libopapi_nn.so); ASCEND_HOME_PATH is an older
    one (libascendcl.so, libopapi.so). Every library must come from the override: the runtime, meta
    and operator of two different CANN installs must never be mixed in one process."""
    override = make_root(tmp_path / "override", fake_libs, {
        "lib64/libacl_rt.so": "acl_rt", "lib64/libnnopbase.so": "nnopbase", "lib64/libopapi.so": "opapi"})
    home = make_root(tmp_path / "home", fake_libs, {
        "lib64/libascendcl.so": "ascendcl", "lib64/libnnopbase.so": "nnopbase", "lib64/libopapi_nn.so": "opapi_nn"})
    result = discover(tmp_path, ACL_SWIGLU_LIB_DIR=override, ASCEND_HOME_PATH=home)
    info = expect_info(result)
    used = {"runtime": info["runtime"], "meta": info["meta"], "operator": info["operator"]}
    assert used == {"runtime": str(override / "lib64/libacl_rt.so"),
                    "meta": str(override / "lib64/libnnopbase.so"),
                    "operator": str(override / "lib64/libopapi.so")}, f"libraries from two roots: {used}"
    assert fake_paths_mapped(result, home) == []


# ---- runtime library name ----


def test_libacl_rt_used_when_libascendcl_is_absent(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, {
        "lib64/libacl_rt.so": "acl_rt", "lib64/libnnopbase.so": "nnopbase", "lib64/libopapi.so": "opapi"})
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert info["backend"] == "cann"
    assert info["runtime"] == str(root / "lib64/libacl_rt.so")
    assert result["markers"]["runtime"] == "acl_rt"
    # libascendcl.so was looked for first, in both library directories of the root.
    searched = info["searched"]
    assert str(root / "lib64/libascendcl.so") in searched
    assert str(root / f"{ARCH}-linux/lib64/libascendcl.so") in searched
    assert searched.index(str(root / f"{ARCH}-linux/lib64/libascendcl.so")) < searched.index(
        str(root / "lib64/libacl_rt.so"))


def test_libascendcl_preferred_when_both_exist(tmp_path, fake_libs):
    layout = dict(STANDARD)
    layout["lib64/libacl_rt.so"] = "acl_rt"
    root = make_root(tmp_path / "cann", fake_libs, layout)
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert info["runtime"] == str(root / "lib64/libascendcl.so")
    assert result["markers"]["runtime"] == "ascendcl"
    assert str(root / "lib64/libacl_rt.so") not in fake_paths_mapped(result, root)


def test_emulator_canary_on_the_runtime_makes_the_backend_emulator(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, {
        "lib64/libascendcl.so": "canary", "lib64/libnnopbase.so": "nnopbase", "lib64/libopapi.so": "opapi"})
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert info["backend"] == "emulator"
    assert info["emulator_version"] == "fake-canary 0.0"
    assert info["runtime"] == str(root / "lib64/libascendcl.so")
    assert result["markers"]["runtime"] == "canary"


# ---- operator library ----


def test_custom_operator_from_ascend_custom_opp_path_vendor_dir(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{"lib64/libopapi_nn.so": "opapi_nn"}))
    custom = make_root(tmp_path / "custom", fake_libs, {"acme/op_api/lib/libcust_opapi.so": "cust_opapi"})
    result = discover(tmp_path, ASCEND_HOME_PATH=root, ASCEND_CUSTOM_OPP_PATH=custom)
    info = expect_info(result)
    assert info["operator"] == str(custom / "acme/op_api/lib/libcust_opapi.so")
    assert result["markers"]["operator"] == "cust_opapi"
    assert info["runtime"] == str(root / "lib64/libascendcl.so")
    assert info["meta"] == str(root / "lib64/libnnopbase.so")
    # The operator libraries of the root were not even opened.
    mapped = fake_paths_mapped(result, root)
    assert str(root / "lib64/libopapi_nn.so") not in mapped and str(root / "lib64/libopapi.so") not in mapped


def test_custom_operator_directly_under_an_ascend_custom_opp_path_entry(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    first = tmp_path / "empty-entry"
    first.mkdir()
    entry = make_root(tmp_path / "vendor_pkg", fake_libs, {"op_api/lib/libcust_opapi.so": "cust_opapi"})
    result = discover(tmp_path, ASCEND_HOME_PATH=root, ASCEND_CUSTOM_OPP_PATH=f"{first}{os.pathsep}{entry}")
    info = expect_info(result)
    assert info["operator"] == str(entry / "op_api/lib/libcust_opapi.so")
    assert result["markers"]["operator"] == "cust_opapi"


def test_custom_operator_from_ascend_opp_path_vendors(tmp_path, fake_libs):
    layout = dict(STANDARD, **{"lib64/libopapi_nn.so": "opapi_nn",
                               "opp/vendors/customize/op_api/lib/libcust_opapi.so": "cust_opapi"})
    root = make_root(tmp_path / "cann", fake_libs, layout)
    result = discover(tmp_path, ASCEND_HOME_PATH=root, ASCEND_OPP_PATH=root / "opp")
    info = expect_info(result)
    assert info["operator"] == str(root / "opp/vendors/customize/op_api/lib/libcust_opapi.so")
    assert result["markers"]["operator"] == "cust_opapi"


def test_ascend_custom_opp_path_before_ascend_opp_path_vendors(tmp_path, fake_libs):
    layout = dict(STANDARD, **{"opp/vendors/customize/op_api/lib/libcust_opapi.so": "cust_opapi"})
    root = make_root(tmp_path / "cann", fake_libs, layout)
    custom = make_root(tmp_path / "custom", fake_libs, {"mine/op_api/lib/libcust_opapi.so": "cust_opapi"})
    info = expect_info(discover(tmp_path, ASCEND_HOME_PATH=root, ASCEND_OPP_PATH=root / "opp",
                                ASCEND_CUSTOM_OPP_PATH=custom))
    assert info["operator"] == str(custom / "mine/op_api/lib/libcust_opapi.so")
    searched = info["searched"]
    assert str(root / "opp/vendors/customize/op_api/lib/libcust_opapi.so") not in searched


def test_libopapi_nn_before_libopapi(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{"lib64/libopapi_nn.so": "opapi_nn"}))
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert info["operator"] == str(root / "lib64/libopapi_nn.so")
    assert result["markers"]["operator"] == "opapi_nn"
    assert str(root / "lib64/libopapi.so") not in fake_paths_mapped(result, root)


@pytest.mark.parametrize("skipped", ["custom_vendor", "opp_vendor", "opapi_nn"])
def test_operator_library_without_the_symbol_is_skipped(tmp_path, fake_libs, skipped):
    layout: Layout = dict(STANDARD)
    env = {}
    if skipped == "custom_vendor":
        layout["custom/acme/op_api/lib/libcust_opapi.so"] = "no_operator"
        layout["lib64/libopapi_nn.so"] = "opapi_nn"
        bad, good, good_marker = "custom/acme/op_api/lib/libcust_opapi.so", "lib64/libopapi_nn.so", "opapi_nn"
    elif skipped == "opp_vendor":
        layout["opp/vendors/old/op_api/lib/libcust_opapi.so"] = "no_operator"
        layout["opp/vendors/sw/op_api/lib/libcust_opapi.so"] = "cust_opapi"
        bad, good, good_marker = ("opp/vendors/old/op_api/lib/libcust_opapi.so",
                                  "opp/vendors/sw/op_api/lib/libcust_opapi.so", "cust_opapi")
    else:
        layout["lib64/libopapi_nn.so"] = "no_operator"
        bad, good, good_marker = "lib64/libopapi_nn.so", "lib64/libopapi.so", "opapi"
    root = make_root(tmp_path / "cann", fake_libs, layout)
    if skipped == "custom_vendor":
        env["ASCEND_CUSTOM_OPP_PATH"] = root / "custom"
    env["ASCEND_OPP_PATH"] = root / "opp"
    result = discover(tmp_path, ASCEND_HOME_PATH=root, **env)
    info = expect_info(result)
    assert info["operator"] == str(root / good)
    assert result["markers"]["operator"] == good_marker
    searched = info["searched"]
    assert searched.index(str(root / bad)) < searched.index(str(root / good))


def test_operator_library_that_cannot_be_loaded_is_skipped(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{"lib64/libopapi_nn.so": NOT_ELF}))
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert info["operator"] == str(root / "lib64/libopapi.so")
    assert result["markers"]["operator"] == "opapi"


# ---- what is missing ----


def test_cann_without_the_operator_loads_and_says_so_and_its_use_needs_ascend_950(tmp_path, fake_libs):
    """An install without the operator still loads (another operator may be there); backend_info
    reports the operator missing, and asking for it raises, naming what was searched and what to do."""
    root = make_root(tmp_path / "cann", fake_libs, {
        "lib64/libascendcl.so": "ascendcl", "lib64/libnnopbase.so": "nnopbase", "opp/vendors/.keep": b""})
    result = discover(tmp_path, ASCEND_HOME_PATH=root, ASCEND_OPP_PATH=root / "opp")
    info = expect_info(result)
    assert info["operator"] is None and info["operators"] == {}
    assert list(info["operators_missing"]) == [SYMBOL]
    err = result["operator_error"]
    assert err["type"] == "OperatorNotFoundError" and err["library_not_found"], err
    message = err["message"]
    assert info["operators_missing"][SYMBOL] == message
    assert "Ascend 950" in message
    assert SYMBOL in message
    assert str(root) in message
    assert "set_env.sh" in message and "set ACL_SWIGLU_BACKEND=emulator" in message
    assert runtime_warnings(result) == []   # auto does not fall back when a CANN root is found
    # It lists what was checked: every operator library candidate of the root.
    for candidate in (root / "lib64/libopapi_nn.so", root / "lib64/libopapi.so",
                      root / f"{ARCH}-linux/lib64/libopapi_nn.so", root / f"{ARCH}-linux/lib64/libopapi.so"):
        assert f"{candidate} (absent)" in message, f"{candidate} is not listed in:\n{message}"


def test_a_call_on_a_cann_without_the_operator_raises_the_same_error(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, {"lib64/libascendcl.so": "ascendcl",
                                                     "lib64/libnnopbase.so": "nnopbase"})
    code = PRELUDE + textwrap.dedent("""
        import numpy as np
        import acl_swiglu
        try:
            acl_swiglu.swiglu_group_quant_grad(np.ones((2, 4), np.float32), np.ones((2, 8), np.float32))
            out = {"error": None}
        except Exception as exc:
            out = {"error": error(exc)}
        print(RESULT + json.dumps(out))
    """)
    err = run_child(code, child_env(ASCEND_HOME_PATH=root), tmp_path)["error"]
    assert err is not None and err["type"] == "OperatorNotFoundError" and err["library_not_found"]
    assert SYMBOL in err["message"] and str(root / "lib64/libopapi.so") in err["message"]


def test_cann_whose_operator_libraries_lack_the_symbol_lists_them(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, {
        "lib64/libascendcl.so": "ascendcl", "lib64/libnnopbase.so": "nnopbase",
        "lib64/libopapi_nn.so": "no_operator", "lib64/libopapi.so": "no_operator"})
    for requested in ("auto", "cann"):
        result = discover(tmp_path, ASCEND_HOME_PATH=root, ACL_SWIGLU_BACKEND=requested,
                          FAKE_MARKER_DIR=tmp_path)
        assert expect_info(result)["operator"] is None
        err = result["operator_error"]
        assert err["library_not_found"], err
        message = err["message"]
        assert "Ascend 950" in message
        assert f"{root / 'lib64/libopapi_nn.so'} (does not export {SYMBOL})" in message
        assert f"{root / 'lib64/libopapi.so'} (does not export {SYMBOL})" in message
        assert runtime_warnings(result) == []
        # Their symbol tables said so: neither was loaded, so none of their code ran.
        assert not (tmp_path / "no_operator").exists()
        assert fake_paths_mapped(result, root / "lib64/libopapi") == []


@pytest.mark.parametrize("missing", ["libnnopbase.so", "runtime"])
def test_root_missing_a_library_names_it(tmp_path, fake_libs, missing):
    layout = dict(STANDARD)
    if missing == "runtime":
        del layout["lib64/libascendcl.so"]
    else:
        del layout["lib64/libnnopbase.so"]
    root = make_root(tmp_path / "cann", fake_libs, layout)
    for requested in ("auto", "cann"):
        result = discover(tmp_path, ASCEND_HOME_PATH=root, ACL_SWIGLU_BACKEND=requested)
        err = expect_error(result)
        assert err["library_not_found"], err
        message = err["message"]
        if missing == "runtime":
            assert "libascendcl.so" in message and "libacl_rt.so" in message
        else:
            assert "libnnopbase.so" in message
            assert "libascendcl.so" not in message.split("\n")[0]
        assert str(root / "lib64") in message
        assert str(root / f"{ARCH}-linux/lib64") in message
        assert "set_env.sh" in message and "ACL_SWIGLU_BACKEND=emulator" in message
        # A broken CANN root is an error, never a silent fallback to the emulator.
        assert runtime_warnings(result) == []
        assert not result["loaded"]


def test_meta_library_that_cannot_be_loaded_is_named(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{"lib64/libnnopbase.so": NOT_ELF}))
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    err = expect_error(result)
    assert err["library_not_found"], err
    message = err["message"]
    assert str(root / "lib64/libnnopbase.so") in message
    # The runtime loaded fine: the error must not blame it.
    assert f"from {root / 'lib64/libascendcl.so'}" not in message, message


def test_backend_cann_with_no_cann_anywhere(tmp_path):
    result = discover(tmp_path, ACL_SWIGLU_BACKEND="cann")
    if no_default_roots():
        assert not os.path.exists("/usr/local/Ascend/cann")
        err = expect_error(result)
        assert err["library_not_found"], err
        message = err["message"]
        assert "set_env.sh" in message
        assert "ACL_SWIGLU_BACKEND=emulator" in message
        for searched in ("ACL_SWIGLU_LIB_DIR", "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", *DEFAULT_ROOTS):
            assert searched in message, f"{searched} not named in:\n{message}"
        assert not result["loaded"]
        assert runtime_warnings(result) == []
        assert not any(p.startswith(result["emulator_root"]) for p in result["maps"])
    else:
        # A default root exists on this machine: it is a CANN root and must be searched.
        existing = [r for r in DEFAULT_ROOTS if os.path.isdir(r)]
        if "info" in result:
            assert result["info"]["root"] in existing
        else:
            assert any(r in result["error"]["message"] for r in existing), result["error"]["message"]


def test_backend_auto_with_no_cann_falls_back_to_the_emulator(tmp_path, installed):
    result = discover(tmp_path)
    if not no_default_roots():
        existing = [r for r in DEFAULT_ROOTS if os.path.isdir(r)]
        assert ("info" in result and result["info"]["root"] in existing) or any(
            r in result["error"]["message"] for r in existing)
        return
    info = expect_info(result)
    assert info["backend"] == "emulator"
    assert info["requested"] == "auto"
    assert info["root"] == installed["emulator_root"]
    lib64 = installed["lib64"]
    assert info["runtime"] == os.path.join(lib64, "libascendcl.so")
    assert info["meta"] == os.path.join(lib64, "libnnopbase.so")
    assert info["operator"] == os.path.join(lib64, "libopapi.so")
    assert info["emulator_version"]
    warned = runtime_warnings(result)
    assert len(warned) == 1, result["warnings"]
    assert warned[0]["package"] and warned[0]["category"] == "AclSwigluWarning"
    assert "emulator" in warned[0]["message"]
    assert "Set ACL_SWIGLU_BACKEND=emulator to silence this" in warned[0]["message"]


def test_backend_emulator_ignores_ascend_home_path(tmp_path, fake_libs, installed):
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    result = discover(tmp_path, ACL_SWIGLU_BACKEND="emulator", ASCEND_HOME_PATH=root, ASCEND_TOOLKIT_HOME=root,
                      ACL_SWIGLU_LIB_DIR=root / "lib64")
    info = expect_info(result)
    assert info["backend"] == "emulator"
    assert info["requested"] == "emulator"
    lib64 = installed["lib64"]
    assert (info["runtime"], info["meta"], info["operator"]) == (
        os.path.join(lib64, "libascendcl.so"), os.path.join(lib64, "libnnopbase.so"),
        os.path.join(lib64, "libopapi.so"))
    assert info["emulator_version"]
    assert result["markers"] == {"runtime": None, "meta": None, "operator": None}
    assert fake_paths_mapped(result, root) == []
    assert runtime_warnings(result) == []   # asked for: no warning


def test_emulator_backend_never_takes_a_custom_operator(tmp_path, fake_libs, installed):
    """What `source set_env.sh` leaves behind (ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME, ASCEND_OPP_PATH)
    or a custom operator package (ASCEND_CUSTOM_OPP_PATH): when the bundled emulator is the backend
    (asked for, or the auto fallback), its own operator library must be the one loaded, never a
    CANN custom operator next to the emulator's runtime."""
    layout = dict(STANDARD, **{"opp/vendors/customize/op_api/lib/libcust_opapi.so": "cust_opapi"})
    root = make_root(tmp_path / "cann", fake_libs, layout)
    custom = make_root(tmp_path / "custom", fake_libs, {"acme/op_api/lib/libcust_opapi.so": "cust_opapi"})
    scenarios = {
        "emulator, set_env.sh sourced": dict(ACL_SWIGLU_BACKEND="emulator", ASCEND_HOME_PATH=root,
                                             ASCEND_TOOLKIT_HOME=root, ASCEND_OPP_PATH=root / "opp"),
        "emulator, ASCEND_CUSTOM_OPP_PATH": dict(ACL_SWIGLU_BACKEND="emulator", ASCEND_HOME_PATH=root,
                                                 ASCEND_CUSTOM_OPP_PATH=custom),
        "auto fallback, ASCEND_CUSTOM_OPP_PATH": dict(ASCEND_CUSTOM_OPP_PATH=custom),
    }
    if not no_default_roots():
        del scenarios["auto fallback, ASCEND_CUSTOM_OPP_PATH"]   # a default root is a CANN: no fallback
    wrong = {}
    for name, variables in scenarios.items():
        result = discover(tmp_path, **variables)
        info = expect_info(result)
        assert info["backend"] == "emulator", name
        assert info["runtime"] == os.path.join(installed["lib64"], "libascendcl.so"), name
        if (info["operator"] != os.path.join(installed["lib64"], "libopapi.so")
                or result["markers"]["operator"] is not None or fake_paths_mapped(result, tmp_path)):
            wrong[name] = info["operator"]
    assert wrong == {}, f"the emulator backend loaded a foreign operator library: {wrong}"


# ---- the system loader ----


def test_system_loader_when_no_root_is_configured(tmp_path, fake_libs):
    libdir = make_root(tmp_path / "ldpath", fake_libs, {
        "libascendcl.so": "ascendcl", "libnnopbase.so": "nnopbase", "libopapi.so": "opapi"})
    if not no_default_roots():
        pytest.fail(f"a default CANN root exists ({DEFAULT_ROOTS}); it is searched before the system loader")
    result = discover(tmp_path, LD_LIBRARY_PATH=libdir, ACL_SWIGLU_BACKEND="cann")
    info = expect_info(result)
    assert info["backend"] == "cann"
    assert info["root"] is None
    assert result["markers"] == {"runtime": "ascendcl", "meta": "nnopbase", "operator": "opapi"}
    assert runtime_warnings(result) == []
    # Every library PATH is reported (docs/architecture.md), not just the name handed to dlopen.
    assert (info["runtime"], info["meta"], info["operator"]) == (
        str(libdir / "libascendcl.so"), str(libdir / "libnnopbase.so"), str(libdir / "libopapi.so"))


# ---- configuration errors ----


@pytest.mark.parametrize("value", ["gpu", "CANN-950", "emu"])
def test_invalid_backend_is_a_configuration_error(tmp_path, fake_libs, value):
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    result = discover(tmp_path, ACL_SWIGLU_BACKEND=value, ASCEND_HOME_PATH=root)
    err = expect_error(result)
    assert err["configuration"] and err["type"] == "ConfigurationError", err
    assert "ACL_SWIGLU_BACKEND" in err["message"]
    assert value in err["message"]
    for allowed in ("auto", "cann", "emulator"):
        assert allowed in err["message"]
    assert not result["loaded"]
    assert fake_paths_mapped(result, root) == []


@pytest.mark.parametrize("value", ["3", "0", "rev2", "2.0"])
def test_invalid_abi_is_a_configuration_error(tmp_path, fake_libs, value):
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    result = discover(tmp_path, ACL_SWIGLU_ABI=value, ASCEND_HOME_PATH=root)
    err = expect_error(result)
    assert err["configuration"] and err["type"] == "ConfigurationError", err
    assert "ACL_SWIGLU_ABI" in err["message"]
    assert repr(value) in err["message"]


@pytest.mark.parametrize("value,abi", [(None, 2), ("1", 1), ("2", 2)])
def test_backend_info_reports_the_abi_revision(tmp_path, fake_libs, value, abi):
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    info = expect_info(discover(tmp_path, ACL_SWIGLU_ABI=value, ASCEND_HOME_PATH=root))
    assert info["abi"] == abi
    assert info["backend"] == "cann"
    assert (info["runtime"], info["meta"], info["operator"]) == (
        str(root / "lib64/libascendcl.so"), str(root / "lib64/libnnopbase.so"), str(root / "lib64/libopapi.so"))


# ---- import loads nothing; loading once, thread-safely ----

LIB_NAMES = ("libascendcl", "libacl_rt", "libnnopbase", "libopapi", "libcust_opapi")


def test_import_loads_nothing(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    code = PRELUDE + textwrap.dedent("""
        import importlib, pkgutil
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import acl_swiglu
            modules = [m.name for m in pkgutil.iter_modules(acl_swiglu.__path__, "acl_swiglu.")
                       if m.name != "acl_swiglu.__main__"]
            for name in modules:
                importlib.import_module(name)
        from acl_swiglu import _loader, _ffi
        before = {"loaded": _loader.loaded() is not None, "ffi_bound": _ffi._api is not None,
                  "maps": mapped(), "warnings": [str(w.message) for w in caught], "modules": modules}
        info = acl_swiglu.backend_info()
        after = {"loaded": _loader.loaded() is not None, "maps": mapped(), "runtime": info.runtime}
        print(RESULT + json.dumps({"before": before, "after": after}))
    """)
    result = run_child(code, child_env(ASCEND_HOME_PATH=root), tmp_path)
    before, after = result["before"], result["after"]
    assert "acl_swiglu.op" in before["modules"] and "acl_swiglu.runtime" in before["modules"]
    assert before["loaded"] is False
    assert before["ffi_bound"] is False
    assert [p for p in before["maps"] if any(n in os.path.basename(p) for n in LIB_NAMES)] == []
    assert before["warnings"] == []
    # The same check sees the libraries once they are loaded.
    assert after["loaded"] is True
    assert after["runtime"] == str(root / "lib64/libascendcl.so")
    assert after["runtime"] in after["maps"]


def test_loading_is_thread_safe_and_happens_once(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    code = PRELUDE + textwrap.dedent("""
        import threading, time
        import acl_swiglu
        from acl_swiglu import _loader
        from acl_swiglu import _trust
        calls = {"load": 0, "open": []}
        real_load = _loader.load

        def slow_load(*args, **kwargs):
            calls["load"] += 1
            time.sleep(0.3)     # widen the window in which the other threads arrive
            return real_load(*args, **kwargs)

        _loader.load = slow_load
        record_opens(calls["open"])
        n = 8
        infos, libs = [None] * n, [None] * n

        def work(i):
            infos[i] = acl_swiglu.backend_info()
            libs[i] = _loader.libraries()

        errors = at_once_on_threads(n, work)
        print(RESULT + json.dumps({
            "errors": errors,
            "same_info": all(x is infos[0] for x in infos) and infos[0] is not None,
            "same_libraries": all(x is libs[0] for x in libs) and libs[0] is _loader.loaded(),
            "load_calls": calls["load"], "opens": calls["open"],
            "info": infos[0].as_dict() if infos[0] is not None else None,
        }))
    """)
    result = run_child(code, child_env(ASCEND_HOME_PATH=root), tmp_path)
    assert result["errors"] == []
    assert result["same_info"] is True
    assert result["same_libraries"] is True
    assert result["load_calls"] == 1
    expected = [str(root / "lib64/libascendcl.so"), str(root / "lib64/libnnopbase.so"),
                str(root / "lib64/libopapi.so")]
    assert result["opens"] == expected
    assert result["info"]["runtime"] == expected[0] and result["info"]["operator"] == expected[2]


# ---- the real emulator under CANN names ----

RUN_OP = PRELUDE + textwrap.dedent("""
    import gc
    import numpy as np
    import acl_swiglu
    from acl_swiglu import emulator, reference
    rng = np.random.default_rng(1234)
    T, H = 6, 8
    grad_y = rng.standard_normal((T, H)).astype(np.float32)
    x = (rng.standard_normal((T, 2 * H)) * 2).astype(np.float32)
    weight = rng.random((T, 1)).astype(np.float32)
    y_origin = reference.swiglu(x).astype(np.float32)
    group_index = np.array([2, 3], dtype=np.int64)       # trunc = 5 of 6 rows
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grad_x, grad_weight = acl_swiglu.swiglu_group_quant_grad(
            grad_y, x, weight=weight, y_origin=y_origin, group_index=group_index, clamp_limit=3.0)
    ref_x, ref_w = reference.swiglu_group_quant_grad(
        grad_y, x, weight=weight, y_origin=y_origin, group_index=group_index, clamp_limit=3.0)
    acl_swiglu.release_cached()
    gc.collect()
    print(RESULT + json.dumps({
        "info": acl_swiglu.backend_info().as_dict(),
        "grad_x_shape": list(grad_x.shape), "grad_x_dtype": str(grad_x.dtype),
        "grad_weight_shape": list(grad_weight.shape),
        "grad_x_bits": grad_x.view(np.uint32).ravel().tolist(),
        "grad_weight_bits": grad_weight.view(np.uint32).ravel().tolist(),
        "grad_x_pass": bool(reference.compare(grad_x, ref_x).passed),
        "grad_weight_pass": bool(reference.compare(grad_weight, ref_w).passed),
        "max_abs_error": float(np.max(np.abs(grad_x.astype(np.float64) - ref_x))),
        "tail_zero": bool(np.all(grad_x[5:].view(np.uint32) == 0) and grad_weight[5, 0] == 0),
        "live": emulator.live_counts(),
        "warnings": [str(w.message) for w in caught],
        "maps": mapped(),
    }))
""")


@pytest.fixture(scope="module")
def bundled_run(tmp_path_factory):
    """RUN_OP on the bundled emulator told ABI revision `abi`: what the emulator's copies under CANN
    names must give bit for bit. One child per revision, shared by the tests that compare with it."""
    cwd = tmp_path_factory.mktemp("bundled")
    results: Dict[str, dict] = {}

    def run(abi: str) -> dict:
        if abi not in results:
            results[abi] = run_child(RUN_OP, child_env(ACL_SWIGLU_BACKEND="emulator", ACL_SWIGLU_ABI=abi), cwd)
        return results[abi]
    return run


@pytest.mark.parametrize("abi", ["2", "1"])
def test_real_emulator_copied_into_a_fake_root_under_cann_names(tmp_path, installed, bundled_run, abi):
    lib64 = Path(installed["lib64"])
    root = tmp_path / "cann"
    (root / "lib64").mkdir(parents=True)
    shutil.copyfile(lib64 / "libascendcl.so", root / "lib64/libacl_rt.so")
    shutil.copyfile(lib64 / "libnnopbase.so", root / "lib64/libnnopbase.so")
    shutil.copyfile(lib64 / "libopapi.so", root / "lib64/libopapi_nn.so")
    safe_modes(root)
    assert not (root / "lib64/libascendcl.so").exists()

    result = run_child(RUN_OP, child_env(ASCEND_HOME_PATH=root, ACL_SWIGLU_ABI=abi), tmp_path)
    info = result["info"]
    assert info["backend"] == "emulator"          # the canary is exported by the copied runtime
    assert info["emulator_version"]
    assert info["requested"] == "auto"
    assert info["abi"] == int(abi)
    assert info["root"] == str(root)
    assert info["runtime"] == str(root / "lib64/libacl_rt.so")
    assert info["meta"] == str(root / "lib64/libnnopbase.so")
    assert info["operator"] == str(root / "lib64/libopapi_nn.so")
    assert result["warnings"] == []               # a CANN root was found: no fallback warning
    assert result["grad_x_shape"] == [6, 16] and result["grad_x_dtype"] == "float32"
    assert result["grad_weight_shape"] == [6, 1]
    assert result["grad_x_pass"] and result["grad_weight_pass"], result["max_abs_error"]
    assert result["max_abs_error"] < 1e-4
    assert result["tail_zero"]
    assert result["live"] == {"tensor": 0, "int_array": 0, "executor": 0, "stream": 0, "allocation": 0, "bytes": 0}
    # The copies ran, not the package's own libraries.
    assert not any(p.startswith(str(lib64)) for p in result["maps"]), [
        p for p in result["maps"] if p.startswith(str(lib64))]
    for name in ("libacl_rt.so", "libnnopbase.so", "libopapi_nn.so"):
        assert str(root / "lib64" / name) in result["maps"]

    # Bit for bit what the bundled emulator gives.
    bundled = bundled_run(abi)
    assert bundled["info"]["runtime"] == str(lib64 / "libascendcl.so")
    assert bundled["grad_x_bits"] == result["grad_x_bits"]
    assert bundled["grad_weight_bits"] == result["grad_weight_bits"]


# ---- the install's ABI revision: a revision-1 CANN ----

HEADER_REV1 = """/* operator header of a revision-1 install */
aclnnStatus aclnnSwigluGroupQuantGradGetWorkspaceSize(
    const aclTensor *gradY, const aclTensor *x, const aclTensor *weightOptional,
    const aclTensor *yOriginOptional, const aclIntArray *groupIndexOptional, double clampLimit,
    const aclTensor *gradXOut, const aclTensor *gradWeightOutOptional, uint64_t *workspaceSize,
    aclOpExecutor **executor);
"""
HEADER_PATH = "include/aclnnop/aclnn_swiglu_group_quant_grad.h"


def revision_1_cann(root: Path, lib64: Path) -> Path:
    """The emulator's libraries under their CANN names, beside an operator header of revision 1."""
    (root / "lib64").mkdir(parents=True)
    for name in ("libascendcl.so", "libnnopbase.so", "libopapi.so"):
        shutil.copyfile(lib64 / name, root / "lib64" / name)
    header = root / HEADER_PATH
    header.parent.mkdir(parents=True)
    header.write_text(HEADER_REV1)
    safe_modes(root)
    return header


def test_a_revision_1_cann_is_called_with_revision_1_without_any_setting(tmp_path, installed, bundled_run):
    # ACL_EMU_ABI=1 makes the emulator behave as a revision-1 CANN; the binding must find
    # revision 1 in the install's header by itself (ACL_SWIGLU_ABI unset).
    root = tmp_path / "cann-rev1"
    header = revision_1_cann(root, Path(installed["lib64"]))
    result = run_child(RUN_OP, child_env(ASCEND_HOME_PATH=root, ACL_EMU_ABI="1"), tmp_path)
    info = result["info"]
    assert info["abi"] == 1
    assert info["abi_source"] == str(header)
    assert (info["header"], info["header_abi"]) == (str(header), 1)
    assert result["warnings"] == []
    assert result["grad_x_pass"] and result["grad_weight_pass"], result["max_abs_error"]
    assert result["tail_zero"]
    # Bit for bit what the bundled emulator gives when both sides are told revision 1.
    bundled = bundled_run("1")
    assert bundled["info"]["abi"] == 1 and bundled["info"]["abi_source"] == "ACL_SWIGLU_ABI"
    assert bundled["grad_x_bits"] == result["grad_x_bits"]
    assert bundled["grad_weight_bits"] == result["grad_weight_bits"]


def test_the_bundled_emulator_follows_acl_emu_abi_when_the_binding_is_not_told(tmp_path, installed):
    result = run_child(RUN_OP, child_env(ACL_SWIGLU_BACKEND="emulator", ACL_EMU_ABI=" 1 "), tmp_path)
    assert result["info"]["abi"] == 1 and result["info"]["abi_source"] == "ACL_EMU_ABI"
    assert result["grad_x_pass"] and result["grad_weight_pass"]


def test_acl_swiglu_abi_overrides_the_header_with_a_warning(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{HEADER_PATH: HEADER_REV1.encode()}))
    result = discover(tmp_path, ASCEND_HOME_PATH=root, ACL_SWIGLU_ABI="2")
    info = expect_info(result)
    assert (info["abi"], info["abi_source"]) == (2, "ACL_SWIGLU_ABI")
    warned = [w["message"] for w in runtime_warnings(result)]
    assert len(warned) == 1, warned
    assert f"ACL_SWIGLU_ABI=2 overrides ABI revision 1 declared by {root / HEADER_PATH}" in warned[0]
    # The same setting that agrees with the header, and no setting at all: silent, revision 1.
    for setting in ("1", None, " "):
        result = discover(tmp_path, ASCEND_HOME_PATH=root, ACL_SWIGLU_ABI=setting)
        assert expect_info(result)["abi"] == 1 and runtime_warnings(result) == []


def test_without_a_header_the_revision_is_2_by_default(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    info = expect_info(discover(tmp_path, ASCEND_HOME_PATH=root))
    assert (info["abi"], info["abi_source"], info["header"]) == (2, "default", None)


BLANKED_REVISIONS = ((" 2", 2), ("1\t", 1), ("\n", 2), ("", 2))
# Each rule once in the default run: blanks around a revision that is not the default, and blanks
# alone meaning unset (tests/test_hostile_env.py has more of both); the other spellings, a child
# interpreter each, in the slow tier.
DEFAULT_RUN_SPELLINGS = {("ACL_SWIGLU_ABI", "1\t"), ("ACL_EMU_ABI", "\n")}


@pytest.mark.parametrize("value,abi,variable", [
    pytest.param(value, abi, variable, marks=() if (variable, value) in DEFAULT_RUN_SPELLINGS else pytest.mark.slow)
    for variable in ("ACL_SWIGLU_ABI", "ACL_EMU_ABI") for value, abi in BLANKED_REVISIONS])
def test_revision_settings_ignore_surrounding_blanks(tmp_path, fake_libs, variable, value, abi):
    result = run_child(RUN_OP, child_env(ACL_SWIGLU_BACKEND="emulator", **{variable: value}), tmp_path)
    assert result["info"]["abi"] == abi
    assert result["grad_x_pass"]
