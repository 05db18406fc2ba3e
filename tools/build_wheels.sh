#!/usr/bin/env bash
# Release artifacts in wheelhouse/: the sdist, and from it one manylinux wheel per architecture
# (x86_64 and aarch64, or those named on the command line), each checked with auditwheel.
#
#   tools/build_wheels.sh [x86_64] [aarch64]
#
# Needs python3, CMake >= 3.18 and ninja or make; everything else (scikit-build-core, build,
# auditwheel, and zig, whose clang cross-compiles and links against glibc 2.28's symbols) comes
# from PyPI into build/wheel-tools. No container, no root. The emulator inside the wheels is
# built exactly as by `pip install .`, with zig's clang instead of the system compiler, and the
# golden-digest test built by the same compiler checks its bytes (under qemu-user for aarch64).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

glibc=2.28
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(x86_64 aarch64)
for arch in "${archs[@]}"; do
  case "$arch" in
    x86_64 | aarch64) ;;
    *) echo "build_wheels.sh: unknown architecture '$arch' (x86_64 or aarch64)" >&2; exit 2 ;;
  esac
done

tools=build/wheel-tools
if [ ! -x "$tools/bin/python" ]; then
  python3 -m venv "$tools"
fi
"$tools/bin/pip" install -q --disable-pip-version-check 'scikit-build-core>=0.10' build auditwheel ziglang
py="$tools/bin/python"
zig=$("$py" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')

rm -rf wheelhouse
mkdir -p wheelhouse
# The tools' environment is the build environment (no isolation): the package index would
# otherwise be asked for build requirements under the target's platform tag.
"$py" -m build --sdist --no-isolation --outdir wheelhouse .
sdist=$(ls wheelhouse/*.tar.gz)

for arch in "${archs[@]}"; do
  plat="manylinux_${glibc/./_}_${arch}"
  echo "== $plat"
  # _PYTHON_HOST_PLATFORM names the wheel's platform tag (scikit-build-core reads it);
  # auditwheel show then proves that the libraries inside keep to it.
  ACL_SWIGLU_ZIG="$zig" ACL_SWIGLU_ZIG_TARGET="${arch}-linux-gnu.${glibc}" _PYTHON_HOST_PLATFORM="$plat" \
    CMAKE_ARGS="-DCMAKE_TOOLCHAIN_FILE=$root/cmake/toolchain-zig.cmake" \
    "$tools/bin/pip" wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w wheelhouse "$sdist"
  wheel=$(ls wheelhouse/*-py3-none-"$plat".whl)
  "$py" tools/check_wheel.py --auditwheel "$tools/bin/auditwheel" "$wheel" "$plat"

  # The kernel built by the same compiler must give the golden bytes (native/tests/test_golden.c);
  # an aarch64 build runs under qemu-user when it is installed.
  launcher=()
  if [ "$arch" != "$(uname -m)" ]; then
    if [ "$arch" != aarch64 ] || ! command -v qemu-aarch64 >/dev/null; then
      echo "build_wheels.sh: cannot run $arch programs here, the $arch golden test was not run" >&2
      continue
    fi
    launcher=(tools/qemu-aarch64-run)
  fi
  ACL_SWIGLU_ZIG="$zig" ACL_SWIGLU_ZIG_TARGET="${arch}-linux-gnu.${glibc}" \
    cmake -S . -B "build/wheel-golden-$arch" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchain-zig.cmake" > "build/wheel-golden-$arch.log"
  ACL_SWIGLU_ZIG="$zig" ACL_SWIGLU_ZIG_TARGET="${arch}-linux-gnu.${glibc}" \
    cmake --build "build/wheel-golden-$arch" -j2 --target test_golden test_forward_golden >> "build/wheel-golden-$arch.log"
  "${launcher[@]}" "build/wheel-golden-$arch/native/tests/test_golden"
  "${launcher[@]}" "build/wheel-golden-$arch/native/tests/test_forward_golden"
done
ls -l wheelhouse
