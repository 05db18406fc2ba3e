"""Each operator's library found by its own symbol (docs/loading.md, "Operators").

libraries() loads the runtime and meta libraries only; operator_library(symbol) finds, checks,
loads and keeps the library exporting that symbol (custom libcust_opapi.so first, then
libopapi_nn.so, then libopapi.so), so that an install lacking one operator still serves another;
operator_header(name, symbol) gives a checked header. Fake roots in tmp_path, children as in
loader_cases.py; the last tests use the bundled emulator in this process.
"""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

from loader_cases import FORWARD_SYMBOL, PRELUDE, STANDARD, SYMBOL, child_env, make_root, run_child

FORWARD_HEADER = "aclnn_swiglu_group_quant.h"
BACKWARD_HEADER = "aclnn_swiglu_group_quant_grad.h"
BASE = {"lib64/libascendcl.so": "ascendcl", "lib64/libnnopbase.so": "nnopbase"}

OPERATORS = PRELUDE + textwrap.dedent("""
    import acl_swiglu
    from acl_swiglu import _loader
    out = {}
    libs = _loader.libraries()
    out["mapped_after_libraries"] = mapped()
    out["libraries"] = {"runtime": marker(libs.runtime), "meta": marker(libs.meta)}
    header = os.environ.get("HEADER") or None
    out["found"] = {}
    for symbol in os.environ["SYMBOLS"].split(","):
        try:
            found = _loader.operator_library(symbol, header_name=header)
            again = _loader.operator_library(symbol)
            out["found"][symbol] = {"path": found.path, "marker": marker(found.library),
                                    "same_library": again.library is found.library,
                                    "header": found.header.path if found.header else None,
                                    "header_text": found.header.text if found.header else None}
        except Exception as exc:
            out["found"][symbol] = {"error": error(exc)}
    if header:
        text = _loader.operator_header(header, os.environ["SYMBOLS"].split(",")[0])
        out["operator_header"] = None if text is None else {"path": text.path, "text": text.text}
    out["info"] = acl_swiglu.backend_info().as_dict()
    out["maps"] = mapped()
    print(RESULT + json.dumps(out))
""")


def operators(tmp_path, symbols, header=None, **variables) -> dict:
    env = child_env(SYMBOLS=",".join(symbols), HEADER=header, **variables)
    return run_child(OPERATORS, env, tmp_path)


def test_libraries_loads_the_runtime_and_meta_without_any_operator(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(BASE, **{"lib64/libopapi.so": "both"}))
    result = operators(tmp_path, [SYMBOL], ASCEND_HOME_PATH=root)
    assert result["libraries"] == {"runtime": "ascendcl", "meta": "nnopbase"}
    assert not [p for p in result["mapped_after_libraries"] if "libopapi" in p]   # none loaded yet
    assert result["found"][SYMBOL]["path"] == str(root / "lib64/libopapi.so")
    assert str(root / "lib64/libopapi.so") in result["maps"]


def test_a_root_without_any_operator_library_still_loads(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, BASE)
    result = operators(tmp_path, [FORWARD_SYMBOL, SYMBOL], ASCEND_HOME_PATH=root)
    assert result["libraries"] == {"runtime": "ascendcl", "meta": "nnopbase"}
    for symbol in (FORWARD_SYMBOL, SYMBOL):
        err = result["found"][symbol]["error"]
        assert err["type"] == "OperatorNotFoundError" and err["library_not_found"]
        assert f"exports {symbol}" in err["message"] and str(root / "lib64/libopapi.so") in err["message"]
        assert "set_env.sh" in err["message"]
    info = result["info"]
    assert info["operators"] == {} and sorted(info["operators_missing"]) == sorted([FORWARD_SYMBOL, SYMBOL])


def test_each_operator_comes_from_the_first_library_exporting_its_own_symbol(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(BASE, **{"lib64/libopapi_nn.so": "forward",
                                                                 "lib64/libopapi.so": "opapi"}))
    result = operators(tmp_path, [FORWARD_SYMBOL, SYMBOL], ASCEND_HOME_PATH=root)
    assert result["found"][FORWARD_SYMBOL]["path"] == str(root / "lib64/libopapi_nn.so")
    assert result["found"][FORWARD_SYMBOL]["marker"] == "forward"
    assert result["found"][SYMBOL]["path"] == str(root / "lib64/libopapi.so")   # libopapi_nn.so lacks it
    assert result["found"][SYMBOL]["marker"] == "opapi"
    info = result["info"]
    assert info["operators"] == {FORWARD_SYMBOL: str(root / "lib64/libopapi_nn.so"),
                                 SYMBOL: str(root / "lib64/libopapi.so")}
    assert info["operator"] == str(root / "lib64/libopapi.so")   # the backward's, as before
    assert info["operators_missing"] == {}


