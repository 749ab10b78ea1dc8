"""The fast socket's frames: how one call becomes one SOCK_SEQPACKET message, and back.

Contract
- The format is proto/fp4q/v1/fp4q.proto's ("the fast socket"): FastRequest {call_id = 1,
  timeout_micros = 2, hello = 3, method = 4, request = 5} and FastReply {call_id = 1, code = 2,
  message = 3, reply = 4, hello = 5}. GENERIC (GenericFraming) is the framing that speaks it,
  the one fp4q._fast_socket.FastSocket uses unless given another with the same five methods:
  serves(rpc), carried(rpc), request(rpc, body), hello(body) and parse(data, rpc).
- Limits: Limits(max_frame, reply_margin, reply_framing). DEFAULT_LIMITS holds the proto's enum
  FastSocketLimit (FAST_SOCKET_MAX_FRAME_BYTES, FAST_SOCKET_REPLY_MARGIN_BYTES,
  FAST_SOCKET_REPLY_FRAMING_BYTES: 65536, 4096 and 32), read from the descriptor;
  Limits.from_server_info takes a server's own (ServerInfo.limits.fast_socket_*) when it reports
  them. A call goes on the fast socket only when its frame fits in max_frame and its reply's
  bound (below) plus reply_margin fits in max_frame - reply_framing: exactly the
  check fp4qd makes (server/call_layer.cc), so a state-changing call is never refused for its
  reply size there.
- reply_bound(rpc, request): the bytes a reply may carry beyond its fixed fields, from the request
  alone. For the state-changing methods it is fp4qd's own bound (server/op_table.cc
  inline_reply_bound) or larger; for the stateless ones the inline tensor bytes of the reply.
  UNKNOWN (a read-only method whose reply size depends on server state: a weight's shape, the
  number of tensors) means "try the fast socket": fp4qd checks such replies against the frame
  before (GetWeight, Dequantize/Matmul of a weight) or after (ListTensors) doing read-only work,
  and answers RESOURCE_EXHAUSTED naming the reply limit (is_reply_limit), after which the caller
  sends the call by gRPC. Every method but OpenSession has an entry (REPLY_BOUNDS).
- Frame holds a request but for call_id and timeout_micros (fields 1 and 2), which data() puts in
  front for each send, byte for byte what FastRequest.SerializeToString() writes.

Not thread-affine: everything here is immutable or per call.
"""

import collections

import grpc

from fp4q import results
from fp4q._messages import METHODS, pb

# The proto's limits (enum FastSocketLimit): the defaults until a server reports its own.
MAX_FRAME_BYTES = pb.FastSocketLimit.FAST_SOCKET_MAX_FRAME_BYTES
REPLY_MARGIN_BYTES = pb.FastSocketLimit.FAST_SOCKET_REPLY_MARGIN_BYTES
# What fp4qd keeps of a frame for the FastReply's own fields around the method's reply (call_id,
# code, the reply field's tag and length): its reply limit is the frame less this.
REPLY_FRAMING_BYTES = pb.FastSocketLimit.FAST_SOCKET_REPLY_FRAMING_BYTES
# The server refuses timeout_micros over one day; a longer client timeout sends one day.
MAX_TIMEOUT_MICROS = 86400 * 10**6
# The methods a fast-socket connection cannot carry (it is bound to one session by its hello).
NOT_SERVED = frozenset({"OpenSession"})

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


_CALL_ID_KEY = _key(pb.FastRequest, "call_id", _WIRE_VARINT)
_TIMEOUT_KEY = _key(pb.FastRequest, "timeout_micros", _WIRE_VARINT)
_HELLO_KEY = _key(pb.FastRequest, "hello", _WIRE_BYTES)
_METHOD_KEY = _key(pb.FastRequest, "method", _WIRE_BYTES)
_REQUEST_KEY = _key(pb.FastRequest, "request", _WIRE_BYTES)
_HEADS_UP_KEY = _key(pb.FastRequest, "heads_up_micros", _WIRE_VARINT)


