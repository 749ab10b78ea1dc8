#!/usr/bin/env bash
# Packs the server's GPU test for the H200 machine (the `device` tool): fp4qd, libfp4q_cuda.so
# and fp4q_ipc_gpu_test from a build dir, stripped, with every non-system shared library they
# need, into <build-dir>/server-bundle (git-ignored), plus run.sh. Then:
#   run(carry=["build-server/server-bundle"], command="build-server/server-bundle/run.sh")
# run.sh writes ipc_gpu_test.log (and fp4qd's log on failure) to $OUT.
#   tests/server/device_bundle.sh [--build-dir build-server]
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=build-server
if [[ "${1:-}" == "--build-dir" ]]; then build_dir="$2"; fi
scripts/build.sh --no-deps --build-dir "$build_dir" --target fp4qd --target fp4q_cuda \
  --target fp4q_ipc_gpu_test
out="$build_dir/server-bundle"
rm -rf "$out"
# shellcheck source=scripts/lib/bundle.sh
source scripts/lib/bundle.sh
bundle_binaries "$out" "$build_dir" fp4qd libfp4q_cuda.so fp4q_ipc_gpu_test
bundle_libraries "$out"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the GPU machine: the two-process CUDA IPC test against a CUDA-enabled fp4qd.
set -uo pipefail
b=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/server-device-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export FP4QD_BINARY="$b/bin/fp4qd" FP4Q_CUDA_MODULE="$b/bin/libfp4q_cuda.so"
nvidia-smi -L 2>&1 | tee "$out/gpu.txt"
"$b/bin/fp4q_ipc_gpu_test" "$@" 2>&1 | tee "$out/ipc_gpu_test.log"
exit "${PIPESTATUS[0]}"
RUN
chmod +x "$out/run.sh"
bundle_check "$out" 56 device_bundle.sh
