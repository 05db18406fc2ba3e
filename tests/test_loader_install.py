"""What a new user trips on (docs/loading.md, "Installs"): the compiled files of an editable install,
running from the source checkout, warnings that point at the user's own line, and messages that name
the command-line option the user gave rather than the variable it set.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import venv
import warnings
from pathlib import Path

import pytest

import acl_swiglu
from acl_swiglu import _loader
from acl_swiglu.errors import AclSwigluWarning, ConfigurationError
from loader_cases import PRELUDE, STANDARD, child_env, make_root, no_default_roots, run_child

CHECKOUT = Path(__file__).resolve().parent.parent


# ---- the package's own compiled files ----


def test_package_native_file_finds_the_installed_files():
    helper = _loader.package_native_file("_native/libaclswiglu_hotpath.so")
    runtime = _loader.package_native_file("_emulator/lib64/libascendcl.so")
    package = Path(acl_swiglu.__file__).resolve().parent
    assert helper is not None and Path(helper).is_file() and Path(helper).name == "libaclswiglu_hotpath.so"
    assert runtime is not None and Path(runtime).parent.parent == Path(_loader.EMULATOR_ROOT)
    assert Path(helper).resolve().is_relative_to(package)
    assert _loader.package_native_file("_native/libnothing.so") is None


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x.so", "_native/../../x.so", "_native//x.so", ""])
def test_package_native_file_refuses_paths_outside_the_package(bad):
    with pytest.raises(ValueError, match="not a path inside the package"):
        _loader.package_native_file(bad)


def _installed_editable() -> bool:
    from importlib import metadata

    try:
        record = json.loads(metadata.distribution("acl-swiglu").read_text("direct_url.json") or "{}")
    except metadata.PackageNotFoundError:
        return False
    return bool(record.get("dir_info", {}).get("editable"))


SOURCE_CHECKOUT = PRELUDE + textwrap.dedent("""
    import acl_swiglu
    try:
        info = acl_swiglu.backend_info()
        out = {"package": os.path.dirname(acl_swiglu.__file__), "runtime": info.runtime}
    except Exception as exc:
        out = {"package": os.path.dirname(acl_swiglu.__file__), "error": error(exc)}
    print(RESULT + json.dumps(out))
