"""The fast socket's frames: how one call becomes one SOCK_SEQPACKET message, and back.

Contract
- Limits (the one place the Python client defines them): a frame, request or reply, is at most
  MAX_FRAME_BYTES; a call goes there only when its reply's inline tensor bytes leave
  REPLY_MARGIN_BYTES of the frame for the rest (header, shapes, amax). proto/fp4q/v1/fp4q.proto
  now names the server's values (enum FastSocketLimit, ServerInfo's Limits): 65536 and 4096.
  The margin here stays 1024, what this client has always used, until a server reports its own.
- reply_inline_bytes(rpc, request): the inline tensor bytes of the reply, from the request alone
  (REPLY_INLINE_BYTES, one bound per RPC); None when the client cannot tell (an output of a
  server-held weight's shape) or knows no bound for the RPC: such a call goes by gRPC.
- A framing turns a call into frame bytes and a reply frame into a Reply. It provides
  serves(rpc), carried(rpc) (what a reply to rpc carries: a Reply's `carried`), request(rpc,
  body) and hello(body) (Frames; body: the serialized request or FastHello), and parse(data,
  rpc) (a Reply; raises on bytes that do not decode). LEGACY is the one fp4qd speaks today.
- Frame holds a request but for call_id and timeout_micros (fields 1 and 2 in every format),
  which data() puts in front for each send, byte for byte what protobuf would serialize.

LEGACY is the format of fp4qd at commit 8e87038: FastRequest {call_id = 1, timeout_micros = 2,
oneof op {hello = 10, quantize = 11, ... server_info = 18}} and FastReply {call_id = 1, code = 2,
message = 3, the same oneof}. proto/ now describes the generic format instead (FastRequest
{call_id, timeout_micros, hello = 3, method = 4, request = 5}, FastReply {..., reply = 4,
hello = 5}), which no server speaks yet; so the legacy messages are declared here
(LegacyFastRequest, LegacyFastReply: package fp4q.v1.fast_legacy, built into the client's
private pool over the fp4q.v1 messages they carry) and do not depend on proto/'s FastRequest.
The generic framing, once a server speaks it, is a second class with the same five methods:
serves() every method but OpenSession; request() a Frame of method (4) and request (5); hello()
one of field 3; parse() pb.FastReply.FromString, carried "hello" when hello is set, else
"reply" with `reply` decoded as METHODS[rpc]'s reply class (carried(rpc) is then "reply").
FastSocket takes the framing (its `framing` argument; fp4q._transport passes none: LEGACY).

Not thread-affine: everything here is immutable or per call.
"""

from google.protobuf import descriptor_pb2

from fp4q import results
from fp4q._messages import add_messages, pb

MAX_FRAME_BYTES = 65536
# Room in a reply frame for everything but the inline tensor bytes (header, shapes, amax).
REPLY_MARGIN_BYTES = 1024
# The server refuses timeout_micros over one day; a longer client timeout sends one day.
MAX_TIMEOUT_MICROS = 86400 * 10**6

_WIRE_VARINT, _WIRE_BYTES = 0, 2


def varint(n):
    """Protobuf's base-128 varint of a non-negative integer."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(message, field, wire_type):
    """The key of `message`'s field `field`: its number << 3 | the wire type, as a varint."""
    return varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | wire_type)


# ------------------------------------------------------------------ the legacy messages

# (oneof field, number, request type, reply type): the op oneof of both legacy frames.
_LEGACY_OPS = (
    ("hello", 10, "FastHello", "FastHelloReply"),
    ("quantize", 11, "QuantizeRequest", "QuantizeReply"),
    ("dequantize", 12, "DequantizeRequest", "DequantizeReply"),
    ("qdq", 13, "QdqRequest", "QdqReply"),
    ("matmul", 14, "MatmulRequest", "MatmulReply"),
    ("update_weight", 15, "UpdateWeightRequest", "UpdateWeightReply"),
    ("keep_alive", 16, "KeepAliveRequest", "KeepAliveReply"),
    ("list_tensors", 17, "ListTensorsRequest", "ListTensorsReply"),
    ("server_info", 18, "ServerInfoRequest", "ServerInfoReply"),
)


def _legacy_messages():
    fdp = descriptor_pb2.FileDescriptorProto(
        name="fp4q/v1/fast_legacy.proto", package="fp4q.v1.fast_legacy", syntax="proto3",
        dependency=["fp4q/v1/fp4q.proto"])
    F = descriptor_pb2.FieldDescriptorProto
    for name, scalars, column in (
            ("LegacyFastRequest", (("call_id", 1, F.TYPE_UINT64),
                                   ("timeout_micros", 2, F.TYPE_UINT64)), 2),
            ("LegacyFastReply", (("call_id", 1, F.TYPE_UINT64), ("code", 2, F.TYPE_INT32),
                                 ("message", 3, F.TYPE_STRING)), 3)):
        m = fdp.message_type.add(name=name)
        for field, number, kind in scalars:
            m.field.add(name=field, number=number, type=kind, label=F.LABEL_OPTIONAL)
        m.oneof_decl.add(name="op")
        for op in _LEGACY_OPS:
            m.field.add(name=op[0], number=op[1], type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                        type_name=".fp4q.v1." + op[column], oneof_index=0)
    classes = add_messages(fdp)
    return classes["LegacyFastRequest"], classes["LegacyFastReply"]


LegacyFastRequest, LegacyFastReply = _legacy_messages()

# ------------------------------------------------------------------ frames

