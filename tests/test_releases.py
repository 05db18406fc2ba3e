"""The installed CANN version (read from fake roots laid out like the older ascend-toolkit/<v> and the
newer cann-<v> installs) and what is known about the releases of docs/cann_releases.md."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from acl_swiglu import _device_info, _releases
from acl_swiglu._releases import (ReleaseLimitationError, check_call, check_group_counts, check_group_index,
                                  check_trunc, host_trunc, is_affected, read_install_version)
from acl_swiglu.errors import AclSwigluWarning, ArgumentError
from loader_cases import STANDARD, child_env, discover, expect_info, make_root

ARCH = platform.machine() or "x86_64"

# What each install layout writes, as the packages write it.
OPS_NN = ("share/info/ops_nn/version.info", "Version=9.2.0\nversion_dir=9.2.0\ntimestamp=20260101_000000000\n")
RUNTIME = ("share/info/runtime/version.info", "Version=9.2.0-beta.2\n")
ALL_CANN = (f"{ARCH}-linux/ascend_all_cann_install.info",
            "package_name=Ascend-cann\nversion=9.1.0\ninnerversion=V100R001C26B100\narch=x\nos=linux\n")
TOOLKIT = (f"{ARCH}-linux/ascend_toolkit_install.info",
           "package_name=Ascend-cann-toolkit\nversion=8.0.RC2\ninnerversion=V100R001C18SPC001\n")
VERSION_CFG = ("version.cfg", "# version: 1.0\nruntime_running_version=[7.3.0.1.231:8.0.RC2]\n"
                              "toolkit_running_version=[7.3.0.1.231:8.0.RC3]\n")
COMPILER = ("compiler/version.info", "Version=7.3.0.1.231\n")


def write(root: Path, *files) -> Path:
    for rel, text in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize("files,version,source", [
    ((OPS_NN, RUNTIME, ALL_CANN, TOOLKIT, VERSION_CFG, COMPILER), "9.2.0", OPS_NN[0]),
    ((RUNTIME, ALL_CANN, TOOLKIT, VERSION_CFG, COMPILER), "9.2.0-beta.2", RUNTIME[0]),
    ((ALL_CANN, TOOLKIT, VERSION_CFG, COMPILER), "9.1.0", ALL_CANN[0]),
    ((TOOLKIT, VERSION_CFG, COMPILER), "8.0.RC2", TOOLKIT[0]),
    ((VERSION_CFG, COMPILER), "8.0.RC3", VERSION_CFG[0]),      # toolkit_running_version, after the colon
    ((COMPILER,), "7.3.0.1.231", COMPILER[0]),
], ids=["ops_nn", "runtime", "all_cann", "toolkit", "version.cfg", "compiler"])
def test_version_files_are_read_in_the_documented_order(tmp_path, files, version, source):
    root = write(tmp_path / "cann", *files)
    assert read_install_version(str(root)) == (version, str(root / source))


def test_no_version_file_and_unreadable_values(tmp_path):
    assert read_install_version(str(tmp_path)) == (None, None)
    assert read_install_version(None) == (None, None)
    root = write(tmp_path / "cann", ("share/info/ops_nn/version.info", "timestamp=1\nVersion=\n"),
                 (TOOLKIT[0], 'version="9.2.0-beta.1"\n'))
    assert read_install_version(str(root)) == ("9.2.0-beta.1", str(root / TOOLKIT[0]))


# ---- the release table ----


def test_the_releases_that_ship_the_operator():
    assert list(_releases.RELEASES) == ["9.1.0", "9.1.1", "9.2.0-beta.1", "9.2.0-beta.2", "9.2.0"]
    assert _releases.AFFECTED_RELEASES == ("9.1.0", "9.1.1", "9.2.0-beta.1")
    # 9.1.1 has no known fix: it is 9.1.0 again, with its driver
    assert _releases.RELEASES["9.1.1"]._replace(name="9.1.0", driver=None) == _releases.RELEASES["9.1.0"]
    assert _releases.RELEASES["9.1.1"].driver == "26.1.1"
    # 9.2.0 is 9.2.0-beta.2 and the clamp band
    final, beta2 = _releases.RELEASES["9.2.0"], _releases.RELEASES["9.2.0-beta.2"]
    assert final.clamp_off_band and not beta2.clamp_off_band and final.driver == "26.2.RC1"
    assert final._replace(name=beta2.name, clamp_off_band=False, driver=None) == beta2
    assert [r.kernel for r in _releases.RELEASES.values()] == ["9.1.0", "9.1.0", "9.1.0", "current", "current"]
    assert [r.weight_needs_rank for r in _releases.RELEASES.values()] == [True, True, False, False, False]
    assert _releases.release_info(" V9.2.0-BETA.2 ") is beta2
    assert _releases.release_info("9.3.0") is None and _releases.release_info(None) is None


@pytest.mark.parametrize("version,affected", [
    ("9.1.0", True), ("9.1.1", True), ("9.2.0-beta.1", True), ("9.2.0-BETA.1", True), (" v9.1.0 ", True),
    ("9.2.0-beta.2", False), ("9.2.0", False), ("9.3.0", False), ("8.0.RC2", False), (None, False)])
def test_affected_releases(version, affected):
    assert is_affected(version) is affected
    assert bool(_releases.known_issues(version or "")) is affected


# ---- the hang guard ----

FAMILY = (8, 16, 56, 64, 72)


@pytest.mark.parametrize("version", ["9.1.0", "9.1.1", "9.2.0-beta.1"])
@pytest.mark.parametrize("cores", FAMILY)
def test_the_hang_is_refused_exactly_below_min_t_and_the_core_count(version, cores):
    for tokens in (4, cores, cores + 1, 200):
        limit = min(tokens, cores)
        for trunc in range(0, tokens + 1):
            call = lambda: check_trunc(trunc, tokens, version=version, cores=(cores, "aclrtGetDeviceInfo(test)"))
            if 0 < trunc < limit:
                with pytest.raises(ReleaseLimitationError):
                    call()
            else:
                call()


def test_the_refusal_names_the_release_the_numbers_the_source_what_is_safe_and_the_fix():
    with pytest.raises(ReleaseLimitationError) as info:
        check_trunc(7, 100, version="9.1.1", cores=(16, "aclGetDeviceCapability(ACL_DEVICE_INFO_VECTOR_CORE_NUM)"))
    text = str(info.value)
    assert isinstance(info.value, ArgumentError)
    for fragment in ("CANN 9.1.1", "trunc = 7 of T = 100", "hangs the device",
                     "16 vector cores (from aclGetDeviceCapability(ACL_DEVICE_INFO_VECTOR_CORE_NUM))",
                     "min(100, 16) = 16", "at least 16 rows", "no group_index", "upgrade CANN to 9.2.0-beta.2"):
        assert fragment in text, (fragment, text)
    with pytest.raises(ReleaseLimitationError, match=r"72 vector cores \(assumed: the largest"):
        check_trunc(60, 100, version="9.1.0", cores=_device_info.CoreCount(72, "assumed: the largest Ascend 950 part"))
    with pytest.raises(ReleaseLimitationError, match=r"8 vector cores \(from the caller\)"):
        check_trunc(7, 100, version="9.1.0", cores=8)


@pytest.mark.parametrize("version", ["9.2.0-beta.2", "9.2.0", "9.3.0", None])
def test_other_releases_are_not_limited(version):
    check_trunc(1, 100, version=version, cores=8)
    check_group_counts([1], 100, version=version, cores=8)


def test_the_device_is_asked_only_when_a_call_could_hang():
    asked = []

    def ask():
        asked.append(1)
        return _device_info.CoreCount(8, "test")

    check_trunc(3, 100, version="9.2.0", cores=ask)       # not an affected release
    check_trunc(0, 100, version="9.1.0", cores=ask)       # trunc = 0
    check_trunc(100, 100, version="9.1.0", cores=ask)     # no truncation
    check_group_counts(None, 100, version="9.1.0", cores=ask)
    check_group_counts([3], 100, version="9.2.0", cores=ask)
    assert asked == []
    with pytest.raises(ReleaseLimitationError, match="8 vector cores"):
        check_trunc(3, 100, version="9.1.0", cores=ask)
    assert asked == [1]


def test_the_calling_threads_device_answers_and_without_an_answer_the_largest_part_is_assumed():
    # the emulator's device: 56 vector cores (ACL_EMU_VECTOR_CORES unset)
    with pytest.raises(ReleaseLimitationError,
                       match=r"56 vector cores \(from aclGetDeviceCapability\(ACL_DEVICE_INFO_VECTOR_CORE_NUM\)\)"):
        check_trunc(55, 100, version="9.1.0", cores=_device_info.current_vector_cores)
    check_trunc(56, 100, version="9.1.0", cores=_device_info.current_vector_cores)
    with pytest.raises(ReleaseLimitationError, match=r"72 vector cores \(assumed"):
        check_trunc(71, 100, version="9.1.0")   # (no count given: the largest of the family)
    check_trunc(72, 100, version="9.1.0")


def test_trunc_from_host_counts_wraps_like_the_operator():
    assert host_trunc([2, 3], 100) == 5
    assert host_trunc(np.array([-1, 2], np.int64), 100) == 1          # -1 is 2**32 - 1 as uint32
    assert host_trunc([2**32 + 1], 100) == 1
    assert host_trunc([], 100) == 0
    assert host_trunc([70, 70], 100) == 100
    with pytest.raises(ReleaseLimitationError):
        check_group_counts(np.array([2**32 + 1], np.int64), 100, version="9.1.0", cores=56)
    check_group_counts(np.array([2**32], np.int64), 100, version="9.1.0", cores=56)      # wraps to 0: no hang
    check_group_counts(None, 100, version="9.1.0", cores=56)
    check_group_counts(np.array([1], np.int64), 100, version="9.2.0", cores=56)


def test_the_earlier_forms_still_work():
    with pytest.raises(ReleaseLimitationError, match="trunc = 3 of T = 8"):
        check_call(3, 8, "9.1.0")
    check_call(8, 8, "9.1.0")
    with pytest.raises(ReleaseLimitationError, match="CANN 9.2.0-beta.1"):
        check_group_index([3], 8, "9.2.0-beta.1")
    check_group_index([3], 8, "9.2.0-beta.2")
    check_group_index(None, 8, "9.1.0")


def test_the_loaded_release_is_the_default(monkeypatch):
    monkeypatch.setattr(_releases, "_installed_release", None)
    check_call(1, 100)
    check_group_counts([1], 100)
    monkeypatch.setattr(_releases, "_installed_release", "9.1.0")
    with pytest.raises(ReleaseLimitationError):
        check_call(1, 100)
    with pytest.raises(ReleaseLimitationError):
        check_group_counts([1], 100, cores=8)
    check_group_counts([1], 100, version="9.2.0", cores=8)   # an explicit version wins


def test_warning_once_per_release(monkeypatch):
    monkeypatch.setattr(_releases, "_warned", set())
    monkeypatch.setattr(_releases, "_installed_release", None)
    with pytest.warns(AclSwigluWarning) as caught:
        _releases.record_install("9.1.0")
        _releases.record_install("9.1.0")
        _releases.record_install("9.1.1")
        _releases.record_install("9.2.0-beta.1")
    texts = [str(w.message) for w in caught]
    assert len(texts) == 3
    assert "CANN 9.1.0" in texts[0] and "weight must also have grad_y's rank" in texts[0]
    assert "CANN 9.1.1" in texts[1] and "weight must also have grad_y's rank" in texts[1]
    assert "CANN 9.2.0-beta.1" in texts[2] and "weight must" not in texts[2]
    for text in texts:
        assert "hangs the device" in text and "Upgrade to CANN 9.2.0-beta.2 or later" in text
        assert "min(T, the device's vector cores)" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _releases.record_install("9.2.0")
        _releases.record_install(None)
    assert _releases._installed_release is None


# ---- the hazard warnings ----


def _classes(found):
    return [hazard for hazard, _ in found]


@pytest.mark.parametrize("tokens,hidden,itemsize,cores,expected", [
    (57, 70, 4, 56, True),     # H % 8 != 0 and more rows than cores
    (56, 70, 4, 56, False),    # one row per core
    (57, 72, 4, 56, False),    # aligned for fp32
    (57, 72, 2, 56, True),     # not for fp16/bf16 (16)
    (57, 80, 2, 56, False),
    (9, 70, 4, None, True),    # unknown core count: the smallest part (8) is assumed
    (8, 70, 4, None, False),
    (9, 70, 4, (72, "assumed: the largest Ascend 950 part"), True),   # an assumed count is no count
    (73, 70, 4, (72, "aclrtGetDeviceInfo(ACL_DEV_ATTR_VECTOR_CORE_NUM)"), True),
    (72, 70, 4, (72, "aclrtGetDeviceInfo(ACL_DEV_ATTR_VECTOR_CORE_NUM)"), False),
])
def test_misaligned_h_with_several_rows_per_core(tokens, hidden, itemsize, cores, expected):
    found = _releases.hazards(tokens, hidden, itemsize, False, cores)
    assert _classes(found) == ([_releases.MISALIGNED_H] if expected else [])
    if expected:
        text = found[0][1]
        assert f"H = {hidden} is not a multiple of {8 if itemsize == 4 else 16}" in text
        assert f"T = {tokens} rows" in text
        assert "acl-swiglu-probe --families misaligned_h --out probe.json" in text and "docs/fidelity.md" in text


@pytest.mark.parametrize("hidden,itemsize,trunc_possible,expected", [
    (8192, 4, True, True), (8191, 4, True, False), (8192, 4, False, False),
    (16384, 2, True, True), (16383, 2, True, False)])
def test_zero_fill_with_a_wrapping_copy_length(hidden, itemsize, trunc_possible, expected):
    found = _releases.hazards(4, hidden, itemsize, trunc_possible, 56)
    assert _classes(found) == ([_releases.ZERO_FILL_WRAP] if expected else [])
    if expected:
        assert f"{2 * hidden * itemsize} bytes >= 65536" in found[0][1]
        assert "--families zero_fill_large_h" in found[0][1]


def test_offsets_past_32_bits():
    assert _classes(_releases.hazards(2**16, 2**15, 2, False, 56)) == [_releases.OFFSET_WRAP]     # exactly 2^32
    assert _releases.hazards(2**16 - 1, 2**15, 2, False, 56) == []
    text = _releases.hazards(2**16, 2**15, 2, False, 56)[0][1]
    assert "65536 x 65536 = 4294967296 elements >= 2^32" in text and "--families large_offsets --unsafe" in text
    assert _releases.hazards(0, 70, 4, True, 8) == [] and _releases.hazards(100, 0, 4, True, 8) == []
    # all three at once
    assert _classes(_releases.hazards(2**16 + 1, 2**15 + 1, 4, True, 8)) == list(_releases.HAZARD_CLASSES)


def test_hazard_warnings_once_per_class_and_never_on_the_emulator(monkeypatch):
    monkeypatch.setattr(_releases, "_hazards_warned", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _classes(_releases.warn_hazards(57, 70, 4, True, 56, emulator=True)) == [_releases.MISALIGNED_H]
        assert _releases.warn_hazards(4, 64, 4, True, 56, emulator=False) == []
    with pytest.warns(AclSwigluWarning) as caught:
        _releases.warn_hazards(57, 70, 4, True, 56, emulator=False)
        _releases.warn_hazards(100, 70, 4, True, 56, emulator=False)            # the same class again
        _releases.warn_hazards(4, 8192, 4, True, 56, emulator=False)
    texts = [str(w.message) for w in caught]
    assert len(texts) == 2
    assert "H = 70 is not a multiple of 8" in texts[0] and "rows past trunc are zero-filled" in texts[1]


# ---- through the loader and the CLI, on fake roots ----


@pytest.mark.parametrize("version,warned", [("9.1.0", True), ("9.2.0-beta.1", True), ("9.2.0", False)])
def test_backend_info_reports_the_version_and_warns_once_on_known_releases(tmp_path, fake_libs, version, warned):
    root = make_root(tmp_path / f"cann-{version}", fake_libs, dict(
        STANDARD, **{"share/info/ops_nn/version.info": f"Version={version}\n".encode()}))
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert info["cann_version"] == version
    assert info["cann_version_file"] == str(root / "share/info/ops_nn/version.info")
    messages = [w["message"] for w in result["warnings"]
                if w["category"] == "AclSwigluWarning" and "hangs the device" in w["message"]]
    assert len(messages) == (1 if warned else 0)
    if warned:
        assert f"CANN {version}" in messages[0]


def test_an_older_toolkit_layout_reports_its_version(tmp_path, fake_libs):
    root = make_root(tmp_path / "ascend-toolkit" / "8.5.0", fake_libs, dict(
        STANDARD, **{TOOLKIT[0]: b"version=8.5.0\n"}))
    info = expect_info(discover(tmp_path, ASCEND_HOME_PATH=root))
    assert (info["cann_version"], info["cann_version_file"]) == ("8.5.0", str(root / TOOLKIT[0]))


def test_an_install_without_a_version_file_says_unknown(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    info = expect_info(discover(tmp_path, ASCEND_HOME_PATH=root))
    assert info["cann_version"] is None and info["cann_version_file"] is None


def test_the_cli_prints_the_release(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(
        STANDARD, **{"share/info/ops_nn/version.info": b"Version=9.2.0\n"}))
    proc = subprocess.run([sys.executable, "-m", "acl_swiglu", "--tokens", "2", "--hidden", "2"], cwd=tmp_path,
                          env=child_env(ASCEND_HOME_PATH=root), capture_output=True, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    assert lines[1] == (f"  operator library: {root / 'lib64/libopapi.so'} "
                        f"(CANN 9.2.0, from {root / 'share/info/ops_nn/version.info'})"), proc.stdout
    # the fake runtime cannot allocate (ACL_ERROR_RT_MEMORY_ALLOCATION): the sample's exit status
    # for a device out of memory, as a real one would give
    assert proc.returncode == 5, proc.stderr


def _emulated_release() -> str:
    """What the emulator's aclsysGetCANNVersion reports (the release it stands in for)."""
    import ctypes

    from acl_swiglu import _ffi

    version = _ffi.aclCANNPackageVersion()
    assert _ffi.api().raw.aclsysGetCANNVersion(0, ctypes.byref(version)) == 0
    return version.version.decode()


