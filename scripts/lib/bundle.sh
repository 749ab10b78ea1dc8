# shellcheck shell=bash
# Shared by the scripts that pack binaries for the lent GPU machine (scripts/device-bundle.sh).
# Source it; each function exits the script on error.
#
# The GPU machine has glibc, libstdc++, the CUDA driver and the CUDA 13 toolkit in
# /usr/local/cuda, but none of gRPC, protobuf, Abseil or prometheus-cpp: those travel in lib/.

# Libraries the GPU machine provides itself.
FP4Q_BUNDLE_SYSTEM_RE='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnvrtc|libnvJitLink)\.so'

# bundle_binaries OUT BUILD_DIR NAME...: copies BUILD_DIR/bin/NAME into OUT/bin, without debug
# info.
bundle_binaries() {
  local out=$1 build_dir=$2
  shift 2
  mkdir -p "$out/bin"
  local f
  for f in "$@"; do
    cp "$build_dir/bin/$f" "$out/bin/"
    strip --strip-debug "$out/bin/$f"
  done
}

# bundle_libraries OUT: copies every non-system shared library that OUT/bin/* needs into
# OUT/lib.
bundle_libraries() {
  local out=$1 entry name path
  mkdir -p "$out/lib"
  mapfile -t _fp4q_libs < <(for f in "$out"/bin/*; do ldd "$f"; done |
    awk '/=> \// {print $1 " " $3}' | sort -u)
  for entry in "${_fp4q_libs[@]}"; do
    name=${entry%% *}
    path=${entry#* }
    [[ "$name" =~ $FP4Q_BUNDLE_SYSTEM_RE ]] && continue
    cp -L "$path" "$out/lib/$name"
  done
}

# bundle_commit OUT PATH...: writes OUT/COMMIT: HEAD, and "dirty" when PATHs have uncommitted
# changes ("unknown" outside a git checkout).
bundle_commit() {
  local out=$1
  shift
  if ! git rev-parse HEAD > /dev/null 2>&1; then
    echo "unknown (not a git checkout)" > "$out/COMMIT"
    return
  fi
  {
    git rev-parse HEAD
    if [[ -n "$(git status --porcelain -- "$@")" ]]; then echo "dirty"; fi
  } > "$out/COMMIT"
}

# bundle_check OUT MAX_MIB WHO: every library of OUT/bin/* resolves with only OUT/lib and the
# CUDA toolkit on the path, and OUT stays under MAX_MIB (the device tool carries 64 MiB, the
# working tree included).
bundle_check() {
  local out=$1 max_mib=$2 who=$3 missing size_kib
  missing=$(for f in "$out"/bin/*; do
    LD_LIBRARY_PATH="$PWD/$out/lib:/usr/local/cuda/lib64" ldd "$f" | grep 'not found' || true
  done)
  if [[ -n "$missing" ]]; then
    echo "$who: unresolved libraries:" >&2
    echo "$missing" >&2
    exit 1
  fi
  size_kib=$(du -sk "$out" | cut -f1)
  echo "$who: $out is $((size_kib / 1024)) MiB ($(ls "$out/lib" | wc -l) libraries)"
  if ((size_kib > max_mib * 1024)); then
    echo "$who: over $max_mib MiB (the device tool carries 64 MiB, tree included)" >&2
    exit 1
  fi
}
