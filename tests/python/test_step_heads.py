"""fp4q._step_plans.StepHeads: the fields of a Step request before its items, encoded once per
set of hyperparameter values and kept, each encoding parsing to the message the fields make. No
GPU, no server."""

import unittest

import torch

import fp4q
from fp4q import _step_plans
from fp4q._messages import pb


class StepHeadsTest(unittest.TestCase):
    """fp4q._step_plans.StepHeads: a Step's fields before its items, encoded once per set of
    values and kept; each encoding parses to the message the fields make."""

    def message(self, step, groups, kind=0, replica=None, brief=False, keep=False, plan_id=0,
                one_pass=False, signal=None, ready=None):
        req = pb.StepRequest(step=step, kind=kind, brief_reply=brief, keep_plan=keep,
                             plan_id=plan_id, one_pass=one_pass)
        for h in groups:
            h.fill(req.groups.add())
        if replica is not None:
            req.replica.group, req.replica.rank = replica
        if signal is not None:
            (rid, off), value = signal
            req.done_signal.region.region_id, req.done_signal.region.offset = rid, off
            req.done_signal.value = value
        if ready is not None:
            (rid, off), value, _ = ready
            req.ready_signal.region.region_id, req.ready_signal.region.offset = rid, off
            req.ready_signal.value = value
        return req

    def check(self, heads, *args, **kwargs):
        data = heads.encode(*args, **kwargs)
        self.assertEqual(pb.StepRequest.FromString(data), self.message(*args, **kwargs))
        return data

    def test_each_head_parses_to_its_fields(self):
        heads = _step_plans.StepHeads()
        sgd = fp4q.SgdHyperparameters(lr=0.01, momentum=0.9, nesterov=True)
        adamw = fp4q.AdamWHyperparameters(lr=3e-4, betas=(0.8, 0.95), weight_decay=0.0)
        for step in (1, 127, 128, 16383, 16384, 2**40, 2**63 - 1, 0, -1, -2**63):
            self.check(heads, step, [sgd, adamw])
        self.check(heads, 9, [sgd], kind=pb.UpdateKind.UPDATE_KIND_DELTA, replica=("dp", 3),
                   brief=True, keep=True, plan_id=77, one_pass=True)
        self.check(heads, 9, [sgd], signal=(("r-done", 4096), 0xFFFFFFFF),
                   ready=(("r-ready", 64), 5, print))
        # The step number goes before the kept fields, the signals after them.
        data = heads.encode(300, [sgd], 0, None, True, False, 0, False)
        self.assertEqual(data[:3], b"\x08\xac\x02")
        with self.assertRaises(ValueError):
            heads.encode(2**63, [sgd], 0, None, False, False, 0, False)

    def test_the_signals_are_encoded_as_the_protobuf_library_encodes_them(self):
        heads = _step_plans.StepHeads()
        sgd = fp4q.SgdHyperparameters(lr=0.01)
        base = heads.encode(3, [sgd])
        for region_id in ("region-1", "", "r" * 200, "r\u00e9gion"):
            for offset in (0, 16, 127, 128, 2**40, 2**64 - 1):
                for value in (0, 1, 127, 128, 2**31, 2**32 - 1):
                    req = pb.StepRequest()
                    req.done_signal.region.region_id = region_id
                    req.done_signal.region.offset = offset
                    req.done_signal.value = value
                    req.ready_signal.region.region_id = region_id
                    req.ready_signal.region.offset = offset + 1 if offset < 2**64 - 1 else 0
                    req.ready_signal.value = value
                    got = heads.encode(3, [sgd], signal=((region_id, offset), value),
                                       ready=((region_id, req.ready_signal.region.offset),
                                              value, print))
                    self.assertEqual(got, base + req.SerializeToString(),
                                     (region_id, offset, value))
        # Out of their fields' ranges: refused as the library refuses them; a bytes region id
        # is the library's to take.
        for signal in ((("r", -16), 1), (("r", 16), 2**32), (("r", 2**64), 1)):
            with self.assertRaisesRegex(ValueError, "out of range"):
                heads.encode(3, [sgd], signal=signal)
        req = pb.StepRequest()
        req.done_signal.region.region_id, req.done_signal.value = "r", 1
        self.assertEqual(heads.encode(3, [sgd], signal=((b"r", 0), 1)),
                         base + req.SerializeToString())

    def test_the_kept_fields_follow_the_values_not_the_objects(self):
        heads = _step_plans.StepHeads()
        h = fp4q.SgdHyperparameters(lr=0.01, momentum=0.9)
        first = self.check(heads, 5, [h])
        self.assertEqual(heads.encode(6, [fp4q.SgdHyperparameters(lr=0.01, momentum=0.9)], 0,
                                      None, False, False, 0, False)[2:], first[2:])
        h.lr = 0.5  # changed in place: encoded anew
        self.assertEqual(pb.StepRequest.FromString(heads.encode(
            6, [h], 0, None, False, False, 0, False)).groups[0].lr, 0.5)
        # A zero's sign is a different encoding, though 0.0 == -0.0.
        for value in (0.0, -0.0, 0.0):
            h.weight_decay = value
            got = pb.StepRequest.FromString(heads.encode(7, [h], 0, None, False, False, 0,
                                                         False)).groups[0].sgd.weight_decay
            self.assertEqual(str(got), str(value))
        # A value with no exact key (a tensor) is encoded at every step, never kept.
        lr = torch.tensor(0.5)
        h = fp4q.SgdHyperparameters(lr=lr)
        self.check(heads, 8, [h])
        lr.fill_(0.25)
        self.assertEqual(pb.StepRequest.FromString(heads.encode(
            9, [h], 0, None, False, False, 0, False)).groups[0].lr, 0.25)

    def test_an_optimizer_groups_values_differ_when_a_zero_changes_sign(self):
        from fp4q._optim_step import _plain_values
        keys = ("lr", "betas", "weight_decay")
        self.assertEqual(_plain_values({"lr": 0.0, "betas": (0.9, 0.0), "weight_decay": 0}, keys),
                         _plain_values({"lr": 0.0, "betas": (0.9, 0.0), "weight_decay": 0}, keys))
        for other in ({"lr": -0.0, "betas": (0.9, 0.0), "weight_decay": 0},
                      {"lr": 0.0, "betas": (0.9, -0.0), "weight_decay": 0},
                      {"lr": 0.0, "betas": (0.9, 0.0), "weight_decay": 0.0}):
            self.assertNotEqual(_plain_values(other, keys), _plain_values(
                {"lr": 0.0, "betas": (0.9, 0.0), "weight_decay": 0}, keys))
        self.assertIsNone(_plain_values({"lr": torch.tensor(0.1)}, ("lr",)))
        self.assertIsNone(_plain_values({"lr": 0.1, "betas": (0.9, None)}, ("lr", "betas")))

    def test_only_a_few_heads_are_kept(self):
        heads = _step_plans.StepHeads()
        for i in range(3 * heads.SIZE):
            self.check(heads, i + 1, [fp4q.SgdHyperparameters(lr=0.001 * (i + 1))])
            self.assertLessEqual(len(heads._kept), heads.SIZE)


if __name__ == "__main__":
    unittest.main()
