#!/usr/bin/python3
"""Train labml's autoregressive AFT character model on Debian's fortunes, and
write the checkpoint and the PyTorch fixtures that lib/tests/test_model.c
checks aft's model against.

    /usr/bin/python3 testdata/model/train_labml_aft.py            # train, export, fixtures
    /usr/bin/python3 testdata/model/train_labml_aft.py --fixtures # fixtures from the shipped checkpoint
    /usr/bin/python3 testdata/model/train_labml_aft.py --check    # recompute them and compare
    /usr/bin/python3 testdata/model/train_labml_aft.py --texts DIR        # the split, for aft train
    /usr/bin/python3 testdata/model/train_labml_aft.py --ship aft.safetensors  # aft train's checkpoint
                                                                  # shipped as float16, then fixtures

Needs Debian's python3-torch and numpy (/usr/bin/python3) and the text of the
`fortunes` package (apt-get install fortunes): every fortune file in
/usr/share/games/fortunes.

The model is labml's AutoregressiveTransformer from
labml_nn/transformers/aft/experiment.py (labmlai/annotated_deep_learning_paper_implementations),
written here from the facts of its source, not imported (labml is not
installed, and PyPI is not reachable):

  src_embed   EmbeddingsWithPositionalEncoding (models.py): `linear` an
              nn.Embedding(n_vocab, d_model); forward = linear(x) * sqrt(d_model)
              + positional_encodings[:T], the buffer [max_len = 5000, 1, d_model]
              (registered with register_buffer, so in the state dict) of
              get_positional_encoding (positional_encoding.py):
              PE[p, 2i] = sin(p * exp(2i * -(ln 10000 / d_model))), PE[p, 2i+1] = cos(same)
  encoder     Encoder (models.py): `layers` = n_layers deep copies of one
              TransformerLayer, then `norm` = nn.LayerNorm([d_model]) (eps 1e-5)
  layer       TransformerLayer (models.py), pre-norm:
              z = norm_self_attn(x); x = x + dropout(self_attn(query=z, key=z, value=z, mask))
              z = norm_ff(x);        x = x + dropout(feed_forward(z))
              children registered in the order self_attn, feed_forward,
              dropout, norm_self_attn, norm_ff (src_attn is None)
  self_attn   AFTLocal(d_model, seq_len, local_window_size) (aft/__init__.py),
              the module of testdata/torch_aft.py (LabmlAFTLocal): query, key,
              value Linear(d, d) with bias, pos_bias [seq_len, seq_len] (zeros
              at init), local_mask [seq_len, seq_len] BOOL nn.Parameter
              (requires_grad False, so in the state dict), output Linear(d, d);
              w = pos_bias[:T, :T] * local_mask[:T, :T] (0 outside |t - t'| < s,
              those keys still count), -inf where labml's causal mask
              (utils.py subsequent_mask: tril(ones(T, T)).unsqueeze(-1)) hides t' > t
  feed_forward FeedForward (feed_forward.py): layer1 Linear(d, d_ff), ReLU,
              dropout, layer2 Linear(d_ff, d); bias1 = bias2 = True
              (configs.py FeedForwardConfigs), not gated
  generator   Generator (models.py): projection = Linear(d_model, n_vocab)

Sizes as the experiment sets them: d_model 128, d_ff 256, local_window_size
32, seq_len 256, n_layers 6 (TransformerConfigs' default), dropout 0.1
(TransformerConfigs' default). Tensors are seq-first, [T, B, ...].

What differs from labml's run, and why: the text (the fortunes Debian ships
instead of Tiny Shakespeare, which needs a download), the vocabulary (sorted
characters of that text), the optimiser (Adam with a warm-up and a cosine
decay, and a larger learning rate for pos_bias, see train(): a run of minutes
instead of labml's 128 epochs with Noam) and the length of the run.

The checkpoint holds model.state_dict() under its own names and order, every
float tensor as float16 (local_mask stays BOOL), with metadata "vocab" (a
JSON array of the characters, index = token id), "window", and what the run
was. The fixtures are computed from those float16 weights read back.
"""
import argparse
import copy
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from torch_aft import LabmlAFTLocal, labml_causal_mask, write_safetensors  # noqa: E402

