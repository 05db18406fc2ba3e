"""Check a built wheel before it is published: its tag, the glibc floor of its libraries, and
that it holds exactly the package's files.

    python tools/check_wheel.py [--auditwheel PATH] WHEEL PLATFORM_TAG

The file list is derived from the source tree: every module of acl_swiglu/ and py.typed, the
emulator's headers (native/include) and its three libraries, the hot-path helper, and the
dist-info files with the license. Anything more (a build leftover, a library grafted in by a
repair) or anything missing fails, as does a floor newer than the tag or a tag other than
py3-none-PLATFORM_TAG.
"""

import argparse
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "acl_swiglu"
EMULATOR_LIBRARIES = ("libascendcl.so", "libnnopbase.so", "libopapi.so")
HOTPATH_LIBRARY = "_native/libaclswiglu_hotpath.so"
DIST_INFO_FILES = ("METADATA", "WHEEL", "RECORD", "entry_points.txt", "licenses/LICENSE")


def expected_files(dist_info: str) -> set:
    package = ROOT / PACKAGE
    files = {f"{PACKAGE}/{p.name}" for p in package.glob("*.py")}
    files.add(f"{PACKAGE}/py.typed")
    include = ROOT / "native" / "include"
    files |= {f"{PACKAGE}/_emulator/include/{p.relative_to(include).as_posix()}"
              for p in include.rglob("*.h")}
    files |= {f"{PACKAGE}/_emulator/lib64/{name}" for name in EMULATOR_LIBRARIES}
    files.add(f"{PACKAGE}/{HOTPATH_LIBRARY}")
    files |= {f"{dist_info}/{name}" for name in DIST_INFO_FILES}
    return files


def glibc_floor(report: str, platform_tag: str) -> tuple:
    """The (major, minor) glibc that auditwheel says the wheel's libraries need."""
    text = " ".join(report.split())
    arch = platform_tag.split("_", 3)[3]
    found = re.search(rf'platform tag: "manylinux_(\d+)_(\d+)_{arch}"', text)
    if not found:
        raise SystemExit(f"auditwheel show gave no manylinux tag for {arch}:\n{report}")
    return int(found.group(1)), int(found.group(2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("platform_tag", help="e.g. manylinux_2_28_x86_64")
    parser.add_argument("--auditwheel", default="auditwheel")
    args = parser.parse_args()

    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(x86_64|aarch64)", args.platform_tag)
    if not match:
        parser.error(f"platform tag must be manylinux_<major>_<minor>_<x86_64|aarch64>, not {args.platform_tag}")
    promised = (int(match.group(1)), int(match.group(2)))

    name, version, python, abi, platform = args.wheel.name[: -len(".whl")].split("-")
    problems = []
    if (python, abi, platform) != ("py3", "none", args.platform_tag):
        problems.append(f"tag is {python}-{abi}-{platform}, expected py3-none-{args.platform_tag}")

    report = subprocess.run([args.auditwheel, "show", str(args.wheel)], capture_output=True,
                            text=True, check=True).stdout
    print(report.strip())
    floor = glibc_floor(report, args.platform_tag)
    if floor > promised:
        problems.append(f"libraries need glibc {floor[0]}.{floor[1]}, newer than the tag's {promised[0]}.{promised[1]}")

    with zipfile.ZipFile(args.wheel) as archive:
        present = {n for n in archive.namelist() if not n.endswith("/")}
    wanted = expected_files(f"{name}-{version}.dist-info")
    if present - wanted:
        problems.append(f"unexpected files: {sorted(present - wanted)}")
    if wanted - present:
        problems.append(f"missing files: {sorted(wanted - present)}")

    if problems:
        print(f"{args.wheel.name}: " + "; ".join(problems), file=sys.stderr)
        return 1
    print(f"{args.wheel.name}: tag py3-none-{args.platform_tag}, glibc floor {floor[0]}.{floor[1]}, "
          f"{len(present)} files as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
