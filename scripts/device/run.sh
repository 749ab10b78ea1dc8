#!/usr/bin/env bash
# Runs device suites ON the lent GPU machine, from the repository root, with a bundle made here
# by scripts/device-bundle.sh (which copies this script into it as run.sh):
#
#   bash .bundle/run.sh [OPTIONS] SUITE [SUITE [SUITE]]
#
# Suites (each one device call of at most ~9 minutes; put longer work in separate calls):
#   info       nvidia-smi, the bundle's libraries, compute-sanitizer, Python modules
#   gpu-tests  fp4q_cuda_test (every kernel bit for bit against the CPU backend), the two-process
#              CUDA IPC test (fp4q_ipc_gpu_test) and the client's LiveCudaIpc tests
#   memcheck   the same three under compute-sanitizer memcheck (children included)
#   bench      fp4q_bench (kernels vs the copy ceiling and cuBLAS); the torchao peer when the
#              bundle has wheels/
#   profile    Nsight Compute (--clock-control none) on bench rows: FP4Q_PROFILE
#   service    fp4qd on the GPU: fp4q bench (32 clients mixed, 1 client small RPCs, the gRPC
#              health floor over TCP and the Unix socket), 1 / 4 / 8 streams per GPU, IPC
#              Quantize 8192x8192 bf16 from C++ (fp4q bench-ipc) and Python over gRPC and the
#              fast socket, fp4qd plain and busy-polling, /metrics
#   python     tests/python/gpu_ipc_check.py, then Python vs C++ IPC latency over the fast
#              socket (clients busy-polling 0 / 100 us, fp4qd plain / busy-polling); with
#              --profile also a cProfile of the Python call
#   examples   the training examples with --transport cuda_ipc (example 1 inline too) compared
#              bit for bit with the CPU backend's results carried in the bundle
#   step       the trainer's step: fp4q_bench --only step (kernels vs the copy ceiling, at the
#              default L2 prefetch distance and at each of FP4Q_STEP_PREFETCH_SWEEP, default
#              0,4), then
#              through fp4qd: fp4q bench-step (C++: GPT-2-small, Llama-3-8B-shaped, 8192x8192;
#              SGD RTN+EF current/delayed, AdamW; fast socket and gRPC) and
#              bench/trainer_step.py (Python fp4q.optim beside torch's SGD/AdamW and an
#              in-process torch NVFP4 update); FP4Q_STEP_LLAMA_LAYERS (default 32)
#   gemm       the user's GEMM: fp4q_bench --only GEMM (the kernels beside cuBLAS bf16 and
#              dequantize + cuBLAS), then bench/matmul_service.py (Matmul through fp4qd by CUDA
#              IPC, fast socket and gRPC, M = 1..8192 at N = K = 8192, beside torch's bf16
#              matmul in the same process)
#   train      train/ (scripts/train-transformer.sh --gpu): the transformer in every variant
#   dp         bench/dp_step.py: 4 data-parallel ranks sharing the GPU through one fp4qd, beside
#              torch.distributed all-reduce (gloo) with per-rank fp32 masters
#   multigpu   (2+ GPUs: kind nvidia-h200-x2) fp4q_multigpu_test with every GPU and with one
#              (it must skip, saying why), ipc_gpu_test, tests/python/multigpu_check.py
#
# Output, under $OUT (./device-out without it): summary.txt (a line per step, a verdict per
# suite), SUITE.json (verdict, steps, and every JSON the suite's tools wrote, by file name) and
# SUITE.tgz (every log and raw file). At most 3 suites per call: 7 files, within the 8 the
# device tool returns, none below $OUT/.
#
# Options:
#   --bundle DIR      the bundle (default: this script's folder, else ./.bundle)
#   --backend B       cuda (default), or cpu: a dry run of the plumbing on a machine without a
#                     GPU (fp4qd --backend cpu; the GPU steps fail and say why)
#   --seconds N       load duration of the service suite (default 20)
#   --iters N         IPC latency calls per measurement (default 300)
#   --steps "A B"     training steps of the examples suite (default "200 500")
#   --profile         python suite: add the cProfile of the Python client's call
#   --dry-run         print the suites' steps without running them
#   -h, --help
# Environment: FP4Q_TEST_FILTER (gtest filter of fp4q_cuda_test in gpu-tests),
#   FP4Q_MEMCHECK_FILTER (of fp4q_cuda_test under memcheck; default: the quantize, QDQ, error
#   feedback, update, amax, RHT, dequantize, golden and GEMM tests), FP4Q_BENCH_ONLY (fp4q_bench
#   --only), FP4Q_PROFILE (';'-separated "bench row|kernel regex|launches to skip").
# Exit status: 0 when every suite passed, 1 when one failed, 2 on bad usage.
set -uo pipefail

