#!/usr/bin/env bash
# Sourced on the GPU machine, by run.sh and by the bench/results scripts' env.sh, with the
# bundle's folder as $1: a bundle made by `scripts/device-bundle.sh --pack` holds bin/ and lib/
# as packed.tar.xz, unpacked here once (the archive is removed after, so a second call on the
# same machine finds bin/ and lib/ and does nothing).
if [[ -f "$1/packed.tar.xz" ]]; then
  tar -C "$1" -xJf "$1/packed.tar.xz" && rm -f "$1/packed.tar.xz" ||
    { echo "unpack.sh: $1/packed.tar.xz could not be unpacked" >&2; return 1; }
fi
