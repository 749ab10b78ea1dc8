# Sourced by this folder's device scripts (repository root, .bundle carried); it sources
# ../overlap/env.sh ($b, $o, room, archive_on_exit).
#   begin NAME [MORE]: $OUT/NAME.tgz gets $o whatever ends the script; then gpu_header MORE
#   gpu_header [MORE]: the GPU's name, driver and UUID and the commit (and MORE) into $o/gpu.txt
#   step_tests SECONDS: fp4q_cuda_test's step and one-pass tests into $o/cuda-tests.txt
#   pdl_bench ROUND SECONDS ORDER...: fp4q_bench's step rows (60 iterations) with the step kernels
#     as programmatic launches ("pdl") and plain (FP4Q_STEP_PDL=0, "plain"), in ORDER:
#     $o/bench-{pdl,plain}-ROUND.*
#   ab_bench ROUND SECONDS ONLY: fp4q_bench --only ONLY with the module under test ("new") and
#     the one gzipped in $b/alt/ ("old"), each with its own copy row: $o/bench-{new,old}-ROUND.*
#   start_fp4qd BANDWIDTH: fp4qd ($FP4QD, default the bundle's) on the CUDA backend with its
#     sockets in $d; sets $pid and $S (fp4q bench-step over the fast socket, kept plans, delayed
#     scaling)
#   step_pair MODEL ROUND ROOM SECONDS ARGS...: $S ARGS in two passes, then in one:
#     $o/cpp-MODEL-{two,one}-ROUND.{json,log}, each only if ROOM seconds are left
#   trainer NAME [FP4QD ARGS...]: bench/trainer_step.py over GPT-2 (one step's rows, 100 steps),
#     fp4qd started with FP4QD ARGS: $o/trainer-step-NAME.{txt,json}
#   phases NAME SPIN_US FP4QD_ARGS: python-client/trainloop.py's phases of the Python GPT-2
#     step (one pass, 1500 steps), the client's fast_socket_spin_us SPIN_US (empty: its
#     default), fp4qd with FP4QD_ARGS: $o/phases-NAME.txt
#   client_phases NAME SECONDS ENV...: python-client/trainloop.py with the environment ENV
#     (VAR=value: MODES, N, SCALING, PROFILE...): $o/phases-NAME.txt
#   alt_pair NAME DIR: mod[old] the bundle's module, mod[NAME] $b/DIR/new.so (gunzipped), and
#     test empty
#   only_rounds ONLY ORDER...: fp4q_bench --only ONLY with each of ORDER's modules in turn
#     (names in the associative array `mod`), 25 s each: $o/<only, lower case>-I-NAME.{json,txt}
#   gemm_rounds ORDER...: only_rounds GEMM, with --gemm-m $GEMM_M (default 32,64,128,256)
#   module_tests NAME FILTER [SECONDS [TAG]]: fp4q_cuda_test (${test[NAME]} if set; declare -A
#     test, maybe empty) with ${mod[NAME]}: $o/test-TAG-NAME.txt (TAG default "module")
#   gemm_tests NAME FILTER: module_tests NAME FILTER 60 matmul; gemm_memcheck NAME FILTER: the
#     tests under memcheck: $o/memcheck-NAME.txt
#   headline_steps: fp4q_bench's every row ($o/bench-all.*), then fp4qd started at that run's copy
#     bandwidth (start_fp4qd; 4200 GB/s when the bench did not run) and step_pair over GPT-2
#     small, 8192 x 8192 and Llama-3-8B-shaped layers; fp4qd is left running ($pid)
#   ipc_check SECONDS: tests/python/gpu_ipc_check.py (fp4qd started by it, the checks' calls over
#     the fast socket, 100 training steps): $o/gpu_ipc_check.txt and $o/ipc/
#   torch_side_tests: tests/python/test_torch_side.py on this torch: $o/test-torch-side.txt
#   mps_start / mps_stop: the CUDA MPS control daemon started (its pipe and log folders in /tmp;
#     a line in $o/gpu.txt) / stopped
#   overlap_loops: under CUDA MPS, train_loop's overlapped step beside torch's SGD over 9 rounds
#     of the train suite's 4-layer, d_model 384 model (mps), then 5 of a 6-layer, d_model 512
#     one (mps-6x512)
#   train_loop TAG BATCH ROUNDS SECONDS [FP4QD FLAGS...]: bench/train_loop.py (the train suite's
#     model in a loop beside torch's SGD) at BATCH x 128, fp4qd started with FP4QD FLAGS, and
#     the array loop_args's train_loop.py arguments if set (e.g. --variant=NAME):
#     $o/train-loop-TAG.{txt,json}
source bench/results/h200-step/overlap/env.sh
begin() {
  archive_on_exit $1
  shift
  gpu_header "$@"
}
gpu_header() {
  nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader | tee $o/gpu.txt
  echo "commit $FP4Q_COMMIT${1:+; $1}" | tee -a $o/gpu.txt
}
step_tests() {
  timeout $1 $b/bin/fp4q_cuda_test --gtest_filter='*OnePass*:*Step*:*LeanSgd*:*Batches*' \
    > $o/cuda-tests.txt 2>&1
  echo "rc=$?" >> $o/cuda-tests.txt; grep -E "^\[ +(FAILED|PASSED|SKIPPED) |rc=" $o/cuda-tests.txt
}
pdl_bench() {
  local round=$1 secs=$2 v env; shift 2
  for v in "$@"; do
    room $secs "bench $v $round" || continue
    env=""; [[ $v == plain ]] && env="FP4Q_STEP_PDL=0"
    env $env timeout $secs stdbuf -oL $b/bin/fp4q_bench --only step --iters 60 \
      --out $o/bench-$v-$round.json > $o/bench-$v-$round.txt 2>&1
    echo "bench $v $round rc=$? ($SECONDS s)"; grep -E "^copy|^step" $o/bench-$v-$round.txt
  done
}
ab_bench() {
  local round=$1 secs=$2 only=$3 m mod
  [[ -f $b/alt/libfp4q_cuda.so.gz ]] && gunzip -f $b/alt/libfp4q_cuda.so.gz
  for m in new old; do
    mod=$b/bin/libfp4q_cuda.so; [[ $m == old ]] && mod=$b/alt/libfp4q_cuda.so
    room $secs "bench $m $round" || continue
    FP4Q_CUDA_MODULE=$mod timeout $secs stdbuf -oL $b/bin/fp4q_bench --only "$only" \
      --out $o/bench-$m-$round.json > $o/bench-$m-$round.txt 2>&1
    echo "bench $m $round rc=$? ($SECONDS s)"; grep -E "^copy|^step" $o/bench-$m-$round.txt
  done
}
start_fp4qd() {
  d=/tmp/fq; mkdir -p $d; rm -f $d/*.sock
  ${FP4QD:-$b/bin/fp4qd} --listen 127.0.0.1:0 --metrics_listen "" --unix_socket $d/g.sock \
    --fast_socket $d/f.sock --allow_cuda_ipc --backend cuda --log_format text \
    --state_budget_bytes 110000000000 > $d/out 2>> $o/fp4qd.log &
  pid=$!; for i in $(seq 400); do [[ -S $d/f.sock ]] && break; sleep 0.05; done
  grep -o "step_signals[^ ]*" $o/fp4qd.log | tail -1
  S="$b/bin/fp4q --server unix://$d/g.sock bench-step --fast-socket $d/f.sock --plan \
    --scaling delayed --copy-bandwidth $1"
}
step_pair() {
  local m=$1 r=$2 need=$3 secs=$4 p flag; shift 4
  for p in two one; do
    flag=""; [[ $p == one ]] && flag="--one-pass"
    room $need "$m $p round $r" || return 0
    timeout $secs $S "$@" $flag --json $o/cpp-$m-$p-$r.json > $o/cpp-$m-$p-$r.log 2>&1
    echo "$m $p $r rc=$? $(python3 -c "import json;d=json.load(open('$o/cpp-$m-$p-$r.json'));print('wall p50 %.1f us, kernel p50 %.1f us, %% of copy (wall, kernel) %s' % (d['wall_us']['p50'], d['kernel_us']['p50'], d.get('pct_of_copy_bandwidth')))" 2>&1 | tail -1)"
  done
}
phases() {
  client_phases $1 45 SPIN_US=$2 FP4QD_ARGS="$3" SCALING=delayed ONE_PASS=1 MODES=gpt2 N=1500
}
client_phases() {
  local name=$1 secs=$2; shift 2
  room $secs "phases $name" || return 0
  env B=$b "$@" timeout $secs python3 bench/results/h200-step/python-client/trainloop.py \
    > $o/phases-$name.txt 2>&1
  echo "phases $name rc=$? ($SECONDS s)"; grep -E "mode=|pre-send|per step" $o/phases-$name.txt
}
trainer() {
  local name=$1 a args=(); shift
  for a in "$@"; do args+=("--fp4qd-arg=$a"); done
  room 130 "trainer_step $name" || return 0
  timeout 130 python3 bench/trainer_step.py --fp4qd $b/bin/fp4qd --models gpt2-small \
    --behind-ms 0 --steps 100 --warmup 10 "${args[@]}" --json $o/trainer-step-$name.json \
    > $o/trainer-step-$name.txt 2>&1
  echo "trainer_step $name rc=$?"
  grep -E "^copy|wait|delayed scaling|foreach|8192" $o/trainer-step-$name.txt | head -10
}
gemm_rounds() { only_rounds GEMM "$@"; }
only_rounds() {
  local only=$1 i=0 v args=(); shift
  [[ $only == GEMM ]] && args=(--gemm-m ${GEMM_M:-32,64,128,256})
  for v in "$@"; do
    i=$((i + 1))
    room 25 "$only $v $i" || continue
    local f=$o/${only,,}-$i-$v
    FP4Q_CUDA_MODULE=${mod[$v]} timeout 25 $b/bin/fp4q_bench --out $f.json --only "$only" \
      ${args[@]+"${args[@]}"} > $f.txt 2>&1
    echo "== $i $v rc=$?"; grep -E "^copy|^GEMM|^\| [a-z ]*$only" $f.txt | cut -c1-100
  done
}
alt_pair() {
  [[ -f $b/$2/new.so.gz ]] && gunzip -f $b/$2/new.so.gz
  declare -gA mod=([old]=$b/bin/libfp4q_cuda.so [$1]=$b/$2/new.so) test=()
}
gemm_tests() { module_tests "$1" "$2" 60 matmul; }
module_tests() {
  local t=${test[$1]:-$b/bin/fp4q_cuda_test} secs=${3:-60} f=$o/test-${4:-module}-$1.txt
  room $secs "tests $1" && FP4Q_CUDA_MODULE=${mod[$1]} timeout $secs $t --gtest_filter="$2" \
    > $f 2>&1
  echo "tests $1 rc=$?"; grep -E "^\[ +(PASSED|FAILED) " $f | head -20
}
gemm_memcheck() {
  local t=${test[$1]:-$b/bin/fp4q_cuda_test}
  local cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  room 80 "memcheck $1" && FP4Q_CUDA_MODULE=${mod[$1]} timeout 80 $cs --tool memcheck $t \
    --gtest_filter="$2" > $o/memcheck-$1.txt 2>&1
  echo "memcheck $1 rc=$?"; grep -E "ERROR SUMMARY|^\[ +(PASSED|FAILED) " $o/memcheck-$1.txt
}
train_loop() {
  local tag=$1 batch=$2 rounds=$3 secs=$4 a args=(); shift 4
  for a in "$@"; do args+=("--fp4qd-arg=$a"); done
  room $secs "train_loop $tag" || return 0
  timeout $secs python3 bench/train_loop.py --fp4qd "$b/bin/fp4qd" "${args[@]}" \
    ${loop_args[@]+"${loop_args[@]}"} --rounds $rounds --batch $batch \
    --out $o/train-loop-$tag.json > $o/train-loop-$tag.txt 2>&1
  echo "$tag rc=$?"; tail -16 $o/train-loop-$tag.txt
}
headline_steps() {
  room 240 "whole bench" && timeout 240 stdbuf -oL $b/bin/fp4q_bench --out $o/bench-all.json \
    > $o/bench-all.txt 2>&1
  echo "whole bench rc=$? ($SECONDS s)"; grep -E "^copy|^\|" $o/bench-all.txt | cut -d'|' -f2-7 \
    | head -70
  bw=$(python3 -c "import json;print(json.load(open('$o/bench-all.json'))['copy_gbps'])" \
    2>/dev/null || echo 4200)
  start_fp4qd $bw
  step_pair gpt2 1 40 30 --model gpt2-small --iters 300 --warmup 20
  step_pair sq8192 1 40 30 --model square8192 --iters 200 --warmup 20
  step_pair llama 1 100 90 --model llama3-8b --iters 10 --warmup 2
}
overlap_loops() {
  mps_start
  loop_args=("--variant=fp4q overlap")
  train_loop mps 256 9 80
  loop_args=("--variant=fp4q overlap" --layers=6 --d-model=512 --heads=8)
  train_loop mps-6x512 256 5 70
  mps_stop
}
ipc_check() {
  room $1 "gpu_ipc_check" || return 0
  timeout $1 python3 tests/python/gpu_ipc_check.py --fp4qd $b/bin/fp4qd --out $o/ipc \
    --steps 100 --fast-socket /tmp/fp4q-check.sock > $o/gpu_ipc_check.txt 2>&1
  echo "gpu_ipc_check rc=$?"; tail -1 $o/gpu_ipc_check.txt
  grep -o '"raw_stream_handles": \[\[[0-9, ]*\], \[[0-9, ]*\]\]' $o/gpu_ipc_check.txt
  grep -o '"ready_words_by_the_driver": [0-9]*' $o/gpu_ipc_check.txt; grep '^FAIL' $o/gpu_ipc_check.txt | cut -c1-300
}
torch_side_tests() {
  (cd tests/python && PYTHONPATH=../../client/python:. timeout 60 python3 -m unittest -v \
    test_torch_side) > $o/test-torch-side.txt 2>&1
  echo "test_torch_side rc=$?"; tail -3 $o/test-torch-side.txt
}
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  MPS=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
  $MPS -d && echo "MPS started ($SECONDS s)" | tee -a $o/gpu.txt
}
mps_stop() {
  echo quit | $MPS; sleep 1; echo "MPS stopped ($SECONDS s)" | tee -a $o/gpu.txt
}
