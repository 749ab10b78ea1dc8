#!/usr/bin/env bash
# Builds here what the GPU run of the training examples needs and collects it, with the
# run script and the CPU results to compare against, into one folder that travels to the GPU
# machine (docs/TRAINING.md, "H200"):
#   bin/      fp4qd, fp4q, libfp4q_cuda.so, fp4q_example_{linear,mlp,linear_qdq} (no debug info)
#   lib/      every shared library they need that the GPU machine may lack (ldd): gRPC,
#             protobuf, Abseil, prometheus-cpp and friends; not glibc, libstdc++/libgcc, the
#             CUDA driver, nor CUDA toolkit libraries (the GPU machine has /usr/local/cuda)
#   cpu/      docs/results/cpu-*/ (the CPU backend's results, same seeds)
#   run_examples_gpu.sh, COMMIT
#
#   scripts/device/examples-bundle.sh [--build-dir DIR] [--archs "90a-real"] [--out DIR]
# Defaults: build dir build-examples-cuda, CUDA architectures 90a-real (H200), out
# DIR/bundle. Then, on the GPU machine (the device tool returns at most 8 files: pack them):
#   run(carry=["build-examples-cuda/bundle"], command="b=build-examples-cuda/bundle;
#       chmod +x $b/run_examples_gpu.sh $b/bin/*; $b/run_examples_gpu.sh --out /tmp/g; rc=$?;
#       tar czf $OUT/gpu_results.tgz -C /tmp g; cp /tmp/g/compare.txt $OUT/; exit $rc")
set -euo pipefail
cd "$(dirname "$0")/../.."

build_dir=build-examples-cuda
archs="90a-real"
out=""
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --archs) archs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "examples-bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
out="${out:-$build_dir/bundle}"
command -v nvcc > /dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
  { echo "examples-bundle.sh: no nvcc: the CUDA module cannot be built here" >&2; exit 1; }

bins=(fp4qd fp4q fp4q_example_linear fp4q_example_mlp fp4q_example_linear_qdq)
targets=(--target fp4q_cuda)
for b in "${bins[@]}"; do targets+=(--target "$b"); done
FP4Q_CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=$archs -DFP4Q_BUILD_TESTS=OFF" \
  scripts/build.sh --no-deps --build-dir "$build_dir" "${targets[@]}"

rm -rf "$out"
mkdir -p "$out/cpu"
# shellcheck source=scripts/lib/bundle.sh
source scripts/lib/bundle.sh
bundle_binaries "$out" "$build_dir" "${bins[@]}" libfp4q_cuda.so
bundle_libraries "$out"

if compgen -G "docs/results/cpu-*" > /dev/null; then cp -r docs/results/cpu-* "$out/cpu/"; fi
cp scripts/device/run_examples_gpu.sh "$out/"
bundle_commit "$out" examples client kernels server proto common
bundle_check "$out" 56 examples-bundle.sh
