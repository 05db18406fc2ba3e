"""Every probe record in tests/probe_records/ replays on the emulator: each case the record ran
must come out bit for bit as the record says (docs/fidelity.md). Records made on devices join
or replace the emulator-made one there; a device record that does not replay is a difference
between the emulator and that device, to be resolved in the emulator (or documented) before the
record is added."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from acl_swiglu import probe

RECORDS = sorted((Path(__file__).parent / "probe_records").glob("*.json"))


def test_there_is_a_record_to_replay():
    assert RECORDS, "tests/probe_records/ holds no probe record"


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_the_record_replays_on_the_emulator(path, tmp_path):
    record = probe.load_record(str(path))
    ran = [c for c in record["cases"] if c["status"] in probe.REPLAYABLE]
    assert ran, f"{path.name} has no case to replay"
    proc = subprocess.run([sys.executable, "-m", "acl_swiglu.probe", "--check", str(path), "--jobs", "2"],
                          cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True, timeout=900)
    assert proc.returncode == probe.EXIT_OK, proc.stdout + proc.stderr
    total = next(line for line in proc.stdout.splitlines() if line.startswith("total"))
    assert [int(v) for v in total.split()[1:]] == [len(record["cases"]), len(ran), 0, len(record["cases"]) - len(ran)]
    families = {c["family"] for c in record["cases"]}
    assert families == set(record["families"]), "the record's family summary names other families than its cases"
