"""fp4q._torch_side.sgd_step: torch.optim.SGD's step made with torch's multi-tensor calls, bit
for bit what torch.optim.SGD.step() gives, and declined (nothing changed) where it is not. No
GPU, no server."""

import copy
import unittest

import torch
from torch.optim import optimizer as torch_optimizer

from fp4q import _torch_side


def _tensors(seed, shapes, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(device=device, dtype=dtype) for s in shapes]


class SgdStepTest(unittest.TestCase):
    """On CPU tensors with foreach=True (torch's multi-tensor path there; with foreach None
    torch loops over the tensors one by one, and sgd_step declines)."""
    SHAPES = ((384,), (1152,), (256, 384), (7,))
    DEVICE = "cpu"
    FOREACH = True

    def twins(self, groups, **hyper):
        """Two SGDs over equal parameters: (ours, torch's, our params, torch's params)."""
        mine, theirs = [], []
        for gi, (shapes, dtype, extra) in enumerate(groups):
            values = _tensors(10 + gi, shapes, dtype, self.DEVICE)
            mine.append(dict(extra, params=[torch.nn.Parameter(v.clone()) for v in values]))
            theirs.append(dict(extra, params=[torch.nn.Parameter(v.clone()) for v in values]))
        if self.FOREACH is not None:
            hyper = dict(hyper, foreach=self.FOREACH)
        a, b = torch.optim.SGD(mine, **hyper), torch.optim.SGD(theirs, **hyper)
        pa = [p for g in mine for p in g["params"]]
        pb = [p for g in theirs for p in g["params"]]
        return a, b, pa, pb

    def grads(self, pa, pb, seed, skip=()):
        for i, (x, y) in enumerate(zip(pa, pb)):
            if i in skip:
                x.grad = y.grad = None
                continue
            g = _tensors(seed * 100 + i, [tuple(x.shape)], x.dtype, self.DEVICE)[0]
            x.grad, y.grad = g.clone(), g.clone()

    def assertSameBits(self, a, b):
        self.assertEqual(a.dtype, b.dtype)
        self.assertTrue(torch.equal(a.view(torch.int16 if a.element_size() == 2 else
                                           torch.int32),
                                    b.view(torch.int16 if b.element_size() == 2 else
                                           torch.int32)), "bits differ")

    def run_steps(self, a, b, pa, pb, steps, skip_at=None, lr_schedule=None):
        """Steps both; from the second step on ours goes through sgd_step, which must take it.
        Returns how many steps sgd_step took."""
        taken = 0
        for k in range(steps):
            if lr_schedule is not None:
                for o in (a, b):
                    for g in o.param_groups:
                        g["lr"] = lr_schedule(k)
            self.grads(pa, pb, k, skip=skip_at.get(k, ()) if skip_at else ())
            with torch.no_grad():
                b.step()
                if _torch_side.sgd_step(a):
                    taken += 1
                else:
                    a.step()
            for x, y in zip(pa, pb):
                self.assertSameBits(x.detach(), y.detach())
                self.assertEqual(sorted(a.state.get(x, {})), sorted(b.state.get(y, {})))
                if y in b.state and "momentum_buffer" in b.state[y]:
                    bx, by = a.state[x]["momentum_buffer"], b.state[y]["momentum_buffer"]
                    if by is None:
                        self.assertIsNone(bx)
                    else:
                        self.assertSameBits(bx, by)
        return taken

    def test_momentum_dampening_weight_decay_match_torch_bit_for_bit(self):
        for hyper in (dict(lr=0.05, momentum=0.9), dict(lr=0.01, momentum=0.9, dampening=0.1),
                      dict(lr=0.02, momentum=0.5, weight_decay=1e-2),
                      dict(lr=0.1, momentum=0.0), dict(lr=0.1, momentum=0.0, weight_decay=0.1)):
            with self.subTest(**hyper):
                a, b, pa, pb = self.twins([(self.SHAPES, torch.float32, {})], **hyper)
                taken = self.run_steps(a, b, pa, pb, 5, lr_schedule=lambda k: 0.1 / (k + 1))
                # With momentum the first step makes the buffers (torch's step() runs); without,
                # it records None ones where this torch does.
                first = hyper["momentum"] or _torch_side._keeps_none_buffers()
                self.assertEqual(taken, 4 if first else 5)

    def test_groups_of_their_own_dtype_and_lr(self):
        a, b, pa, pb = self.twins([(self.SHAPES, torch.float32, {"lr": 0.03}),
                                   (self.SHAPES[:2], torch.bfloat16, {"momentum": 0.8})],
                                  lr=0.01, momentum=0.9, weight_decay=1e-3)
        self.assertEqual(self.run_steps(a, b, pa, pb, 4), 3)

    def test_a_parameter_without_a_gradient_is_left_alone(self):
        a, b, pa, pb = self.twins([(self.SHAPES, torch.float32, {})], lr=0.05, momentum=0.9)
        # Step 2 has no gradient for parameter 1: it keeps its value and buffer, as in torch.
        self.assertEqual(self.run_steps(a, b, pa, pb, 4, skip_at={2: (1,)}), 3)

    def test_a_buffer_made_late_falls_back_to_torch_for_that_step(self):
        a, b, pa, pb = self.twins([(self.SHAPES, torch.float32, {})], lr=0.05, momentum=0.9)
        # Parameter 3 has no gradient at first: no buffer, so step 2 (its first) is torch's.
        taken = self.run_steps(a, b, pa, pb, 4, skip_at={0: (3,), 1: (3,)})
        self.assertEqual(taken, 2)  # steps 1 and 3

    def declined(self, opt, params):
        before = [p.detach().clone() for p in params]
        bufs = {id(p): opt.state[p]["momentum_buffer"].clone()
                for p in params if "momentum_buffer" in opt.state.get(p, {})}
        with torch.no_grad():
            self.assertFalse(_torch_side.sgd_step(opt))
        for p, q in zip(params, before):
            self.assertTrue(torch.equal(p.detach(), q))
        for p in params:
            if id(p) in bufs:
                self.assertTrue(torch.equal(opt.state[p]["momentum_buffer"], bufs[id(p)]))

    def stepped_once(self, groups=None, **hyper):
        a, b, pa, pb = self.twins(groups or [(self.SHAPES, torch.float32, {})], **hyper)
        self.grads(pa, pb, 0)
        a.step()  # the buffers exist
        self.grads(pa, pb, 1)
        return a, pa

    def test_declines_what_is_not_torch_s_multi_tensor_sgd(self):
        # The first step with momentum: no buffers yet.
        a, b, pa, pb = self.twins([(self.SHAPES, torch.float32, {})], lr=0.1, momentum=0.9)
        self.grads(pa, pb, 0)
        self.declined(a, pa)
        # Nesterov momentum.
        a, pa = self.stepped_once(lr=0.1, momentum=0.9, nesterov=True)
        self.declined(a, pa)
        # maximize.
        a, pa = self.stepped_once(lr=0.1, momentum=0.9, maximize=True)
        self.declined(a, pa)
        # A tensor learning rate.
        a, pa = self.stepped_once(lr=0.1, momentum=0.9)
        a.param_groups[0]["lr"] = torch.tensor(0.1)
        self.declined(a, pa)
        # Parameters of two dtypes in one group.
        a, pa = self.stepped_once(lr=0.1, momentum=0.9)
        bf16 = dict(dtype=torch.bfloat16, device=self.DEVICE)
        mixed = torch.nn.Parameter(torch.ones(16, **bf16))
        mixed.grad = torch.ones(16, **bf16)
        a.param_groups[0]["params"].append(mixed)
        a.state[mixed]["momentum_buffer"] = torch.zeros(16, **bf16)
        self.declined(a, pa + [mixed])
        # A sparse gradient.
        a, pa = self.stepped_once(lr=0.1, momentum=0.9)
        pa[0].grad = pa[0].grad.to_sparse()
        self.declined(a, pa)
        # Another optimizer.
        p = torch.nn.Parameter(torch.ones(16, device=self.DEVICE))
        p.grad = torch.ones(16, device=self.DEVICE)
        adamw = torch.optim.AdamW([p], lr=0.1)
        adamw.step()
        self.declined(adamw, [p])

    def test_declines_when_a_step_hook_would_run(self):
        a, pa = self.stepped_once(lr=0.1, momentum=0.9)
        if not hasattr(a, "register_step_pre_hook"):
            self.skipTest("torch %s has no optimizer step hooks" % torch.__version__)
        handle = a.register_step_pre_hook(lambda *args: None)
        self.declined(a, pa)
        handle.remove()
        handle = torch_optimizer.register_optimizer_step_post_hook(lambda *args: None)
        try:
            self.declined(a, pa)
        finally:
            handle.remove()
        with torch.no_grad():
            self.assertTrue(_torch_side.sgd_step(a))  # no hook left

    def test_the_kept_plan_is_reused_and_follows_load_state_dict(self):
        a, b, pa, pb = self.twins([(self.SHAPES, torch.float32, {}),
                                   (self.SHAPES[:2], torch.bfloat16, {"lr": 0.02})],
                                  lr=0.05, momentum=0.9)
        self.assertEqual(self.run_steps(a, b, pa, pb, 3), 2)
        kept = _torch_side._kept[a]
        self.assertEqual(self.run_steps(a, b, pa, pb, 2, lr_schedule=lambda k: 0.01 * (k + 1)),
                         2)
        self.assertIs(_torch_side._kept[a], kept)  # reused, with each step's lr
        # New buffers (and a new state dict) in both: a plan that kept the old ones would step
        # with them, and the results would differ from torch's. Each optimizer gets its own
        # copy: torch 2.x's state_dict() hands out its live state, and its load_state_dict()
        # keeps tensors that need no conversion, so one dict would give both the same buffers.
        state = copy.deepcopy(b.state_dict())
        for entry in state["state"].values():
            entry["momentum_buffer"] = entry["momentum_buffer"] * -3
        a.load_state_dict(copy.deepcopy(state))
        b.load_state_dict(copy.deepcopy(state))
        self.assertEqual(self.run_steps(a, b, pa, pb, 2), 2)
        self.assertIsNot(_torch_side._kept[a], kept)

    def test_a_kept_plan_declines_what_changed_since(self):
        a, b, pa, pb = self.twins([(self.SHAPES, torch.float32, {})], lr=0.05, momentum=0.9)
        self.assertEqual(self.run_steps(a, b, pa, pb, 3), 2)
        self.grads(pa, pb, 7)
        group = a.param_groups[0]
        for change, undo in (
                (lambda: group.update(nesterov=True), lambda: group.update(nesterov=False)),
                (lambda: group.update(lr=torch.tensor(0.05)), lambda: group.update(lr=0.05)),
                (lambda: group.update(foreach=False), lambda: group.update(foreach=self.FOREACH))):
            self.assertIn(a, _torch_side._kept)
            change()
            self.declined(a, pa)
            self.assertNotIn(a, _torch_side._kept)  # dropped: torch's step() runs next
            undo()
            with torch.no_grad():
                self.assertTrue(_torch_side.sgd_step(a))  # built again
            self.grads(pa, pb, 8)
        dense = pa[0].grad
        pa[0].grad = dense.to_sparse()
        self.declined(a, pa)
        pa[0].grad = dense
        with torch.no_grad():
            self.assertTrue(_torch_side.sgd_step(a))
        bf16 = dict(dtype=torch.bfloat16, device=self.DEVICE)
        mixed = torch.nn.Parameter(torch.ones(16, **bf16))
        mixed.grad = torch.ones(16, **bf16)
        group["params"].append(mixed)
        a.state[mixed]["momentum_buffer"] = torch.zeros(16, **bf16)
        self.declined(a, pa + [mixed])

    def test_declines_foreach_false_and_cpu_tensors_without_foreach(self):
        a, pa = self.stepped_once(lr=0.1, momentum=0.9)
        a.param_groups[0]["foreach"] = False
        self.declined(a, pa)
        if self.DEVICE == "cpu":
            a.param_groups[0]["foreach"] = None  # torch's single-tensor loop on the CPU
            self.declined(a, pa)


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA device: torch's multi-tensor path on "
                     "a GPU is checked on GPU machines (bench/results/h200-loop/run9.sh)")
class CudaSgdStepTest(SgdStepTest):
    """On CUDA tensors with foreach None, as fp4q.optim.SGD's inner optimizer has it: torch's
    multi-tensor path (foreach kernels), which sgd_step calls."""
    DEVICE = "cuda"
    FOREACH = None


if __name__ == "__main__":
    unittest.main()
