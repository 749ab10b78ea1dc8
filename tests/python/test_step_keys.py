"""fp4q.optim's key of its step's items (StepMixin._step_key) and the re-sliced items'
encoding (fp4q._step_plans._SlicedItems), which a trainer's repeated Step rests on. No GPU, no
server."""

import unittest
import weakref

import torch

import fp4q
from fp4q import _step_plans
from fp4q._messages import pb


class OptimizerStepKeyTest(unittest.TestCase):
    """fp4q.optim's key of its items (StepMixin._step_key): equal while every gradient and
    parameter stays where it was, different when one moves or goes."""

    def setUp(self):
        from fp4q import _stored_optimizer
        from fp4q._optim_step import StepMixin
        self.params = [torch.nn.Parameter(torch.zeros(32, 16)) for _ in range(3)]
        for p in self.params:
            p.grad = torch.ones(32, 16)
        spec = fp4q.OptimizerSpec()
        stored = [_stored_optimizer._Stored(name="w%d" % i, param=p, group=i // 2, index=i,
                                            dtype=p.dtype, spec=spec)
                  for i, p in enumerate(self.params)]
        self.opt = type("Opt", (StepMixin,), {})()
        self.opt._stored, self.opt._plan_token = stored, object()

    def test_the_key_follows_the_tensors(self):
        (layout, pointers), groups = self.opt._step_key()
        self.assertEqual(groups, {0: 0, 1: 1})
        self.assertIs(layout[0], self.opt._plan_token)
        self.assertEqual(layout[1:], ((torch.float32, True, torch.Size([32, 16]), True),) * 3)
        self.assertEqual(pointers, tuple(v for p in self.params
                                         for v in (p.grad.data_ptr(), p.data_ptr())))
        self.assertEqual((layout, pointers), tuple(self.opt._step_key()[0]))
        self.params[1].grad = torch.ones(32, 16)  # a new gradient tensor elsewhere
        (layout2, moved), _ = self.opt._step_key()
        self.assertEqual(layout2, layout)
        self.assertNotEqual(moved[2], pointers[2])
        self.assertEqual(moved[:2] + moved[3:], pointers[:2] + pointers[3:])
        self.params[0].grad = None
        self.params[1].grad = None
        (gone, pointers), groups = self.opt._step_key()
        self.assertEqual((gone[1], gone[2]), (None, None))
        self.assertEqual(len(pointers), 2)
        self.assertEqual(groups, {1: 0})
        self.params[2].data = self.params[2].data.t().contiguous().t()  # same shape, strided
        self.assertEqual(self.opt._step_key()[0][0][3][3], False)

    def test_the_last_key_is_kept_while_nothing_moved(self):
        key, groups = self.opt._step_key()
        again, groups2 = self.opt._step_key()
        self.assertIs(again, key)  # the same object: its hash is not computed again
        self.assertEqual(groups2, groups)
        # A gradient resized in place keeps its address: it is still seen, and refused.
        self.params[0].grad.resize_(16, 16)
        with self.assertRaisesRegex(
                fp4q.ClientArgumentError,
                r"^INVALID_ARGUMENT: parameter 0 \('w0'\): gradient of shape \[16, 16\] for a "
                r"parameter of shape \[32, 16\]"):
            self.opt._step_key()
        self.params[0].grad = torch.ones(32, 16)
        key, _ = self.opt._step_key()
        # The kept key holds no gradient: one set to None is freed (the allocator reuses it).
        ref = weakref.ref(self.params[0].grad)
        self.params[0].grad = None
        self.assertIsNone(ref())
        self.assertIsNone(self.opt._step_key()[0][0][1])
        # A parameter viewed as another dtype in place (same address and shape) is refused as
        # _items refuses it, and so is a sparse gradient.
        self.params[0].grad = torch.ones(32, 16)
        self.opt._step_key()
        grad, data = self.params[0].grad, self.params[0].data
        self.params[0].grad = None
        self.params[0].data = data.view(torch.bfloat16)[:, :16]  # its address, shape [32, 16]
        self.params[0].grad = grad.view(torch.bfloat16)[:, :16]
        self.assertEqual(self.params[0].data_ptr(), data.data_ptr())
        with self.assertRaisesRegex(fp4q.ClientArgumentError,
                                    r"parameter 0 \('w0'\): the parameter is torch.bfloat16 "):
            self.opt._step_key()
        self.params[0].grad = None
        self.params[0].data = data
        self.params[0].grad = grad
        self.params[0].grad = torch.ones(32, 16).to_sparse()
        with self.assertRaisesRegex(fp4q.ClientArgumentError,
                                    r"parameter 0 \('w0'\): sparse gradients are not supported"):
            self.opt._step_key()
        self.params[0].grad = torch.ones(32, 16)
        key, _ = self.opt._step_key()
        # A square gradient transposed in place keeps its address and shape, not its strides.
        sq = torch.nn.Parameter(torch.zeros(16, 16))
        sq.grad = torch.arange(256.0).view(16, 16)
        self.opt._stored[1].param = sq
        (layout, _), _ = self.opt._step_key()
        self.assertEqual(layout[2], (torch.float32, True, torch.Size([16, 16]), True))
        sq.grad.t_()
        (layout, _), _ = self.opt._step_key()
        self.assertEqual(layout[2], (torch.float32, False, torch.Size([16, 16]), True))
        self.opt._stored[1].param = self.params[1]
        key, _ = self.opt._step_key()
        # A parameter added to the optimizer (add_param_group) joins the key.
        from fp4q import _stored_optimizer
        p = torch.nn.Parameter(torch.zeros(48, 16))
        p.grad = torch.ones(48, 16)
        self.opt._stored.append(_stored_optimizer._Stored(
            name="w3", param=p, group=2, index=3, dtype=p.dtype, spec=fp4q.OptimizerSpec()))
        (layout, pointers), groups = self.opt._step_key()
        self.assertEqual(len(layout), 5)
        self.assertEqual(pointers[-2:], (p.grad.data_ptr(), p.data_ptr()))
        self.assertEqual(groups, {0: 0, 1: 1, 2: 2})
        # A gradient set to None leaves the key.
        p.grad = None
        (layout, pointers), groups = self.opt._step_key()
        self.assertEqual((layout[4], len(pointers), groups), (None, 6, {0: 0, 1: 1}))

    def test_keys_of_gradients_that_alternate_between_places_are_kept(self):
        # Two sets of gradient tensors in turn, as torch's allocator hands a backward pass after
        # zero_grad(set_to_none=True): each set's key is found again, the same object.
        sets = [[torch.ones(32, 16) for _ in self.params] for _ in range(2)]

        def use(grads):
            for p, g in zip(self.params, grads):
                p.grad = g
            return self.opt._step_key()

        first = [use(sets[0]), use(sets[1])]
        self.assertNotEqual(first[0][0], first[1][0])
        for round_ in range(3):
            for i in (0, 1):
                key, groups = use(sets[i])
                self.assertIs(key, first[i][0], (round_, i))
                self.assertIs(groups, first[i][1])
        # A kept key is checked in full: one gradient of set 0 moved gives a new key.
        moved = list(sets[0])
        moved[2] = torch.ones(32, 16)
        key, _ = use(moved)
        self.assertNotEqual(key, first[0][0])
        self.assertEqual(key.pointers[4], moved[2].data_ptr())
        # The last RECENT_KEYS keys are kept: set 1 is still there after three more sets, and
        # gone (an equal key, computed afresh) after four.
        extra = [[torch.ones(32, 16) for _ in self.params] for _ in range(4)]
        for grads in extra[:2]:
            use(grads)
        self.assertEqual(self.opt.RECENT_KEYS, 4)
        self.assertIs(use(sets[1])[0], first[1][0])
        for grads in extra:
            use(grads)
        again, _ = use(sets[1])
        self.assertEqual(again, first[1][0])
        self.assertIsNot(again, first[1][0])

    def test_a_bad_gradient_is_refused_as_the_items_refuse_it(self):
        self.opt._stored[1].dtype = torch.bfloat16  # as if the model was converted since
        with self.assertRaisesRegex(
                fp4q.ClientArgumentError,
                r"^INVALID_ARGUMENT: parameter 1 \('w1'\): the parameter is torch.float32 now, "
                r"but its weight was created torch.bfloat16"):
            self.opt._step_key()