usage() { sed -n '2,60p' "$0" | sed 's/^# \{0,1\}//'; }

here=$(cd "$(dirname "$0")" && pwd)
bundle=""
backend=cuda
load_s=20
iters=300
example_steps="200 500"
profile=0
dry=0
suites=()
known="info gpu-tests memcheck bench profile service python examples step gemm train dp multigpu"
while (($#)); do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --backend) backend="$2"; shift 2 ;;
    --seconds) load_s="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --steps) example_steps="$2"; shift 2 ;;
    --profile) profile=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *)
      if [[ " $known " != *" $1 "* ]]; then
        echo "run.sh: unknown suite '$1'; suites: $known" >&2; exit 2
      fi
      suites+=("$1"); shift ;;
  esac
done
if ((${#suites[@]} == 0)); then usage >&2; exit 2; fi
if ((${#suites[@]} > 3)); then
  echo "run.sh: at most 3 suites per call (the device tool returns 8 files)" >&2; exit 2
fi
[[ $backend == cuda || $backend == cpu ]] || { echo "run.sh: --backend cuda|cpu" >&2; exit 2; }
[[ $load_s =~ ^[0-9]+$ && $iters =~ ^[0-9]+$ && $load_s -ge 2 && $iters -ge 1 ]] ||
  { echo "run.sh: --seconds >= 2 and --iters >= 1 are counts" >&2; exit 2; }
if [[ -z "$bundle" ]]; then
  bundle=$PWD/.bundle
  [[ -d "$here/bin" || -f "$here/packed.tar.xz" ]] && bundle=$here
fi
b=$(cd "$bundle" 2>/dev/null && pwd) || { echo "run.sh: no bundle at '$bundle'" >&2; exit 2; }
[[ -d client/python && -d tests/python ]] ||
  { echo "run.sh: run it from the repository root (client/python, tests/python)" >&2; exit 2; }
# shellcheck source=scripts/device/unpack.sh
source scripts/device/unpack.sh "$b" || exit 2  # a bundle made with --pack

out=${OUT:-$PWD/device-out}
root=/tmp/fp4q-device
mkdir -p "$out" "$root"
chmod +x "$b"/bin/* 2>/dev/null

# ---- Environment: the bundle's libraries, then the CUDA toolkit; cuBLASLt from PyTorch's wheels
# where the toolkit lacks it.
cuda_lib=/usr/local/cuda/lib64
export LD_LIBRARY_PATH="$b/lib:$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ ! -e "$cuda_lib/libcublasLt.so.13" ]]; then
  extra=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
  [[ -n "$extra" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$extra"
fi
export FP4QD_BINARY="$b/bin/fp4qd" FP4Q_FP4QD="$b/bin/fp4qd" FP4Q_CLI="$b/bin/fp4q"
export FP4Q_CUDA_MODULE="$b/bin/libfp4q_cuda.so"
[[ -d "$b/golden" ]] && export FP4Q_GOLDEN_DIR="$b/golden"
export PYTHONPATH="$PWD/client/python:$PWD/tests/python${PYTHONPATH:+:$PYTHONPATH}"
[[ -f "$b/python/fp4q_v1.binpb" ]] && export FP4Q_PROTO_DESCRIPTOR="$b/python/fp4q_v1.binpb"
export PYTHONUNBUFFERED=1
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
commit=$(tr '\n' ' ' 2>/dev/null < "$b/COMMIT" || echo unknown)
export FP4Q_COMMIT="${commit% }"  # the benchmarks and train/run.py record the bundle's commit
gpu=$(nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader 2>/dev/null |
      tr '\n' ';' || true)

# ---- Steps. Each suite has a work folder; every step logs there and adds a summary line.
summary=$out/summary.txt
suite=""
work=""
failed=0
started=$(date +%s)
note() { echo "$*" | tee -a "$summary" "$work/summary.txt"; }
elapsed() { echo "$(($(date +%s) - started)) s"; }
record() {  # record NAME RC DETAIL: a step's line, in the summary and the suite's steps.tsv
  local name=$1 rc=$2 detail=$3 word=ok
  ((rc == 0)) || { word="FAILED (exit $rc)"; failed=1; }
  ((rc == 124)) && word="TIMED OUT"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$detail" >> "$work/steps.tsv"
  note "[$suite] $name: $word${detail:+ - $detail} [$(elapsed)]"
}
run_step() {  # run_step NAME TIMEOUT_S CMD...: runs CMD with its output in NAME.log
  local name=$1 limit=$2
  shift 2
  if ((dry)); then echo "[$suite] $name (timeout $limit s): $*"; return 0; fi
  timeout -k 10 "$limit" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  record "$name" "$rc" "$(tail -n 1 "$work/$name.log" | head -c 200)"
  return $rc
}
# gtest_step NAME TIMEOUT_S ALLOWED_SKIPS CMD...: a GoogleTest binary; it passes when it exits 0,
# runs at least one test and skips none except those whose reason matches ALLOWED_SKIPS (the
# tests that only run as another test's child process). A GPU test never passes by skipping.
gtest_step() {
  local name=$1 limit=$2 allowed=$3
  shift 3
  if ((dry)); then echo "[$suite] $name (timeout $limit s): $*"; return 0; fi
  timeout -k 10 "$limit" "$@" --gtest_output="xml:$work/$name.xml" > "$work/$name.log" 2>&1
  local rc=$?
  local verdict
  verdict=$(python3 - "$work/$name.xml" "$allowed" <<'PY'
import re, sys, xml.etree.ElementTree as ET
try:
    cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
except Exception as e:  # no XML: the binary did not get that far
    print("no test report (%s)" % e.__class__.__name__); sys.exit(1)
allowed = re.compile(sys.argv[2]) if sys.argv[2] else None
passed = failed = skipped = excused = 0
reasons = []
for c in cases:
    if c.find("failure") is not None or c.find("error") is not None:
        failed += 1
    elif c.find("skipped") is not None or c.get("result") == "skipped":
        why = (c.find("skipped").get("message", "") if c.find("skipped") is not None else "")
        if allowed and allowed.search(why):
            excused += 1
        else:
            skipped += 1; reasons.append(why.strip().splitlines()[-1] if why.strip() else "?")
    elif c.get("status", "run") == "run":
        passed += 1
line = "passed %d, failed %d, skipped %d" % (passed, failed, skipped)
if excused: line += " (+%d child-only)" % excused
if reasons: line += "; skip reason: " + reasons[0][:160]
print(line)
sys.exit(0 if failed == 0 and skipped == 0 and passed > 0 else 1)
PY
)
  local ok=$?
  ((rc == 0 && ok != 0)) && rc=1
  record "$name" "$rc" "$verdict"
  return $rc
}
# memcheck_step NAME TIMEOUT_S CMD...: CMD under compute-sanitizer memcheck; passes when the
# command passes and every ERROR SUMMARY line says 0 errors.
memcheck_step() {
  local name=$1 limit=$2
  shift 2
  if ((dry)); then echo "[$suite] $name (timeout $limit s): memcheck $*"; return 0; fi
  if [[ ! -x "$sanitizer" ]]; then record "$name" 1 "no compute-sanitizer"; return 1; fi
  timeout -k 10 "$limit" "$sanitizer" --tool memcheck --target-processes all --leak-check no \
    --error-exitcode 86 --print-limit 20 "$@" > "$work/$name.log" 2>&1
  local rc=$?
  local sums
  sums=$(grep -E 'ERROR SUMMARY' "$work/$name.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  if ((rc == 0)); then
    if [[ -z "$sums" ]]; then
      rc=1  # the sanitizer never reported: it did not run the program
    elif grep -E 'ERROR SUMMARY' "$work/$name.log" | grep -qv 'ERROR SUMMARY: 0 errors'; then
      rc=86
    fi
  fi
  record "$name" "$rc" "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$work/$name.log" | tr '\n' ' ')$sums"
  return $rc
}

# ---- fp4qd for the service steps. start_server NAME [FLAGS...]: Unix socket NAME.sock, fast
# socket NAME.fast, TCP and /metrics on free ports; sets pid, port and mport.
pid=""
port=""
mport=""
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_server() {
  local name=$1
  shift
  port=$(free_port)
  mport=$(free_port)
  local ipc=(--allow_cuda_ipc)
  if ((dry)); then echo "[$suite] fp4qd $name: --backend $backend ${ipc[*]} $*"; pid=""; return 0; fi
  "$b/bin/fp4qd" --backend "$backend" "${ipc[@]}" --unix_socket "$work/$name.sock" \
    --fast_socket "$work/$name.fast" --listen "127.0.0.1:$port" \
    --metrics_listen "127.0.0.1:$mport" "$@" > "$work/$name.out" 2> "$work/$name.log" &
  pid=$!
  local _
  for _ in $(seq 150); do
    grep -q "listening on" "$work/$name.out" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q "listening on" "$work/$name.out" 2>/dev/null; then
    record "fp4qd-$name" 1 "did not start: $(tail -n 3 "$work/$name.log" | tr '\n' ' ' | head -c 300)"
    kill -TERM "$pid" 2>/dev/null
    pid=""
    return 1
  fi
  note "[$suite] fp4qd $name ($*): $(head -n 1 "$work/$name.out")"
}
stop_server() {
  [[ -n "$pid" ]] || return 0
  kill -TERM "$pid" 2>/dev/null
  timeout 60 tail --pid="$pid" -f /dev/null
  wait "$pid"
  local rc=$?
  record "fp4qd-sigterm" "$rc" ""
  pid=""
}
trap '[[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null' EXIT
scrape() {  # scrape FILE
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$mport/metrics', timeout=10).read().decode())" > "$1" 2>&1
}
# figures FILE KEY...: "KEY p50 X p99 Y;" for each KEY of a latency report (fp4q bench-ipc,
# ipc_quantize_latency.py)
figures() {
  python3 - "$@" <<'PY' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1]))
print(" ".join("%s p50 %.0f p99 %.0f;" % (k, r[k]["p50"], r[k]["p99"]) for k in sys.argv[2:] if k in r),
      "goal met:", r.get("goal_p50_wall_le_kernel_plus_100us"))
PY
}
# detail NAME TEXT: a step's figures on a line of their own, when there are any.
detail() { ((dry)) || [[ -z "$2" ]] || note "[$suite] $1: $2"; }
# rpc_p50 FILE: "rpc p50 X us;" for each RPC of an fp4q bench report (its text table)
rpc_p50() { grep -E '^(health|info|keepalive|list|quantize|qdq|update|get|dequantize) ' "$1" 2>/dev/null | awk '{printf "%s p50 %s us; ", $1, $4}'; }

# ---- Suites.
suite_info() {
  run_step nvidia-smi 30 nvidia-smi
  run_step libraries 30 bash -c 'for f in "$0"/bin/*; do echo "$f"; ldd "$f" | grep -E "not found|cuda|cublas|grpc"; done; n=$(for f in "$0"/bin/*; do ldd "$f"; done | grep -c "not found"); echo "$(ls "$0"/bin | wc -l) binaries, $n unresolved libraries"; ((n == 0))' "$b"
  run_step sanitizer 10 "$sanitizer" --version
  run_step python 60 python3 -c 'import sys, torch, numpy, grpc, google.protobuf as pb, fp4q; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(), "numpy", numpy.__version__, "grpcio", grpc.__version__, "protobuf", pb.__version__)'
}

memcheck_filter=${FP4Q_MEMCHECK_FILTER:-"AllModes/QuantizeTest.*:*Golden*:CudaTest.Amax*:CudaTest.Dequantize*:CudaTest.Rht*:CudaTest.Qdq*:CudaTest.QuantizeWithErrorFeedback*:CudaTest.UpdateWeight*:MatmulTest.*"}
child_only='runs (only )?as (a|the) child'
suite_gpu_tests() {
  gtest_step cuda_test 420 "$child_only" "$b/bin/fp4q_cuda_test" --gtest_brief=1 \
    ${FP4Q_TEST_FILTER:+--gtest_filter="$FP4Q_TEST_FILTER"}
  gtest_step ipc_gpu_test 150 "" "$b/bin/fp4q_ipc_gpu_test"
  gtest_step client_cuda_live 120 "$child_only" "$b/bin/fp4q_client_live_test" \
    --gtest_filter='LiveCudaIpc.*'
}
suite_memcheck() {
  memcheck_step cuda_test_memcheck 300 "$b/bin/fp4q_cuda_test" --gtest_brief=1 \
    --gtest_filter="$memcheck_filter"
  memcheck_step ipc_gpu_test_memcheck 150 "$b/bin/fp4q_ipc_gpu_test"
  memcheck_step client_cuda_live_memcheck 120 "$b/bin/fp4q_client_live_test" \
    --gtest_filter='LiveCudaIpc.*'
}
suite_bench() {
  run_step bench 420 "$b/bin/fp4q_bench" --out "$work/fp4q_bench.json" --commit "${commit%% *}" \
    ${FP4Q_BENCH_ONLY:+--only "$FP4Q_BENCH_ONLY"}
  if compgen -G "$b/wheels/*.whl" > /dev/null; then
    run_step peer-install 120 python3 -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target "$root/site" "$b"/wheels/*.whl
    PYTHONPATH="$root/site:$PYTHONPATH" run_step peer 300 python3 bench/torchao_peer.py \
      --out "$work/torchao_peer.json"
  else
    note "[$suite] peer: not run (no wheels/ in the bundle: put torchao wheels in .whl/cuda/)"
  fi
}
suite_profile() {
  local ncu list spec row kernel skip i=0
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  list=${FP4Q_PROFILE:-"quantize nvfp4 1x16 RTN, amax given|QuantizeBlocks|3;quantize nvfp4 1x16 SR|QuantizeBlocks|3;quantize nvfp4 1x16 RHT+SR|QuantizeBlocks|3;QDQ nvfp4 + error|QuantizeLanes|3;quantize nvfp4 row+col|QuantizeTile|3"}
  IFS=';' read -ra specs <<< "$list"
  for spec in "${specs[@]}"; do
    IFS='|' read -r row kernel skip <<< "$spec"
    i=$((i + 1))
    run_step "ncu-$i" 150 "$ncu" --clock-control none --kernel-name "regex:$kernel" \
      --launch-skip "${skip:-3}" --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
      --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis \
      --metrics smsp__inst_executed.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_fmaheavy.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_uniform.sum,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active \
      "$b/bin/fp4q_bench" --out "$work/profile-$i.json" --iters 8 --only "$row"
    ((dry)) || note "[$suite] ncu-$i = $row: $(grep -E 'Duration|DRAM Throughput|Issue Slots Busy' "$work/ncu-$i.log" | tr -s ' ' | tr '\n' ';' | head -c 300)"
  done
}

mix=quantize=4,qdq=2,dequantize=1,update=2,get=1,list=1,info=1,keepalive=1
load() {  # load NAME SECONDS ADDR [ARGS...]: fp4q bench with 32 clients on the mix
  local name=$1 seconds=$2 addr=$3
  shift 3
  run_step "$name" $((seconds + 60)) "$b/bin/fp4q" --server "$addr" bench --clients 32 \
    --duration "$seconds" --warmup 3 --mix "$mix" --shape 16x256 --quiet \
    ${pid:+--server-pid "$pid"} --json "$work/$name.json" "$@"
  detail "$name" "$(grep -E '^total|RSS' "$work/$name.log" 2>/dev/null | tr '\n' ' ')"
}
small() {  # small NAME ADDR MIX [ARGS...]: fp4q bench with 1 client, small RPCs
  local name=$1 addr=$2 m=$3
  shift 3
  run_step "$name" 60 "$b/bin/fp4q" --server "$addr" bench --clients 1 --duration 8 --quiet \
    --mix "$m" --json "$work/$name.json" "$@"
  detail "$name" "$(rpc_p50 "$work/$name.log")"
}
ipc_cpp() {  # ipc_cpp NAME SOCK [ARGS...]: fp4q bench-ipc, Quantize 8192x8192 bf16
  local name=$1 sock=$2
  shift 2
  run_step "$name" 120 "$b/bin/fp4q" --server "unix://$sock" bench-ipc --shape 8192x8192 \
    --dtype bf16 --iters "$iters" --warmup 20 --json "$work/$name.json" "$@"
  detail "$name" "$(figures "$work/$name.json" wall_us kernel_us queue_us server_us overhead_us client_and_transport_us fast_keepalive_us)"
}
ipc_py() {  # ipc_py NAME SOCK [ARGS...]: bench/ipc_quantize_latency.py, the same call
  local name=$1 sock=$2 device=cuda
  shift 2
  [[ $backend == cpu ]] && device=cpu
  run_step "$name" 150 python3 bench/ipc_quantize_latency.py --server "unix://$sock" \
    --device "$device" --shape 8192x8192 --dtype bf16 --iters "$iters" \
    --json "$work/$name.json" "$@"
  detail "$name" "$(figures "$work/$name.json" wall_us kernel_us overhead_us)"
}
spin_flags=(--worker_spin_us 200 --fast_socket_spin_us 200)

suite_service() {
  local half=$((load_s / 2)) s streams srv
  # One fp4qd, 4 streams per GPU: gRPC load, small RPCs, the floor, IPC latency, /metrics.
  if start_server grpc --streams_per_gpu 4; then
    s=$work/grpc.sock
    load load-32 "$load_s" "127.0.0.1:$port"
    small small-1-tcp "127.0.0.1:$port" health=1,list=1,info=1,keepalive=1
    small small-1-unix "unix://$s" health=1,list=1,info=1,keepalive=1
    ipc_cpp ipc-cpp-grpc "$s"
    ipc_py ipc-py-grpc "$s"
    ((dry)) || { scrape "$work/metrics-grpc.txt"; note "[$suite] metrics: $(grep -c '^fp4q_' "$work/metrics-grpc.txt") fp4q_ samples"; }
    stop_server
  fi
  # 1 and 8 streams per GPU under the same load.
  for streams in 1 8; do
    start_server "streams$streams" --streams_per_gpu "$streams" || continue
    load "load-32-streams$streams" "$half" "127.0.0.1:$port"
    stop_server
  done
  # The fast socket, fp4qd plain and busy-polling.
  for srv in fast fast-spin; do
    if [[ $srv == fast ]]; then start_server "$srv" || continue
    else start_server "$srv" "${spin_flags[@]}" || continue; fi
    s=$work/$srv.sock
    small "$srv-small-grpc" "unix://$s" keepalive=1,quantize=1,health=1
    small "$srv-small" "unix://$s" keepalive=1,quantize=1,list=1,info=1 --fast-socket "$work/$srv.fast"
    small "$srv-small-clientspin" "unix://$s" keepalive=1,quantize=1 --fast-socket "$work/$srv.fast" --spin-us 100
    ipc_cpp "$srv-ipc-cpp" "$s" --fast-socket "$work/$srv.fast"
    ipc_cpp "$srv-ipc-cpp-clientspin" "$s" --fast-socket "$work/$srv.fast" --spin-us 100
    ipc_py "$srv-ipc-py" "$s" --fast-socket "$work/$srv.fast"
    if [[ $srv == fast ]]; then
      # Twice on one server: the second round shows whether memory stays flat after warm-up.
      load "$srv-load-32-round1" "$load_s" "unix://$s" --fast-socket "$work/$srv.fast"
      load "$srv-load-32-round2" "$load_s" "unix://$s" --fast-socket "$work/$srv.fast"
    fi
    ((dry)) || scrape "$work/metrics-$srv.txt"
    stop_server
  done
}

suite_python() {
  local srv spin args
  run_step gpu_ipc_check 150 python3 tests/python/gpu_ipc_check.py --fp4qd "$b/bin/fp4qd" \
    --out "$work/gpu_ipc_check" --steps 200
  for srv in plain spin; do
    if [[ $srv == plain ]]; then start_server "$srv" || continue
    else start_server "$srv" "${spin_flags[@]}" || continue; fi
    for spin in 0 100; do
      args=(--fast-socket "$work/$srv.fast")
      ipc_py "py-$srv-clientspin$spin" "$work/$srv.sock" "${args[@]}" --spin-us "$spin"
      ((spin > 0)) && args+=(--spin-us "$spin")
      ipc_cpp "cpp-$srv-clientspin$spin" "$work/$srv.sock" "${args[@]}"
    done
    if ((profile)) && [[ $srv == plain ]]; then
      for t in fast grpc; do
        args=()
        [[ $t == fast ]] && args=(--fast-socket "$work/$srv.fast")
        run_step "cprofile-$t" 240 python3 -m cProfile -o "$work/cprofile-$t.prof" \
          bench/ipc_quantize_latency.py --server "unix://$work/$srv.sock" --device cuda \
          --shape 8192x8192 --dtype bf16 --iters 1000 "${args[@]}" --json "$work/cprofile-$t.json"
        ((dry)) || python3 - "$work/cprofile-$t.prof" > "$work/cprofile-$t.txt" 2>&1 <<'PY'
import pstats, sys
s = pstats.Stats(sys.argv[1])
s.sort_stats("tottime").print_stats(35)
s.sort_stats("cumulative").print_stats(45)
s.sort_stats("cumulative").print_callees(r"client\.py|_transport\.py|_fast_socket\.py")
PY
      done
    fi
    stop_server
  done
}

suite_examples() {
  local addr steps dir name
  local cuda_flags=(--allow_cuda_ipc --cuda_ipc_over_tcp)
  if ((dry)); then echo "[$suite] fp4qd: --backend $backend ${cuda_flags[*]}"; addr=ADDR; else
  "$b/bin/fp4qd" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 --backend "$backend" \
    "${cuda_flags[@]}" --log_format text > "$work/fp4qd.out" 2> "$work/fp4qd.log" &
  pid=$!
  addr=""
  for _ in $(seq 150); do
    addr=$(sed -n 's/^fp4qd: listening on //p' "$work/fp4qd.out" | head -n 1)
    [[ -n "$addr" ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [[ -n "$addr" ]] || { record fp4qd 1 "did not start: $(tail -n 3 "$work/fp4qd.log" | tr '\n' ' ')"; return; }
  fi
  run_step health 30 "$b/bin/fp4q" --server "$addr" health
  run_step server-info 30 "$b/bin/fp4q" --server "$addr" info
  for steps in $example_steps; do
    dir=$work/gpu-$steps
    mkdir -p "$dir"
    for name in linear mlp linear_qdq linear_inline; do
      local transport=cuda_ipc program=$name
      [[ $name == linear_inline ]] && { transport=inline; program=linear; }
      run_step "$name-$steps" 300 "$b/bin/fp4q_example_$program" --server "$addr" \
        --steps "$steps" --seed 1 --transport "$transport" --csv "$dir/$name.csv" \
        --json "$dir/$name.json"
    done
  done
  stop_server
  # Same seed, same bits: every loss of every step against the CPU backend's results, and the
  # two transports against each other. The JSONs carry 17 significant digits (exact).
  ((dry)) && return
  python3 - "$work" "$b/cpu" $example_steps > "$work/compare.txt" 2>&1 <<'PY'
import json, os, sys
work, cpu, steps = sys.argv[1], sys.argv[2], sys.argv[3:]
bad = 0
def losses(path):
    d = json.load(open(path))
    return {k: (v["start_loss"], v["final_loss"]) for k, v in d["variants"].items()}, d
for s in steps:
    g = os.path.join(work, f"gpu-{s}")
    pairs = [(f"gpu-{s}/{n}.json", os.path.join(g, f"{n}.json"), f"cpu-{s}/{n}.json",
              os.path.join(cpu, f"cpu-{s}", f"{n}.json")) for n in ("linear", "mlp", "linear_qdq")]
    pairs.append((f"gpu-{s}/linear.json", os.path.join(g, "linear.json"),
                  f"gpu-{s}/linear_inline.json", os.path.join(g, "linear_inline.json")))
    for la, a, lb, b in pairs:
        if not os.path.exists(a):
            print(f"MISSING {la}"); bad += 1; continue
        if not os.path.exists(b):
            print(f"no reference for {la}: {lb} absent"); continue
        (va, da), (vb, db) = losses(a), losses(b)
        same = va == vb and open(a[:-5] + ".csv").read() == open(b[:-5] + ".csv").read()
        print(f"{'IDENTICAL' if same else 'DIFFERENT'}  {la} ({da['backend']}, {da['transport']})"
              f"  vs  {lb} ({db['backend']}, {db['transport']})")
        bad += 0 if same else 1
sys.exit(1 if bad else 0)
PY
  record compare $? "$(grep -c '^IDENTICAL' "$work/compare.txt") identical, $(grep -cE '^(DIFFERENT|MISSING)' "$work/compare.txt") different or missing"
}

suite_step() {
  # The step rows at the default L2 prefetch distance, then again at each of the sweep's.
  run_step kernel-step 400 "$b/bin/fp4q_bench" --out "$work/fp4q_bench_step.json" \
    --commit "${commit%% *}" --only step --step-prefetch-sweep "${FP4Q_STEP_PREFETCH_SWEEP:-0,4}"
  local copy
  copy=$(sed -n 's/^copy: .*: \([0-9.]*\) GB\/s$/\1/p' "$work/kernel-step.log" | head -n 1)
  detail copy "${copy:-?} GB/s"
  local sock=$root/step.sock fast=$root/step.fast
  rm -f "$sock" "$fast"
  if ((!dry)); then
    "$b/bin/fp4qd" --backend "$backend" --allow_cuda_ipc --unix_socket "$sock" --fast_socket "$fast" \
      --listen 127.0.0.1:0 --metrics_listen= --state_budget_bytes=137438953472 --log_format text \
      > "$work/fp4qd.out" 2> "$work/fp4qd.log" &
    pid=$!
    for _ in $(seq 150); do grep -q listening "$work/fp4qd.out" && break; sleep 0.1; done
  fi
  local layers=${FP4Q_STEP_LLAMA_LAYERS:-32}
  st() {  # st NAME ARGS...: one bench-step configuration
    local name=$1
    shift
    run_step "$name" 240 "$b/bin/fp4q" --server "unix://$sock" bench-step \
      ${copy:+--copy-bandwidth "$copy"} --json "$work/$name.json" "$@"
  }
  local F=(--fast-socket "$fast")
  st gpt2-sgd-grpc --model gpt2-small
  st gpt2-sgd-fast --model gpt2-small "${F[@]}"
  st gpt2-sgd-delayed-fast --model gpt2-small --scaling delayed "${F[@]}"
  st gpt2-adamw-fast --model gpt2-small --optimizer adamw "${F[@]}"
  st gpt2-adamw-delayed-fast --model gpt2-small --optimizer adamw --scaling delayed "${F[@]}"
  st gpt2-adamw-nvfp4-fast --model gpt2-small --optimizer adamw --state-dtype nvfp4 "${F[@]}"
  st sq8192-fast --model square8192 "${F[@]}"
  st sq8192-delayed-fast --model square8192 --scaling delayed "${F[@]}"
  st llama-sgd-fast --model llama3-8b --layers "$layers" --iters 20 --warmup 3 "${F[@]}"
  st llama-sgd-delayed-fast --model llama3-8b --layers "$layers" --iters 20 --warmup 3 \
    --scaling delayed "${F[@]}"
  st llama-adamw-fast --model llama3-8b --layers "$layers" --iters 10 --warmup 2 \
    --optimizer adamw "${F[@]}"
  stop_server
  run_step trainer-step 420 python3 bench/trainer_step.py --fp4qd "$b/bin/fp4qd" \
    --profile "$work/trainer_step_profile.txt" \
    --llama-layers "${FP4Q_STEP_PY_LLAMA_LAYERS:-8}" --json "$work/trainer_step.json"
}

suite_gemm() {
  run_step kernel-gemm 300 "$b/bin/fp4q_bench" --out "$work/fp4q_bench_gemm.json" \
    --commit "${commit%% *}" --only GEMM
  run_step matmul-service 400 python3 bench/matmul_service.py --fp4qd "$b/bin/fp4qd" --grpc \
    --json "$work/matmul_service.json"
}

suite_train() {
  OUT=$work run_step train 560 bash scripts/train-transformer.sh --gpu
}

suite_dp() {
  run_step dp 400 python3 bench/dp_step.py --fp4qd "$b/bin/fp4qd" --ranks 4 \
    --json "$work/dp_step.json"
}

suite_multigpu() {
  if ((!dry)); then nvidia-smi -L > "$work/gpus.txt" 2>&1; nvidia-smi topo -m > "$work/topo.txt" 2>&1; fi
  gtest_step multigpu_test 240 "" "$b/bin/fp4q_multigpu_test"
  # One GPU visible: every test must skip, saying why; none may pass.
  if ((dry)); then echo "[$suite] multigpu_test_1gpu: CUDA_VISIBLE_DEVICES=0 fp4q_multigpu_test"; else
    CUDA_VISIBLE_DEVICES=0 timeout 60 "$b/bin/fp4q_multigpu_test" > "$work/multigpu_test_1gpu.log" 2>&1
    local rc=$? one=$work/multigpu_test_1gpu.log reason
    reason=$(grep -m1 'needs at least 2' "$one")
    if ((rc == 0)) && [[ -n "$reason" ]] && grep -q '^\[  SKIPPED \]' "$one" &&
       ! grep -q '^\[       OK \]' "$one"; then
      record multigpu_test_1gpu 0 "skips: $reason"
    else
      record multigpu_test_1gpu 1 "exit $rc, reason: ${reason:-NONE}"
    fi
  fi
  gtest_step ipc_gpu_test 150 "" "$b/bin/fp4q_ipc_gpu_test"
  run_step multigpu_check 150 python3 tests/python/multigpu_check.py --fp4qd "$b/bin/fp4qd"
}

# ---- Run them.
((dry)) || { : > "$summary"; }
for suite in "${suites[@]}"; do
  work=$root/$suite
  rm -rf "$work" && mkdir -p "$work"
  : > "$work/steps.tsv"
  failed_before=$failed
  failed=0
  if ((dry)); then echo "== $suite (dry run; bundle $b, backend $backend)"; else
    note "[$suite] commit: $commit; gpu: ${gpu:-none}; cpus: $(nproc); backend: $backend; bundle: $b"
  fi
  "suite_${suite//-/_}"
  suite_failed=$failed
  failed=$((failed_before || suite_failed))
  ((dry)) && continue
  verdict=PASS
  ((suite_failed)) && verdict=FAIL
  note "[$suite] VERDICT: $verdict"
  python3 - "$work" "$suite" "$verdict" "$commit" "${gpu:-none}" "$backend" > "$out/$suite.json" <<'PY'
import glob, json, os, sys
work, suite, verdict, commit, gpu, backend = sys.argv[1:7]
steps = []
for line in open(os.path.join(work, "steps.tsv")):
    name, rc, detail = (line.rstrip("\n").split("\t") + ["", ""])[:3]
    steps.append({"name": name, "exit": int(rc), "detail": detail})
results = {}
for path in sorted(glob.glob(os.path.join(work, "**", "*.json"), recursive=True)):
    key = os.path.relpath(path, work)[:-5]
    try:
        results[key] = json.load(open(path))
    except (OSError, ValueError) as e:
        results[key] = {"unreadable": str(e)}
json.dump({"suite": suite, "verdict": verdict, "commit": commit.strip(), "gpu": gpu,
           "backend": backend, "steps": steps, "results": results}, sys.stdout, indent=1)
PY
  tar czf "$out/$suite.tgz" -C "$root" --exclude='*.sock' --exclude='*.fast' "$suite"
done
((dry)) || echo "run.sh: $(elapsed); results in $out: $(cd "$out" && ls | tr '\n' ' ')"
exit "$failed"
