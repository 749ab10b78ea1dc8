"""The two tasks' data: 3-digit addition and byte-level text, deterministic from a seed.

Every variant of a run sees the same batches in the same order: batches are drawn from a
torch.Generator of their own (seeded by the run's seed), never from the global generator that
model initialisation and stochastic layers use.

Addition: "123+456=0579\n" (operands 000-999 written with 3 digits, the sum with 4, then a
newline), 13 tokens over a 13-symbol vocabulary. A fixed set of operand pairs (drawn from the
seed, both orders a+b and b+a) is held out of training; training draws uniformly from the rest.
The loss is taken on the 5 answer positions only (4 digits and the newline): the operands are
random and cannot be predicted.

Text: the bytes of every *.py file under a directory (default: this interpreter's standard
library), files sorted by relative path and assigned to validation when the SHA-1 of the path
falls in the first `val_fraction` of the hash space (so the split depends only on the path, not
on which other files exist). Training draws random windows of the training stream; validation
is a fixed set of evenly spaced windows of the validation stream.
"""

import hashlib
import os
import sysconfig

import torch

# ---------------------------------------------------------------- addition

ADD_VOCAB = "0123456789+=\n"
ADD_TOKENS = {c: i for i, c in enumerate(ADD_VOCAB)}
ADD_LEN = 13            # "123+456=0579\n"
ADD_PROMPT = 8          # "123+456="
ADD_ANSWER = 5          # "0579\n"