def test_the_emulator_reports_its_own_version():
    import acl_swiglu

    info = acl_swiglu.backend_info()
    assert info.backend == "emulator" and info.cann_version_file is None
    # Not read from files; the release the emulator stands in for once the loader asks it
    assert info.cann_version in (None, _emulated_release())
    assert _emulated_release() == os.environ.get("ACL_EMU_CANN_VERSION") or _emulated_release() == "9.2.0"
    assert info.version == info.emulator_version and info.emulator_version.startswith("acl-swiglu-emulator")


# ---- the check in the call path: host counts are checked right after validation ----

TOKENS, HIDDEN = 8, 4   # T = 8 < 56 vector cores: the hang needs 0 < trunc < 8


def _problem(rows: int = TOKENS):
    rng = np.random.default_rng(11)
    gy = rng.uniform(-1, 1, (rows, HIDDEN)).astype(np.float32)
    x = rng.uniform(-2, 2, (rows, 2 * HIDDEN)).astype(np.float32)
    return gy, x


@pytest.mark.parametrize("abi", [1, 2], indirect=True)
@pytest.mark.parametrize("counts", [[3], [2, 5], [1, 2**32]])
def test_the_one_shot_call_refuses_the_hang_before_allocating(cann_9_1, abi, counts):
    import acl_swiglu
    from acl_swiglu import emulator

    gy, x = _problem()
    before = emulator.live_counts()
    with pytest.raises(ReleaseLimitationError) as info:
        acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=np.array(counts, np.int64))
    assert "CANN 9.1.0" in str(info.value) and "9.2.0-beta.2" in str(info.value)
    assert f"of T = {TOKENS} rows" in str(info.value)
    assert emulator.live_counts() == before


