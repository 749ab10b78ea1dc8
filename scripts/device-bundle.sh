#!/usr/bin/env bash
# Builds here what the GPU machine runs and collects it into ./.bundle/ (git-ignored):
#   bin/   libfp4q_cuda.so, fp4q_cuda_test, fp4q_bench (stripped of debug info)
#   lib/   every non-system shared library they need (ldd), i.e. Abseil and friends; not glibc,
#          libstdc++/libgcc, the CUDA driver, nor the CUDA toolkit libraries (cudart, cuBLAS(Lt))
#          that the GPU machine has in /usr/local/cuda
#   shared/ NUMERICS.md and golden/ from ../shared (the GPU machine does not get ../shared)
#   device-run.sh, torchao_peer.py, COMMIT
# and checks that it stays under 64 MiB and that every library resolves under the bundle's
# LD_LIBRARY_PATH. Then:   run(carry=[".bundle"], command=".bundle/device-run.sh all")
#
#   scripts/device-bundle.sh [--build-dir DIR] [--archs "90a-real"]
# Default build dir: build-bundle; default architectures: the project's (CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-bundle
archs=""
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --archs) archs="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "device-bundle.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

extra=()
if [[ -n "$archs" ]]; then extra=(-DCMAKE_CUDA_ARCHITECTURES="$archs"); fi
FP4Q_CMAKE_ARGS="${extra[*]:-}" \
  scripts/build.sh --no-deps --build-dir "$build_dir" \
  --target fp4q_cuda --target fp4q_cuda_test --target fp4q_bench

out=.bundle
rm -rf "$out"
mkdir -p "$out/shared"
# shellcheck source=scripts/lib/bundle.sh
source scripts/lib/bundle.sh
bundle_binaries "$out" "$build_dir" libfp4q_cuda.so fp4q_cuda_test fp4q_bench
bundle_libraries "$out"

shared_src=../shared
cp "$shared_src/NUMERICS.md" "$out/shared/"
cp -r "$shared_src/golden" "$out/shared/"
chmod -R u+w "$out/shared"
cp scripts/device-run.sh bench/torchao_peer.py "$out/"
# Wheels for the torchao peer (the GPU machine cannot download): put them in .whl/cuda/ first,
# e.g. pip download --no-deps --only-binary=:all: --python-version 3.12 ... torchao
if compgen -G ".whl/cuda/*.whl" > /dev/null; then
  mkdir -p "$out/wheels"
  cp .whl/cuda/*.whl "$out/wheels/"
fi
bundle_commit "$out" kernels/src/cuda bench tests/kernels/cuda scripts

bundle_check "$out" 60 device-bundle.sh
