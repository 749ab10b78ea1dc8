"""Build-time generation of the fp4q service descriptor.

The package does not ship protoc output. Instead, at build/install time protoc compiles
proto/fp4q/v1/fp4q.proto and proto/grpc/health/v1/health.proto into a serialized FileDescriptorSet (`fp4q_v1.binpb`); at import time
`fp4q._proto` builds the message classes and the gRPC method table from it. A serialized
descriptor is plain protobuf wire data, so one file works with every protobuf runtime from 3.21
(Debian 12) to the current releases, unlike generated *_pb2.py modules, which are tied to the
protoc version that wrote them.

Usage (from a checkout):
    python3 client/python/fp4q/_protogen.py [--out FILE] [--proto-root DIR]
writes client/python/fp4q/_proto/fp4q_v1.binpb by default (a git-ignored path).

protoc is found as $FP4Q_PROTOC, `protoc` on PATH, or grpc_tools.protoc when installed.
This module has no dependency on the rest of the package (setup.py imports it by path).
"""

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

DESCRIPTOR_NAME = "fp4q_v1.binpb"
PROTO_FILES = (os.path.join("fp4q", "v1", "fp4q.proto"),
               os.path.join("grpc", "health", "v1", "health.proto"))


def default_proto_root():
    """The repository's proto/ folder, located relative to this file (client/python/fp4q)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "proto"))


def default_output():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "_proto", DESCRIPTOR_NAME)


def stale(output=None, proto_root=None):
    """True when `output` exists and a proto file of a source checkout (`proto_root`, by
    default the repository's proto/ beside the package) is newer than it: a descriptor generated
    before the protos changed (a pull, an edit) would load messages without their new fields.
    False where there are no proto sources (an installed package)."""
    proto_root = proto_root or default_proto_root()
    output = output or default_output()
    try:
        made = os.path.getmtime(output)
        return any(os.path.getmtime(os.path.join(proto_root, rel)) > made
                   for rel in PROTO_FILES)
    except OSError:
        return False


def _protoc_command():
    explicit = os.environ.get("FP4Q_PROTOC")
    if explicit:
        return [explicit]
    found = shutil.which("protoc")
    if found:
        return [found]
    if importlib.util.find_spec("grpc_tools") is None:
        return None
    return [sys.executable, "-m", "grpc_tools.protoc"]


def generate(output=None, proto_root=None):
    """Compiles the PROTO_FILES into one FileDescriptorSet at `output`; returns the path.

    Raises RuntimeError naming what is missing when no protoc or no proto file is found, and
    when protoc fails (its stderr included). The file is replaced atomically.
    """
    proto_root = proto_root or default_proto_root()
    output = output or default_output()
    for rel in PROTO_FILES:
        if not os.path.isfile(os.path.join(proto_root, rel)):
            raise RuntimeError("fp4q: proto source not found at %s" %
                               os.path.join(proto_root, rel))
    protoc = _protoc_command()
    if protoc is None:
        raise RuntimeError(
            "fp4q: no protoc found (set FP4Q_PROTOC, install protobuf-compiler, "
            "or install grpcio-tools)")
    out_dir = os.path.dirname(os.path.abspath(output))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fp4q_v1.", suffix=".tmp", dir=out_dir)
    os.close(fd)
    try:
        cmd = protoc + ["--proto_path=" + proto_root, "--include_imports",
                        "--descriptor_set_out=" + tmp] + list(PROTO_FILES)
        done = subprocess.run(cmd, cwd=proto_root, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError("fp4q: %s failed (exit %d): %s" %
                               (" ".join(cmd), done.returncode, done.stderr.strip()))
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the descriptor is package data
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return output


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="descriptor file to write")
    parser.add_argument("--proto-root", default=None, help="folder holding fp4q/v1/fp4q.proto")
    args = parser.parse_args(argv)
    try:
        path = generate(args.out, args.proto_root)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
