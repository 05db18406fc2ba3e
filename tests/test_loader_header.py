"""Which ABI revision a CANN's operator header declares, and the warning when ACL_SWIGLU_ABI
disagrees with it (pure functions of the loader: nothing is loaded here)."""

import os
import platform
import warnings

import pytest

from acl_swiglu import _loader
from acl_swiglu._loader import BackendInfo, find_operator_header, header_abi
from acl_swiglu.errors import ConfigurationError

REVISION_1 = """aclnnStatus aclnnSwigluGroupQuantGradGetWorkspaceSize(
    const aclTensor *gradY, const aclTensor *x, const aclTensor *weightOptional,
    const aclTensor *yOriginOptional, const aclIntArray *groupIndexOptional, double clampLimit,
    const aclTensor *gradXOut, const aclTensor *gradWeightOutOptional, uint64_t *workspaceSize,
    aclOpExecutor **executor);
"""
REVISION_2 = REVISION_1.replace("const aclIntArray *groupIndexOptional", "const aclTensor *groupIndexOptional")


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)
    return str(path)


def test_header_abi_reads_the_group_index_type(tmp_path):
    assert header_abi(_write(tmp_path / "r1.h", REVISION_1)) == 1
    assert header_abi(_write(tmp_path / "r2.h", REVISION_2)) == 2
    assert header_abi(_write(tmp_path / "other.h", "int unrelated(void);")) is None
    assert header_abi(str(tmp_path / "missing.h")) is None


def test_the_project_header_is_revision_2():
    root = os.path.join(os.path.dirname(__file__), "..", "native", "include", "aclnnop", _loader.HEADER_NAME)
    assert header_abi(root) == 2


def test_header_found_in_root_arch_dir_or_beside_a_custom_operator(tmp_path):
    root = tmp_path / "cann"
    operator = str(root / "lib64" / "libopapi.so")
    assert find_operator_header(str(root), operator) is None
    arch = _write(root / f"{platform.machine()}-linux" / "include" / "aclnnop" / _loader.HEADER_NAME, REVISION_1)
    assert find_operator_header(str(root), operator) == arch
    direct = _write(root / "include" / "aclnnop" / _loader.HEADER_NAME, REVISION_2)
    assert find_operator_header(str(root), operator) == direct
    custom = tmp_path / "vendors" / "mine" / "op_api"
    custom_header = _write(custom / "include" / _loader.HEADER_NAME, REVISION_1)
    assert find_operator_header(None, str(custom / "lib" / "libcust_opapi.so")) == custom_header


def _info(header, header_revision):
    return BackendInfo("cann", "auto", "/r", "/r/lib64/libascendcl.so", "/r/lib64/libnnopbase.so",
                       "/r/lib64/libopapi.so", (), None, header, header_revision,
                       abi_declared=header_revision, abi_declared_by=header)


def test_setting_that_overrides_the_header_warns_and_agreeing_is_silent(monkeypatch):
    # The header's revision is used; ACL_SWIGLU_ABI overrides it, saying so (a deliberate change:
    # the header no longer only produces advice).
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    with pytest.warns(RuntimeWarning, match="ACL_SWIGLU_ABI=2 overrides ABI revision 1 declared by /r/include"):
        _loader._warn_abi_mismatch(_info("/r/include/aclnnop/h.h", 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monkeypatch.setenv("ACL_SWIGLU_ABI", "1")
        _loader._warn_abi_mismatch(_info("/r/include/aclnnop/h.h", 1))   # agrees: silent
        monkeypatch.delenv("ACL_SWIGLU_ABI")
        _loader._warn_abi_mismatch(_info("/r/include/aclnnop/h.h", 1))   # unset: the header wins, silent
        monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
        _loader._warn_abi_mismatch(_info(None, None))                    # no header: silent
    assert "declares ABI revision 1" in str(_info("/r/h.h", 1))


def test_abi_source_names_the_variable_the_header_or_the_default(monkeypatch):
    monkeypatch.setenv("ACL_SWIGLU_ABI", " 1\t")
    assert _info("/r/h.h", 2).abi_source == "ACL_SWIGLU_ABI"
    monkeypatch.setenv("ACL_SWIGLU_ABI", "  ")            # blank counts as unset
    assert _info("/r/h.h", 1).abi_source == "/r/h.h"
    assert _info(None, None).abi_source == "default"


@pytest.mark.parametrize("text,expected", [
    (None, None), ("", None), (" \t\n\r\v\f", None), ("1", 1), ("2", 2), (" 2", 2), ("1\n", 1),
    ("\v2\f", 2), ("\t1 ", 1)])
def test_revision_setting_strips_ascii_blanks(text, expected):
    assert _loader.parse_revision("ACL_SWIGLU_ABI", text) == expected


@pytest.mark.parametrize("text", ["3", "0", "01", "1.0", "2 2", "+1", "\u00a02", "two", "1\x00"])
def test_revision_setting_refuses_anything_else_naming_variable_and_value(text):
    with pytest.raises(ConfigurationError) as info:
        _loader.parse_revision("ACL_EMU_ABI", text)
    assert "ACL_EMU_ABI" in str(info.value) and repr(text) in str(info.value)


def test_abi_revision_follows_the_variable_between_calls(monkeypatch):
    import acl_swiglu

    for value, expected in (("1", 1), ("2", 2), (" 1\n", 1), ("2", 2)):
        monkeypatch.setenv("ACL_SWIGLU_ABI", value)
        assert acl_swiglu.abi_revision() == expected
    monkeypatch.setenv("ACL_SWIGLU_ABI", "3")
    for _ in range(2):   # a bad value is refused at every call, never remembered as valid
        with pytest.raises(ConfigurationError, match="ACL_SWIGLU_ABI='3'"):
            acl_swiglu.abi_revision()
    monkeypatch.delenv("ACL_SWIGLU_ABI")
    assert acl_swiglu.abi_revision() == (acl_swiglu.backend_info().abi_declared or 2)
