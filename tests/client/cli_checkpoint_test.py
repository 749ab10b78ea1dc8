"""`fp4q quantize` writes checkpoints the ModelOpt NVFP4 loaders of vLLM and SGLang read.

Checked against that convention (docs/CHECKPOINTS.md): for a quantized Linear weight
"M.weight" [r, c]: "M.weight" U8 [r, c/2], "M.weight_scale" F8_E4M3 [r, c/16],
"M.weight_scale_2" F32 (one value, amax / 2688), "M.input_scale" F32 (one value); the modules
left dense in hf_quant_config.json's exclude_modules; quant_algo "NVFP4", group_size 16,
kv_cache_quant_algo present. Fused siblings (q/k/v, gate/up) share weight_scale_2.

The written file is decoded here by a decoder of its own (this file's safetensors reader,
E2M1 table and E4M3 decoding; nothing from fp4q), as an inference engine would decode it, and
compared bit for bit with `fp4q dequantize`, with the numpy reference quantization, and with the
original values (error within one grid step of each block).

Environment (tests/client/CMakeLists.txt): FP4Q_CLI, FP4Q_FP4QD, PYTHONPATH with tests/python
(fp4q_testing starts the server, fp4q_reference is the numerics oracle).
"""

import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest

import numpy as np

import fp4q_reference as R
import fp4q_testing

SERVER = None
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
ST_DTYPES = {"F32": ("<f4", 4), "BF16": ("<u2", 2), "F16": ("<f2", 2), "U8": ("u1", 1),
             "F8_E4M3": ("u1", 1), "I64": ("<i8", 8)}


def setUpModule():
    global SERVER
    SERVER = fp4q_testing.Server()


def tearDownModule():
    SERVER.stop()


# ---------------------------------------------------------------- the test's own file format

def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype name, numpy array of that dtype's storage)}."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, array) in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    """({name: (dtype name, shape, raw bytes)}, metadata)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    metadata = header.pop("__metadata__", {})
    body = raw[8 + n:]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        out[name] = (info["dtype"], tuple(info["shape"]), body[begin:end])
    return out, metadata


def as_array(entry):
    dtype, shape, data = entry
    return np.frombuffer(data, ST_DTYPES[dtype][0]).reshape(shape)


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def e4m3_to_f32(byte):
    """E4M3 (1 sign, 4 exponent bits, bias 7, 3 mantissa bits; 0x7F/0xFF NaN) as float32."""
    b = byte.astype(np.int32)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e, m = (b >> 3) & 0xF, b & 0x7
    value = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    value = np.where((b & 0x7F) == 0x7F, np.nan, value)
    return (sign * value).astype(np.float32)


def decode(codes_u8, scales_u8, scale_2):
    """What a loader computes: e2m1(code) * e4m3(scale) * weight_scale_2, in f32."""
    rows = codes_u8.shape[0]
    codes = np.empty((rows, codes_u8.shape[1] * 2), np.uint8)
    codes[:, 0::2] = codes_u8 & 0xF
    codes[:, 1::2] = codes_u8 >> 4
    block = np.repeat(e4m3_to_f32(scales_u8), 16, axis=1)
    return (E2M1[codes] * block) * np.float32(scale_2)


# ---------------------------------------------------------------- the model

def llama_like(rng, dtype="F32"):
    """A two-layer model with the tensor names of Llama-family checkpoints."""
    def w(*shape, scale=1.0):
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        if dtype == "BF16":
            return ("BF16", (x.view(np.uint32) >> 16).astype(np.uint16))
        return ("F32", x)
    t = {"model.embed_tokens.weight": w(64, 32), "model.norm.weight": w(32),
         "lm_head.weight": w(64, 32)}
    for i in range(2):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = w(32)
        t[p + "post_attention_layernorm.weight"] = w(32)
        t[p + "self_attn.q_proj.weight"] = w(32, 32)
        t[p + "self_attn.k_proj.weight"] = w(16, 32, scale=3.0)  # the group's largest amax
        t[p + "self_attn.v_proj.weight"] = w(16, 32, scale=0.5)
        t[p + "self_attn.o_proj.weight"] = w(32, 32, scale=0.25)
        t[p + "mlp.gate_proj.weight"] = w(48, 32)
        t[p + "mlp.up_proj.weight"] = w(48, 32, scale=2.0)
        t[p + "mlp.down_proj.weight"] = w(32, 48)
    return t


def values_f32(entry):
    dtype, array = entry
    return bf16_bits_to_f32(array) if dtype == "BF16" else array


class CheckpointTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="fp4q-ckpt-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.cli = os.environ.get("FP4Q_CLI") or os.path.join(fp4q_testing.REPO, "build", "bin",
                                                              "fp4q")

    def run_cli(self, *args, ok=True):
        done = subprocess.run([self.cli, "--server", SERVER.target] + list(args),
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, FP4Q_TOKEN=""))
        if ok:
            self.assertEqual(done.returncode, 0, done.stderr)
        return done

    def quantize_model(self, dtype="F32", extra=()):
        rng = np.random.default_rng(11)
        model = llama_like(rng, dtype)
        src = os.path.join(self.dir, "model.safetensors")
        write_safetensors(src, model, {"format": "pt"})
        out_dir = os.path.join(self.dir, "nvfp4")
        os.mkdir(out_dir)
        out = os.path.join(out_dir, "model.safetensors")
        done = self.run_cli("quantize", src, out, *extra)
        return model, src, out, done

    def test_names_dtypes_shapes_and_config_follow_modelopt(self):
        model, _, out, done = self.quantize_model()
        config_path = os.path.join(os.path.dirname(out), "hf_quant_config.json")
        self.assertIn("wrote %s\n" % config_path, done.stdout)
        tensors, metadata = read_safetensors(out)
        linear = [n for n in model if n.endswith("_proj.weight")]
        self.assertEqual(len(linear), 14)
        for name in linear:
            rows, cols = model[name][1].shape
            module = name[:-len(".weight")]
            self.assertEqual(tensors[name][:2], ("U8", (rows, cols // 2)), name)
            self.assertEqual(tensors[name + "_scale"][:2], ("F8_E4M3", (rows, cols // 16)), name)
            self.assertEqual(tensors[name + "_scale_2"][:2], ("F32", (1,)), name)
            self.assertEqual(tensors[module + ".input_scale"][:2], ("F32", (1,)), name)
            self.assertEqual(float(as_array(tensors[module + ".input_scale"])[0]), 1.0)
        dense = [n for n in model if n not in linear]
        for name in dense:  # embeddings, norms, lm_head: bytes, dtype and shape unchanged
            dtype, array = model[name]
            self.assertEqual(tensors[name], (dtype, array.shape, array.tobytes()), name)
        expected = set(linear) | set(dense)
        expected |= {n + s for n in linear for s in ("_scale", "_scale_2")}
        expected |= {n[:-len(".weight")] + ".input_scale" for n in linear}
        self.assertEqual(set(tensors), expected)

        with open(config_path) as f:
            config = json.load(f)
        self.assertEqual(config["producer"]["name"], "fp4q")
        self.assertEqual(config["quant_method"], "modelopt_fp4")
        q = config["quantization"]
        self.assertEqual(q["quant_algo"], "NVFP4")
        self.assertEqual(q["group_size"], 16)
        self.assertIn("kv_cache_quant_algo", q)
        self.assertIsNone(q["kv_cache_quant_algo"])
        # The 2-D tensors left dense; norms are 1-D and never quantized, so not listed.
        self.assertEqual(q["exclude_modules"], ["lm_head", "model.embed_tokens"])

        self.assertEqual(metadata["format"], "pt")
        self.assertEqual(metadata["fp4q.format"], "nvfp4")
        self.assertEqual(metadata["fp4q.block"], "1x16")
        self.assertEqual(metadata["fp4q.rounding"], "rtn")
        self.assertEqual(json.loads(metadata["fp4q.original_dtypes"]),
                         {n: "F32" for n in linear})
        groups = json.loads(metadata["fp4q.scale_groups"])
        self.assertEqual(groups["model.layers.1.self_attn.k_proj.weight"],
                         "model.layers.1.self_attn.{q,k,v}_proj.weight")
        self.assertEqual(groups["model.layers.0.mlp.up_proj.weight"],
                         "model.layers.0.mlp.{gate,up}_proj.weight")
        self.assertNotIn("model.layers.0.mlp.down_proj.weight", groups)

    def test_an_independent_decoder_reads_what_dequantize_and_the_reference_give(self):
        model, _, out, _ = self.quantize_model()
        tensors, _ = read_safetensors(out)
        dq_path = os.path.join(self.dir, "dq.safetensors")
        self.run_cli("dequantize", out, dq_path)
        dq, dq_meta = read_safetensors(dq_path)
        self.assertNotIn("fp4q.block", dq_meta)
        for layer in range(2):
            p = "model.layers.%d." % layer
            groups = [[p + "self_attn.%s_proj.weight" % k for k in "qkv"],
                      [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"],
                      [p + "self_attn.o_proj.weight"], [p + "mlp.down_proj.weight"]]
            for group in groups:
                amax = max(float(np.abs(values_f32(model[n])).max()) for n in group)
                scale_2 = {float(as_array(tensors[n + "_scale_2"])[0]) for n in group}
                self.assertEqual(len(scale_2), 1, group)  # one global scale per fused group
                s_enc = np.float32(2688.0) / np.float32(amax)
                self.assertEqual(scale_2.pop(), float(np.float32(1) / s_enc), group)
                for name in group:
                    x = values_f32(model[name])
                    codes = as_array(tensors[name])
                    scales = as_array(tensors[name + "_scale"])
                    mine = decode(codes, scales, as_array(tensors[name + "_scale_2"])[0])
                    # fp4q dequantize gives the same bits.
                    self.assertTrue(np.array_equal(mine, as_array(dq[name])), name)
                    self.assertNotIn(name[:-len(".weight")] + ".input_scale", dq)
                    # The numpy reference quantization with the group's amax gives these bytes.
                    ref = R.quantize_nvfp4(x, amax=np.float32(amax))
                    self.assertTrue(np.array_equal(codes, ref["packed"]), name)
                    self.assertTrue(np.array_equal(scales, ref["scales"]), name)
                    # Within one grid step of each block (the largest step, 4 -> 6, is 2 units
                    # of the block scale; clipping at 6 costs less than 1).
                    unit = np.repeat(e4m3_to_f32(scales), 16, axis=1) * as_array(
                        tensors[name + "_scale_2"])[0]
                    self.assertTrue(np.all(np.abs(mine - x) <= unit * 1.0 + 1e-6), name)
                    rel = np.linalg.norm(mine - x) / np.linalg.norm(x)
                    self.assertLess(rel, 0.2, name)

    def test_bf16_originals_and_options_are_recorded(self):
        model, _, out, _ = self.quantize_model("BF16", ("--block", "16x16", "--rounding", "sr",
                                                        "--seed", "5", "--step", "2",
                                                        "--no-shared-scales"))
        tensors, metadata = read_safetensors(out)
        self.assertEqual(metadata["fp4q.block"], "16x16")
        self.assertEqual((metadata["fp4q.rounding"], metadata["fp4q.seed"],
                          metadata["fp4q.step"]), ("sr", "5", "2"))
        self.assertEqual(json.loads(metadata["fp4q.original_dtypes"])[
            "model.layers.0.mlp.down_proj.weight"], "BF16")
        self.assertEqual(json.loads(metadata["fp4q.scale_groups"]), {})
        s2 = {float(as_array(tensors["model.layers.0.self_attn.%s_proj.weight_scale_2" % k])[0])
              for k in "qkv"}
        self.assertEqual(len(s2), 3)  # each its own global scale
        # 16x16: each tile's scale on all of its 16 rows.
        scales = as_array(tensors["model.layers.0.mlp.gate_proj.weight_scale"])
        self.assertTrue(np.array_equal(scales[0:16], np.repeat(scales[0:1], 16, axis=0)))

    def test_shards_share_one_config_and_a_foreign_one_is_refused(self):
        _, src, out, _ = self.quantize_model()
        shard2 = os.path.join(os.path.dirname(out), "model-2.safetensors")
        self.run_cli("quantize", src, shard2, "--exclude", "*.layers.1.mlp.*")
        with open(os.path.join(os.path.dirname(out), "hf_quant_config.json")) as f:
            q = json.load(f)["quantization"]
        self.assertEqual(q["exclude_modules"], [
            "lm_head", "model.embed_tokens", "model.layers.1.mlp.down_proj",
            "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"])

        other = os.path.join(self.dir, "other")
        os.mkdir(other)
        config = os.path.join(other, "hf_quant_config.json")
        with open(config, "w") as f:
            json.dump({"producer": {"name": "modelopt", "version": "0.29"},
                       "quantization": {"quant_algo": "FP8"}}, f)
        done = self.run_cli("quantize", src, os.path.join(other, "m.safetensors"), ok=False)
        self.assertEqual(done.returncode, 1)
        self.assertEqual(done.stderr, "fp4q quantize: FAILED_PRECONDITION: \"%s\" exists and was "
                         "not written by fp4q for NVFP4 with group_size 16 (its producer.name is "
                         "not \"fp4q\"); remove it or write the output to another directory\n"
                         % config)
        self.assertFalse(os.path.exists(os.path.join(other, "m.safetensors")))

    def test_rht_weights_get_no_config(self):
        _, _, out, done = self.quantize_model("F32", ("--rht", "default"))
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(out),
                                                     "hf_quant_config.json")))
        self.assertIn("fp4q quantize: note: no hf_quant_config.json: with --rht the stored "
                      "weights are in the transformed domain", done.stderr)
        self.assertIn("fp4q quantize: note: no shared scale groups with --rht", done.stderr)


if __name__ == "__main__":
    unittest.main()
