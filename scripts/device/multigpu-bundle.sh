#!/usr/bin/env bash
# Packs the multi-GPU check (scripts/device/multigpu_x2.sh) into one folder that travels to a
# machine with 2+ GPUs with the `device` tool:
#   bin/  fp4qd, libfp4q_cuda.so, fp4q_multigpu_test, fp4q_ipc_gpu_test (no debug info)
#   lib/  the non-system shared libraries they need (scripts/lib/bundle.sh)
#   multigpu_x2.sh, COMMIT
# The Python check runs from the repository's client/python and tests/python plus the generated
# descriptor client/python/fp4q/_proto (made here with _protogen.py, git-ignored): carry both.
#
#   scripts/device/multigpu-bundle.sh [--build-dir DIR]
# Default build dir: build-mgpu (CUDA architecture 90a-real, H200); the bundle is
# DIR/multigpu-bundle (git-ignored). Then:
#   run(kind="nvidia-h200-x2", carry=["build-mgpu/multigpu-bundle", "client/python/fp4q/_proto"],
#       command="bash build-mgpu/multigpu-bundle/multigpu_x2.sh build-mgpu/multigpu-bundle")
set -euo pipefail
cd "$(dirname "$0")/../.."

build_dir=build-mgpu
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "multigpu-bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

bins=(fp4qd libfp4q_cuda.so fp4q_multigpu_test fp4q_ipc_gpu_test)
FP4Q_CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90a-real" scripts/build.sh --no-deps \
  --build-dir "$build_dir" --target fp4qd --target fp4q_cuda --target fp4q_multigpu_test \
  --target fp4q_ipc_gpu_test
/usr/bin/python3 client/python/fp4q/_protogen.py > /dev/null

out="$build_dir/multigpu-bundle"
rm -rf "$out"
mkdir -p "$out"
# shellcheck source=scripts/lib/bundle.sh
source scripts/lib/bundle.sh
bundle_binaries "$out" "$build_dir" "${bins[@]}"
bundle_libraries "$out"
cp scripts/device/multigpu_x2.sh "$out/"
bundle_commit "$out" server kernels proto common tests/server scripts/device
bundle_check "$out" 50 multigpu-bundle.sh
