"""Tests of the `acl-swiglu-sample` CLI (also `python -m acl_swiglu`).

The CLI runs in-process (``acl_swiglu.cli.main([...])`` with capsys) and as real subprocesses
(``python -m acl_swiglu`` and the console script next to ``sys.executable``), with the working
directory a temporary one so that the installed package is what gets imported.

Covered: the default run (the documented C++ example: lines, order, values against the float64
reference and against tests/device_model.py's bit-exact model), every option, the ``--json``
schema (REPORT_SCHEMA / ERROR_REPORT_SCHEMA below, validated key by key), the exit statuses
(0 pass, 1 failing check, 2 bad options, 3 library/ACL error, 5 out of memory, 130 interrupted)
and the progress bar of ``--repeat``.
"""

from __future__ import annotations

import json
import math
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import device_model  # noqa: E402

import acl_swiglu  # noqa: E402
from acl_swiglu import cli, reference  # noqa: E402

DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
OUT_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
ENTRY_POINTS = {
    "module": [sys.executable, "-m", "acl_swiglu"],
    "script": [str(Path(sys.executable).parent / "acl-swiglu-sample")],
}
# The exit statuses 2 and 3 in a process, through `python -m acl_swiglu` in the default run and
# through the console script (the same main()) in the slow tier as well, one child interpreter
# each; test_default_run_subprocess runs both entry points in the default run.
EXIT_ENTRY_POINTS = ["module", pytest.param("script", marks=pytest.mark.slow)]
VALUE_LINE = re.compile(r"^(gradX|gradWeight)\[(\d+)\] = (-?\d+\.\d{6}|-?nan|-?inf)$")
TIMING_LINE = re.compile(r"^  (phase 1|phase 2 \+ synchronize|plan call \+ synchronize)\s+(\d+\.\d) /\s+(\d+\.\d)$")
# "%f" prints 6 decimals: a printed value is within half a unit of the 6th decimal of the real one.
PRINT_SLACK = 0.5e-6


# ----------------------------------------------------------------------------- the JSON schema

INT_GE0 = {"type": "integer", "minimum": 0}
NUM_GE0 = {"type": "number", "minimum": 0}
SHAPE = {"type": "array", "items": INT_GE0}
FIRST_VALUES = {"type": "array", "items": {"type": "number"}, "maxItems": 10}

#: One output's verdict and figures (acl_swiglu.reference.Comparison.to_dict(), docs/operator.md (judging a result)).
COMPARISON_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["passed", "dtype", "count", "failures", "fail_fraction", "allowed_fraction", "tol",
                 "max_abs_error", "mere", "mare", "mere_ok", "mare_ok", "threshold", "nan_mismatch",
                 "inf_mismatch", "departures", "departures_nan", "worst_index"],
    "properties": {
        "passed": {"type": "boolean", "description": "the output's verdict"},
        "dtype": {"enum": ["float32", "float16", "bfloat16"], "description": "the output dtype judged"},
        "count": {**INT_GE0, "description": "elements judged (departures excluded)"},
        "failures": {**INT_GE0, "description": "elements with |a-g| > tol + tol*|g|, or NaN/inf class mismatches"},
        "fail_fraction": NUM_GE0,
        "allowed_fraction": NUM_GE0,
        "tol": NUM_GE0,
        "max_abs_error": NUM_GE0,
        "mere": {**NUM_GE0, "description": "mean relative error (information)"},
        "mare": {**NUM_GE0, "description": "max relative error (information)"},
        "mere_ok": {"type": "boolean"},
        "mare_ok": {"type": "boolean"},
        "threshold": {**NUM_GE0, "description": "Th of the dtype: MERE < Th, MARE < 10 Th"},
        "nan_mismatch": INT_GE0,
        "inf_mismatch": INT_GE0,
        "departures": {**INT_GE0, "description": "positions where the device formula departs from the math"},
        "departures_nan": INT_GE0,
        "worst_index": {"type": ["array", "null"], "items": INT_GE0},
    },
}

TIMING_SUMMARY_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["n", "min_us", "median_us", "max_us"],
    "properties": {"n": {"type": "integer", "minimum": 1}, "min_us": NUM_GE0, "median_us": NUM_GE0,
                   "max_us": NUM_GE0},
}

VERSIONS_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "description": "what a bug report needs; torch and ml_dtypes null when not installed",
    "required": ["acl_swiglu", "python", "numpy", "ml_dtypes", "torch", "platform"],
    "properties": {"acl_swiglu": {"type": "string"}, "python": {"type": "string"}, "numpy": {"type": "string"},
                   "ml_dtypes": {"type": ["string", "null"]}, "torch": {"type": ["string", "null"]},
                   "platform": {"type": "string"}},
}

WARNINGS_SCHEMA = {"type": "array", "items": {"type": "string"},
                   "description": "each warning of the run, once, as the 'note:' lines on stderr"}

#: `--json` output of a run that got as far as the operator (exit status 0 or 1).
REPORT_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["ok", "exit_status", "op", "versions", "warnings", "backend", "inputs", "grad_x_first",
                 "grad_weight_first"],
    "properties": {
        "ok": {"type": "boolean", "description": "exit_status == 0"},
        "exit_status": {"enum": [0, 1]},
        "op": {"enum": ["backward"], "description": "the operator run (--op)"},
        "versions": VERSIONS_SCHEMA,
        "warnings": WARNINGS_SCHEMA,
        "backend": {
            "type": "object",
            "additionalProperties": False,
            "description": "acl_swiglu.backend_info().as_dict()",
            "required": ["backend", "requested", "abi", "abi_source", "root", "runtime", "meta", "operator",
                         "emulator_version", "cann_version", "cann_version_file", "header", "header_abi",
                         "trust", "searched"],
            "properties": {
                "backend": {"enum": ["cann", "emulator"]},
                "requested": {"enum": ["auto", "cann", "emulator"]},
                "abi": {"enum": [1, 2]},
                "abi_source": {"type": "string",
                               "description": "'ACL_SWIGLU_ABI', the header path, 'ACL_EMU_ABI' or 'default'"},
                "cann_version": {"type": ["string", "null"],
                                 "description": "null when the install (or an emulator without aclsysGetCANNVersion) says none"},
                "cann_version_file": {"type": ["string", "null"]},
                "cann_version_source": {"type": ["string", "null"],
                                        "description": "'aclsysGetCANNVersion', the file it was read from, or null"},
                "cann_version_note": {"type": ["string", "null"]},
                "operators": {"type": "object", "description": "symbol -> library path, for the operators found"},
                "operators_missing": {"type": "object", "description": "symbol -> why it was not found"},
                "package_version": {"type": ["string", "null"]},
                "python_version": {"type": ["string", "null"]},
                "numpy_version": {"type": ["string", "null"]},
                "torch_version": {"type": ["string", "null"], "description": "null when torch is not imported"},
                "trust": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["ran", "enforced", "checked", "problems", "note"],
                    "properties": {
                        "ran": {"type": "boolean"},
                        "enforced": {"type": "boolean", "description": "false with ACL_SWIGLU_TRUST_LIBS=1"},
                        "checked": {"type": "array", "items": {"type": "string"}},
                        "problems": {"type": "array", "items": {"type": "string"}},
                        "note": {"type": "string"},
                        "files": {"type": "array", "items": {
                            "type": "object", "additionalProperties": False, "required": ["path", "role", "why"],
                            "properties": {"path": {"type": "string"}, "role": {"type": "string"},
                                           "why": {"type": "string"}}}},
                    },
                },
                "root": {"type": ["string", "null"], "description": "null when the system loader found CANN"},
                "runtime": {"type": "string"},
                "meta": {"type": "string"},
                "operator": {"type": ["string", "null"], "description": "null when the install lacks the operator"},
                "emulator_version": {"type": ["string", "null"]},
                "header": {"type": ["string", "null"], "description": "the operator header found, if any"},
                "header_abi": {"enum": [1, 2, None], "description": "the ABI revision that header declares"},
                "searched": {"type": "array", "items": {"type": "string"}},
            },
        },
        "inputs": {
            "type": "object",
            "additionalProperties": False,
            "required": ["dtype", "shapes", "clamp_limit", "group_index", "data"],
            "properties": {
                "dtype": {"enum": ["fp32", "fp16", "bf16"]},
                "shapes": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["grad_y", "x"],
                    "description": "weight and y_origin only with weight, group_index only with groups",
                    "properties": {"grad_y": SHAPE, "x": SHAPE, "weight": SHAPE, "y_origin": SHAPE,
                                   "group_index": SHAPE},
                },
                "clamp_limit": {"type": ["number", "null"], "description": "null: clamp off"},
                "group_index": {"type": ["array", "null"], "items": {"type": "integer"}},
                "data": {"type": "string", "description": "'documented patterns' or 'random (seed N)'"},
            },
        },
        "grad_x_first": FIRST_VALUES,
        "grad_weight_first": {**FIRST_VALUES, "description": "[] without weight"},
        "check": {
            "type": "object",
            "additionalProperties": False,
            "description": "absent with --no-check; grad_weight only with weight",
            "required": ["grad_x", "passed"],
            "properties": {"grad_x": COMPARISON_SCHEMA, "grad_weight": COMPARISON_SCHEMA,
                           "passed": {"type": "boolean"}},
        },
        "timing": {
            "type": "object",
            "additionalProperties": False,
            "description": "only with --repeat N",
            "required": ["phase1", "phase2_sync", "plan_sync"],
            "properties": {"phase1": TIMING_SUMMARY_SCHEMA, "phase2_sync": TIMING_SUMMARY_SCHEMA,
                           "plan_sync": TIMING_SUMMARY_SCHEMA},
        },
    },
}

#: reference.QuantComparison.to_dict(): the forward's codes and scales judged (docs/forward.md).
QUANT_COMPARISON_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["passed", "dst_type", "quant_mode", "rows_judged", "count", "exact", "near_midpoint",
                 "code_mismatches", "nan_mismatch", "inf_mismatch", "scale_count", "scale_mismatches",
                 "scale_boundary", "max_scale_ulps", "worst_index"],
    "properties": {
        "passed": {"type": "boolean"},
        "dst_type": {"enum": ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "float4_e1m2"]},
        "quant_mode": {"enum": [0, 1]},
        "rows_judged": {**INT_GE0, "description": "rows before the truncation"},
        "count": {**INT_GE0, "description": "codes judged"},
        "exact": INT_GE0,
        "near_midpoint": {**INT_GE0, "description": "codes one step off where the value lies at a rounding midpoint"},
        "code_mismatches": INT_GE0,
        "nan_mismatch": INT_GE0,
        "inf_mismatch": INT_GE0,
        "scale_count": INT_GE0,
        "scale_mismatches": INT_GE0,
        "scale_boundary": {**INT_GE0, "description": "power-of-two scales one exponent off at a step"},
        "max_scale_ulps": INT_GE0,
        "worst_index": {"type": ["array", "null"], "items": INT_GE0},
    },
}

