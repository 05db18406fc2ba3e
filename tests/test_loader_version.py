"""Where the CANN version comes from (docs/loading.md, "The CANN version"), and the versions a bug
report needs.

The install is asked first: aclsysGetCANNVersion(ACL_PKG_NAME_CANN), which needs no aclInit and,
in CANN, reads <ASCEND_HOME_PATH>/share/info/runtime/version.info and answers '9.2.0-beta.1' as
'9.2.0.beta1' (the fake runtimes of test_loader.py do the same; their emulator-like runtime
answers ACL_EMU_CANN_VERSION, as the bundled emulator will). The install's version files are the
fallback, and a version read from ops-nn's own file says that a self-built ops-nn labels itself
9.1.0.
"""

from __future__ import annotations

import platform
import sys
import textwrap

import pytest

from acl_swiglu._loader import release_from_api
from loader_cases import PRELUDE, STANDARD, child_env, discover, expect_info, make_root, run_child, runtime_warnings

RUNTIME_VERSION = "share/info/runtime/version.info"
OPS_NN_VERSION = "share/info/ops_nn/version.info"


@pytest.mark.parametrize("answer,release", [
    ("9.2.0.beta1", "9.2.0-beta.1"), ("9.2.0.beta2", "9.2.0-beta.2"), ("9.1.0", "9.1.0"), ("9.2.0", "9.2.0"),
    ("8.0.RC2", "8.0.RC2"), ("8.5.0.alpha001", "8.5.0-alpha.1"), ("8.5.0.rc1", "8.5.0-rc.1"), ("7", "7")])
def test_the_runtimes_spelling_of_a_release_is_read_back(answer, release):
    assert release_from_api(answer) == release


def test_the_runtime_is_asked_first_and_its_answer_read_back(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{
        RUNTIME_VERSION: b"Version=9.2.0-beta.1\ntimestamp=1\n", OPS_NN_VERSION: b"Version=9.2.0\n"}))
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert (info["cann_version"], info["cann_version_source"], info["cann_version_file"]) == (
        "9.2.0-beta.1", "aclsysGetCANNVersion", None)
    assert info["cann_version_note"] is None
    # The file the runtime answers from was checked first; the ops-nn record was not read.
    assert str(root / RUNTIME_VERSION) in info["trust"]["checked"]
    assert str(root / OPS_NN_VERSION) not in info["trust"]["checked"]
    # 9.2.0-beta.1 is a release with the known hang: it is recognised in the runtime's spelling.
    assert [w for w in runtime_warnings(result) if "CANN 9.2.0-beta.1" in w["message"] and "hangs" in w["message"]]


@pytest.mark.parametrize("case", ["old-runtime", "home-unset", "home-elsewhere", "no-runtime-record"])
def test_the_version_files_are_the_fallback(tmp_path, fake_libs, case):
    layout = dict(STANDARD, **{OPS_NN_VERSION: b"Version=9.1.0\n", RUNTIME_VERSION: b"Version=9.2.0\n"})
    variables = {"ASCEND_HOME_PATH": None}
    if case == "old-runtime":
        layout["lib64/libascendcl.so"] = "old_ascendcl"            # no aclsysGetCANNVersion
    elif case == "no-runtime-record":
        del layout[RUNTIME_VERSION]                                # the runtime would answer nothing
    root = make_root(tmp_path / "cann", fake_libs, layout)
    if case == "home-unset":
        variables = {"ACL_SWIGLU_LIB_DIR": root}
    elif case == "home-elsewhere":
        # The runtime would answer for ASCEND_HOME_PATH's install, not for the one in use.
        other = make_root(tmp_path / "other", fake_libs, dict(STANDARD, **{RUNTIME_VERSION: b"Version=9.9.9\n"}))
        variables = {"ACL_SWIGLU_LIB_DIR": root, "ASCEND_HOME_PATH": other}
    else:
        variables = {"ASCEND_HOME_PATH": root}
    info = expect_info(discover(tmp_path, **variables))
    assert info["root"] == str(root)
    assert (info["cann_version"], info["cann_version_source"], info["cann_version_file"]) == (
        "9.1.0", str(root / OPS_NN_VERSION), str(root / OPS_NN_VERSION))
    note = info["cann_version_note"]
    assert "self-built ops-nn labels itself 9.1.0" in note and "later source" in note


