#!/usr/bin/env bash
# Builds here everything the device suites run (scripts/device/run.sh) and collects it into one
# folder, by default .bundle/ (git-ignored), which the device tool carries to the GPU machine:
#   bin/     fp4qd, fp4q, libfp4q_cuda.so, fp4q_cuda_test, fp4q_bench, fp4q_ipc_gpu_test,
#            fp4q_multigpu_test, fp4q_client_live_test, fp4q_example_{linear,mlp,linear_qdq}
#            (debug info stripped)
#   lib/     every non-system shared library they need (gRPC, protobuf, Abseil, prometheus-cpp
#            and friends): the GPU machine has glibc, libstdc++, the CUDA driver and the CUDA 13
#            toolkit, none of those (scripts/lib/bundle.sh)
#   golden/  the golden vectors (tests/data/golden) for fp4q_cuda_test
#   cpu/     the CPU backend's training results (docs/results/cpu-*), which the examples suite
#            compares the GPU's with
#   python/  fp4q_v1.binpb, the Python client's service descriptor (the GPU machine has no
#            protoc; the client itself runs from the repository's client/python)
#   wheels/  only when .whl/cuda/*.whl exist (e.g. torchao for the bench suite's peer)
#   run.sh   scripts/device/run.sh;  COMMIT  HEAD, and "dirty" with uncommitted source changes
# It checks that every library resolves with only lib/ and the CUDA toolkit on the path and
# that the folder stays under --max-mib (the device tool carries 64 MiB, working tree included).
# --pack then replaces bin/ and lib/ by packed.tar.xz (about a fifth of their size: 51 MiB went
# to 9.5 MiB at 2950929), which leaves room in one call for more, such as other builds of the
# CUDA module to compare; on the GPU machine run.sh, and the bench/results scripts' env.sh,
# unpack it first (scripts/device/unpack.sh).
#
#   scripts/device-bundle.sh [--build-dir DIR] [--out DIR] [--archs LIST] [--cpu-only]
#                            [--max-mib N] [--jobs N] [--pack]
# Defaults: build dir build-device, out .bundle, CUDA architectures 90a-real (the H200; one
# architecture keeps the CUDA module small), max 60 MiB, jobs $FP4Q_JOBS or nproc.
# --cpu-only builds without CUDA (no libfp4q_cuda.so and no GPU test binaries): a bundle for a
# dry run of run.sh here (run.sh --backend cpu).
# Then, with the device tool, from the repository root:
#   run(carry=[".bundle"], command="bash .bundle/run.sh gpu-tests bench")
#   run(kind="nvidia-h200-x2", carry=[".bundle"], command="bash .bundle/run.sh multigpu")
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-device
out=.bundle
archs=90a-real
cpu_only=0
max_mib=60
jobs=${FP4Q_JOBS:-$(nproc)}
pack=0
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --archs) archs="$2"; shift 2 ;;
    --cpu-only) cpu_only=1; shift ;;
    --max-mib) max_mib="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --pack) pack=1; shift ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "device-bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

bins=(fp4qd fp4q fp4q_client_live_test fp4q_example_linear fp4q_example_mlp
      fp4q_example_linear_qdq)
cmake_args=()
if ((cpu_only)); then
  cmake_args+=(-DFP4Q_WITH_CUDA=OFF)
else
  command -v nvcc > /dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
    { echo "device-bundle.sh: no nvcc here: the CUDA module cannot be built (--cpu-only?)" >&2; exit 1; }
  cmake_args+=(-DFP4Q_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$archs")
  bins+=(libfp4q_cuda.so fp4q_cuda_test fp4q_bench fp4q_ipc_gpu_test fp4q_multigpu_test)
fi
targets=()
for t in "${bins[@]}"; do
  [[ $t == libfp4q_cuda.so ]] && t=fp4q_cuda
  targets+=(--target "$t")
done
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}" ${FP4Q_CMAKE_ARGS:-} > /dev/null
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
/usr/bin/python3 client/python/fp4q/_protogen.py --out "$build_dir/fp4q_v1.binpb" > /dev/null

rm -rf "$out"
mkdir -p "$out/python" "$out/cpu"
# shellcheck source=scripts/lib/bundle.sh
source scripts/lib/bundle.sh
bundle_binaries "$out" "$build_dir" "${bins[@]}"
bundle_libraries "$out"
cp "$build_dir/fp4q_v1.binpb" "$out/python/"
cp -r tests/data/golden "$out/golden"
chmod -R u+w "$out"
if compgen -G "docs/results/cpu-*" > /dev/null; then cp -r docs/results/cpu-* "$out/cpu/"; fi
if compgen -G ".whl/cuda/*.whl" > /dev/null; then
  mkdir -p "$out/wheels" && cp .whl/cuda/*.whl "$out/wheels/"
fi
cp scripts/device/run.sh "$out/run.sh"
bundle_commit "$out" common kernels proto server client examples bench tests scripts
if ((pack)); then
  bundle_check "$out" 1024 device-bundle.sh
  tar -C "$out" -cf - bin lib | xz -T0 -6 > "$out/packed.tar.xz"
  rm -rf "$out/bin" "$out/lib"
  echo "device-bundle.sh: bin/ and lib/ packed into $out/packed.tar.xz" \
       "($(( $(stat -c %s "$out/packed.tar.xz") / 1048576 )) MiB)"
  size_kib=$(du -sk "$out" | cut -f1)
  if ((size_kib > max_mib * 1024)); then
    echo "device-bundle.sh: $out is over $max_mib MiB packed" >&2
    exit 1
  fi
else
  bundle_check "$out" "$max_mib" device-bundle.sh
fi
echo "device-bundle.sh: then run(carry=[\"$out\"], command=\"bash $out/run.sh SUITE\"); suites: bash $out/run.sh --help"
