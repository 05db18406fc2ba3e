"""The benchmark scripts run (in their quick form) and report every figure with its target; the
figures themselves are for the README, not asserted here: this machine's
timings are too noisy to gate CI on. Slow tier: the quick run builds its C drivers and times every
section (about 20 s on 2 cores); CI runs it as `pytest -m slow`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.allow_live_handles]   # everything runs in child processes


def test_run_py_quick_reports_every_target(tmp_path):
    out = tmp_path / "bench.json"
    markdown = tmp_path / "bench.md"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--json", str(out),
                             "--markdown", str(markdown)], capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    data = json.loads(out.read_text())
    targets = {f"{section}.{key}" for section in ("host_overhead", "kernel", "reference")
               for key in data[section]["targets"]}
    assert targets == {"host_overhead.one_shot_ratio", "host_overhead.device_call_ratio",
                       "host_overhead.plan_call_ratio", "kernel.one_shot_vs_copy",
                       "kernel.bf16_weight_clamp_fraction", "kernel.identical_bytes",
                       "reference.time_vs_kernel", "reference.peak_memory"}
    # The bytes are the same whatever the kernel build or thread count: that one is not a timing.
    assert data["kernel"]["targets"]["identical_bytes"]["met"] is True
    for section in ("host_overhead", "kernel", "reference"):
        assert len(data[section]["sizes"]) >= 3   # cost growth: every figure at three sizes or more
    assert "Targets:" in result.stdout and "Targets:" in markdown.read_text()