def test_a_version_from_another_file_carries_no_ops_nn_note(tmp_path, fake_libs):
    arch = platform.machine() or "x86_64"
    toolkit = f"{arch}-linux/ascend_toolkit_install.info"
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{toolkit: b"version=8.5.0\n"}))
    info = expect_info(discover(tmp_path, ASCEND_HOME_PATH=root))
    assert (info["cann_version"], info["cann_version_source"], info["cann_version_note"]) == (
        "8.5.0", str(root / toolkit), None)


@pytest.mark.parametrize("role,emulated,expected", [
    ("canary", None, ("9.2.0", "aclsysGetCANNVersion")),
    ("canary", "9.1.0", ("9.1.0", "aclsysGetCANNVersion")),
    ("old_canary", "9.1.0", (None, None))], ids=["default", "ACL_EMU_CANN_VERSION", "without-the-function"])
def test_an_emulator_reports_the_release_it_emulates_when_it_can_be_asked(tmp_path, fake_libs, role, emulated,
                                                                          expected):
    root = make_root(tmp_path / "cann", fake_libs, dict(STANDARD, **{"lib64/libascendcl.so": role}))
    info = expect_info(discover(tmp_path, ASCEND_HOME_PATH=root, ACL_EMU_CANN_VERSION=emulated))
    assert info["backend"] == "emulator" and info["emulator_version"] == "fake-canary 0.0"
    assert (info["cann_version"], info["cann_version_source"]) == expected


ASK_BUNDLED = PRELUDE + textwrap.dedent("""
    import acl_swiglu
    from acl_swiglu import _loader
    info = acl_swiglu.backend_info()
    print(RESULT + json.dumps({"info": info.as_dict(),
                               "has_function": hasattr(_loader.libraries().runtime, "aclsysGetCANNVersion")}))
""")


@pytest.mark.parametrize("emulated", [None, "9.2.0-beta.1"])
def test_the_bundled_emulator_is_asked_when_it_has_the_function(tmp_path, emulated):
    result = run_child(ASK_BUNDLED, child_env(ACL_SWIGLU_BACKEND="emulator", ACL_EMU_CANN_VERSION=emulated), tmp_path)
    info = result["info"]
    if result["has_function"]:
        assert (info["cann_version"], info["cann_version_source"]) == (emulated or "9.2.0", "aclsysGetCANNVersion")
    else:   # an emulator built before it answered: nothing to report, and no file is read for it
        assert (info["cann_version"], info["cann_version_source"], info["cann_version_file"]) == (None, None, None)
    assert info["emulator_version"].startswith("acl-swiglu-emulator")


VERSIONS = PRELUDE + textwrap.dedent("""
    import importlib, platform
    if os.environ.get("IMPORT_TORCH"):
        import torch
    import numpy
    import acl_swiglu
    info = acl_swiglu.backend_info()
    print(RESULT + json.dumps({"info": info.as_dict(), "text": str(info), "torch_imported": "torch" in sys.modules,
                               "expected": {"package_version": acl_swiglu.__version__,
                                            "python_version": platform.python_version(),
                                            "numpy_version": numpy.__version__,
                                            "torch_version": sys.modules["torch"].__version__
                                            if "torch" in sys.modules else None}}))
""")


def test_backend_info_reports_the_versions_a_bug_report_needs_and_never_imports_torch(tmp_path):
    result = run_child(VERSIONS, child_env(ACL_SWIGLU_BACKEND="emulator"), tmp_path)
    info, expected = result["info"], result["expected"]
    assert result["torch_imported"] is False
    assert {key: info[key] for key in expected} == expected
    assert expected["torch_version"] is None and expected["package_version"]
    assert f"Python {expected['python_version']}" in result["text"]
    assert f"NumPy {expected['numpy_version']}" in result["text"]


def test_backend_info_reports_torchs_version_when_torch_is_imported(tmp_path):
    pytest.importorskip("torch")
    result = run_child(VERSIONS, child_env(ACL_SWIGLU_BACKEND="emulator", IMPORT_TORCH="1"), tmp_path)
    assert result["info"]["torch_version"] == result["expected"]["torch_version"] is not None
    assert f"torch {result['expected']['torch_version']}" in result["text"]


def test_in_this_process_the_versions_match_the_interpreter():
    import numpy

    import acl_swiglu

    info = acl_swiglu.backend_info()
    assert info.python_version == platform.python_version()
    assert info.numpy_version == numpy.__version__
    assert info.package_version == acl_swiglu.__version__
    assert info.torch_version == (sys.modules["torch"].__version__ if "torch" in sys.modules else None)
