"""The fidelity probe (acl_swiglu.probe, docs/fidelity.md): every family runs on the emulator, the
record replays with --check (all agree), and a one-bit change in a recorded case is reported;
the inputs rebuild the same bits from their recipes; cases that would hang a release are
skipped with the reason; workers that outlive their time limit are killed; bad options and
records are refused with the documented exit codes."""

from __future__ import annotations

import base64
import copy
import json
import os
import pty
import subprocess
import sys
import zlib

import numpy as np
import pytest

from acl_swiglu import probe

PROBE = [sys.executable, "-m", "acl_swiglu.probe"]


def run_probe(args, tmp_path, timeout=600, **env):
    # cwd elsewhere, so that the children import the installed package, not the source tree
    return subprocess.run(PROBE + list(args), cwd=tmp_path, env=dict(os.environ, **env), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def record_run(tmp_path_factory):
    """One probe run of every family on the emulator (two cases at a time)."""
    where = tmp_path_factory.mktemp("probe")
    out = where / "record.json"
    proc = run_probe(["--jobs", "2", "--out", str(out)], where)
    return where, out, proc


def _cases(record, family=None):
    return [c for c in record["cases"] if family is None or c["family"] == family]


# ----------------------------------------------------------------------------- a whole run and its replay


def test_every_family_runs_on_the_emulator_quietly_in_a_pipe(record_run):
    where, out, proc = record_run
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""   # no progress in a pipe
    record = json.loads(out.read_text())
    assert record["format"] == probe.RECORD_FORMAT
    assert list(record["families"]) == list(probe.FAMILY_NAMES) and len(probe.FAMILY_NAMES) == 18
    env = record["environment"]
    assert env["backend"] == "emulator" and env["vector_cores"] == 56
    assert env["cann_version"] == "9.2.0" and env["cann_version_source"] == "aclsysGetCANNVersion(ACL_PKG_NAME_CANN)"
    assert env["vector_cores_source"] == "aclGetDeviceCapability(ACL_DEVICE_INFO_VECTOR_CORE_NUM)"
    assert record["fingerprint"]["tiling"] == "current factors"
    for family in probe.FAMILY_NAMES:
        cases = _cases(record, family)
        assert cases, family
        for case in cases:
            if family == "large_offsets":
                assert case["status"] == "skipped", case["name"]
                continue
            assert case["status"] == "ok", (family, case["name"], case.get("device", {}).get("error"))
            assert case["emulator"] == {"agrees": True, "same_run": True}
            if family == "forward_quant":
                assert set(case["device"]["outputs"]) == {"y", "y_scale"}
            else:
                assert set(case["device"]["outputs"]) <= {"grad_x", "grad_weight"}
    assert env["forward"] == {"available": True, "reason": None}
    reasons = {c["skip_reason"] for c in _cases(record) if c["status"] == "skipped"}
    assert len(reasons) == 1 and "about 24 GiB" in reasons.pop()
    summary = proc.stdout.strip().splitlines()[-1]
    ran = sum(1 for c in _cases(record) if c["status"] != "skipped")
    assert summary.startswith(f"acl-swiglu-probe: {ran} case(s) run, 1 skipped, {ran} agree with the emulator")


def test_the_outputs_show_what_each_family_measures(record_run):
    _, out, _ = record_run
    record = json.loads(out.read_text())
    by_name = {(c["family"], c["name"]): c["device"] for c in _cases(record) if c["status"] == "ok"}
    # the sentinel shows unwritten elements: the emulator writes every element of every output
    for result in by_name.values():
        assert all(count == 0 for count in result.get("unwritten", {}).values())
    assert all(by_name[("determinism", n)]["repeats_identical"] for n in
               ("fp32-weight-clamp", "bf16-weight", "fp16-split-row"))
    assert by_name[("layouts_shapes", "plan-twice")]["plan_repeat_identical"] is True

    def bits(family, name, output="grad_weight"):
        return probe.decode_bits(by_name[(family, name)]["outputs"][output])

    # reduce_zero_sign: -0.0 exactly where no +0.0 padding lane takes part (n = 64, 65..256)
    for n, negative in ((1, False), (63, False), (64, True), (65, True), (256, True), (257, False), (1000, False)):
        assert set(bits("reduce_zero_sign", f"n{n}").tolist()) == {0x80000000 if negative else 0}, n
    # exp_bits: below the flush threshold e = 0, so gx1 = x0 * 0 = -0.0
    gx = bits("exp_bits", "flush-threshold", "grad_x").view(np.float32)
    x0 = probe.build_inputs(_cases(record, "exp_bits")[1]["recipe"])["x"][0, :1024]
    flushed = gx[1024:][x0 < -87.34]
    assert flushed.size > 100 and np.all(flushed.view(np.uint32) == 0x80000000)
    # overflow_edge: NaN (canonical) exactly from 88.72284 up without clamp
    sweep = probe.build_inputs(_cases(record, "overflow_edge")[0]["recipe"])["x"][0, :128]
    gx = bits("overflow_edge", "sweep-noclamp", "grad_x")
    assert np.all((gx[128:] == 0x7FC00000) == (sweep >= np.float32(88.72283935546875)))
    # group_index_edges: rows past trunc are +0.0 (the emulator zero-fills them)
    tokens = 56 + 8
    gx = bits("group_index_edges", "cores", "grad_x").reshape(tokens, 16)
    assert not gx[56:].any() and gx[:56].any()


def test_check_replays_the_record_and_every_case_agrees(record_run):
    where, out, _ = record_run
    proc = run_probe(["--check", str(out), "--jobs", "2"], where)
    assert proc.returncode == probe.EXIT_OK, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"record: {out} (emulator, CANN 9.2.0, 56 vector cores")
    table = _table(proc.stdout)
    record = json.loads(out.read_text())
    for family in probe.FAMILY_NAMES:
        cases = _cases(record, family)
        skipped = sum(c["status"] == "skipped" for c in cases)
        assert table[family] == [len(cases), len(cases) - skipped, 0, skipped], family
    assert "differs" not in proc.stdout


