"""Test setup: the emulator backend unless a device run is asked for, a check after every test
that it left no live native handle behind, and the native build of tests/test_native.py started
as soon as the session knows it will run."""

import gc
import os
import subprocess
import sys
import tempfile

import pytest

from loader_cases import build_fake_libs, find_installed

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


NO_DEVICE_RUN = ("the selected tests all need a real Ascend 950 device, and ACL_SWIGLU_BACKEND is not 'cann', so "
                 "every one would be skipped. On an Ascend host: `source <CANN root>/set_env.sh`, then "
                 "`ACL_SWIGLU_BACKEND=cann pytest -m device -rs` (README, 'Running the device tests').")


def _check_the_device_run(items):
    """One early, clear error instead of a failure (or a skip) per device test: a device run
    that finds no CANN, and a run of device tests only that is not a device run."""
    device_tests = [item for item in items if item.get_closest_marker("device") is not None]
    if not device_tests:
        return
    if not DEVICE_RUN:
        if len(device_tests) == len(items):
            pytest.exit(NO_DEVICE_RUN, returncode=pytest.ExitCode.USAGE_ERROR)
        return
    # Asked of a child interpreter, so that this process loads nothing before its tests do (run
    # from elsewhere than the clone's root, whose sources are not the installed package).
    probe = ("import acl_swiglu, sys\n"
             "try:\n    info = acl_swiglu.backend_info()\n"
             "except acl_swiglu.AclSwigluError as error:\n    sys.exit(f'error: {error}')\n"
             "print(info.backend, info.root)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            cwd=tempfile.gettempdir())
    if result.returncode != 0:
        error = result.stderr.strip().removeprefix("error: ")
        pytest.exit(f"ACL_SWIGLU_BACKEND=cann, but the CANN libraries cannot be loaded, so none of the "
                    f"{len(device_tests)} device tests can run:\n{error}", returncode=pytest.ExitCode.USAGE_ERROR)
    backend, _, root = result.stdout.strip().partition(" ")
    if backend != "cann":
        pytest.exit(f"ACL_SWIGLU_BACKEND=cann, but the {backend} backend was loaded ({root})",
                    returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_collection_finish(session):
    """tests/test_native.py's build and ctest start now, beside the tests that run before it
    (tests/native_build.py); a device run checks first that it has a device."""
    if session.config.option.collectonly:
        return
    _check_the_device_run(session.items)
    if any(item.path.name == "test_native.py" for item in session.items):
        import native_build
        native_build.start()


def pytest_sessionfinish(session):
    native_build = sys.modules.get("native_build")
    if native_build is not None:
        native_build.stop()


def _live_counts():
    from acl_swiglu import emulator
    return emulator.live_counts()


@pytest.fixture(scope="module", autouse=True)
def cheap_garbage_collection():
    """The leak check below may run gc.collect() after every test, and a full collection walks
    the whole heap (torch, numpy, hypothesis and pytest's own objects: hundreds of ms on a loaded
    machine). Objects that exist when a module starts are frozen out of the collector's walk for
    the module's duration; everything the module's tests create is collected as usual. Freezing
    can only keep more alive, so it never hides a leak from the check."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _leaked_after_release():
    import acl_swiglu
    acl_swiglu.release_cached()
    return {kind: n for kind, n in _live_counts().items() if n}


@pytest.fixture(autouse=True)
def no_leaked_handles(request):
    """Fails a test that leaves live tensors, int arrays, executors, streams or device memory."""
    yield
    if DEVICE_RUN or request.node.get_closest_marker("allow_live_handles") is not None:
        return
    from acl_swiglu import _loader
    if _loader.loaded() is None:
        return   # the test never loaded the libraries
    # A collection only ever frees handles, so when nothing is live without one there is nothing
    # for it to find; otherwise collect (garbage cycles, e.g. a frame kept by a caught exception's
    # traceback, release their handles through finalizers) and count again.
    leaked = _leaked_after_release()
    if leaked:
        gc.collect()
        leaked = _leaked_after_release()
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


# ---- the loader tests' fake CANN libraries and the installed package (tests/loader_cases.py) ----


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory):
    return build_fake_libs(tmp_path_factory)


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    return find_installed(tmp_path_factory)


@pytest.fixture
def cann_9_1(monkeypatch):
    """The loaded CANN is 9.1.0 (as the loader records it from the install's version file)."""
    import acl_swiglu
    from acl_swiglu import _releases

    acl_swiglu.backend_info()   # loaded first: the loader's own record must not undo ours
    monkeypatch.setattr(_releases, "_installed_release", "9.1.0")