@pytest.mark.parametrize("present,absent", [("forward", SYMBOL), ("opapi", FORWARD_SYMBOL)],
                         ids=["forward-only", "backward-only"])
def test_an_install_lacking_one_operator_serves_the_other(tmp_path, fake_libs, present, absent):
    root = make_root(tmp_path / "cann", fake_libs, dict(BASE, **{"lib64/libopapi.so": present}))
    there = FORWARD_SYMBOL if absent == SYMBOL else SYMBOL
    result = operators(tmp_path, [absent, there], ASCEND_HOME_PATH=root)
    err = result["found"][absent]["error"]
    assert err["type"] == "OperatorNotFoundError"
    assert f"{root / 'lib64/libopapi.so'} (does not export {absent})" in err["message"]
    assert f"{root / 'lib64/libopapi_nn.so'} (absent)" in err["message"]
    assert result["found"][there] == {"path": str(root / "lib64/libopapi.so"), "marker": present,
                                      "same_library": True, "header": None, "header_text": None}
    info = result["info"]
    assert info["operators"] == {there: str(root / "lib64/libopapi.so")}
    assert list(info["operators_missing"]) == [absent] and info["operators_missing"][absent] == err["message"]


def test_a_custom_library_comes_first_for_the_symbols_it_exports(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(BASE, **{"lib64/libopapi.so": "both"}))
    custom = make_root(tmp_path / "custom", fake_libs, {"acme/op_api/lib/libcust_opapi.so": "forward"})
    result = operators(tmp_path, [FORWARD_SYMBOL, SYMBOL], ASCEND_HOME_PATH=root, ASCEND_CUSTOM_OPP_PATH=custom)
    assert result["found"][FORWARD_SYMBOL]["path"] == str(custom / "acme/op_api/lib/libcust_opapi.so")
    assert result["found"][SYMBOL]["path"] == str(root / "lib64/libopapi.so")


def test_any_operator_symbol_is_found_the_same_way(tmp_path, fake_libs):
    other = "aclnnSwigluQuantGetWorkspaceSize"   # an operator this package does not wrap
    root = make_root(tmp_path / "cann", fake_libs, dict(BASE, **{"lib64/libopapi.so": "no_operator"}))
    result = operators(tmp_path, [other], ASCEND_HOME_PATH=root)
    assert result["found"][other]["path"] == str(root / "lib64/libopapi.so")
    assert result["found"][other]["marker"] == "no_operator"
    assert result["info"]["operators"][other] == str(root / "lib64/libopapi.so")


THREADS = PRELUDE + textwrap.dedent("""
    import acl_swiglu
    from acl_swiglu import _loader
    opened = []
    record_opens(opened)
    symbols = os.environ["SYMBOLS"].split(",")
    n = 8
    found = [None] * n

    def work(i):
        found[i] = [_loader.operator_library(symbols[(i + k) % len(symbols)]) for k in range(len(symbols))]

    errors = at_once_on_threads(n, work)
    by_symbol = {}
    for row in found:
        for item in row or []:
            by_symbol.setdefault(item.path, set()).add(id(item))
    print(RESULT + json.dumps({"errors": errors, "opened": opened,
                               "distinct": {p: len(ids) for p, ids in by_symbol.items()}}))
""")


def test_operator_libraries_load_once_thread_safely(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, dict(BASE, **{"lib64/libopapi.so": "both"}))
    result = run_child(THREADS, child_env(ASCEND_HOME_PATH=root, SYMBOLS=f"{SYMBOL},{FORWARD_SYMBOL}"), tmp_path)
    assert result["errors"] == []
    lib64 = root / "lib64"
    # The runtime, the meta library, and the one library exporting both symbols: each opened once.
    assert result["opened"] == [str(lib64 / "libascendcl.so"), str(lib64 / "libnnopbase.so"),
                                str(lib64 / "libopapi.so")]
    assert result["distinct"] == {str(lib64 / "libopapi.so"): 2}   # one OperatorLibrary per symbol


