"""Message classes and the gRPC method table, built at import time from a descriptor.

The descriptor (a serialized FileDescriptorSet of proto/fp4q/v1/fp4q.proto) is produced at build
time by `fp4q._protogen`; see that module for why this is a descriptor and not *_pb2.py code.
Looked up, in order:
  1. $FP4Q_PROTO_DESCRIPTOR (a path),
  2. fp4q/_proto/fp4q_v1.binpb inside the package (pip install, or a generated checkout),
  3. in a source checkout where protoc is available: generated on the spot into 2, and
     generated again there when the checkout's proto files are newer than it (a stale one is
     used, with a warning, where protoc is missing).
The classes live in a private DescriptorPool, so they never clash with other copies of the same
protos loaded by the application.

`pb` exposes every message class by its short name (pb.QuantizeRequest) and every enum as an
object whose attributes are its values (pb.DType.DTYPE_F32 == 1). `METHODS` maps an RPC name
("Quantize") to (path, request class, reply class). The standard health service's messages
(grpc.health.v1, compiled from proto/grpc/health/v1/health.proto) come from the same file, so
no grpc_health package is needed.
"""

import os
import threading
import warnings

from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory

from fp4q import _protogen

_PACKAGE = "fp4q.v1"
_SERVICE = "fp4q.v1.Fp4q"
HEALTH_CHECK_PATH = "/grpc.health.v1.Health/Check"


def _message_class(desc, pool):
    get = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22
    if get is not None:
        return get(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)  # protobuf 3.21 (4.21.x)


def descriptor_path():
    """Where the descriptor is read from (it may not exist yet)."""
    return os.environ.get("FP4Q_PROTO_DESCRIPTOR") or _protogen.default_output()


def _load_descriptor_bytes():
    path = descriptor_path()
    explicit = os.environ.get("FP4Q_PROTO_DESCRIPTOR")
    if not os.path.isfile(path):
        if explicit:
            raise ImportError("fp4q: $FP4Q_PROTO_DESCRIPTOR=%s does not exist" % path)
        try:
            _protogen.generate(path)
        except (RuntimeError, OSError) as e:
            raise ImportError(
                "fp4q: the service descriptor %s is missing and could not be generated (%s). "
                "Generate it where protoc exists: python3 client/python/fp4q/_protogen.py, "
                "or install the package with pip." % (path, e)) from e
    elif not explicit and _protogen.stale(path):
        try:
            _protogen.generate(path)
        except (RuntimeError, OSError) as e:
            warnings.warn(
                "fp4q: the service descriptor %s is older than the checkout's proto files and "
                "could not be generated again (%s); messages lack any field added since. Run "
                "python3 client/python/fp4q/_protogen.py where protoc exists" % (path, e),
                RuntimeWarning, stacklevel=2)
    with open(path, "rb") as f:
        return f.read()


class _Enum:
    """An enum's values as attributes, plus name <-> number lookups."""

    def __init__(self, desc):
        self.name = desc.name
        self.by_name = {v.name: v.number for v in desc.values}
        self.by_number = {v.number: v.name for v in desc.values}
        for k, v in self.by_name.items():
            setattr(self, k, v)

    def Name(self, number):  # noqa: N802 (mirrors protobuf's EnumTypeWrapper)
        return self.by_number.get(number, str(number))


class _Namespace:
    pass


class _Loaded:
    def __init__(self):
        fds = descriptor_pb2.FileDescriptorSet.FromString(_load_descriptor_bytes())
        self.pool = descriptor_pool.DescriptorPool()
        names = []
        for f in fds.file:
            self.pool.Add(f)
            if f.package == _PACKAGE:
                names.append(f.name)
        packages = {f.package for f in fds.file}
        for needed in (_PACKAGE, "grpc.health.v1"):
            if needed not in packages:
                raise ImportError("fp4q: descriptor %s holds no %s file (regenerate it: python3 "
                                  "client/python/fp4q/_protogen.py)" % (descriptor_path(), needed))
        self.pb = _Namespace()
        for name in names:
            fdesc = self.pool.FindFileByName(name)
            for mname, mdesc in fdesc.message_types_by_name.items():
                setattr(self.pb, mname, _message_class(mdesc, self.pool))
            for ename, edesc in fdesc.enum_types_by_name.items():
                setattr(self.pb, ename, _Enum(edesc))
        svc = self.pool.FindServiceByName(_SERVICE)
        self.methods = {}
        for m in svc.methods:
            self.methods[m.name] = ("/%s/%s" % (_SERVICE, m.name),
                                    getattr(self.pb, m.input_type.name),
                                    getattr(self.pb, m.output_type.name))
        self.health_request = _message_class(
            self.pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest"), self.pool)
        resp_desc = self.pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")
        self.health_response = _message_class(resp_desc, self.pool)
        self.health_status = _Enum(resp_desc.enum_types_by_name["ServingStatus"])


_lock = threading.Lock()
_loaded = None


def loaded():
    """The loaded descriptor (built once per process)."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _Loaded()
        return _loaded


pb = loaded().pb
METHODS = loaded().methods


class Serialized:
    """A request whose wire bytes are already built (fp4q._requests' step plans): `body` is
    what the message's SerializeToString() gives, `reply_bound` the bytes its reply may carry
    beyond its fixed fields (fp4q._fast_frames.reply_bound). The call path sends it as it
    would the message (ByteSize, SerializeToString)."""

    __slots__ = ("body", "reply_bound")

    def __init__(self, body, reply_bound):
        self.body = body
        self.reply_bound = reply_bound

    def ByteSize(self):  # noqa: N802 (the protobuf message's interface)
        return len(self.body)

    def SerializeToString(self):  # noqa: N802
        return self.body
