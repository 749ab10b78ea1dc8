"""fp4q.optim.SGD / AdamW against a live CPU-backend fp4qd (inline tensors): what is stored,
each step's exact values against tests/python/fp4q_reference.py, training the examples' models
(round-to-nearest stalls, error feedback learns; AdamW tracks torch's fp32 AdamW), param groups,
schedulers, torch-side parameters, validation, steps over the fast socket. state_dict round trips
and restarts: test_optim_state.py; replica groups, namespaces and retries: test_optim_groups.py."""

import inspect
import os
import shutil
import unittest

import grpc
import numpy as np
import torch
from torch.optim import optimizer as torch_optimizer

import fp4q
import fp4q_reference as R
import fp4q_testing
import optim_models as M
import optim_testing
from optim_testing import Assertions, client, randn


def setUpModule():
    optim_testing.start_server()


def tearDownModule():
    optim_testing.stop_server()


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
            (lambda: fp4q.optim.SGD(p, lr=0.1, overlap=1, client=c),
             r"^overlap: 1 is not a bool$"),
            (lambda: fp4q.optim.AdamW(p, ready_signal="yes", client=c),
             r"^ready_signal: 'yes' is not a bool$"),
            (lambda: fp4q.optim.AdamW(p, overlap=True, client=c),
             r"^overlap: True needs a server that offers cuda_ipc and step_done_signal to this "
             r"client \(fp4qd --allow_cuda_ipc on the CUDA backend, reached over its Unix "
             r"socket\); it lists \['adamw', "),
        ]
        if inspect.signature(torch.optim.SGD).parameters["lr"].default in (
                inspect.Parameter.empty, torch_optimizer.required):
            # this torch has no default learning rate (newer ones have 1e-3, and so has fp4q then)
            bad.append((lambda: fp4q.optim.SGD(p, client=c), r"^lr: required \(torch\.optim\."
                        r"SGD has no default; give lr= or each param group's 'lr'\)$"))
        for fn, pattern in bad:
            with self.subTest(pattern):
                self.assertClientRefused(pattern, fn)
        self.assertEqual(c.list_tensors(), [])  # nothing was created
        c.close()

    def test_arguments_have_torch_s_names_and_defaults(self):
        import inspect
        for ours, theirs in ((fp4q.optim.SGD, torch.optim.SGD),
                             (fp4q.optim.AdamW, torch.optim.AdamW)):
            a = inspect.signature(ours.__init__).parameters
            b = inspect.signature(theirs.__init__).parameters
            positional = [n for n, p in b.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
            with self.subTest(ours.__name__):
                # torch's positional arguments, in torch's order, each with torch's default.
                self.assertEqual([n for n, p in a.items()
                                  if p.kind == p.POSITIONAL_OR_KEYWORD][:len(positional)],
                                 positional)
                for n in positional[1:]:  # after self
                    self.assertEqual(a[n].default, b[n].default, n)

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

    def test_parameters_kept_in_torch_are_stepped_by_torch_s_multi_tensor_calls(self):
        # Momentum without Nesterov: from the second step on (the buffers exist),
        # fp4q._torch_side.sgd_step steps the parameters kept in torch, not torch's step().
        c = client()
        lin = torch.nn.Linear(32, 16)
        twin = torch.nn.Linear(32, 16)
        twin.load_state_dict(lin.state_dict())
        opt = fp4q.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9, dampening=0.1,
                             weight_decay=1e-3, client=c)
        ref = torch.optim.SGD([twin.bias], lr=0.1, momentum=0.9, dampening=0.1,
                              weight_decay=1e-3, foreach=True)
        # On the CPU torch takes its multi-tensor path only with foreach=True (on CUDA with the
        # default None, which the inner optimizer has).
        opt._inner.param_groups[0]["foreach"] = True
        inner_steps = []
        inner_step = opt._inner.step
        opt._inner.step = lambda *a, **k: inner_steps.append(1) or inner_step(*a, **k)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=1, gamma=0.5)
        x, w = randn(8, 32, seed=52), randn(8, 16, seed=53)
        for _ in range(4):
            for m, o in ((lin, opt), (twin, ref)):
                o.zero_grad(set_to_none=True)
                (m(x) * w).sum().backward()
                o.step()
            sched.step()
            ref_sched.step()
            self.assertSameBits(lin.bias.detach(), twin.bias.detach())
        self.assertEqual(len(inner_steps), 1)  # the first step made the momentum buffer
        self.assertSameBits(opt._inner.state[lin.bias]["momentum_buffer"],
                            ref.state[twin.bias]["momentum_buffer"])
        del opt._inner.step
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

    @staticmethod
    def _stepped(seed, steps):
        """A client, one stored [16, 32] parameter and its SGD optimizer after `steps` good steps
        (what is refused after them is checked every step, not only the first)."""
        c = client()
        p = torch.nn.Parameter(randn(16, 32, seed=seed))
        opt = fp4q.optim.SGD([p], lr=0.1, client=c)
        p.grad = torch.ones(16, 32)
        for _ in range(steps):
            opt.step()
        return c, p, opt

    def test_bad_gradients_are_refused_before_anything_is_sent(self):
        c, p, opt = self._stepped(61, 1)
        p.grad = torch.ones(16, 32).to_sparse()
        self.assertClientRefused(r"^parameter 0 \('param0'\): sparse gradients are not supported$",
                                 opt.step)
        p.grad = None
        p.data = p.data.to(torch.float64)
        p.grad = torch.ones(16, 32, dtype=torch.float64)
        self.assertClientRefused(
            r"^parameter 0 \('param0'\): the parameter is torch.float64 now, but its weight was "
            r"created torch.float32 \(convert the model before building the optimizer\)$",
            opt.step)
        self.assertEqual(c.get_weight("param0", dequantized=False).info.last_step, 1)
        c.close()

    def test_fixed_state_is_checked_after_good_steps_too(self):
        c, p, opt = self._stepped(62, 2)
        opt.param_groups[0]["momentum"] = 0.9
        self.assertRefused(grpc.StatusCode.INVALID_ARGUMENT,
                           r"^param_groups\[0\]: sgd with a momentum buffer, but its weights "
                           r"were created for sgd", opt.step)
        opt.param_groups[0]["momentum"] = 0.0
        opt.step()
        self.assertEqual(c.get_weight("param0", dequantized=False).info.last_step, 3)
        # The last step's hyperparameters are reused only while the values are those checked.
        opt.param_groups[0]["lr"] = -0.5
        self.assertClientRefused(r"^param_groups\[0\]\['lr'\]: -0.5 must be >= 0 "
                                 r"\(Invalid learning rate\)$", opt.step)
        # A new lr alone (a scheduler's step) is checked as a whole group is.
        opt.param_groups[0]["lr"] = float("nan")
        self.assertClientRefused(r"^param_groups\[0\]\['lr'\]: nan is not finite$", opt.step)
        opt.param_groups[0]["lr"] = True
        self.assertClientRefused(r"^param_groups\[0\]\['lr'\]: True is not a number$",
                                 opt.step)
        opt.param_groups[0]["lr"] = torch.tensor(0.05)  # not a plain number: checked every step
        opt.step()
        opt.step()
        self.assertEqual(c.get_weight("param0", dequantized=False).info.last_step, 5)
        opt.param_groups[0]["lr"] = torch.tensor(float("nan"))
        self.assertClientRefused(r"^param_groups\[0\]\['lr'\]: nan is not finite$", opt.step)
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

    def test_step_runs_hooks_without_grad_and_names_itself_to_the_profiler(self):
        c = client()
        p = torch.nn.Parameter(randn(16, 32, seed=61))
        opt = fp4q.optim.SGD([p], lr=0.1, client=c, name_prefix="hooks_")
        self.assertIs(type(opt).step, fp4q.optim.SGD.step)  # not wrapped again by torch
        seen = []

        def closure():
            seen.append(("closure", torch.is_grad_enabled()))
            return torch.tensor(3.0)
        p.grad = torch.ones(16, 32)
        if hasattr(opt, "register_step_pre_hook"):  # torch >= 2.0
            def pre(o, args, kwargs):
                seen.append(("pre", o is opt, len(args), torch.is_grad_enabled()))
                return (), {"closure": closure}  # the hook replaces the arguments
            opt.register_step_pre_hook(pre)
            opt.register_step_post_hook(
                lambda o, args, kwargs: seen.append(("post", sorted(kwargs))))
            loss = opt.step(lambda: self.fail("the pre hook replaced this closure"))
            self.assertEqual(seen, [("pre", True, 1, True), ("closure", True), ("post", ["closure"])])
        else:
            loss = opt.step(closure)
            self.assertEqual(seen, [("closure", True)])
        self.assertEqual(float(loss), 3.0)
        self.assertTrue(torch.is_grad_enabled())  # restored after the step
        self.assertEqual(c.get_weight("hooks_param0", dequantized=False).info.last_step, 1)

        seen.clear()
        with torch.autograd.profiler.profile() as prof:
            opt.step(closure)
        self.assertIn("Optimizer.step#SGD.step", [e.name for e in prof.function_events])
        self.assertEqual(c.get_weight("hooks_param0", dequantized=False).info.last_step, 2)

        def bad(o, args, kwargs):
            return "no"
        if hasattr(opt, "register_step_pre_hook"):
            handle = opt.register_step_pre_hook(bad)
            with self.assertRaisesRegex(RuntimeError, "must return None or a tuple"):
                opt.step()
            handle.remove()
            self.assertEqual(c.get_weight("hooks_param0", dequantized=False).info.last_step, 2)
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


