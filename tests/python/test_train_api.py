"""The fp4-train API and fp4q.nn.Linear against a live CPU-backend fp4qd, exact where defined."""

import os
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
    SERVER = fp4q_testing.Server()
    CLIENT = fp4q.Client(SERVER.target, timeout=120)
    fp4q.set_default_client(CLIENT)


def tearDownModule():
    fp4q.set_default_client(None)
    CLIENT.close()
    SERVER.stop()


def randn(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def ref_dq(x, block="1x16", sr=None):
    q = R.quantize_nvfp4(np.asarray(x, np.float32), block, sr=sr)
    return q, R.dequantize_nvfp4(q["packed"], q["scales"], q["s_enc"])


class FunctionalTest(unittest.TestCase):
    def test_quantize_returns_packed_and_scale_and_dequantize_inverts_it(self):
        x = randn(4, 8, 32, seed=1)  # leading axes flatten to 32 rows
        packed, scale = fp4q.quantize(x)
        ref, dq = ref_dq(x.reshape(32, 32).numpy())
        self.assertEqual(packed.dtype, torch.uint8)
        self.assertEqual(tuple(packed.shape), (32, 16))
        self.assertTrue(np.array_equal(packed.numpy(), ref["packed"]))
        self.assertTrue(np.array_equal(scale.view(torch.uint8).numpy(), ref["scales"]))
        if hasattr(torch, "float8_e4m3fn"):
            self.assertEqual(scale.dtype, torch.float8_e4m3fn)
        y = fp4q.dequantize(packed, scale, 32, 32)
        self.assertTrue(np.array_equal(y.numpy(), dq))

    def test_dequantize_without_global_scale_is_refused(self):
        packed, scale = fp4q.quantize(randn(16, 16, seed=2))
        bare = scale.view(torch.uint8).clone()
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"s_enc: the scale tensor"):
            fp4q.dequantize(packed, bare, 16, 16)
        pair = fp4q.quantize(randn(16, 16, seed=2))
        y = fp4q.dequantize(packed, bare, 16, 16, s_enc=pair.s_enc)
        self.assertTrue(torch.equal(y, fp4q.dequantize(*pair, 16, 16)))

    def test_stochastic_quantize_uses_seed_and_step(self):
        x = randn(16, 64, seed=3)
        packed, _ = fp4q.quantize(x, stochastic=True, seed=77, step=9)
        ref, _ = ref_dq(x.numpy(), sr=(77, 9))
        self.assertTrue(np.array_equal(packed.numpy(), ref["packed"]))

    def test_caller_residual_error_feedback(self):
        x = randn(16, 32, seed=4)
        r = torch.zeros(16, 32)
        rr = np.zeros((16, 32), np.float32)
        for step in range(3):
            y = fp4q.qdq(x, residual=r, step=step)
            v = (x.numpy() + rr).astype(np.float32)
            _, dq = ref_dq(v)
            rr = (v - dq).astype(np.float32)
            self.assertTrue(np.array_equal(y.numpy(), dq))
            self.assertTrue(np.array_equal(r.numpy(), rr))
        r2 = torch.zeros(16, 32)
        pair = fp4q.quantize(x, residual=r2)
        _, dq = ref_dq(x.numpy())
        self.assertTrue(np.array_equal(r2.numpy(), x.numpy() - dq))
        self.assertEqual(pair.global_amax, float(np.abs(x.numpy()).max()))
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"residual\.shape"):
            fp4q.qdq(x, residual=torch.zeros(16, 16))

    def test_qdq_keeps_dtype_and_shape(self):
        x = randn(2, 16, 48, seed=5).to(torch.bfloat16)
        y = fp4q.qdq(x)
        self.assertEqual((y.dtype, tuple(y.shape)), (torch.bfloat16, (2, 16, 48)))
        _, dq = ref_dq(R.bf16_to_f32(x.reshape(32, 48).view(torch.int16).numpy().view(np.uint16)))
        self.assertTrue(torch.equal(y.reshape(32, 48), torch.from_numpy(dq).to(torch.bfloat16)))

    def test_fp4_matmul_is_the_reference_gemm(self):
        a, b = randn(20, 64, seed=6), randn(24, 64, seed=7)
        c = fp4q.fp4_matmul(a, b)
        expected = R.matmul_reference(R.quantize_nvfp4(a.numpy()), R.quantize_nvfp4(b.numpy()))
        self.assertTrue(np.array_equal(c.numpy(), expected))
        pa = fp4q.quantize(a)
        self.assertTrue(torch.equal(fp4q.fp4_matmul(pa, b), c))
        cb = fp4q.fp4_matmul(a.to(torch.bfloat16), b.to(torch.bfloat16))
        self.assertEqual(cb.dtype, torch.bfloat16)

    def test_fp4_linear_forward_and_straight_through_backward(self):
        x = randn(3, 16, 32, seed=8).requires_grad_()
        w = randn(48, 32, seed=9, scale=0.2).requires_grad_()
        y = fp4q.fp4_linear(x, w)
        self.assertEqual(tuple(y.shape), (3, 16, 48))
        qx, dqx = ref_dq(x.detach().reshape(48, 32).numpy())
        qw, dqw = ref_dq(w.detach().numpy())
        self.assertTrue(np.array_equal(y.detach().reshape(48, 48).numpy(),
                                       R.matmul_reference(qx, qw)))
        g = randn(3, 16, 48, seed=10)
        y.backward(g)
        g2 = g.reshape(48, 48)
        self.assertTrue(torch.equal(x.grad.reshape(48, 32), g2 @ torch.from_numpy(dqw)))
        self.assertTrue(torch.equal(w.grad, g2.t() @ torch.from_numpy(dqx)))

    def test_error_feedback_class_keeps_residual_on_server(self):
        ef = fp4q.ErrorFeedback(stochastic=True, seed=5)
        name = "ef-class-%d" % os.getpid()
        w = randn(16, 32, seed=11)
        r = np.zeros((16, 32), np.float32)
        for step in (1, 2):
            y = ef.qdq(name, w, step)
            v = (w.numpy() + r).astype(np.float32)
            _, dq = ref_dq(v, sr=(5, step))
            r = (v - dq).astype(np.float32)
            self.assertTrue(np.array_equal(y.numpy(), dq))
        with self.assertRaises(fp4q.Fp4qError) as cm:
            ef.qdq(name, w, 2)
        self.assertEqual(cm.exception.code, grpc.StatusCode.ALREADY_EXISTS)
        ef.reset(name)

    def test_to_fp4_operands(self):
        a, b = randn(40, 64, seed=12), randn(24, 64, seed=13)
        if not hasattr(torch, "float4_e2m1fn_x2"):
            with self.assertRaises(fp4q.Fp4qError) as cm:
                fp4q.to_fp4_operands(a, b)
            self.assertEqual(cm.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("float4_e2m1fn_x2", cm.exception.message)
            return
        ops = fp4q.to_fp4_operands(a, b)
        qa, qb = R.quantize_nvfp4(a.numpy()), R.quantize_nvfp4(b.numpy())
        self.assertEqual((ops.a.dtype, tuple(ops.a.shape)), (torch.float4_e2m1fn_x2, (40, 32)))
        self.assertEqual(ops.scale_a.dtype, torch.float8_e4m3fn)
        self.assertTrue(np.array_equal(ops.a.view(torch.uint8).numpy(), qa["packed"]))
        self.assertTrue(np.array_equal(ops.b.view(torch.uint8).numpy(), qb["packed"]))
        self.assertTrue(np.array_equal(ops.scale_a.view(torch.uint8).numpy(),
                                       R.swizzle_scales(qa["scales"])))
        self.assertTrue(np.array_equal(ops.scale_b.view(torch.uint8).numpy(),
                                       R.swizzle_scales(qb["scales"])))
        self.assertEqual(ops.alpha, float(qa["s_dec"]) * float(qb["s_dec"]))


class LinearTest(unittest.TestCase):
    def test_constructor_checks_and_from_linear(self):
        with self.assertRaisesRegex(ValueError, r"in_features: 20 is not a positive multiple"):
            fp4q.nn.Linear(20, 32)
        ref = torch.nn.Linear(32, 16)
        m = fp4q.nn.Linear.from_linear(ref, seed=1)
        self.assertTrue(torch.equal(m.weight, ref.weight) and torch.equal(m.bias, ref.bias))

    def test_deterministic_recipe_gemms_are_exact(self):
        recipe = fp4q.nn.Recipe(grad_rounding="nearest", wgrad_input_rounding="nearest")
        torch.manual_seed(0)
        m = fp4q.nn.Linear(32, 48, recipe=recipe, seed=3)
        x = randn(20, 32, seed=14).requires_grad_()  # 20 tokens: wgrad pads to 32
        y = m(x)
        qx, _ = ref_dq(x.detach().numpy())
        qw16 = R.quantize_nvfp4(m.weight.detach().numpy(), "16x16")
        expected = R.matmul_reference(qx, qw16) + m.bias.detach().numpy()
        self.assertTrue(np.array_equal(y.detach().numpy(), expected.astype(np.float32)))
        g = randn(20, 48, seed=15)
        y.backward(g)
        qg = R.quantize_nvfp4(g.numpy())
        qwt = R.quantize_nvfp4(m.weight.detach().numpy().T.copy(), "16x16")
        self.assertTrue(np.array_equal(x.grad.numpy(), R.matmul_reference(qg, qwt)))
        gp = np.zeros((32, 48), np.float32)
        gp[:20] = g.numpy()
        xp = np.zeros((32, 32), np.float32)
        xp[:20] = x.detach().numpy()
        qgt = R.quantize_nvfp4(R.hadamard16_rows(gp.T.copy()))
        qxt = R.quantize_nvfp4(R.hadamard16_rows(xp.T.copy()))
        self.assertTrue(np.array_equal(m.weight.grad.numpy(), R.matmul_reference(qgt, qxt)))
        self.assertTrue(torch.equal(m.bias.grad, g.sum(0)))

    def test_linear_gemms_equal_separate_quantize_and_matmul_calls(self):
        """Each GEMM of fp4q.nn.Linear is one Matmul of dense operands (fp4q.DenseOperand); its
        results are those of quantizing the operands with Quantize and multiplying them, bit
        for bit, for the default recipe (SR, RHT) and with stochastic forward rounding."""
        from fp4q.functional import _key
        from fp4q.nn import _SALT_DGRAD, _SALT_WGRAD_G, _SALT_WGRAD_X
        c = CLIENT
        for recipe in (fp4q.nn.Recipe(), fp4q.nn.Recipe(forward_rounding="stochastic")):
            with self.subTest(recipe=recipe):
                torch.manual_seed(2)
                m = fp4q.nn.Linear(64, 48, recipe=recipe, seed=11)
                x = randn(20, 64, seed=18).requires_grad_()  # wgrad pads 20 tokens to 32
                calls = []
                real_call = c._requests.call

                def counting(rpc, *args, **kwargs):
                    calls.append(rpc)
                    return real_call(rpc, *args, **kwargs)
                c._requests.call = counting
                try:
                    y = m(x)
                    g = randn(20, 48, seed=19)
                    y.backward(g)
                finally:
                    del c._requests.call
                self.assertEqual(calls, ["Matmul"] * 3)  # one call a GEMM: fprop, dgrad, wgrad
                s, r = m.step, recipe
                qx = c.quantize(x.detach(), block=r.input_block, rounding=r.forward_rounding,
                                seed=_key(m.seed), step=s).rowwise
                qw = c.quantize(m.weight.detach(), block=r.weight_block,
                                rounding=r.forward_rounding, seed=_key(m.seed), step=s,
                                outputs="both")
                want_y = c.matmul(qx, qw.rowwise, torch.float32) + m.bias.detach()
                self.assertTrue(torch.equal(y.detach(), want_y))
                qg = c.quantize(g, rounding=r.grad_rounding, seed=_key(m.seed, _SALT_DGRAD),
                                step=s).rowwise
                self.assertTrue(torch.equal(x.grad, c.matmul(qg, qw.columnwise, torch.float32)))
                gp = torch.nn.functional.pad(g, (0, 0, 0, 12))
                xp = torch.nn.functional.pad(x.detach(), (0, 0, 0, 12))
                qgt = c.quantize(gp, outputs="columnwise", rht=r.wgrad_rht,
                                 rounding=r.grad_rounding, seed=_key(m.seed, _SALT_WGRAD_G),
                                 step=s).columnwise
                qxt = c.quantize(xp, outputs="columnwise", rht=r.wgrad_rht,
                                 rounding=r.wgrad_input_rounding,
                                 seed=_key(m.seed, _SALT_WGRAD_X), step=s).columnwise
                self.assertTrue(torch.equal(m.weight.grad, c.matmul(qgt, qxt, torch.float32)))
                self.assertGreater(float(m.weight.grad.abs().sum()), 0.0)

    def test_dense_operand_checks(self):
        x = randn(16, 32, seed=20)
        with self.assertRaises(fp4q.Fp4qError) as e:
            CLIENT.matmul(fp4q.DenseOperand(x, outputs="both"), fp4q.DenseOperand(x))
        self.assertIn("a.dense.options.outputs: OUTPUTS_BOTH", e.exception.message)
        with self.assertRaises(fp4q.Fp4qError) as e:
            CLIENT.matmul(fp4q.DenseOperand(x), fp4q.DenseOperand(x, residual_key="r"))
        self.assertIn("b.dense.options.residual_key", e.exception.message)
        with self.assertRaises(fp4q.ClientArgumentError):
            fp4q.DenseOperand(x, not_an_option=1)
        with self.assertRaises(fp4q.ClientArgumentError):
            fp4q.DenseOperand(x.numpy())
        with self.assertRaises(fp4q.ClientArgumentError):  # Dequantize takes no dense input
            CLIENT.dequantize(fp4q.DenseOperand(x))
        xt = x.t().contiguous()
        y = CLIENT.matmul(fp4q.DenseOperand(x), fp4q.DenseOperand(xt, outputs="columnwise"),
                          torch.float32)
        qa = CLIENT.quantize(x).rowwise
        qb = CLIENT.quantize(xt, outputs="columnwise").columnwise
        self.assertEqual(tuple(y.shape), (16, 16))
        self.assertTrue(torch.equal(y, CLIENT.matmul(qa, qb, torch.float32)))

    def test_default_recipe_gradients_approximate_full_precision(self):
        torch.manual_seed(1)
        m = fp4q.nn.Linear(64, 32, seed=4)
        ref = torch.nn.Linear(64, 32)
        with torch.no_grad():
            ref.weight.copy_(m.weight)
            ref.bias.copy_(m.bias)
        x = randn(64, 64, seed=16)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        g = randn(64, 32, seed=17)
        m(x1).backward(g)
        ref(x2).backward(g)

        def rel(a, b):
            return float((a - b).norm() / b.norm())
        self.assertLess(rel(x1.grad, x2.grad), 0.25)
        self.assertLess(rel(m.weight.grad, ref.weight.grad), 0.25)
        self.assertGreater(rel(m.weight.grad, ref.weight.grad), 0.0)  # really quantized
        self.assertEqual(m.step, 1)

    def test_small_model_trains(self):
        torch.manual_seed(2)
        teacher = torch.nn.Linear(32, 16)
        model = torch.nn.Sequential(fp4q.nn.Linear(32, 64, seed=5), torch.nn.ReLU(),
                                    fp4q.nn.Linear(64, 16, seed=6))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x = randn(64, 32, seed=18)
        with torch.no_grad():
            target = teacher(x)
        losses = []
        for _ in range(40):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.assertLess(losses[-1], losses[0] / 4, losses)


if __name__ == "__main__":
    unittest.main()
