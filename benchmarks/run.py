"""Every benchmark of the project in one run, each figure with its target and whether it is met.

    python benchmarks/run.py [--quick] [--json FILE] [--markdown FILE] [--plot PNG]
    python benchmarks/run.py --from-json FILE --plot PNG      (draw a saved run again)

Needs the package installed (pip install .) and cmake/gcc: the C drivers and the emulator are
built in build/bench and both the C and the Python side use those same libraries. Figures are
ratios measured side by side in this run; absolute times on a shared machine are noise. --plot
draws the call cost of each path beside C and the kernel's throughput beside a copy's
(docs/performance.png: `python benchmarks/run.py --json docs/performance.json --plot
docs/performance.png` remeasures both); it needs matplotlib, the 'plot' extra.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import host_overhead  # noqa: E402
import kernel_throughput  # noqa: E402
import reference_cost  # noqa: E402

SECTIONS = (("host_overhead", host_overhead), ("kernel", kernel_throughput), ("reference", reference_cost))


def _draw(results: dict, path: str) -> int:
    """The picture, with matplotlib imported only now: a clear error (status 2) without it."""
    import plot

    try:
        plot.draw(results, Path(path))
    except plot.PlotUnavailable as error:
        print(f"run.py: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (a smoke run)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="also write the report as markdown")
    parser.add_argument("--plot", metavar="PNG", help="also draw the call costs and the kernel's throughput "
                                                      "(needs matplotlib: pip install '.[plot]')")
    parser.add_argument("--from-json", metavar="FILE", help="measure nothing: draw (--plot) the run saved in FILE")
    args = parser.parse_args(argv)
    if args.from_json:
        if not args.plot:
            parser.error("--from-json draws a saved run: give --plot PNG")
        return _draw(json.loads(Path(args.from_json).read_text()), args.plot)
    if args.plot:   # before minutes of measuring: is there anything to draw with?
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _draw({}, args.plot)
    results = {"machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                           "python": platform.python_version(), "quick": args.quick,
                           "date": time.strftime("%Y-%m-%d %H:%M")}}
    texts = []
    for name, module in SECTIONS:
        print(f"== {name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        results[name] = module.measure(args.quick)
        text = module.report(results[name])
        texts.append(text)
        print(text + f"\n({time.perf_counter() - start:.0f} s)\n", flush=True)
    targets = [(f"{name}.{key}", t) for name, _ in SECTIONS for key, t in results[name]["targets"].items()]
    summary = ["Targets:"] + [f"  {'met    ' if t['met'] else 'NOT MET'} {key}: {t['target']}" for key, t in targets]
    print("\n".join(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if args.markdown:
        body = "\n\n".join(f"```\n{text}\n```" for text in texts)
        machine = results["machine"]
        Path(args.markdown).write_text(
            f"# A run of benchmarks/run.py\n\n{machine['date']} on {machine['processor']} ({machine['platform']}), "
            f"Python {machine['python']}{', --quick' if args.quick else ''}.\n\n{body}\n\n```\n" + "\n".join(summary)
            + "\n```\n")
    if args.plot:
        return _draw(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