def encode_addition(a, b):
    """[N] operand tensors -> [N, 13] int64 token ids."""
    s = a + b
    digits = [a // 100, a // 10 % 10, a % 10, None, b // 100, b // 10 % 10, b % 10, None,
              s // 1000, s // 100 % 10, s // 10 % 10, s % 10, None]
    fill = {3: ADD_TOKENS["+"], 7: ADD_TOKENS["="], 12: ADD_TOKENS["\n"]}
    cols = [d if d is not None else torch.full_like(a, fill[i]) for i, d in enumerate(digits)]
    return torch.stack(cols, 1).long()


def decode_addition(tokens):
    return "".join(ADD_VOCAB[int(t)] for t in tokens)


class Addition:
    """Training batches and the held-out probe of 3-digit addition."""

    name = "add"
    vocab_size = len(ADD_VOCAB)
    block_size = ADD_LEN - 1   # the model sees tokens 0..11 and predicts 1..12
    metric_names = ("heldout_accuracy", "heldout_loss")
    metric_best = {"heldout_accuracy": "max", "heldout_loss": "min"}

    def __init__(self, seed, heldout=2000):
        self.seed = seed
        g = torch.Generator().manual_seed(seed * 1000003 + 17)
        pairs = torch.randperm(1000 * 1000, generator=g)
        held = set()
        chosen = []
        for p in pairs.tolist():
            a, b = divmod(p, 1000)
            if (a, b) in held:
                continue
            held.add((a, b))
            held.add((b, a))
            chosen.append((a, b))
            if len(chosen) == heldout:
                break
        mask = torch.ones(1000 * 1000, dtype=torch.bool)
        for a, b in held:
            mask[a * 1000 + b] = False
        self.train_pairs = torch.nonzero(mask).squeeze(1)
        self.heldout = torch.tensor(chosen, dtype=torch.long)
        self.heldout_pairs = len(held)
        self.reset_order()

    def reset_order(self):
        """Back to the first batch: every variant sees the same sequence."""
        self._gen = torch.Generator().manual_seed(self.seed * 1000003 + 29)

    def describe(self):
        return {"train_pairs": int(self.train_pairs.numel()), "heldout_pairs": len(self.heldout),
                "excluded_from_training": self.heldout_pairs, "sequence": ADD_LEN,
                "loss_positions": ADD_ANSWER}

    def batch(self, n):
        """x [n, 12], y [n, 12] with -100 (ignored) on the operand positions."""
        idx = torch.randint(0, self.train_pairs.numel(), (n,), generator=self._gen)
        p = self.train_pairs[idx]
        t = encode_addition(p // 1000, p % 1000)
        x, y = t[:, :-1], t[:, 1:].clone()
        y[:, :ADD_PROMPT - 1] = -100
        return x, y

    def tokens_per_batch(self, n):
        return n * self.block_size

    @torch.no_grad()
    def evaluate(self, model, device, batch=1000):
        """Exact-match accuracy on the held-out pairs and the loss on their answer positions.

        One teacher-forced forward per pair: the answer is right when the argmax at each of the
        5 answer positions, given the true prefix, is the true token. That is greedy decoding
        getting all 5 tokens right (each greedy step then sees the true prefix), up to the
        floating-point difference between one full-sequence forward and 5 prefix forwards."""
        correct, loss_sum, count = 0, 0.0, 0
        for i in range(0, len(self.heldout), batch):
            ab = self.heldout[i:i + batch]
            t = encode_addition(ab[:, 0], ab[:, 1]).to(device)
            logits = model(t[:, :-1])[:, ADD_PROMPT - 1:].float()
            tgt = t[:, ADD_PROMPT:]
            loss_sum += float(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="sum"))
            count += tgt.numel()
            correct += int((logits.argmax(-1) == tgt).all(1).sum())
        return {"heldout_accuracy": correct / len(self.heldout),
                "heldout_loss": loss_sum / count}


# ---------------------------------------------------------------- text


def default_text_dir():
    return sysconfig.get_paths()["stdlib"]


def _is_val(rel, val_fraction):
    h = int.from_bytes(hashlib.sha1(rel.encode()).digest()[:8], "big")
    return h < val_fraction * 2**64


class Text:
    """Byte-level language modelling on the *.py files under `root`."""

    name = "text"
    vocab_size = 256
    metric_names = ("val_bpb",)
    metric_best = {"val_bpb": "min"}

    def __init__(self, seed, root=None, block_size=128, val_fraction=0.1,
                 max_train_bytes=16 << 20, max_val_bytes=2 << 20, val_windows=256):
        self.root = os.path.abspath(root or default_text_dir())
        self.block_size = block_size
        files = []
        for d, dirs, names in os.walk(self.root):
            dirs[:] = sorted(x for x in dirs if x not in ("__pycache__", "site-packages",
                                                          "dist-packages"))
            files += [os.path.relpath(os.path.join(d, n), self.root) for n in names
                      if n.endswith(".py")]
        files.sort()
        if not files:
            raise RuntimeError("no *.py files under %s (--text-dir)" % self.root)
        train, val = bytearray(), bytearray()
        digest = hashlib.sha1()
        n_train = n_val = 0
        for rel in files:
            dst, cap = (val, max_val_bytes) if _is_val(rel, val_fraction) else (train,
                                                                              max_train_bytes)
            if len(dst) >= cap:
                continue
            with open(os.path.join(self.root, rel), "rb") as f:
                data = f.read()
            dst += data[:cap - len(dst)]
            digest.update(rel.encode() + b"\0" + data)
            if dst is val:
                n_val += 1
            else:
                n_train += 1
        if len(val) < (block_size + 1) * val_windows or len(train) < 100 * block_size:
            raise RuntimeError("%s: too little text (train %d bytes, validation %d)" %
                               (self.root, len(train), len(val)))
        self.train = torch.frombuffer(train, dtype=torch.uint8).long()
        self.val = torch.frombuffer(val, dtype=torch.uint8).long()
        self.files = (n_train, n_val)
        self.sha1 = digest.hexdigest()
        stride = (len(self.val) - block_size - 1) // (val_windows - 1)
        self.val_starts = torch.arange(val_windows) * stride
        self.seed = seed
        self.reset_order()

    def reset_order(self):
        """Back to the first batch: every variant sees the same sequence."""
        self._gen = torch.Generator().manual_seed(self.seed * 1000003 + 31)

    def describe(self):
        return {"root": self.root, "train_files": self.files[0], "val_files": self.files[1],
                "train_bytes": int(self.train.numel()), "val_bytes": int(self.val.numel()),
                "val_windows": int(self.val_starts.numel()), "sha1": self.sha1,
                "block_size": self.block_size}

    def _windows(self, stream, starts):
        off = starts[:, None] + torch.arange(self.block_size + 1)[None, :]
        t = stream[off]
        return t[:, :-1], t[:, 1:]

    def batch(self, n):
        starts = torch.randint(0, len(self.train) - self.block_size - 1, (n,),
                               generator=self._gen)
        return self._windows(self.train, starts)

    def tokens_per_batch(self, n):
        return n * self.block_size

    @torch.no_grad()
    def evaluate(self, model, device, batch=64):
        """Validation loss in bits per byte over the fixed validation windows."""
        total, count = 0.0, 0
        for i in range(0, len(self.val_starts), batch):
            x, y = self._windows(self.val, self.val_starts[i:i + batch])
            logits = model(x.to(device)).float()
            total += float(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.to(device).reshape(-1), reduction="sum"))
            count += y.numel()
        return {"val_bpb": total / count / 0.6931471805599453}


def make_task(name, seed, text_dir=None, block_size=128, heldout=2000):
    if name == "add":
        return Addition(seed, heldout)
    if name == "text":
        return Text(seed, text_dir, block_size=block_size)
    raise ValueError("unknown task %r (add, text)" % name)