def _table(stdout):
    """--check's per-family table, which ends its output: {family: [cases, agree, differ, not replayed]}."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["family", "cases"])
    assert lines[-1].startswith("total")
    return {line.split()[0]: [int(v) for v in line.split()[1:]] for line in lines[start + 1:]}


def _flip_one_bit(record, family, name, output, index, bit):
    case = next(c for c in record["cases"] if c["family"] == family and c["name"] == name)
    encoded = case["device"]["outputs"][output]
    raw = bytearray(zlib.decompress(base64.b64decode(encoded["bits_z"])))
    itemsize = 4 if encoded["dtype"] == "fp32" else 2
    before = int.from_bytes(raw[index * itemsize:(index + 1) * itemsize], "little")
    raw[index * itemsize + bit // 8] ^= 1 << (bit % 8)
    after = int.from_bytes(raw[index * itemsize:(index + 1) * itemsize], "little")
    encoded["bits_z"] = base64.b64encode(zlib.compress(bytes(raw))).decode()
    return before, after


def test_check_reports_a_one_bit_change_in_a_recorded_case(record_run, tmp_path):
    _, out, _ = record_run
    record = json.loads(out.read_text())
    altered = copy.deepcopy(record)
    before, after = _flip_one_bit(altered, "exp_bits", "s-equals-e", "grad_x", 1500, 0)
    before_w, after_w = _flip_one_bit(altered, "reduce_tree", "n65", "grad_weight", 2, 31)   # a sign
    path = tmp_path / "altered.json"
    path.write_text(json.dumps(altered))
    proc = run_probe(["--check", str(path), "--jobs", "2", "--families", "exp_bits,reduce_tree,determinism"],
                     tmp_path)
    assert proc.returncode == probe.EXIT_DIFFERS, proc.stdout + proc.stderr
    table = _table(proc.stdout)
    assert table["exp_bits"] == [4, 3, 1, 0] and table["reduce_tree"] == [27, 26, 1, 0]
    assert table["determinism"] == [3, 3, 0, 0]
    differs = [line for line in proc.stdout.splitlines() if line.startswith("differs: ")]
    assert differs == [   # in the record's order (reduce_tree comes before exp_bits)
        f"differs: reduce_tree/n65: grad_weight: 1 element(s) differ, first at flat index 2: "
        f"0x{after_w:08x} vs 0x{before_w:08x}",
        f"differs: exp_bits/s-equals-e: grad_x: 1 element(s) differ, first at flat index 1500: "
        f"0x{after:08x} vs 0x{before:08x}",
    ]
    assert after_w == before_w ^ 0x80000000 and after == before ^ 1


def test_check_reports_a_changed_digest_and_a_changed_status(record_run, tmp_path):
    _, out, _ = record_run
    record = json.loads(out.read_text())
    altered = copy.deepcopy(record)
    big = next(c for c in altered["cases"] if c["family"] == "zero_fill_large_h" and c["name"] == "fp32-H8192")
    digest = big["device"]["outputs"]["grad_x"]["sha256"]
    big["device"]["outputs"]["grad_x"]["sha256"] = ("0" if digest[0] != "0" else "1") + digest[1:]
    small = next(c for c in altered["cases"] if c["family"] == "zero_fill_large_h" and c["name"] == "fp32-H8191")
    small["device"] = {"status": "error", "inputs_sha256": small["device"]["inputs_sha256"],
                       "error": {"type": "AclErrorRtVectorCoreTimeout", "code": 507034}}
    path = tmp_path / "altered.json"
    path.write_text(json.dumps(altered))
    proc = run_probe(["--check", str(path), "--families", "zero_fill_large_h"], tmp_path)
    assert proc.returncode == probe.EXIT_DIFFERS
    assert "differs: zero_fill_large_h/fp32-H8192: grad_x: digests differ" in proc.stdout
    assert ("differs: zero_fill_large_h/fp32-H8191: status error (AclErrorRtVectorCoreTimeout 507034) vs ok (-)"
            in proc.stdout)


def test_check_notices_inputs_that_rebuild_differently(record_run, tmp_path):
    _, out, _ = record_run
    record = json.loads(out.read_text())
    case = next(c for c in record["cases"] if c["family"] == "div_rounding")
    case["device"]["inputs_sha256"] = "0" * 64
    path = tmp_path / "altered.json"
    path.write_text(json.dumps(record))
    proc = run_probe(["--check", str(path), "--families", "div_rounding"], tmp_path)
    assert proc.returncode == probe.EXIT_DIFFERS
    assert (f"differs: div_rounding/{case['name']}: the recipe built other inputs here than where it was recorded"
            in proc.stdout)


# ----------------------------------------------------------------------------- releases and cores


def test_an_emulated_9_1_0_part_with_8_cores_skips_the_hangs_and_shows_its_tiling(tmp_path):
    out = tmp_path / "r.json"
    proc = run_probe(["--jobs", "2", "--families", "fingerprint,group_index_edges", "--out", str(out)], tmp_path,
                     ACL_EMU_CANN_VERSION="9.1.0", ACL_EMU_VECTOR_CORES="8")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["fingerprint"] == {"release": "9.1.0", "vector_cores": 8, "tiling": "9.1.0 factors",
                                     "vector_cores_source": "aclGetDeviceCapability(ACL_DEVICE_INFO_VECTOR_CORE_NUM)"}
    skipped = {c["name"]: c["skip_reason"] for c in _cases(record, "group_index_edges") if c["status"] == "skipped"}
    assert skipped == {
        "cores-minus-1": "trunc = 7 < min(T = 16, 8 cores) hangs the device on CANN 9.1.0",
        "one": "trunc = 1 < min(T = 16, 8 cores) hangs the device on CANN 9.1.0",
        "wraps-to-3": "trunc = 3 < min(T = 16, 8 cores) hangs the device on CANN 9.1.0",
        "negative": "trunc = 4 < min(T = 16, 8 cores) hangs the device on CANN 9.1.0",
        "small-T4-[3]": "trunc = 3 < min(T = 4, 8 cores) hangs the device on CANN 9.1.0",
    }
    assert all(c["status"] == "ok" for c in _cases(record) if c["status"] != "skipped")


def _env(**changes):
    env = {"backend": "cann", "cann_version": "9.2.0", "vector_cores": 16, "forward": {"available": False,
                                                                                       "reason": "absent"}}
    env.update(changes)
    return env


def test_skips_follow_the_release_the_core_count_and_the_options():
    def skipped(env, unsafe=False):
        return {(c.family, c.name): c.skip for c in probe.build_cases(env, probe.FAMILY_NAMES, unsafe) if c.skip}

    fixed = skipped(_env())
    assert fixed == {("forward_quant", n): "absent" for n in
                     ("bf16-e4m3fn-mode0", "bf16-e5m2-mode0", "bf16-e4m3fn-mode1", "fp16-e4m3fn-mode0",
                      "fp16-e5m2-mode0", "fp16-e4m3fn-mode1")} | {
        ("large_offsets", "fp16-T65537-H32768"): "a risky family: it runs only with --unsafe"}
    assert ("large_offsets", "fp16-T65537-H32768") not in skipped(_env(), unsafe=True)
    for release in ("9.1.1", "9.2.0-beta.1", None):
        hang = {k: v for k, v in skipped(_env(cann_version=release)).items() if k[0] == "group_index_edges"}
        assert set(hang) == {("group_index_edges", n) for n in
                             ("cores-minus-1", "one", "wraps-to-3", "negative", "small-T4-[3]")}
        if release is None:
            assert all("this install's release is unknown" in v for v in hang.values())
        else:
            assert all(v.endswith(f"hangs the device on CANN {release}") for v in hang.values())
    # the case shapes follow the core count: T = cores + 8 for the group cases, cores + 2 rows for the fills
    cases = {(c.family, c.name): c.recipe for c in probe.build_cases(_env(vector_cores=72), probe.FAMILY_NAMES, False)}
    assert cases[("group_index_edges", "cores")]["lead"] == [80] and cases[("group_index_edges", "cores")][
        "group_index"] == [72]
    assert cases[("zero_fill_large_h", "fp32-H8192")]["lead"] == [74]
    assert cases[("misaligned_h", "fp32-H9-T75")]["hidden"] == 9


def test_the_forward_family_runs_when_the_forward_operator_is_offered():
    cases = [c for c in probe.build_cases(_env(forward={"available": True, "reason": None}), ("forward_quant",), False)]
    assert len(cases) == 6 and all(c.skip is None and c.recipe["api"] == "forward" for c in cases)


# ----------------------------------------------------------------------------- recipes, records, comparisons


def test_the_generators_build_the_same_bits_everywhere():
    # splitmix64 from state 0: its published first outputs
    assert [int(v) for v in probe._random_u64(0, 2)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
    spec = probe.N(7, 2.0)
    a = probe.build_operand(spec, (3, 5), np.dtype(np.float32))
    assert np.array_equal(a, probe.build_operand(spec, (3, 5), np.dtype(np.float32)))
    assert not np.array_equal(a, probe.build_operand(probe.N(8, 2.0), (3, 5), np.dtype(np.float32)))
    assert probe.build_operand(probe.C(0x3F800000), (2, 2), np.dtype(np.float32)).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    tiled = probe.build_operand(probe.B(["0x3c00", "0xbc00", "0x0001"]), (2, 4), np.dtype(np.float16))
    assert tiled.view(np.uint16).tolist() == [[0x3C00, 0xBC00, 0x0001, 0x3C00], [0xBC00, 0x0001, 0x3C00, 0xBC00]]
    sweep = probe.build_operand({"gen": "sweep", "start": "0xfffe", "step": 1}, (4,), probe._np_dtype("bf16"))
    assert sweep.view(np.uint16).tolist() == [0xFFFE, 0xFFFF, 0x0000, 0x0001]   # wraps at the width
    rows = probe.build_operand({"gen": "rows", "values": [1.5, -2.0]}, (3, 2), np.dtype(np.float32))
    assert rows.tolist() == [[1.5, 1.5], [-2.0, -2.0], [1.5, 1.5]]
    overlay = probe.build_operand({"gen": "overlay", "base": probe.C(0), "rows": [1, 9], "bits": ["0x7fc00001"]},
                                  (3, 2), np.dtype(np.float32))
    assert overlay.view(np.uint32).tolist() == [[0, 0], [0x7FC00001, 0x7FC00001], [0, 0]]
    wide = probe.build_operand(probe.W(3, -4, 4), (1000,), np.dtype(np.float32))
    exponents = np.frexp(wide.astype(np.float64))[1] - 1
    assert exponents.min() == -4 and exponents.max() == 4 and (wide < 0).any() and (wide > 0).any()
    with pytest.raises(ValueError, match="unknown generator 'bogus'"):
        probe.build_operand({"gen": "bogus"}, (1,), np.dtype(np.float32))


def test_a_recipe_builds_its_layout():
    r = probe.recipe("bf16", (2, 3), 8, weight=probe.U(1, 0.5, 1.5), weight_shape="flat", group_index=[4],
                     clamp=2.5, layout="strided")
    inputs = probe.build_inputs(r)
    assert inputs["x"].shape == (2, 3, 16) and not inputs["x"].flags.c_contiguous
    assert inputs["weight"].shape == (6,) and inputs["group_index"].tolist() == [4]
    assert inputs["clamp_limit"] == 2.5 and inputs["grad_y"].dtype.name == "bfloat16"
    same = probe.build_inputs(json.loads(json.dumps(r)))
    assert probe.inputs_digest(same) == probe.inputs_digest(inputs)
    assert probe.inputs_digest(probe.build_inputs(dict(r, clamp_limit=(3.0).hex()))) != probe.inputs_digest(inputs)


def test_outputs_are_recorded_whole_or_as_a_digest():
    small = np.arange(8, dtype=np.float32)
    encoded = probe.encode(small)
    assert encoded["dtype"] == "fp32" and encoded["shape"] == [8]
    assert probe.decode_bits(encoded).tolist() == small.view(np.uint32).tolist()
    big = np.arange(probe.INLINE_BYTES // 2 + 1, dtype=np.float16)
    encoded = probe.encode(big)
    assert "bits_z" not in encoded and probe.decode_bits(encoded) is None
    assert len(encoded["samples"]) == probe.SAMPLES and encoded["samples"][0] == [0, "0x0000"]
    assert encoded["samples"][-1] == [big.size - 1, f"0x{int(big.view(np.uint16)[-1]):04x}"]


def test_results_compare_by_status_error_repeats_and_bits():
    ok = {"status": "ok", "outputs": {"grad_x": probe.encode(np.zeros(4, np.float32))}}
    assert probe.compare_results(ok, copy.deepcopy(ok)) is None
    other = {"status": "ok", "outputs": {"grad_x": probe.encode(np.array([0, 0, -0.0, 0], np.float32))}}
    assert probe.compare_results(ok, other) == ("grad_x: 1 element(s) differ, first at flat index 2: "
                                                "0x00000000 vs 0x80000000")
    error = {"status": "error", "error": {"type": "AclErrorInnerTilingError", "code": 561002}}
    assert probe.compare_results(error, copy.deepcopy(error)) is None
    assert probe.compare_results(error, ok) == "status error (AclErrorInnerTilingError 561002) vs ok (-)"
    assert probe.compare_results(error, {"status": "error", "error": {"type": "AclErrorParamInvalid",
                                                                      "code": 161002}}) == (
        "error AclErrorInnerTilingError 561002 vs AclErrorParamInvalid 161002")
    assert probe.compare_results(dict(ok, repeats_identical=True), dict(ok, repeats_identical=False)) == (
        "repeats_identical: True vs False")
    assert probe.compare_results(ok, {"status": "ok", "outputs": {}}) == "grad_x: present in one result only"


# ----------------------------------------------------------------------------- workers and their time limit

STALLING_WORKER = """
import json, sys, time
sys.stdout.buffer.write(b"noise a library printed\\n")
sys.stdout.buffer.write(b"ACL-SWIGLU-PROBE " + json.dumps({"ready": {"backend": "fake"}}).encode() + b"\\n")
sys.stdout.buffer.flush()
for line in sys.stdin.buffer:
    request = json.loads(line)
    if request["recipe"].get("answer"):
        sys.stdout.buffer.write(b"ACL-SWIGLU-PROBE " + json.dumps(
            {"id": request["id"], "result": {"status": "ok"}}).encode() + b"\\n")
        sys.stdout.buffer.flush()
    elif request["recipe"].get("die"):
        sys.stderr.write("the worker fell over\\n")
        sys.exit(9)
    else:
        time.sleep(3600)
