#!/usr/bin/python3
"""PyTorch's gradients of labml's model, for lib/tests/test_model_grad.c to
hold aft_model_loss_grad (and aft model --grad) to without torch.

    /usr/bin/python3 testdata/model/make_grad_fixture.py          # write testdata/model/grad/
    /usr/bin/python3 testdata/model/make_grad_fixture.py --check  # recompute and compare

Two small models of train_labml_aft.py's classes (labml's
AutoregressiveTransformer with AFTLocal layers: 2 layers, d_model 16, d_ff
32, seq_len 24, window 5, 17 tokens, positional encodings of 40 rows), with
PyTorch's default initialisation from a seed and a random pos_bias (labml's
is zeros at init, which would leave its gradient's path untested); the
second with keys in the hundreds (the key projection's bias at 300 and its
weight times 60). For each, in grad/NAME.safetensors: the checkpoint (its
floats rounded to float32; labml's names and metadata 'window'); in
grad/NAME_grads.safetensors: the gradient of every trained parameter of the
mean cross-entropy on grad/tokens.npy predicting grad/targets.npy (int32
[B, T], batch-major), by float64 autograd through the float32 weights, with
metadata 'loss'.
"""
import argparse
import os
import sys

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from torch_aft import LabmlAFTLocal, write_safetensors  # noqa: E402
from train_labml_aft import (AutoregressiveTransformer, Encoder, EmbeddingsWithPositionalEncoding,  # noqa: E402
                             FeedForward, Generator, TransformerLayer, read_safetensors)

V, D, F, SEQ, WIN, LAYERS, MAXLEN, B, T = 17, 16, 32, 24, 5, 2, 40, 3, 20
OUT = os.path.join(HERE, "grad")


def small_model(seed, extreme):
    torch.manual_seed(seed)
    attn = LabmlAFTLocal(D, SEQ, WIN)
    layer = TransformerLayer(D, attn, FeedForward(D, F, 0.0), 0.0)
    model = AutoregressiveTransformer(Encoder(layer, LAYERS), EmbeddingsWithPositionalEncoding(D, V, MAXLEN),
                                      Generator(V, D))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("pos_bias"):
                p.copy_(torch.randn_like(p) * 0.7)
            if extreme and n.endswith("self_attn.key.bias"):
                p.fill_(300.0)
            if extreme and n.endswith("self_attn.key.weight"):
                p.mul_(60.0)
            p.copy_(p.float())   # float32 already: the values the checkpoint holds
    return model


def grads(model, tokens, targets):
    m = model.double()
    x = torch.from_numpy(tokens.T.astype(np.int64))    # seq-first [T, B]
    y = torch.from_numpy(targets.T.astype(np.int64))
    logits = m(x)
    loss = nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    m.zero_grad()
    loss.backward()
    g = [(n, p.grad.float()) for n, p in m.named_parameters() if p.requires_grad]
    return float(loss.item()), g


def make(check):
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(5)
    w = rng.integers(0, V, size=(B, T + 1)).astype(np.int32)
    tokens, targets = w[:, :-1].copy(), w[:, 1:].copy()
    bad = 0
    for name, seed, extreme in (("small", 1, False), ("extreme", 2, True)):
        model = small_model(seed, extreme)
        sd = [(k, v.float() if v.is_floating_point() else v) for k, v in model.state_dict().items()]
        loss, g = grads(model, tokens, targets)
        gmax = max(float(t.abs().max()) for _, t in g)
        print("%s: loss %.6f, %d gradients, max |g| %.3g" % (name, loss, len(g), gmax))
        ck = os.path.join(OUT, name + ".safetensors")
        gp = os.path.join(OUT, name + "_grads.safetensors")
        if check:
            old, meta = read_safetensors(gp)
            oldd = dict(old)
            for n, t in g:
                o = oldd[n].double()
                if o.shape != t.shape or float((o - t.double()).abs().max()) > 1e-6 * max(1.0, gmax):
                    print("MISMATCH %s %s" % (name, n))
                    bad += 1
            if abs(float(meta["loss"]) - loss) > 1e-6:
                print("MISMATCH %s loss" % name)
                bad += 1
            continue
        write_safetensors(ck, sd, {"format": "pt", "window": str(WIN)})
        write_safetensors(gp, g, {"format": "pt", "loss": "%.9g" % loss})
    if check:
        print("check: %s" % ("ok" if not bad else "%d mismatches" % bad))
        return 1 if bad else 0
    np.save(os.path.join(OUT, "tokens.npy"), tokens)
    np.save(os.path.join(OUT, "targets.npy"), targets)
    print("wrote %s" % OUT)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="recompute and compare with the files")
    args = ap.parse_args()
    torch.set_num_threads(1)
    return make(args.check)


if __name__ == "__main__":
    sys.exit(main())
