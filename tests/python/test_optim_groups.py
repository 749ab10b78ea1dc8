"""fp4q.optim with several workers against a live CPU-backend fp4qd: data-parallel replica groups
(K rank processes, optim_rank.py, equal to a one-process replay; one server copy of the state;
missing and dead ranks), jobs in namespaces of their own, lost sessions and retried steps."""

import os
import shutil
import subprocess
import sys
import threading
import time
import unittest

import grpc
import torch

import fp4q
import fp4q_testing
import optim_models as M
import optim_testing
from optim_testing import Assertions, Small, bits, client, set_grads

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = None


def setUpModule():
    global SERVER
    SERVER = optim_testing.start_server()


def tearDownModule():
    optim_testing.stop_server()


class ReplicaGroupTest(Assertions):
    def ranks(self, namespace, group, world, steps, *extra):
        folder = fp4q_testing.socket_path("ranks")
        os.makedirs(folder, exist_ok=True)
        procs, outs = [], []
        for r in range(world):
            out = os.path.join(folder, "rank%d.pt" % r)
            outs.append(out)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "optim_rank.py"),
                 SERVER.target, namespace, group, str(world), str(r), str(steps), out] +
                list(extra), stdout=subprocess.PIPE, text=True))
        return folder, procs, outs

    def test_k_ranks_equal_a_single_process_replay_summing_in_rank_order(self):
        world, steps = 3, 8
        namespace = "dp-%d" % os.getpid()
        folder, procs, outs = self.ranks(namespace, "mlp", world, steps)
        try:
            for p in procs:
                self.assertEqual(p.wait(timeout=300), 0)
            runs = [torch.load(o) for o in outs]
        finally:
            shutil.rmtree(os.path.dirname(folder), ignore_errors=True)
        for r in runs[1:]:
            for name, t in r["params"].items():
                self.assertSameBits(t, runs[0]["params"][name], name)
        self.assertLess(runs[0]["losses"][-1], runs[0]["losses"][0])
        # The replay: one process, no group, the K gradients summed in rank order, over K.
        replay_c = client("replay")
        model, _, _ = M.mlp_problem(seed=5)
        opt = fp4q.optim.SGD(model.named_parameters(), lr=0.1, momentum=0.9, client=replay_c)
        for k in range(steps):
            for name, p in model.named_parameters():
                g = runs[0]["grads"][k][name].clone()
                for r in runs[1:]:
                    g = g + r["grads"][k][name]
                p.grad = g / world
            opt.step()
        for name, p in model.named_parameters():
            self.assertSameBits(p.detach(), runs[0]["params"][name], name)
        group_c = fp4q.Client(SERVER.target, namespace=namespace)
        for name in ("w1", "w2"):
            a = group_c.get_weight(name, quantized=True, residual=True, optimizer_state=True)
            b = replay_c.get_weight(name, quantized=True, residual=True, optimizer_state=True)
            self.assertSameBits(a.quantized.codes, b.quantized.codes, name)
            self.assertSameBits(a.quantized.scales, b.quantized.scales, name)
            self.assertSameBits(a.residual, b.residual, name)
            self.assertSameBits(a.optimizer_state.moments["momentum_buffer"],
                                b.optimizer_state.moments["momentum_buffer"], name)
            self.assertEqual((a.info.last_step, a.info.optimizer_steps), (steps, steps))
        self.assertEqual(group_c.delete_namespace(), 2)
        group_c.close()
        replay_c.close()

    def test_server_state_is_one_copy_whatever_the_number_of_ranks(self):
        # K = 1, 2, 4 ranks train the same MLP (SGD momentum, error feedback): the server holds
        # the same bytes for each K (one weight, residual and momentum buffer per parameter),
        # where per-rank fp32 masters with momentum would hold 8 B/param on each of K ranks.
        held, params = {}, None
        for world in (1, 2, 4):
            namespace = "dp-mem%d-%d" % (world, os.getpid())
            folder, procs, outs = self.ranks(namespace, "mem", world, 2)
            try:
                for p in procs:
                    self.assertEqual(p.wait(timeout=300), 0)
                if params is None:
                    params = sum(t.numel() for t in torch.load(outs[0])["params"].values())
            finally:
                shutil.rmtree(os.path.dirname(folder), ignore_errors=True)
            c = fp4q.Client(SERVER.target, namespace=namespace)
            listing = c.list_tensors()
            self.assertEqual(sorted(t.name for t in listing), ["w1", "w2"])
            self.assertEqual({t.last_step for t in listing}, {2})
            held[world] = sum(t.bytes for t in listing)
            self.assertEqual(c.delete_namespace(), 2)
            c.close()
        self.assertEqual(held[2], held[1])
        self.assertEqual(held[4], held[1])
        per_param = held[1] / params
        # codes 0.5 + scales 0.0625 + residual 4 + momentum 4, and the per-tensor scalars.
        self.assertGreater(per_param, 8.5625)
        self.assertLess(per_param, 8.6)
        print("\nserver state: %d bytes for %d parameters (%.3f B/param) at K = 1, 2 and 4; "
              "per-rank fp32 masters with momentum: %d bytes at K = 4"
              % (held[1], params, per_param, 4 * 8 * params))

    def test_a_missing_rank_fails_the_step_for_all_and_nothing_is_applied(self):
        ns = "miss-%d" % os.getpid()
        c0, c1 = (fp4q.Client(SERVER.target, timeout=60, namespace=ns) for _ in range(2))
        m0, m1 = Small(seed=100), Small(seed=100)
        kw = dict(lr=0.1, group="g", world_size=2, deadline_ms=500, exclude=["b"])
        o0 = fp4q.optim.SGD([("w", m0.w)], rank=0, client=c0, **kw)
        o1 = fp4q.optim.SGD([("w", m1.w)], rank=1, client=c1, **kw)
        self.assertSameBits(m0.w.detach(), m1.w.detach())  # both hold the server's copy
        m0.w.grad = torch.ones(32, 64)
        self.assertRefused(grpc.StatusCode.DEADLINE_EXCEEDED,
                           r"^replica: ranks \[1\] of group 'g' did not send step 1 within 500 "
                           r"ms; nothing was applied$", o0.step)
        self.assertEqual(c0.get_weight("w", dequantized=False).info.last_step, 0)
        # Both ranks step: one update with the mean of their gradients.
        m1.w.grad = torch.full((32, 64), 3.0)
        errors = []
        t = threading.Thread(target=lambda: errors.append(o1.step()))
        t.start()
        o0.step()
        t.join(60)
        self.assertEqual(errors, [None])
        self.assertSameBits(m0.w.detach(), m1.w.detach())
        self.assertEqual(c0.get_weight("w", dequantized=False).info.last_step, 1)
        c0.delete_namespace()
        c0.close()
        c1.close()

    def test_a_dead_rank_fails_the_step_naming_it(self):
        folder = fp4q_testing.socket_path("dead")
        server = fp4q_testing.Server("--session_lease_s", "2")
        try:
            ns = "dead-%d" % os.getpid()
            rank1 = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "optim_rank.py"),
                 server.target, ns, "mlp", "2", "1", "1", os.path.join(folder, "x"), "--hang"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True)
            self.assertEqual(rank1.stdout.readline().strip(), "ready")
            c0 = fp4q.Client(server.target, timeout=60, namespace=ns)
            model, x, y = M.mlp_problem(seed=5)
            o0 = fp4q.optim.SGD(model.named_parameters(), lr=0.1, momentum=0.9, client=c0,
                                group="mlp", world_size=2, rank=0, deadline_ms=20000)
            M.mlp_loss(model, x, y).backward()
            outcome = []

            def step():
                try:
                    o0.step()
                    outcome.append(None)
                except fp4q.Fp4qError as e:
                    outcome.append(e)
            t = threading.Thread(target=step)
            t.start()
            time.sleep(0.5)
            rank1.kill()  # SIGKILL: its session lapses with its lease (2 s)
            rank1.wait(30)
            rank1.stdin.close()
            rank1.stdout.close()
            t.join(30)
            (err,) = outcome
            self.assertIsInstance(err, fp4q.Fp4qError)
            self.assertEqual(err.code, grpc.StatusCode.UNAVAILABLE)
            self.assertEqual(err.message, "replica: rank 1 of group 'mlp' lost its session (its "
                             "process died, closed it, or let its lease lapse) during step 1; "
                             "nothing was applied; rank 1 can JoinGroup again")
            self.assertEqual(c0.get_weight("w1", dequantized=False).info.last_step, 0)
            c0.close()
        finally:
            server.stop()
            shutil.rmtree(os.path.dirname(folder), ignore_errors=True)


