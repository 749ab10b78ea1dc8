"""fp4q.optim.SGD / AdamW against a live CPU-backend fp4qd (inline tensors): what is stored,
each step's exact values against tests/python/fp4q_reference.py, training the examples' models
(round-to-nearest stalls, error feedback learns; AdamW tracks torch's fp32 AdamW), param groups,
schedulers, torch-side parameters, state_dict round trips, validation, restarts."""

import io
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
import unittest

import grpc
import numpy as np
import torch

import fp4q
import fp4q_reference as R
import fp4q_testing
import optim_models as M

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = None
_NS = iter(range(10**6))


def setUpModule():
    global SERVER
    SERVER = fp4q_testing.Server("--session_lease_s", "600")


def tearDownModule():
    SERVER.stop()


def client(tag="t", **kwargs):
    """A client in a namespace of its own (tests never see one another's weights)."""
    return fp4q.Client(SERVER.target, timeout=120,
                       namespace="%s-%d-%d" % (tag, os.getpid(), next(_NS)), **kwargs)


def randn(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def f32(t):
    return np.asarray(t.detach().float().numpy(), dtype=np.float32)


def ref_create(x, block="1x16", sr=None):
    """CreateWeight with error feedback: (DQ(W), r) of Q(x) (the amax of x)."""
    q = R.quantize_nvfp4(f32(x), block, sr=sr)
    dq = R.dequantize_nvfp4(q["packed"], q["scales"], q["s_enc"])
    return q, dq, (f32(x) - dq).astype(np.float32)


def ref_sgd_step(d, r, g, lr, block="1x16", sr=None, ef=True):
    """NUMERICS 5.1 / 10 for plain SGD: x = RN(d - RN(lr g)), v = RN(x + r), W = Q(v),
    r = RN(v - DQ(W)). Returns (q, DQ(W), r)."""
    step = (np.float32(lr) * f32(g)).astype(np.float32)
    x = (d - step).astype(np.float32)
    v = (x + r).astype(np.float32) if ef else x
    q = R.quantize_nvfp4(v, block, sr=sr)
    dq = R.dequantize_nvfp4(q["packed"], q["scales"], q["s_enc"])
    return q, dq, (v - dq).astype(np.float32)


def bits(t):
    return t.detach().contiguous().view(torch.uint8).numpy().tobytes()


class Assertions(unittest.TestCase):
    def assertSameBits(self, a, b, msg=None):
        a = torch.as_tensor(a)
        b = torch.as_tensor(b)
        self.assertEqual((a.dtype, tuple(a.shape)), (b.dtype, tuple(b.shape)), msg)
        self.assertTrue(bits(a) == bits(b), msg)

    def assertRefused(self, code, pattern, fn, *args, **kwargs):
        with self.assertRaises(fp4q.Fp4qError) as cm:
            fn(*args, **kwargs)
        self.assertEqual(cm.exception.code, code, cm.exception.message)
        self.assertRegex(cm.exception.message, pattern)
        return cm.exception


class ConstructionTest(Assertions):
    def test_storable_parameters_go_to_the_server_the_rest_stay_in_torch(self):
        c = client()
        lin = torch.nn.Linear(128, 64)            # weight [64, 128] stored, bias in torch
        odd = torch.nn.Linear(20, 48, bias=False)  # 20 columns: torch
        tall = torch.nn.Linear(32, 40, bias=False)  # 40 rows: stored with 1x16 blocks
        skip = torch.nn.Linear(32, 32, bias=False)
        named = [("lin.weight", lin.weight), ("lin.bias", lin.bias), ("odd", odd.weight),
                 ("tall", tall.weight), ("skip", skip.weight)]
        w0 = lin.weight.detach().clone()
        opt = fp4q.optim.SGD(named, lr=0.1, client=c, exclude=["skip"], name_prefix="m/")
        self.assertEqual(opt.stored_names, {0: "m/lin.weight", 3: "m/tall"})
        self.assertEqual(opt.torch_parameters, {
            1: "1-D (stored weights are 2-D)", 2: "20 columns, not a multiple of 16",
            4: "excluded by the caller"})
        self.assertEqual(sorted(t.name for t in c.list_tensors()), ["m/lin.weight", "m/tall"])
        _, dq, r = ref_create(w0)
        self.assertSameBits(lin.weight.detach(), torch.from_numpy(dq))  # the stored value
        st = c.get_weight("m/lin.weight", residual=True)
        self.assertSameBits(st.residual, torch.from_numpy(r))
        self.assertEqual((st.info.options.error_feedback, st.info.options.scaling,
                          st.info.last_step), (True, 1, 0))
        opt16 = fp4q.optim.SGD([tall.weight], lr=0.1, block="16x16", client=client())
        self.assertEqual(opt16.torch_parameters, {0: "40 rows, not a multiple of 16 (16x16 "
                                                     "blocks)"})
        c.close()

    def test_arguments_are_checked_like_torch_before_anything_is_sent(self):
        c = client()
        p = [torch.nn.Parameter(torch.ones(16, 32))]
        bad = [
            (lambda: fp4q.optim.SGD(p, lr=-0.1, client=c), r"^lr: -0\.1 must be >= 0 "
             r"\(Invalid learning rate\)$"),
            (lambda: fp4q.optim.SGD(p, client=c), r"^lr: required \(torch\.optim\.SGD has no "
             r"default; give lr= or each param group's 'lr'\)$"),
            (lambda: fp4q.optim.SGD(p, lr=float("nan"), client=c), r"^lr: nan is not finite$"),
            (lambda: fp4q.optim.SGD(p, lr=0.1, momentum=-1, client=c),
             r"^momentum: -1\.0 must be >= 0 \(Invalid momentum value\)$"),
            (lambda: fp4q.optim.SGD(p, lr=0.1, weight_decay=-1e-4, client=c),
             r"^weight_decay: -0\.0001 must be >= 0"),
            (lambda: fp4q.optim.SGD(p, lr=0.1, nesterov=True, client=c),
             r"^nesterov: Nesterov momentum requires a momentum and zero dampening \(momentum "
             r"0\.0, dampening 0\.0\)$"),
            (lambda: fp4q.optim.AdamW(p, betas=(1.0, 0.9), client=c),
             r"^betas\[0\]: 1\.0 is not in \[0, 1\) \(Invalid beta parameter at index 0\)$"),
            (lambda: fp4q.optim.AdamW(p, betas=(0.9, -0.1), client=c), r"^betas\[1\]: -0\.1"),
            (lambda: fp4q.optim.AdamW(p, eps=0.0, client=c), r"^eps: 0\.0 must be > 0"),
            (lambda: fp4q.optim.AdamW(p, lr=-1e-3, client=c), r"^lr: -0\.001 must be >= 0"),
            (lambda: fp4q.optim.AdamW([{"params": p, "weight_decay": -1}], client=c),
             r"^param_groups\[0\]\['weight_decay'\]: -1\.0 must be >= 0"),
            (lambda: fp4q.optim.SGD(p, lr=0.1, rounding="truncate", client=c),
             r"^rounding: 'truncate' is not one of \['nearest', 'stochastic'\]$"),
            (lambda: fp4q.optim.SGD(p, lr=0.1, scaling="later", client=c),
             r"^scaling: 'later' is not one of \['current', 'delayed'\]$"),
            (lambda: fp4q.optim.SGD(p, lr=0.1, state_dtype="f16", client=c), r"^state_dtype: "),
            (lambda: fp4q.optim.SGD(p, lr=0.1, world_size=2, client=c),
             r"^group: a replica group name is needed with world_size=2$"),
            (lambda: fp4q.optim.SGD(p, lr=0.1, group="g", world_size=2, rank=2, client=c),
             r"^rank: 2 is not in \[0, 2\)$"),
        ]
        for fn, pattern in bad:
            with self.subTest(pattern):
                with self.assertRaises(ValueError) as cm:
                    fn()
                self.assertIsInstance(cm.exception, fp4q.ClientArgumentError)
                self.assertRegex(cm.exception.message, pattern)
        self.assertEqual(c.list_tensors(), [])  # nothing was created
        c.close()

    def test_an_existing_name_is_an_error_unless_attached_or_replaced(self):
        c = client()
        p = torch.nn.Parameter(randn(16, 32, seed=1))
        opt = fp4q.optim.SGD([("w", p)], lr=0.5, client=c)
        p.grad = randn(16, 32, seed=2)
        opt.step()
        after = p.detach().clone()
        q = torch.nn.Parameter(randn(16, 32, seed=3))
        self.assertRefused(grpc.StatusCode.ALREADY_EXISTS,
                           r"^weight 'w' already exists in namespace '%s' \(last step 1: an "
                           r"earlier run or another optimizer\); pass existing='attach'"
                           % c.namespace, fp4q.optim.SGD, [("w", q)], lr=0.5, client=c)
        attached = fp4q.optim.SGD([("w", q)], lr=0.5, client=c, existing="attach")
        self.assertSameBits(q.detach(), after)  # the stored value, not q's own
        self.assertEqual(attached._fp4q_steps, 1)  # the next step is 2
        q.grad = randn(16, 32, seed=4)
        attached.step()
        self.assertEqual(c.get_weight("w", dequantized=False).info.last_step, 2)
        self.assertRefused(grpc.StatusCode.ALREADY_EXISTS, r"does not fit parameter 0: its "
                           r"shape is \[16, 32\], the parameter's \[32, 32\]", fp4q.optim.SGD,
                           [("w", torch.nn.Parameter(torch.ones(32, 32)))], lr=0.5, client=c,
                           existing="attach")
        fresh = torch.nn.Parameter(randn(16, 32, seed=5))
        fp4q.optim.SGD([("w", fresh)], lr=0.5, client=c, existing="replace")
        self.assertEqual(c.get_weight("w", dequantized=False).info.last_step, 0)
        _, dq, _ = ref_create(randn(16, 32, seed=5))
        self.assertSameBits(fresh.detach(), torch.from_numpy(dq))
        c.close()


class StepValuesTest(Assertions):
    """Each step's stored value, exactly, against the reference of NUMERICS 5.1 and 10."""

    def test_sgd_with_error_feedback_is_the_reference_step(self):
        for rounding, block in (("nearest", "1x16"), ("stochastic", "1x16"),
                                ("nearest", "16x16")):
            with self.subTest(rounding=rounding, block=block):
                c = client()
                w0 = randn(32, 64, seed=10)
                p = torch.nn.Parameter(w0.clone())
                opt = fp4q.optim.SGD([p], lr=0.05, rounding=rounding, block=block, seed=7,
                                     client=c)
                sr = (lambda step: (7, step)) if rounding == "stochastic" else (lambda step: None)
                _, d, r = ref_create(w0, block, sr(0))
                for step, lr in ((1, 0.05), (2, 0.05), (3, 0.2)):
                    opt.param_groups[0]["lr"] = lr
                    g = randn(32, 64, seed=10 + step)
                    p.grad = g.clone()
                    opt.step()
                    q, d, r = ref_sgd_step(d, r, g, lr, block, sr(step))
                    self.assertSameBits(p.detach(), torch.from_numpy(d), "step %d" % step)
                st = c.get_weight("param0", quantized=True, residual=True)
                self.assertEqual(st.quantized.codes.numpy().tobytes(), q["packed"].tobytes())
                self.assertEqual(st.quantized.scales.numpy().tobytes(), q["scales"].tobytes())
                self.assertSameBits(st.residual, torch.from_numpy(r))
                self.assertEqual((st.info.last_step, st.info.optimizer_steps), (3, 3))
                c.close()

    def test_without_error_feedback_small_updates_are_rounded_away(self):
        c = client()
        w0 = randn(32, 64, seed=20, scale=0.1)
        p = torch.nn.Parameter(w0.clone())
        opt = fp4q.optim.SGD([p], lr=1e-3, error_feedback=False, client=c)
        q, d, _ = ref_create(w0)
        codes0 = q["codes"]
        zero = np.zeros_like(d)
        for step in range(1, 6):
            g = randn(32, 64, seed=20 + step, scale=0.1)
            p.grad = g.clone()
            opt.step()
            q, d, _ = ref_sgd_step(d, zero, g, 1e-3, ef=False)
            self.assertSameBits(p.detach(), torch.from_numpy(d), "step %d" % step)
        # |lr g| ~ 1e-4 against half a grid step ~ 1e-2: only the codes next to a rounding
        # threshold (or moved by the global scale's drift) change; the updates are lost.
        moved = float(np.mean(q["codes"] != codes0))
        self.assertLess(moved, 0.05)
        self.assertIsNone(c.get_weight("param0", dequantized=False).info.options.error_feedback
                          or None)
        c.close()

    def test_bf16_parameters_receive_bf16_dequantized_values(self):
        c = client()
        w0 = randn(16, 32, seed=30).to(torch.bfloat16)
        p = torch.nn.Parameter(w0.clone())
        opt = fp4q.optim.SGD([p], lr=0.1, client=c)
        self.assertEqual(c.get_weight("param0", dequantized=False).info.options.dtype,
                         fp4q._messages.pb.DType.DTYPE_BF16)
        _, d, r = ref_create(w0.float())
        g = randn(16, 32, seed=31).to(torch.bfloat16)
        p.grad = g.clone()
        opt.step()
        _, d, _ = ref_sgd_step(d, r, g.float(), 0.1)
        self.assertEqual(p.dtype, torch.bfloat16)
        self.assertSameBits(p.detach(), torch.from_numpy(d).to(torch.bfloat16))
        c.close()

    def test_param_groups_schedulers_and_skipped_parameters(self):
        c = client()
        a0, b0 = randn(16, 32, seed=40), randn(16, 32, seed=41)
        a, b = torch.nn.Parameter(a0.clone()), torch.nn.Parameter(b0.clone())
        opt = fp4q.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.01}], lr=0.1, client=c)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        _, da, ra = ref_create(a0)
        _, db, rb = ref_create(b0)
        lrs = []
        for step in range(1, 4):
            ga, gb = randn(16, 32, seed=40 + 2 * step), randn(16, 32, seed=41 + 2 * step)
            a.grad = ga.clone()
            b.grad = gb.clone() if step != 2 else None  # b skipped at step 2
            lrs.append([g["lr"] for g in opt.param_groups])
            opt.step()
            sched.step()
            _, da, ra = ref_sgd_step(da, ra, ga, lrs[-1][0])
            if step != 2:
                _, db, rb = ref_sgd_step(db, rb, gb, lrs[-1][1])
            self.assertSameBits(a.detach(), torch.from_numpy(da), "a, step %d" % step)
            self.assertSameBits(b.detach(), torch.from_numpy(db), "b, step %d" % step)
        self.assertEqual(lrs, [[0.1, 0.01], [0.05, 0.005], [0.025, 0.0025]])
        self.assertEqual(c.get_weight("param1", dequantized=False).info.last_step, 3)
        self.assertEqual(c.get_weight("param1", dequantized=False).info.optimizer_steps, 2)
        opt.param_groups[1]["lr"] = -1.0
        self.assertRefused(grpc.StatusCode.INVALID_ARGUMENT,
                           r"^param_groups\[1\]\['lr'\]: -1\.0 must be >= 0", opt.step)
        self.assertEqual(c.get_weight("param0", dequantized=False).info.last_step, 3)
        c.close()

    def test_parameters_kept_in_torch_get_torch_s_update(self):
        c = client()
        lin = torch.nn.Linear(32, 16)
        twin = torch.nn.Linear(32, 16)
        twin.load_state_dict(lin.state_dict())
        opt = fp4q.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3,
                             nesterov=True, client=c)
        ref = torch.optim.SGD([twin.bias], lr=0.1, momentum=0.9, weight_decay=1e-3,
                              nesterov=True)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=1, gamma=0.5)
        x, w = randn(8, 32, seed=50), randn(8, 16, seed=51)
        for _ in range(3):
            for m, o in ((lin, opt), (twin, ref)):
                o.zero_grad()
                (m(x) * w).sum().backward()  # the bias' gradient: w.sum(0), whatever W is
                o.step()
            sched.step()
            ref_sched.step()
        self.assertSameBits(lin.bias.detach(), twin.bias.detach())
        self.assertEqual(c.get_weight("param0", dequantized=False).info.last_step, 3)
        c.close()

    def test_add_param_group_creates_the_new_weights(self):
        c = client()
        a0, b0 = randn(16, 32, seed=55), randn(16, 48, seed=56)
        a, b = torch.nn.Parameter(a0.clone()), torch.nn.Parameter(b0.clone())
        bias = torch.nn.Parameter(torch.zeros(16))
        opt = fp4q.optim.SGD([("a", a)], lr=0.1, client=c)
        opt.add_param_group({"params": [("b", b), ("bias", bias)], "lr": 0.01})
        self.assertEqual(opt.stored_names, {0: "a", 1: "b"})
        self.assertEqual(opt.torch_parameters, {2: "1-D (stored weights are 2-D)"})
        self.assertEqual(sorted(t.name for t in c.list_tensors()), ["a", "b"])
        with self.assertRaises(ValueError):  # torch's own check: a parameter in two groups
            opt.add_param_group({"params": [a]})
        _, db, rb = ref_create(b0)
        gb = randn(16, 48, seed=57)
        a.grad, b.grad, bias.grad = torch.zeros(16, 32), gb.clone(), torch.ones(16)
        opt.step()
        _, db, _ = ref_sgd_step(db, rb, gb, 0.01)
        self.assertSameBits(b.detach(), torch.from_numpy(db))
        self.assertSameBits(bias.detach(), torch.full((16,), -0.01))
        c.close()

    def test_fixed_state_cannot_change_and_closures_work(self):
        c = client()
        p = torch.nn.Parameter(randn(16, 32, seed=60))
        opt = fp4q.optim.SGD([p], lr=0.1, client=c)  # momentum 0: no buffer on the server
        opt.param_groups[0]["momentum"] = 0.9
        p.grad = torch.ones(16, 32)
        self.assertRefused(grpc.StatusCode.INVALID_ARGUMENT,
                           r"^param_groups\[0\]: sgd with a momentum buffer, but its weights "
                           r"were created for sgd \(fixed at construction: whether momentum is "
                           r"> 0\)$", opt.step)
        opt.param_groups[0]["momentum"] = 0.0

        self.assertEqual(c.get_weight("param0", dequantized=False).info.last_step, 0)

        def closure():
            opt.zero_grad()
            loss = (p * p).sum()
            loss.backward()
            return loss
        before = p.detach().clone()
        loss = opt.step(closure)
        self.assertEqual(float(loss), float((before * before).sum()))
        self.assertEqual(c.get_weight("param0", dequantized=False).info.last_step, 1)
        c.close()