"""


def test_a_case_past_its_time_limit_is_killed_and_recorded_and_the_next_gets_a_new_worker():
    pool = probe.Pool(dict(os.environ), 1, 0.5, [sys.executable, "-c", STALLING_WORKER])
    assert pool.environment() == {"backend": "fake"}
    jobs = [probe.Job(0, {"answer": True}), probe.Job(1, {}), probe.Job(2, {"answer": True}),
            probe.Job(3, {"die": True}), probe.Job(4, {"answer": True})]
    seen = []
    try:
        pool.run(jobs, lambda job: seen.append(job.key))
    finally:
        pool.close()
    assert seen == [0, 1, 2, 3, 4]
    assert jobs[0].result == {"status": "ok"} and jobs[2].result == {"status": "ok"}
    assert jobs[1].result["status"] == "timeout" and jobs[1].result["error"]["message"] == (
        "no answer within the time limit (0.5 s)")
    assert jobs[3].result["status"] == "crashed" and "exited with 9" in jobs[3].result["error"]["message"]
    assert "the worker fell over" in jobs[3].result["error"]["message"]
    assert jobs[4].result == {"status": "ok"}


def test_when_no_worker_can_start_the_remaining_cases_are_not_run():
    failing = "import sys; sys.exit(4)"
    pool = probe.Pool(dict(os.environ), 2, 5.0, [sys.executable, "-c", failing])
    jobs = [probe.Job(i, {}) for i in range(3)]
    pool.run(jobs)
    assert [j.result["status"] for j in jobs] == ["not run"] * 3
    assert "no worker could start: the worker exited with 4" in jobs[0].result["error"]["message"]


# ----------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("args,message", [
    (["--families", "exp_bits,bogus"], "unknown family bogus; known: determinism, fingerprint"),
    (["--families", ","], "unknown family (none given)"),
    (["--timeout", "0"], "must be a finite number of seconds > 0, got 0"),
    (["--timeout", "soon"], "'soon' is not a number of seconds"),
    (["--jobs", "0"], "must be 1..64, got 0"),
    (["--check", "x.json", "--unsafe"], "--unsafe applies to a probe run, not to --check"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
])
def test_bad_options_are_refused_with_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        probe.main(args)
    assert info.value.code == probe.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_a_missing_or_foreign_record_is_refused_with_exit_3(tmp_path, capsys):
    assert probe.main(["--check", str(tmp_path / "absent.json")]) == probe.EXIT_ENVIRONMENT
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert probe.main(["--check", str(tmp_path / "bad.json")]) == probe.EXIT_ENVIRONMENT
    assert "is not JSON" in capsys.readouterr().err
    (tmp_path / "other.json").write_text(json.dumps({"format": "something else", "cases": []}))
    assert probe.main(["--check", str(tmp_path / "other.json")]) == probe.EXIT_ENVIRONMENT
    assert "is not an acl-swiglu-probe record" in capsys.readouterr().err


def test_an_unwritable_output_is_exit_3(tmp_path):
    proc = run_probe(["--families", "div_rounding", "--out", str(tmp_path / "no" / "such" / "dir.json")], tmp_path)
    assert proc.returncode == probe.EXIT_ENVIRONMENT and "cannot write" in proc.stderr


def test_the_families_are_listed(capsys):
    assert probe.main(["--list-families"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(probe.FAMILY_NAMES)
    assert "(--unsafe)" in lines[-1] and lines[-1].startswith("large_offsets")


def test_progress_on_a_terminal_and_the_record_on_stdout(tmp_path):
    master, slave = pty.openpty()
    proc = subprocess.Popen(PROBE + ["--families", "reduce_zero_sign,forward_quant", "--out", "-"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=slave, env=dict(os.environ))
    os.close(slave)
    out, _ = proc.communicate(timeout=300)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    progress = b"".join(chunks).decode()
    assert proc.returncode == 0
    record = json.loads(out)
    assert [c["family"] for c in record["cases"]].count("reduce_zero_sign") == 12
    assert "backend emulator, CANN 9.2.0 (aclsysGetCANNVersion(ACL_PKG_NAME_CANN)), 56 vector cores" in progress
    assert [c["family"] for c in record["cases"]].count("forward_quant") == 6
    assert all(c["status"] == "ok" for c in record["cases"])
    assert "emulator: forward_quant: 6 case(s) done" in progress
    assert "emulator: reduce_zero_sign: 12 case(s) done" in progress
    assert progress.lstrip().startswith("[")   # each line tells the time elapsed


def test_the_console_script_is_installed():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts") if e.name.startswith("acl-swiglu")}
    assert scripts["acl-swiglu-probe"] == "acl_swiglu.probe:main"


def test_on_a_device_the_emulators_result_stands_beside_each_case():
    cases = [probe.Case("div_rounding", "a", {"lead": [1]}), probe.Case("div_rounding", "b", {"lead": [1]}),
             probe.Case("div_rounding", "c", {"lead": [1]}, skip="why not")]
    device = {0: {"status": "ok", "outputs": {"grad_x": probe.encode(np.zeros(2, np.float32))}},
              1: {"status": "ok", "outputs": {"grad_x": probe.encode(np.array([0.0, -0.0], np.float32))}}}
    emulated = {0: copy.deepcopy(device[0]), 1: copy.deepcopy(device[0])}
    args = probe.build_parser().parse_args(["--families", "div_rounding"])
    record = probe._record(args, _env(), cases, device, emulated, False, {"tiling": "not measured"}, 1.0)
    a, b, c = record["cases"]
    assert a["emulator"] == {"agrees": True, "same_run": False} and a["device"] is device[0]
    assert b["emulator"]["agrees"] is False and b["emulator"]["result"] == emulated[1]
    assert b["emulator"]["differs"] == ("grad_x: 1 element(s) differ, first at flat index 1: "
                                        "0x80000000 vs 0x00000000")
    assert c == {"family": "div_rounding", "name": "c", "recipe": {"lead": [1]}, "status": "skipped",
                 "skip_reason": "why not"}
    assert record["families"] == {"div_rounding": {"decides": probe.FAMILIES[5].decides, "unsafe": False,
                                                   "cases": 3, "skipped": 1, "agree": 1}}
