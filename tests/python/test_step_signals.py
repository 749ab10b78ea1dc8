"""Step signals (fp4q._overlap): overlap=True's done signal, whose wait the worker's stream
queues and whose reply a watcher thread takes; the ready signal the worker's stream writes
behind the backward pass (a driver write), for overlapped and synchronous steps; their
fallbacks. The driver, the server and the CUDA tensors are fakes (step_testing.py): no GPU, no
server."""

import contextlib
import gc
import threading
import unittest
import weakref
from unittest import mock

import grpc
import torch

import fp4q
from fp4q import _cuda_driver, _overlap, _requests, _transport
from fp4q._messages import pb
from step_testing import GRADS, SIGNAL, FakeCudaTensor, StepFixture


class StepSignalTest(StepFixture, unittest.TestCase):

    def begun(self):
        """Requests whose begin() sends at once (self.sent) and hands the reply (or the server's
        error) over only when waited for (self.replies_read counts them), after self.reply_gate
        (a threading.Event) is set when there is one; self.fail_wait, when set, is raised
        instead."""
        self.replies_read = 0
        self.fail_wait = None
        self.reply_gate = None

        def begin(rpc, request):
            try:
                reply, error = self.server(rpc, request), None
            except fp4q.Fp4qError as e:  # the server's refusal, read with the reply
                reply, error = None, e

            def wait():
                if self.reply_gate is not None:
                    self.reply_gate.wait(timeout=10)
                self.replies_read += 1
                if self.fail_wait is not None:
                    raise self.fail_wait
                if error is not None:
                    raise error
                return reply
            return _transport.Pending(wait)
        return _requests.Requests(self.server, lambda: False, self.regions, begin)

    def test_a_begun_step_of_a_plan_the_server_holds_sends_its_head_and_signals(self):
        plans, refuse, bodies = self.plan_keeping_server()
        requests = self.begun()
        groups = [fp4q.SgdHyperparameters(lr=0.1)]
        key = ("opt", tuple(x for g, p in zip(self.grads, self.params)
                            for x in (g.data_ptr(), p.data_ptr())))
        ordered = []
        ready = (("region-9", 32), 5, ordered.append)

        def begin(step, value, **kw):
            pending, result = requests.step_begin(step, key, self.items, groups, None,
                                                  (("region-9", 16), value), ready, **kw)
            self.assertIsNone(result)
            return pending.wait()
        begin(1, 1)  # the items, kept as plan 7
        self.stats.clear()
        self.assertEqual(begin(2, 2, one_pass=True).applied_items, 3)
        sent = self.sent[-1]
        self.assertEqual((sent.step, sent.plan_id, len(sent.items), sent.one_pass,
                          sent.done_signal.value, sent.ready_signal.region.offset,
                          sent.ready_signal.value), (2, 7, 0, True, 2, 32, 5))
        self.assertEqual(self.stats["step_plans_named"], 1)
        self.assertEqual(len(ordered), 2)  # the ready word's order, for each step
        # Byte for byte what the call path's build sends for it.
        with mock.patch.object(requests, "_step_named_begin", return_value=None):
            begin(2, 2, one_pass=True)
        self.assertEqual((bodies[-1], self.stats["step_plans_named"]), (bodies[-2], 1))
        # A server that dropped the plan: refused when the reply is read, nothing applied, and
        # the plan ids forgotten, so that the step sent again carries its items.
        refuse.append(1)
        with self.assertRaisesRegex(fp4q.Fp4qError, "plan_id: this session holds no step plan 7"):
            begin(3, 3)
        self.assertEqual(begin(3, 3).applied_items, 3)
        self.assertEqual((self.sent[-1].keep_plan, len(self.sent[-1].items)), (True, 3))
        begin(4, 4)
        self.assertEqual((self.sent[-1].plan_id, len(self.sent[-1].items)), (8, 0))

    def test_a_step_with_a_done_signal_is_sent_at_once_and_its_reply_read_when_waited_for(self):
        requests = self.begun()
        groups = [fp4q.SgdHyperparameters(lr=0.1)]
        pending, result = requests.step_begin(4, None, self.items, groups, None,
                                              (("region-9", 16), 7))
        self.assertIsNone(result)
        self.assertEqual(self.replies_read, 0)
        sent = self.sent[-1]
        self.assertEqual((sent.step, len(sent.items), sent.brief_reply), (4, 3, True))
        self.assertEqual((sent.done_signal.region.region_id, sent.done_signal.region.offset,
                          sent.done_signal.value), ("region-9", 16, 7))
        result = pending.wait()
        self.assertEqual((self.replies_read, result.applied_items), (1, 3))
        # An output that is copied after the reply (a CPU parameter): the call completes now.
        cpu = [torch.zeros(32, 16, dtype=torch.bfloat16) for _ in range(3)]
        pending, result = requests.step_begin(5, None, lambda: self.items(params=cpu), groups,
                                              None, (("region-9", 16), 8))
        self.assertIsNone(pending)
        self.assertEqual([r.last_step for r in result.items], [5, 5, 5])
        self.assertFalse(self.sent[-1].brief_reply)
        self.assertEqual(self.sent[-1].done_signal.value, 8)  # the server still writes it

    def test_overlapped_steps_wait_on_the_stream_and_release_it_on_any_error(self):
        requests = self.begun()
        signal = FakeCudaTensor(SIGNAL, shape=(8,), dtype=torch.int32)
        side = mock.Mock()
        waits = []
        patches = [
            mock.patch.object(_overlap, "_new_signal", lambda device: (signal, side)),
            mock.patch.object(_cuda_driver, "stream_wait_value32",
                              lambda stream, ptr, value: waits.append((ptr, value))),
            mock.patch.object(torch.cuda, "device", lambda d: contextlib.nullcontext()),
            mock.patch.object(torch.cuda, "stream", lambda s: contextlib.nullcontext())]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)
        client = mock.Mock(_ipc=self.regions, _requests=requests)
        o = _overlap.OverlappedSteps(client, torch.device("cuda", 0))
        groups = [fp4q.SgdHyperparameters(lr=0.1)]
        self.assertIsNone(o.send(1, None, self.items, groups, None))
        self.assertEqual((o.in_flight, waits), (1, [(SIGNAL, 1)]))
        d = self.sent[-1].done_signal
        self.assertEqual((d.region.offset, d.value), (0, 1))
        self.assertIn(d.region.region_id, {"region-1", "region-2", "region-3"})
        step, result = o.finish()
        self.assertEqual((step, result.applied_items, o.in_flight), (1, 3, None))
        self.assertEqual(int(signal[0]), 0)  # on success the server writes it, not the client
        self.assertIsNone(o.finish())
        # A refusal before the device work (or a lost connection): the watcher writes the value.
        self.fail_wait = fp4q.Fp4qError(grpc.StatusCode.NOT_FOUND,
                                        "items[0].name: no weight 'w0'", "Step")
        self.assertIsNone(o.send(2, None, self.items, groups, None))
        with self.assertRaisesRegex(fp4q.Fp4qError, "no weight 'w0'"):
            o.finish()
        self.assertEqual(int(signal[0]), 2)
        side.synchronize.assert_called_once_with()
        self.assertIsNone(o.in_flight)
        # The value wraps at 2^32 (the stream's wait compares cyclically).
        o._value = 0xFFFFFFFE
        self.assertIsNone(o.send(3, None, self.items, groups, None))
        with self.assertRaises(fp4q.Fp4qError):
            o.finish()
        self.assertEqual(int(signal[0]), -1)
        self.fail_wait = None
        self.assertIsNone(o.send(3, None, self.items, groups, None))
        self.assertEqual(waits[-2:], [(SIGNAL, 0xFFFFFFFF), (SIGNAL, 0)])
        self.assertEqual(o.finish()[0], 3)
        self.assertEqual((o.sent, o.completed), (4, 0))


    def test_with_ready_signals_the_gradients_stream_writes_the_value_instead_of_a_host_wait(self):
        requests = self.begun()
        freed = []  # the threads that freed the signal tensor

        class Signal(FakeCudaTensor):
            def __del__(self):
                freed.append(threading.current_thread().name)

        signal = Signal(SIGNAL, shape=(8,), dtype=torch.int32)
        waits = []
        patches = [
            mock.patch.object(_overlap, "_new_signal", lambda device: (signal, mock.Mock())),
            mock.patch.object(_cuda_driver, "stream_wait_value32",
                              lambda stream, ptr, value: waits.append((ptr, value))),
            mock.patch.object(torch.cuda, "device", lambda d: contextlib.nullcontext())]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)
        synchronized = torch.cuda.current_stream.return_value.synchronize
        client = mock.Mock(_ipc=self.regions, _requests=requests)
        o = _overlap.OverlappedSteps(client, torch.device("cuda", 0), ready=True)
        groups = [fp4q.SgdHyperparameters(lr=0.1)]
        synchronized.reset_mock()
        self.assertIsNone(o.send(1, None, self.items, groups, None))
        synchronized.assert_not_called()  # the host did not wait for the gradients
        sent = self.sent[-1]
        r, d = sent.ready_signal, sent.done_signal
        self.assertEqual((r.region.region_id, r.region.offset, r.value, r.timeout_ms),
                         (d.region.region_id, d.region.offset + 16, 1, 0))
        self.assertEqual([int(v) for v in signal], [0, 0, 0, 0, 1, 0, 0, 0])
        handle = torch.cuda.current_stream.return_value.cuda_stream
        self.assertEqual(self.word_writes, [(handle, SIGNAL + 16, 1)])  # by the driver
        self.assertEqual(waits, [(SIGNAL, 1)])
        self.assertEqual((o.finish()[0], o.ready_sent), (1, 1))
        # Gradients on another device too: that device's stream is still waited for.
        other = [FakeCudaTensor(GRADS + 0x1000 * i, index=1) for i in range(3)]
        self.assertIsNone(o.send(2, None, lambda: self.items(grads=other), groups, None))
        self.assertEqual(synchronized.call_count, 1)
        self.assertEqual(int(signal[4]), 2)
        o.finish()
        # A step that completes in step() (an output copied after the reply) still carries and
        # gets its ready value: the server would wait for it otherwise.
        cpu = [torch.zeros(32, 16, dtype=torch.bfloat16) for _ in range(3)]
        result = o.send(3, None, lambda: self.items(params=cpu), groups, None)
        self.assertEqual([x.last_step for x in result.items], [3, 3, 3])
        self.assertEqual((self.sent[-1].ready_signal.value, int(signal[4])), (3, 3))
        self.assertEqual((o.sent, o.completed, o.ready_sent), (2, 1, 3))
        # The watcher thread ends with the object and is waited for, so the signal tensor's
        # last reference is dropped here, not on that thread as it ends.
        o = signal = None
        gc.collect()
        self.assertEqual(freed, [threading.current_thread().name])
        self.assertEqual([t for t in threading.enumerate() if t.name == "fp4q-overlap"], [])


    def test_a_held_tensor_s_slot_is_kept_while_its_region_and_the_server_are(self):
        signal = FakeCudaTensor(SIGNAL, shape=(8,), dtype=torch.int32)
        slot, kept = self.regions.register_held(signal)
        self.assertEqual((slot, self.stats["registrations"]), (("region-1", 0), 1))
        calls = sum(self.driver_calls.values())
        for _ in range(3):
            self.assertEqual(self.regions.register_held(signal, kept), (slot, kept))
        self.assertEqual(sum(self.driver_calls.values()), calls)  # no driver call, no RPC
        # A region leaving the cache (another allocation evicted it, or a new session cleared
        # it): registered again.
        self.regions.clear()
        slot, kept = self.regions.register_held(signal, kept)
        self.assertEqual(slot, ("region-2", 0))
        self.assertEqual(self.regions.register_held(signal, kept)[0], ("region-2", 0))
        # The server's ServerInfo forgotten (a restarted server): checked again.
        self.regions.forget_server_info()
        calls = self.driver_calls["identity"]
        slot, kept = self.regions.register_held(signal, kept)
        self.assertEqual((slot, self.driver_calls["identity"]), (("region-2", 0), calls + 1))
        self.assertEqual(self.regions.register_held(signal, kept)[0], ("region-2", 0))
        self.assertEqual(self.driver_calls["identity"], calls + 1)

    def test_the_ready_word_is_a_driver_write_on_the_device_s_stream_or_a_fill(self):
        signal = FakeCudaTensor(SIGNAL, shape=(8,), dtype=torch.int32)
        entered = []

        @contextlib.contextmanager
        def device(d):
            entered.append(d)
            yield
        patches = [mock.patch.object(torch.cuda, "device", device),
                   mock.patch.object(torch.cuda, "current_device", lambda: 0)]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)
        stream = torch.cuda.current_stream.return_value
        stream.cuda_stream = 0x5000
        sent = []
        transfer = mock.Mock()
        order = _overlap._ready_order(signal, torch.device("cuda", 0), 0xFFFFFFFF,
                                      lambda: sent.append(1))
        order(transfer)
        transfer.before_send.assert_called_once_with(skip=torch.device("cuda", 0))
        self.assertEqual(self.word_writes, [(0x5000, SIGNAL + 16, 0xFFFFFFFF)])
        self.assertEqual((int(signal[4]), entered, sent), (-1, [], [1]))
        # torch's default stream (handle 0) of a device other than the current one: the driver
        # call names the current context's legacy stream, so that device is made current.
        stream.cuda_stream = 0
        _overlap._write_ready(signal, torch.device("cuda", 1), 7)
        self.assertEqual((self.word_writes[-1], entered), ((0, SIGNAL + 16, 7), [
            torch.device("cuda", 1)]))
        _overlap._write_ready(signal, torch.device("cuda", 0), 8)  # the current device's
        self.assertEqual((self.word_writes[-1], len(entered)), ((0, SIGNAL + 16, 8), 1))
        # A driver that refuses the write (no stream memory operations): a one-element fill_
        # on that device's stream instead.
        refusals = []

        def refuse(stream, ptr, value):
            refusals.append(value)
            raise _cuda_driver.DriverError("cuStreamWriteValue32: CUDA_ERROR_NOT_SUPPORTED")
        with mock.patch.object(_cuda_driver, "stream_write_value32", refuse):
            _overlap._write_ready(signal, torch.device("cuda", 0), 9)
        self.assertEqual((refusals, int(signal[4]), entered[-1]),
                         ([9], 9, torch.device("cuda", 0)))
        self.assertEqual([int(v) for v in signal], [0, 0, 0, 0, 9, 0, 0, 0])

    def test_with_ready_signals_a_sent_step_holds_its_gradients_no_longer(self):
        # The stream waits for the step before its later work, so torch's allocator may hand
        # the gradients' memory on at once; without ready signals a step built afresh holds
        # them to the reply (a step of a kept plan never held them).
        requests = self.begun()
        signal = FakeCudaTensor(SIGNAL, shape=(8,), dtype=torch.int32)
        patches = [
            mock.patch.object(_overlap, "_new_signal", lambda device: (signal, mock.Mock())),
            mock.patch.object(_cuda_driver, "stream_wait_value32", lambda s, p, v: None),
            mock.patch.object(torch.cuda, "device", lambda d: contextlib.nullcontext())]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)
        client = mock.Mock(_ipc=self.regions, _requests=requests)
        groups = [fp4q.SgdHyperparameters(lr=0.1)]
        for ready in (False, True):
            o = _overlap.OverlappedSteps(client, torch.device("cuda", 0), ready=ready)
            for step in (1, 2):  # the second step's items come from its kept plan
                grads = [FakeCudaTensor(GRADS + 0x1000 * i) for i in range(3)]
                alive = [weakref.ref(g) for g in grads]
                key = (("layout", ready), tuple(x for g, p in zip(grads, self.params)
                                          for x in (g.data_ptr(), p.data_ptr())))
                self.reply_gate = threading.Event()  # the reply comes only when set
                self.assertIsNone(o.send(step, key, lambda g=grads: self.items(grads=g),
                                         groups, None))
                del grads
                gc.collect()
                held = 3 if not ready and step == 1 else 0
                self.assertEqual(sum(r() is not None for r in alive), held,
                                 "ready=%s, step %d" % (ready, step))
                self.reply_gate.set()
                self.assertEqual(o.finish()[1].applied_items, 3)
                gc.collect()
                self.assertEqual(sum(r() is not None for r in alive), 0)
        self.assertEqual(self.stats["step_plans_reused"], 2)

    def ready_steps(self):
        """An fp4q._overlap.ReadySteps on fake device 0 whose signal tensor is a fake; its
        stream is busy until self.idle is set."""
        signal = FakeCudaTensor(SIGNAL, shape=(8,), dtype=torch.int32)
        patches = [
            mock.patch.object(_overlap, "_new_signal", lambda device: (signal, mock.Mock())),
            mock.patch.object(torch.cuda, "device", lambda d: contextlib.nullcontext())]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)
        stream = torch.cuda.current_stream.return_value
        stream.query.side_effect = lambda: self.idle
        self.idle = False
        client = mock.Mock(_ipc=self.regions, _requests=self.requests)
        return _overlap.ReadySteps(client, torch.device("cuda", 0)), signal, stream

    def test_a_synchronous_step_sends_a_ready_signal_while_the_stream_is_busy(self):
        ready, signal, stream = self.ready_steps()
        groups = [fp4q.SgdHyperparameters(lr=0.1)]
        stream.synchronize.reset_mock()
        # The backward pass still queued: the stream writes the word, the host does not wait.
        result = self.requests.step_keyed(1, None, self.items, groups, None, ready.ready())
        stream.synchronize.assert_not_called()
        # The stream was asked about by the driver (cuStreamQuery), on its handle.
        self.assertEqual(self.stream_calls, [("query", stream.cuda_stream)])
        self.assertEqual(result.applied_items, 3)  # the reply was waited for
        r = self.sent[-1].ready_signal
        self.assertEqual((r.region.offset, r.value, r.timeout_ms), (16, 1, 0))
        self.assertIn(r.region.region_id, {"region-1", "region-2", "region-3"})
        self.assertEqual([int(v) for v in signal], [0, 0, 0, 0, 1, 0, 0, 0])
        self.assertFalse(self.sent[-1].HasField("done_signal"))
        # An idle stream: no signal; the host's wait (free) orders the step.
        self.idle = True
        self.requests.step_keyed(2, None, self.items, groups, None, ready.ready())
        self.assertFalse(self.sent[-1].HasField("ready_signal"))
        stream.synchronize.assert_called_once_with()
        self.idle = False
        self.requests.step_keyed(3, None, self.items, groups, None, ready.ready())
        self.assertEqual((self.sent[-1].ready_signal.value, int(signal[4])), (2, 2))
        self.assertEqual((ready.sent, ready.idle, ready.fallbacks), (2, 1, 0))

    def test_a_step_of_an_idle_stream_is_sent_without_the_hosts_wait_for_it(self):
        # fp4q.optim's _send: ready() found the stream idle just before, so neither a ready
        # signal nor a synchronize (nothing was queued on it since); a busy stream still
        # gets its signal, and with the signal off the host waits again.
        ready, signal, stream = self.ready_steps()
        opt = self.optimizer_sending(ready)
        groups = [fp4q.SgdHyperparameters(lr=0.1)]
        stream.synchronize.reset_mock()
        self.idle = True
        self.assertEqual(opt._send(1, None, groups).applied_items, 3)
        self.assertFalse(self.sent[-1].HasField("ready_signal"))
        stream.synchronize.assert_not_called()
        self.assertEqual((ready.idle, ready.sent), (1, 0))
        self.idle = False
        opt._send(2, None, groups)
        self.assertEqual(self.sent[-1].ready_signal.value, 1)
        stream.synchronize.assert_not_called()
        self.assertEqual((ready.idle, ready.sent), (1, 1))
        ready.off = "turned off"
        self.idle = True
        opt._send(3, None, groups)
        self.assertFalse(self.sent[-1].HasField("ready_signal"))
        stream.synchronize.assert_called_once_with()
        self.assertEqual((ready.idle, ready.sent), (1, 1))
        # What ready_and_order gives in each state: the signal off, idle, busy.
        self.assertEqual(ready.ready_and_order(), (None, None))
        ready.off = None
        self.assertEqual(ready.ready_and_order(), (None, ready.idle_order))
        self.idle = False
        signal_ready, order = ready.ready_and_order()
        self.assertEqual((signal_ready[1], order), (2, None))

    def optimizer_sending(self, ready):
        """A StepMixin whose steps go to this test's fake server, with `ready` as its
        ReadySteps."""
        from fp4q._optim_step import StepMixin
        opt = type("Opt", (StepMixin,), {})()
        opt.client = mock.Mock(_requests=self.requests, _ipc=self.regions)
        opt._replica, opt._epoch, opt._ready_steps = None, 0, ready
        opt._items = lambda: (self.items(), {0: 0})
        return opt

    def test_a_ready_word_that_timed_out_sends_the_step_again_after_the_hosts_wait(self):
        ready, signal, stream = self.ready_steps()
        opt = self.optimizer_sending(ready)
        server, refused = self.requests._send, []

        def timing_out(rpc, request, resend=False):
            body = pb.StepRequest.FromString(request.body)
            if rpc == "Step" and body.HasField("ready_signal"):
                refused.append(body.ready_signal.value)
                raise fp4q.Fp4qError(grpc.StatusCode.DEADLINE_EXCEEDED, (
                    "ready_signal: the worker's stream did not write %d within 5000 ms (it "
                    "holds 0); the step changed nothing") % body.ready_signal.value, "Step")
            return server(rpc, request, resend)
        self.requests._send = timing_out
        stream.synchronize.reset_mock()
        with self.assertWarnsRegex(RuntimeWarning, r"ready word was not written within "
                                   r"fp4qd's --step_ready_timeout_ms"):
            result = opt._send(7, None, [fp4q.SgdHyperparameters(lr=0.1)])
        self.assertEqual((refused, result.applied_items), ([1], 3))
        self.assertEqual([m.step for m in self.sent], [7])  # the resend, without the signal
        self.assertFalse(self.sent[-1].HasField("ready_signal"))
        stream.synchronize.assert_called_once_with()  # its host wait
        self.assertEqual((ready.sent, ready.fallbacks, ready.off), (1, 1, None))
        # The request's own deadline passing is the caller's error, not a fallback.
        deadline = ("ready_signal: still waiting for 2 (it holds 1): DEADLINE_EXCEEDED: "
                    "the request's deadline passed")

        def past_deadline(rpc, request, resend=False):
            raise fp4q.Fp4qError(grpc.StatusCode.DEADLINE_EXCEEDED, deadline, "Step")
        self.requests._send = past_deadline
        with self.assertRaisesRegex(fp4q.Fp4qError, "still waiting for 2"):
            opt._send(8, None, [fp4q.SgdHyperparameters(lr=0.1)])
        self.assertEqual(ready.fallbacks, 1)

    def test_a_refused_ready_signal_is_turned_off_and_the_step_sent_without_it(self):
        ready, _, _ = self.ready_steps()
        opt = self.optimizer_sending(ready)
        server = self.requests._send
        why = ("ready_signal.region: on device cuda:0, but the step's weights are on device "
               "cuda:1")

        def refusing(rpc, request, resend=False):
            if rpc == "Step" and pb.StepRequest.FromString(request.body).HasField(
                    "ready_signal"):
                raise fp4q.Fp4qError(grpc.StatusCode.INVALID_ARGUMENT, why, "Step")
            return server(rpc, request, resend)
        self.requests._send = refusing
        with self.assertWarnsRegex(RuntimeWarning, r"the step's ready signal failed \(ready_"
                                   r"signal\.region: on device cuda:0"):
            self.assertEqual(opt._send(1, None, [fp4q.SgdHyperparameters(lr=0.1)])
                             .applied_items, 3)
        self.assertEqual(opt._send(2, None, [fp4q.SgdHyperparameters(lr=0.1)]).applied_items, 3)
        self.assertEqual([m.step for m in self.sent], [1, 2])
        self.assertFalse(any(m.HasField("ready_signal") for m in self.sent))
        self.assertEqual((ready.sent, ready.off), (1, why))  # asked once, then off
        self.assertIsNone(ready.ready())
        # Any other refusal is the step's own error.
        ready.off = None
        self.requests._send = lambda rpc, request, resend=False: (_ for _ in ()).throw(
            fp4q.Fp4qError(grpc.StatusCode.INVALID_ARGUMENT, "items[0].name: no weight 'w0'",
                           "Step"))
        with self.assertRaisesRegex(fp4q.Fp4qError, "no weight 'w0'"):
            opt._send(3, None, [fp4q.SgdHyperparameters(lr=0.1)])
        self.assertIsNone(ready.off)

    def test_a_ready_word_that_cannot_be_registered_leaves_the_host_to_wait(self):
        ready, _, stream = self.ready_steps()
        full = fp4q.Fp4qError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              "session holds 64 regions, the most --max_regions allows",
                              "RegisterCudaRegion")
        with mock.patch.object(self.regions, "register_tensor", side_effect=full):
            with self.assertWarnsRegex(RuntimeWarning, "ready signal failed \\(session holds "
                                       "64 regions"):
                self.assertIsNone(ready.ready())
        self.assertEqual((ready.sent, ready.off), (0, full.message))
        self.assertIsNone(ready.ready())  # off from now on
        stream.synchronize.reset_mock()
        opt = self.optimizer_sending(ready)
        self.assertEqual(opt._send(1, None, [fp4q.SgdHyperparameters(lr=0.1)]).applied_items, 3)
        self.assertFalse(self.sent[-1].HasField("ready_signal"))
        stream.synchronize.assert_called_once_with()


if __name__ == "__main__":
    unittest.main()