""")


def test_running_from_the_source_checkout_explains_what_happened(installed):
    """`python -c ...` from the repository root imports the checkout (the current directory comes
    first on sys.path), which has no compiled emulator: the error says why and what to do."""
    result = run_child(SOURCE_CHECKOUT, child_env(ACL_SWIGLU_BACKEND="emulator"), CHECKOUT)
    assert Path(result["package"]).resolve() == CHECKOUT / "acl_swiglu"
    if _installed_editable():   # an editable install of this checkout finds its compiled files
        assert "error" not in result and result["runtime"].endswith("libascendcl.so")
        return
    err = result["error"]
    assert err["type"] == "LibraryNotFoundError"
    message = err["message"]
    assert f"imported from {CHECKOUT / 'acl_swiglu'}, a source checkout" in message
    assert f"the installed copy in {Path(installed['package'])}" in message
    assert "Run from another directory" in message and "pip install -e ." in message


def _venv_python(where: Path) -> Path:
    venv.EnvBuilder(with_pip=True, symlinks=True).create(where)
    return where / "bin" / "python"


def _copy_checkout(to: Path) -> Path:
    """The tracked files of this checkout as they are now (git ls-files), else all but builds."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=CHECKOUT, capture_output=True)
    if listed.returncode == 0 and listed.stdout:
        for name in listed.stdout.decode().split("\0"):
            if name and (CHECKOUT / name).is_file():
                (to / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(CHECKOUT / name, to / name)
    else:
        shutil.copytree(CHECKOUT, to, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("build", "build-*", ".git", "wheelhouse", "__pycache__"))
    return to


@pytest.mark.slow
def test_an_editable_install_finds_its_compiled_files_and_runs_the_sample(tmp_path):
    """`pip install -e .`: scikit-build-core installs the compiled files into site-packages and the
    Python files load from the source tree; the loader finds them either way (from another
    directory, and from the checkout's root)."""
    checkout = _copy_checkout(tmp_path / "checkout")
    python = _venv_python(tmp_path / "venv")
    env = child_env()
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", str(checkout)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    sample = tmp_path / "venv" / "bin" / "acl-swiglu-sample"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for cwd in (elsewhere, checkout):
        run = subprocess.run([str(sample), "--tokens", "8", "--hidden", "16"], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"from {cwd}:\n{run.stdout}\n{run.stderr}"
        assert run.stdout.startswith("backend: CPU emulator") and "verdict: PASS" in run.stdout, run.stdout
    where = subprocess.run([str(python), "-c", "import acl_swiglu, json; from acl_swiglu import _loader; "
                            "print(json.dumps([acl_swiglu.__file__, _loader.package_native_file("
                            "'_native/libaclswiglu_hotpath.so'), _loader.EMULATOR_ROOT]))"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    module, helper, emulator_root = json.loads(where.stdout)
    site = tmp_path / "venv" / "lib"
    assert Path(module).resolve().is_relative_to(checkout.resolve())       # Python files: the source tree
    assert Path(helper).resolve().is_relative_to(site.resolve())           # compiled files: site-packages
    assert Path(emulator_root).resolve().is_relative_to(site.resolve())


# ---- warnings point at the caller's line ----


def test_a_warning_points_at_the_callers_line(monkeypatch):
    monkeypatch.setattr(_loader, "_declaration", _loader._Declaration(2, "/r/include/h.h", "/r/include/h.h", 2))
    monkeypatch.setattr(_loader, "_override_warned", set())
    monkeypatch.setenv("ACL_SWIGLU_ABI", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        assert acl_swiglu.abi_revision() == 1
    assert len(caught) == 1
    assert issubclass(caught[0].category, AclSwigluWarning) and issubclass(caught[0].category, RuntimeWarning)
    assert "ACL_SWIGLU_ABI=1 overrides ABI revision 2 declared by /r/include/h.h" in str(caught[0].message)
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


CALLER = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import acl_swiglu
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if sys.argv[1] == "info":
            acl_swiglu.backend_info()                                   # the info call
        else:
            acl_swiglu.swiglu_group_quant_grad(np.ones((2, 4), np.float32), np.ones((2, 8), np.float32))  # the operator call
    print("RESULT:" + json.dumps([{"category": w.category.__name__, "file": w.filename, "line": w.lineno,
                                   "message": str(w.message)} for w in caught]))
""")


@pytest.mark.parametrize("call,comment", [("info", "# the info call"), ("call", "# the operator call")])
def test_the_fallback_and_trust_warnings_point_at_the_callers_line(tmp_path, fake_libs, installed, call, comment):
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    line = next(n for n, text in enumerate(CALLER.splitlines(), 1) if text.endswith(comment))
    scenarios = {}
    if no_default_roots():
        scenarios["fallback"] = child_env()
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    (root / "lib64/libopapi.so").chmod(0o666)
    if call == "info":   # (the fake CANN cannot run a call)
        scenarios["trust"] = child_env(ASCEND_HOME_PATH=root, ACL_SWIGLU_TRUST_LIBS="1")
    assert scenarios
    for name, env in scenarios.items():
        done = subprocess.run([sys.executable, str(script), call], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        caught = json.loads(done.stdout.split("RESULT:", 1)[1])
        assert len(caught) == 1, (name, caught)
        assert caught[0]["category"] == "AclSwigluWarning", (name, caught)
        assert (caught[0]["file"], caught[0]["line"]) == (str(script), line), (name, caught)


# ---- messages name what the user set ----


NAMED = PRELUDE + textwrap.dedent("""
    import acl_swiglu
    from acl_swiglu import _loader
    options = json.loads(os.environ["OPTIONS"])
    try:
        with _loader.settings_named(options):
            acl_swiglu.backend_info()
        out = {"error": None}
    except Exception as exc:
        out = {"error": error(exc)}
    out["after"] = _loader.setting_text("ACL_SWIGLU_BACKEND", "cann")
    print(RESULT + json.dumps(out))
""")


def test_messages_name_the_command_line_option_that_was_given(tmp_path):
    if not no_default_roots():
        pytest.skip("a default CANN root exists here, so ACL_SWIGLU_BACKEND=cann finds a CANN")
    given = run_child(NAMED, child_env(ACL_SWIGLU_BACKEND="cann", OPTIONS='{"ACL_SWIGLU_BACKEND": "--backend"}'),
                      tmp_path)
    message = given["error"]["message"]
    assert message.startswith("--backend cann but no CANN was found") and "use --backend emulator" in message
    assert "ACL_SWIGLU_BACKEND" not in message
    assert given["after"] == "ACL_SWIGLU_BACKEND=cann"   # the naming ends with the block
    plain = run_child(NAMED, child_env(ACL_SWIGLU_BACKEND="cann", OPTIONS="{}"), tmp_path)["error"]["message"]
    assert plain.startswith("ACL_SWIGLU_BACKEND=cann but no CANN was found")
    assert "set ACL_SWIGLU_BACKEND=emulator" in plain


def test_revision_messages_name_the_option_too(monkeypatch):
    with _loader.settings_named({"ACL_SWIGLU_ABI": "--abi"}):
        with pytest.raises(ConfigurationError, match=r"^--abi '3' is not an ABI revision"):
            _loader.parse_revision("ACL_SWIGLU_ABI", "3")
        monkeypatch.setattr(_loader, "_declaration", _loader._Declaration(1, "/r/h.h", "/r/h.h", 1))
        monkeypatch.setattr(_loader, "_override_warned", set())
        monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
        with pytest.warns(AclSwigluWarning) as caught:
            acl_swiglu.abi_revision()
    text = str(caught[0].message)
    assert "--abi 2 overrides ABI revision 1 declared by /r/h.h" in text and "Leave out --abi to follow" in text
    with pytest.raises(ConfigurationError, match=r"^ACL_SWIGLU_ABI='3' is not an ABI revision"):
        _loader.parse_revision("ACL_SWIGLU_ABI", "3")
