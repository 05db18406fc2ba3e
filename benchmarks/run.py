"""Every benchmark of the project in one run, each figure with its target and whether it is met.

    python benchmarks/run.py [--quick] [--json FILE] [--markdown FILE]

Needs the package installed (pip install .) and cmake/gcc: the C drivers and the emulator are
built in build/bench and both the C and the Python side use those same libraries. Figures are
ratios measured side by side in this run; absolute times on a shared machine are noise.
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (a smoke run)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="also write the report as markdown")
    args = parser.parse_args(argv)
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
        Path(args.markdown).write_text(f"Run {results['machine']['date']} on {results['machine']['processor']}, "
                                       f"Python {results['machine']['python']}.\n\n{body}\n\n```\n" + "\n".join(summary)
                                       + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