FORTUNES = "/usr/share/games/fortunes"
CKPT_NAME = "labml_aft_fortunes.safetensors"

D_MODEL, D_FF, WINDOW, SEQ_LEN, N_LAYERS, MAX_LEN = 128, 256, 32, 256, 6, 5000


# --------------------------------------------------------------------- data

def read_fortunes():
    """Every fortune file of the package, in name order, as one text; and the
    split: every tenth fortune (entries end with a line '%') is validation."""
    names = sorted(n for n in os.listdir(FORTUNES)
                   if not n.endswith(".dat") and not os.path.islink(os.path.join(FORTUNES, n)))
    if not names:
        sys.exit("no fortunes in %s: apt-get install fortunes" % FORTUNES)
    train, valid, k = [], [], 0
    for n in names:
        with open(os.path.join(FORTUNES, n), encoding="utf-8") as f:
            text = f.read()
        for entry in text.split("%\n"):
            if not entry:
                continue
            (valid if k % 10 == 9 else train).append(entry + "%\n")
            k += 1
    return names, "".join(train), "".join(valid)


# ------------------------------------------------------------------ modules

def get_positional_encoding(d_model, max_len):
    """[max_len, 1, d_model] float32: sin at even features, cos at odd."""
    pe = torch.zeros(max_len, d_model)
    pos = torch.arange(0, max_len, dtype=torch.float32).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    div = torch.exp(two_i * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe.unsqueeze(1)


class EmbeddingsWithPositionalEncoding(nn.Module):
    def __init__(self, d_model, n_vocab, max_len=MAX_LEN):
        super().__init__()
        self.linear = nn.Embedding(n_vocab, d_model)
        self.d_model = d_model
        self.register_buffer("positional_encodings", get_positional_encoding(d_model, max_len))

    def forward(self, x):
        pe = self.positional_encodings[:x.shape[0]]
        return self.linear(x) * math.sqrt(self.d_model) + pe


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout):
        super().__init__()
        self.layer1 = nn.Linear(d_model, d_ff)
        self.layer2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = nn.ReLU()

    def forward(self, x):
        return self.layer2(self.dropout(self.activation(self.layer1(x))))


class TransformerLayer(nn.Module):
    def __init__(self, d_model, self_attn, feed_forward, dropout):
        super().__init__()
        self.size = d_model
        self.self_attn = self_attn
        self.src_attn = None
        self.feed_forward = feed_forward
        self.dropout = nn.Dropout(dropout)
        self.norm_self_attn = nn.LayerNorm([d_model])
        self.norm_ff = nn.LayerNorm([d_model])

    def forward(self, x, mask):
        z = self.norm_self_attn(x)
        x = x + self.dropout(self.self_attn(query=z, key=z, value=z, mask=mask))
        z = self.norm_ff(x)
        return x + self.dropout(self.feed_forward(z))


class Encoder(nn.Module):
    def __init__(self, layer, n_layers):
        super().__init__()
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(n_layers)])
        self.norm = nn.LayerNorm([layer.size])

    def forward(self, x, mask):
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class Generator(nn.Module):
    def __init__(self, n_vocab, d_model):
        super().__init__()
        self.projection = nn.Linear(d_model, n_vocab)

    def forward(self, x):
        return self.projection(x)


class AutoregressiveTransformer(nn.Module):
    def __init__(self, encoder, src_embed, generator):
        super().__init__()
        self.src_embed = src_embed
        self.encoder = encoder
        self.generator = generator

    def forward(self, x):
        """x: [T, B] token ids; logits [T, B, n_vocab]"""
        mask = labml_causal_mask(len(x)).to(x.device)
        return self.generator(self.encoder(self.src_embed(x), mask))


def make_model(n_vocab, n_layers=N_LAYERS, dropout=0.1):
    attn = LabmlAFTLocal(D_MODEL, SEQ_LEN, WINDOW)
    layer = TransformerLayer(D_MODEL, attn, FeedForward(D_MODEL, D_FF, dropout), dropout)
    return AutoregressiveTransformer(Encoder(layer, n_layers),
                                     EmbeddingsWithPositionalEncoding(D_MODEL, n_vocab),
                                     Generator(n_vocab, D_MODEL))


