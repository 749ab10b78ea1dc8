#!/usr/bin/env bash
# The fp4q demo ("main job"): builds what is missing, starts fp4qd on a free port (backend auto:
# CUDA where a GPU is usable, else CPU), shows it working (fp4q health, fp4q info), runs the short
# version of the three training examples (RTN / SR / EF tables, docs/TRAINING.md), then the path a
# PyTorch team takes: the Python client pip-installed into a venv, its fp4-train functions, a
# small model trained with fp4q.nn.Linear, the same model with its weights stored in 4 bits and
# updated by fp4qd (fp4q.optim.AdamW, the trainer's step; scripts/demo_pytorch.py), the CLI turning that
# model's weights into an NVFP4 checkpoint inference engines load (and back). Then it stops the
# server with SIGTERM. A yes/NO verdict is printed only for an asserted check: the examples'
# by CI (tests/examples, examples.demo_results), the Python part's by this demo itself.
#
#   scripts/demo.sh [--build-dir DIR] [--no-build] [--steps N] [--seed N] [--out DIR]
#                   [--backend auto|cpu|cuda] [--transport inline|cuda_ipc]
#
# Defaults: build dir ./build, 200 steps, seed 1, results (tables, CSV loss curves, JSON, server
# log) in DIR/demo, backend auto, transport inline. --no-build uses the binaries as they are.
# Exit status: 0 when every step worked, 1 otherwise (the failing step is named), 2 bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
build=1
steps=200
seed=1
out=""
backend=auto
transport=inline
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --build-dir) build_dir="${2:?--build-dir needs a value}"; shift 2 ;;
    --no-build) build=0; shift ;;
    --steps) steps="${2:?--steps needs a value}"; shift 2 ;;
    --seed) seed="${2:?--seed needs a value}"; shift 2 ;;
    --out) out="${2:?--out needs a value}"; shift 2 ;;
    --backend) backend="${2:?--backend needs a value}"; shift 2 ;;
    --transport) transport="${2:?--transport needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "demo.sh: --steps '$steps' is not a positive integer" >&2; exit 2; }
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "demo.sh: --seed '$seed' is not an unsigned integer" >&2; exit 2; }
case "$backend" in auto|cpu|cuda) ;; *) echo "demo.sh: --backend '$backend' is not auto, cpu or cuda" >&2; exit 2 ;; esac
case "$transport" in inline|cuda_ipc) ;; *) echo "demo.sh: --transport '$transport' is not inline or cuda_ipc" >&2; exit 2 ;; esac
out="${out:-$build_dir/demo}"
bin="$build_dir/bin"
repo=$(pwd)
# Debian's interpreter (python3-torch, -grpcio, -protobuf, -numpy, -venv), or $FP4Q_PYTHON.
python="${FP4Q_PYTHON:-python3}"
if [[ -z "${FP4Q_PYTHON:-}" && -x /usr/bin/python3 ]]; then python=/usr/bin/python3; fi
examples=(linear mlp linear_qdq)

step() { printf '\n=== %s\n' "$*"; }
die() { echo "demo.sh: FAILED: $*" >&2; exit 1; }

if ((build)); then
  step "build (scripts/build.sh: Debian packages, then only what changed)"
  targets=(--target fp4qd --target fp4q)
  for e in "${examples[@]}"; do targets+=(--target "fp4q_example_$e"); done
  scripts/build.sh --build-dir "$build_dir" "${targets[@]}" || die "build"
  # The CUDA backend module, where this build has it (a CUDA toolkit was found).
  if [[ "$backend" != cpu ]] && [[ -n "$(cmake --build "$build_dir" --target help | sed -n '/^fp4q_cuda:/p')" ]]; then
    cmake --build "$build_dir" --target fp4q_cuda || die "build of the CUDA module"
  fi
fi
for f in fp4qd fp4q "${examples[@]/#/fp4q_example_}"; do
  [[ -x "$bin/$f" ]] || die "$bin/$f is missing (run without --no-build)"
done
mkdir -p "$out"

server_pid=""
stop_server() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2> /dev/null; then
    kill -TERM "$server_pid" 2> /dev/null || true
    wait "$server_pid" 2> /dev/null || true
  fi
  server_pid=""
}
trap stop_server EXIT