#: `--json` output of an --op forward run that got as far as the operator (exit status 0 or 1).
FORWARD_REPORT_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["ok", "exit_status", "op", "versions", "warnings", "backend", "inputs", "y_first", "y_scale_first"],
    "properties": {
        "ok": REPORT_SCHEMA["properties"]["ok"],
        "exit_status": REPORT_SCHEMA["properties"]["exit_status"],
        "op": {"enum": ["forward"]},
        "versions": VERSIONS_SCHEMA,
        "warnings": WARNINGS_SCHEMA,
        "backend": REPORT_SCHEMA["properties"]["backend"],
        "inputs": {
            "type": "object",
            "additionalProperties": False,
            "required": ["dtype", "shapes", "clamp_limit", "group_index", "dst_type", "quant_mode", "round_scale",
                         "data"],
            "properties": {
                "dtype": {"enum": ["fp16", "bf16"]},
                "shapes": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["x"],
                    "description": "weight only with weight, group_index only with groups",
                    "properties": {"x": SHAPE, "weight": SHAPE, "group_index": SHAPE},
                },
                "clamp_limit": {"type": ["number", "null"], "description": "null: clamp off"},
                "group_index": {"type": ["array", "null"], "items": {"type": "integer"}},
                "dst_type": QUANT_COMPARISON_SCHEMA["properties"]["dst_type"],
                "quant_mode": {"enum": [0, 1]},
                "round_scale": {"type": "boolean"},
                "data": {"type": "string", "description": "'documented patterns' or 'random (seed N)'"},
            },
        },
        "y_first": {**FIRST_VALUES, "description": "the first codes' values (FP4 unpacked), before their scales"},
        "y_scale_first": {**FIRST_VALUES, "description": "the first scales' values (E8M0 decoded)"},
        "check": {
            "type": "object",
            "additionalProperties": False,
            "description": "absent with --no-check",
            "required": ["y", "passed"],
            "properties": {"y": QUANT_COMPARISON_SCHEMA, "passed": {"type": "boolean"}},
        },
        "timing": REPORT_SCHEMA["properties"]["timing"],
    },
}

#: `--json` output of a failed run: bad options or settings (exit status 2), the libraries or an
#: ACL call (3), host or device memory (5), an interrupt (130): what was known before the failure
#: (backend, inputs, warnings), and the error.
ERROR_REPORT_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["ok", "exit_status", "versions", "error"],
    "properties": {
        "ok": {"enum": [False]},
        "exit_status": {"enum": [2, 3, 5, 130]},
        "versions": VERSIONS_SCHEMA,
        "warnings": WARNINGS_SCHEMA,
        "backend": REPORT_SCHEMA["properties"]["backend"],
        "inputs": REPORT_SCHEMA["properties"]["inputs"],
        "error": {
            "type": "object",
            "additionalProperties": False,
            "required": ["kind", "message"],
            "description": "kind 'usage', 'argument' or 'configuration' (exit 2), 'acl' (with api, code, name; "
                           "exit 3, or 5 for the device's out-of-memory codes), the exception class name (exit 3), "
                           "'HostMemoryError' (exit 5) or 'interrupted' (exit 130)",
            "properties": {
                "kind": {"type": "string"},
                "api": {"type": "string"},
                "code": {"type": "integer"},
                "name": {"type": "string"},
                "message": {"type": ["string", "null"]},
            },
        },
    },
}

_PY_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _has_type(value, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _PY_TYPES[name])


def schema_errors(value, schema, path="$"):
    """The subset of JSON Schema the schemas above use: type, enum, properties, required,
    additionalProperties: false, items, minItems/maxItems, minimum. Returns a list of errors."""
    errors = []
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_has_type(value, t) for t in types):
            return errors + [f"{path}: {type(value).__name__} {value!r} is not {types}"]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing key {key!r}")
        for key, item in value.items():
            if key in props:
                errors += schema_errors(item, props[key], f"{path}.{key}")
            elif schema.get("additionalProperties", True) is False:
                errors.append(f"{path}: unexpected key {key!r}")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: {len(value)} items > {schema['maxItems']}")
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: {len(value)} items < {schema['minItems']}")
        for i, item in enumerate(value):
            errors += schema_errors(item, schema.get("items", {}), f"{path}[{i}]")
    if "minimum" in schema and _has_type(value, "number") and value < schema["minimum"]:
        errors.append(f"{path}: {value} < {schema['minimum']}")
    return errors


def assert_schema(value, schema):
    errors = schema_errors(value, schema)
    assert not errors, "JSON report does not match the documented schema:\n  " + "\n  ".join(errors)


# ----------------------------------------------------------------------------- helpers


def installed_backend():
    return acl_swiglu.backend_info()


def on_emulator() -> bool:
    return installed_backend().backend == "emulator"


def backend_line(info, abi=None) -> str:
    name = "CPU emulator" if info.backend == "emulator" else "CANN"
    return (f"backend: {name} (ABI revision {abi if abi is not None else acl_swiglu.abi_revision()}), "
            f"root {info.root or '(system loader)'}")


@pytest.fixture
def clean_env(monkeypatch):
    """The CLI sets ACL_SWIGLU_BACKEND / ACL_SWIGLU_ABI in os.environ for --backend / --abi:
    make monkeypatch restore both whatever a test does."""
    for name in ("ACL_SWIGLU_BACKEND", "ACL_SWIGLU_ABI"):
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:   # set then delete, so that monkeypatch records "absent" and restores that
            monkeypatch.setenv(name, "")
            monkeypatch.delenv(name)
    return monkeypatch


def run_inproc(capsys, *args):
    rc = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def json_inproc(capsys, *args):
    rc, out, err = run_inproc(capsys, "--json", *args)
    report = json.loads(out)   # the whole of stdout is one JSON object
    assert isinstance(report, dict)
    assert report["exit_status"] == rc
    assert_schema(report, REPORT_SCHEMA)
    return rc, report, err