@pytest.mark.parametrize("abi", [1, 2], indirect=True)
@pytest.mark.parametrize("counts", [[0], [], [8], [5, 5], [2**32]], ids=["0", "none", "T", "beyond-T", "wraps-to-0"])
def test_the_one_shot_call_runs_when_trunc_is_0_or_at_least_min_t_cores(cann_9_1, abi, counts):
    import acl_swiglu

    gy, x = _problem()
    group_index = np.array(counts, np.int64)
    grad_x, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=group_index)
    _releases._installed_release = None   # the same call where no release limits it
    expected, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=group_index)
    assert np.array_equal(grad_x.view(np.uint32), expected.view(np.uint32))


def test_min_t_cores_is_the_limit_for_large_t(cann_9_1, monkeypatch):
    import acl_swiglu

    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    gy, x = _problem(rows=64)
    # the emulated device has 56 vector cores (ACL_EMU_VECTOR_CORES unset), and the guard asks it
    with pytest.raises(ReleaseLimitationError, match=r"56 vector cores \(from aclGetDeviceCapability.*"
                                                     r"min\(64, 56\) = 56"):
        acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=np.array([55], np.int64))
    grad_x, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=np.array([56], np.int64))
    assert not grad_x[56:].any() and grad_x[:56].any()


@pytest.mark.parametrize("abi", [1], indirect=True)
def test_revision_1_host_counts_are_checked_at_phase_1_and_plan_construction(cann_9_1, abi):
    import acl_swiglu
    from acl_swiglu import emulator

    gy, x = _problem()
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as d_gx:
        before = emulator.live_counts()
        for call in (lambda gi: acl_swiglu.get_workspace_size(d_gy, d_x, group_index=gi, grad_x=d_gx),
                     lambda gi: acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, group_index=gi, grad_x=d_gx),
                     lambda gi: acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=gi, grad_x=d_gx)):
            with pytest.raises(ReleaseLimitationError, match="CANN 9.1.0"):
                call([3])
            assert emulator.live_counts() == before
        with acl_swiglu.get_workspace_size(d_gy, d_x, group_index=[0], grad_x=d_gx) as executor:
            executor.launch()
        with acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, group_index=[TOKENS], grad_x=d_gx) as plan:
            plan(synchronize=True)
        acl_swiglu.synchronize_device()


