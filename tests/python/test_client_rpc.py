"""fp4q.Client against a live CPU-backend fp4qd: every RPC, exact numerics, error mapping."""

import json
import os
import re
import unittest

import grpc
import numpy as np
import torch

import fp4q
import fp4q_reference as R
import fp4q_testing

SERVER = None
CLIENT = None


def setUpModule():
    global SERVER, CLIENT
    SERVER = fp4q_testing.Server("--session_lease_s", "20")
    CLIENT = fp4q.Client(SERVER.target, timeout=120)


def tearDownModule():
    CLIENT.close()
    SERVER.stop()


def np_of(t):
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return R.bf16_to_f32(t.view(torch.int16).numpy().view(np.uint16))
    return t.numpy()


def randn(rows, cols, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * scale


HAND_ROW = [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6]


class ErrorAssertions(unittest.TestCase):
    def assertFp4qError(self, code, pattern, fn, *args, **kwargs):
        with self.assertRaises(fp4q.Fp4qError) as cm:
            fn(*args, **kwargs)
        self.assertEqual(cm.exception.code, code, str(cm.exception))
        self.assertRegex(cm.exception.message, pattern)
        return cm.exception


class QuantizeTest(ErrorAssertions):
    def test_hand_picked_values_give_known_codes_and_scales(self):
        x = torch.tensor([HAND_ROW, [v / 8 for v in HAND_ROW]], dtype=torch.float32)
        for dtype in (torch.float32, torch.bfloat16):
            q = CLIENT.quantize(x.to(dtype)).rowwise
            self.assertEqual(q.shape, (2, 16))
            self.assertEqual(q.codes.dtype, torch.uint8)
            expected_row = [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]
            self.assertEqual(q.codes.tolist(), [expected_row, expected_row])
            # E4M3 448 (block amax 6) and 56 (block amax 0.75) with S_enc = 2688 / 6.
            self.assertEqual(q.scales.tolist(), [[0x7E], [0x66]])
            self.assertEqual(q.global_amax, 6.0)
            self.assertEqual(q.s_enc, 448.0)
            self.assertEqual((q.format, q.block, q.scale_layout), ("nvfp4", "1x16", "plain"))

    def test_golden_vectors_bit_exact(self):
        meta, t = R.read_safetensors(fp4q_testing.golden_path())
        cases = json.loads(meta["cases"])
        self.assertEqual(len(cases), 10)
        for case in cases:
            k = case["key"]
            with self.subTest(case=k, dist=case["dist"], block=case["block"]):
                x = torch.from_numpy(t[k + ".x"].copy())
                if case["dtype"] == "torch.bfloat16":
                    x = x.to(torch.bfloat16)  # exact: the values are bf16
                q = CLIENT.quantize(x, block=case["block"]).rowwise
                self.assertTrue(np.array_equal(q.codes.numpy(), t[k + ".codes"]))
                self.assertTrue(np.array_equal(q.scales.numpy(), t[k + ".scales"]))
                self.assertEqual(np.float32(q.s_enc), t[k + ".s_enc"][0])
                self.assertEqual(np.float32(q.global_amax), t[k + ".global_amax"][0])

    def test_stochastic_rounding_matches_philox_definition(self):
        x = randn(32, 64, seed=3)
        for seed, step in ((1, 0), (0xDEADBEEFCAFEF00D, 2**40 + 5)):
            with self.subTest(seed=seed, step=step):
                q = CLIENT.quantize(x, rounding="stochastic", seed=seed, step=step).rowwise
                ref = R.quantize_nvfp4(x.numpy(), sr=(seed, step))
                self.assertTrue(np.array_equal(q.codes.numpy(), ref["packed"]))
                self.assertTrue(np.array_equal(q.scales.numpy(), ref["scales"]))
        a = CLIENT.quantize(x, rounding="stochastic", seed=1, step=1).rowwise.codes
        b = CLIENT.quantize(x, rounding="stochastic", seed=1, step=2).rowwise.codes
        self.assertFalse(torch.equal(a, b))

    def test_both_outputs_and_16x16_columnwise_is_the_transpose(self):
        x = randn(32, 48, seed=4)
        res = CLIENT.quantize(x, block="16x16", outputs="both")
        ref = R.quantize_nvfp4(x.numpy(), "16x16")
        self.assertTrue(np.array_equal(res.rowwise.codes.numpy(), ref["packed"]))
        self.assertEqual(res.columnwise.shape, (48, 32))
        ref_t = R.quantize_nvfp4(x.numpy().T.copy(), "16x16")
        self.assertTrue(np.array_equal(res.columnwise.codes.numpy(), ref_t["packed"]))
        self.assertTrue(np.array_equal(res.columnwise.scales.numpy(), ref_t["scales"]))
        self.assertTrue(np.array_equal(R.unpack(res.columnwise.codes.numpy()),
                                       R.unpack(res.rowwise.codes.numpy()).T))

    def test_columnwise_with_rht_quantizes_the_transformed_transpose(self):
        x = randn(32, 32, seed=5)
        q = CLIENT.quantize(x, outputs="columnwise", rht="default").columnwise
        ref = R.quantize_nvfp4(R.hadamard16_rows(x.numpy().T.copy()))
        self.assertTrue(np.array_equal(q.codes.numpy(), ref["packed"]))
        self.assertTrue(np.array_equal(q.scales.numpy(), ref["scales"]))
        self.assertEqual(np.float32(q.global_amax), ref["amax"])

    def test_swizzled_scales_follow_the_128x4_layout(self):
        x = randn(130, 80, seed=6)
        q = CLIENT.quantize(x, scale_layout="swizzled").rowwise
        ref = R.quantize_nvfp4(x.numpy())
        self.assertEqual(tuple(q.scales.shape), (256 * 8,))
        self.assertTrue(np.array_equal(q.scales.numpy(), R.swizzle_scales(ref["scales"])))

    def test_caller_amax_sets_the_global_scale(self):
        x = randn(16, 32, seed=7)
        q = CLIENT.quantize(x, amax=10.0).rowwise
        ref = R.quantize_nvfp4(x.numpy(), amax=10.0)
        self.assertEqual(q.s_enc, float(ref["s_enc"]))
        self.assertTrue(np.array_equal(q.codes.numpy(), ref["packed"]))

    def test_bad_shape_and_options_map_to_invalid_argument(self):
        self.assertFp4qError(grpc.StatusCode.INVALID_ARGUMENT, r"15",
                             CLIENT.quantize, torch.ones(4, 15))
        self.assertFp4qError(grpc.StatusCode.INVALID_ARGUMENT, r"^input\.shape: .*rank 3",
                             CLIENT.quantize, torch.ones(2, 4, 16))
        self.assertFp4qError(grpc.StatusCode.INVALID_ARGUMENT, r"format.*unknown value 9",
                             CLIENT.quantize, torch.ones(4, 16), format=9)
        err = self.assertFp4qError(grpc.StatusCode.INVALID_ARGUMENT, r"rounding",
                                   CLIENT.quantize, torch.ones(4, 16), rounding="truncate")
        self.assertIsInstance(err, ValueError)  # refused here, before sending
        self.assertFp4qError(grpc.StatusCode.INVALID_ARGUMENT, r"input\.dtype: torch\.float16",
                             CLIENT.quantize, torch.ones(4, 16, dtype=torch.float16))


class DequantizeQdqMatmulTest(ErrorAssertions):
    def test_dequantize_is_exact_in_f32_and_bf16(self):
        x = randn(16, 64, seed=8, scale=3.0)
        q = CLIENT.quantize(x).rowwise
        ref = R.dequantize_nvfp4(q.codes.numpy(), q.scales.numpy(), q.s_enc)
        y = CLIENT.dequantize(q)
        self.assertEqual(y.dtype, torch.float32)
        self.assertTrue(np.array_equal(y.numpy(), ref))
        yb = CLIENT.dequantize(q, torch.bfloat16)
        self.assertEqual(yb.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(yb, torch.from_numpy(ref).to(torch.bfloat16)))

    def test_dequantize_into_out_writes_every_element(self):
        q = CLIENT.quantize(randn(16, 32, seed=9)).rowwise
        out = torch.full((16, 32), float("nan"))
        got = CLIENT.dequantize(q, out=out)
        self.assertIs(got, out)
        self.assertTrue(torch.equal(out, CLIENT.dequantize(q)))

    def test_qdq_equals_dequantize_of_quantize(self):
        x = randn(32, 64, seed=10)
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            y = CLIENT.qdq(xd)
            self.assertEqual(y.dtype, dtype)
            expected = CLIENT.dequantize(CLIENT.quantize(xd).rowwise, dtype)
            self.assertTrue(torch.equal(y, expected))
            self.assertEqual(CLIENT.last_qdq_amax, float(np.abs(np_of(xd)).max()))
        y32 = CLIENT.qdq(x.to(torch.bfloat16), out_dtype=torch.float32)
        self.assertEqual(y32.dtype, torch.float32)

    def test_matmul_matches_the_f64_reference(self):
        a, b = randn(24, 64, seed=11), randn(40, 64, seed=12, scale=0.1)
        qa, qb = CLIENT.quantize(a).rowwise, CLIENT.quantize(b).rowwise
        c = CLIENT.matmul(qa, qb)
        self.assertEqual(tuple(c.shape), (24, 40))
        ref = R.matmul_reference(R.quantize_nvfp4(a.numpy()), R.quantize_nvfp4(b.numpy()))
        self.assertTrue(np.array_equal(c.numpy(), ref))
        cb = CLIENT.matmul(qa, qb, torch.bfloat16)
        self.assertEqual(cb.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(cb, torch.from_numpy(ref).to(torch.bfloat16)))

    def test_matmul_operand_mismatch_is_invalid_argument(self):
        qa = CLIENT.quantize(randn(8, 32, seed=13)).rowwise
        qb = CLIENT.quantize(randn(8, 64, seed=14)).rowwise
        self.assertFp4qError(grpc.StatusCode.INVALID_ARGUMENT, r"(32|64)", CLIENT.matmul, qa, qb)

    def test_tampered_quantized_tensor_is_rejected(self):
        q = CLIENT.quantize(randn(8, 32, seed=15)).rowwise
        q.codes = q.codes[:, :8].contiguous()  # half the bytes the shape needs
        self.assertFp4qError(grpc.StatusCode.INVALID_ARGUMENT, r"codes", CLIENT.dequantize, q)


class ResidualTest(ErrorAssertions):
    def test_server_residual_follows_error_feedback_and_refuses_repeated_steps(self):
        key = "ef-test-%d" % os.getpid()
        x = randn(16, 32, seed=16)
        r = np.zeros((16, 32), np.float32)
        for step in (1, 2, 5):
            y = CLIENT.qdq(x, residual_key=key, step=step)
            v = (x.numpy() + r).astype(np.float32)
            q = R.quantize_nvfp4(v)
            dq = R.dequantize_nvfp4(q["packed"], q["scales"], q["s_enc"])
            r = (v - dq).astype(np.float32)
            self.assertTrue(np.array_equal(y.numpy(), dq), "step %d" % step)
        self.assertFp4qError(grpc.StatusCode.ALREADY_EXISTS, r"options\.step: 5 was already",
                             CLIENT.qdq, x, residual_key=key, step=5)
        self.assertFp4qError(grpc.StatusCode.FAILED_PRECONDITION, r"options\.step: 3 is older",
                             CLIENT.qdq, x, residual_key=key, step=3)
        listing = {t.name: t for t in CLIENT.list_tensors()}
        self.assertIn(key, listing)
        self.assertEqual(listing[key].kind, fp4q._messages.pb.TensorKind.TENSOR_KIND_RESIDUAL)
        CLIENT.reset_residual(key)
        y = CLIENT.qdq(x, residual_key=key, step=6)
        self.assertTrue(torch.equal(y, CLIENT.qdq(x)))  # residual was zero again
        self.assertFp4qError(grpc.StatusCode.NOT_FOUND, r"no weight or residual 'nope-",
                             CLIENT.reset_residual, "nope-%d" % os.getpid())


class WeightTest(ErrorAssertions):
    def test_weight_lifecycle(self):
        name = "w-test-%d" % os.getpid()
        w0 = randn(32, 64, seed=17)
        info = CLIENT.create_weight(name, w0, block="16x16", error_feedback=True)
        self.assertEqual(list(info.shape), [32, 64])
        self.assertEqual(info.last_step, 0)
        ref0 = R.quantize_nvfp4(w0.numpy(), "16x16")
        dq0 = R.dequantize_nvfp4(ref0["packed"], ref0["scales"], ref0["s_enc"])
        st = CLIENT.get_weight(name, quantized=True, residual=True)
        self.assertTrue(np.array_equal(st.dequantized.numpy(), dq0))
        self.assertTrue(np.array_equal(st.quantized.codes.numpy(), ref0["packed"]))
        self.assertTrue(np.array_equal(st.residual.numpy(), (w0.numpy() - dq0)))

        g = randn(32, 64, seed=18)
        lr = np.float32(0.05)
        res = CLIENT.update_weight(name, 1, g, lr=float(lr), return_dequantized=True)
        self.assertTrue(res.applied)
        self.assertEqual(res.last_step, 1)
        x = (dq0 - (lr * g.numpy()).astype(np.float32)).astype(np.float32)
        v = (x + (w0.numpy() - dq0)).astype(np.float32)
        ref1 = R.quantize_nvfp4(v, "16x16")
        dq1 = R.dequantize_nvfp4(ref1["packed"], ref1["scales"], ref1["s_enc"])
        self.assertTrue(np.array_equal(res.dequantized.numpy(), dq1))
        self.assertEqual(np.float32(res.global_amax), ref1["amax"])

        again = CLIENT.update_weight(name, 1, g, lr=float(lr))
        self.assertFalse(again.applied)
        self.assertFp4qError(grpc.StatusCode.FAILED_PRECONDITION, r"^step: 0 is older",
                             CLIENT.update_weight, name, 0, g, lr=0.1)
        self.assertFp4qError(grpc.StatusCode.INVALID_ARGUMENT, r"update",
                             CLIENT.update_weight, name, 2, torch.ones(16, 64), lr=0.1)
        self.assertEqual(CLIENT.matmul(name, name).shape, (32, 32))
        self.assertTrue(torch.equal(CLIENT.dequantize(name), torch.from_numpy(dq1)))

        listing = {t.name: t for t in CLIENT.list_tensors()}
        self.assertEqual(listing[name].last_step, 1)
        CLIENT.delete_weight(name)
        self.assertNotIn(name, {t.name for t in CLIENT.list_tensors()})
        for fn, args in ((CLIENT.get_weight, (name,)), (CLIENT.delete_weight, (name,)),
                         (CLIENT.dequantize, (name,))):
            self.assertFp4qError(grpc.StatusCode.NOT_FOUND, re.escape(name), fn, *args)

    def test_duplicate_create_is_already_exists(self):
        name = "dup-%d" % os.getpid()
        CLIENT.create_weight(name, torch.ones(16, 16))
        try:
            self.assertFp4qError(grpc.StatusCode.ALREADY_EXISTS, re.escape(name),
                                 CLIENT.create_weight, name, torch.ones(16, 16))
        finally:
            CLIENT.delete_weight(name)

    def test_checkpoint_without_state_dir_is_failed_precondition(self):
        self.assertFp4qError(grpc.StatusCode.FAILED_PRECONDITION, r"--state_dir",
                             CLIENT.checkpoint)


class SessionInfoHealthTest(ErrorAssertions):
    def test_server_info_and_health(self):
        info = CLIENT.server_info()
        self.assertEqual(info.backend, "cpu")
        self.assertEqual(info.limits.session_lease_seconds, 20)
        self.assertEqual(info.limits.max_message_bytes, 536870912)
        self.assertNotIn("cuda_ipc", list(info.supported_modes))
        self.assertEqual(CLIENT.last_header.backend, "cpu")
        for service in ("", "liveness", "readiness"):
            self.assertEqual(CLIENT.health(service), "SERVING")

    def test_sessions_and_region_errors(self):
        c = fp4q.Client(SERVER.target, timeout=60)
        try:
            sid = c.open_session("unit-test")
            self.assertRegex(sid, r"^[0-9a-f]{32}$")
            self.assertEqual(c.keep_alive(), 20)
            self.assertEqual(SERVER.metric("fp4q_sessions"), 2.0 if CLIENT.session_id else 1.0)
            self.assertFp4qError(grpc.StatusCode.INVALID_ARGUMENT, r"ipc_handle: 10 bytes",
                                 c.register_cuda_region, b"x" * 10, 4096)
            self.assertFp4qError(grpc.StatusCode.FAILED_PRECONDITION, r"--allow_cuda_ipc",
                                 c.register_cuda_region, b"x" * 64, 4096)
            req = fp4q._messages.pb.QdqRequest()
            req.input.dtype = 1
            req.input.shape.extend([1, 16])
            req.input.region.region_id = "0123456789abcdef0123456789abcdef"
            self.assertFp4qError(grpc.StatusCode.NOT_FOUND, r"input\.region\.region_id: no "
                                 r"region '0123456789abcdef0123456789abcdef' in this session",
                                 c._raw, "Qdq", req)
            self.assertEqual(c.close_session(), 0)
            self.assertIsNone(c.session_id)
            self.assertFp4qError(grpc.StatusCode.NOT_FOUND, r"^session: unknown",
                                 c.keep_alive)
        finally:
            c.close()

    def test_unreachable_server_is_unavailable(self):
        c = fp4q.Client("127.0.0.1:1", timeout=5)
        try:
            err = self.assertFp4qError(grpc.StatusCode.UNAVAILABLE, r".", c.server_info)
            self.assertEqual(err.rpc, "ServerInfo")
            self.assertTrue(str(err).startswith("[ServerInfo] UNAVAILABLE: "))
        finally:
            c.close()


class StepRpcTest(ErrorAssertions):
    """Step, ResetOptimizer, JoinGroup / LeaveGroup and DeleteNamespace through the client."""

    def setUp(self):
        self.c = fp4q.Client(SERVER.target, timeout=120,
                             namespace="step-rpc-%d-%s" % (os.getpid(), self._testMethodName[:40]))
        self.addCleanup(self.c.close)

    def test_one_step_of_two_weights_is_the_reference_update(self):
        c = self.c
        w0, w1 = randn(16, 32, seed=200), randn(32, 16, seed=201)
        c.create_weight("a", w0, error_feedback=True)
        c.create_weight("b", w1, error_feedback=True, dtype=torch.bfloat16)
        g0, g1 = randn(16, 32, seed=202), randn(32, 16, seed=203).to(torch.bfloat16)
        out = torch.full((32, 16), float("nan"), dtype=torch.bfloat16)
        r = c.step(1, [fp4q.StepItem("a", g0, return_dequantized=True),
                       fp4q.StepItem("b", g1, dequantized_out=out, group=1)],
                   [fp4q.SgdHyperparameters(lr=0.5), fp4q.SgdHyperparameters(lr=0.25)])
        self.assertEqual((r.world_size, [(i.name, i.applied, i.last_step) for i in r.items]),
                         (1, [("a", True, 1), ("b", True, 1)]))
        self.assertIs(r.items[1].dequantized, out)
        for w, g, lr, got in ((w0, g0, 0.5, r.items[0].dequantized), (w1, g1, 0.25, out)):
            q = R.quantize_nvfp4(w.numpy())
            d = R.dequantize_nvfp4(q["packed"], q["scales"], q["s_enc"])
            res = (w.numpy() - d).astype(np.float32)
            v = ((d - (np.float32(lr) * np_of(g)).astype(np.float32)).astype(np.float32) +
                 res).astype(np.float32)
            q = R.quantize_nvfp4(v)
            want = R.dequantize_nvfp4(q["packed"], q["scales"], q["s_enc"])
            self.assertTrue(np.array_equal(np_of(got), np_of(torch.from_numpy(want).to(got.dtype))))
            self.assertEqual(r.items[[0.5, 0.25].index(lr)].global_amax, q["amax"])
        again = c.step(1, [fp4q.StepItem("a", g0), fp4q.StepItem("b", g1, group=1)],
                       [fp4q.SgdHyperparameters(lr=0.5), fp4q.SgdHyperparameters(lr=0.25)])
        self.assertEqual([i.applied for i in again.items], [False, False])  # a safe retry

    def test_refusals_name_the_item_and_change_nothing(self):
        c = self.c
        c.create_weight("w", randn(16, 32, seed=210), error_feedback=True)
        c.create_weight("m", randn(16, 32, seed=211), optimizer=fp4q.OptimizerSpec(
            kind="sgd", momentum=True))
        sgd = [fp4q.SgdHyperparameters(lr=0.1)]
        g = randn(16, 32, seed=212)
        nan = g.clone()
        nan.view(-1)[5] = float("nan")
        cases = [
            (grpc.StatusCode.NOT_FOUND, r"^items\[1\]\.name: no weight 'nope'$",
             [fp4q.StepItem("w", g), fp4q.StepItem("nope", g)], sgd, 1),
            (grpc.StatusCode.INVALID_ARGUMENT, r"^items\[1\]\.name: 'w' appears twice in one "
             r"step$", [fp4q.StepItem("w", g), fp4q.StepItem("w", g)], sgd, 1),
            (grpc.StatusCode.INVALID_ARGUMENT, r"^items\[0\]\.update\.shape: \[16, 16\] does not "
             r"match weight 'w' of shape \[16, 32\]$", [fp4q.StepItem("w", g[:, :16].clone())],
             sgd, 1),
            (grpc.StatusCode.INVALID_ARGUMENT, r"^items\[1\]\.update: element 5 is NaN \(weight "
             r"'m', step 1\); nothing was applied$",
             [fp4q.StepItem("w", g), fp4q.StepItem("m", nan)], sgd, 1),
            (grpc.StatusCode.INVALID_ARGUMENT, r"^groups\[0\]\.lr: -1 must be finite and >= 0$",
             [fp4q.StepItem("w", g)], [fp4q.SgdHyperparameters(lr=-1.0)], 1),
            (grpc.StatusCode.INVALID_ARGUMENT, r"^groups\[0\]\.adamw\.beta1: 1 must be in "
             r"\[0, 1\)$", [fp4q.StepItem("w", g)],
             [fp4q.AdamWHyperparameters(lr=0.1, betas=(1.0, 0.9))], 1),
            (grpc.StatusCode.FAILED_PRECONDITION, r"^items\[0\]: weight 'w' keeps SGD state, but "
             r"groups\[0\] sends AdamW hyperparameters; switch optimizers with ResetOptimizer$",
             [fp4q.StepItem("w", g)], [fp4q.AdamWHyperparameters(lr=0.1)], 1),
            (grpc.StatusCode.FAILED_PRECONDITION, r"^step: 0 is not newer than the last step 0 "
             r"of weight 'w'", [fp4q.StepItem("w", g)], sgd, 0),
        ]
        before = {n: c.get_weight(n, quantized=True).quantized.codes.clone() for n in ("w", "m")}
        for code, pattern, items, groups, step in cases:
            with self.subTest(pattern):
                self.assertFp4qError(code, pattern, c.step, step, items, groups)
        for n in ("w", "m"):
            st = c.get_weight(n, quantized=True)
            self.assertEqual((st.info.last_step, st.info.optimizer_steps), (0, 0))
            self.assertTrue(torch.equal(st.quantized.codes, before[n]))
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"items\[0\]: expected "
                                    r"fp4q\.StepItem, got tuple"):
            c.step(1, [("w", g)], sgd)

    def test_optimizer_state_reset_and_namespace_deletion(self):
        c = self.c
        spec = fp4q.OptimizerSpec(kind="adamw", amsgrad=True, state_dtype="bf16")
        info = c.create_weight("w", randn(16, 32, seed=220), optimizer=spec)
        self.assertEqual((info.options.optimizer.kind, info.options.optimizer.amsgrad,
                          info.options.optimizer.state_dtype), (2, True, 2))
        c.step(1, [fp4q.StepItem("w", randn(16, 32, seed=221))],
               [fp4q.AdamWHyperparameters(lr=1e-2)])
        st = c.get_weight("w", optimizer_state=True).optimizer_state
        self.assertEqual((st.spec, st.steps), (spec, 1))
        self.assertEqual({k: (v.dtype, tuple(v.shape)) for k, v in st.moments.items()},
                         {k: (torch.bfloat16, (16, 32)) for k in
                          ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")})
        self.assertGreater(float(st.moments["exp_avg_sq"].float().abs().max()), 0)
        info = c.reset_optimizer("w", fp4q.OptimizerSpec(kind="sgd", momentum=True))
        self.assertEqual((info.options.optimizer.kind, info.optimizer_steps), (1, 0))
        st = c.get_weight("w", optimizer_state=True).optimizer_state
        self.assertEqual(float(st.moments["momentum_buffer"].abs().max()), 0.0)
        self.assertEqual(c.join_group("g", 2, 1), 1)
        self.assertFp4qError(grpc.StatusCode.INVALID_ARGUMENT, r"^rank: 2 is not in \[0, 2\)$",
                             c.join_group, "g", 2, 2)
        c.leave_group("g")
        self.assertFp4qError(grpc.StatusCode.NOT_FOUND, r"^group: this session is not a member "
                             r"of group 'g'$", c.leave_group, "g")
        self.assertEqual([t.name for t in c.list_tensors()], ["w"])
        self.assertEqual([t.name for t in CLIENT.list_tensors() if t.name == "w"], [])
        self.assertEqual(c.delete_namespace(), 1)
        self.assertEqual(c.list_tensors(), [])
        self.assertEqual(c._session.server_namespace, c.namespace)


class CudaIpcTest(unittest.TestCase):
    @unittest.skipUnless(torch.cuda.is_available(),
                         "CUDA IPC needs a CUDA device in this process (torch.cuda.is_available() "
                         "is False); tests/python/gpu_ipc_check.py covers it on a GPU host")
    def test_cuda_tensor_goes_inline_to_a_cpu_server(self):
        x = torch.randn(16, 32, device="cuda")
        c = fp4q.Client(SERVER.target)
        try:
            y = c.qdq(x)
            self.assertEqual(y.device, x.device)
            self.assertTrue(torch.equal(y.cpu(), CLIENT.qdq(x.cpu())))
            self.assertIn("does not offer cuda_ipc", c.ipc_reasons[str(x.device)])
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main()