# ------------------------------------------------------------------ training

def batches(ids, T, B, gen):
    """B random windows of T + 1 tokens, seq-first: (x [T, B], y [T, B])"""
    starts = torch.randint(0, len(ids) - T - 1, (B,), generator=gen)
    w = torch.stack([ids[s:s + T + 1] for s in starts.tolist()], dim=1)
    return w[:-1], w[1:]


@torch.no_grad()
def valid_loss(model, ids, T=SEQ_LEN, B=32, limit=None):
    """mean cross entropy over non-overlapping windows of T + 1 tokens"""
    model.eval()
    n = (len(ids) - 1) // T
    if limit:
        n = min(n, limit)
    total, count = 0.0, 0
    for b0 in range(0, n, B):
        w = torch.stack([ids[i * T:i * T + T + 1] for i in range(b0, min(n, b0 + B))], dim=1)
        logits = model(w[:-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[1:].reshape(-1),
                                           reduction="sum")
        total += loss.item()
        count += w[1:].numel()
    model.train()
    return total / count


def train(args, out):
    names, train_text, valid_text = read_fortunes()
    vocab = sorted(set(train_text + valid_text))
    stoi = {c: i for i, c in enumerate(vocab)}
    tr = torch.tensor([stoi[c] for c in train_text], dtype=torch.long)
    va = torch.tensor([stoi[c] for c in valid_text], dtype=torch.long)
    print("fortunes: %d files, %d training and %d validation characters, %d distinct"
          % (len(names), len(tr), len(va), len(vocab)), flush=True)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = make_model(len(vocab), args.layers, args.dropout)
    # pos_bias starts at zero (labml's init) and must reach values of several
    # units before a query can favour its window over the hundreds of keys
    # outside it (weight exp(0) each): at the common learning rate Adam takes
    # thousands of steps for that, so it gets a larger one
    pb = [p for n, p in model.named_parameters() if n.endswith(".pos_bias")]
    rest = [p for n, p in model.named_parameters() if not n.endswith(".pos_bias")]
    opt = torch.optim.Adam([{"params": rest, "mult": 1.0}, {"params": pb, "mult": args.pos_bias_lr_mult}],
                           lr=args.lr, betas=(0.9, 0.98), eps=1e-9)

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        f = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * f)))

    t0 = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step) * g["mult"]
        x, y = batches(tr, SEQ_LEN, args.batch, gen)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, len(vocab)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)   # labml's grad_norm_clip
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            msg = "step %d/%d  loss %.4f  %.0f s" % (step, args.steps, loss.item(), time.time() - t0)
            if step % 250 == 0 and step:
                msg += "  valid (64 windows) %.4f" % valid_loss(model, va, limit=64)
            print(msg, flush=True)
    minutes = (time.time() - t0) / 60
    model.eval()

    meta = {
        "format": "pt",
        "vocab": json.dumps(vocab, ensure_ascii=True),
        "window": str(WINDOW),
        "model": "labml_nn AutoregressiveTransformer, AFTLocal self-attention",
        "data": "Debian package fortunes 1:1.99.1: /usr/share/games/fortunes/{%s}" % ",".join(names),
        "training": "%d steps of %d x %d characters, Adam lr %g (pos_bias %g), dropout %g, seed %d, %.1f minutes"
                    % (args.steps, args.batch, SEQ_LEN, args.lr, args.lr * args.pos_bias_lr_mult, args.dropout,
                       args.seed, minutes),
    }
    named = [(k, v.to(torch.float16) if v.is_floating_point() else v) for k, v in model.state_dict().items()]
    # the validation loss of the weights as shipped (rounded to float16)
    shipped = load_model(named, len(vocab))
    meta["valid_loss"] = "%.4f" % valid_loss(shipped, va)
    ckpt = os.path.join(out, CKPT_NAME)
    write_safetensors(ckpt, named, meta)
    print("wrote %s (%d bytes): valid loss %s nats/char (float16 weights), %.1f minutes of training"
          % (ckpt, os.path.getsize(ckpt), meta["valid_loss"], minutes), flush=True)


