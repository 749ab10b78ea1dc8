# Sourced by the scripts of this folder (run from the repository root, .bundle carried): the
# bundle's libraries, CUDA module and descriptor, the client on PYTHONPATH, $o for the outputs.
b=$PWD/.bundle
source scripts/device/unpack.sh "$b" || exit 1  # a bundle made with --pack
cuda_lib=/usr/local/cuda/lib64
export LD_LIBRARY_PATH="$b/lib:$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ ! -e "$cuda_lib/libcublasLt.so.13" ]]; then
  extra=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
  [[ -n "$extra" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$extra"
fi
chmod +x "$b"/bin/*
export FP4Q_CUDA_MODULE="$b/bin/libfp4q_cuda.so" FP4Q_FP4QD="$b/bin/fp4qd"
export PYTHONPATH="$PWD/client/python:$PWD/tests/python"
export FP4Q_PROTO_DESCRIPTOR="$b/python/fp4q_v1.binpb" PYTHONUNBUFFERED=1
export FP4Q_COMMIT=$(cat "$b/COMMIT")
o=$OUT/r; mkdir -p $o
# A device call may run for 600 s. room SECONDS WHAT: whether WHAT, taking up to SECONDS, still
# fits in this script's share (LIMIT seconds, default 560); a phase that does not fit is skipped
# and says so. archive_on_exit NAME: $OUT/NAME.tgz holds $o whatever ends the script.
room() {
  (( SECONDS + $1 < ${LIMIT:-560} )) && return 0
  echo "skipped (no time left): $2" | tee -a $o/skipped.txt; return 1
}
archive_on_exit() { trap "cd $OUT && tar czf $1.tgz r && rm -rf r" EXIT; }
