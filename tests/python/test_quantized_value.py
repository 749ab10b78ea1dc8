"""fp4q.Fp4Tensor (the self-contained quantized value), fp4q.fp4_mm and its path choice, and
ErrorFeedback's sequences and scopes, against a live CPU-backend fp4qd."""

import io
import os
import types
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


def ref_dq(x, block="1x16"):
    q = R.quantize_nvfp4(np.asarray(x, np.float32), block)
    return q, R.dequantize_nvfp4(q["packed"], q["scales"], q["s_enc"])


class Fp4TensorTest(unittest.TestCase):
    def setUp(self):
        self.x = randn(64, 48, seed=1, scale=3.0)
        self.ref, self.dq = ref_dq(self.x.numpy())
        self.q = fp4q.quantize(self.x)

    def assertDecodes(self, q, rows=slice(None)):
        self.assertTrue(np.array_equal(fp4q.dequantize(q).numpy(), self.dq[rows]))

    def test_fields_are_the_reference_quantization(self):
        q = self.q
        self.assertIsInstance(q, fp4q.Fp4Tensor)
        self.assertIs(fp4q.Fp4Pair, fp4q.Fp4Tensor)
        self.assertEqual(q.shape, (64, 48))
        self.assertEqual(q.block, "1x16")
        self.assertTrue(np.array_equal(q.packed.numpy(), self.ref["packed"]))
        self.assertTrue(np.array_equal(q.scale.view(torch.uint8).numpy(), self.ref["scales"]))
        self.assertEqual(q.s_enc, float(self.ref["s_enc"]))
        self.assertEqual(q.s_dec, float(np.float32(1) / np.float32(self.ref["s_enc"])))
        self.assertEqual(q.global_amax, float(np.abs(self.x.numpy()).max()))
        self.assertDecodes(q)

    def test_unpacks_as_the_fp4_train_pair(self):
        packed, scale = self.q
        self.assertIs(packed, self.q[0])
        self.assertIs(scale, self.q[1])
        self.assertEqual(len(self.q), 2)
        y = fp4q.dequantize(packed, scale, 64, 48)  # the scale as returned still carries s_enc
        self.assertTrue(np.array_equal(y.numpy(), self.dq))
        with self.assertRaisesRegex(fp4q.ClientArgumentError,
                                    r"s_enc: the scale tensor carries no global scale .*keep the "
                                    r"Fp4Tensor"):
            fp4q.dequantize(packed, scale.clone(), 64, 48)
        with self.assertRaisesRegex(IndexError, r"index 2 \(0 = packed, 1 = scale"):
            self.q[2]
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"pass it alone"):
            fp4q.dequantize(self.q, scale)

    def test_clone_keeps_it_decodable_and_independent(self):
        c = self.q.clone()
        self.assertIsNot(c.packed, self.q.packed)
        self.assertNotEqual(c.packed.data_ptr(), self.q.packed.data_ptr())
        self.assertDecodes(c)
        c.packed.zero_()
        self.assertDecodes(self.q)

    def test_row_slices_decode_to_the_same_rows(self):
        part = self.q[8:40]
        self.assertEqual(part.shape, (32, 48))
        self.assertDecodes(part, slice(8, 40))
        self.assertDecodes(self.q[-5:], slice(59, 64))
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"step 1"):
            self.q[::2]

    def test_sixteen_by_sixteen_slices_keep_or_drop_the_tile_shape(self):
        w = randn(64, 32, seed=2)
        _, dq16 = ref_dq(w.numpy(), "16x16")
        q = fp4q.quantize(w, block="16x16")
        self.assertEqual(q.block, "16x16")
        self.assertTrue(np.array_equal(q.scale.view(torch.uint8).numpy(),
                                       R.quantize_nvfp4(w.numpy(), "16x16")["scales"]))
        aligned, ragged = q[16:48], q[3:20]
        self.assertEqual((aligned.block, ragged.block), ("16x16", "1x16"))
        self.assertEqual(q[48:].block, "16x16")
        self.assertTrue(np.array_equal(fp4q.dequantize(aligned).numpy(), dq16[16:48]))
        self.assertTrue(np.array_equal(fp4q.dequantize(ragged).numpy(), dq16[3:20]))

    def test_torch_save_and_load(self):
        buf = io.BytesIO()
        torch.save({"w": self.q, "step": 3}, buf)
        buf.seek(0)
        back = torch.load(buf)
        self.assertEqual(back["step"], 3)
        self.assertIsInstance(back["w"], fp4q.Fp4Tensor)
        self.assertEqual((back["w"].s_enc, back["w"].global_amax, back["w"].block),
                         (self.q.s_enc, self.q.global_amax, "1x16"))
        self.assertDecodes(back["w"])
        if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4
            buf.seek(0)
            self.assertDecodes(torch.load(buf, weights_only=True)["w"])

    def test_to_device_and_checks(self):
        self.assertDecodes(self.q.to("cpu"))
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"scale.shape: \[64, 2\], expected "
                                    r"\[64, 3\] for packed \[64, 24\]"):
            fp4q.Fp4Tensor(self.q.packed, self.q.scale[:, :2], 1.0)
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"block: '2x16'"):
            fp4q.Fp4Tensor(self.q.packed, self.q.scale, 1.0, block="2x16")
        self.assertIn("Fp4Tensor(shape=[64, 48], block=1x16", repr(self.q))


