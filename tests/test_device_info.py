"""The device's vector-core count as the release guards see it (acl_swiglu._device_info): asked
with aclGetDeviceCapability, then aclrtGetDeviceInfo, else the largest part of the Ascend 950
family; the device's answer kept per device."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from acl_swiglu import _device_info, _ffi, emulator
from acl_swiglu._device_info import ASSUMED_VECTOR_CORES, CoreCount

CAPABILITY = "aclGetDeviceCapability(ACL_DEVICE_INFO_VECTOR_CORE_NUM)"
DEVICE_INFO = "aclrtGetDeviceInfo(ACL_DEV_ATTR_VECTOR_CORE_NUM)"


@pytest.fixture
def fresh():
    """No answer kept from an earlier test, and none left for the next."""
    _device_info.forget()
    yield
    _device_info.forget()


def test_the_emulated_device_answers_and_the_answer_is_kept(fresh):
    first = _device_info.vector_cores(0)
    assert first == (56, CAPABILITY) and first.from_device
    assert first.describe() == f"56 vector cores (from {CAPABILITY})"
    # kept: later questions do not reach the runtime (a fault would show)
    with emulator.inject_faults("aclGetDeviceCapability:1:507000,aclrtGetDeviceInfo:1:507000"):
        assert _device_info.vector_cores(0) is first
        assert emulator.faults_injected() == 0
    assert _device_info.current_vector_cores() is first   # the calling thread's device is 0


@pytest.mark.emulator_only
def test_a_failing_capability_query_falls_back_to_the_device_info_query(fresh):
    with emulator.inject_faults("aclGetDeviceCapability:1:507000"):
        answer = _device_info.vector_cores(0)
    assert answer == (56, DEVICE_INFO)
    assert _ffi.api().get_message() is None   # the failure's text was read, not left for the next error


@pytest.mark.emulator_only
def test_when_neither_query_answers_the_largest_part_is_assumed_and_not_kept(fresh):
    with emulator.inject_faults("aclGetDeviceCapability:1:507000,aclrtGetDeviceInfo:1:107000"):
        answer = _device_info.vector_cores(0)
    assert answer.cores == ASSUMED_VECTOR_CORES == 72 and not answer.from_device
    assert answer.source == ("assumed: the largest Ascend 950 part; the runtime's aclGetDeviceCapability and "
                             "aclrtGetDeviceInfo gave no vector-core count")
    assert answer.describe().startswith("72 vector cores (assumed: the largest")
    assert _device_info.vector_cores(0) == (56, CAPABILITY)   # asked again, and answered


def test_a_runtime_without_either_query(fresh, monkeypatch):
    raw = _ffi.api().raw
    monkeypatch.setattr(raw, "aclGetDeviceCapability", None)
    monkeypatch.setattr(raw, "aclrtGetDeviceInfo", None)
    answer = _device_info.vector_cores(0)
    assert answer == (72, "assumed: the largest Ascend 950 part; the runtime has neither aclGetDeviceCapability "
                          "nor aclrtGetDeviceInfo")


def test_the_count_is_the_family_largest_when_the_runtime_cannot_be_reached(fresh, monkeypatch):
    from acl_swiglu import runtime

    def unreachable():
        raise OSError("no runtime here")

    monkeypatch.setattr(runtime, "runtime_api", unreachable)
    answer = _device_info.vector_cores(0)
    assert answer.cores == 72 and "could not be asked (OSError: no runtime here)" in answer.source
    assert _device_info.current_vector_cores().cores == 72


def test_a_core_count_is_a_pair():
    count, source = CoreCount(8, DEVICE_INFO)
    assert (count, source) == (8, DEVICE_INFO)
    assert not CoreCount(72, "assumed: x").from_device


DEVICES_CHILD = """
import json
from acl_swiglu import _device_info
print("CORES:" + json.dumps([list(_device_info.vector_cores(d)) for d in (0, 1, 2)]))
"""


@pytest.mark.emulator_only
@pytest.mark.parametrize("cores", ["8", "16", "64", "72"])
def test_every_part_of_the_family_reports_its_own_count(cores, tmp_path):
    env = dict(os.environ, ACL_EMU_VECTOR_CORES=cores, ACL_EMU_DEVICES="2")
    proc = subprocess.run([sys.executable, "-c", DEVICES_CHILD], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answers = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("CORES:"))[6:])
    assert answers[0] == answers[1] == [int(cores), CAPABILITY]
    # device 2 does not exist: neither query answers for it
    assert answers[2][0] == 72 and answers[2][1].startswith("assumed")
