"""The package's shape: no import cycle among its modules (imports inside functions and under
TYPE_CHECKING count too), no object's memory read by address, every entry point of the native
helper declared as a row in _ffi.py, and the helper built against the emulator's headers."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Set

import acl_swiglu
from acl_swiglu import _ffi

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "acl_swiglu"
BINDING = ROOT / "binding"
CORE = ("runtime", "_device", "tensor", "_operator", "_plan", "_arena", "_aclnn")


def _imports(path: Path) -> Set[str]:
    """The package modules a module imports, anywhere in it."""
    tree = ast.parse(path.read_text())
    found: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module is None:
                found.update(alias.name for alias in node.names)
            elif node.level == 1:
                found.add(node.module.split(".")[0])
            elif node.module and node.module.startswith("acl_swiglu"):
                parts = node.module.split(".")
                found.add(parts[1] if len(parts) > 1 else "__init__")
                if len(parts) == 1:
                    found.update(alias.name for alias in node.names
                                 if (PACKAGE / f"{alias.name}.py").exists())
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "acl_swiglu":
                    found.add(parts[1] if len(parts) > 1 else "__init__")
    return {name for name in found if (PACKAGE / f"{name}.py").exists()} - {path.stem}


def _graph() -> Dict[str, Set[str]]:
    return {path.stem: _imports(path) for path in PACKAGE.glob("*.py")}


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    groups: List[List[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_import_cycle_among_the_package_modules():
    graph = _graph()
    assert "_device" in graph and "runtime" in graph["_device"]   # (the scan sees imports)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_data_model_knows_no_calls_or_plans():
    for module in ("runtime", "_device", "tensor"):
        assert not _imports(PACKAGE / f"{module}.py") & {"_plan", "_aclnn", "_operator", "op", "_arena"}, module


def test_no_object_memory_is_read_by_address():
    """Host arrays are read through NumPy's public interfaces: nothing takes an address from id()."""
    offenders = []
    for path in PACKAGE.glob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\bid\(", code) and re.search(r"from_address|addressof|c_void_p|slots|pack", code):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
            if re.search(r"\.from_address\(", code):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == []


def _helper_exports() -> Set[str]:
    library = Path(_ffi.helper_path())
    listed = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in listed.stdout.splitlines() if " T " in line}


def test_every_helper_entry_point_is_a_row_of_ffi():
    acl_swiglu.backend_info()   # (the operators register their rows at import)
    rows = {row.symbol for row in _ffi.declarations() if row.library == "helper"}
    exports = _helper_exports()
    assert exports and exports == rows, (exports ^ rows)
    for row in _ffi.declarations():
        if row.library == "helper":
            assert row.argtypes is not None and all(arg is not None for arg in row.argtypes), row


def test_the_helper_takes_its_acl_prototypes_from_the_emulator_headers():
    """binding/ declares no ACL function itself: it includes native/include, so the compiler
    checks every function pointer type it uses against the emulator's headers."""
    for source in list(BINDING.glob("*.c")) + list(BINDING.glob("*.h")):
        text = source.read_text()
        assert not re.search(r"typedef\s+\w+\s*\(\s*\*\s*\w+\s*\)\s*\(\s*void\s*\*\*", text), source.name
        assert not re.search(r"^\s*(int|aclError|aclnnStatus)\s+acl(rt)?[A-Z]\w*\s*\(", text, re.M), source.name
    assert '#include "acl/acl.h"' in (BINDING / "helper.h").read_text()
    assert '#include "aclnn/acl_meta.h"' in (BINDING / "helper.h").read_text()
    cmake = (BINDING / "CMakeLists.txt").read_text()
    assert "EMU_INCLUDE_DIR" in cmake
    thunks = [source for source in BINDING.glob("*.c") if '#include "aclnnop/' in source.read_text()]
    assert thunks, "each operator's thunk includes its operator header"
    for source in thunks:
        assert "_Static_assert" in source.read_text(), source.name   # (phase 2's type, checked too)


def test_no_try_block_sits_right_inside_a_with_block_in_the_core():
    """A ``try`` right inside a ``with`` does not protect its own first line: an exception there
    (a signal at the wrong moment) would skip the with's exit. The core keeps them apart."""
    found = []
    for name in CORE:
        path = PACKAGE / f"{name}.py"
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.With, ast.AsyncWith)):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Try) and inner is not node:
                        found.append(f"{path.name}:{inner.lineno}")
    assert found == []


def test_test_modules_share_helpers_not_each_other():
    """Shared fixtures live in conftest.py and shared helpers in helper modules (loader_cases,
    swiglu_cases, native_build, ...): no test module imports another (a child process a test
    starts may import its own module, from a script in a string)."""
    tests = ROOT / "tests"
    importing = []
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            importing += [f"{path.name} imports {name}" for name in names if name.startswith("test_")]
    assert not importing, importing
