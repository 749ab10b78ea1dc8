#!/usr/bin/env bash
# Installs the CUDA toolkit (or only its runtime libraries) from NVIDIA's Debian 12 repository.
# Used by the Dockerfile; CI and developer machines bring their own CUDA (build.sh finds nvcc).
#   scripts/install-cuda.sh --devel    nvcc, cudart and cuBLAS headers: what the build needs
#   scripts/install-cuda.sh --runtime  libcudart and libcublasLt: what libfp4q_cuda.so loads
# Environment: CUDA_VERSION (major.minor, default 13.0). Runs as root. Debian 12 (bookworm) only.
set -euo pipefail

mode="${1:-}"
case "$mode" in
  --devel|--runtime) ;;
  -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
  *) echo "install-cuda.sh: expected --devel or --runtime, got '${mode}'" >&2; exit 2 ;;
esac

version="${CUDA_VERSION:-13.0}"
if [[ ! "$version" =~ ^[0-9]+\.[0-9]+$ ]]; then
  echo "install-cuda.sh: CUDA_VERSION must be MAJOR.MINOR, got '${version}'" >&2
  exit 2
fi
. /etc/os-release
if [[ "${ID:-}" != "debian" || "${VERSION_ID:-}" != "12" ]]; then
  echo "install-cuda.sh: needs Debian 12, this is ${PRETTY_NAME:-unknown}" >&2
  exit 2
fi
arch="$(dpkg --print-architecture)"
case "$arch" in
  amd64) repo_arch=x86_64; target=x86_64-linux ;;
  arm64) repo_arch=sbsa; target=sbsa-linux ;;
  *) echo "install-cuda.sh: no CUDA repository for architecture ${arch}" >&2; exit 2 ;;
esac
pkg_version="${version/./-}"

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends ca-certificates curl
# The keyring package installs NVIDIA's signing key and the apt source for the repository.
keyring_deb="$(mktemp --suffix=.deb)"
curl -fsSL -o "$keyring_deb" \
  "https://developer.download.nvidia.com/compute/cuda/repos/debian12/${repo_arch}/cuda-keyring_1.1-1_all.deb"
dpkg -i "$keyring_deb"
rm -f "$keyring_deb"
apt-get update -q

if [[ "$mode" == "--devel" ]]; then
  pkgs=("cuda-minimal-build-${pkg_version}" "libcublas-dev-${pkg_version}")
else
  pkgs=("cuda-cudart-${pkg_version}" "libcublas-${pkg_version}")
fi
apt-get install -y -q --no-install-recommends "${pkgs[@]}"

# Make the libraries findable without LD_LIBRARY_PATH, and nvcc reachable as /usr/local/cuda.
lib_dir="/usr/local/cuda-${version}/targets/${target}/lib"
echo "$lib_dir" > "/etc/ld.so.conf.d/zz-cuda-${pkg_version}.conf"
ldconfig
if [[ ! -e /usr/local/cuda ]]; then ln -s "cuda-${version}" /usr/local/cuda; fi

# The runtime image keeps no downloader and no package lists.
if [[ "$mode" == "--runtime" ]]; then
  apt-get purge -y -q --auto-remove curl
fi
rm -rf /var/lib/apt/lists/*
echo "install-cuda.sh: installed ${pkgs[*]} (libraries in ${lib_dir})"
