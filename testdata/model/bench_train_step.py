#!/usr/bin/python3
"""One training step's loss + backward of labml's model at the shipped shape
(6 layers, d_model 128, d_ff 256, window 32, B 32, T 256), PyTorch against
aft model --grad, side by side in one run.

    /usr/bin/python3 testdata/model/bench_train_step.py [--threads 2] [--repeat 3]

aft's time is the median of --repeat runs of `aft model --grad` on the same
tokens, less the same command's time at B = 1 x T = 1 (loading the
checkpoint and writing the file), so both sides time the step alone.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from train_labml_aft import CKPT_NAME, load_model, read_safetensors  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--repeat", type=int, default=3)
ap.add_argument("--aft", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "aft"))
a = ap.parse_args()
torch.set_num_threads(a.threads)
ckpt = os.path.join(HERE, CKPT_NAME)
named, meta = read_safetensors(ckpt)
V = len(__import__("json").loads(meta["vocab"]))
model = load_model(named, V).train()
B, T = 32, 256
rng = np.random.default_rng(0)
w = rng.integers(0, V, size=(B, T + 1)).astype(np.int32)


def torch_step():
    x = torch.from_numpy(w[:, :-1].T.astype(np.int64))
    y = torch.from_numpy(w[:, 1:].T.astype(np.int64))
    t0 = time.perf_counter()
    loss = nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
    model.zero_grad()
    loss.backward()
    return time.perf_counter() - t0, loss.item()


def aft_run(tok_path, out):
    t0 = time.perf_counter()
    subprocess.run([a.aft, "model", "--weights", ckpt, "--grad", "--threads", str(a.threads), "-o", out, tok_path],
                   check=True)
    return time.perf_counter() - t0


with tempfile.TemporaryDirectory() as d:
    tp, t1 = os.path.join(d, "tok.npy"), os.path.join(d, "one.npy")
    np.save(tp, w[:, :-1].copy())
    np.save(t1, w[:1, :2].copy())
    out = os.path.join(d, "g.safetensors")
    pt, at, base = [], [], []
    for _ in range(a.repeat):
        pt.append(torch_step()[0])
        at.append(aft_run(tp, out))
        base.append(aft_run(t1, out))
    pt, at, base = sorted(pt)[len(pt) // 2], sorted(at)[len(at) // 2], sorted(base)[len(base) // 2]
    step = at - base
    print("B %d x T %d, %d threads: PyTorch forward+backward %.3f s, aft %.3f s (%.3f s less %.3f s of loading), "
          "%.1fx; aft %.0f tokens/s" % (B, T, a.threads, pt, step, at, base, pt / step, B * T / step))
