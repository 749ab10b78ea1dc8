#!/usr/bin/env bash
# Installs the Debian packages fp4q builds and tests with, when any is missing.
# Runs as root (CI) or through sudo. Idempotent: does nothing when everything is present.
#   scripts/install-deps.sh            build + test dependencies
#   scripts/install-deps.sh --runtime  only what a built fp4qd needs to run
set -euo pipefail

build_pkgs=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev
  python3 python3-grpcio python3-protobuf python3-numpy python3-yaml python3-torch
  python3-matplotlib  # scripts/plot_curves.py (the training curves in docs/TRAINING.md)
  curl yamllint
  xz-utils  # scripts/device-bundle.sh --pack and tests/scripts/unpack_test.sh
  prometheus  # only for promtool: tests/deploy checks and unit-tests the alert rules
  clang libclang-rt-14-dev  # libFuzzer + sanitizers: scripts/fuzz.sh, ctest fp4q_fuzz_smoke
)
runtime_pkgs=(libgrpc++1.51 libprotobuf32 libprometheus-cpp-pull1.0 libprometheus-cpp-core1.0)

pkgs=("${build_pkgs[@]}")
if [[ "${1:-}" == "--runtime" ]]; then pkgs=("${runtime_pkgs[@]}"); fi
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  sed -n '2,6p' "$0"; exit 0
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