_CALL_ID_KEY = _key(LegacyFastRequest, "call_id", _WIRE_VARINT)  # the same in every format
_TIMEOUT_KEY = _key(LegacyFastRequest, "timeout_micros", _WIRE_VARINT)


class Frame:
    """A FastRequest but for call_id and timeout_micros, which each send fills in.

    Holds the serialized operation (key, length, the request's own serialization): data() puts
    the two varint fields before it, byte for byte what FastRequest.SerializeToString() writes
    (fields in number order, zero values left out), without copying the request into a
    FastRequest and serializing it again."""

    __slots__ = ("op_bytes",)

    def __init__(self, field_key, body):
        self.op_bytes = field_key + varint(len(body)) + body

    def __len__(self):
        """The size of the frame without call_id and timeout_micros (FastRequest.ByteSize())."""
        return len(self.op_bytes)

    def data(self, call_id, timeout_micros):
        head = _CALL_ID_KEY + varint(call_id) if call_id else b""
        if timeout_micros:
            head += _TIMEOUT_KEY + varint(timeout_micros)
        return head + self.op_bytes


class Reply:
    """A decoded FastReply: code (a google.rpc.Code number), message, and `payload`, the reply
    message it carries (named by `carried`: see the framing's carried(); None when none)."""

    __slots__ = ("call_id", "code", "message", "carried", "payload")

    def __init__(self, call_id, code, message, carried, payload):
        self.call_id = call_id
        self.code = code
        self.message = message
        self.carried = carried
        self.payload = payload


# ------------------------------------------------------------------ the legacy format

# RPC name -> the FastRequest/FastReply oneof field carrying it: what this client sends there.
OPS = {
    "Quantize": "quantize",
    "Dequantize": "dequantize",
    "Qdq": "qdq",
    "Matmul": "matmul",
    "UpdateWeight": "update_weight",
    "KeepAlive": "keep_alive",
}
_OP_KEYS = {rpc: _key(LegacyFastRequest, field, _WIRE_BYTES) for rpc, field in OPS.items()}
_HELLO_KEY = _key(LegacyFastRequest, "hello", _WIRE_BYTES)


class LegacyFraming:
    """fp4qd's fast-socket format today (see the module docstring): one oneof field per RPC."""

    name = "legacy"

    def serves(self, rpc):
        return rpc in OPS

    def carried(self, rpc):
        return OPS[rpc]

    def request(self, rpc, body):
        return Frame(_OP_KEYS[rpc], body)

    def hello(self, body):
        return Frame(_HELLO_KEY, body)

    def parse(self, data, rpc):
        reply = LegacyFastReply.FromString(data)
        op = reply.WhichOneof("op")
        return Reply(reply.call_id, reply.code, reply.message, op,
                     getattr(reply, op) if op else None)


LEGACY = LegacyFraming()

# ------------------------------------------------------------------ what fits in a frame


def _numel(shape):
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    return n


def _inline(target):
    return not target.HasField("region")


def _esize(dtype, default):
    return {pb.DType.DTYPE_F32: 4, pb.DType.DTYPE_BF16: 2}.get(dtype or default, 4)


def _quantize_reply(req):
    shape = list(req.input.shape)
    if len(shape) != 2:
        return 0
    o = req.options
    total = 0
    for which, r, c in results.quantize_sides(o.outputs, int(shape[0]), int(shape[1])):
        if _inline(getattr(req, which + "_codes")):
            total += (max(r, 0) * max(c, 0) + 1) // 2
        if _inline(getattr(req, which + "_scales")):
            total += results.scale_bytes(o.format, o.block, o.scale_layout, r, c) or 0
    return total


def _qdq_reply(req):
    if not _inline(req.out):
        return 0
    return _numel(req.input.shape) * _esize(req.out_dtype, req.input.dtype)


def _dequantize_reply(req):
    if not _inline(req.out):
        return 0
    if req.input.WhichOneof("operand") != "tensor":
        return None
    return _numel(req.input.tensor.shape) * _esize(req.out_dtype, pb.DType.DTYPE_F32)


def _matmul_reply(req):
    if not _inline(req.out):
        return 0
    if "weight_name" in (req.a.WhichOneof("operand"), req.b.WhichOneof("operand")):
        return None
    a, b = list(req.a.tensor.shape), list(req.b.tensor.shape)
    if len(a) != 2 or len(b) != 2:
        return 0
    return max(int(a[0]), 0) * max(int(b[0]), 0) * _esize(req.out_dtype, pb.DType.DTYPE_F32)


def _update_weight_reply(req):
    if not req.return_dequantized or not _inline(req.dequantized_out):
        return 0
    return _numel(req.update.shape) * 4  # the weight's dtype: at most f32


# RPC -> request -> the inline tensor bytes of its reply (None: unknown). Shapes the server will
# refuse count 0: their reply is a short error.
REPLY_INLINE_BYTES = {
    "Quantize": _quantize_reply,
    "Qdq": _qdq_reply,
    "Dequantize": _dequantize_reply,
    "Matmul": _matmul_reply,
    "UpdateWeight": _update_weight_reply,
    "KeepAlive": lambda req: 0,
}


def reply_inline_bytes(rpc, req):
    """The inline tensor bytes the reply to `req` will carry, or None when the client cannot
    tell (an output of a server-held weight's shape, or an RPC without a bound here)."""
    bound = REPLY_INLINE_BYTES.get(rpc)
    return None if bound is None else bound(req)
