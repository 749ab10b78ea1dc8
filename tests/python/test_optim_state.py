"""fp4q.optim's state against a live CPU-backend fp4qd: state_dict round trips bit for bit
(torch.save / torch.load, another optimizer loading it), refusals of mismatched state_dicts, and a
restarted server reported without anything re-created."""

import io
import os
import pickle
import shutil
import unittest

import grpc
import torch

import fp4q
import fp4q_reference as R
import fp4q_testing
import optim_testing
from optim_testing import Assertions, Small, client, set_grads


def setUpModule():
    optim_testing.start_server()


def tearDownModule():
    optim_testing.stop_server()


def saved_and_loaded(sd):
    """sd through torch.save and torch.load (weights_only where torch can: torch 1.13's
    weights_only unpickler has no float opcodes, so it cannot load any optimizer's state)."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    try:
        return torch.load(buf, weights_only=True)
    except (TypeError, pickle.UnpicklingError):
        if torch.__version__ >= "2":
            raise
        buf.seek(0)
        return torch.load(buf)


class StateDictTest(Assertions):
    def round_trip(self, make, before=3, after=3):
        """Run A: `before` steps, state_dict, `after` steps. Run B: a new optimizer (another
        namespace, other initial values) loads A's state_dict and takes the same `after` steps.
        Returns (A, B, their optimizers, the state_dict)."""
        ca, cb = client("sda"), client("sdb")
        a = Small(seed=70)
        opt_a = make(a, ca)
        for k in range(before):
            set_grads(a, k)
            opt_a.step()
        sd = saved_and_loaded(opt_a.state_dict())
        saved_w, saved_b = a.w.detach().clone(), a.b.detach().clone()
        for k in range(before, before + after):
            set_grads(a, k)
            opt_a.step()
        b = Small(seed=80)
        with torch.no_grad():
            b.b.copy_(saved_b)  # the model's own state_dict holds what torch keeps
        opt_b = make(b, cb)
        opt_b.load_state_dict(sd)
        self.assertSameBits(b.w.detach(), saved_w)  # stored weights: the server's
        self.assertEqual(opt_b._fp4q_steps, before)
        for k in range(before, before + after):
            set_grads(b, k)
            opt_b.step()
        self.assertSameBits(b.w.detach(), a.w.detach())
        self.assertSameBits(b.b.detach(), a.b.detach())
        wa, wb = opt_a.state_dict()["fp4q"]["weights"][0], opt_b.state_dict()["fp4q"]["weights"][0]
        for part in ("codes", "scales", "residual"):
            if wa[part] is not None:
                self.assertSameBits(wb[part], wa[part], part)
        self.assertEqual((wb["global_amax"], wb["s_enc"], wb["last_step"]),
                         (wa["global_amax"], wa["s_enc"], wa["last_step"]))
        for name, m in wa["moments"].items():
            self.assertSameBits(wb["moments"][name], m, name)
        return opt_a, opt_b, sd

    def test_what_state_dict_holds(self):
        c = client()
        m = Small(seed=60)
        opt = fp4q.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, client=c)
        set_grads(m, 0)
        opt.step()
        sd = opt.state_dict()
        self.assertEqual(sd["param_groups"], [{"lr": 0.1, "momentum": 0.9, "dampening": 0,
                                               "weight_decay": 0, "nesterov": False,
                                               "params": [0, 1]}])
        self.assertEqual(sorted(sd["state"]), [1])  # the bias, torch's own state
        self.assertEqual(sorted(sd["state"][1]), ["momentum_buffer"])
        f = sd["fp4q"]
        self.assertEqual((f["format"], f["optimizer"], f["step"], f["namespace"]),
                         (1, "sgd", 1, c.namespace))
        self.assertEqual(f["options"], {"rounding": "nearest", "error_feedback": True,
                                        "block": "1x16", "scaling": "current",
                                        "state_dtype": "f32", "seed": 0})
        w = f["weights"][0]
        self.assertEqual((w["name"], w["shape"], w["dtype"], w["last_step"],
                          w["optimizer_steps"]), ("param0", (32, 64), "float32", 1, 1))
        self.assertEqual(w["spec"], {"kind": "sgd", "momentum": True, "amsgrad": False,
                                     "state_dtype": "f32"})
        self.assertEqual((tuple(w["codes"].shape), tuple(w["scales"].shape),
                          tuple(w["residual"].shape)), ((32, 32), (32, 4), (32, 64)))
        # DQ(W) of the saved codes is what the parameter holds
        dq = R.dequantize_nvfp4(w["codes"].numpy(), w["scales"].numpy(), w["s_enc"])
        self.assertSameBits(m.w.detach(), torch.from_numpy(dq))
        self.assertSameBits(w["moments"]["momentum_buffer"],
                            c.get_weight("param0", optimizer_state=True)
                            .optimizer_state.moments["momentum_buffer"])
        c.close()

    def test_sgd_round_trips_bit_for_bit(self):
        cases = {
            "rtn+ef": lambda m, c: fp4q.optim.SGD(m.parameters(), lr=0.1, client=c),
            "sr+ef": lambda m, c: fp4q.optim.SGD(m.parameters(), lr=0.05, rounding="stochastic",
                                                 seed=11, client=c),
            "rtn+ef, nesterov momentum, weight decay, bf16 buffer": lambda m, c: fp4q.optim.SGD(
                m.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3,
                state_dtype="bf16", client=c),
            "rtn, no ef": lambda m, c: fp4q.optim.SGD(m.parameters(), lr=0.3,
                                                      error_feedback=False, client=c),
            "16x16, momentum f32": lambda m, c: fp4q.optim.SGD(
                m.parameters(), lr=0.1, momentum=0.5, dampening=0.1, block="16x16", client=c),
        }
        for what, make in cases.items():
            with self.subTest(what):
                self.round_trip(make)

    def test_a_state_the_server_still_holds_loads_for_any_optimizer(self):
        # AdamW's moments cannot be written by any request: its state loads only where fp4qd
        # still holds it (a worker restarting while the server kept its state).
        c = client()
        ref_c = client()
        make = lambda m, cl, **kw: fp4q.optim.AdamW(m.parameters(), lr=1e-2, client=cl, **kw)
        a, ref = Small(seed=90), Small(seed=90)
        opt, opt_ref = make(a, c), make(ref, ref_c)
        for k in range(3):
            for mm, o in ((a, opt), (ref, opt_ref)):
                set_grads(mm, k)
                o.step()
        sd = saved_and_loaded(opt.state_dict())
        # The worker restarts: a new model and optimizer attach to the server's weights.
        b = Small(seed=91)
        with torch.no_grad():
            b.b.copy_(a.b)  # the model's own state_dict holds what torch keeps
        opt_b = make(b, c, existing="attach")
        opt_b.load_state_dict(sd)
        for k in range(3, 6):
            for mm, o in ((b, opt_b), (ref, opt_ref)):
                set_grads(mm, k)
                o.step()
        self.assertSameBits(b.w.detach(), ref.w.detach())
        self.assertSameBits(b.b.detach(), ref.b.detach())
        # The server moved on: the same state_dict is now refused, and nothing changes.
        before = c.get_weight("param0", quantized=True).quantized.codes.clone()
        err = self.assertRefused(
            grpc.StatusCode.FAILED_PRECONDITION,
            r"^load_state_dict: 1 weights differ from the server's and cannot be re-created "
            r"exactly: 'param0': fp4qd has no request that writes AdamW moments; nothing was "
            r"changed", opt_b.load_state_dict, sd)
        self.assertIsInstance(err, fp4q.Fp4qError)
        self.assertSameBits(c.get_weight("param0", quantized=True).quantized.codes, before)
        self.assertEqual(opt_b._fp4q_steps, 6)

    def test_mismatched_state_dicts_are_refused_naming_what_differs(self):
        c = client()
        m = Small(seed=95)
        sgd = fp4q.optim.SGD(m.parameters(), lr=0.1, client=c)
        sd = sgd.state_dict()
        other = fp4q.optim.AdamW(Small(seed=96).parameters(), client=client())
        with self.assertRaisesRegex(fp4q.ClientArgumentError,
                                    r"INVALID_ARGUMENT: state_dict\['fp4q'\]"
                                    r"\['optimizer'\]: 'sgd', this optimizer is 'adamw'$"):
            other.load_state_dict(sd)
        sr = fp4q.optim.SGD(Small(seed=97).parameters(), lr=0.1, rounding="stochastic",
                            client=client())
        with self.assertRaisesRegex(fp4q.ClientArgumentError,
                                    r"INVALID_ARGUMENT: state_dict\['fp4q'\]"
                                    r"\['options'\]\['rounding'\]: 'nearest', this optimizer "
                                    r"has 'stochastic'$"):
            sr.load_state_dict(sd)
        dm = Small(seed=98)
        delayed = fp4q.optim.SGD(dm.parameters(), lr=0.1, scaling="delayed", client=client())
        set_grads(dm, 0)
        delayed.step()
        dsd = delayed.state_dict()
        fresh_c = client()
        fresh = fp4q.optim.SGD(Small(seed=99).parameters(), lr=0.1, scaling="delayed",
                               client=fresh_c)
        self.assertRefused(grpc.StatusCode.FAILED_PRECONDITION,
                           r"'param0': under delayed scaling the weight was quantized with the "
                           r"previous step's amax", fresh.load_state_dict, dsd)
        self.assertEqual([t.last_step for t in fresh_c.list_tensors()], [0])  # unchanged
        sm = Small(seed=100)
        kw = dict(lr=0.1, momentum=0.9, rounding="stochastic")
        sr_momentum = fp4q.optim.SGD(sm.parameters(), client=client(), **kw)
        set_grads(sm, 0)
        sr_momentum.step()
        other = fp4q.optim.SGD(Small(seed=101).parameters(), client=client(), **kw)
        self.assertRefused(grpc.StatusCode.FAILED_PRECONDITION,
                           r"'param0': stochastic rounding with a momentum buffer: writing the "
                           r"buffer takes one more step", other.load_state_dict,
                           sr_momentum.state_dict())
        c.close()


class RestartTest(Assertions):
    def test_a_restarted_server_is_reported_and_nothing_is_re_created(self):
        for fast in (False, True):
            with self.subTest(fast_socket=fast):
                self.restart(fast)

    def restart(self, fast):
        sock = fp4q_testing.socket_path("grpc.sock")
        folder = os.path.dirname(sock)
        state = os.path.join(folder, "state")
        os.makedirs(state)
        fast_path = os.path.join(folder, "fast.sock")
        args = ("--unix_socket", sock, "--state_dir", state, "--fast_socket", fast_path)
        server = fp4q_testing.Server(*args)
        c = fp4q.Client("unix:" + sock, timeout=30, fast_socket=fast_path if fast else "")
        try:
            m = Small(seed=130)
            opt = fp4q.optim.SGD([("restart-w", m.w)], lr=0.1, client=c)
            for k in range(2):
                set_grads(m, k)
                opt.step()
            c.checkpoint()
            set_grads(m, 2)
            opt.step()  # step 3: after the checkpoint
            self.assertEqual(c.stats["fast_socket_calls"] > 0, fast)
            old = c.server_epoch
            server.proc.kill()  # kill -9: no final checkpoint (SIGTERM would write one)
            server.proc.wait(30)
            server.stop()
            server = fp4q_testing.Server(*args)
            fp4q_testing.wait_serving(c)
            set_grads(m, 3)
            err = self.assertRefused(grpc.StatusCode.FAILED_PRECONDITION,
                                     r"^fp4qd restarted \(server_epoch %d, now \d+\): its "
                                     r"weights" % old, opt.step)
            self.assertIsInstance(err, fp4q.ServerRestartedError)
            self.assertNotEqual(err.new_epoch, old)
            self.assertRefused(grpc.StatusCode.FAILED_PRECONDITION, r"^fp4qd restarted",
                               opt.step)  # and again, without sending anything
            # The server holds what its checkpoint held (step 2); nothing was re-created.
            self.assertEqual([(t.name, t.last_step) for t in c.list_tensors()],
                             [("restart-w", 2)])
        finally:
            c.close()
            server.stop()
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
