#!/usr/bin/env bash
# The packed device bundle (scripts/device-bundle.sh --pack): bin/ and lib/ carried as
# packed.tar.xz are unpacked by scripts/device/unpack.sh as run.sh sources it, byte for byte;
# a second call finds them unpacked and does nothing; a damaged archive is an error that says
# so. And run.sh, copied into a packed bundle, takes that bundle as its own (its --dry-run names
# it). Run from the repository root; exit 0 when every check holds.
set -uo pipefail
cd "$(dirname "$0")/../.."
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p "$t/src/bin" "$t/src/lib" "$t/b"
head -c 100000 /dev/urandom > "$t/src/bin/fp4qd"
chmod +x "$t/src/bin/fp4qd"
head -c 5000 /dev/urandom > "$t/src/lib/libx.so.1"
tar -C "$t/src" -cf - bin lib | xz -6 > "$t/b/packed.tar.xz"
cp scripts/device/run.sh "$t/b/run.sh"

out=$(OUT="$t/out" bash "$t/b/run.sh" --dry-run info 2>&1) || fail "run.sh --dry-run: $out"
grep -q "bundle $t/b," <<< "$out" || fail "run.sh did not take its own packed bundle: $out"
[[ ! -e "$t/b/packed.tar.xz" ]] || fail "packed.tar.xz left behind"
diff -r "$t/src/bin" "$t/b/bin" > /dev/null || fail "bin/ differs after unpacking"
diff -r "$t/src/lib" "$t/b/lib" > /dev/null || fail "lib/ differs after unpacking"
[[ -x "$t/b/bin/fp4qd" ]] || fail "bin/fp4qd lost its execute bit"

source scripts/device/unpack.sh "$t/b" || fail "a second unpack of an unpacked bundle failed"

echo "not xz" > "$t/b/packed.tar.xz"
msg=$( (source scripts/device/unpack.sh "$t/b") 2>&1) && fail "a damaged archive was accepted"
grep -q "unpack.sh: $t/b/packed.tar.xz could not be unpacked" <<< "$msg" ||
  fail "no message naming the damaged archive: $msg"
echo "unpack_test: all checks passed"
