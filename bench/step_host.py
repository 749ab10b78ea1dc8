#!/usr/bin/env python3
"""The host's share of the trainer's step, measured on a machine without a GPU.

    python3 bench/step_host.py --build build --json out.json

What runs: `fp4q.optim.SGD.step()` through fp4qd, every layer real but the GPU.
  - fp4qd loads the tests' fake CUDA module (--cuda_module, built with the tests:
    tests/server/fake_modules/libfp4q_fake_shm_cuda.so). It is a "GPU" whose memory is host
    memory, whose IPC handles name POSIX shared memory objects, and whose kernels are the CPU
    backend's.
  - The client's CUDA driver calls (fp4q._cuda_driver, fp4q.ipc) are replaced. Its "CUDA
    tensors" (the gradients and the parameters) are slices of two shared memory objects, which
    fp4qd maps as the regions of the step.
  - So a step goes as it goes on a GPU: the step plan (kept on the server), one Step frame over
    the fast socket, fp4qd pinning the regions, checking the items once, the CPU kernels, the
    brief reply, DQ(W) written into the parameters' memory (poisoned first, checked after).
  - The model: --params matrices of --rows x 16 bf16 (default 50 of 1 x 16: GPT-2's count of
    matrices, with tensors small enough that the CPU kernels take tens of microseconds).
    Gradients random, never zero.

Reported, medians over --steps steps after --warmup:
  - step_us: the wall time of step();
  - server_us, kernel_us and queue_us: fp4qd's own time for the Step, its kernels' and the
    Step's wait in the device's work queue before it started (ReplyHeader);
  - client_and_transport_us: step_us - server_us; client_before_send_us and
    client_after_reply_us: the client's own parts of it, from step()'s start to the fast
    socket exchange and from the exchange's end to step()'s return;
  - the same run's floor: an empty ServerInfo round trip over the same fast socket.
With --overlap, fp4q.optim.SGD(overlap=True): each step() sends the step with its ready signal
(the fake driver writes the word into shared memory at once) and done signal (fp4qd writes it
there) and returns; the reply is taken by synchronize() outside the timed call, so step_us is
the host's time in step() alone, the figure that bounds a host-bound overlapped training loop.
With --gap-ms the process sleeps that long after the round trip and before each step, as a
training loop's forward and backward passes leave fp4qd idle between steps: its threads stop
busy-polling after a while and the step then pays their wake-ups.
These are this machine's CPU times. On the GPU's host the same code runs, slower or faster as
that CPU is, and with the CUDA backend's launches in place of the CPU kernels. The fake CUDA
tensors answer data_ptr(), device and is_cuda from Python, which costs more than torch's own
answers: the client's step plan key check, which reads them for every parameter, takes about
twice as long here as over real tensors of this CPU
(bench/results/h200-step/one-pass/attr_cost.py times it over real ones).
"""

import argparse
import contextlib
import json
import math
import mmap
import os
import platform
import random
import statistics
import struct
import sys
import time
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "client", "python"))

import torch  # noqa: E402

import fp4q  # noqa: E402
import fp4q.optim  # noqa: E402
from fp4q import _cuda_driver, _overlap, _streams, ipc  # noqa: E402
from fp4qd_process import Fp4qd, commit  # noqa: E402

FAKE_UUID = "GPU-fake-shm-0"  # fake_shm_cuda_module.cc's one device
FAKE_MODULE = os.path.join("tests", "server", "fake_modules", "libfp4q_fake_shm_cuda.so")


