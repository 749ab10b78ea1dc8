"""fp4q.optim's overlap=True: a step sent without its host waiting for the reply.

A step with overlap carries a done signal (fp4q.v1.DoneSignal): a 4-byte word in a small CUDA
tensor of this module, registered as an IPC region, and the step's sequence value. fp4qd
writes the value there once the step's device work is over (the weights, residuals and every
DQ(W) in param.data written), whether it applied or the device-side check refused it. After
sending, the worker's current CUDA stream is made to wait on the device for that value
(cuStreamWaitValue32), and step() returns: the worker's host goes on with the next forward pass,
whose kernels run once the new weights are in place. The reply is read later:

- a watcher thread (one per optimizer, asleep in the socket's recv) takes each reply as it
  arrives. On any error (a refusal before the device work, which leaves the signal unwritten, a
  lost connection, a dead server) it writes the value itself from a side stream, so the worker's
  stream is never left waiting, even while the host blocks on the GPU (loss.item());
- the next step() (or synchronize(), state_dict(), load_state_dict()) takes the outcome: the
  step count advances, or the error is raised there, before anything else is sent.

Where the server also takes ready signals ("step_ready_signal"), the host does not wait for
the gradients either: a second word of the tensor, 16 bytes on, gets the same value from the
worker's current stream once the backward pass queued before step() is done (a driver write,
cuStreamWriteValue32, queued behind it), and the step is sent at once with that ready signal
(fp4q.v1.ReadySignal).
fp4qd reads no gradient before the word holds the value, so step() costs the worker's host only
building and sending the request, and the GPU goes from the backward pass to the step's kernels
to the next forward pass with no host round trip between them. Other devices' streams, if a
step's tensors are on any, are still waited for on the host.

The step is sent only when every tensor of it travels in place by IPC (no output copied after
the reply); otherwise it completes in step() as without overlap.
"""

import queue
import threading
import warnings
import weakref

import grpc
import torch

from fp4q import _cuda_driver, _streams
from fp4q.errors import Fp4qError


class _Job:
    __slots__ = ("step", "value", "pending", "done", "result", "error")

    def __init__(self, step, value, pending, done):
        self.step = step
        self.value = value
        self.pending = pending
        self.done = done  # cleared; the watcher sets it once the job's outcome is in
        self.result = None
        self.error = None


def _as_int32(value):
    return value - (1 << 32) if value >= 1 << 31 else value


def _watch(jobs, signal, side):
    """The watcher thread: each job's reply, and the signal written on any error."""
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            job.result = job.pending.wait()
        except BaseException as e:  # noqa: BLE001 - every failure must release the stream
            job.error = e
            try:
                with torch.cuda.device(signal.device), torch.cuda.stream(side):
                    signal[DONE_WORD].fill_(_as_int32(job.value))
                side.synchronize()
            except BaseException as e2:  # noqa: BLE001
                job.error.__context__ = e2
        job.done.set()
        job = None  # the step's tensors are not held while this thread waits for the next


# The words of the signal tensor (int32 elements; region slices are 16-byte aligned).
DONE_WORD, READY_WORD = 0, 4


def _new_signal(device):
    """The signal tensor (the done word, then 16 bytes on the ready word) and the side stream
    the watcher writes the done word from."""
    return torch.zeros(8, dtype=torch.int32, device=device), torch.cuda.Stream(device)


