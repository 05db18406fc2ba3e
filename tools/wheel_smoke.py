"""Smoke test of an installed acl-swiglu, run by tools/wheel_smoke.sh with `python -I` from an
empty directory so that only the installed package can be imported.

Checks that the package and its emulator come from this environment, that the license and
py.typed were installed, and that the operator's results pass the reference comparison for every
dtype through the one-shot call and a reused plan. Prints one line, `outputs sha256 <digest>`, a
digest of all outputs: two installs (e.g. a wheel and a source build) that print the same digest
computed the same bytes.
"""

import hashlib
import sys
from importlib import metadata
from pathlib import Path

import ml_dtypes
import numpy as np

import acl_swiglu
from acl_swiglu import reference


def inside_environment(path: str) -> bool:
    return Path(path).resolve().is_relative_to(Path(sys.prefix).resolve())


def check_installation() -> None:
    assert inside_environment(acl_swiglu.__file__), f"acl_swiglu imported from {acl_swiglu.__file__}, not {sys.prefix}"
    assert Path(acl_swiglu.__file__).with_name("py.typed").is_file(), "py.typed is not installed"
    distribution = metadata.distribution("acl-swiglu")
    assert distribution.version == acl_swiglu.__version__
    assert distribution.metadata["License-Expression"] == "Apache-2.0", distribution.metadata["License-Expression"]
    licenses = [f for f in distribution.files if f.name == "LICENSE"]
    assert licenses and "Apache License" in licenses[0].read_text(), "the LICENSE file is not installed"
    info = acl_swiglu.backend_info()
    assert info.backend == "emulator", info
    for library in (info.runtime, info.meta, info.operator):
        assert inside_environment(library), f"{library} is not the installed emulator"


def inputs(dtype, rows: int, hidden: int, seed: int):
    rng = np.random.default_rng(seed)
    grad_y = rng.standard_normal((rows, hidden)).astype(dtype)
    x = (3 * rng.standard_normal((rows, 2 * hidden))).astype(dtype)
    weight = rng.uniform(0, 2, (rows, 1)).astype(np.float32)
    y_origin = reference.swiglu(x).astype(dtype)
    return grad_y, x, weight, y_origin


def main() -> int:
    check_installation()
    digest = hashlib.sha256()
    groups = np.array([40, 13], np.int64)
    for seed, dtype in enumerate((np.float32, np.float16, ml_dtypes.bfloat16)):
        grad_y, x, weight, y_origin = inputs(dtype, 64, 160, seed)
        grad_x, grad_weight = acl_swiglu.swiglu_group_quant_grad(
            grad_y, x, weight, y_origin, group_index=groups, clamp_limit=4.0)
        golden_x, golden_weight = reference.swiglu_group_quant_grad(
            grad_y, x, weight, y_origin, group_index=groups, clamp_limit=4.0)
        for name, actual, golden in (("grad_x", grad_x, golden_x), ("grad_weight", grad_weight, golden_weight)):
            verdict = reference.compare(actual, golden)
            assert verdict.passed, f"{np.dtype(dtype).name} {name}: {verdict}"
            digest.update(np.ascontiguousarray(actual).tobytes())
        with acl_swiglu.Stream() as stream, acl_swiglu.to_device(grad_y) as d_gy, acl_swiglu.to_device(x) as d_x, \
                acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=4.0, stream=stream) as plan:
            for _ in range(3):
                plan_x, _ = plan()
            stream.synchronize()
            planned = plan_x.to_numpy()
        one_shot, _ = acl_swiglu.swiglu_group_quant_grad(grad_y, x, clamp_limit=4.0)
        assert planned.tobytes() == one_shot.tobytes(), f"{np.dtype(dtype).name}: a plan call differs from one-shot"
        digest.update(planned.tobytes())
    print(f"outputs sha256 {digest.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
