"""Build hook: compiles proto/ into the package's service descriptor (see fp4q/_protogen.py).

Everything else is declared in pyproject.toml. From a checkout:
    pip install ./client/python                 (fetches setuptools for the isolated build)
    pip install --no-build-isolation --no-index ./client/python
                                                (offline, e.g. Debian 12 inside a venv made with
                                                 --system-site-packages: setuptools, grpcio,
                                                 protobuf, numpy and torch come from Debian)
build_py writes fp4q/_proto/fp4q_v1.binpb before the package's files are collected; the file is
package data of `fp4q` (pyproject.toml), so no step needs the folder to exist beforehand.
protoc comes from $FP4Q_PROTOC, PATH or grpcio-tools. Without any, an already generated
fp4q/_proto/fp4q_v1.binpb is packaged as it is; without that either, the build fails naming
what is missing.
"""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _protogen():
    spec = importlib.util.spec_from_file_location(
        "fp4q_protogen", os.path.join(HERE, "fp4q", "_protogen.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithDescriptor(build_py):
    def run(self):
        gen = _protogen()
        target = os.path.join(HERE, "fp4q", "_proto", gen.DESCRIPTOR_NAME)
        proto_root = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))
        try:
            gen.generate(target, proto_root)
        except RuntimeError as e:
            if not os.path.isfile(target):
                raise
            self.announce("fp4q: using the existing %s (%s)" % (target, e), level=2)
        super().run()


setup(cmdclass={"build_py": BuildPyWithDescriptor})