class OverlappedSteps:
    """The in-flight step of one optimizer whose stored parameters are on `device`; `ready`:
    the server takes ready signals."""

    def __init__(self, client, device, ready=False):
        self._client = client
        self._device = torch.device(device)
        self._ready = bool(ready)
        self._signal, self._side = _new_signal(self._device)
        self._ptr = self._signal.data_ptr()
        self._slot = None  # Regions.register_held's last answer for the signal tensor
        self._value = 0
        self._inflight = None
        self._done = threading.Event()
        self._jobs = None
        self.sent = 0       # steps sent with overlap
        self.completed = 0  # steps that had to complete in step()
        self.ready_sent = 0  # steps sent with a ready signal (no host wait for the gradients)

    def send(self, step, key, make_items, groups, replica, one_pass=False):
        """Sends step `step` (fp4q._requests.step_begin). Returns its StepResult when it
        completed now; else None (finish() takes its outcome)."""
        assert self._inflight is None, "finish() the step in flight first"
        slot, self._slot = self._client._ipc.register_held(self._signal, self._slot)
        value = (self._value + 1) & 0xFFFFFFFF
        ready = None
        if self._ready:
            ready = ((slot[0], slot[1] + 4 * READY_WORD), value, self._order(value))
        pending, result = self._client._requests.step_begin(step, key, make_items, groups,
                                                            replica, (slot, value), ready,
                                                            one_pass=one_pass)
        self._value = value
        if pending is None:
            self.completed += 1
            return result
        try:
            _streams.on_current_stream(self._device, _cuda_driver.stream_wait_value32, self._ptr,
                                       value)
        except _cuda_driver.DriverError:
            self.completed += 1
            return pending.wait()  # the stream cannot wait on the device: the host waits
        if ready is not None:
            # The gradients were made on this stream (the ready word is written behind them)
            # and its later work now waits for the step: torch's allocator may hand their
            # memory to the next backward pass at once. Held until the reply, they were not
            # freed by zero_grad(set_to_none=True), the next gradients landed elsewhere, and
            # no kept step plan matched them (h200-loop call 13).
            pending.let_go()
        # One Event for all of this object's jobs: the one in flight is finished (its Event
        # set by the watcher and waited for) before the next is sent.
        self._done.clear()
        job = _Job(step, value, pending, self._done)
        self._inflight = job
        self._watcher().put(job)
        self.sent += 1
        return None

    def finish(self):
        """None when no step is in flight; else waits for it and returns (step, StepResult),
        or raises its error."""
        job = self._inflight
        if job is None:
            return None
        job.done.wait()
        self._inflight = None
        if job.error is not None:
            raise job.error
        return job.step, job.result

    def _order(self, value):
        """The host's wait for the gradients, replaced (see _ready_order)."""
        return _ready_order(self._signal, self._device, value, self._count_ready)

    def _count_ready(self):
        self.ready_sent += 1

    @property
    def in_flight(self):
        """The step number in flight, or None."""
        return None if self._inflight is None else self._inflight.step

    def _watcher(self):
        if self._jobs is None:
            jobs = queue.SimpleQueue()
            t = threading.Thread(target=_watch, args=(jobs, self._signal, self._side),
                                 name="fp4q-overlap", daemon=True)
            t.start()
            self._jobs = jobs
            weakref.finalize(self, _end_watcher, t, jobs, self._signal, self._side)
        return self._jobs


def _end_watcher(thread, jobs, signal, side):
    """Ends an OverlappedSteps' watcher thread with the object, and waits for it (at most 1 s:
    a step still in flight is waited for no longer), so that the thread drops its references to
    the signal tensor and the side stream first and this function's are the last, released on
    the calling thread. Released on the watcher thread as it ended, the tensor's last reference
    made the process abort at its exit about once in ten runs ("terminate called without an
    active exception")."""
    jobs.put(None)
    if thread is not threading.current_thread():
        thread.join(timeout=1.0)


def _write_ready(signal, device, value):
    """Queues on `device`'s current stream, behind the work queued on it (the backward pass),
    the write of `value` to the ready word (signal[READY_WORD]): one driver call
    (cuStreamWriteValue32, its memory fence orders the stream's earlier writes before the
    word's), or where the driver refuses it a one-element fill_. The fill_ costs the host a
    device switch, a view and a kernel launch: about 100 us a step on an H100's host (h200-loop
    call 13), against a few for the driver call."""
    try:
        _streams.on_current_stream(device, _cuda_driver.stream_write_value32,
                                   signal.data_ptr() + 4 * READY_WORD, value)
    except _cuda_driver.DriverError:
        with torch.cuda.device(device):
            signal[READY_WORD].fill_(_as_int32(value))


def _ready_order(signal, device, value, sent):
    """order(transfer) of a step sent with a ready signal: the host's wait for the gradients,
    replaced. The ready word (signal[READY_WORD]) gets `value` from `device`'s current stream,
    behind the work queued on it (the backward pass); other devices' streams are still waited
    for on the host. sent() is called once the write is queued."""
    def order(transfer):
        transfer.before_send(skip=device)
        _write_ready(signal, device, value)
        sent()
    return order