@pytest.mark.parametrize("abi", [2], indirect=True)
def test_revision_2_device_counts_are_read_back_and_checked(cann_9_1, abi):
    """In device memory the counts can change between calls: each call on an affected release
    reads them (after their writer) and refuses a hang, the first call of a layout or a later one."""
    import acl_swiglu

    gy, x = _problem()
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.to_device(np.array([0], np.int64)) as d_gi:
        grad_x, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=d_gi)
        with grad_x:
            assert not grad_x.to_numpy().any()   # trunc 0: safe, every row zero
            d_gi.copy_from(np.array([3], np.int64))
            with pytest.raises(ReleaseLimitationError, match="trunc = 3"):
                acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=d_gi, grad_x=grad_x)


RELEASE_CALL = """
import json, sys
import numpy as np
import acl_swiglu
from acl_swiglu._releases import ReleaseLimitationError
out = {}
for counts in ([3], [0]):
    try:
        acl_swiglu.swiglu_group_quant_grad(np.ones((8, 4), np.float32), np.ones((8, 8), np.float32),
                                           group_index=np.array(counts, np.int64))
        out[str(counts)] = "ran"
    except ReleaseLimitationError as exc:
        out[str(counts)] = "refused: " + str(exc)
    except acl_swiglu.AclError as exc:   # past the check: the fake runtime cannot allocate
        out[str(counts)] = f"AclError {exc.code}"
print("RELEASE-RESULT:" + json.dumps(out))
"""


