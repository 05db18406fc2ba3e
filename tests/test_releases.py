"""The installed CANN version (read from fake roots laid out like the older ascend-toolkit/<v> and the
newer cann-<v> installs) and what is known about the releases of docs/cann_releases.md."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from acl_swiglu import _releases
from acl_swiglu._releases import (AIV_CORES_950, ReleaseLimitationError, check_call, check_group_index, host_trunc,
                                  is_affected, read_install_version)
from acl_swiglu.errors import ArgumentError
from test_loader import STANDARD, child_env, discover, expect_info, fake_libs, make_root, runtime_warnings  # noqa: F401

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


@pytest.mark.parametrize("version,affected", [
    ("9.1.0", True), ("9.2.0-beta.1", True), ("9.2.0-BETA.1", True), (" v9.1.0 ", True),
    ("9.2.0-beta.2", False), ("9.2.0", False), ("9.1.1", False), ("8.0.RC2", False), (None, False)])
def test_affected_releases(version, affected):
    assert is_affected(version) is affected


@pytest.mark.parametrize("version", ["9.1.0", "9.2.0-beta.1"])
def test_the_hang_is_refused_naming_the_release_and_the_fix(version):
    for trunc, tokens in ((1, 100), (AIV_CORES_950 - 1, 100), (3, 4)):
        with pytest.raises(ReleaseLimitationError) as info:
            check_call(trunc, tokens, version)
        text = str(info.value)
        assert isinstance(info.value, ArgumentError)
        assert f"CANN {version}" in text and "hangs the device" in text and "9.2.0-beta.2" in text
        assert f"trunc = {trunc} of T = {tokens}" in text
    # Safe on these releases: no truncation at all, trunc = 0, or trunc at least min(T, cores).
    for trunc, tokens in ((0, 100), (AIV_CORES_950, 100), (100, 100), (4, 4), (0, 0)):
        check_call(trunc, tokens, version)


@pytest.mark.parametrize("version", ["9.2.0-beta.2", "9.2.0", None])
def test_other_releases_and_the_emulator_are_not_limited(version):
    check_call(1, 100, version)


def test_trunc_from_host_counts_wraps_like_the_operator():
    assert host_trunc([2, 3], 100) == 5
    assert host_trunc(np.array([-1, 2], np.int64), 100) == 1          # -1 is 2**32 - 1 as uint32
    assert host_trunc([2**32 + 1], 100) == 1
    assert host_trunc([], 100) == 0
    assert host_trunc([70, 70], 100) == 100
    with pytest.raises(ReleaseLimitationError):
        check_group_index(np.array([2**32 + 1], np.int64), 100, "9.1.0")
    check_group_index(np.array([2**32], np.int64), 100, "9.1.0")      # wraps to 0: no hang
    check_group_index(None, 100, "9.1.0")
    check_group_index(np.array([1], np.int64), 100, "9.2.0")


def test_the_loaded_release_is_the_default(monkeypatch):
    # Without a version argument the loaded backend's is used: the emulator has none.
    import acl_swiglu

    assert acl_swiglu.backend_info().cann_version is None
    check_call(1, 100)
    monkeypatch.setattr(_releases, "_installed_release", "9.1.0")
    with pytest.raises(ReleaseLimitationError):
        check_call(1, 100)


def test_warning_once_per_release(monkeypatch):
    monkeypatch.setattr(_releases, "_warned", set())
    monkeypatch.setattr(_releases, "_installed_release", None)
    with pytest.warns(RuntimeWarning) as caught:
        _releases.record_install("9.1.0")
        _releases.record_install("9.1.0")
        _releases.record_install("9.2.0-beta.1")
    texts = [str(w.message) for w in caught]
    assert len(texts) == 2
    assert "CANN 9.1.0" in texts[0] and "weight must also have grad_y's rank" in texts[0]
    assert "CANN 9.2.0-beta.1" in texts[1] and "weight must" not in texts[1]
    for text in texts:
        assert "hangs the device" in text and "Upgrade to CANN 9.2.0-beta.2 or later" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _releases.record_install("9.2.0")
        _releases.record_install(None)


# ---- through the loader and the CLI, on fake roots ----


@pytest.mark.parametrize("version,warned", [("9.1.0", True), ("9.2.0-beta.1", True), ("9.2.0", False)])
def test_backend_info_reports_the_version_and_warns_once_on_known_releases(tmp_path, fake_libs, version, warned):
    root = make_root(tmp_path / f"cann-{version}", fake_libs, dict(
        STANDARD, **{"share/info/ops_nn/version.info": f"Version={version}\n".encode()}))
    result = discover(tmp_path, ASCEND_HOME_PATH=root)
    info = expect_info(result)
    assert info["cann_version"] == version
    assert info["cann_version_file"] == str(root / "share/info/ops_nn/version.info")
    messages = [w["message"] for w in runtime_warnings(result) if "hangs the device" in w["message"]]
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


def test_the_emulator_reports_its_own_version():
    import acl_swiglu

    info = acl_swiglu.backend_info()
    assert info.backend == "emulator" and info.cann_version is None
    assert info.version == info.emulator_version and info.emulator_version.startswith("acl-swiglu-emulator")


# ---- the check in the call path: host counts are checked right after validation ----

TOKENS, HIDDEN = 8, 4   # T = 8 < 56 AI cores: the hang needs 0 < trunc < 8


def _problem(rows: int = TOKENS):
    rng = np.random.default_rng(11)
    gy = rng.uniform(-1, 1, (rows, HIDDEN)).astype(np.float32)
    x = rng.uniform(-2, 2, (rows, 2 * HIDDEN)).astype(np.float32)
    return gy, x


@pytest.fixture
def cann_9_1(monkeypatch):
    """The loaded CANN is 9.1.0 (as the loader records it from the install's version file)."""
    import acl_swiglu

    acl_swiglu.backend_info()   # loaded first: the loader's own record must not undo ours
    monkeypatch.setattr(_releases, "_installed_release", "9.1.0")


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
    with pytest.raises(ReleaseLimitationError, match=f"= {AIV_CORES_950} hangs the device"):
        acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=np.array([AIV_CORES_950 - 1], np.int64))
    grad_x, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=np.array([AIV_CORES_950], np.int64))
    assert not grad_x[AIV_CORES_950:].any() and grad_x[:AIV_CORES_950].any()


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
def test_revision_2_device_counts_cannot_be_seen_so_they_are_not_checked(cann_9_1, abi):
    import acl_swiglu

    gy, x = _problem()
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.to_device(np.array([3], np.int64)) as d_gi:
        grad_x, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=d_gi)
        with grad_x:
            assert grad_x.to_numpy()[:3].any() and not grad_x.to_numpy()[3:].any()


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
