"""Test setup: the emulator backend unless a device run is asked for, and a check after every
test that it left no live native handle behind."""

import gc
import os

import pytest

DEVICE_RUN = os.environ.get("ACL_SWIGLU_BACKEND", "").lower() == "cann"
if not DEVICE_RUN:
    os.environ["ACL_SWIGLU_BACKEND"] = "emulator"


def pytest_collection_modifyitems(config, items):
    skip_device = pytest.mark.skip(reason="needs a real Ascend 950 device: run with ACL_SWIGLU_BACKEND=cann on an "
                                          "Ascend host (see README, 'Running the device tests')")
    skip_emulator_only = pytest.mark.skip(reason="emulator-only behaviour (fault injection, live counts, "
                                                 "strictness checks) cannot run against real CANN")
    for item in items:
        if item.get_closest_marker("device") is not None and not DEVICE_RUN:
            item.add_marker(skip_device)
        if item.get_closest_marker("emulator_only") is not None and DEVICE_RUN:
            item.add_marker(skip_emulator_only)


def _live_counts():
    from acl_swiglu import emulator
    return emulator.live_counts()


@pytest.fixture(autouse=True)
def no_leaked_handles(request):
    """Fails a test that leaves live tensors, int arrays, executors, streams or device memory."""
    yield
    if DEVICE_RUN or request.node.get_closest_marker("allow_live_handles") is not None:
        return
    from acl_swiglu import _loader
    if _loader.loaded() is None:
        return   # the test never loaded the libraries
    import acl_swiglu
    gc.collect()
    acl_swiglu.release_cached()
    counts = _live_counts()
    leaked = {kind: n for kind, n in counts.items() if n}
    assert not leaked, f"test left live native handles behind: {leaked}"


@pytest.fixture
def abi(request, monkeypatch):
    """The operator ABI revision under test (1 or 2; parametrise indirectly, default 2), set for
    both the Python layer and the emulator."""
    value = int(getattr(request, "param", 2))
    monkeypatch.setenv("ACL_SWIGLU_ABI", str(value))
    import acl_swiglu
    assert acl_swiglu.abi_revision() == value
    return value