class SlicedItemsTest(unittest.TestCase):
    """_step_plans._SlicedItems: a re-sliced step's items spliced from their fixed parts are the
    bytes the protobuf library writes for the template with those slices."""

    def template(self):
        t = pb.StepRequest()
        for i in range(12):
            # Names long enough that some items need a two-byte length; one inline DQ(W) flag.
            m = t.items.add(name="blocks.%d.mlp.fc.weight" % i + "n" * (12 * i), group=i % 3,
                            return_dequantized=i == 4)
            m.update.dtype = pb.DType.DTYPE_BF16 if i % 2 else pb.DType.DTYPE_F32
            m.update.shape.extend([16 * (i + 1), 48 * (i + 1) ** 3])
            m.update.region.region_id, m.update.region.offset = "r-template", 16
            m.dequantized_out.region.region_id = "r-template-out"
            m.dequantized_out.region.offset = 32
        return t

    def reference(self, template, slices):
        ref = pb.StepRequest()
        ref.CopyFrom(template)
        for k, m in enumerate(ref.items):
            m.update.region.region_id, m.update.region.offset = slices[2 * k]
            m.dequantized_out.region.region_id, m.dequantized_out.region.offset = \
                slices[2 * k + 1]
        return ref.SerializeToString()

    def test_spliced_items_are_the_library_encoding_byte_for_byte(self):
        t = self.template()
        enc = _step_plans._SlicedItems(t)
        self.assertEqual(enc.count, 12)
        offsets = [0, 16, 127, 128, 16383, 16384, 2 ** 21 + 48, 2 ** 40 + 16, 2 ** 63 - 16]
        ids = ["r-0", "r-" + "a" * 130, "r-1"]
        rng = __import__("random").Random(7)
        for trial in range(100):
            slices = [(rng.choice(ids), rng.choice(offsets)) for _ in range(24)]
            self.assertEqual(enc.encode(slices), self.reference(t, slices), trial)
        # Every offset zero: RegionSlice.offset is left out, as the library leaves it out.
        zero = [("r-0", 0)] * 24
        self.assertEqual(enc.encode(zero), self.reference(t, zero))
        parsed = pb.StepRequest.FromString(enc.encode(zero))
        self.assertEqual([m.name for m in parsed.items], [m.name for m in t.items])
        self.assertEqual(parsed.items[4].return_dequantized, True)
        self.assertEqual(list(parsed.items[3].update.shape), [64, 48 * 64])

if __name__ == "__main__":
    unittest.main()