class ReadySteps:
    """overlap=False's steps with a ready signal (fp4q.v1.ReadySignal): step() still waits for
    the reply, but not for the backward pass before sending. When the current stream of the
    stored parameters' device still has work queued (query()), the step carries a ready word
    that the stream writes behind that work; fp4qd validates the request and queues the step's
    kernels behind a device-side wait on the word while the backward pass runs, so the client's
    and the server's host time before the kernels is off the GPU's path. When the stream is
    already idle the step is sent without one (the server's device-side wait and its watching
    would only add to it), and without the host's wait for that stream either: ready_and_order
    gives idle_order, which waits for the other devices' streams only.

    A ready word the stream did not write within the server's timeout (a backward pass queued
    further ahead than --step_ready_timeout_ms) refuses the step with nothing changed; step()
    then waits for the stream on the host and sends the step again without the signal
    (fallbacks counts those). A server that refuses the signal itself (INVALID_ARGUMENT on
    ready_signal, e.g. the word on another device than the weights), or a failed registration
    of the word's tensor, turns it off for this optimizer (off says why, with a RuntimeWarning),
    and the step is sent without it."""

    def __init__(self, client, device):
        self._client = client
        self._device = torch.device(device)
        self._signal = None  # made at the first step that needs it
        self._slot = None  # Regions.register_held's last answer for it
        self._value = 0
        self.sent = 0        # steps sent with a ready signal
        self.idle = 0        # steps sent without: the stream had nothing queued
        self.fallbacks = 0   # steps sent again after the ready word timed out
        self.off = None      # why the server's refusal turned the signal off

    def ready(self):
        """The `ready` argument of fp4q._requests.step_keyed for the next step: None when the
        stream is idle or the signal is off, else ((region_id, offset), value, order)."""
        return self.ready_and_order()[0]

    def ready_and_order(self):
        """(ready, order): step_keyed's `ready` and `order` for the next step. While the stream
        has work queued, the signal and None; when it is idle, None and idle_order (nothing was
        queued on it since, so the host does not wait for it); with the signal off, None and
        None (the host waits)."""
        if self.off is not None:
            return None, None
        if _streams.idle(self._device):
            self.idle += 1
            return None, self.idle_order
        if self._signal is None:
            self._signal = _new_signal(self._device)[0]
        try:
            slot, self._slot = self._client._ipc.register_held(self._signal, self._slot)
        except Fp4qError as e:  # e.g. the session's region limit: the host waits instead
            self._turn_off(e.message)
            return None, None
        value = self._value = (self._value + 1) & 0xFFFFFFFF
        return ((slot[0], slot[1] + 4 * READY_WORD), value,
                _ready_order(self._signal, self._device, value, self._count)), None

    def _count(self):
        self.sent += 1

    def idle_order(self, transfer):
        """order(transfer) of a step sent just after ready_and_order() found the stream idle:
        nothing was queued on it since, so only the other devices' streams are waited for."""
        transfer.before_send(skip=self._device)

    def retry_without(self, error):
        """True when `error` (of a step sent with ready()) leaves the step unapplied because of
        its ready signal, so that it is to be sent again without one (whose host wait for the
        stream then orders it): after a timeout, or after a refusal of the signal, which turns
        the signal off."""
        if error.code == grpc.StatusCode.DEADLINE_EXCEEDED and "ready_signal: the worker's "\
                "stream did not write" in error.message:
            self.fallbacks += 1  # the resend without the signal waits for the stream
            if self.fallbacks == 1:
                warnings.warn(
                    "fp4q.optim: a step's ready word was not written within fp4qd's "
                    "--step_ready_timeout_ms (the backward pass was queued further ahead); the "
                    "step was sent again after the host's wait (%s). ready_signal=False sends "
                    "every step that way" % error.message, RuntimeWarning, stacklevel=4)
            return True
        if error.code == grpc.StatusCode.INVALID_ARGUMENT and "ready_signal" in error.message:
            self._turn_off(error.message)
            return True
        return False

    def _turn_off(self, why):
        self.off = why
        warnings.warn("fp4q.optim: the step's ready signal failed (%s); steps are sent after "
                      "the host's wait from now on" % why, RuntimeWarning, stacklevel=5)
