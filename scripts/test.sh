#!/usr/bin/env bash
# Builds fp4q and runs every test (ctest). GPU tests skip, saying why, where no GPU is present.
#   scripts/test.sh [--build-dir DIR] [build.sh options] [-- ctest options]
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
build_args=()
ctest_args=()
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; build_args+=("$1" "$2"); shift 2 ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) sed -n '2,3p' "$0"; exit 0 ;;
    *) build_args+=("$1"); shift ;;
  esac
done

scripts/build.sh --build-dir "$build_dir" "${build_args[@]}"
cd "$build_dir"
set +e
ctest --output-on-failure -j "${FP4Q_JOBS:-$(nproc)}" --timeout 900 "${ctest_args[@]}" | tee ctest.log
rc=${PIPESTATUS[0]}
set -e
# End with ctest's summary line.
grep -E '^[0-9]+% tests passed' ctest.log | tail -n 1
exit "$rc"
