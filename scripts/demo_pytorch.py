"""The Python part of scripts/demo.sh: what a PyTorch team does with fp4q, through the client
installed with pip (the demo runs this file with its venv's interpreter).

  demo_pytorch.py train --server ADDR --out DIR [--steps N] [--seed N]
      the fp4-train functions (quantize, dequantize, fp4_mm), then a small model whose MLP is
      trained with fp4q.nn.Linear against the same model in fp32, then the fp32 model with its
      weights stored in 4 bits on fp4qd by fp4q.optim.AdamW (round-to-nearest with and without
      error feedback, --stored-lr); writes DIR/model.safetensors (the fp4q.nn.Linear model's
      weights, for the CLI step) and DIR/pytorch.json
  demo_pytorch.py check-checkpoint --out DIR
      reads DIR/model.safetensors and what `fp4q quantize` / `fp4q dequantize` made of it
      (DIR/nvfp4/model.safetensors, DIR/dequantized.safetensors) and checks them

Every check printed is asserted: the exit status is 1 when one fails, naming it.
"""

import argparse
import json
import os
import struct
import sys
import time

import numpy as np
import torch

import fp4q


class Checks:
    def __init__(self):
        self.failed = []

    def check(self, text, passed, detail):
        print("  %-58s %s  (%s)" % (text, "yes" if passed else "FAILED", detail))
        if not passed:
            self.failed.append(text)


def write_safetensors(path, tensors):
    """{name: float32 torch tensor} as a safetensors file (F32)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    body = raw[8 + n:]
    return {k: (v["dtype"], tuple(v["shape"]), body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


class TinyModel(torch.nn.Module):
    """Token ids -> 16 outputs: an embedding, a norm and an MLP, named as in Llama-family
    checkpoints. `linear` makes the MLP's layers (torch.nn.Linear or fp4q.nn.Linear)."""

    def __init__(self, linear, vocab=256, d=32, hidden=128, d_out=16):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, d)
        self.norm = torch.nn.LayerNorm(d)
        self.up_proj = linear(d, hidden)
        self.down_proj = linear(hidden, d_out)

    def forward(self, ids):
        return self.down_proj(torch.relu(self.up_proj(self.norm(self.embed_tokens(ids)))))


NAMES = {"embed_tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
         "norm.bias": "model.norm.bias", "up_proj.weight": "model.mlp.up_proj.weight",
         "up_proj.bias": "model.mlp.up_proj.bias", "down_proj.weight": "model.mlp.down_proj.weight",
         "down_proj.bias": "model.mlp.down_proj.bias"}


