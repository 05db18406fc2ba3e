"""ml_dtypes (bfloat16) is imported on first need, not with the package: its import costs more
than the rest of the package's. Each case runs in a fresh interpreter, which is the only place
where "not imported yet" can be observed."""

import json
import subprocess
import sys

import pytest

PRELUDE = "import json, sys\nimport numpy as np\nimport acl_swiglu\nseen = {'at import': 'ml_dtypes' in sys.modules}\n"

CASES = {
    "float32 calls": """
gy = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
grad_x, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.0)
with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
    out, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x)
    same = bool(np.array_equal(out.to_numpy(), acl_swiglu.swiglu_group_quant_grad(gy, x)[0]))
    out.close()
golden, _ = acl_swiglu.reference.swiglu_group_quant_grad(gy, x, clamp_limit=1.0)
seen['after'] = 'ml_dtypes' in sys.modules
seen['result'] = [str(grad_x.dtype), same, bool(acl_swiglu.reference.compare(grad_x, golden))]
""",
    "the public name": """
dtype = acl_swiglu.bfloat16
import ml_dtypes
seen['after'] = 'ml_dtypes' in sys.modules
seen['result'] = [dtype == np.dtype(ml_dtypes.bfloat16), "bfloat16" in acl_swiglu.__all__]
try:
    acl_swiglu.no_such_name
except AttributeError as error:
    seen['result'].append(str(error))
""",
    "the name as a string": """
with acl_swiglu.DeviceArray.empty((2, 8), "bfloat16") as array:
    seen['after'] = 'ml_dtypes' in sys.modules
    seen["result"] = [str(array.dtype), list(array.shape)]
""",
    "bfloat16 arrays": """
import ml_dtypes
bf16 = ml_dtypes.bfloat16
gy = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16).astype(bf16)
x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32).astype(bf16)
grad_x, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.0)
golden, _ = acl_swiglu.reference.swiglu_group_quant_grad(gy, x, clamp_limit=1.0)
seen['after'] = True
seen['result'] = [str(grad_x.dtype), bool(acl_swiglu.reference.compare(grad_x, golden, dtype="bfloat16"))]
""",
}

WANT = {
    "float32 calls": (False, ["float32", True, True]),
    "the public name": (True, [True, True, "module 'acl_swiglu' has no attribute 'no_such_name'"]),
    "the name as a string": (True, ["bfloat16", [2, 8]]),
    "bfloat16 arrays": (True, ["bfloat16", True]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ml_dtypes_is_imported_only_when_bfloat16_is_needed(case, tmp_path):
    script = PRELUDE + CASES[case] + "json.dump(seen, sys.stdout)\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout)
    after, result = WANT[case]
    assert seen["at import"] is False, seen
    assert seen["after"] is after and seen["result"] == result, seen


def test_a_bfloat16_dtype_name_is_checked_against_ml_dtypes():
    """Only ml_dtypes' bfloat16 is bfloat16: another dtype of that name is not taken for it."""
    import ml_dtypes
    import numpy as np
    from acl_swiglu import _dtypes

    assert _dtypes.is_bfloat16(np.dtype(ml_dtypes.bfloat16))
    assert _dtypes.acl_dtype(ml_dtypes.bfloat16) == _dtypes.ACL_BF16 == _dtypes.acl_dtype("bfloat16")
    for other in (np.float16, np.uint16, np.dtype([("bfloat16", np.uint16)]), np.dtype("V2")):
        assert not _dtypes.is_bfloat16(np.dtype(other)), other
    with pytest.raises(KeyError):
        _dtypes.acl_dtype(np.dtype("V2"))
    assert _dtypes.allowed_dtype_text().split(", ")[:4] == ["float32", "float16", "bfloat16", "int64"]
