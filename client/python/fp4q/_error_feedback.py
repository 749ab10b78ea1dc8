"""fp4q.functional.ErrorFeedback: QDQ with an error-feedback residual held by the server."""

import re
import threading

import grpc

from fp4q._functional_common import _client, _key, _rounding, _rows
from fp4q._messages import pb
from fp4q.errors import Fp4qError
from fp4q.tensors import ClientArgumentError


_NAME_CHARS = re.compile(r"^[A-Za-z0-9._\-/:]+$")


class ErrorFeedback:
    """QDQ with an error-feedback residual held by the server, one per name.

    qdq(name, W, step): returns DQ(Q(W + r)) in W's dtype and updates r on the server
    (NUMERICS 5). Within a sequence, steps must increase per name: a repeated step is refused
    with ALREADY_EXISTS, an older one with FAILED_PRECONDITION.

    Sequences. Like fp4-train's ErrorFeedback, whose residuals live in the process, each
    ErrorFeedback object starts its own sequence: the first qdq of a name deletes a residual
    the server still holds under that name (from an earlier run of the script), so the name
    starts again at any step with a zero residual. resume=True keeps the server's residual and
    its last step instead (a restarted job continuing where it stopped).
    reset(name) ends the sequence of `name` now (reset() ends every name this object used):
    the server's residual is deleted and the next qdq starts afresh. To zero a residual but
    keep its step, use Client.reset_residual.

    Names. `scope` is the job's prefix: the server key of `name` is "<scope>/<name>", so two
    jobs (or two ranks) with different scopes never share a residual. Without a scope the
    name is the server key, shared by every client of that server (within the session's
    namespace, where the server has namespaces). Keys follow the server's name rules (1..256
    bytes of A-Z a-z 0-9 . _ - / :). A key that names a stored weight is refused here (it is
    never deleted).
    """

    def __init__(self, stochastic=False, seed=0, *, scope=None, resume=False, client=None):
        if scope is not None and (not isinstance(scope, str) or not _NAME_CHARS.match(scope)):
            raise ClientArgumentError("scope: %r is not a name (A-Z a-z 0-9 . _ - / :)" % (scope,))
        self.stochastic = bool(stochastic)
        self.seed = int(seed)
        self.scope = scope
        self.resume = bool(resume)
        self._client = client
        self._started = set()  # names whose sequence this object has started
        self._lock = threading.Lock()

    def key(self, name):
        """The server's residual key of `name` ("<scope>/<name>" with a scope)."""
        if not isinstance(name, str) or not name:
            raise ClientArgumentError("name: expected a non-empty str, got %r" % (name,))
        return "%s/%s" % (self.scope, name) if self.scope else name

    def qdq(self, name, W, step):
        c = _client(self._client)
        key = self.key(name)
        with self._lock:
            if name not in self._started:
                if not self.resume:
                    self._delete(c, [key])
                self._started.add(name)
        x2 = _rows(W, "W")
        y = c.qdq(x2, rounding=_rounding(self.stochastic), seed=_key(self.seed), step=int(step),
                  residual_key=key)
        return y.reshape(W.shape)

    def reset(self, name=None):
        """Deletes the server's residual of `name` (None: of every name this object used), so
        the next qdq of it starts a fresh sequence. Returns how many residuals were deleted."""
        c = _client(self._client)
        with self._lock:
            names = [name] if name is not None else sorted(self._started)
            keys = [self.key(n) for n in names]
            deleted = self._delete(c, keys)
            self._started.update(names)
            return deleted

    @staticmethod
    def _delete(c, keys):
        kinds = {t.name: t.kind for t in c.list_tensors()}
        weight = pb.TensorKind.TENSOR_KIND_WEIGHT
        for key in keys:
            if kinds.get(key) == weight:
                raise ClientArgumentError("name: %r is a stored weight on the server, not an "
                                          "error-feedback residual" % key)
        deleted = 0
        for key in keys:
            if key not in kinds:
                continue
            try:
                c.delete_weight(key)
                deleted += 1
            except Fp4qError as e:
                if e.code != grpc.StatusCode.NOT_FOUND:  # gone meanwhile: fresh all the same
                    raise
        return deleted
