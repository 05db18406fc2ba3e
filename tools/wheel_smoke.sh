#!/usr/bin/env bash
# Installs a built wheel into a fresh virtual environment and runs, from an empty directory
# (so that nothing of the source tree can be imported), the sample and tools/wheel_smoke.py.
# With a second argument, the Python of another install (e.g. the source build CI tests) runs
# the same smoke test, and both must compute the same output bytes.
#
#   tools/wheel_smoke.sh WHEEL [OTHER_PYTHON]
set -euo pipefail
wheel=$(realpath "${1:?usage: tools/wheel_smoke.sh WHEEL [OTHER_PYTHON]}")
other_python=
if [ -n "${2:-}" ]; then   # absolute, but not resolved: a venv's python is a symlink
  other_python=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
fi
smoke=$(cd "$(dirname "$0")" && pwd)/wheel_smoke.py

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check "$wheel"
mkdir "$work/run"
cd "$work/run"
export ACL_SWIGLU_BACKEND=emulator

"$work/venv/bin/acl-swiglu-sample" > sample.txt
grep -q '^verdict: PASS$' sample.txt || { cat sample.txt; echo "wheel_smoke: the sample did not pass" >&2; exit 1; }
grep -q "root $work/venv/" sample.txt || { cat sample.txt; echo "wheel_smoke: the sample did not use the wheel's emulator" >&2; exit 1; }
echo "wheel_smoke: acl-swiglu-sample from $(basename "$wheel"): verdict PASS"

from_wheel=$("$work/venv/bin/python" -I "$smoke")
echo "wheel_smoke: $(basename "$wheel"): $from_wheel"
if [ -n "$other_python" ]; then
  from_other=$("$other_python" -I "$smoke")
  echo "wheel_smoke: $other_python: $from_other"
  [ "$from_wheel" = "$from_other" ] || { echo "wheel_smoke: the wheel computes other bytes" >&2; exit 1; }
fi
