"""torch.compile and torch.export as the first thing a process does with acl_swiglu.torch: the
trace loads no library (Dynamo refuses the loader's lock, and a trace has no need of the backend);
the libraries are loaded when the operator first runs, and the result is the eager one. Each case
runs in a fresh interpreter, since any earlier use in this one would have loaded the libraries."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="acl_swiglu.torch needs torch (pip install 'acl-swiglu[torch]')")

# The child asks the loader whether the libraries are loaded (without loading them) at the points
# where tracing is over: after a compiled call's forward, in a compiler called with the traced
# graphs, after torch.export.
PRELUDE = textwrap.dedent("""
    import torch
    from acl_swiglu import _loader
    import acl_swiglu.torch as at

    def loaded():
        return _loader.loaded() is not None

    def problem(rows, seed):
        generator = torch.Generator().manual_seed(seed)
        x = (torch.randn(rows, 32, generator=generator) * 2).to(torch.bfloat16).requires_grad_()
        weight = (torch.rand(rows, generator=generator) + 0.5).requires_grad_()
        return x, weight, torch.tensor([rows - 2], dtype=torch.int64)
""")

COMPILE_FIRST = PRELUDE + textwrap.dedent("""
    module = at.SwiGLU(clamp_limit=1.0)

    def step(x, weight, group_index):
        return module(x, weight, group_index).float().square().sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend="aot_eager")
    x, weight, group_index = problem(12, 0)
    loss = compiled(x, weight, group_index)   # Dynamo traces the forward, AOTAutograd the backward
    assert not loaded(), "tracing (or the plain-torch forward) loaded the libraries"
    loss.backward()                            # the operator runs: the libraries load now
    assert loaded()

    x_eager, weight_eager, _ = problem(12, 0)
    step(x_eager, weight_eager, group_index).backward()
    assert torch.equal(x.grad.view(torch.int16), x_eager.grad.view(torch.int16))
    assert torch.equal(weight.grad, weight_eager.grad)
    for rows in (20, 7):                       # and the graph stays dynamic after the first run
        x, weight, group_index = problem(rows, rows)
        compiled(x, weight, group_index).backward()
    print("compile first: ok")
""")

COMPILE_OPERATOR_FIRST = PRELUDE + textwrap.dedent("""
    from torch._dynamo.backends.common import aot_autograd

    loaded_when_traced = []

    def compiler(graph, example_inputs):   # called with the graph once Dynamo and AOTAutograd traced it
        loaded_when_traced.append(loaded())
        return graph.forward

    backend = aot_autograd(fw_compiler=compiler)
    compiled = torch.compile(at.swiglu_group_quant_grad, fullgraph=True, dynamic=True, backend=backend)
    generator = torch.Generator().manual_seed(3)
    grad_y, x = torch.randn(9, 8, generator=generator), torch.randn(9, 16, generator=generator)
    weight, y_origin = torch.rand(9, generator=generator), torch.randn(9, 8, generator=generator)
    got = compiled(grad_y, x, weight=weight, y_origin=y_origin, clamp_limit=2.0)
    assert loaded_when_traced == [False], loaded_when_traced
    assert loaded()   # loaded when the compiled graph ran the operator
    expected = at.swiglu_group_quant_grad(grad_y, x, weight=weight, y_origin=y_origin, clamp_limit=2.0)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    print("compile of the operator first: ok")
""")

EXPORT_FIRST = PRELUDE + textwrap.dedent("""
    class Backward(torch.nn.Module):
        def forward(self, grad_y, x, weight, y_origin):
            return at.swiglu_group_quant_grad(grad_y, x, weight=weight, y_origin=y_origin, clamp_limit=1.5)

    generator = torch.Generator().manual_seed(4)
    inputs = (torch.randn(10, 16, generator=generator), torch.randn(10, 32, generator=generator),
              torch.rand(10, 1, generator=generator), torch.randn(10, 16, generator=generator))
    rows = torch.export.Dim("rows", min=2)
    program = torch.export.export(Backward(), inputs, dynamic_shapes=({0: rows},) * 4)
    forward = torch.export.export(at.SwiGLU(clamp_limit=1.0), inputs[1:3])
    assert not loaded(), "torch.export loaded the libraries"
    for got, expected in zip(program.module()(*inputs), Backward()(*inputs)):
        assert torch.equal(got, expected)
    assert loaded()
    print("export first: ok")
""")


CASES = [
    pytest.param(COMPILE_FIRST, None, id="compile-swiglu"),
    # with the revision set, traced code reads it from the environment instead of assuming 2
    pytest.param(COMPILE_FIRST, "2", id="compile-swiglu-ACL_SWIGLU_ABI=2"),
    pytest.param(COMPILE_OPERATOR_FIRST, None, id="compile-operator"),
    pytest.param(EXPORT_FIRST, None, id="export"),
]


@pytest.mark.parametrize("script,abi_setting", CASES)
def test_tracing_first_loads_nothing_and_runs(tmp_path, script, abi_setting):
    env = {k: v for k, v in os.environ.items() if k != "ACL_SWIGLU_ABI"}
    env.update(ACL_SWIGLU_BACKEND="emulator", OMP_NUM_THREADS="1")
    if abi_setting is not None:
        env["ACL_SWIGLU_ABI"] = abi_setting
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-6000:]
    assert result.stdout.strip().endswith(": ok")


WARNING_FROM_BACKWARD = textwrap.dedent("""
    import warnings
    import torch
    import acl_swiglu
    import acl_swiglu.torch as at

    x = torch.randn(4, 16, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = at.swiglu(x, torch.rand(4)).sum()
        loss.backward()   # WARNED HERE
    line = next(n for n, text in enumerate(open(__file__), 1) if text.rstrip().endswith("# WARNED HERE"))
    fallback = [w for w in caught if "no CANN installation found" in str(w.message)]
    assert len(fallback) == 1, [str(w.message) for w in caught]
    assert issubclass(fallback[0].category, acl_swiglu.AclSwigluWarning), fallback[0].category
    assert (fallback[0].filename, fallback[0].lineno) == (__file__, line), (fallback[0].filename, fallback[0].lineno)
    print("warning at the caller: ok")
""")


def test_the_fallback_warning_of_a_first_backward_points_at_the_callers_line(tmp_path):
    """No CANN and ACL_SWIGLU_BACKEND unset: the loader falls back to the emulator and warns; a
    backward that made the first call gets that warning as an AclSwigluWarning on its own line,
    not on a line inside acl_swiglu or torch."""
    script = tmp_path / "train.py"
    script.write_text(WARNING_FROM_BACKWARD)
    env = {k: v for k, v in os.environ.items()
           if k not in ("ACL_SWIGLU_BACKEND", "ACL_SWIGLU_LIB_DIR", "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")}
    env["OMP_NUM_THREADS"] = "1"
    if any(os.path.exists(root) for root in ("/usr/local/Ascend/cann", "/usr/local/Ascend/ascend-toolkit/latest")):
        pytest.skip("a CANN is installed here, so the loader does not fall back to the emulator")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "warning at the caller: ok" in result.stdout
