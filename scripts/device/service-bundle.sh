#!/usr/bin/env bash
# Packs the service-level H200 checks (scripts/device/service_h200.sh) into one folder that
# travels to the GPU machine with the `device` tool:
#   bin/  fp4qd, fp4q, libfp4q_cuda.so, fp4q_ipc_gpu_test, fp4q_client_live_test (no debug info)
#   lib/  the non-system shared libraries they need (scripts/lib/bundle.sh)
#   service_h200.sh, COMMIT
# The Python client travels as the repository's client/python plus its generated descriptor
# (client/python/fp4q/_proto, made here with _protogen.py): carry both paths.
#
#   scripts/device/service-bundle.sh [--build-dir DIR] [--out DIR]
# Defaults: build dir build-service, CUDA architecture 90a-real (H200), out .gpurun/service.
# Then:
#   run(carry=[".gpurun/service", "client/python/fp4q/_proto"],
#       command="bash .gpurun/service/service_h200.sh .gpurun/service 20")
set -euo pipefail
cd "$(dirname "$0")/../.."

build_dir=build-service
out=.gpurun/service
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "service-bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

bins=(fp4qd fp4q libfp4q_cuda.so fp4q_ipc_gpu_test fp4q_client_live_test)
FP4Q_CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90a-real" scripts/build.sh --no-deps \
  --build-dir "$build_dir" --target fp4qd --target fp4q --target fp4q_cuda \
  --target fp4q_ipc_gpu_test --target fp4q_client_live_test
/usr/bin/python3 client/python/fp4q/_protogen.py > /dev/null

rm -rf "$out"
mkdir -p "$out"
# shellcheck source=scripts/lib/bundle.sh
source scripts/lib/bundle.sh
bundle_binaries "$out" "$build_dir" "${bins[@]}"
bundle_libraries "$out"
cp scripts/device/service_h200.sh "$out/"
bundle_commit "$out" server client kernels proto common tests/server tests/python bench
bundle_check "$out" 50 service-bundle.sh