class OnePassTest(Assertions):
    """one_pass=True (fp4q.v1.StepRequest.one_pass): the same values as two-pass steps, counted
    in one_pass_steps; steps it cannot take run in two; its arguments are checked."""

    def test_one_pass_steps_equal_two_pass_steps(self):
        c = client()
        w0 = randn(48, 64, seed=60)
        runs = []
        for one_pass in (True, False):
            p = torch.nn.Parameter(w0.clone())
            opt = fp4q.optim.SGD([p], lr=0.05, scaling="delayed", rounding="stochastic",
                                 seed=3, one_pass=one_pass, name_prefix="op%d/" % one_pass,
                                 client=c)
            values = []
            for step in range(1, 6):
                p.grad = randn(48, 64, seed=60 + step)
                opt.step()
                values.append(p.detach().clone())
            # A group with weight decay is not plain SGD: that step runs in two passes.
            opt.param_groups[0]["weight_decay"] = 0.01
            p.grad = randn(48, 64, seed=70)
            opt.step()
            values.append(p.detach().clone())
            runs.append((values, opt.one_pass_steps, opt.two_pass_reasons))
        (one, one_count, one_why), (two, two_count, two_why) = runs
        for step, (a, b) in enumerate(zip(one, two), 1):
            self.assertSameBits(a, b, "step %d" % step)
        self.assertEqual((one_count, two_count), (5, 0))
        # fp4qd's reason for the two-pass step (StepResult.one_pass_outcome); none counted
        # where one pass was not asked.
        self.assertEqual((one_why, two_why), ({"items": 1}, {}))
        c.close()

    def test_a_refused_one_pass_step_changes_nothing(self):
        c = client()
        p = torch.nn.Parameter(randn(16, 32, seed=80))
        opt = fp4q.optim.SGD([p], lr=0.1, scaling="delayed", one_pass=True, client=c)
        p.grad = randn(16, 32, seed=81)
        opt.step()
        before = p.detach().clone()
        stored = c.get_weight("param0", quantized=True, residual=True)
        g = randn(16, 32, seed=82)
        g[3, 5] = float("nan")
        p.grad = g
        with self.assertRaises(fp4q.Fp4qError) as e:
            opt.step()
        self.assertIn("element 101 is NaN", str(e.exception))
        self.assertSameBits(p.detach(), before)
        after = c.get_weight("param0", quantized=True, residual=True)
        self.assertEqual(after.quantized.codes.numpy().tobytes(),
                         stored.quantized.codes.numpy().tobytes())
        self.assertSameBits(after.residual, stored.residual)
        self.assertEqual(opt.one_pass_steps, 1)
        c.close()

    def test_one_pass_arguments_are_checked(self):
        c = client()
        p = torch.nn.Parameter(randn(16, 32, seed=90))
        with self.assertRaisesRegex(fp4q.ClientArgumentError, "one_pass: 'yes' is not a bool"):
            fp4q.optim.SGD([p], lr=0.1, scaling="delayed", one_pass="yes", client=c)
        with self.assertRaisesRegex(fp4q.ClientArgumentError,
                                    "one_pass: True needs scaling='delayed' and block='1x16' "
                                    r"\(got scaling='current'"):
            fp4q.optim.SGD([p], lr=0.1, one_pass=True, client=c)
        self.assertEqual(c.list_tensors(), [])  # nothing was created
        c.close()


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
                if fast:
                    fast_round_trip = dict(c._fast._last_round_trip)
                    fast_on_cpu = c._fast.server_on_cpu
                c.close()
            (fm, fstats), (gm, gstats) = results
            self.assertSameBits(fm.w1.detach(), gm.w1.detach())
            self.assertSameBits(fm.w2.detach(), gm.w2.detach())
            self.assertEqual((fstats.get("fast_socket_calls"), fstats.get("fast_socket_fallbacks",
                                                                          0)), (5, 0))
            self.assertEqual(gstats.get("fast_socket_calls", 0), 0)
            # The default client timed each step's round trip (the last kept), and learnt that
            # this server's steps run on the CPU backend, whose replies it does not poll for.
            self.assertGreater(fast_round_trip["Step"], 0.0)
            self.assertTrue(fast_on_cpu)
            self.assertEqual((fstats.get("fast_socket_polled", 0),
                              fstats.get("fast_socket_polled_then_slept", 0)), (0, 0))
        finally:
            server.stop()
            shutil.rmtree(os.path.dirname(fast_path), ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
