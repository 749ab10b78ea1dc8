# syntax=docker/dockerfile:1
# fp4qd container image: builder and runtime stages, CUDA or CPU-only.
#
#   docker build -t fp4qd:0.1.0-cuda13 .                              CUDA backend (default)
#   docker build -t fp4qd:0.1.0-cpu --build-arg FP4Q_VARIANT=cpu .    CPU backend, no CUDA at all
#
# Base: debian:12 in every stage, not nvidia/cuda:*-ubuntu24.04. The build installs its
# libraries (gRPC 1.51, protobuf 3.21, Abseil 20220623, prometheus-cpp 1.0.1) with the same
# scripts/install-deps.sh that CI runs on Debian 12, so image and CI build the same code against
# the same packages. Ubuntu 24.04 renamed those packages (the t64 transition: libprotobuf32t64,
# libgrpc++1.51t64, ...), so the script could not run there and the two would drift. The CUDA
# toolkit comes from NVIDIA's Debian 12 repository (scripts/install-cuda.sh); the GPU driver
# (libcuda.so.1) is injected at run time by the NVIDIA container toolkit.
#
# Stages: toolchain-{cpu,cuda} -> build (scripts/build.sh) -> runtime-{cpu,cuda} + binaries.
# With BuildKit only the stages of the chosen variant are built.

ARG FP4Q_VARIANT=cuda
ARG DEBIAN_IMAGE=debian:12-slim
ARG CUDA_VERSION=13.0

# ---- toolchain: compilers and -dev packages, exactly what CI installs ----
FROM ${DEBIAN_IMAGE} AS toolchain-cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*

FROM toolchain-cpu AS toolchain-cuda
ARG CUDA_VERSION
COPY scripts/install-cuda.sh scripts/install-cuda.sh
RUN CUDA_VERSION="${CUDA_VERSION}" scripts/install-cuda.sh --devel

# ---- build: the CI build script, without tests ----
FROM toolchain-${FP4Q_VARIANT} AS build
ARG FP4Q_VARIANT
# Optional, e.g. "90a-real;100a-real" to build fewer GPU architectures than the default list.
ARG CUDA_ARCHITECTURES=""
COPY . /src
RUN variant_args=(); \
    if [[ "${FP4Q_VARIANT}" == cpu ]]; then variant_args+=(--cpu-only); \
    elif [[ "${FP4Q_VARIANT}" != cuda ]]; then \
      echo "FP4Q_VARIANT must be cuda or cpu, got '${FP4Q_VARIANT}'" >&2; exit 2; fi; \
    cmake_args="-DFP4Q_BUILD_TESTS=OFF"; \
    if [[ -n "${CUDA_ARCHITECTURES}" ]]; then \
      cmake_args+=" -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}"; fi; \
    FP4Q_CMAKE_ARGS="${cmake_args}" scripts/build.sh --build-dir /build --no-deps \
      "${variant_args[@]}" && \
    install -d /out/bin && \
    install -m 0755 /build/bin/fp4qd /build/bin/fp4q /out/bin/ && \
    if [[ "${FP4Q_VARIANT}" == cuda ]]; then \
      test -f /build/bin/libfp4q_cuda.so || { echo "CUDA build produced no libfp4q_cuda.so" >&2; exit 1; }; \
      install -m 0644 /build/bin/libfp4q_cuda.so /out/bin/; \
    fi && \
    strip --strip-debug /out/bin/*

# ---- runtime: only the shared libraries fp4qd and the CUDA module load ----
FROM ${DEBIAN_IMAGE} AS runtime-cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh --runtime && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh

FROM runtime-cpu AS runtime-cuda
ARG CUDA_VERSION
COPY scripts/install-cuda.sh /tmp/install-cuda.sh
RUN CUDA_VERSION="${CUDA_VERSION}" /tmp/install-cuda.sh --runtime && rm /tmp/install-cuda.sh
# What the NVIDIA container toolkit mounts: the compute driver and nvidia-smi. Which GPUs are
# visible is decided by the device plugin or DRA driver, not by the image.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility

FROM runtime-${FP4Q_VARIANT} AS runtime
ARG FP4Q_VARIANT
LABEL org.opencontainers.image.title="fp4qd" \
      org.opencontainers.image.description="fp4q: NVFP4 training numerics served over gRPC" \
      io.fp4q.variant="${FP4Q_VARIANT}"
RUN groupadd --system --gid 65532 fp4q && \
    useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin fp4q
COPY --from=build /out/bin/ /opt/fp4q/bin/
# Fail the image build, not the first pod, when a shared library is missing (libcuda.so.1 is
# the driver's, mounted at run time), and check that fp4qd starts far enough to list its flags.
RUN missing="$(ldd /opt/fp4q/bin/* | grep 'not found' | grep -v 'libcuda\.so\.1' || true)"; \
    if [[ -n "$missing" ]]; then echo "missing libraries: $missing" >&2; exit 1; fi; \
    { /opt/fp4q/bin/fp4qd --help 2>&1 || true; } | grep -q -- '--listen'
ENV PATH=/opt/fp4q/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
USER 65532:65532
# gRPC (--listen) and Prometheus /metrics (--metrics_listen): the defaults in docs/DESIGN.md.
EXPOSE 50051 9450
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
  CMD ["/opt/fp4q/bin/fp4q", "--server", "127.0.0.1:50051", "health"]
ENTRYPOINT ["/opt/fp4q/bin/fp4qd"]
# Beyond loopback, so that other containers and the kubelet's probes can connect.
CMD ["--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9450"]