# --------------------------------------------------------------- the checkpoint

ST_NP = {"F16": "<f2", "F32": "<f4", "BF16": "<u2", "BOOL": "|b1"}


def read_safetensors(path):
    """[(name, torch tensor)] in file order, and the metadata"""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = []
    for name, h in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        a, b = h["data_offsets"]
        arr = np.frombuffer(raw[base + a:base + b], dtype=ST_NP[h["dtype"]]).reshape(h["shape"])
        if h["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out.append((name, torch.from_numpy(arr.copy())))
    return out, meta


def load_model(named, n_vocab, dtype=torch.float32):
    """a model (eval mode, in dtype) holding exactly these (rounded) weights"""
    n_layers = 1 + max(int(k.split(".")[2]) for k, _ in named if k.startswith("encoder.layers."))
    model = make_model(n_vocab, n_layers, 0.0).to(dtype)
    sd = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in named}
    model.load_state_dict(sd, strict=True)
    return model.eval()


# ----------------------------------------------------------------- fixtures

def feed(ctx, tok, L, keep):
    """the context aft's model state holds: when it holds L tokens and one
    more comes, it keeps the last `keep` (re-encoded from position 0)"""
    if len(ctx) == L:
        del ctx[:L - keep]
    ctx.append(tok)


@torch.no_grad()
def greedy(model, prompt, n_new, L=SEQ_LEN, keep=SEQ_LEN // 2):
    """labml's sampling loop (the whole context through the model for every
    token, argmax of the last row), over the context `feed` keeps. Also the
    smallest gap between the best and second-best logit seen."""
    ctx, out, margin = [], [], float("inf")
    for t in prompt:
        feed(ctx, t, L, keep)
    for i in range(n_new):
        logits = model(torch.tensor(ctx, dtype=torch.long).unsqueeze(-1))[-1, 0]
        top = torch.topk(logits.double(), 2).values
        margin = min(margin, (top[0] - top[1]).item())
        nxt = int(torch.argmax(logits))
        out.append(nxt)
        if i + 1 < n_new:
            feed(ctx, nxt, L, keep)
    return out, margin


PROMPTS = [("It is ", 200), ("The computer ", 200), ("Q:\tWhat do you call ", 600)]


def make_fixtures(out, check=False):
    named, meta = read_safetensors(os.path.join(out, CKPT_NAME))
    vocab = json.loads(meta["vocab"])
    stoi = {c: i for i, c in enumerate(vocab)}
    model = load_model(named, len(vocab))
    model64 = load_model(named, len(vocab), torch.float64)
    _, _, valid_text = read_fortunes()
    va = [stoi[c] for c in valid_text]
    arrays = {}
    with torch.no_grad():
        # one sequence of the whole context, [T]
        seq = torch.tensor(va[1000:1000 + SEQ_LEN], dtype=torch.long)
        arrays["seq_tokens"] = seq.numpy().astype("<i4")
        arrays["seq_logits"] = model(seq.unsqueeze(-1))[:, 0].numpy().astype("<f4")
        # a batch in labml's own layout, seq-first [T, B], and batch-major [B, T]
        tb = torch.tensor(np.array([va[s:s + 100] for s in (5000, 20000, 40000)]).T, dtype=torch.long)
        lt = model(tb)
        arrays["tb_tokens"] = tb.numpy().astype("<i4")
        arrays["tb_logits"] = lt.numpy().astype("<f4")
        arrays["bt_tokens"] = tb.T.contiguous().numpy().astype("<i4")
        arrays["bt_logits"] = lt.transpose(0, 1).contiguous().numpy().astype("<f4")
        worst = 0.0
        for tok, key in ((seq.unsqueeze(-1), "seq_logits"), (tb, "tb_logits")):
            ref = model64(tok).numpy()
            got = arrays[key].reshape(ref.shape)
            worst = max(worst, float(np.max(np.abs(got - ref) / np.maximum(1, np.abs(ref)))))
    print("float32 logits against the float64 model: worst %.2e x max(1, |logit|)" % worst)
    runs = []
    for prompt, n in PROMPTS:
        ids, margin = greedy(model, [stoi[c] for c in prompt], n)
        text = "".join(vocab[i] for i in ids)
        print("greedy %r + %d: smallest gap between the best two logits %.2e" % (prompt, n, margin))
        runs.append({"prompt": prompt, "n_new": n, "text": text, "min_top2_gap": round(margin, 6)})
    greedy_doc = {"context": SEQ_LEN, "keep": SEQ_LEN // 2, "runs": runs}

    if check:
        bad = 0
        for k, a in arrays.items():
            old = np.load(os.path.join(out, k + ".npy"))
            if old.shape != a.shape or old.dtype != a.dtype or \
               np.max(np.abs(old.astype(np.float64) - a) / np.maximum(1, np.abs(a))) > 1e-5:
                print("MISMATCH %s" % k)
                bad += 1
        with open(os.path.join(out, "greedy.json")) as f:
            if json.load(f) != json.loads(json.dumps(greedy_doc)):
                print("MISMATCH greedy.json")
                bad += 1
        print("check: %s" % ("ok" if not bad else "%d mismatches" % bad))
        return 1 if bad else 0
    for k, a in arrays.items():
        np.save(os.path.join(out, k + ".npy"), a)
    with open(os.path.join(out, "greedy.json"), "w") as f:
        json.dump(greedy_doc, f, indent=1, ensure_ascii=True)
        f.write("\n")
    print("wrote %s and greedy.json" % ", ".join(k + ".npy" for k in arrays))
    return 0


def write_texts(out):
    """the text split as train() makes it, as the two files aft train reads"""
    _, tr, va = read_fortunes()
    for name, text in (("fortunes_train.txt", tr), ("fortunes_valid.txt", va)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write(text)
        print("wrote %s: %d characters" % (os.path.join(out, name), len(text)))


def ship(src, out):
    """aft train's checkpoint as the shipped one: float tensors rounded to
    float16 as train() rounds PyTorch's, its metadata kept, and the text
    and the validation loss of the float16 weights (this script's model)
    added"""
    named, meta = read_safetensors(src)
    named = [(k, v.to(torch.float16) if v.is_floating_point() else v) for k, v in named]
    vocab = json.loads(meta["vocab"])
    stoi = {c: i for i, c in enumerate(vocab)}
    names, _, valid_text = read_fortunes()
    va = torch.tensor([stoi[c] for c in valid_text], dtype=torch.long)
    meta = {k: v for k, v in meta.items() if k != "step"}
    meta["data"] = "Debian package fortunes 1:1.99.1: /usr/share/games/fortunes/{%s}" % ",".join(names)
    meta["valid_loss"] = "%.4f" % valid_loss(load_model(named, len(vocab)), va)
    ckpt = os.path.join(out, CKPT_NAME)
    write_safetensors(ckpt, named, meta)
    print("wrote %s (%d bytes), validation loss %s" % (ckpt, os.path.getsize(ckpt), meta["valid_loss"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixtures", action="store_true", help="only remake the fixtures from the checkpoint")
    ap.add_argument("--check", action="store_true", help="recompute the fixtures and compare")
    ap.add_argument("--texts", metavar="DIR", help="only write the split text (fortunes_train.txt, "
                    "fortunes_valid.txt) into DIR, for aft train")
    ap.add_argument("--ship", metavar="FILE", help="ship aft train's checkpoint FILE (float16, validation "
                    "loss), then remake the fixtures")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layers", type=int, default=N_LAYERS)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--pos-bias-lr-mult", type=float, default=100.0,
                    help="pos_bias's learning rate as a multiple of the others' (default 100)")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=HERE, help="where the checkpoint and fixtures go (default: beside this script)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.texts:
        write_texts(args.texts)
        return 0
    if args.ship:
        ship(args.ship, args.out)
    elif not (args.fixtures or args.check):
        train(args, args.out)
    return make_fixtures(args.out, check=args.check)


if __name__ == "__main__":
    sys.exit(main())
