"""Step plans (fp4q._step_plans.StepPlans, fp4q._regions' TransferPlan): a trainer's repeated Step
reuses its items' encoding when every tensor is a slice of the same allocations, and builds it
afresh when anything it rests on changed; brief replies; fp4q.optim's keyed steps. The driver,
the server and the CUDA tensors are fakes (step_testing.py): no GPU, no server."""

import unittest
from unittest import mock

import grpc
import torch

import fp4q
from fp4q import _cuda_driver, _step_plans
from fp4q._messages import pb
from step_testing import GRADS, PARAMS, FakeCudaTensor, StepFixture


class StepPlanTest(StepFixture, unittest.TestCase):

    def test_a_repeated_step_reuses_its_items_with_one_driver_call_per_allocation(self):
        self.step(1)
        first = dict(self.driver_calls)
        self.assertEqual(first["export"], 2)  # one registration per allocation
        self.driver_calls.clear()
        result = self.step(2, lr=0.05)
        self.assertEqual(dict(self.driver_calls), {"buffer id": 2})  # not one per tensor (6)
        self.assertEqual(self.stats["step_plans_reused"], 1)
        self.assertEqual([r.last_step for r in result.items], [2, 2, 2])
        a, b = self.sent
        # The same items (regions and offsets); the head is the new step's.
        self.assertEqual(list(a.items), list(b.items))
        self.assertEqual((a.step, b.step), (1, 2))
        self.assertAlmostEqual(b.groups[0].lr, 0.05)
        self.assertEqual(len(b.groups), 1)
        self.assertEqual([it.update.region.offset for it in b.items], [0, 0x1000, 0x2000])
        self.assertEqual({it.update.region.region_id for it in b.items}, {"region-1"})
        self.assertEqual({it.dequantized_out.region.region_id for it in b.items}, {"region-2"})
        self.assertEqual(self.stats["ipc_tensors"], 12)  # counted on both paths
        # A server that does not list "step_plans" is never asked to keep one.
        self.assertFalse(any(r.keep_plan or r.plan_id for r in self.sent))

    def test_a_tensor_moved_within_the_plans_allocations_reslices_the_step(self):
        self.step(1)
        grads = list(self.grads)
        grads[1] = FakeCudaTensor(GRADS + 0x8000)
        self.driver_calls.clear()
        self.step(2, items=self.items(grads=grads))
        self.assertEqual(dict(self.driver_calls), {"buffer id": 2})  # none per tensor
        self.assertEqual((self.stats["step_plans_reused"], self.stats["step_plans_resliced"]),
                         (1, 1))
        self.assertEqual([it.update.region.offset for it in self.sent[1].items],
                         [0, 0x8000, 0x2000])

    def test_a_tensor_moved_elsewhere_builds_the_step_afresh(self):
        self.step(1)
        self.allocs[0x400000] = (0x100000, b"N" * 64, 13)
        grads = list(self.grads)
        grads[1] = FakeCudaTensor(0x400000 + 0x100)
        self.step(2, items=self.items(grads=grads))
        self.assertEqual(self.stats["step_plans_reused"], 0)
        self.assertEqual(self.sent[1].items[1].update.region.offset, 0x100)
        self.assertEqual(self.sent[1].items[1].update.region.region_id, "region-3")

    def test_a_reallocated_allocation_is_not_trusted(self):
        self.step(1)
        self.allocs[GRADS] = (0x100000, b"H" * 64, 99)  # freed and made again at the same base
        self.step(2)
        self.assertEqual(self.stats["step_plans_reused"], 0)
        # Exported and registered again: the new allocation's region.
        self.assertEqual({it.update.region.region_id for it in self.sent[1].items}, {"region-3"})
        # That step's Transfer saw a region leave (the stale one): its plan is not trusted
        # either; the next one is.
        self.step(3)
        self.assertEqual(self.stats["step_plans_reused"], 0)
        self.step(4)
        self.assertEqual(self.stats["step_plans_reused"], 1)

    def test_a_lost_session_or_a_restarted_server_builds_the_step_afresh(self):
        self.step(1)
        self.regions.clear()  # the session that held the regions is gone
        self.step(2)
        self.assertEqual(self.stats["step_plans_reused"], 0)
        self.regions.forget_server_info()  # the server restarted
        self.step(3)
        self.assertEqual(self.stats["step_plans_reused"], 0)
        self.step(4)
        self.assertEqual(self.stats["step_plans_reused"], 1)

    def test_a_driver_failure_or_disabled_ipc_builds_the_step_afresh(self):
        self.step(1)
        plan = self.requests._step_plans.get(_step_plans._step_plan_key(self.items())).plan
        failed = _cuda_driver.DriverError("CUDA_ERROR_DEINITIALIZED")
        with mock.patch.object(_cuda_driver, "allocation_identity", side_effect=failed), \
                mock.patch.object(_cuda_driver, "buffer_id", side_effect=failed):
            self.assertFalse(self.regions.plan_valid(plan))
        self.regions.mode = "never"
        self.assertFalse(self.regions.plan_valid(plan))
        self.regions.mode = "auto"
        self.assertTrue(self.regions.plan_valid(plan))

    def test_the_plan_check_reads_each_allocations_buffer_id(self):
        self.step(1)
        plan = self.requests._step_plans.get(_step_plans._step_plan_key(self.items())).plan
        self.driver_calls.clear()
        self.assertTrue(self.regions.plan_valid(plan))
        self.assertEqual(dict(self.driver_calls), {"buffer id": 2})
        # Where the singular call fails (a thread without a context, say) the plural one
        # decides, allocation by allocation.
        self.driver_calls.clear()
        with mock.patch.object(_cuda_driver, "buffer_id",
                               side_effect=_cuda_driver.DriverError("CUDA_ERROR_INVALID_CONTEXT")):
            self.assertTrue(self.regions.plan_valid(plan))
        self.assertEqual(dict(self.driver_calls), {"identity": 2})
        # The gradients' allocation freed and made again at the same address and size: a new
        # buffer id, and the plan no longer holds (nothing else asked).
        size, handle, _ = self.allocs[GRADS]
        self.allocs[GRADS] = (size, handle, 21)
        self.driver_calls.clear()
        self.assertFalse(self.regions.plan_valid(plan))
        self.assertEqual(dict(self.driver_calls), {"buffer id": 1})
        # Freed and not made again: the singular call fails, so does the plural one's id.
        del self.allocs[GRADS]
        self.driver_calls.clear()
        self.assertFalse(self.regions.plan_valid(plan))
        self.assertEqual(dict(self.driver_calls), {"buffer id": 1, "identity": 1})

    def test_requests_that_are_not_all_direct_slices_are_not_kept(self):
        cpu = [fp4q.StepItem(name="w0", update=torch.ones(32, 16))]
        self.assertIsNone(_step_plans._step_plan_key(cpu))
        # An output allocated for the request (return_dequantized into a new tensor, no target)
        # is direct; a missing DQ target on a CUDA update keeps the plan too.
        tr = self.regions.transfer()
        self.assertIsNone(tr.plan())  # nothing sent yet
        tr.input(pb.Tensor(), self.grads[0], "update")
        plan = tr.plan()
        self.assertEqual(plan.allocations, ((0, GRADS, 0x100000, 11, GRADS, "region-1", GRADS),))
        self.assertEqual(plan.locate(GRADS + 0x30), ("region-1", 0x30))
        self.assertIsNone(plan.locate(GRADS + 0x38))  # not a slice's alignment
        self.assertIsNone(plan.locate(GRADS + 0x100000))  # past the allocation
        self.assertEqual(plan.tensors, 1)
        tr.output(pb.OutputTarget(), (2, 16), torch.bfloat16, torch.device("cpu"))
        self.assertIsNone(tr.plan())  # an output planned here: a new tensor each time
        tr.release()
        tr = self.regions.transfer()
        tr.input(pb.Tensor(), torch.ones(2), "update")  # inline bytes
        self.assertIsNone(tr.plan())
        tr.release()

    def test_only_the_last_few_plans_are_kept_and_none_holds_a_tensor(self):
        for k in range(_step_plans.StepPlans.SIZE + 2):
            grads = [FakeCudaTensor(GRADS + 0x10000 * k + 0x1000 * i) for i in range(3)]
            self.step(k + 1, items=self.items(grads=grads))
        plans = self.requests._step_plans._plans
        self.assertEqual(len(plans), _step_plans.StepPlans.SIZE)
        for memo in plans.values():
            self.assertFalse(any(isinstance(v, FakeCudaTensor)
                                 for a in memo.plan.allocations for v in a))
            self.assertIsInstance(memo.body, bytes)

    def test_a_brief_reply_is_asked_for_only_when_no_output_travels_inline(self):
        result = self.step(1, brief=True)
        self.assertTrue(self.sent[0].brief_reply)
        self.assertEqual((result.items, result.applied_items), ([], 3))
        result = self.step(2, brief=True)  # the kept plan
        self.assertEqual(self.stats["step_plans_reused"], 1)
        self.assertTrue(self.sent[1].brief_reply)
        self.assertEqual(list(self.sent[0].items), list(self.sent[1].items))
        self.assertEqual(self.sent[1].step, 2)
        # A DQ(W) target on the CPU comes back inline: the reply must list the items.
        items = self.items()
        items[2] = fp4q.StepItem(name="w2", update=self.grads[2],
                                 dequantized_out=torch.zeros(32, 16, dtype=torch.bfloat16))
        result = self.step(3, brief=True, items=items)
        self.assertFalse(self.sent[2].brief_reply)
        self.assertTrue(self.sent[2].items[2].return_dequantized)
        self.assertEqual([r.name for r in result.items], ["w0", "w1", "w2"])
        self.assertEqual(result.applied_items, 3)
        with self.assertRaisesRegex(fp4q.ClientArgumentError, "brief_reply: 1 is not a bool"):
            self.step(4, brief=1)
        self.assertEqual(len(self.sent), 3)

    def keyed(self, n, grads, built, layout="opt", replica=None):
        def make_items():
            built.append(1)
            return self.items(grads=grads)

        pointers = []
        for g, p in zip(grads, self.params):
            pointers += [g.data_ptr(), p.data_ptr()]
        return self.requests.step_keyed(n, (layout, tuple(pointers)), make_items,
                                        [fp4q.SgdHyperparameters(lr=0.1)], replica)

    def test_a_keyed_step_builds_its_items_only_when_no_plan_of_its_key_holds(self):
        built = []
        for n in (1, 2, 3):
            result = self.keyed(n, self.grads, built)
            self.assertEqual((result.items, result.applied_items), ([], 3))
        self.assertEqual(len(built), 1)
        self.assertEqual(self.stats["step_plans_reused"], 2)
        self.assertEqual([r.step for r in self.sent], [1, 2, 3])
        self.assertTrue(all(r.brief_reply for r in self.sent))
        self.assertEqual([it.name for it in self.sent[2].items], ["w0", "w1", "w2"])
        self.assertEqual([it.update.region.offset for it in self.sent[2].items],
                         [0, 0x1000, 0x2000])
        # Another layout: built again.
        self.keyed(4, self.grads, built, layout="other", replica=("g", 1))
        self.assertEqual(len(built), 2)
        self.assertEqual((self.sent[3].replica.group, self.sent[3].replica.rank), ("g", 1))

    def test_a_server_that_keeps_plans_is_sent_the_items_once_then_their_plan_id(self):
        plans, refuse, _ = self.plan_keeping_server()
        built = []
        for n in (1, 2, 3):
            result = self.keyed(n, self.grads, built)
            self.assertEqual(result.applied_items, 3)
        first, second, third = self.sent
        self.assertEqual((first.keep_plan, first.plan_id, len(first.items)), (True, 0, 3))
        for r in (second, third):
            self.assertEqual((r.keep_plan, r.plan_id, len(r.items), r.brief_reply),
                             (False, 7, 0, True))
        self.assertEqual((second.step, third.step), (2, 3))
        self.assertEqual(self.stats["step_plans_on_server"], 2)
        # The server dropped the plan: the step is sent again with its items, kept anew.
        refuse.append(1)
        self.assertEqual(self.keyed(4, self.grads, built).applied_items, 3)
        refused, resent = self.sent[3:]
        self.assertEqual((refused.plan_id, refused.step), (7, 4))
        self.assertEqual((resent.keep_plan, resent.plan_id, len(resent.items), resent.step),
                         (True, 0, 3, 4))
        self.keyed(5, self.grads, built)
        self.assertEqual((self.sent[5].plan_id, len(self.sent[5].items)), (8, 0))
        # Gradients moved within the allocations: new items, kept as a plan of their own.
        grads = [FakeCudaTensor(GRADS + 0x8000 + 0x1000 * i) for i in range(3)]
        self.keyed(6, grads, built)
        self.keyed(7, grads, built)
        moved, named = self.sent[6:]
        self.assertEqual((moved.keep_plan, [it.update.region.offset for it in moved.items]),
                         (True, [0x8000, 0x9000, 0xA000]))
        self.assertEqual((named.plan_id, len(named.items)), (9, 0))
        self.assertEqual(plans[9], list(moved.items))
        self.assertEqual(len(built), 1)  # never built again: reused, then resliced

    def test_step_named_sends_the_head_of_a_plan_the_server_holds_or_nothing(self):
        plans, refuse, bodies = self.plan_keeping_server()
        groups = [fp4q.SgdHyperparameters(lr=0.1, momentum=0.5)]
        key = ("opt", tuple(x for g, p in zip(self.grads, self.params)
                            for x in (g.data_ptr(), p.data_ptr())))
        # No plan of the key, then a plan the server does not hold yet: nothing sent.
        self.assertIsNone(self.requests.step_named(1, key, groups))
        self.requests.step_keyed(1, key, self.items, groups, None)  # kept as plan 7 and on
        self.requests.step_keyed(2, key, self.items, groups, None)  # the server: named
        self.assertEqual(len(bodies), 2)
        self.stats.clear()
        result = self.requests.step_named(3, key, groups, one_pass=True)
        self.assertEqual((result.items, result.applied_items), ([], 3))
        sent = self.sent[-1]
        self.assertEqual((sent.step, sent.plan_id, sent.brief_reply, sent.one_pass, len(sent.items),
                          sent.groups[0].sgd.momentum), (3, 7, True, True, 0, 0.5))
        self.assertEqual(self.stats, {"ipc_tensors": 6, "step_plans_reused": 1,
                                      "step_plans_on_server": 1, "step_plans_named": 1})
        self.assertEqual(self.driver_calls["buffer id"], 2 * 2)  # an allocation each, steps 2, 3
        # Byte for byte what step_keyed sends for the same step.
        self.requests.step_keyed(3, key, self.items, groups, None, one_pass=True)
        self.assertEqual(bodies[-1], bodies[-2])
        # The same hyperparameter objects: the head's fields kept, only the step number written
        # (fp4q.optim makes a new object for new values); new objects: encoded again.
        encode, sent_before = self.requests._step_heads.encode, len(bodies)
        with mock.patch.object(self.requests._step_heads, "encode", wraps=encode) as encoded:
            self.requests.step_named(2**40, key, groups, one_pass=True)
            self.assertEqual(encoded.call_count, 0)
            self.requests.step_keyed(2**40, key, self.items, groups, None, one_pass=True)
            self.assertEqual(bodies[-1], bodies[-2])
            encoded.reset_mock()
            lower = [fp4q.SgdHyperparameters(lr=0.25, momentum=0.5)]
            self.requests.step_named(2**40 + 1, key, lower, one_pass=True)
            self.assertEqual((self.sent[-1].step, self.sent[-1].groups[0].lr),
                             (2**40 + 1, 0.25))
            self.assertEqual(encoded.call_count, 1)
            with self.assertRaises(ValueError):  # outside int64, as the library refuses it
                self.requests.step_named(2**63, key, lower, one_pass=True)
        del bodies[sent_before:], self.sent[sent_before:]  # the counts below as before
        # An allocation made anew (a new buffer id): not this path, nothing sent.
        size, handle, _ = self.allocs[GRADS]
        self.allocs[GRADS] = (size, handle, 99)
        self.assertIsNone(self.requests.step_named(4, key, groups))
        self.allocs[GRADS] = (size, handle, 11)
        self.assertEqual(len(bodies), 4)
        # A server that dropped the plan: None, nothing applied, the ids forgotten, so that
        # step_keyed sends the items again.
        refuse.append(1)
        self.assertIsNone(self.requests.step_named(4, key, groups))
        self.assertEqual((self.sent[-1].plan_id, len(bodies)), (7, 5))
        self.assertIsNone(self.requests.step_named(4, key, groups))
        self.assertEqual(len(bodies), 5)
        self.requests.step_keyed(4, key, self.items, groups, None)
        self.assertEqual((self.sent[-1].keep_plan, len(self.sent[-1].items)), (True, 3))
        self.assertEqual(self.requests.step_named(5, key, groups).applied_items, 3)
        self.assertEqual(self.sent[-1].plan_id, 8)
        # Any other refusal is the caller's to handle.
        with mock.patch.object(self.requests, "_send", side_effect=fp4q.Fp4qError(
                grpc.StatusCode.INVALID_ARGUMENT, "step 6: items[1].update: element 9 is NaN",
                "Step")):
            with self.assertRaisesRegex(fp4q.Fp4qError, "element 9 is NaN"):
                self.requests.step_named(6, key, groups)
        self.assertEqual(self.requests.step_named(6, key, groups).applied_items, 3)

    def test_gradients_moved_within_known_allocations_reslice_the_layouts_items(self):
        built = []
        self.keyed(1, self.grads, built)
        # New gradient tensors each step (zero_grad(set_to_none=True)): other offsets of the
        # same allocation. No item is built and no tensor resolved: one driver call per
        # allocation.
        moved = [FakeCudaTensor(GRADS + 0x40000 + 0x2000 * i) for i in range(3)]
        self.driver_calls.clear()
        self.keyed(2, moved, built)
        self.assertEqual(len(built), 1)
        self.assertEqual(dict(self.driver_calls), {"buffer id": 2})
        self.assertEqual(self.stats["step_plans_resliced"], 1)
        self.assertEqual([it.update.region.offset for it in self.sent[1].items],
                         [0x40000, 0x42000, 0x44000])
        self.assertEqual([it.dequantized_out.region.offset for it in self.sent[1].items],
                         [0, 0x1000, 0x2000])
        self.assertEqual([it.name for it in self.sent[1].items], ["w0", "w1", "w2"])
        self.assertEqual({it.update.region.region_id for it in self.sent[1].items},
                         {"region-1"})
        # The moved key is kept too: the next step at those addresses is a plain reuse.
        self.keyed(3, moved, built)
        self.assertEqual((len(built), self.stats["step_plans_resliced"]), (1, 1))
        # A gradient in an allocation the plan does not hold, or misaligned: built afresh.
        self.allocs[0x400000] = (0x100000, b"N" * 64, 13)
        outside = [moved[0], FakeCudaTensor(0x400000), moved[2]]
        self.keyed(4, outside, built)
        self.assertEqual(len(built), 2)
        self.assertEqual(self.sent[3].items[1].update.region.region_id, "region-3")
        plans = self.requests._step_plans
        skewed = (GRADS + 0x50008, PARAMS) + (GRADS, PARAMS + 0x1000) * 2
        self.assertIsNone(plans.resliced("opt", skewed, ("opt", skewed), self.regions.plan_valid))
        self.assertIsNone(plans.resliced("opt", skewed[:4], ("opt", skewed[:4]),
                                         self.regions.plan_valid))  # not one pair per item


if __name__ == "__main__":
    unittest.main()
