#!/usr/bin/env bash
# The transformer proof (docs/TRAINING.md "A transformer with 4-bit stored weights"):
# train/run.py against an fp4qd it starts itself, then train/plot.py on the results.
#
#   scripts/train-transformer.sh [--gpu] [--build-dir DIR] [--bundle DIR] [--out DIR]
#                                [--doc] [-- RUN.PY ARGS...]
#
# Default: the CPU version (--preset cpu-ci: a 2-layer d_model-64 model on 3-digit addition,
# 400 steps of bf16, frozen-weights, RTN and RTN+EF AdamW, CPU fp4qd): about 1.5 minutes on two
# cores. --gpu: the full version (--preset gpu: 4 layers, d_model 384, both tasks, every
# variant, CUDA fp4qd with CUDA IPC and the fast socket): about 4-5 minutes on one H200
# (estimate; the summary records the measured time). fp4qd comes from --bundle (default .bundle
# when it holds bin/fp4qd: scripts/device-bundle.sh, with its libraries and the Python client's
# descriptor) or else from --build-dir (default build). Results in --out (default
# DIR/train-cpu or DIR/train-gpu). Where $OUT is set (the device tool's machine, which returns
# at most 8 files), the run goes to /tmp/fp4q-train and $OUT gets train.tgz (the whole folder:
# unpack it and run train/plot.py on it), summary.json, results.md, the PNGs and train.log.
# --doc also rewrites the results block of docs/TRAINING.md and its images (docs/img/train/).
# Exit status: run.py's (0 done, 1 error, 2 bad usage); plotting is skipped, saying so, where
# matplotlib is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

gpu=0
build_dir=build
bundle=""
out=""
doc=0
extra=()
while (($#)); do
  case "$1" in
    --gpu) gpu=1; shift ;;
    --build-dir) build_dir="${2:?--build-dir needs a value}"; shift 2 ;;
    --bundle) bundle="${2:?--bundle needs a value}"; shift 2 ;;
    --out) out="${2:?--out needs a value}"; shift 2 ;;
    --doc) doc=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "train-transformer.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -z "$bundle" && -x .bundle/bin/fp4qd ]]; then bundle=.bundle; fi
if [[ -n "$bundle" ]]; then
  b=$(cd "$bundle" && pwd)
  fp4qd=$b/bin/fp4qd
  export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [[ -f "$b/python/fp4q_v1.binpb" ]] && export FP4Q_PROTO_DESCRIPTOR="$b/python/fp4q_v1.binpb"
else
  fp4qd=$build_dir/bin/fp4qd
  d=$build_dir/tests/python/fp4q_v1.binpb
  [[ -f "$d" ]] && export FP4Q_PROTO_DESCRIPTOR=$PWD/$d
fi
[[ -x "$fp4qd" ]] || { echo "train-transformer.sh: no fp4qd at $fp4qd (scripts/build.sh, or --bundle)" >&2; exit 1; }

py=python3
if ((gpu)); then
  preset=gpu
else
  preset=cpu-ci
  [[ -x /usr/bin/python3 ]] && py=/usr/bin/python3  # Debian's torch (scripts/install-deps.sh)
fi
pack=""
if [[ -z "$out" ]]; then
  if [[ -n "${OUT:-}" ]]; then
    out=/tmp/fp4q-train
    pack=$OUT
    rm -rf "$out"
  else
    out=$build_dir/train-${preset%%-*}
  fi
fi
export PYTHONPATH="$PWD/client/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

start=$(date +%s)
mkdir -p "$out"
set +e
"$py" train/run.py --preset "$preset" --fp4qd "$fp4qd" --out "$out" "${extra[@]}" 2>&1 |
  tee "$out/train.log"
rc=${PIPESTATUS[0]}
set -e
echo "train-transformer.sh: run.py took $(($(date +%s) - start)) s (exit $rc); results in $out"
if [[ ! -f "$out/summary.json" ]]; then
  echo "train-transformer.sh: no $out/summary.json: nothing to plot"
elif "$py" -c 'import matplotlib' 2>/dev/null; then
  plot=("$py" train/plot.py "$out")
  if ((doc)); then plot+=(--img-dir docs/img/train --doc docs/TRAINING.md); fi
  if "${plot[@]}" > /dev/null; then
    echo "train-transformer.sh: plots and table in $out (results.md, *.png)"
  else
    echo "train-transformer.sh: train/plot.py failed (above)"
  fi
else
  echo "train-transformer.sh: no matplotlib for $py: plots skipped (train/plot.py $out)"
fi
if [[ -n "$pack" ]]; then
  tar czf "$pack/train.tgz" -C "$out" .
  for f in summary.json results.md add.png text.png train.log; do
    if [[ -f "$out/$f" ]]; then cp "$out/$f" "$pack/"; fi
  done
  echo "train-transformer.sh: $pack/train.tgz and the summary, table, plots and log in $pack"
fi
exit "$rc"