@pytest.mark.parametrize("version,refused", [("9.1.0", True), ("9.2.0", False)])
def test_a_fake_install_of_an_affected_release_refuses_the_hang(tmp_path, fake_libs, version, refused):
    root = make_root(tmp_path / f"cann-{version}", fake_libs, dict(
        STANDARD, **{"share/info/ops_nn/version.info": f"Version={version}\n".encode()}))
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", RELEASE_CALL], cwd=tmp_path,
                          env=child_env(ASCEND_HOME_PATH=root), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RELEASE-RESULT:"))
    out = json.loads(line[len("RELEASE-RESULT:"):])
    if refused:
        assert out["[3]"].startswith("refused: ") and f"CANN {version}" in out["[3]"]
    else:
        assert out["[3]"] == "AclError 207001"
    assert out["[0]"] == "AclError 207001"   # trunc = 0 is safe: the call goes on (to the fake runtime's refusal)


# ---- an emulated 9.1.0 device with 8 vector cores: the emulated hang, and the guard keeping calls from it ----

EMULATED_9_1 = """
import json
import numpy as np
import acl_swiglu
from acl_swiglu import _device_info, _releases
from acl_swiglu._releases import ReleaseLimitationError

info = acl_swiglu.backend_info()
out = {"cores": list(_device_info.vector_cores(0)), "version": [info.cann_version, info.cann_version_source]}
rng = np.random.default_rng(3)
gy = rng.uniform(-1, 1, (16, 4)).astype(np.float32)
x = rng.uniform(-2, 2, (16, 8)).astype(np.float32)

def device_call(counts):
    # revision 2: the counts live in device memory (read back by the guard on affected releases)
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \\
            acl_swiglu.to_device(np.array(counts, np.int64)) as d_gi, acl_swiglu.Stream() as stream:
        grad_x, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=d_gi, stream=stream)
        with grad_x:
            try:
                stream.synchronize()
            except acl_swiglu.AclError as exc:
                return {"code": exc.code, "name": exc.name, "message": exc.message}
            return {"rows_written": int(np.count_nonzero(np.any(grad_x.to_numpy() != 0, axis=1)))}

def guarded(call, counts):
    try:
        return call(counts)
    except ReleaseLimitationError as exc:
        return {"refused": str(exc)}

# What the emulated device does with the guard out of the way (the binding told a fixed release):
_releases.record_install("9.2.0")
out["unguarded device [3]"] = device_call([3])
# The release as the install reports it again: the guard refuses the hang, whatever the path
_releases.record_install(info.cann_version)
out["device [3]"] = guarded(device_call, [3])
out["device [8]"] = guarded(device_call, [8])
for counts in ([7], [8], [0]):
    try:
        gx, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=np.array(counts, np.int64))
        out[f"one-shot {counts}"] = {"rows_written": int(np.count_nonzero(np.any(gx != 0, axis=1)))}
    except ReleaseLimitationError as exc:
        out[f"one-shot {counts}"] = {"refused": str(exc)}
print("EMULATED:" + json.dumps(out))
"""