def test_an_operator_header_is_found_in_the_root_or_beside_the_custom_library(tmp_path, fake_libs):
    text = "/* forward operator */\n"
    root = make_root(tmp_path / "cann", fake_libs, dict(BASE, **{
        "lib64/libopapi.so": "both", f"include/aclnnop/{FORWARD_HEADER}": text.encode()}))
    result = operators(tmp_path, [FORWARD_SYMBOL], header=FORWARD_HEADER, ASCEND_HOME_PATH=root)
    header = str(root / f"include/aclnnop/{FORWARD_HEADER}")
    assert result["found"][FORWARD_SYMBOL]["header"] == header
    assert result["found"][FORWARD_SYMBOL]["header_text"] == text
    assert result["operator_header"] == {"path": header, "text": text}
    assert header in result["info"]["trust"]["checked"]

    custom = make_root(tmp_path / "custom", fake_libs, {"acme/op_api/lib/libcust_opapi.so": "forward",
                                                         f"acme/op_api/include/{FORWARD_HEADER}": text.encode()})
    bare = make_root(tmp_path / "bare", fake_libs, BASE)
    result = operators(tmp_path, [FORWARD_SYMBOL], header=FORWARD_HEADER, ASCEND_HOME_PATH=bare,
                       ASCEND_CUSTOM_OPP_PATH=custom)
    assert result["operator_header"] == {"path": str(custom / f"acme/op_api/include/{FORWARD_HEADER}"), "text": text}

    result = operators(tmp_path, [FORWARD_SYMBOL], header="aclnn_no_such_header.h", ASCEND_HOME_PATH=root)
    assert result["operator_header"] is None and result["found"][FORWARD_SYMBOL]["header"] is None


def test_the_backward_revision_is_read_from_the_header_beside_its_custom_library(tmp_path, fake_libs):
    revision_1 = ("aclnnStatus aclnnSwigluGroupQuantGradGetWorkspaceSize(const aclTensor *gradY, const aclTensor *x, "
                  "const aclTensor *w, const aclTensor *y, const aclIntArray *groupIndexOptional, double c, "
                  "const aclTensor *gx, const aclTensor *gw, uint64_t *ws, aclOpExecutor **e);\n")
    root = make_root(tmp_path / "cann", fake_libs, BASE)
    custom = make_root(tmp_path / "custom", fake_libs, {"v/op_api/lib/libcust_opapi.so": "cust_opapi",
                                                         f"v/op_api/include/{BACKWARD_HEADER}": revision_1.encode()})
    info = operators(tmp_path, [SYMBOL], ASCEND_HOME_PATH=root, ASCEND_CUSTOM_OPP_PATH=custom)["info"]
    header = str(custom / f"v/op_api/include/{BACKWARD_HEADER}")
    assert (info["abi"], info["abi_source"], info["header"], info["header_abi"]) == (1, header, header, 1)
    assert info["operator"] == str(custom / "v/op_api/lib/libcust_opapi.so")


LAZY_OPERATOR = PRELUDE + textwrap.dedent("""
    from acl_swiglu import _loader
    libs = _loader.libraries()
    before = [p for p in mapped() if "libopapi" in p]
    operator = libs.operator
    print(RESULT + json.dumps({"before": before, "marker": marker(operator),
                               "same": operator is _loader.operator_library(_loader.OPERATOR_SYMBOL).library,
                               "info_operator": libs.info.operator}))
""")


def test_libraries_operator_is_the_backwards_library_loaded_on_first_use(tmp_path, fake_libs):
    root = make_root(tmp_path / "cann", fake_libs, STANDARD)
    result = run_child(LAZY_OPERATOR, child_env(ASCEND_HOME_PATH=root), tmp_path)
    assert result == {"before": [], "marker": "opapi", "same": True,
                      "info_operator": str(root / "lib64/libopapi.so")}


# ---- on the bundled emulator, in this process ----


def test_the_bundled_emulator_serves_the_backward_and_says_what_it_lacks():
    import acl_swiglu
    from acl_swiglu import _loader

    found = _loader.operator_library(SYMBOL)
    info = acl_swiglu.backend_info()
    assert found.path == info.operator == info.operators[SYMBOL]
    assert found.path.endswith("/_emulator/lib64/libopapi.so")
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.path = "elsewhere"   # type: ignore[misc]
    assert _loader.operator_header(BACKWARD_HEADER, SYMBOL) is None   # the emulator's headers are generic
    missing = "aclnnNoSuchOperatorGetWorkspaceSize"
    with pytest.raises(_loader.OperatorNotFoundError) as raised:
        _loader.operator_library(missing)
    assert isinstance(raised.value, acl_swiglu.LibraryNotFoundError)
    assert f"exports {missing}" in str(raised.value) and f"{found.path} (does not export {missing})" in str(raised.value)
    assert acl_swiglu.backend_info().operators_missing[missing] == str(raised.value)
