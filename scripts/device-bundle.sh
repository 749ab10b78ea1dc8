#!/usr/bin/env bash
# Builds here what the GPU machine runs and collects it into ./.bundle/ (git-ignored):
#   bin/   libfp4q_cuda.so, fp4q_cuda_test, fp4q_bench (stripped of debug info)
#   lib/   every non-system shared library they need (ldd), i.e. Abseil and friends; not glibc,
#          libstdc++/libgcc, the CUDA driver, nor the CUDA toolkit libraries (cudart, cuBLAS(Lt))
#          that the GPU machine has in /usr/local/cuda
#   shared/ NUMERICS.md and golden/ from ../shared (the GPU machine does not get ../shared)
#   device-run.sh, torchao_peer.py, COMMIT
# and checks that it stays under 64 MiB and that every library resolves under the bundle's
# LD_LIBRARY_PATH. Then:   run(carry=[".bundle"], command=".bundle/device-run.sh all")
#
#   scripts/device-bundle.sh [--build-dir DIR] [--archs "90a-real"]
# Default build dir: build-bundle; default architectures: the project's (CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-bundle
archs=""
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --archs) archs="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "device-bundle.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

extra=()
if [[ -n "$archs" ]]; then extra=(-DCMAKE_CUDA_ARCHITECTURES="$archs"); fi
FP4Q_CMAKE_ARGS="${extra[*]:-}" \
  scripts/build.sh --no-deps --build-dir "$build_dir" \
  --target fp4q_cuda --target fp4q_cuda_test --target fp4q_bench

out=.bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/shared"
for f in libfp4q_cuda.so fp4q_cuda_test fp4q_bench; do
  cp "$build_dir/bin/$f" "$out/bin/"
  strip --strip-debug "$out/bin/$f"
done

# Libraries the GPU machine provides itself.
system_re='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnvrtc|libnvJitLink)\.so'
mapfile -t libs < <(for f in "$out"/bin/*; do ldd "$f"; done | awk '/=> \// {print $1 " " $3}' | sort -u)
for entry in "${libs[@]}"; do
  name=${entry%% *}
  path=${entry#* }
  if [[ "$name" =~ $system_re ]]; then continue; fi
  cp -L "$path" "$out/lib/$name"
done

shared_src=../shared
cp "$shared_src/NUMERICS.md" "$out/shared/"
cp -r "$shared_src/golden" "$out/shared/"
chmod -R u+w "$out/shared"
cp scripts/device-run.sh bench/torchao_peer.py "$out/"
# Wheels for the torchao peer (the GPU machine cannot download): put them in .whl/cuda/ first,
# e.g. pip download --no-deps --only-binary=:all: --python-version 3.12 ... torchao
if compgen -G ".whl/cuda/*.whl" > /dev/null; then
  mkdir -p "$out/wheels"
  cp .whl/cuda/*.whl "$out/wheels/"
fi
{
  git rev-parse HEAD
  if [[ -n "$(git status --porcelain -- kernels/src/cuda bench tests/kernels/cuda scripts)" ]]; then
    echo "dirty"
  fi
} > "$out/COMMIT"

# Every dependency must resolve with only the bundle and the CUDA toolkit on the path.
missing=$(for f in "$out"/bin/*; do
  LD_LIBRARY_PATH="$PWD/$out/lib:/usr/local/cuda/lib64" ldd "$f" | grep 'not found' || true
done)
if [[ -n "$missing" ]]; then
  echo "device-bundle.sh: unresolved libraries:" >&2
  echo "$missing" >&2
  exit 1
fi
size_kib=$(du -sk "$out" | cut -f1)
echo "device-bundle.sh: $out is $((size_kib / 1024)) MiB ($(ls "$out/lib" | wc -l) libraries)"
if ((size_kib > 60 * 1024)); then
  echo "device-bundle.sh: over the 60 MiB budget (64 MiB carry limit, tree included)" >&2
  exit 1
fi