def subprocess_env(**overrides):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACL_EMU_")}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_cli(tmp_path, *args, entry="module", env=None, timeout=300):
    cmd = ENTRY_POINTS[entry] + [str(a) for a in args]
    return subprocess.run(cmd, cwd=tmp_path, env=env if env is not None else subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


def value_lines(lines, name):
    found = []
    for line in lines:
        m = VALUE_LINE.match(line)
        if m and m.group(1) == name:
            found.append((int(m.group(2)), m.group(3)))
    assert [i for i, _ in found] == list(range(len(found))), f"{name} lines out of order: {found}"
    return [text for _, text in found]


def example_inputs(dtype="fp16", tokens=512, hidden=512, batch=None, weight=True, groups="halves", clamp=1.0):
    """The documented example's inputs, built here from the documented formulas (not by the CLI)."""
    lead = (batch, tokens) if batch else (tokens,)
    rows = math.prod(lead)

    def pattern(shape, fn):
        i = np.arange(math.prod(shape), dtype=np.float64)
        return fn(i).reshape(shape)

    dt = DTYPES[dtype]
    grad_y = pattern(lead + (hidden,), lambda i: (i % 10) * 0.1).astype(dt)
    x = pattern(lead + (2 * hidden,), lambda i: ((i % 20) - 10) * 0.5).astype(dt)
    w = pattern(lead + (1,), lambda i: ((i % 5) + 1) * 0.2).astype(np.float32) if weight else None
    y_origin = pattern(lead + (hidden,), lambda i: ((i % 8) + 1) * 0.3).astype(dt) if weight else None
    if groups == "halves":
        group_index = np.array([rows // 2, rows - rows // 2], np.int64)
    elif groups is None:
        group_index = None
    else:
        group_index = np.array(groups, np.int64)
    return dict(grad_y=grad_y, x=x, weight=w, y_origin=y_origin, group_index=group_index, clamp_limit=clamp)


def cli_inputs(*args):
    """The inputs the CLI makes for these options (for --random, whose data is the CLI's own)."""
    return cli.make_inputs(cli.build_parser().parse_args([str(a) for a in args]))


def expected_first(inputs):
    """(golden gradX, golden gradWeight, model gradX, model gradWeight), first 10 each, plus the
    departures of the first 10 gradX elements."""
    args = [inputs[k] for k in ("grad_y", "x", "weight", "y_origin", "group_index", "clamp_limit")]
    gx, gw = reference.swiglu_group_quant_grad(*args)
    mx, mw = device_model.swiglu_group_quant_grad_model(*args)
    dep = reference.device_departures(inputs["x"], inputs["clamp_limit"], inputs["group_index"])
    first = lambda a: None if a is None else a.reshape(-1)[:10]  # noqa: E731
    return first(gx), first(gw), first(mx), first(mw), dep.reshape(-1)[:10]


def same_values(got, want) -> bool:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    return (got.shape == want.shape and np.array_equal(got, want, equal_nan=True)
            and np.array_equal(np.signbit(got), np.signbit(want)))


def assert_report_values(report, inputs):
    """The JSON's first values: within the docs/operator.md (judging a result) verdict against the float64 reference,
    and (on the emulator) bit-exactly the device model's."""
    gx, gw, mx, mw, dep = expected_first(inputs)
    x_dtype = inputs["x"].dtype
    got_x = np.asarray(report["grad_x_first"], np.float64)
    assert got_x.size == min(10, inputs["x"].size)
    # every reported value is a value of the output dtype (converted exactly)
    assert same_values(got_x.astype(x_dtype).astype(np.float64), got_x)
    verdict = reference.compare(got_x.astype(x_dtype), gx, departures=dep)
    assert verdict.passed, f"gradX first values vs reference: {verdict}"
    if inputs["weight"] is None:
        assert report["grad_weight_first"] == []
    else:
        got_w = np.asarray(report["grad_weight_first"], np.float64)
        assert got_w.size == min(10, inputs["weight"].size)
        verdict = reference.compare(got_w.astype(np.float32), gw)
        assert verdict.passed, f"gradWeight first values vs reference: {verdict}"
    if on_emulator():
        assert same_values(got_x, mx), f"gradX {got_x} vs model {mx}"
        if inputs["weight"] is not None:
            assert same_values(report["grad_weight_first"], mw), f"gradWeight vs model {mw}"


# ----------------------------------------------------------------------------- the schema itself


def test_schema_validator_rejects_wrong_reports(capsys):
    rc, report, _ = json_inproc(capsys, "--tokens", 4, "--hidden", 4)
    assert rc == 0
    bad = json.loads(json.dumps(report))
    del bad["ok"]
    bad["exit_status"] = "0"
    bad["surprise"] = 1
    bad["backend"]["abi"] = 3
    bad["inputs"]["shapes"]["x"] = [4, "8"]
    bad["check"]["grad_x"]["passed"] = 1
    bad["grad_x_first"] = list(range(11))
    errors = "\n".join(schema_errors(bad, REPORT_SCHEMA))
    for needle in ("missing key 'ok'", "$.exit_status", "unexpected key 'surprise'", "$.backend.abi",
                   "$.inputs.shapes.x[1]", "$.check.grad_x.passed", "11 items > 10"):
        assert needle in errors, f"{needle!r} not reported in:\n{errors}"


# ----------------------------------------------------------------------------- the default run


def _check_default_text(out: str, err: str, info) -> None:
    lines = out.splitlines()
    root = info.root
    assert lines[0] == backend_line(info), "the backend line must come before anything else"
    assert lines[1] == f"  operator library: {info.operator} ({cli._version_text(info)})"
    if info.backend == "emulator":
        assert lines[1].endswith(f" ({info.emulator_version})")
    assert lines[2] == ("gradY [512, 512] x [512, 1024] fp16, weight [512, 1], groupIndex [256, 256], "
                        "clamp 1.0")
    assert lines[3] == "gradX output (first 10 elements):"
    assert all(VALUE_LINE.match(line) for line in lines[4:14]), lines[4:14]
    assert [line.split(" = ")[0] for line in lines[4:14]] == [f"gradX[{i}]" for i in range(10)]
    assert lines[14] == "gradWeight output (first 10 elements):"
    assert [line.split(" = ")[0] for line in lines[15:25]] == [f"gradWeight[{i}]" for i in range(10)]
    assert all(VALUE_LINE.match(line) for line in lines[15:25]), lines[15:25]
    assert lines[25].startswith("check gradX against acl_swiglu.reference: PASS float16: 0/524288 failing")
    assert lines[26].startswith("  MERE ")
    assert lines[27].startswith("check gradWeight against acl_swiglu.reference: PASS float32: 0/512 failing")
    assert lines[28].startswith("  MERE ")
    assert lines[29] == "verdict: PASS"
    assert len(lines) == 30, lines[30:]
    assert "Traceback" not in err
    if info.backend == "emulator":
        assert root.endswith(os.path.join("acl_swiglu", "_emulator"))
        assert err == ""


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_default_run_subprocess(tmp_path, entry):
    assert Path(ENTRY_POINTS[entry][0]).exists(), f"{ENTRY_POINTS[entry][0]} is not installed"
    proc = run_cli(tmp_path, entry=entry)
    assert proc.returncode == 0, proc.stderr
    # the subprocess imported the installed package: the same library root as this process
    _check_default_text(proc.stdout, proc.stderr, installed_backend())


def test_default_run_in_process(capsys):
    rc, out, err = run_inproc(capsys)
    assert rc == 0
    _check_default_text(out, err, installed_backend())


def test_default_values_match_reference_and_model(capsys):
    rc, out, _ = run_inproc(capsys)
    assert rc == 0
    lines = out.splitlines()
    printed_x = value_lines(lines, "gradX")
    printed_w = value_lines(lines, "gradWeight")
    assert len(printed_x) == 10 and len(printed_w) == 10
    inputs = example_inputs()
    gx, gw, mx, mw, _ = expected_first(inputs)
    # within the fp16 verdict (tol 1e-3) for gradX, fp32 (tol 1e-4) for gradWeight
    for text, golden in zip(printed_x, gx):
        assert abs(float(text) - golden) <= 1e-3 + 1e-3 * abs(golden) + PRINT_SLACK, (text, golden)
    for text, golden in zip(printed_w, gw):
        assert abs(float(text) - golden) <= 1e-4 + 1e-4 * abs(golden) + PRINT_SLACK, (text, golden)
    if on_emulator():
        assert printed_x == ["%f" % float(v) for v in mx]
        assert printed_w == ["%f" % float(v) for v in mw]
        # what the documented example prints (the emulator's kernel is the device formula, docs/operator.md)
        assert printed_x[:3] == ["-0.000000", "-0.000758", "-0.002106"]
        assert printed_w[:2] == ["312.598938", "314.938965"]


def test_json_reports_what_the_text_prints(capsys):
    rc_text, out, _ = run_inproc(capsys)
    rc_json, report, err = json_inproc(capsys)
    assert rc_text == rc_json == 0
    lines = out.splitlines()
    assert value_lines(lines, "gradX") == ["%f" % v for v in report["grad_x_first"]]
    assert value_lines(lines, "gradWeight") == ["%f" % v for v in report["grad_weight_first"]]
    info = installed_backend()
    assert report["backend"] == info.as_dict()
    assert report["ok"] is True and report["check"]["passed"] is True
    assert report["inputs"] == {"dtype": "fp16",
                                "shapes": {"grad_y": [512, 512], "x": [512, 1024], "weight": [512, 1],
                                           "y_origin": [512, 512], "group_index": [2]},
                                "clamp_limit": 1.0, "group_index": [256, 256], "data": "documented patterns"}
    check = report["check"]
    assert check["grad_x"]["dtype"] == "float16" and check["grad_x"]["count"] == 512 * 1024
    assert check["grad_weight"]["dtype"] == "float32" and check["grad_weight"]["count"] == 512
    assert check["grad_x"]["failures"] == 0 and check["grad_weight"]["failures"] == 0
    assert check["grad_x"]["tol"] == 1e-3 and check["grad_weight"]["tol"] == 1e-4
    assert "timing" not in report
    assert_report_values(report, example_inputs())
    if info.backend == "emulator":
        assert err == ""


# ----------------------------------------------------------------------------- options

# (options, expected inputs section, example_inputs(...) arguments or None for --random data)
OPTION_CASES = {
    "small": (["--tokens", 6, "--hidden", 5],
              {"dtype": "fp16", "shapes": {"grad_y": [6, 5], "x": [6, 10], "weight": [6, 1], "y_origin": [6, 5],
                                           "group_index": [2]},
               "clamp_limit": 1.0, "group_index": [3, 3], "data": "documented patterns"},
              dict(tokens=6, hidden=5)),
    "odd_rows_halves": (["--tokens", 7, "--hidden", 4],
                        {"dtype": "fp16", "shapes": {"grad_y": [7, 4], "x": [7, 8], "weight": [7, 1],
                                                     "y_origin": [7, 4], "group_index": [2]},
                         "clamp_limit": 1.0, "group_index": [3, 4], "data": "documented patterns"},
                        dict(tokens=7, hidden=4, groups=[3, 4])),
    "batch_3d": (["--batch", 2, "--tokens", 3, "--hidden", 4],
                 {"dtype": "fp16", "shapes": {"grad_y": [2, 3, 4], "x": [2, 3, 8], "weight": [2, 3, 1],
                                              "y_origin": [2, 3, 4], "group_index": [2]},
                  "clamp_limit": 1.0, "group_index": [3, 3], "data": "documented patterns"},
                 dict(batch=2, tokens=3, hidden=4)),
    "fp32": (["--dtype", "fp32", "--tokens", 8, "--hidden", 16],
             {"dtype": "fp32", "shapes": {"grad_y": [8, 16], "x": [8, 32], "weight": [8, 1], "y_origin": [8, 16],
                                          "group_index": [2]},
              "clamp_limit": 1.0, "group_index": [4, 4], "data": "documented patterns"},
             dict(dtype="fp32", tokens=8, hidden=16)),
    "bf16": (["--dtype", "bf16", "--tokens", 8, "--hidden", 16],
             {"dtype": "bf16", "shapes": {"grad_y": [8, 16], "x": [8, 32], "weight": [8, 1], "y_origin": [8, 16],
                                          "group_index": [2]},
              "clamp_limit": 1.0, "group_index": [4, 4], "data": "documented patterns"},
             dict(dtype="bf16", tokens=8, hidden=16)),
    "clamp_none": (["--clamp", "none", "--tokens", 8, "--hidden", 16],
                   {"dtype": "fp16", "shapes": {"grad_y": [8, 16], "x": [8, 32], "weight": [8, 1],
                                                "y_origin": [8, 16], "group_index": [2]},
                    "clamp_limit": None, "group_index": [4, 4], "data": "documented patterns"},
                   dict(tokens=8, hidden=16, clamp=None)),
    "clamp_2.5": (["--clamp", "2.5", "--tokens", 8, "--hidden", 16],
                  {"dtype": "fp16", "shapes": {"grad_y": [8, 16], "x": [8, 32], "weight": [8, 1],
                                               "y_origin": [8, 16], "group_index": [2]},
                   "clamp_limit": 2.5, "group_index": [4, 4], "data": "documented patterns"},
                  dict(tokens=8, hidden=16, clamp=2.5)),
    "groups_none": (["--group-index", "none", "--tokens", 8, "--hidden", 16],
                    {"dtype": "fp16", "shapes": {"grad_y": [8, 16], "x": [8, 32], "weight": [8, 1],
                                                 "y_origin": [8, 16]},
                     "clamp_limit": 1.0, "group_index": None, "data": "documented patterns"},
                    dict(tokens=8, hidden=16, groups=None)),
    "groups_custom": (["--group-index", "1", "--tokens", 4, "--hidden", 2],
                      {"dtype": "fp16", "shapes": {"grad_y": [4, 2], "x": [4, 4], "weight": [4, 1],
                                                   "y_origin": [4, 2], "group_index": [1]},
                       "clamp_limit": 1.0, "group_index": [1], "data": "documented patterns"},
                      dict(tokens=4, hidden=2, groups=[1])),
    "groups_over_T": (["--group-index", "3,1000", "--tokens", 8, "--hidden", 16],
                      {"dtype": "fp16", "shapes": {"grad_y": [8, 16], "x": [8, 32], "weight": [8, 1],
                                                   "y_origin": [8, 16], "group_index": [2]},
                       "clamp_limit": 1.0, "group_index": [3, 1000], "data": "documented patterns"},
                      dict(tokens=8, hidden=16, groups=[3, 1000])),
    "zero_groups": (["--group-index", "", "--tokens", 4, "--hidden", 2],
                    {"dtype": "fp16", "shapes": {"grad_y": [4, 2], "x": [4, 4], "weight": [4, 1],
                                                 "y_origin": [4, 2], "group_index": [0]},
                     "clamp_limit": 1.0, "group_index": [], "data": "documented patterns"},
                    dict(tokens=4, hidden=2, groups=[])),
    "no_weight": (["--no-weight", "--tokens", 8, "--hidden", 16],
                  {"dtype": "fp16", "shapes": {"grad_y": [8, 16], "x": [8, 32], "group_index": [2]},
                   "clamp_limit": 1.0, "group_index": [4, 4], "data": "documented patterns"},
                  dict(tokens=8, hidden=16, weight=False)),
    "no_weight_3d_groups": (["--no-weight", "--batch", 2, "--tokens", 4, "--hidden", 3, "--group-index", "1,2"],
                            {"dtype": "fp16", "shapes": {"grad_y": [2, 4, 3], "x": [2, 4, 6], "group_index": [2]},
                             "clamp_limit": 1.0, "group_index": [1, 2], "data": "documented patterns"},
                            dict(batch=2, tokens=4, hidden=3, weight=False, groups=[1, 2])),
    "empty_tokens": (["--tokens", 0, "--hidden", 8],
                     {"dtype": "fp16", "shapes": {"grad_y": [0, 8], "x": [0, 16], "weight": [0, 1],
                                                  "y_origin": [0, 8], "group_index": [2]},
                      "clamp_limit": 1.0, "group_index": [0, 0], "data": "documented patterns"},
                     dict(tokens=0, hidden=8)),
    "random": (["--random", "--seed", 7, "--tokens", 16, "--hidden", 24, "--dtype", "fp32"],
               {"dtype": "fp32", "shapes": {"grad_y": [16, 24], "x": [16, 48], "weight": [16, 1],
                                            "y_origin": [16, 24], "group_index": [2]},
                "clamp_limit": 1.0, "group_index": [8, 8], "data": "random (seed 7)"},
               None),
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_option_changes_inputs_and_values(capsys, case):
    args, want_inputs, example = OPTION_CASES[case]
    rc, report, _ = json_inproc(capsys, *args)
    assert rc == 0 and report["ok"] is True
    assert report["inputs"] == want_inputs
    inputs = example_inputs(**example) if example is not None else cli_inputs(*args)
    assert_report_values(report, inputs)
    check = report["check"]
    assert check["passed"] is True
    assert check["grad_x"]["dtype"] == OUT_NAMES[want_inputs["dtype"]]
    assert check["grad_x"]["count"] == math.prod(want_inputs["shapes"]["x"])
    assert ("grad_weight" in check) == ("weight" in want_inputs["shapes"])


def test_group_index_truncates_rows(capsys):
    # 4 rows of 2H = 4: the first 10 values are row 0, row 1 and half of row 2
    rc, one, _ = json_inproc(capsys, "--group-index", "1", "--tokens", 4, "--hidden", 2, "--clamp", "none")
    assert rc == 0
    # row 0 computed (gradY[0, 0] = 0 makes its columns h = 0 zero: gradX[0, 0] and gradX[0, H + 0])
    assert one["grad_x_first"][1] != 0.0 and one["grad_x_first"][3] != 0.0
    assert_report_values(one, example_inputs(tokens=4, hidden=2, groups=[1], clamp=None))
    assert one["grad_x_first"][4:] == [0.0] * 6                            # rows >= 1 are zero
    assert not any(math.copysign(1.0, v) < 0 for v in one["grad_x_first"][4:])   # +0.0
    assert one["grad_weight_first"][0] != 0.0 and one["grad_weight_first"][1:] == [0.0] * 3
    rc, zero, _ = json_inproc(capsys, "--group-index", "", "--tokens", 4, "--hidden", 2, "--clamp", "none")
    assert rc == 0
    assert zero["grad_x_first"] == [0.0] * 10 and zero["grad_weight_first"] == [0.0] * 4
    rc, full, _ = json_inproc(capsys, "--group-index", "none", "--tokens", 4, "--hidden", 2, "--clamp", "none")
    rc2, over, _ = json_inproc(capsys, "--group-index", "99", "--tokens", 4, "--hidden", 2, "--clamp", "none")
    assert rc == rc2 == 0
    assert all(v != 0.0 for v in full["grad_weight_first"])
    assert over["grad_x_first"] == full["grad_x_first"] and over["grad_weight_first"] == full["grad_weight_first"]
    assert full["grad_x_first"][:4] == one["grad_x_first"][:4]


def test_clamp_none_changes_values(capsys):
    rc, clamped, _ = json_inproc(capsys)
    rc2, free, _ = json_inproc(capsys, "--clamp", "none")
    assert rc == rc2 == 0
    assert clamped["inputs"]["clamp_limit"] == 1.0 and free["inputs"]["clamp_limit"] is None
    # row 0: x0 = -5 .. -0.5 (never clamped), x1[1] = 1.5 (clamped to 1.0): gradX[0, 1] changes by 1.5x
    assert clamped["grad_x_first"][1] != 0.0
    assert free["grad_x_first"][1] == pytest.approx(1.5 * clamped["grad_x_first"][1], rel=2e-3)
    assert clamped["grad_x_first"] != free["grad_x_first"]
    # gradWeight does not depend on the clamp
    assert clamped["grad_weight_first"] == free["grad_weight_first"]
    assert_report_values(free, example_inputs(clamp=None))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_dtype_option_text(capsys, dtype):
    rc, out, _ = run_inproc(capsys, "--dtype", dtype)
    assert rc == 0
    lines = out.splitlines()
    assert lines[2].startswith(f"gradY [512, 512] x [512, 1024] {dtype}, ")
    name = OUT_NAMES[dtype]
    assert any(line.startswith(f"check gradX against acl_swiglu.reference: PASS {name}:") for line in lines)
    assert lines[-1] == "verdict: PASS"
    inputs = example_inputs(dtype=dtype)
    _, _, mx, mw, _ = expected_first(inputs)
    gx = reference.swiglu_group_quant_grad(*[inputs[k] for k in ("grad_y", "x", "weight", "y_origin",
                                                                   "group_index", "clamp_limit")])[0]
    tol = reference.TOLERANCES[name][0]
    for text, golden in zip(value_lines(lines, "gradX"), gx.reshape(-1)[:10]):
        assert abs(float(text) - golden) <= tol + tol * abs(golden) + PRINT_SLACK
    if on_emulator():
        assert value_lines(lines, "gradX") == ["%f" % float(v) for v in mx]


def test_no_weight_prints_no_grad_weight(capsys):
    rc, out, _ = run_inproc(capsys, "--no-weight")
    assert rc == 0
    lines = out.splitlines()
    assert lines[2] == "gradY [512, 512] x [512, 1024] fp16, weight none, groupIndex [256, 256], clamp 1.0"
    assert len(value_lines(lines, "gradX")) == 10
    assert value_lines(lines, "gradWeight") == []
    assert not any("gradWeight" in line for line in lines)
    assert sum(line.startswith("check ") for line in lines) == 1
    assert lines[-1] == "verdict: PASS"


def test_batch_makes_3d_inputs(capsys):
    rc, out, _ = run_inproc(capsys, "--batch", 2, "--tokens", 256)
    assert rc == 0
    lines = out.splitlines()
    assert lines[2] == ("gradY [2, 256, 512] x [2, 256, 1024] fp16, weight [2, 256, 1], groupIndex [256, 256], "
                        "clamp 1.0")
    # same flat data as the 2-D example: same first values
    rc2, out2, _ = run_inproc(capsys)
    assert rc2 == 0
    assert value_lines(lines, "gradX") == value_lines(out2.splitlines(), "gradX")
    assert value_lines(lines, "gradWeight") == value_lines(out2.splitlines(), "gradWeight")


def test_random_seed_reproducible_and_seeds_differ(capsys):
    args = ["--random", "--tokens", 32, "--hidden", 16]
    rc1, a, _ = json_inproc(capsys, *args, "--seed", 1)
    rc2, b, _ = json_inproc(capsys, *args, "--seed", 1)
    rc3, c, _ = json_inproc(capsys, *args, "--seed", 2)
    rc4, d, _ = json_inproc(capsys, *args)       # default seed 0
    assert rc1 == rc2 == rc3 == rc4 == 0
    assert a["inputs"]["data"] == "random (seed 1)" and d["inputs"]["data"] == "random (seed 0)"
    assert a["grad_x_first"] == b["grad_x_first"] and a["grad_weight_first"] == b["grad_weight_first"]
    assert a["grad_x_first"] != c["grad_x_first"] and a["grad_weight_first"] != c["grad_weight_first"]
    assert d["grad_x_first"] != a["grad_x_first"]
    # random data is not the documented patterns
    rc5, pat, _ = json_inproc(capsys, "--tokens", 32, "--hidden", 16)
    assert rc5 == 0 and pat["grad_x_first"] != d["grad_x_first"]
    assert_report_values(c, cli_inputs(*args, "--seed", 2))


def test_random_seed_reproducible_across_processes(tmp_path):
    args = ["--json", "--random", "--seed", 5, "--tokens", 16, "--hidden", 8]
    first = run_cli(tmp_path, *args)
    second = run_cli(tmp_path, *args, entry="script")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["grad_x_first"] == b["grad_x_first"] and a["grad_weight_first"] == b["grad_weight_first"]


def test_abi_1_and_2_same_values(capsys, clean_env):
    rc1, one, _ = json_inproc(capsys, "--abi", "1")
    rc2, two, _ = json_inproc(capsys, "--abi", "2")
    assert rc1 == rc2 == 0
    assert one["backend"]["abi"] == 1 and two["backend"]["abi"] == 2
    assert one["grad_x_first"] == two["grad_x_first"]
    assert one["grad_weight_first"] == two["grad_weight_first"]
    assert one["check"]["grad_x"] == two["check"]["grad_x"]
    rc, out, _ = run_inproc(capsys, "--abi", "1", "--tokens", 4, "--hidden", 4)
    assert rc == 0 and out.splitlines()[0] == backend_line(installed_backend(), abi=1)


def test_abi_1_with_repeat_and_no_groups(capsys, clean_env):
    rc, report, _ = json_inproc(capsys, "--abi", "1", "--repeat", 2, "--tokens", 8, "--hidden", 8)
    assert rc == 0 and report["timing"]["plan_sync"]["n"] == 2
    rc, report, _ = json_inproc(capsys, "--abi", "1", "--group-index", "none", "--batch", 2, "--tokens", 4,
                                "--hidden", 8)
    assert rc == 0 and report["backend"]["abi"] == 1
    assert_report_values(report, example_inputs(batch=2, tokens=4, hidden=8, groups=None))


def test_backend_option_emulator(tmp_path):
    # without the option, the environment decides (auto: no CANN here falls back with a warning)
    proc = run_cli(tmp_path, "--json", "--backend", "emulator", "--tokens", 4, "--hidden", 4,
                   env=subprocess_env(ACL_SWIGLU_BACKEND="auto"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert_schema(report, REPORT_SCHEMA)
    assert report["backend"]["backend"] == "emulator"
    assert report["backend"]["requested"] == "emulator"
    assert report["backend"]["emulator_version"].startswith("acl-swiglu-emulator")
    assert report["backend"]["root"].endswith(os.path.join("acl_swiglu", "_emulator"))
    assert "RuntimeWarning" not in proc.stderr


@pytest.mark.emulator_only
def test_backend_auto_without_cann_falls_back_visibly(tmp_path):
    env = subprocess_env(ACL_SWIGLU_BACKEND="auto", ASCEND_HOME_PATH=None, ASCEND_TOOLKIT_HOME=None,
                         ACL_SWIGLU_LIB_DIR=None)
    proc = run_cli(tmp_path, "--backend", "auto", "--tokens", 4, "--hidden", 4, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("backend: CPU emulator (ABI revision 2), root ")
    assert "no CANN installation found; running on the bundled CPU emulator" in proc.stderr


def test_device_id_0(capsys):
    rc, report, _ = json_inproc(capsys, "--device-id", 0)
    assert rc == 0 and report["ok"] is True
    assert_report_values(report, example_inputs())


def test_no_check(capsys, monkeypatch):
    rc, out, _ = run_inproc(capsys, "--no-check")
    assert rc == 0
    lines = out.splitlines()
    assert len(value_lines(lines, "gradX")) == 10 and len(value_lines(lines, "gradWeight")) == 10
    assert not any(line.startswith(("check ", "verdict", "  MERE")) for line in lines)
    # no check at all: a wrong reference changes nothing
    monkeypatch.setattr(reference, "swiglu_group_quant_grad", _perturbed(reference.swiglu_group_quant_grad, "x"))
    rc, report, _ = json_inproc(capsys, "--no-check")
    assert rc == 0 and report["ok"] is True and report["exit_status"] == 0
    assert "check" not in report


def test_repeat_prints_timing(capsys):
    rc, out, err = run_inproc(capsys, "--repeat", 3, "--tokens", 16, "--hidden", 32)
    assert rc == 0
    lines = out.splitlines()
    head = lines.index("timing over 3 runs (microseconds, min / median):")
    assert lines[head - 1] == "verdict: PASS"
    rows = [TIMING_LINE.match(line) for line in lines[head + 1:]]
    assert all(rows) and [m.group(1) for m in rows] == ["phase 1", "phase 2 + synchronize",
                                                         "plan call + synchronize"]
    for m in rows:
        assert 0 < float(m.group(2)) <= float(m.group(3))
    assert "\r" not in err     # capsys is not a TTY: no progress bar


def test_repeat_json_timing(capsys):
    rc, report, _ = json_inproc(capsys, "--repeat", 4, "--tokens", 16, "--hidden", 32, "--no-weight")
    assert rc == 0
    timing = report["timing"]
    for key in ("phase1", "phase2_sync", "plan_sync"):
        t = timing[key]
        assert t["n"] == 4
        assert 0 < t["min_us"] <= t["median_us"] <= t["max_us"]


# ----------------------------------------------------------------------------- exit status 1


def _perturbed(original, which):
    def wrong_reference(*args, **kwargs):
        gx, gw = original(*args, **kwargs)
        if which == "x":
            gx = gx * 1.5 + 0.25
        else:
            gw = gw * 1.01 + 1.0
        return gx, gw
    return wrong_reference


def test_failing_check_exits_1(capsys, monkeypatch):
    monkeypatch.setattr(reference, "swiglu_group_quant_grad", _perturbed(reference.swiglu_group_quant_grad, "x"))
    rc, out, err = run_inproc(capsys)
    assert rc == 1
    lines = out.splitlines()
    assert lines[0] == backend_line(installed_backend())
    check_x = next(line for line in lines if line.startswith("check gradX"))
    assert check_x.startswith("check gradX against acl_swiglu.reference: FAIL float16: ")
    failing = int(re.search(r"FAIL float16: (\d+)/524288 failing", check_x).group(1))
    assert failing > 0.001 * 524288
    assert any(line.startswith("check gradWeight against acl_swiglu.reference: PASS") for line in lines)
    assert lines[-1] == "verdict: FAIL"
    assert "Traceback" not in err

    rc, report, _ = json_inproc(capsys)
    assert rc == 1 and report["ok"] is False and report["exit_status"] == 1
    assert report["check"]["passed"] is False
    assert report["check"]["grad_x"]["passed"] is False
    assert report["check"]["grad_x"]["failures"] == failing
    assert report["check"]["grad_x"]["fail_fraction"] > report["check"]["grad_x"]["allowed_fraction"]
    assert report["check"]["grad_weight"]["passed"] is True


def test_failing_grad_weight_check_exits_1(capsys, monkeypatch):
    monkeypatch.setattr(reference, "swiglu_group_quant_grad", _perturbed(reference.swiglu_group_quant_grad, "w"))
    rc, report, _ = json_inproc(capsys, "--tokens", 8, "--hidden", 8)
    assert rc == 1 and report["ok"] is False
    assert report["check"]["grad_x"]["passed"] is True
    assert report["check"]["grad_weight"]["passed"] is False
    assert report["check"]["grad_weight"]["failures"] == 8
    assert report["check"]["passed"] is False


def test_failing_check_exits_1_in_a_process(tmp_path):
    script = ("import sys\n"
              "import acl_swiglu.reference as r\n"
              "original = r.swiglu_group_quant_grad\n"
              "def wrong(*a, **k):\n"
              "    gx, gw = original(*a, **k)\n"
              "    return gx + 0.5, gw\n"
              "r.swiglu_group_quant_grad = wrong\n"
              "from acl_swiglu.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", script, "--tokens", "8", "--hidden", "8"], cwd=tmp_path,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines()[-1] == "verdict: FAIL"
    assert "check gradX against acl_swiglu.reference: FAIL" in proc.stdout
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- exit status 2

BAD_OPTIONS = [
    (["--dtype", "fp64"], "argument --dtype: invalid choice: 'fp64'"),
    (["--tokens", "-1"], "argument --tokens: must be >= 0, got -1"),
    (["--tokens", "abc"], "argument --tokens: 'abc' is not a whole number"),
    (["--hidden", "1.5"], "argument --hidden: '1.5' is not a whole number"),
    (["--batch", "0"], "argument --batch: must be >= 1, got 0"),
    (["--clamp", "0"], "argument --clamp: must be a finite number > 0"),
    (["--clamp", "-1"], "argument --clamp: must be a finite number > 0"),
    (["--clamp", "inf"], "argument --clamp: must be a finite number > 0"),
    (["--clamp", "nan"], "argument --clamp: must be a finite number > 0"),
    (["--clamp", "big"], "argument --clamp: 'big' is not a number (or 'none')"),
    (["--group-index", "1,x"], "argument --group-index: '1,x' is not a comma-separated list of ints"),
    (["--seed", "x"], "argument --seed: 'x' is not a whole number"),
    (["--abi", "3"], "argument --abi: invalid choice: '3'"),
    (["--backend", "gpu"], "argument --backend: invalid choice: 'gpu'"),
    (["--device-id", "-2"], "argument --device-id: must be >= 0, got -2"),
    (["--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--tokens"], "argument --tokens: expected one argument"),
]


@pytest.mark.parametrize("args,message", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_options_exit_2(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(args)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("usage: acl-swiglu-sample ")
    assert f"acl-swiglu-sample: error: {message}" in captured.err


@pytest.mark.parametrize("entry", EXIT_ENTRY_POINTS)
def test_bad_option_exit_2_in_a_process(tmp_path, entry):
    proc = run_cli(tmp_path, "--dtype", "fp64", entry=entry)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("usage: acl-swiglu-sample ")
    assert "acl-swiglu-sample: error: argument --dtype: invalid choice: 'fp64'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_out_of_range_values_are_usage_errors(capsys):
    # numbers float32 cannot use as a limit are rejected by the parser, naming the option
    for value in ("1e39", "1e-50"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["--clamp", value, "--tokens", "4", "--hidden", "4"])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2
        assert err.startswith("usage: acl-swiglu-sample ")
        assert "acl-swiglu-sample: error: argument --clamp: must be a finite number > 0 within float32 range" in err
        assert value in err and "Traceback" not in err


def test_bad_environment_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("ACL_SWIGLU_ABI", "7")
    rc, out, err = run_inproc(capsys, "--tokens", 4, "--hidden", 4)
    assert rc == 2
    assert "acl-swiglu-sample: error: ACL_SWIGLU_ABI='7' is not an ABI revision" in err
    assert "Traceback" not in err


def test_negative_seed_is_a_usage_error(tmp_path):
    """`--random --seed -1` is refused by the parser (exit 2), rather than reaching numpy inside
    run() as a traceback with the 'check failed' status."""
    proc = run_cli(tmp_path, "--random", "--seed", "-1", "--tokens", 4, "--hidden", 4)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2
    assert "acl-swiglu-sample: error: argument --seed" in proc.stderr


def test_huge_group_count_is_a_usage_error(tmp_path):
    """A --group-index count beyond int64 is refused by the parser (exit 2), rather than raising
    OverflowError from np.asarray(..., int64) inside run()."""
    proc = run_cli(tmp_path, "--group-index", "99999999999999999999", "--tokens", 4, "--hidden", 4)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2
    assert "acl-swiglu-sample: error: argument --group-index" in proc.stderr


# ----------------------------------------------------------------------------- exit status 3

FAULTS = [
    ("aclnnSwigluGroupQuantGrad:1:507015", "aclnnSwigluGroupQuantGrad", "ACL_ERROR_RT_AICORE_EXCEPTION", 507015),
    ("aclnnSwigluGroupQuantGradGetWorkspaceSize:1:561002", "aclnnSwigluGroupQuantGradGetWorkspaceSize",
     "ACLNN_ERR_INNER_TILING_ERROR", 561002),
    ("aclrtMemcpy:1:507000", "aclrtMemcpy", "ACL_ERROR_RT_INTERNAL_ERROR", 507000),   # (memory: exit 5, below)
    ("aclrtSynchronizeStream:1:507000", "aclrtSynchronizeStream", "ACL_ERROR_RT_INTERNAL_ERROR", 507000),
]


@pytest.mark.emulator_only
@pytest.mark.parametrize("entry", EXIT_ENTRY_POINTS)
def test_acl_error_exits_3(tmp_path, entry):
    proc = run_cli(tmp_path, entry=entry, env=subprocess_env(ACL_EMU_FAIL="aclnnSwigluGroupQuantGrad:1:507015"))
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert ("acl-swiglu-sample: ACL error: aclnnSwigluGroupQuantGrad failed with ACL_ERROR_RT_AICORE_EXCEPTION "
            "(507015)") in proc.stderr
    assert "injected fault (call 1 of aclnnSwigluGroupQuantGrad, planned by ACL_EMU_FAIL)" in proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == backend_line(installed_backend())
    assert not any(line.startswith(("gradX", "verdict")) for line in lines)


@pytest.mark.emulator_only
@pytest.mark.parametrize("plan,api,name,code", FAULTS, ids=[f[1] for f in FAULTS])
def test_acl_error_json(tmp_path, plan, api, name, code):
    proc = run_cli(tmp_path, "--json", "--tokens", 8, "--hidden", 8, env=subprocess_env(ACL_EMU_FAIL=plan))
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert f"ACL error: {api} failed with {name} ({code})" in proc.stderr
    report = json.loads(proc.stdout)
    assert_schema(report, ERROR_REPORT_SCHEMA)
    assert report["error"]["kind"] == "acl"
    assert report["error"]["api"] == api and report["error"]["name"] == name and report["error"]["code"] == code
    assert "injected fault" in report["error"]["message"]


@pytest.mark.emulator_only
def test_acl_error_during_repeat_exits_3(tmp_path):
    # the 3rd launch is inside the timing loop
    proc = run_cli(tmp_path, "--repeat", 5, "--tokens", 8, "--hidden", 8,
                   env=subprocess_env(ACL_EMU_FAIL="aclnnSwigluGroupQuantGrad:3:507015"))
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert "verdict: PASS" in proc.stdout
    assert "ACL error: aclnnSwigluGroupQuantGrad failed with ACL_ERROR_RT_AICORE_EXCEPTION" in proc.stderr


@pytest.mark.emulator_only
@pytest.mark.parametrize("entry", EXIT_ENTRY_POINTS)
def test_invalid_device_id_exits_3(tmp_path, entry):
    proc = run_cli(tmp_path, "--device-id", 5, entry=entry)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert "acl-swiglu-sample: ACL error: aclrtSetDevice failed with ACL_ERROR_RT_INVALID_DEVICEID (107001)" \
        in proc.stderr
    assert "deviceId 5 is out of range" in proc.stderr
    assert proc.stdout.splitlines()[0] == backend_line(installed_backend())
    assert "gradX output" not in proc.stdout


@pytest.mark.emulator_only
def test_invalid_device_id_json(capsys):
    rc, out, err = run_inproc(capsys, "--json", "--device-id", 5, "--tokens", 4, "--hidden", 4)
    try:
        assert rc == 3
        report = json.loads(out)
        assert_schema(report, ERROR_REPORT_SCHEMA)
        assert report["error"] == {"kind": "acl", "api": "aclrtSetDevice", "code": 107001,
                                   "name": "ACL_ERROR_RT_INVALID_DEVICEID",
                                   "message": report["error"]["message"]}
        assert "deviceId 5 is out of range" in report["error"]["message"]
        assert "Traceback" not in err
    finally:
        acl_swiglu.set_device(0)   # the failed choice must not leak into later tests


@pytest.mark.emulator_only
def test_failed_device_id_does_not_poison_later_runs(capsys):
    """A failed --device-id 5 leaves nothing behind: later in-process runs (without --device-id)
    still run on the default device instead of failing with ACL_ERROR_RT_INVALID_DEVICEID."""
    try:
        rc, _, _ = run_inproc(capsys, "--device-id", 5, "--tokens", 4, "--hidden", 4)
        assert rc == 3
        rc, out, err = run_inproc(capsys, "--tokens", 4, "--hidden", 4)
        assert rc == 0, err
        assert out.splitlines()[-1] == "verdict: PASS"
    finally:
        acl_swiglu.set_device(0)


NO_CANN_ENV = dict(ASCEND_HOME_PATH=None, ASCEND_TOOLKIT_HOME=None, ACL_SWIGLU_LIB_DIR=None,
                   LD_LIBRARY_PATH=None, ASCEND_CUSTOM_OPP_PATH=None, ASCEND_OPP_PATH=None)


@pytest.mark.emulator_only
@pytest.mark.parametrize("how", ["environment", "option"])
def test_missing_cann_exits_3(tmp_path, how):
    if how == "environment":
        proc = run_cli(tmp_path, env=subprocess_env(ACL_SWIGLU_BACKEND="cann", **NO_CANN_ENV))
    else:
        proc = run_cli(tmp_path, "--backend", "cann", env=subprocess_env(ACL_SWIGLU_BACKEND="emulator",
                                                                           **NO_CANN_ENV))
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert "the system loader has no libascendcl.so" in proc.stderr
    assert "source <CANN root>/set_env.sh" in proc.stderr   # the fix
    if how == "environment":   # what the user set, and the fix in the same terms
        assert "acl-swiglu-sample: ACL_SWIGLU_BACKEND=cann but no CANN was found" in proc.stderr
        assert "set ACL_SWIGLU_BACKEND=emulator" in proc.stderr
    else:
        assert "acl-swiglu-sample: --backend cann but no CANN was found" in proc.stderr
        assert "use --backend emulator" in proc.stderr
        assert "ACL_SWIGLU_BACKEND" not in proc.stderr


@pytest.mark.emulator_only
def test_missing_cann_json_and_empty_lib_dir(tmp_path):
    empty = tmp_path / "no-cann-here"
    empty.mkdir()
    proc = run_cli(tmp_path, "--json", env=subprocess_env(ACL_SWIGLU_BACKEND="cann",
                                                          **{**NO_CANN_ENV, "ACL_SWIGLU_LIB_DIR": str(empty)}))
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert_schema(report, ERROR_REPORT_SCHEMA)
    assert report["error"]["kind"] == "LibraryNotFoundError"
    message = report["error"]["message"]
    assert message.startswith("CANN libraries not found: no libascendcl.so or libacl_rt.so in any configured root")
    assert os.path.join(str(empty), "lib64", "libascendcl.so") in message
    assert "set_env.sh" in message and "ACL_SWIGLU_BACKEND=emulator" in message
    assert "CANN libraries not found" in proc.stderr


@pytest.mark.emulator_only
def test_backend_cann_in_process_after_emulator_loaded(capsys, clean_env):
    """Once a process has loaded the emulator, `main(["--backend", "cann"])` cannot switch: it
    must not run on the emulator, and says that another process is needed (a usage error)."""
    installed_backend()   # the emulator is loaded in this process
    rc, out, err = run_inproc(capsys, "--backend", "cann", "--tokens", 4, "--hidden", 4)
    assert "CPU emulator" not in out, "asked for CANN, ran on the emulator"
    assert rc == 2
    assert "--backend cann needs a new process" in err and "Traceback" not in err


def test_in_process_run_leaves_the_environment_alone(capsys, clean_env):
    """--backend / --abi apply to one run: os.environ is as before afterwards, so an in-process
    caller does not keep ABI revision 1 (or the backend choice) for later calls."""
    before = {k: os.environ.get(k) for k in ("ACL_SWIGLU_BACKEND", "ACL_SWIGLU_ABI")}
    rc, _, _ = run_inproc(capsys, "--abi", "1", "--backend", "emulator", "--tokens", 4, "--hidden", 4)
    assert rc == 0
    after = {k: os.environ.get(k) for k in before}
    assert after == before
    assert acl_swiglu.abi_revision() == (1 if before["ACL_SWIGLU_ABI"] == "1" else 2)


@pytest.mark.emulator_only
def test_exit_frees_every_handle_before_acl_finalize(tmp_path):
    """At interpreter exit the per-thread stream of one-shot calls and its workspace are freed
    before aclFinalize, whatever order the atexit hooks of the runtime and of weakref.finalize
    run in; the emulator's leak check shows anything left."""
    for args in (["--tokens", 8, "--hidden", 8], ["--repeat", 2, "--tokens", 8, "--hidden", 8]):
        proc = run_cli(tmp_path, *args, env=subprocess_env(ACL_EMU_LEAK_CHECK="1"))
        assert proc.returncode == 0, proc.stderr
        assert "acl-swiglu emulator: leak check at aclFinalize: no live handles" in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- progress bar


class FakeClock:
    """perf_counter advancing 0.25 s per call: every --repeat run looks long."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self):
        self.now += 0.25
        return self.now


def test_progress_bar_on_a_tty(capsys, monkeypatch):
    monkeypatch.setattr(cli, "time", FakeClock())
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    rc, out, err = run_inproc(capsys, "--repeat", 20, "--tokens", 4, "--hidden", 4, "--no-check")
    assert rc == 0
    for label in ("phase 1", "phase 2 + synchronize", "plan + synchronize"):
        assert f"\r{label:<22} [" in err, err
    assert err.count(f"[{'#' * 30}] 20/20 eta ") == 3
    assert err.count("\n") == 3 and err.endswith("\n")
    # the bar is on stderr only; stdout has the timing lines
    assert "\r" not in out
    assert "timing over 20 runs (microseconds, min / median):" in out


def test_no_progress_bar_without_a_tty(capsys, monkeypatch):
    monkeypatch.setattr(cli, "time", FakeClock())
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    rc, out, err = run_inproc(capsys, "--repeat", 20, "--tokens", 4, "--hidden", 4, "--no-check")
    assert rc == 0
    assert err == ""
    assert "timing over 20 runs (microseconds, min / median):" in out


def test_no_progress_bar_for_a_short_run_on_a_tty(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    rc, out, err = run_inproc(capsys, "--repeat", 3, "--tokens", 4, "--hidden", 4, "--no-check")
    assert rc == 0
    assert err == ""


def _run_with_tty_stderr(cmd, cwd, env, timeout=300):
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=slave)
    finally:
        os.close(slave)
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:   # EIO once the child's side is closed
                break
            if not data:
                break
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        reader.join(timeout=30)
        os.close(master)
    return proc.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


def test_progress_bar_real_tty_and_pipe(tmp_path):
    """A real process whose stderr is a pseudo-terminal, and the same run piped. --progress-after 0
    shows the bar from the first call, so what appears does not depend on how fast the machine is."""
    repeat = 12
    args = [str(a) for a in ("--repeat", repeat, "--progress-after", 0, "--tokens", 8, "--hidden", 16,
                             "--no-check")]
    piped = run_cli(tmp_path, *args)
    rc, out, err = _run_with_tty_stderr(ENTRY_POINTS["module"] + args, tmp_path, subprocess_env())
    assert rc == 0, err
    assert f"timing over {repeat} runs" in out
    labels = ("phase 1", "phase 2 + synchronize", "plan + synchronize")
    for label in labels:
        # every call redraws the bar (12 < 100 steps), ending complete
        drawn = re.findall(rf"\r{re.escape(label)} +\[([#.]{{30}})\] (\d+)/{repeat} eta ", err)
        assert [int(done) for _, done in drawn] == list(range(1, repeat + 1)), (label, err[-400:])
        assert drawn[-1][0] == "#" * 30
    assert err.count("\n") == len(labels)           # each bar ends its line once
    assert "Traceback" not in err
    assert piped.returncode == 0, piped.stderr
    assert "\r" not in piped.stderr and "eta" not in piped.stderr
    assert f"timing over {repeat} runs" in piped.stdout


def test_progress_after_waits_for_its_delay(capsys, monkeypatch):
    # The fake clock advances 0.25 s per reading, several readings per call: with --progress-after 0
    # the phase 1 bar starts at call 1, with 3 seconds some calls later, and both end complete.
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    first_shown = {}
    for after in (0, 3):
        monkeypatch.setattr(cli, "time", FakeClock())
        rc, out, err = run_inproc(capsys, "--repeat", 20, "--progress-after", after, "--tokens", 4,
                                  "--hidden", 4, "--no-check")
        assert rc == 0
        shown = [int(done) for done in re.findall(r"\rphase 1 +\[[#.]{30}\] (\d+)/20 eta ", err)]
        first_shown[after] = shown[0]
        assert shown == list(range(shown[0], 21))
        assert err.count(f"[{'#' * 30}] 20/20 eta ") == 3
    assert first_shown[0] == 1
    assert 1 < first_shown[3] < 20


@pytest.mark.parametrize("value", ["-1", "inf", "nan", "soon"])
def test_progress_after_must_be_seconds(capsys, value):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--progress-after", value])
    assert exc.value.code == 2
    assert "argument --progress-after:" in capsys.readouterr().err


# ----------------------------------------------------------------------------- host memory


@pytest.mark.parametrize("sizes", [("--tokens", 10**9, "--hidden", 10**9),
                                   ("--tokens", 2**40, "--hidden", 4096, "--batch", 2**30),
                                   ("--tokens", 10**6, "--hidden", 10**6, "--dtype", "fp32")])
def test_more_memory_than_the_host_has_is_a_resource_error(capsys, sizes):
    rc, out, err = run_inproc(capsys, *sizes)
    assert rc == 5, err
    assert "Traceback" not in err and "internal error" not in err
    assert "GiB of host memory" in err and "choose smaller sizes" in err
    assert f"--tokens {sizes[1]} --hidden {sizes[3]}" in err


def test_more_memory_than_the_host_has_json(capsys):
    rc, out, err = run_inproc(capsys, "--json", "--tokens", 10**9, "--hidden", 10**9)
    report = json.loads(out)
    assert rc == 5 and report["exit_status"] == 5 and report["ok"] is False
    assert_schema(report, ERROR_REPORT_SCHEMA)
    assert report["error"]["kind"] == "HostMemoryError" and "GiB" in report["error"]["message"]
    assert report["backend"]["backend"] in ("emulator", "cann")


def test_a_process_memory_limit_is_respected(tmp_path):
    # Under `ulimit -v` 1 GiB an 8192 x 4096 run (about 2 GiB to build its inputs) is refused up front.
    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = subprocess_env(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(ENTRY_POINTS["module"] + ["--tokens", "8192", "--hidden", "4096"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert proc.returncode == 5, proc.stderr
    assert "address-space limit (ulimit -v)" in proc.stderr and "Traceback" not in proc.stderr


def test_an_allocation_that_fails_later_is_a_resource_error_too(capsys, monkeypatch):
    # Past the up-front estimate, numpy's own MemoryError (here a real one: 4 EiB) still exits 5.
    def greedy(args, rng=None):
        return np.empty(1 << 62, dtype=np.uint8)

    monkeypatch.setattr(cli, "make_inputs", greedy)
    for extra in ([], ["--json"]):
        rc, out, err = run_inproc(capsys, *extra, "--tokens", 4, "--hidden", 4)
        assert rc == 5 and "Traceback" not in err
        assert "not enough host memory for this problem (--tokens 4 --hidden 4)" in err
        if extra:
            report = json.loads(out)
            assert_schema(report, ERROR_REPORT_SCHEMA)
            assert report["error"]["kind"] == "HostMemoryError"


# ----------------------------------------------------------------------------- --json on usage errors


@pytest.mark.parametrize("args,message", [(["--json", "--dtype", "fp64"], "argument --dtype: invalid choice"),
                                          (["--tokens", "x", "--json"], "argument --tokens: 'x' is not a whole"),
                                          (["--json", "--bogus"], "unrecognized arguments: --bogus")])
def test_usage_errors_print_json_when_asked(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(args)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert_schema(report, ERROR_REPORT_SCHEMA)
    assert report["exit_status"] == 2 and report["error"]["kind"] == "usage"
    assert message in report["error"]["message"]
    assert captured.err.startswith("usage: acl-swiglu-sample ")      # stderr unchanged


def test_no_json_after_a_double_dash(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--bogus", "--", "--json"])
    assert capsys.readouterr().out == ""


def test_configuration_error_prints_json_when_asked(capsys, monkeypatch):
    monkeypatch.setenv("ACL_SWIGLU_ABI", "7")
    rc, out, err = run_inproc(capsys, "--json", "--tokens", 4, "--hidden", 4)
    assert rc == 2
    report = json.loads(out)
    assert_schema(report, ERROR_REPORT_SCHEMA)
    assert report["error"]["kind"] == "configuration"
    assert "ACL_SWIGLU_ABI='7'" in report["error"]["message"]


# ----------------------------------------------------------------------------- what a bug report needs


def test_json_carries_the_versions(capsys):
    import importlib.metadata
    import platform

    rc, report, _ = json_inproc(capsys, "--tokens", 4, "--hidden", 4)
    assert rc == 0
    versions = report["versions"]
    assert versions["acl_swiglu"] == acl_swiglu.__version__
    assert versions["python"] == platform.python_version() and versions["numpy"] == np.__version__
    assert versions["ml_dtypes"] == importlib.metadata.version("ml_dtypes")
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    assert versions["torch"] == torch_version and versions["platform"] == platform.platform()
    # and in the report of a failure
    with pytest.raises(SystemExit):
        cli.main(["--json", "--dtype", "fp64"])
    assert json.loads(capsys.readouterr().out)["versions"] == versions


@pytest.mark.emulator_only
def test_warnings_are_notes_and_in_the_json_naming_what_the_user_set(tmp_path):
    """With --backend auto and no CANN the loader falls back to the emulator and warns: one
    'note:' line, the same text in the JSON, and its advice in terms of the option given."""
    env = subprocess_env(ACL_SWIGLU_BACKEND=None, **NO_CANN_ENV)
    proc = run_cli(tmp_path, "--json", "--backend", "auto", "--tokens", 4, "--hidden", 4, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert_schema(report, REPORT_SCHEMA)
    [warning] = report["warnings"]
    assert "no CANN installation found; running on the bundled CPU emulator" in warning
    assert "Use --backend emulator to silence this" in warning and "ACL_SWIGLU_BACKEND" not in warning
    assert proc.stderr.splitlines() == [f"note: {warning}"]


def test_abi_help_says_the_install_decides_and_the_variable_overrides():
    text = " ".join(cli.build_parser().format_help().split())
    assert ("--abi {1,2} operator ABI revision, overriding what the install declares (with a warning when they "
            "differ). Default: the revision the install's operator header declares (2 without one); "
            "ACL_SWIGLU_ABI, when set, overrides that the same way") in text


def test_option_names_replace_the_variables_the_cli_sets_for_them():
    args = cli.build_parser().parse_args(["--backend", "cann", "--abi", "1"])
    assert cli.as_the_user_set_it("ACL_SWIGLU_BACKEND=cann but no CANN was found; set ACL_SWIGLU_BACKEND=emulator "
                                  "instead. Set ACL_SWIGLU_BACKEND=emulator to silence this", args) == (
        "--backend cann but no CANN was found; use --backend emulator instead. Use --backend emulator to "
        "silence this")
    assert cli.as_the_user_set_it("acl_swiglu: ACL_SWIGLU_ABI=1 overrides ABI revision 2 declared by h.h; "
                                  "Unset ACL_SWIGLU_ABI to follow the install.", args) == (
        "acl_swiglu: --abi 1 overrides ABI revision 2 declared by h.h; Drop --abi to follow the install.")
    plain = cli.build_parser().parse_args([])   # set in the environment: named as set
    assert cli.as_the_user_set_it("ACL_SWIGLU_BACKEND='cann'", plain) == "ACL_SWIGLU_BACKEND='cann'"


# ----------------------------------------------------------------------------- exit statuses 5 and 130


@pytest.mark.emulator_only
@pytest.mark.parametrize("code,name", [(207001, "ACL_ERROR_RT_MEMORY_ALLOCATION"), (207018, "ACL_ERROR_RT_DEVICE_OOM")])
def test_device_out_of_memory_exits_5(tmp_path, code, name):
    proc = run_cli(tmp_path, "--json", "--tokens", 8, "--hidden", 8,
                   env=subprocess_env(ACL_EMU_FAIL=f"aclrtMalloc:1:{code}"))
    assert proc.returncode == 5, proc.stderr
    assert f"acl-swiglu-sample: device memory: aclrtMalloc failed with {name} ({code})" in proc.stderr
    assert "not enough device memory for this problem (--tokens 8 --hidden 8): choose smaller sizes" in proc.stderr
    report = json.loads(proc.stdout)
    assert_schema(report, ERROR_REPORT_SCHEMA)
    assert report["exit_status"] == 5 and report["error"]["kind"] == "acl" and report["error"]["code"] == code


def _as_on_a_terminal():
    """In the child: SIGINT as a terminal's foreground process has it (a run started in the
    background of a non-interactive shell, as CI may start pytest, inherits it ignored)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.emulator_only
def test_ctrl_c_during_repeat_exits_130_with_one_line(tmp_path):
    import signal

    proc = subprocess.Popen(ENTRY_POINTS["module"] + ["--repeat", str(10**9), "--no-check", "--tokens", "16",
                                                      "--hidden", "4"],
                            cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_as_on_a_terminal)
    try:
        lines = [proc.stdout.readline() for _ in range(25)]   # the run is under way once its values are out
        assert lines[-1].startswith("gradWeight[9] = "), lines
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert err == "acl-swiglu-sample: interrupted\n"
    assert "timing" not in out


INTERRUPTED_JSON_RUN = """
import os, signal, sys, threading
import acl_swiglu.cli as cli

timed = cli.time_phases
def interrupted_soon(*args, **kwargs):   # Ctrl-C once the timing loops have begun
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    return timed(*args, **kwargs)
cli.time_phases = interrupted_soon
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.emulator_only
def test_ctrl_c_with_json_prints_the_report(tmp_path):
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_JSON_RUN, "--json", "--repeat", str(10**9),
                           "--tokens", "4", "--hidden", "4"], cwd=tmp_path, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300, preexec_fn=_as_on_a_terminal)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "acl-swiglu-sample: interrupted\n"
    report = json.loads(proc.stdout)
    assert_schema(report, ERROR_REPORT_SCHEMA)
    assert report["exit_status"] == 130 and report["error"] == {"kind": "interrupted",
                                                                "message": "interrupted (Ctrl-C)"}
    assert report["inputs"]["shapes"]["x"] == [4, 8]


@pytest.mark.parametrize("word", ["--j", "--js", "--jso", "--rep", "--no-c"])
def test_abbreviations_are_usage_errors(capsys, word):
    """An abbreviation used to be taken for its option on success but not by the JSON report of a
    usage error; options are now spelt in full, so every abbreviation is a usage error alike."""
    with pytest.raises(SystemExit) as exc:
        cli.main([word, "--tokens", "4", "--hidden", "4"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"unrecognized arguments: {word}" in captured.err


def test_every_exit_status_is_documented():
    """docs/cli.md, the module's docstring and --help list the same exit statuses, each once."""
    documented = {code: text for code, text in cli.EXIT_STATUSES.items()}
    assert set(documented) == {0, 1, 2, 3, 4, 5, 130, 141}
    page = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    table = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", page, flags=re.M))
    assert sorted(map(int, table)) == sorted(documented), table
    help_text = cli.build_parser().format_help()
    for code, text in documented.items():
        assert re.search(rf"^  {code} +{re.escape(text)}$", help_text, flags=re.M), (code, help_text)
        assert re.search(rf"^  {code} +", cli.__doc__, flags=re.M), code


# ----------------------------------------------------------------------------- --op forward


FORWARD_VALUE_LINE = re.compile(r"^(y|yScale)\[(\d+)\] = (\S+)$")


def forward_values(lines, name):
    found = [m.groups() for m in map(FORWARD_VALUE_LINE.match, lines) if m and m.group(1) == name]
    assert [int(i) for _, i, _ in found] == list(range(len(found))), f"{name} lines out of order"
    return [float(text) for _, _, text in found]


def forward_json(capsys, *args):
    rc, out, err = run_inproc(capsys, "--json", "--op", "forward", *args)
    report = json.loads(out)
    assert report["exit_status"] == rc
    assert_schema(report, FORWARD_REPORT_SCHEMA)
    return rc, report, err


def expected_forward(inputs, **options):
    """The NumPy call's codes and scales for these inputs, as the values the CLI reports."""
    from acl_swiglu import formats

    y, y_scale = acl_swiglu.swiglu_group_quant(inputs["x"], inputs["weight"], inputs["group_index"], **options)
    codes = formats.unpack_fp4(y, options["dst_type"]) if formats.DST_TYPES[options["dst_type"]].packed \
        else y.astype(np.float32)
    scales = formats.e8m0_scales(y_scale) if options["quant_mode"] == 1 else y_scale
    return codes.reshape(-1)[:10].tolist(), scales.reshape(-1)[:10].tolist()


def test_forward_default_run_prints_the_example_and_passes(capsys):
    rc, out, err = run_inproc(capsys, "--op", "forward")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == backend_line(installed_backend())
    assert lines[2] == ("x [512, 1024] fp16, weight [512, 1], groupIndex [256, 256], clamp 1.0; float8_e4m3fn, "
                        "quant mode 0")
    inputs = example_inputs()
    codes, scales = expected_forward(inputs, dst_type="float8_e4m3fn", quant_mode=0, round_scale=False,
                                     clamp_limit=1.0)
    assert forward_values(lines, "y") == codes
    assert forward_values(lines, "yScale") == pytest.approx(scales, rel=1e-5)   # (printed with %g: 6 digits)
    check = next(i for i, line in enumerate(lines) if line.startswith("check y and yScale"))
    assert lines[check].startswith("check y and yScale against acl_swiglu.reference: PASS float8_e4m3fn mode 0: "
                                   "0/262144 codes wrong")
    assert lines[check + 1].endswith("; 512 rows judged")
    assert lines[-1] == "verdict: PASS"


FORWARD_KINDS = [("float8_e4m3fn", 0, False), ("float8_e5m2", 0, True), ("float8_e4m3fn", 1, True),
                 ("float8_e5m2", 1, True), ("float4_e2m1fn", 1, True), ("float4_e1m2", 1, True)]


@pytest.mark.parametrize("dst,mode,rounded", FORWARD_KINDS)
def test_forward_json_reports_the_operators_values(capsys, dst, mode, rounded):
    args = ["--dst-type", dst, "--quant-mode", mode, "--tokens", 24, "--hidden", 256, "--random", "--seed", 3,
            "--dtype", "bf16", "--group-index", "20,1"]
    if rounded and mode == 0:
        args.append("--round-scale")
    rc, report, _ = forward_json(capsys, *args)
    assert rc == 0 and report["ok"] is True and report["op"] == "forward"
    assert report["inputs"] == {"dtype": "bf16", "shapes": {"x": [24, 512], "weight": [24, 1], "group_index": [2]},
                                "clamp_limit": 1.0, "group_index": [20, 1], "dst_type": dst, "quant_mode": mode,
                                "round_scale": rounded, "data": "random (seed 3)"}
    inputs = cli.make_forward_inputs(cli.build_parser().parse_args(
        [str(a) for a in ["--op", "forward", *args]]))
    codes, scales = expected_forward(inputs, dst_type=dst, quant_mode=mode, round_scale=rounded, clamp_limit=1.0)
    assert report["y_first"] == codes and report["y_scale_first"] == scales
    check = report["check"]
    assert check["passed"] is True and check["y"]["passed"] is True
    assert check["y"]["rows_judged"] == 21 and check["y"]["count"] == 21 * 256
    assert check["y"]["dst_type"] == dst and check["y"]["quant_mode"] == mode


def test_forward_fp4_defaults_to_mx_and_options_reach_the_operator(capsys):
    rc, report, _ = forward_json(capsys, "--dst-type", "float4_e2m1fn", "--tokens", 4, "--hidden", 128,
                                 "--no-weight", "--clamp", "none", "--group-index", "none", "--batch", 2)
    assert rc == 0
    assert report["inputs"]["quant_mode"] == 1 and report["inputs"]["round_scale"] is True
    assert report["inputs"]["shapes"] == {"x": [2, 4, 256]} and report["inputs"]["clamp_limit"] is None
    assert report["check"]["y"]["rows_judged"] == 8
    assert all(s == 2.0 ** round(math.log2(s)) for s in report["y_scale_first"])   # E8M0: powers of two


def test_forward_no_check_and_failing_check(capsys, monkeypatch):
    rc, report, _ = forward_json(capsys, "--no-check", "--tokens", 8, "--hidden", 128)
    assert rc == 0 and "check" not in report
    real = acl_swiglu.swiglu_group_quant

    def one_code_off(*args, **kwargs):   # the operator's codes with one of them changed
        y, y_scale = real(*args, **kwargs)
        codes = y.view(np.uint8).copy()
        codes[0, 5] ^= 0x01
        return codes.view(y.dtype), y_scale

    monkeypatch.setattr(acl_swiglu, "swiglu_group_quant", one_code_off)
    rc, report, _ = forward_json(capsys, "--tokens", 8, "--hidden", 128, "--random")
    assert rc == 1 and report["ok"] is False
    assert report["check"]["passed"] is False
    assert report["check"]["y"]["code_mismatches"] == 1 and report["check"]["y"]["worst_index"] == [0, 5]
    rc, out, _ = run_inproc(capsys, "--op", "forward", "--tokens", 8, "--hidden", 128, "--random")
    assert rc == 1 and out.splitlines()[-1] == "verdict: FAIL"


def test_forward_repeat_times_its_phases(capsys):
    rc, out, _ = run_inproc(capsys, "--op", "forward", "--repeat", 3, "--tokens", 16, "--hidden", 128)
    assert rc == 0
    lines = out.splitlines()
    head = lines.index("timing over 3 runs (microseconds, min / median):")
    rows = [TIMING_LINE.match(line) for line in lines[head + 1:]]
    assert all(rows) and [m.group(1) for m in rows] == ["phase 1", "phase 2 + synchronize",
                                                         "plan call + synchronize"]
    rc, report, _ = forward_json(capsys, "--repeat", 2, "--tokens", 16, "--hidden", 128, "--quant-mode", 1)
    assert rc == 0
    for key in ("phase1", "phase2_sync", "plan_sync"):
        assert report["timing"][key]["n"] == 2
        assert 0 < report["timing"][key]["min_us"] <= report["timing"][key]["max_us"]


#: `--json` output of a failed --op forward run: the forward's inputs, when it got as far as them.
FORWARD_ERROR_REPORT_SCHEMA = {**ERROR_REPORT_SCHEMA, "properties": {
    **ERROR_REPORT_SCHEMA["properties"], "inputs": FORWARD_REPORT_SCHEMA["properties"]["inputs"]}}

FORWARD_USAGE_ERRORS = [
    (["--dst-type", "float8_e5m2"], "--dst-type applies to the forward only: add --op forward"),
    (["--quant-mode", "1", "--round-scale"], "--quant-mode, --round-scale apply to the forward only"),
    (["--op", "forward", "--abi", "2"], "--abi chooses the backward's ABI revision"),
    (["--op", "forward", "--dtype", "fp32"], "--dtype fp32: the forward's quant modes 0 and 1 take fp16 or bf16"),
    (["--op", "forward", "--hidden", "100"], "x's last dim is 200; it must be a multiple of 256"),
    (["--op", "forward", "--dst-type", "float4_e1m2", "--quant-mode", "0"], "is produced by quant_mode 1"),
    (["--op", "forward", "--tokens", "0"], "is empty"),
]


@pytest.mark.parametrize("args,message", FORWARD_USAGE_ERRORS, ids=[" ".join(a) for a, _ in FORWARD_USAGE_ERRORS])
def test_forward_usage_errors_exit_2(capsys, args, message):
    rc, out, err = run_inproc(capsys, "--json", *args)
    assert rc == 2
    report = json.loads(out)
    assert_schema(report, FORWARD_ERROR_REPORT_SCHEMA if "--op" in args else ERROR_REPORT_SCHEMA)
    assert message in report["error"]["message"] and message in err
    assert report["error"]["kind"] == "argument"


def test_forward_runs_in_a_process(tmp_path):
    proc = run_cli(tmp_path, "--op", "forward", "--tokens", "8", "--hidden", "128", "--quant-mode", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert_schema(report, FORWARD_REPORT_SCHEMA)
    assert report["check"]["passed"] is True


def test_the_forward_output_shown_in_the_docs_is_what_it_prints(tmp_path):
    from doc_snippets import ROOT, section

    page = section(ROOT / "docs" / "cli.md", "The forward: `--op forward`")
    shown = re.search(r"^```text\n(.*?)^```", page, flags=re.M | re.S).group(1)
    proc = run_cli(tmp_path, "--op", "forward", env=subprocess_env(ACL_SWIGLU_BACKEND="emulator"))
    assert proc.returncode == 0, proc.stderr
    printed = re.sub(r"(root |library: )\S*site-packages", r"\1/…/site-packages", proc.stdout)
    assert printed.strip() == shown.strip()