step "start fp4qd (--backend $backend, free port)"
allow_ipc=()
if [[ "$transport" == cuda_ipc ]]; then allow_ipc=(--allow_cuda_ipc --cuda_ipc_over_tcp); fi
"$bin/fp4qd" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 --backend "$backend" \
  --log_format text "${allow_ipc[@]}" > "$out/fp4qd.stdout" 2> "$out/fp4qd.log" &
server_pid=$!
addr=""
for _ in $(seq 1 300); do
  addr=$(sed -n 's/^fp4qd: listening on //p' "$out/fp4qd.stdout" | head -n 1)
  [[ -n "$addr" ]] && break
  if ! kill -0 "$server_pid" 2> /dev/null; then
    tail -n 20 "$out/fp4qd.log" >&2
    die "fp4qd exited before listening (log: $out/fp4qd.log)"
  fi
  sleep 0.1
done
[[ -n "$addr" ]] || die "fp4qd did not print its address within 30 s (log: $out/fp4qd.log)"
cat "$out/fp4qd.stdout"

step "fp4q health"
"$bin/fp4q" --server "$addr" health || die "fp4q health"
step "fp4q info"
"$bin/fp4q" --server "$addr" info || die "fp4q info"

for e in "${examples[@]}"; do
  step "example $e: $steps steps, seed $seed, transport $transport"
  set +e
  "$bin/fp4q_example_$e" --server "$addr" --steps "$steps" --seed "$seed" \
    --transport "$transport" --csv "$out/$e.csv" --json "$out/$e.json" | tee "$out/$e.txt"
  rc=${PIPESTATUS[0]}
  set -e
  ((rc == 0)) || die "example $e (exit status $rc)"
done

step "the Python client, installed as a PyTorch team would: pip install ./client/python"
"$python" -c "import torch, grpc, google.protobuf, numpy" 2> /dev/null ||
  die "$python lacks torch, grpcio, protobuf or numpy (Debian: scripts/install-deps.sh)"
# A venv that sees the distribution's torch; no package index (scripts/demo.sh runs offline):
# build with the installed setuptools, take the dependencies from what is installed.
"$python" -m venv --system-site-packages "$out/venv" || die "python3 -m venv $out/venv"
"$out/venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation \
  --no-index ./client/python || die "pip install ./client/python"
echo "installed fp4q into $out/venv"

step "PyTorch: the fp4-train functions, a small model trained with fp4q.nn.Linear, and the same model with its weights stored in 4 bits by fp4q.optim.AdamW"
"$out/venv/bin/python" "$repo/scripts/demo_pytorch.py" train --server "$addr" \
  --out "$out/pytorch" --seed "$seed" | tee "$out/pytorch.txt"
((PIPESTATUS[0] == 0)) || die "scripts/demo_pytorch.py train"

step "the CLI on that model's file: fp4q quantize (NVFP4, ModelOpt layout), fp4q dequantize"
mkdir -p "$out/pytorch/nvfp4"
rm -f "$out/pytorch/nvfp4/hf_quant_config.json"
"$bin/fp4q" --server "$addr" quantize "$out/pytorch/model.safetensors" \
  "$out/pytorch/nvfp4/model.safetensors" || die "fp4q quantize"
cat "$out/pytorch/nvfp4/hf_quant_config.json"
"$bin/fp4q" --server "$addr" dequantize "$out/pytorch/nvfp4/model.safetensors" \
  "$out/pytorch/dequantized.safetensors" || die "fp4q dequantize"
"$out/venv/bin/python" "$repo/scripts/demo_pytorch.py" check-checkpoint --out "$out/pytorch" ||
  die "scripts/demo_pytorch.py check-checkpoint"

step "stop fp4qd (SIGTERM)"
kill -TERM "$server_pid"
set +e
wait "$server_pid"
rc=$?
set -e
server_pid=""
((rc == 0)) || die "fp4qd exited with status $rc on SIGTERM (log: $out/fp4qd.log)"
echo "fp4qd stopped cleanly (exit status 0)"

step "done: tables, CSV loss curves, JSON results and the Python part's files in $out"
ls "$out"