def test_an_emulated_9_1_0_device_with_8_cores_hangs_and_the_guard_keeps_calls_away(tmp_path):
    env = dict(os.environ, ACL_EMU_CANN_VERSION="9.1.0", ACL_EMU_VECTOR_CORES="8", ACL_SWIGLU_ABI="2")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", EMULATED_9_1], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("EMULATED:"))[9:])
    assert out["cores"] == [8, "aclGetDeviceCapability(ACL_DEVICE_INFO_VECTOR_CORE_NUM)"]
    assert out["version"] == ["9.1.0", "aclsysGetCANNVersion"]   # (asked from the runtime)
    # The emulator does what the device would not survive: the synchronisation fails, nothing is written
    hang = out["unguarded device [3]"]
    assert hang["code"] == 507034 and hang["name"] == "ACL_ERROR_RT_VECTOR_CORE_TIMEOUT", hang
    for fragment in ("CANN 9.1.0", "would hang", "trunc = 3 of T = 16", "min(T, 8 vector cores) = 8"):
        assert fragment in hang["message"], (fragment, hang["message"])
    assert "8 vector cores (from aclGetDeviceCapability" in out["device [3]"]["refused"]
    assert out["device [8]"] == {"rows_written": 8}
    # With the release known, the guard refuses the hang with the device's own core count
    refused = out["one-shot [7]"]["refused"]
    assert "8 vector cores (from aclGetDeviceCapability(ACL_DEVICE_INFO_VECTOR_CORE_NUM))" in refused
    assert "min(16, 8) = 8" in refused and "CANN 9.1.0" in refused
    assert out["one-shot [8]"] == {"rows_written": 8} and out["one-shot [0]"] == {"rows_written": 0}