class TrainingTest(Assertions):
    """The examples' models: round-to-nearest stalls, error feedback learns, AdamW tracks
    torch's AdamW on fp32 master weights."""

    def sgd_run(self, **kwargs):
        c = client()
        model, x, y = M.linear_problem()
        opt = fp4q.optim.SGD(model.parameters(), lr=0.02, client=c, **kwargs)
        q0 = c.get_weight("param0", quantized=True).quantized
        losses = M.train(model, opt, M.linear_loss, x, y, 200)
        q = c.get_weight("param0", quantized=True).quantized
        moved = float((torch.stack((q.codes & 15, q.codes >> 4)) !=
                       torch.stack((q0.codes & 15, q0.codes >> 4))).float().mean())
        c.close()
        return losses, moved

    def test_linear_regression_rtn_stalls_error_feedback_learns(self):
        model, x, y = M.linear_problem()
        fp32 = M.train(model, torch.optim.SGD(model.parameters(), lr=0.02), M.linear_loss, x, y,
                       200)
        rtn, rtn_moved = self.sgd_run(error_feedback=False)
        ef, ef_moved = self.sgd_run(error_feedback=True)
        sr, sr_moved = self.sgd_run(error_feedback=False, rounding="stochastic", seed=3)
        floor = M.loss_floor(M.linear_problem)
        print("\nlinear regression, 200 SGD steps (start, final, codes moved): fp32 %.4f %.4f; "
              "RTN %.4f %.4f %.3f; RTN+EF %.4f %.4f %.3f; SR %.4f %.4f %.3f; 4-bit floor %.4f" % (
                  fp32[0], fp32[-1], rtn[0], rtn[-1], rtn_moved, ef[0], ef[-1], ef_moved,
                  sr[0], sr[-1], sr_moved, floor))
        self.assertLess(fp32[-1], 0.01 * fp32[0])
        self.assertLess(rtn_moved, 0.05)                 # the updates are rounded away
        self.assertGreater(rtn[-1], 0.99 * rtn[0])       # so the loss does not go down
        self.assertGreater(ef_moved, 0.5)
        self.assertLess(ef[-1], 0.1 * ef[0])             # error feedback learns
        self.assertLess(ef[-1], 2 * floor)               # to near what 4 bits can hold
        self.assertLess(sr[-1], 0.2 * sr[0])             # stochastic rounding learns, slower
        self.assertGreater(sr[-1], ef[-1])

    def test_mlp_sgd_with_momentum_and_error_feedback_learns(self):
        c = client()
        model, x, y = M.mlp_problem()
        twin, _, _ = M.mlp_problem()
        opt = fp4q.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, client=c)
        q = M.train(model, opt, M.mlp_loss, x, y, 150)
        f = M.train(twin, torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9), M.mlp_loss,
                    x, y, 150)
        floor = M.loss_floor(M.mlp_problem)
        print("\nMLP, 150 SGD momentum steps: fp32 %.5f -> %.5f, fp4q RTN+EF %.5f -> %.5f, "
              "4-bit floor %.5f" % (f[0], f[-1], q[0], q[-1], floor))
        self.assertLess(q[-1], 0.1 * q[0])
        self.assertLess(q[-1], f[-1] + 1.5 * floor)
        c.close()

    def test_adamw_tracks_torch_adamw_on_fp32_master_weights(self):
        for problem, loss_fn in ((M.linear_problem, M.linear_loss), (M.mlp_problem, M.mlp_loss)):
            floor = M.loss_floor(problem)
            for state_dtype in ("f32", "bf16"):
                with self.subTest(problem=problem.__name__, state_dtype=state_dtype):
                    c = client()
                    model, x, y = problem()
                    twin, _, _ = problem()
                    opt = fp4q.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2,
                                           state_dtype=state_dtype, client=c)
                    q = M.train(model, opt, loss_fn, x, y, 150)
                    f = M.train(twin, torch.optim.AdamW(twin.parameters(), lr=3e-3,
                                                        weight_decay=1e-2), loss_fn, x, y, 150)
                    # At every step fp4q's loss is torch's plus at most twice the 4-bit floor
                    # (the loss of the teacher itself rounded to NVFP4): torch's fp32 masters
                    # go to 0, 4-bit weights to about that floor.
                    gap = max(a - b for a, b in zip(q, f))
                    print("\n%s AdamW (%s moments), 150 steps: torch %.5f -> %.5f, fp4q %.5f -> "
                          "%.5f, 4-bit floor %.5f, largest excess %.4f; at steps 0/10/30/60/150: "
                          "torch %s fp4q %s" % (
                              problem.__name__, state_dtype, f[0], f[-1], q[0], q[-1], floor, gap,
                              ["%.4f" % f[k] for k in (0, 10, 30, 60, 150)],
                              ["%.4f" % q[k] for k in (0, 10, 30, 60, 150)]))
                    self.assertLess(gap, 2 * floor)
                    self.assertLess(q[-1], 2 * floor)
                    self.assertLess(q[10], 1.5 * f[10])  # the same descent
                    st = c.get_weight("param0", dequantized=False, optimizer_state=True)
                    self.assertEqual(st.optimizer_state.steps, 150)
                    self.assertEqual(sorted(st.optimizer_state.moments),
                                     ["exp_avg", "exp_avg_sq"])
                    self.assertEqual(st.optimizer_state.moments["exp_avg"].dtype,
                                     torch.float32 if state_dtype == "f32" else torch.bfloat16)
                    c.close()

    def test_bf16_models_and_autocast_train(self):
        c = client()
        model, x, y = M.mlp_problem()
        model = model.to(torch.bfloat16)
        opt = fp4q.optim.AdamW(model.parameters(), lr=3e-3, client=c)
        losses = M.train(model, opt, M.mlp_loss, x.to(torch.bfloat16), y.to(torch.bfloat16), 60)
        self.assertEqual(model.w1.dtype, torch.bfloat16)
        self.assertLess(losses[-1], 0.5 * losses[0])
        model, x, y = M.mlp_problem()
        opt = fp4q.optim.AdamW(model.parameters(), lr=3e-3, client=client())

        def autocast_loss(m, xx, yy):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return M.mlp_loss(m, xx, yy).float()
        losses = M.train(model, opt, autocast_loss, x, y, 60)
        self.assertEqual(model.w1.grad.dtype, torch.float32)
        self.assertLess(losses[-1], 0.5 * losses[0])
        c.close()