def train(args):
    checks = Checks()
    print("fp4q %s, installed at %s" % (fp4q.__version__, os.path.dirname(fp4q.__file__)))
    client = fp4q.Client(args.server, timeout=120)
    fp4q.set_default_client(client)
    torch.manual_seed(args.seed)

    print("\nthe fp4-train functions, served by fp4qd:")
    x = torch.randn(64, 128)
    w = torch.randn(96, 128) * 0.1
    q = fp4q.quantize(x)  # an fp4q.Fp4Tensor; unpacks as fp4-train's (packed, scale)
    packed, scale = q
    print("  quantize(x [64, 128]) -> packed %s %s, scale %s %s, s_enc %.6g" % (
        packed.dtype, list(packed.shape), scale.dtype, list(scale.shape), q.s_enc))
    err = float((fp4q.dequantize(q) - x).norm() / x.norm())
    checks.check("dequantize(quantize(x)) within 15% of x (Frobenius)", err < 0.15,
                 "relative error %.4f" % err)
    y = fp4q.fp4_mm(x, w)  # x @ w^T, both operands NVFP4
    path = fp4q.last_fp4_mm_path()
    print("  fp4_mm(x, w) = x @ w^T %s ran on: %s (%s)" % (list(y.shape), path.kind, path.reason))
    ref = x @ w.t()
    err = float((y - ref).norm() / ref.norm())
    checks.check("fp4_mm(x, w) within 20% of x @ w^T in fp32", err < 0.2,
                 "relative error %.4f" % err)

    print("\na small model (embedding 256 x 32, norm, MLP 32 -> 128 -> 16), trained %d steps with "
          "Adam (lr 1e-2),\nits MLP in fp32 and in NVFP4 (fp4q.nn.Linear: every GEMM on fp4qd):"
          % args.steps)
    ids = torch.randint(0, 256, (512,))
    target = torch.randn(256, 16)[ids]
    fp32 = TinyModel(torch.nn.Linear)
    nvfp4 = TinyModel(lambda i, o: fp4q.nn.Linear(i, o, seed=args.seed))
    nvfp4.load_state_dict(fp32.state_dict())  # the same start
    init = {k: v.clone() for k, v in fp32.state_dict().items()}
    results = {}
    for name, m in (("fp32", fp32), ("nvfp4", nvfp4)):
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        losses = []
        for _ in range(args.steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(ids), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        results[name] = losses
        print("  %-6s start loss %.5f  final loss %.5f" % (name, losses[0], losses[-1]))
    f32, f4 = results["fp32"], results["nvfp4"]
    checks.check("NVFP4 model: final loss <= 0.25 x its start", f4[-1] <= 0.25 * f4[0],
                 "%.5f vs %.5f" % (f4[-1], 0.25 * f4[0]))
    zero = float((target ** 2).mean())
    checks.check("NVFP4 model: final loss <= 0.15 x predicting 0's", f4[-1] <= 0.15 * zero,
                 "%.5f vs %.5f" % (f4[-1], 0.15 * zero))
    print("  (fp32 memorises the table further, to %.5f; with weights, activations and "
          "gradients in NVFP4 the model stops higher)" % f32[-1])

    # The trainer's step: the fp32 model again, its 2-D weights (embedding and MLP) stored in
    # NVFP4 on fp4qd by fp4q.optim.AdamW; step() sends every gradient in one Step call and
    # writes DQ(W) back into the parameters. The norm and the biases stay in torch.
    print("\nthe fp32 model with its weights stored in 4 bits on fp4qd (fp4q.optim.AdamW, lr "
          "%g, %d steps):" % (args.stored_lr, args.steps))
    stored = {}
    for label, ef in (("rtn", False), ("rtn+ef", True)):
        m = TinyModel(torch.nn.Linear)
        m.load_state_dict(init)
        opt = fp4q.optim.AdamW(m.parameters(), lr=args.stored_lr, error_feedback=ef,
                               name_prefix="demo-%s/" % label.replace("+", "-"), existing="replace")
        losses, step_ms = [], []
        for _ in range(args.steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(ids), target)
            loss.backward()
            t0 = time.perf_counter()
            opt.step()
            step_ms.append((time.perf_counter() - t0) * 1e3)
            losses.append(loss.item())
        stored[label] = losses
        print("  %-7s start loss %.5f  final loss %.5f  (%s; optimizer step %.2f ms median, "
              "one Step call)" % (label, losses[0], losses[-1], repr(opt),
                                  sorted(step_ms)[len(step_ms) // 2]))
    results["stored"] = stored
    rtn, ef = stored["rtn"], stored["rtn+ef"]
    checks.check("4-bit stored weights with error feedback: final loss <= 0.25 x its start",
                 ef[-1] <= 0.25 * ef[0], "%.5f vs %.5f" % (ef[-1], 0.25 * ef[0]))
    checks.check("round-to-nearest alone learns less: its final loss >= 2 x error feedback's",
                 rtn[-1] >= 2.0 * ef[-1], "%.5f vs %.5f" % (rtn[-1], 2.0 * ef[-1]))

    os.makedirs(args.out, exist_ok=True)
    weights = {NAMES[k]: v for k, v in nvfp4.state_dict().items()}
    write_safetensors(os.path.join(args.out, "model.safetensors"), weights)
    with open(os.path.join(args.out, "pytorch.json"), "w") as f:
        json.dump({"losses": results, "fp4_mm_path": path.kind, "failed": checks.failed}, f)
    print("  wrote %s (the NVFP4-trained weights, for the CLI step)" %
          os.path.join(args.out, "model.safetensors"))
    client.close()
    return checks


def check_checkpoint(args):
    checks = Checks()
    src = read_safetensors(os.path.join(args.out, "model.safetensors"))
    q = read_safetensors(os.path.join(args.out, "nvfp4", "model.safetensors"))
    dq = read_safetensors(os.path.join(args.out, "dequantized.safetensors"))
    with open(os.path.join(args.out, "nvfp4", "hf_quant_config.json")) as f:
        config = json.load(f)
    print("  %-36s %-8s %s" % ("tensor in nvfp4/model.safetensors", "dtype", "shape"))
    for name in sorted(q):
        print("  %-36s %-8s %s" % (name, q[name][0], list(q[name][1])))
    for name in ("model.mlp.up_proj.weight", "model.mlp.down_proj.weight"):
        rows, cols = src[name][1]
        module = name[:-len(".weight")]
        layout = (q[name][:2], q[name + "_scale"][:2], q[name + "_scale_2"][:2],
                  q[module + ".input_scale"][:2])
        expected = (("U8", (rows, cols // 2)), ("F8_E4M3", (rows, cols // 16)), ("F32", (1,)),
                    ("F32", (1,)))
        checks.check("%s: ModelOpt NVFP4 tensors and shapes" % module, layout == expected,
                     "%s" % (layout,))
        x = np.frombuffer(src[name][2], "<f4")
        y = np.frombuffer(dq[name][2], "<f4")
        err = float(np.linalg.norm(y - x) / np.linalg.norm(x))
        checks.check("%s: dequantized within 15%% of the original" % module, err < 0.15,
                     "relative error %.4f" % err)
    quant = config["quantization"]
    checks.check("hf_quant_config.json: NVFP4, group_size 16, the embedding left dense",
                 (quant["quant_algo"], quant["group_size"], quant["exclude_modules"]) ==
                 ("NVFP4", 16, ["model.embed_tokens"]),
                 "%s, %s, %s" % (quant["quant_algo"], quant["group_size"],
                                 quant["exclude_modules"]))
    dense = sorted(n for n in src if not n.endswith("_proj.weight"))
    checks.check("embedding, norm and biases copied unchanged",
                 all(q[n] == src[n] for n in dense), ", ".join(dense))
    return checks


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--server", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=100)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--stored-lr", type=float, default=1e-2,
                   help="AdamW's learning rate for the 4-bit stored weights (default 1e-2)")
    c = sub.add_parser("check-checkpoint")
    c.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    checks = train(args) if args.command == "train" else check_checkpoint(args)
    if checks.failed:
        print("demo_pytorch.py: FAILED: %s" % "; ".join(checks.failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