class Limits(collections.namedtuple("Limits", ("max_frame", "reply_margin", "reply_framing",
                                               "heads_up_micros"), defaults=(0,))):
    """The fast socket's frame limit, the room kept in a reply for its fixed fields, what the
    FastReply envelope takes of a frame, and the longest heads-up the server takes (0: none)."""

    __slots__ = ()

    @classmethod
    def from_server_info(cls, info, current):
        """The limits a ServerInfoReply reports (limits.fast_socket_max_frame_bytes,
        fast_socket_reply_margin_bytes and fast_socket_reply_framing_bytes), each kept at
        `current`'s value where it is 0 (a server that reports none, or has no fast socket); and
        fast_socket_max_heads_up_micros as it is (0: the server takes no heads-ups)."""
        limits = getattr(info, "limits", None)
        if limits is None:
            return current
        frame = int(limits.fast_socket_max_frame_bytes) or current.max_frame
        margin = int(limits.fast_socket_reply_margin_bytes) or current.reply_margin
        framing = int(limits.fast_socket_reply_framing_bytes) or current.reply_framing
        heads_up = int(getattr(limits, "fast_socket_max_heads_up_micros", 0))
        return cls(frame, margin, framing, heads_up)

    def reply_fits(self, bound):
        """Whether a reply carrying `bound` bytes beyond its fixed fields fits in a frame."""
        return bound + self.reply_margin <= self.max_frame - self.reply_framing


DEFAULT_LIMITS = Limits(MAX_FRAME_BYTES, REPLY_MARGIN_BYTES, REPLY_FRAMING_BYTES)


class Frame:
    """A FastRequest but for call_id and timeout_micros, which each send fills in.

    Holds the serialized fields 3 to 5 (a hello, or the method and its serialized request):
    data() puts the two varint fields before them, byte for byte what
    FastRequest.SerializeToString() writes (fields in number order, zero values and empty
    strings left out), without copying the request into a FastRequest and serializing it
    again."""

    __slots__ = ("op_bytes",)

    def __init__(self, op_bytes):
        self.op_bytes = op_bytes

    def __len__(self):
        """The size of the frame without call_id and timeout_micros (FastRequest.ByteSize())."""
        return len(self.op_bytes)

    def data(self, call_id, timeout_micros):
        head = _CALL_ID_KEY + varint(call_id) if call_id else b""
        if timeout_micros:
            head += _TIMEOUT_KEY + varint(timeout_micros)
        return head + self.op_bytes


class Reply:
    """A decoded FastReply: code (a google.rpc.Code number), message, and `payload`, the message
    it carries (named by `carried`: "hello" for a FastHelloReply, "reply" for the method's reply
    message; None when it carries neither, as an error does)."""

    __slots__ = ("call_id", "code", "message", "carried", "payload")

    def __init__(self, call_id, code, message, carried, payload):
        self.call_id = call_id
        self.code = code
        self.message = message
        self.carried = carried
        self.payload = payload


class GenericFraming:
    """proto/'s frames: a method name and its serialized request, one format for every method."""

    name = "generic"

    def serves(self, rpc):
        return rpc in METHODS and rpc not in NOT_SERVED

    def carried(self, rpc):
        return "reply"

    def request(self, rpc, body):
        method = rpc.encode()
        op = _METHOD_KEY + varint(len(method)) + method
        if body:
            op += _REQUEST_KEY + varint(len(body)) + body
        return Frame(op)

    def hello(self, body):
        return Frame(_HELLO_KEY + varint(len(body)) + body)

    @staticmethod
    def heads_up(micros):
        """The bytes of a heads-up frame: a call follows within `micros` (FastRequest field 6;
        no call_id, no reply)."""
        return _HEADS_UP_KEY + varint(micros)

    def parse(self, data, rpc):
        """The Reply of a frame; the method's reply decoded as METHODS[rpc]'s reply class when
        the call succeeded. Raises on bytes that do not decode."""
        reply = pb.FastReply.FromString(data)
        if reply.HasField("hello"):
            return Reply(reply.call_id, reply.code, reply.message, "hello", reply.hello)
        if reply.code != 0:
            return Reply(reply.call_id, reply.code, reply.message, None, None)
        return Reply(reply.call_id, 0, reply.message, "reply",
                     METHODS[rpc][2].FromString(reply.reply))


GENERIC = GenericFraming()

# ------------------------------------------------------------------ what a reply may carry

UNKNOWN = None  # a read-only reply whose size the request does not tell (see the docstring)


def _numel(shape):
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    return n


def _inline(target):
    return not target.HasField("region")


def _esize(dtype, default):
    return {pb.DType.DTYPE_F32: 4, pb.DType.DTYPE_BF16: 2}.get(dtype or default, 4)


