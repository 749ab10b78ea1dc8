#!/usr/bin/env bash
# Runs ON the GPU machine, from a bundle made by scripts/device-bundle.sh (it is copied into
# .bundle/ beside the binaries). Sets LD_LIBRARY_PATH to the bundle's libraries and the CUDA
# toolkit, then runs a named suite, writing logs and results to $OUT (or ./device-out):
#
#   .bundle/device-run.sh info       nvidia-smi, library resolution
#   .bundle/device-run.sh test       the GPU test suite (fp4q_cuda_test)          -> test.log
#   .bundle/device-run.sh memcheck   the suite under compute-sanitizer memcheck   -> memcheck.log
#   .bundle/device-run.sh bench      fp4q_bench                                   -> h200.json, bench.log
#   .bundle/device-run.sh peer       torchao under torch.compile (needs wheels)   -> peer.json
#   .bundle/device-run.sh profile    Nsight Compute on chosen bench rows           -> profile.txt
#   .bundle/device-run.sh all        info, test, bench, peer, memcheck (in that order)
#
# Environment: FP4Q_TEST_FILTER (gtest filter for test), FP4Q_MEMCHECK_FILTER (for memcheck),
# FP4Q_MEMCHECK_TIMEOUT (seconds, default 240; the log shows how far it got), FP4Q_WHEELS (folder of wheels for `peer`),
# FP4Q_PROFILE: ';'-separated "bench row filter|kernel name regex|launches to skip" for
# `profile` (default: the quantize rows of issue 4), FP4Q_PROFILE_TIMEOUT (seconds per entry,
# default 120), FP4Q_BENCH_ONLY (bench --only filter).
set -uo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$PWD/device-out}
mkdir -p "$out"

cuda_lib=/usr/local/cuda/lib64
export LD_LIBRARY_PATH="$bundle/lib:$cuda_lib:${LD_LIBRARY_PATH:-}"
# cuBLASLt of the CUDA 13 toolkit; if the toolkit lacks it, the one PyTorch's wheels carry.
if [[ ! -e "$cuda_lib/libcublasLt.so.13" ]]; then
  extra=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
  if [[ -n "$extra" ]]; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$extra"; fi
fi
export FP4Q_GOLDEN_DIR="$bundle/golden"
export FP4Q_CUDA_MODULE="$bundle/bin/libfp4q_cuda.so"
commit=$(head -n1 "$bundle/COMMIT" 2>/dev/null || echo unknown)
if grep -q dirty "$bundle/COMMIT" 2>/dev/null; then commit="$commit+dirty"; fi

run_info() {
  {
    echo "== nvidia-smi"; nvidia-smi 2>&1
    echo "== libraries"; for f in "$bundle"/bin/*; do echo "$f"; ldd "$f" | grep -E 'not found|cuda|cublas|absl' ; done
    echo "== compute-sanitizer"; command -v compute-sanitizer || ls /usr/local/cuda/bin | grep -i sanit
  } 2>&1 | tee "$out/info.txt"
}

run_test() {
  "$bundle/bin/fp4q_cuda_test" --gtest_brief=1 ${FP4Q_TEST_FILTER:+--gtest_filter="$FP4Q_TEST_FILTER"} \
    2>&1 | tee "$out/test.log"
  return "${PIPESTATUS[0]}"
}

run_memcheck() {
  local cs
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout "${FP4Q_MEMCHECK_TIMEOUT:-240}" "$cs" --tool memcheck --error-exitcode 9 \
    --target-processes application-only --print-limit 20 \
    "$bundle/bin/fp4q_cuda_test" \
    ${FP4Q_MEMCHECK_FILTER:+--gtest_filter="$FP4Q_MEMCHECK_FILTER"} > "$out/memcheck.log" 2>&1
  local rc=$?
  tail -n 25 "$out/memcheck.log"
  echo "memcheck exit status: $rc"
  return $rc
}

run_bench() {
  "$bundle/bin/fp4q_bench" --out "$out/h200.json" --commit "$commit" \
    ${FP4Q_BENCH_ONLY:+--only "$FP4Q_BENCH_ONLY"} 2>&1 | tee "$out/bench.log"
  return "${PIPESTATUS[0]}"
}

# One kernel launch per entry under Nsight Compute (--clock-control none: the VM does not let
# ncu lock clocks), with the sections that say what bounds it: speed of light, occupancy,
# scheduler issue, warp stall reasons, instruction mix and pipe utilisation.
run_profile() {
  local ncu spec row kernel skip
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  local list=${FP4Q_PROFILE:-"quantize nvfp4 1x16 RTN, amax given|QuantizeLanes|3;quantize nvfp4 1x16 SR|QuantizeLanes|3;quantize nvfp4 1x16 RHT+SR|QuantizeLanes|3;QDQ nvfp4 + error|QuantizeLanes|3;quantize nvfp4 row+col|QuantizeTile|3"}
  : > "$out/profile.txt"
  IFS=';' read -ra specs <<< "$list"
  for spec in "${specs[@]}"; do
    IFS='|' read -r row kernel skip <<< "$spec"
    echo "==== $row (kernel ~ $kernel, skip $skip)" | tee -a "$out/profile.txt"
    timeout "${FP4Q_PROFILE_TIMEOUT:-120}" "$ncu" --clock-control none --kernel-name "regex:$kernel" \
      --launch-skip "${skip:-3}" --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
      --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis \
      --metrics smsp__inst_executed.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_fmaheavy.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_uniform.sum,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active \
      "$bundle/bin/fp4q_bench" --out /tmp/fp4q-profile.json --iters 8 --only "$row" \
      >> "$out/profile.txt" 2>&1
    echo "ncu exit status: $?" | tee -a "$out/profile.txt"
  done
  grep -E "^====|Duration|DRAM Throughput|Issue Slots Busy|Issued Warp|Achieved Occupancy|Registers Per|inst_executed|pipe_.*cycles_active|No Eligible|ncu exit" "$out/profile.txt"
}

run_peer() {
  local wheels=${FP4Q_WHEELS:-$bundle/wheels}
  if [[ -n "$wheels" && -d "$wheels" ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/fp4q-site "$wheels"/*.whl && export PYTHONPATH=/tmp/fp4q-site
  fi
  PYTHONUNBUFFERED=1 python3 "$bundle/torchao_peer.py" --out "$out/peer.json" 2>&1 | tee "$out/peer.log"
}

case "${1:-}" in
  info) run_info ;;
  test) run_test ;;
  memcheck) run_memcheck ;;
  bench) run_bench ;;
  peer) run_peer ;;
  profile) run_profile ;;
  all)
    run_info > /dev/null
    run_test; t=$?
    run_bench; b=$?
    run_peer
    run_memcheck; m=$?
    echo "== summary: test $t, bench $b, memcheck $m"
    exit $((t || b || m)) ;;
  *) sed -n "2,18p" "$0"; exit 2 ;;
esac