class NamespaceAndRetryTest(Assertions):
    def test_two_jobs_with_the_same_names_in_different_namespaces(self):
        ca, cb = client("job-a"), client("job-b")
        a, b = Small(seed=110), Small(seed=111)
        oa = fp4q.optim.SGD([("w", a.w)], lr=0.1, client=ca)
        ob = fp4q.optim.SGD([("w", b.w)], lr=0.1, client=cb)
        for k in range(2):
            set_grads(a, k)
            set_grads(b, k + 5)
            oa.step()
            ob.step()
        self.assertEqual([(t.name, t.last_step) for t in ca.list_tensors()], [("w", 2)])
        self.assertEqual([(t.name, t.last_step) for t in cb.list_tensors()], [("w", 2)])
        self.assertSameBits(ca.get_weight("w").dequantized, a.w.detach())
        self.assertSameBits(cb.get_weight("w").dequantized, b.w.detach())
        self.assertNotEqual(bits(a.w), bits(b.w))
        self.assertEqual(ca.delete_namespace(), 1)
        self.assertEqual(ca.list_tensors(), [])
        set_grads(b, 9)
        ob.step()
        self.assertEqual([(t.name, t.last_step) for t in cb.list_tensors()], [("w", 3)])
        with fp4q.Client(SERVER.target) as default:
            self.assertRefused(grpc.StatusCode.FAILED_PRECONDITION, r"^namespace: the default "
                               r"namespace cannot be deleted at once", default.delete_namespace)
        cb.close()

    def test_a_lost_session_of_a_single_worker_is_replaced_and_the_step_sent_once(self):
        c = client()
        m = Small(seed=125)
        opt = fp4q.optim.SGD([("w", m.w)], lr=0.1, client=c)
        old = c.session_id
        path, req, rep = fp4q._messages.METHODS["CloseSession"]
        with grpc.insecure_channel(SERVER.target) as channel:  # behind the client's back
            channel.unary_unary(path, request_serializer=req.SerializeToString,
                                response_deserializer=rep.FromString)(
                req(), metadata=(("fp4q-session", old),), timeout=30)
        set_grads(m, 0)
        opt.step()
        self.assertNotIn(c.session_id, (None, old))
        self.assertEqual([(t.name, t.last_step) for t in c.list_tensors()], [("w", 1)])
        c.close()

    def test_a_retried_step_is_not_applied_twice_and_a_changed_retry_is_refused(self):
        c = client()
        m = Small(seed=120)
        opt = fp4q.optim.SGD([("w", m.w)], lr=0.1, momentum=0.9, client=c)
        set_grads(m, 0)
        opt.step()
        after = m.w.detach().clone()
        state = c.get_weight("w", residual=True, optimizer_state=True)
        opt._fp4q_steps = 0  # as if step 1's reply had been lost: the next step() resends it
        opt.step()
        self.assertSameBits(m.w.detach(), after)  # answered "already applied"
        again = c.get_weight("w", residual=True, optimizer_state=True)
        self.assertSameBits(again.residual, state.residual)
        self.assertEqual((again.info.last_step, again.info.optimizer_steps, opt._fp4q_steps),
                         (1, 1, 1))
        opt._fp4q_steps = 0
        m.w.grad = m.w.grad * 2
        self.assertRefused(grpc.StatusCode.FAILED_PRECONDITION,
                           r"^items\[0\]\.update: weight 'w' already applied step 1 with a "
                           r"different update; a retry must resend the same update; nothing "
                           r"was applied$", opt.step)
        self.assertEqual(opt._fp4q_steps, 0)  # not counted: the next step() sends 1 again
        self.assertSameBits(c.get_weight("w").dequantized, after)
        c.close()


if __name__ == "__main__":
    unittest.main()
