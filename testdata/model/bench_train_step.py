#!/usr/bin/python3
"""One training step of labml's model at the shipped shape (6 layers,
d_model 128, d_ff 256, window 32, B 32, T 256), PyTorch against aft train,
side by side in one run.

    /usr/bin/python3 testdata/model/bench_train_step.py [--threads 2] [--steps 4] [--repeat 1]

Both sides start from the shipped checkpoint and take the same fixed batch
each step, dropout off (load_model's), and a step is the whole of one:
forward, cross-entropy, backward, clipping at norm 1, Adam.

- PyTorch: the median of --steps steps after one warm-up step.
- aft: `aft train --init CKPT --batches FILE --timing` run for 1 step and
  for 1 + --steps steps; its step is the difference of their train_ms over
  --steps, so loading, the first step's allocations and writing the
  checkpoint fall out.

FLOPs of a step count the products alone, 2 m n k each, N = B T rows: per
layer Q, K, V (N x D x 3C), the output projection (N x C x D) and the
FFN's two (N x D x F each), then the generator (N x D x V); the backward
pass runs two products of each forward one's size (dX and dW), so a step is
3 x the forward's. The operator, the norms, the cross-entropy and Adam are
not counted: the share of the sgemm rate is a lower bound. The sgemm rate is
measured in the same run: torch.matmul of (N x D) by (D x 3C), the Q, K, V
product's shape, on the same threads, the best of 20.
"""
import argparse
import json
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
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--repeat", type=int, default=1)
ap.add_argument("--aft", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "aft"))
a = ap.parse_args()
torch.set_num_threads(a.threads)
ckpt = os.path.join(HERE, CKPT_NAME)
named, meta = read_safetensors(ckpt)
V = len(json.loads(meta["vocab"]))
B, T, NL, D, C, F = 32, 256, 6, 128, 128, 256
N = B * T
FLOPS = 3 * (NL * 2 * N * (D * 3 * C + C * D + 2 * D * F) + 2 * N * D * V)
rng = np.random.default_rng(0)
w = rng.integers(0, V, size=(B, T + 1)).astype(np.int32)


def torch_steps(k):
    """the median time of k steps after a warm-up one"""
    model = load_model(named, V).train()
    pb = [p for n, p in model.named_parameters() if n.endswith(".pos_bias")]
    rest = [p for n, p in model.named_parameters() if not n.endswith(".pos_bias")]
    opt = torch.optim.Adam([{"params": rest}, {"params": pb, "lr": 0.2}], lr=2e-3, betas=(0.9, 0.98), eps=1e-9)
    x = torch.from_numpy(w[:, :-1].T.astype(np.int64))
    y = torch.from_numpy(w[:, 1:].T.astype(np.int64))
    times = []
    for _ in range(k + 1):
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    times = sorted(times[1:])
    return times[len(times) // 2]


def aft_train_ms(d, steps):
    timing = os.path.join(d, "t.json")
    subprocess.run([a.aft, "train", "--init", ckpt, "--batches", os.path.join(d, "batches.npy"), "--steps",
                    str(steps), "--dropout", "0", "--warmup", "1", "--threads", str(a.threads), "-q", "-o",
                    os.path.join(d, "m.safetensors"), "--timing", timing], check=True)
    with open(timing) as f:
        return json.load(f)["train_ms"] / 1000.0


def sgemm_rate():
    x, m = torch.randn(N, D), torch.randn(D, 3 * C)
    best = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        torch.matmul(x, m)
        best = min(best, time.perf_counter() - t0)
    return 2 * N * D * 3 * C / best


with tempfile.TemporaryDirectory() as d:
    np.save(os.path.join(d, "batches.npy"), w[None].copy())
    for r in range(a.repeat):
        pt = torch_steps(a.steps)
        one = aft_train_ms(d, 1)
        many = aft_train_ms(d, 1 + a.steps)
        rate = sgemm_rate()
        step = (many - one) / a.steps
        print("B %d x T %d, %d threads, load %.2f: PyTorch %.3f s a step (%.0f tokens/s), aft %.3f s (%.0f tokens/s), "
              "%.1fx; %.1f GFLOP of products a step, sgemm %.1f GFLOP/s: aft %.0f%% of it, PyTorch %.0f%%"
              % (B, T, a.threads, os.getloadavg()[0], pt, N / pt, step, N / step, pt / step, FLOPS / 1e9,
                 rate / 1e9, 100 * FLOPS / step / rate, 100 * FLOPS / pt / rate))
