#!/usr/bin/env bash
# Configures and builds fp4q (installing missing Debian packages first).
#   scripts/build.sh [--build-dir DIR] [--cpu-only] [--debug] [--no-deps] [--target T]...
# Defaults: build dir ./build, RelWithDebInfo, the CUDA backend module too when nvcc exists.
# Environment: FP4Q_JOBS (parallel jobs, default nproc), FP4Q_CMAKE_ARGS (extra cmake args).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
cmake_args=()
targets=()
deps=1
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --cpu-only) cmake_args+=(-DFP4Q_WITH_CUDA=OFF); shift ;;
    --debug) cmake_args+=(-DCMAKE_BUILD_TYPE=Debug); shift ;;
    --no-deps) deps=0; shift ;;
    --target) targets+=(--target "$2"); shift 2 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if ((deps)); then scripts/install-deps.sh; fi
jobs="${FP4Q_JOBS:-$(nproc)}"
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}" ${FP4Q_CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
