#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang + ASan + UBSan and runs them.
#   scripts/fuzz.sh [--build-dir DIR] [--target request|fast_socket|parsers|all] [--seconds N]
#                   [--smoke] [--seed] [--no-merge]
# Each target's seed corpus is one archive, tests/fuzz/corpus/<target>.tar.gz, unpacked into
# <build-dir>/corpus/<target> before a run.
# Default: each target for --seconds (300) on new inputs, the corpus extended with what it
# finds, then minimized into a fresh folder (-merge=1 -set_cover_merge=1: the fewest inputs that
# keep every feature) and packed back into the archive (commit it).
# --smoke (CI, ctest fp4q_fuzz_smoke): each target over its corpus plus 15 s of new inputs,
#   the archive left as committed. Exit 77 (ctest: skipped) when clang or libFuzzer is missing.
# --seed: adds each target's built-in seeds (seed-*) to its archive, then stops.
# Environment: FP4Q_JOBS (build jobs, default nproc). Logs: <build-dir>/fuzz-<target>.log.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-fuzz
targets=(request fast_socket parsers)
seconds=300
smoke=0
seed=0
merge=1
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --target) [[ "$2" == all ]] || targets=("$2"); shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --smoke) smoke=1; seconds=15; shift ;;
    --seed) seed=1; shift ;;
    --no-merge) merge=0; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

clang=""
for c in clang++ clang++-14; do
  if command -v "$c" > /dev/null 2>&1; then clang="$(command -v "$c")"; break; fi
done
if [[ -z "$clang" ]]; then
  echo "fuzz.sh: SKIP: clang++ is not installed (Debian: apt-get install clang libclang-rt-14-dev)"
  exit 77
fi
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  > "$probe/p.cc"
if ! "$clang" -fsanitize=fuzzer,address,undefined "$probe/p.cc" -o "$probe/p" 2> "$probe/err"; then
  echo "fuzz.sh: SKIP: $clang cannot link libFuzzer (Debian: libclang-rt-14-dev): $(head -c 300 "$probe/err")"
  exit 77
fi

sanitizers="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
sanitizers+=" -fno-sanitize=vptr"  # protobuf and gRPC come uninstrumented from Debian
jobs="${FP4Q_JOBS:-$(nproc)}"
mkdir -p "$build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER="$clang" -DFP4Q_FUZZ=ON \
  -DFP4Q_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DCMAKE_CXX_FLAGS="$sanitizers" > "$build_dir/fuzz-configure.log" 2>&1 ||
  { cat "$build_dir/fuzz-configure.log" >&2; exit 1; }
build_targets=()
for t in "${targets[@]}"; do build_targets+=(--target "fp4q_fuzz_$t"); done
cmake --build "$build_dir" -j "$jobs" "${build_targets[@]}"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
declare -A max_len=([request]=4096 [fast_socket]=4096 [parsers]=8192)

# pack DIR ARCHIVE: the folder's files as a reproducible tar.gz (sorted, no owners or times).
pack() {
  (cd "$1" && find . -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort |
    tar --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=u=rw,go=r -cf - -T -) |
    gzip -9n > "$2.tmp"
  mv "$2.tmp" "$2"
}
# unpack ARCHIVE DIR: a fresh DIR holding the archive's files (none when there is no archive).
unpack() {
  rm -rf "$2" && mkdir -p "$2"
  if [[ -f "$1" ]]; then tar -xzf "$1" -C "$2"; fi
}

rc=0
for t in "${targets[@]}"; do
  bin="$build_dir/bin/fp4q_fuzz_$t"
  archive="tests/fuzz/corpus/$t.tar.gz"
  corpus="$build_dir/corpus/$t"
  unpack "$archive" "$corpus"
  if ((seed)); then
    FP4Q_FUZZ_WRITE_SEEDS="$corpus" "$bin"
    pack "$corpus" "$archive"
    echo "fuzz.sh: $t: $archive holds $(ls "$corpus" | wc -l) inputs"
    continue
  fi
  new="$(mktemp -d)"
  log="$build_dir/fuzz-$t.log"
  # Smoke: new inputs go to a scratch dir (first directory), the corpus is only read.
  dirs=("$new" "$corpus")
  ((smoke)) || dirs=("$corpus")
  echo "fuzz.sh: $t for ${seconds}s over $(ls "$corpus" | wc -l) corpus inputs (log: $log)"
  set +e
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="${max_len[$t]}" \
    -print_final_stats=1 -artifact_prefix="$build_dir/crash-$t-" "${dirs[@]}" > "$log" 2>&1
  status=$?
  set -e
  grep -E '^#[0-9]+.*(DONE|INITED)|stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added' \
    "$log" | sed "s/^/fuzz.sh: $t: /" || true
  if ((status != 0)); then
    echo "fuzz.sh: $t FAILED (exit $status); the input is in $build_dir/crash-$t-*:" >&2
    tail -n 60 "$log" >&2
    rc=1
  elif ((!smoke && merge)); then
    merged="$(mktemp -d)"
    "$bin" -merge=1 -set_cover_merge=1 -timeout=10 -max_len="${max_len[$t]}" "$merged" \
      "$corpus" >> "$log" 2>&1
    pack "$merged" "$archive"
    echo "fuzz.sh: $t: corpus minimized to $(ls "$merged" | wc -l) inputs in $archive"
    rm -rf "$merged"
  fi
  rm -rf "$new"
done
exit "$rc"
