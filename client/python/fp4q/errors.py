"""The exception every failed fp4q call raises."""

import grpc


class Fp4qError(Exception):
    """A failed RPC, or a request that could not be sent.

    Attributes:
      code: a grpc.StatusCode (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, ...), exactly the
        code the server answered with; client-side refusals use the code the server would give.
      message: the server's message (it names the offending field and value).
      rpc: the RPC name ("Quantize"), or None when the error did not come from an RPC.
    str(error) is "CODE_NAME: message" (with "[Rpc] " in front when rpc is known).
    """

    def __init__(self, code, message, rpc=None):
        self.code = code
        self.message = message
        self.rpc = rpc
        super().__init__(self._text())

    @property
    def code_name(self):
        """The code's canonical name, e.g. "INVALID_ARGUMENT"."""
        return self.code.name if isinstance(self.code, grpc.StatusCode) else str(self.code)

    def _text(self):
        prefix = "[%s] " % self.rpc if self.rpc else ""
        return "%s%s: %s" % (prefix, self.code_name, self.message)


class ServerRestartedError(Fp4qError):
    """fp4qd restarted under a stateful user (fp4q.optim): its server_epoch changed, so its
    stored state is what its last checkpoint held (or nothing), not what the user last saw.
    Code FAILED_PRECONDITION; `old_epoch`, `new_epoch`."""

    def __init__(self, old_epoch, new_epoch, rpc=None):
        self.old_epoch = old_epoch
        self.new_epoch = new_epoch
        super().__init__(grpc.StatusCode.FAILED_PRECONDITION, (
            "fp4qd restarted (server_epoch %s, now %s): its weights, residuals and optimizer "
            "state are now those of its last checkpoint (or none), not this optimizer's; nothing "
            "was re-created or applied. Build a new optimizer and load_state_dict() a state_dict "
            "saved before the restart" % (old_epoch, new_epoch)), rpc)


def from_rpc_error(error, rpc):
    """Turns a grpc.RpcError raised by a call into an Fp4qError (code and details kept)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return Fp4qError(code, details or "", rpc)


def invalid_argument(message):
    return Fp4qError(grpc.StatusCode.INVALID_ARGUMENT, message)