class Fp4MmTest(unittest.TestCase):
    def test_on_cpu_it_is_the_server_gemm_and_says_so(self):
        a, b = randn(20, 64, seed=3), randn(24, 64, seed=4)
        expected = R.matmul_reference(R.quantize_nvfp4(a.numpy()), R.quantize_nvfp4(b.numpy()))
        y = fp4q.fp4_mm(a, b)
        self.assertEqual((y.dtype, tuple(y.shape)), (torch.float32, (20, 24)))
        self.assertTrue(np.array_equal(y.numpy(), expected))
        path = fp4q.last_fp4_mm_path()
        self.assertEqual(path.kind, "server")
        self.assertEqual(path, fp4q.fp4_mm_path(a, b))
        # Quantized operands give the same product; leading axes of a are kept.
        self.assertTrue(torch.equal(fp4q.fp4_mm(fp4q.quantize(a), fp4q.quantize(b)), y))
        y3 = fp4q.fp4_mm(a.reshape(4, 5, 64), b, path="server")
        self.assertEqual(tuple(y3.shape), (4, 5, 24))
        self.assertTrue(torch.equal(y3.reshape(20, 24), y))
        self.assertEqual(fp4q.last_fp4_mm_path(), fp4q.Fp4MmPath("server", "path='server'"))
        self.assertEqual(fp4q.fp4_mm(a.to(torch.bfloat16), b.to(torch.bfloat16)).dtype,
                         torch.bfloat16)

    def test_forcing_tensor_cores_names_why_not(self):
        a, b = randn(16, 32, seed=5), randn(16, 32, seed=6)
        reason = fp4q.fp4_mm_path(a, b).reason
        with self.assertRaises(fp4q.Fp4qError) as cm:
            fp4q.fp4_mm(a, b, path="scaled_mm")
        self.assertEqual(cm.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(cm.exception.message,
                         "fp4_mm: path='scaled_mm' is not available: " + reason)
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"path: 'gpu' is not one of"):
            fp4q.fp4_mm(a, b, path="gpu")

    def test_path_choice(self):
        cpu = torch.zeros(16, 16)
        if not hasattr(torch, "float4_e2m1fn_x2"):
            p = fp4q.fp4_mm_path(cpu, cpu)
            self.assertEqual(p.kind, "server")
            self.assertIn("torch %s has no float4_e2m1fn_x2" % torch.__version__, p.reason)
            return
        self.assertEqual(fp4q.fp4_mm_path(cpu, cpu),
                         fp4q.Fp4MmPath("server", "operands on cpu and cpu, not CUDA"))
        # Device properties without a GPU: stand-in operands that only report a CUDA device.
        gpu = types.SimpleNamespace(device=torch.device("cuda", 0))
        on_gpu = fp4q.QuantizedTensor(codes=gpu, scales=gpu, rows=16, cols=16, global_amax=1.0,
                                      s_enc=1.0)
        hopper = fp4q.fp4_mm_path(on_gpu, on_gpu, capability=(9, 0))
        self.assertEqual(hopper, fp4q.Fp4MmPath(
            "server", "cuda:0 is sm_90; FP4 tensor cores need sm_100 or newer"))
        blackwell = fp4q.fp4_mm_path(on_gpu, on_gpu, capability=(10, 0))
        self.assertEqual(blackwell.kind, "scaled_mm")

    def test_tensor_core_plumbing_with_a_stand_in_for_scaled_mm(self):
        """No GPU here has FP4 tensor cores: a stand-in for torch._scaled_mm (the product of the
        decoded operands, from the swizzled scales it is handed) checks what fp4_mm hands it
        (codes, B transposed, swizzled scales, alpha = S_dec_a * S_dec_b) and the fallback."""
        calls = []

        def unswizzle(sw, rows, cols):  # docs/NUMERICS.md 3, read backwards
            cp = -(-cols // 4) * 4
            r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
            pos = ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 \
                + c % 4
            return sw.numpy()[pos]

        def decode(codes, scales):
            return R.e2m1_value(R.unpack(codes)) * np.repeat(R.e4m3_decode(scales), 16, axis=1)

        def stand_in(a, bt, scale_a, scale_b, out_dtype):
            b = bt.t()
            m, n, k = a.shape[0], b.shape[0], a.shape[1] * 2
            calls.append((tuple(a.shape), tuple(bt.shape), tuple(scale_a.shape), out_dtype))
            va = decode(a.numpy(), unswizzle(scale_a, m, k // 16)).astype(np.float64)
            vb = decode(b.contiguous().numpy(), unswizzle(scale_b, n, k // 16)).astype(np.float64)
            return torch.from_numpy((va @ vb.T).astype(np.float32)).to(out_dtype)

        functional = fp4q.functional
        for name, value in (("float4_e2m1fn_x2", torch.uint8), ("float8_e4m3fn", torch.uint8),
                            ("_scaled_mm", stand_in)):
            if not hasattr(torch, name):
                setattr(torch, name, value)
                self.addCleanup(delattr, torch, name)
        chosen = fp4q.Fp4MmPath("scaled_mm", "stand-in")
        original_path = functional.fp4_mm_path
        functional.fp4_mm_path = lambda a, b: chosen
        self.addCleanup(setattr, functional, "fp4_mm_path", original_path)
        if torch._scaled_mm is not stand_in:
            self.skipTest("this torch has a real _scaled_mm; the GPU checks cover it")

        a, b = randn(40, 64, seed=20), randn(24, 64, seed=21)
        qa, qb = R.quantize_nvfp4(a.numpy()), R.quantize_nvfp4(b.numpy())
        alpha = np.float32(qa["s_dec"]) * np.float32(qb["s_dec"])
        va = R.e2m1_value(qa["codes"]) * np.repeat(R.e4m3_decode(qa["scales"]), 16, axis=1)
        vb = R.e2m1_value(qb["codes"]) * np.repeat(R.e4m3_decode(qb["scales"]), 16, axis=1)
        expected = (va.astype(np.float64) @ vb.astype(np.float64).T).astype(np.float32) * alpha
        for operands in ((a, b), (fp4q.quantize(a), fp4q.quantize(b))):
            y = fp4q.fp4_mm(*operands)
            self.assertEqual(fp4q.last_fp4_mm_path(), chosen)
            self.assertTrue(np.array_equal(y.numpy(), expected))
        self.assertEqual(calls[0], ((40, 32), (32, 24), (128 * 4,), torch.float32))
        server = fp4q.fp4_mm(a, b, path="server")
        self.assertLess(float((server - y).abs().max() / server.abs().max()), 1e-6)

        def refuses(*args, **kwargs):
            raise RuntimeError("CUDA error: no kernel image for this device\nmore")
        torch._scaled_mm = refuses
        self.addCleanup(setattr, torch, "_scaled_mm", stand_in)
        y = fp4q.fp4_mm(a, b)
        self.assertEqual(fp4q.last_fp4_mm_path(), fp4q.Fp4MmPath(
            "server", "torch._scaled_mm refused the operands (CUDA error: no kernel image for "
            "this device)"))
        self.assertTrue(torch.equal(y, server))
        with self.assertRaises(fp4q.Fp4qError) as cm:
            fp4q.fp4_mm(a, b, path="scaled_mm")
        self.assertEqual(cm.exception.message, "fp4_mm: torch._scaled_mm refused the operands: "
                         "CUDA error: no kernel image for this device\nmore")

    def test_swizzle_is_the_tensor_core_layout(self):
        s = torch.randint(0, 255, (200, 12), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(7))
        out = fp4q.swizzle_scales(s)
        self.assertEqual(tuple(out.shape), (256 * 12,))
        self.assertTrue(np.array_equal(out.numpy(), R.swizzle_scales(s.numpy())))


class ErrorFeedbackSequenceTest(unittest.TestCase):
    def run_script(self, name, steps, **kwargs):
        """What a ported training script does: a new ErrorFeedback, steps 0..steps-1."""
        ef = fp4q.ErrorFeedback(stochastic=True, seed=9, **kwargs)
        w = randn(16, 32, seed=8)
        return ef, [ef.qdq(name, w, step) for step in range(steps)]

    def test_running_the_script_twice_starts_afresh(self):
        name = "ef-twice-%d" % os.getpid()
        _, first = self.run_script(name, 5)
        _, second = self.run_script(name, 5)  # was: "step 0 is older than the last step 4"
        for a, b in zip(first, second):
            self.assertTrue(torch.equal(a, b))
        listing = {t.name: t for t in CLIENT.list_tensors()}
        self.assertEqual(listing[name].last_step, 4)

    def test_reset_ends_the_sequence(self):
        name = "ef-reset-%d" % os.getpid()
        ef, _ = self.run_script(name, 3)
        with self.assertRaises(fp4q.Fp4qError) as cm:
            ef.qdq(name, randn(16, 32, seed=8), 1)
        self.assertEqual(cm.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(ef.reset(), 1)
        self.assertNotIn(name, {t.name for t in CLIENT.list_tensors()})
        ef.qdq(name, randn(16, 32, seed=8), 0)
        self.assertEqual(ef.reset(name), 1)
        self.assertEqual(ef.reset(name), 0)  # nothing left: fresh all the same

    def test_resume_keeps_the_servers_residual(self):
        name = "ef-resume-%d" % os.getpid()
        _, first = self.run_script(name, 3)
        ef = fp4q.ErrorFeedback(stochastic=True, seed=9, resume=True)
        w = randn(16, 32, seed=8)
        with self.assertRaises(fp4q.Fp4qError) as cm:
            ef.qdq(name, w, 2)
        self.assertEqual(cm.exception.code, grpc.StatusCode.ALREADY_EXISTS)
        continued = ef.qdq(name, w, 3)
        _, uninterrupted = self.run_script(name, 4)
        self.assertTrue(torch.equal(continued, uninterrupted[3]))

    def test_scopes_keep_jobs_apart(self):
        name = "w-%d" % os.getpid()
        a, _ = self.run_script(name, 2, scope="job-a")
        b, _ = self.run_script(name, 4, scope="job-b")
        self.assertEqual(a.key(name), "job-a/" + name)
        listing = {t.name: t.last_step for t in CLIENT.list_tensors()}
        self.assertEqual((listing["job-a/" + name], listing["job-b/" + name]), (1, 3))
        self.assertEqual(a.reset(), 1)
        self.assertIn("job-b/" + name, {t.name for t in CLIENT.list_tensors()})
        b.reset()
        with self.assertRaisesRegex(fp4q.ClientArgumentError, r"scope: 'bad scope' is not a name"):
            fp4q.ErrorFeedback(scope="bad scope")

    def test_a_weight_name_is_refused_and_kept(self):
        name = "ef-weight-%d" % os.getpid()
        CLIENT.create_weight(name, randn(16, 32, seed=10))
        self.addCleanup(CLIENT.delete_weight, name)
        ef = fp4q.ErrorFeedback()
        with self.assertRaisesRegex(fp4q.ClientArgumentError,
                                    r"name: '%s' is a stored weight on the server" % name):
            ef.qdq(name, randn(16, 32, seed=11), 0)
        self.assertIn(name, {t.name for t in CLIENT.list_tensors()})


if __name__ == "__main__":
    unittest.main()