class Small(torch.nn.Module):
    """A stored [32, 64] weight and a bias kept in torch."""

    def __init__(self, seed):
        super().__init__()
        self.w = torch.nn.Parameter(randn(32, 64, seed=seed, scale=0.2))
        self.b = torch.nn.Parameter(randn(32, seed=seed + 1))


def set_grads(model, k):
    for i, p in enumerate(model.parameters()):
        p.grad = randn(*p.shape, seed=1000 + 10 * k + i, scale=0.5)


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


class FastSocketTest(Assertions):
    def test_steps_over_the_fast_socket_equal_grpc_s(self):
        fast_path = fp4q_testing.socket_path("fast.sock")
        server = fp4q_testing.Server("--fast_socket", fast_path)
        try:
            results = []
            for fast in (fast_path, ""):
                c = fp4q.Client(server.target, timeout=60, fast_socket=fast,
                                namespace="fs-%d" % len(results))
                model, x, y = M.mlp_problem()
                opt = fp4q.optim.AdamW(model.parameters(), lr=3e-3, client=c)
                before = dict(c.stats)
                M.train(model, opt, M.mlp_loss, x, y, 5)
                results.append((model, {k: c.stats[k] - before.get(k, 0) for k in c.stats}))
                c.close()
            (fm, fstats), (gm, gstats) = results
            self.assertSameBits(fm.w1.detach(), gm.w1.detach())
            self.assertSameBits(fm.w2.detach(), gm.w2.detach())
            self.assertEqual((fstats.get("fast_socket_calls"), fstats.get("fast_socket_fallbacks",
                                                                          0)), (5, 0))
            self.assertEqual(gstats.get("fast_socket_calls", 0), 0)
        finally:
            server.stop()
            shutil.rmtree(os.path.dirname(fast_path), ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
