"""The benchmark scripts run (in their quick form) and report every figure with its target; the
figures themselves are for docs/performance.md, not asserted here: this machine's timings are too
noisy to gate CI on. Slow tier: the quick run builds its C drivers and times every section (about
20 s on 2 cores); CI runs it as `pytest -m slow`. Default tier: the picture run.py --plot draws,
and its clear error without matplotlib."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.allow_live_handles]   # everything runs in child processes


@pytest.mark.slow
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
                       "host_overhead.plan_call_ratio", "host_overhead.device_call_alternating_ratio",
                       "kernel.one_shot_vs_copy",
                       "kernel.bf16_weight_clamp_fraction", "kernel.identical_bytes",
                       "reference.time_vs_kernel", "reference.peak_memory"}
    # The bytes are the same whatever the kernel build or thread count: that one is not a timing.
    assert data["kernel"]["targets"]["identical_bytes"]["met"] is True
    for section in ("host_overhead", "kernel", "reference"):
        assert len(data[section]["sizes"]) >= 3   # cost growth: every figure at three sizes or more
    assert "Targets:" in result.stdout and "Targets:" in markdown.read_text()


# ---- the picture (benchmarks/run.py --plot): drawn from the run saved beside it in docs/


SAVED_RUN = ROOT / "docs" / "performance.json"
PICTURE = ROOT / "docs" / "performance.png"


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.parametrize("draw_from", ["saved run", "measuring"])
def test_plot_without_matplotlib_is_one_clear_error(tmp_path, draw_from):
    """Without matplotlib, --plot fails at once (before any measuring) with status 2, saying what to install."""
    args = ["--plot", str(tmp_path / "out.png")] + (["--from-json", str(SAVED_RUN)] if draw_from == "saved run" else [])
    blocked = ("import runpy, sys; sys.modules['matplotlib'] = None; "
               f"sys.argv = ['run.py'] + {args!r}; runpy.run_path({str(ROOT / 'benchmarks' / 'run.py')!r}, "
               "run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "--plot draws with matplotlib, which is not installed: pip install '.[plot]'" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == "" and not (tmp_path / "out.png").exists()


def test_the_picture_is_committed_small_with_the_run_it_shows():
    width, height = _png_size(PICTURE)
    assert (width, height) == (1100, 420) and PICTURE.stat().st_size < 150_000
    saved = json.loads(SAVED_RUN.read_text())
    assert {"machine", "host_overhead", "kernel", "reference"} <= set(saved) and not saved["machine"]["quick"]


def test_plot_draws_the_saved_run(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the 'plot' extra (matplotlib)")
    out = tmp_path / "again.png"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--from-json", str(SAVED_RUN),
                             "--plot", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert _png_size(out) == _png_size(PICTURE) and out.stat().st_size < 150_000