class SharedBuffer:
    """A POSIX shared memory object of `nbytes`, mapped here; fp4qd maps it by its name."""

    def __init__(self, tag, nbytes):
        self.name = "/fp4q-step-host-%d-%s" % (os.getpid(), tag)
        fd = os.open("/dev/shm" + self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            self.map = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        self.nbytes = nbytes
        self.handle = (b"FP4QSHM:" + self.name.encode()).ljust(64, b"\0")

    def fill_bf16(self, generator, scale):
        """Random bf16 values, N(0, scale^2), none zero."""
        n = self.nbytes // 2
        x = torch.randn(n, generator=generator) * scale
        x = torch.where(x == 0, torch.full_like(x, scale), x).to(torch.bfloat16)
        self.map[:] = x.view(torch.int16).numpy().tobytes()

    def close(self):
        self.map.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink("/dev/shm" + self.name)


class _OnCuda0:
    """What the client reads of a CUDA tensor, for the fakes below: cuda:0, at `fake_ptr`."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    is_cuda = True

    @property
    def device(self):
        return torch.device("cuda", 0)

    def data_ptr(self):
        return self.fake_ptr


class FakeCudaTensor(_OnCuda0, torch.Tensor):
    """A bf16 tensor that says it lives at `ptr` on cuda:0 (its bytes here are not read)."""

    @staticmethod
    def __new__(cls, ptr, shape):
        t = torch.Tensor._make_subclass(cls, torch.empty(shape, dtype=torch.bfloat16))
        t.fake_ptr = ptr
        return t


class FakeCudaParameter(_OnCuda0, torch.nn.Parameter):
    """A parameter at `ptr` on cuda:0 whose `.data` is a FakeCudaTensor there; its own values
    (what detach() gives, sent inline when the weight is created) are `initial`."""

    def __new__(cls, ptr, initial):
        t = torch.nn.Parameter.__new__(cls, initial)
        t.fake_ptr = ptr
        t.fake_data = FakeCudaTensor(ptr, initial.shape)
        return t

    @property
    def data(self):
        return self.fake_data


class FakeCudaSignal(_OnCuda0, torch.Tensor):
    """fp4q._overlap's signal tensor (8 int32 words) at `ptr` on cuda:0: its words live in the
    shared memory object `buffer` (at offset ptr - base), which the fake driver's stream writes
    and fp4qd reads and writes."""

    @staticmethod
    def __new__(cls, ptr):
        t = torch.Tensor._make_subclass(cls, torch.zeros(8, dtype=torch.int32))
        t.fake_ptr = ptr
        return t


class IdleStream:
    """torch.cuda's current stream, as the client sees it here: every step finds it idle."""

    cuda_stream = 0x5000  # a handle, not the default stream's 0

    def query(self):
        return True

    def synchronize(self):
        pass


def fake_driver(buffers):
    """Patches standing in for the CUDA driver: `buffers` {base address: SharedBuffer}. The
    "GPU" is fp4qd's host, which runs a step's work before its reply: a stream's write of a word
    (overlap=True's ready word) is made at once, and a stream's wait for one (its done word) is
    over at once."""
    def find(ptr):
        for base, b in buffers.items():
            if base <= ptr < base + b.nbytes:
                return base, b
        raise _cuda_driver.DriverError("0x%x: no fake allocation holds it" % ptr)

    def identity(ptr):
        base, b = find(ptr)
        return base, b.nbytes, base >> 40  # (base, size, buffer id)

    def write_value32(stream, ptr, value):
        base, b = find(ptr)
        b.map[ptr - base:ptr - base + 4] = struct.pack("<I", value & 0xFFFFFFFF)

    return [mock.patch.object(_cuda_driver, "allocation_identity", identity),
            mock.patch.object(_cuda_driver, "buffer_id", lambda ptr: identity(ptr)[2]),
            mock.patch.object(_cuda_driver, "address_range",
                              lambda ptr: (find(ptr)[0], find(ptr)[1].nbytes)),
            mock.patch.object(_cuda_driver, "ipc_handle", lambda base: buffers[base].handle),
            mock.patch.object(_cuda_driver, "bind_context", lambda index: None),
            mock.patch.object(ipc, "_current_device", lambda i: contextlib.nullcontext()),
            mock.patch.object(ipc, "device_uuid", return_value=FAKE_UUID.lower()),
            mock.patch.object(torch.cuda, "current_stream", lambda device=None: IdleStream()),
            mock.patch.object(torch.cuda, "synchronize", lambda device=None: None),
            mock.patch.object(_cuda_driver, "stream_write_value32", write_value32),
            mock.patch.object(_cuda_driver, "stream_wait_value32", lambda s, ptr, v: find(ptr)),
            mock.patch.object(_cuda_driver, "stream_query", lambda stream: True),
            mock.patch.object(_cuda_driver, "stream_synchronize", lambda stream: None),
            mock.patch.object(_streams, "_raw_stream", None)]


def p50(xs):
    return statistics.median(xs)


@contextlib.contextmanager
def timed_exchanges(out):
    """Appends (start, end) perf_counter times of every fast socket exchange made inside."""
    from fp4q import _fast_socket
    exchange = _fast_socket.FastSocket._exchange

    def timed(self, *a, **k):
        t = time.perf_counter()
        try:
            return exchange(self, *a, **k)
        finally:
            out.append((t, time.perf_counter()))
    _fast_socket.FastSocket._exchange = timed
    try:
        yield
    finally:
        _fast_socket.FastSocket._exchange = exchange


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--build", default="build",
                    help="the build folder with bin/fp4qd and the tests' fake CUDA module "
                         "(default: build)")
    ap.add_argument("--params", type=int, default=50, help="stored matrices (default 50)")
    ap.add_argument("--rows", type=int, default=1, help="rows of each, x 16 columns (default 1)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    ap.add_argument("--steps", type=int, default=2000, help="timed steps (default 2000)")
    ap.add_argument("--warmup", type=int, default=50, help="untimed steps first (default 50)")
    ap.add_argument("--fp4qd-arg", action="append", default=[],
                    help="one more fp4qd flag (repeatable)")
    ap.add_argument("--spin-us", type=int, default=None,
                    help="fp4q.Client fast_socket_spin_us (default: the client's own)")
    ap.add_argument("--lr-schedule", action="store_true",
                    help="change the learning rate before every step, as a scheduler does")
    ap.add_argument("--fresh-grads", action="store_true",
                    help="new gradient tensors (at the same addresses) before every step, as "
                         "zero_grad(set_to_none=True) and a backward pass give")
    ap.add_argument("--shuffle-grads", action="store_true",
                    help="with --fresh-grads: the new gradients at shuffled places of the same "
                         "buffer (the allocator giving each gradient another block)")
    ap.add_argument("--alternate-grads", action="store_true",
                    help="with --fresh-grads: the new gradients at one of two fixed placements "
                         "in turn (torch's allocator alternating between two sets of blocks "
                         "after zero_grad(set_to_none=True))")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="idle milliseconds before each step, as a training loop's forward and "
                         "backward passes leave between steps (default 0: back to back)")
    ap.add_argument("--overlap", action="store_true",
                    help="fp4q.optim.SGD(overlap=True): step() sends the step with its ready and "
                         "done signals and returns; the previous step's reply is taken "
                         "(synchronize()) before each timed step(), so step_us is the host's "
                         "time in step() alone")
    ap.add_argument("--json", help="also write the report there")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="then a cProfile of --steps more steps: its N costliest functions "
                    "(by own time; STEP_HOST_SORT=ncalls or cumulative sorts otherwise)")
    args = ap.parse_args()
    for name, v, least in (("--params", args.params, 1), ("--rows", args.rows, 1),
                           ("--steps", args.steps, 1), ("--warmup", args.warmup, 0),
                           ("--profile", args.profile, 0), ("--gap-ms", args.gap_ms, 0)):
        if v < least:
            ap.error("%s: %g is not >= %d" % (name, v, least))
    if (args.shuffle_grads or args.alternate_grads) and not args.fresh_grads:
        ap.error("--shuffle-grads and --alternate-grads place fresh gradients: add --fresh-grads")
    if args.shuffle_grads and args.alternate_grads:
        ap.error("--shuffle-grads and --alternate-grads exclude each other")
    fp4qd = os.path.join(args.build, "bin", "fp4qd")
    module = os.path.join(args.build, FAKE_MODULE)
    for path in (fp4qd, module):
        if not os.path.exists(path):
            ap.error("%s not found (build the tests: cmake --build %s)" % (path, args.build))

    per = args.rows * 16 * 2
    nbytes = (per * args.params + 4095) // 4096 * 4096
    grads, params = SharedBuffer("g", nbytes), SharedBuffer("p", nbytes)
    signals = SharedBuffer("s", 4096)  # overlap=True's signal tensor
    server = None
    try:
        gen = torch.Generator().manual_seed(1)
        grads.fill_bf16(gen, 0.01)
        gbase, pbase, sbase = 1 << 40, 2 << 40, 3 << 40  # fake device addresses
        patches = fake_driver({gbase: grads, pbase: params, sbase: signals})
        patches.append(mock.patch.object(_overlap, "_new_signal", lambda device: (
            FakeCudaSignal(sbase), IdleStream())))
        for p in patches:
            p.start()
        ns = argparse.Namespace(fp4qd=fp4qd, fp4qd_arg=["--cuda_module=" + module] +
                                args.fp4qd_arg, server=None, fast_socket=None,
                                state_budget_bytes=1 << 30, spin_us=args.spin_us)
        server = Fp4qd(ns, cuda=True)
        client = server.client(True, "step-host", "require")
        model = []
        for i in range(args.params):
            initial = (torch.randn(args.rows, 16, generator=gen) * 0.02).to(torch.bfloat16)
            p = FakeCudaParameter(pbase + i * per, initial)
            p.grad = FakeCudaTensor(gbase + i * per, (args.rows, 16))
            model.append(p)
        opt = fp4q.optim.SGD(model, lr=1e-3, momentum=args.momentum, client=client,
                             overlap=args.overlap)
        headers = []  # every Step reply's header (an overlapped one is read on another thread)
        check_epoch = opt._check_reply_epoch

        def record(header, rpc):
            if rpc == "Step" and header is not None:
                headers.append(header)
            return check_epoch(header, rpc)
        opt._check_reply_epoch = record
        params.map[:per * args.params] = b"\xff" * (per * args.params)  # poison: NaN bf16
        def before_step(k):
            if args.lr_schedule:
                opt.param_groups[0]["lr"] = 1e-3 * (1.0 + 0.5 * math.cos(k / 100.0))
            if args.fresh_grads:
                order = list(range(len(model)))
                if args.shuffle_grads:
                    random.Random(k).shuffle(order)
                elif args.alternate_grads and k % 2:
                    order.reverse()
                for i, p in zip(order, model):
                    p.grad = FakeCudaTensor(gbase + i * per, (args.rows, 16))

        for k in range(args.warmup):
            before_step(k)
            opt.step()
            client.server_info()
        wall, server_us, kernel_us, queue_us, empty, before, after = [], [], [], [], [], [], []
        progress = max(1, args.steps // 4)
        exchanges = []  # (start, end) of each fast socket exchange
        for k in range(args.steps):
            t = time.perf_counter()
            client.server_info()
            empty.append((time.perf_counter() - t) * 1e6)
            if args.gap_ms > 0:
                time.sleep(args.gap_ms / 1e3)
            before_step(args.warmup + k)
            opt.synchronize()  # with overlap, the last step's reply: not this step's time
            with timed_exchanges(exchanges):
                t = time.perf_counter()
                opt.step()
                end = time.perf_counter()
            wall.append((end - t) * 1e6)
            if exchanges:  # without overlap: the step's exchange
                before.append((exchanges[0][0] - t) * 1e6)
                after.append((end - exchanges[-1][1]) * 1e6)
            exchanges.clear()
            opt.synchronize()
            h = headers[-1]
            server_us.append(h.server_micros)
            kernel_us.append(h.kernel_micros)
            queue_us.append(h.queue_micros)
            if (k + 1) % progress == 0:
                print("step_host: %d/%d steps" % (k + 1, args.steps), file=sys.stderr)
        opt.synchronize()
        poisoned = params.map[:per * args.params].count(b"\xff\xff")
        if poisoned:
            raise RuntimeError("%d DQ(W) values were not written by the steps" % poisoned)
        stats = dict(client.stats)
        if stats.get("step_plans_on_server", 0) < args.steps and not args.shuffle_grads:
            raise RuntimeError("the steps did not go as server step plans: %s" % stats)
        if not args.shuffle_grads and stats.get("step_plans_named", 0) < args.steps:
            raise RuntimeError("the steps did not take the named plan's path: %s" % stats)
        o = opt._overlapped
        overlapped = None if o is None else {"sent": o.sent, "completed_in_step": o.completed,
                                             "sent_with_ready_signal": o.ready_sent}
        total = args.warmup + args.steps
        if args.overlap and overlapped != {"sent": total, "completed_in_step": 0,
                                           "sent_with_ready_signal": total}:
            raise RuntimeError("not every one of the %d steps was sent overlapped with a ready "
                               "signal: %s" % (total, overlapped))
        report = {
            "tool": "bench/step_host.py",
            "commit": commit(),
            "host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__, "python": platform.python_version(),
            "command": " ".join(sys.argv),
            "fp4qd_command": server.command,
            "params": args.params, "shape": [args.rows, 16], "momentum": args.momentum,
            "steps": args.steps,
            "step_us": {"p50": p50(wall), "min": min(wall)},
            "gap_ms": args.gap_ms,
            "server_us": p50(server_us), "kernel_us": p50(kernel_us),
            "queue_us": p50(queue_us),
            "overlap": args.overlap, "overlapped": overlapped,
            # Without overlap: step() waits for the reply, whose time is fp4qd's and the
            # exchange's; with overlap step() is the host's time alone.
            "client_and_transport_us": None if args.overlap else p50(
                [w - s for w, s in zip(wall, server_us)]),
            "client_before_send_us": p50(before) if before else None,
            "client_after_reply_us": p50(after) if after else None,
            "empty_round_trip_us": {"p50": p50(empty), "min": min(empty)},
            "stats": {k: stats[k] for k in sorted(stats)
                      if k.startswith(("step_plans", "fast_socket_polled", "fast_socket_heads_ups",
                                       "fast_socket_replied"))},
            "client_spin_us": args.spin_us,
            "lr_schedule": args.lr_schedule, "fresh_grads": args.fresh_grads,
            "alternate_grads": args.alternate_grads,
        }
        head = "%d matrices of %dx16, SGD momentum %g%s" % (
            args.params, args.rows, args.momentum,
            ", %g ms idle before each" % args.gap_ms if args.gap_ms else "")
        if args.overlap:
            print("%s, overlap=True: step() p50 %.1f us (min %.1f), the host's time (the step "
                  "sent with its signals, its reply taken later); fp4qd %.0f us, its kernels "
                  "%.0f us; an empty round trip %.1f us; step plans on the server %d"
                  % (head, report["step_us"]["p50"], report["step_us"]["min"],
                     report["server_us"], report["kernel_us"],
                     report["empty_round_trip_us"]["p50"], stats.get("step_plans_on_server", 0)))
        else:
            print("%s: step() p50 %.1f us (min %.1f); fp4qd %.0f us, its kernels %.0f us, its "
                  "device queue %.0f us; client and transport %.1f us (before the send %.1f, "
                  "after the reply %.1f); an empty round trip %.1f us; replies busy-polled for "
                  "%d, slept for after a spin %d; heads-ups sent %d"
                  % (head, report["step_us"]["p50"], report["step_us"]["min"],
                     report["server_us"], report["kernel_us"], report["queue_us"],
                     report["client_and_transport_us"], report["client_before_send_us"],
                     report["client_after_reply_us"], report["empty_round_trip_us"]["p50"],
                     stats.get("fast_socket_polled", 0),
                     stats.get("fast_socket_polled_then_slept", 0),
                     stats.get("fast_socket_heads_ups", 0)))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        if args.profile > 0:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
            for k in range(args.steps):
                before_step(k)
                opt.step()
                opt.synchronize()  # with overlap, the step's reply (its own entry here)
            prof.disable()
            pstats.Stats(prof).sort_stats(os.environ.get("STEP_HOST_SORT", "tottime")).print_stats(
                args.profile)
        client.close()
    finally:
        if server is not None:
            server.stop()
        grads.close()
        params.close()
        signals.close()


if __name__ == "__main__":
    main()