def _server_quantized_bound(shape):
    """fp4qd's bound for an inline quantized output of `shape` (codes and scales with the
    swizzle's padding): op_table.cc QuantizedInline."""
    if len(shape) != 2 or shape[0] <= 0 or shape[1] <= 0:
        return 0
    rows, cols = int(shape[0]), int(shape[1])
    return rows * cols // 2 + 1 + (rows + 128) * (cols // 16 + 4)


def _quantize(req):
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
    if o.residual_key and (_inline(req.rowwise_codes) or _inline(req.rowwise_scales)):
        total = max(total, _server_quantized_bound(shape))  # state-changing: the server's bound
    return total


def _qdq(req):
    if not _inline(req.out):
        return 0
    return _numel(req.input.shape) * _esize(req.out_dtype, req.input.dtype)


def _dequantize(req):
    if not _inline(req.out):
        return 0
    if req.input.WhichOneof("operand") != "tensor":
        return UNKNOWN  # a weight by name: its shape is the server's
    return _numel(req.input.tensor.shape) * _esize(req.out_dtype, pb.DType.DTYPE_F32)


def _operand_rows(op):
    """A Matmul operand's rows from the request, None when only the server knows them (a
    weight), 0 when the request is malformed (refused before any output)."""
    kind = op.WhichOneof("operand")
    if kind == "weight_name":
        return None
    if kind == "dense":
        shape = list(op.dense.tensor.shape)
        if len(shape) != 2:
            return 0
        columnwise = op.dense.options.outputs == pb.Outputs.OUTPUTS_COLUMNWISE
        return max(int(shape[1] if columnwise else shape[0]), 0)
    shape = list(op.tensor.shape)
    return max(int(shape[0]), 0) if len(shape) == 2 else 0


def _matmul(req):
    if not _inline(req.out):
        return 0
    m, n = _operand_rows(req.a), _operand_rows(req.b)
    if m is None or n is None:
        return UNKNOWN
    return m * n * _esize(req.out_dtype, pb.DType.DTYPE_F32)


def _update_weight(req):
    if not req.return_dequantized or not _inline(req.dequantized_out):
        return 0
    return _numel(req.update.shape) * 4  # the weight's dtype: at most f32 (fp4qd's bound too)


def _step(req):
    """fp4qd's bound (op_table.cc): per item its name and fixed fields, plus its inline DQ(W)."""
    total = 0
    for item in req.items:
        total += len(item.name.encode()) + 48
        if item.return_dequantized and _inline(item.dequantized_out):
            total += _numel(item.update.shape) * 4 + 16
    return total


def _get_weight(req):
    if req.quantized or req.residual or req.optimizer_state:
        return UNKNOWN
    if req.dequantized and _inline(req.out):
        return UNKNOWN
    return 0  # the WeightInfo alone


def _fixed(req):
    return 0


# RPC -> request -> reply_bound (bytes, or UNKNOWN). Shapes the server will refuse count 0:
# their reply is a short error.
REPLY_BOUNDS = {
    "Quantize": _quantize,
    "Dequantize": _dequantize,
    "Qdq": _qdq,
    "Matmul": _matmul,
    "UpdateWeight": _update_weight,
    "CreateWeight": _fixed,
    "GetWeight": _get_weight,
    "DeleteWeight": _fixed,
    "ResetResidual": _fixed,
    "ListTensors": lambda req: UNKNOWN,
    "Checkpoint": _fixed,
    "ResetOptimizer": _fixed,
    "Step": _step,
    "JoinGroup": _fixed,
    "LeaveGroup": _fixed,
    "DeleteNamespace": _fixed,
    "KeepAlive": _fixed,
    "CloseSession": _fixed,
    "RegisterCudaRegion": _fixed,
    "UnregisterCudaRegion": _fixed,
    "ServerInfo": _fixed,
}
# The methods whose UNKNOWN bound may be tried on the fast socket: read-only, refused by fp4qd
# with a reply-limit RESOURCE_EXHAUSTED when the reply does not fit (then sent by gRPC).
READ_ONLY = frozenset({"Dequantize", "Matmul", "GetWeight", "ListTensors"})


def reply_bound(rpc, req):
    """The bytes the reply to `req` may carry beyond its fixed fields, or UNKNOWN."""
    return REPLY_BOUNDS[rpc](req)


def is_reply_limit(error):
    """Whether an Fp4qError is fp4qd refusing a reply for the fast socket's frame limit."""
    return (error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and
            "reply limit" in (error.message or ""))
