"""A worked pipeline: check a hand-written PyTorch backward of labml's
AFTLocal against `aft grad`, with `aft compare`.

    /usr/bin/python3 testdata/grad_pipeline.py [--aft ./aft] [--dir DIR]

Someone writing their own AFT kernel (Triton, CUDA, JAX, or plain tensor
code as here) has a backward pass to check. This script
  1. builds labml's AFTLocal (testdata/torch_aft.py mirrors it) with random
     weights and position bias, and random x and dY;
  2. computes the gradients of sum(Y * dY) by hand in float64, from the
     formulas in man/aft.1 (no autograd), and saves them in a .npz under
     the state_dict's names, with "input" for dL/dx;
  3. saves the weights (.npz, as np.savez writes it), x and dY (.npy);
  4. runs aft grad on the same files and aft compare on the two .npz files,
     tensor by tensor; its exit status is this script's.
Step 2 is what a user replaces with their own kernel's output.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_aft import LabmlAFTLocal  # noqa: E402

T, B, D, S, TMAX = 48, 2, 32, 8, 64


def hand_backward(sd, x, dy):
    """The gradients of sum(Y * dY) of causal AFTLocal, per batch, in float64."""
    f = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in sd.items() if k != "local_mask"}
    band = torch.as_tensor(sd["local_mask"][:T, :T])
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    w = f["pos_bias"][:T, :T] * band                      # 0 outside the window, still visible
    ew = torch.exp(w) * causal                            # exp(w), 0 where not visible
    g = {k: torch.zeros_like(v) for k, v in f.items()}
    dx = torch.zeros(T, B, D, dtype=torch.float64)
    for b in range(B):
        xb, dyb = torch.as_tensor(x[:, b], dtype=torch.float64), torch.as_tensor(dy[:, b], dtype=torch.float64)
        q = xb @ f["query.weight"].T + f["query.bias"]
        k = xb @ f["key.weight"].T + f["key.bias"]
        v = xb @ f["value.weight"].T + f["value.bias"]
        ek = torch.exp(k - k.max(0).values)               # the stabiliser cancels in num / den
        num, den = ew @ (ek * v), ew @ ek
        yp, sq = num / den, torch.sigmoid(q)
        h = sq * yp
        dh = dyb @ f["output.weight"]
        gg = dh * sq / den
        dv = ek * (ew.T @ gg)
        dk = ek * (v * (ew.T @ gg) - ew.T @ (gg * yp))
        dq = dh * yp * sq * (1 - sq)
        dw = ew * (gg @ (ek * v).T - (gg * yp) @ ek.T)
        g["pos_bias"][:T, :T] += dw * band                 # w = pos_bias * mask
        g["output.weight"] += dyb.T @ h
        g["output.bias"] += dyb.sum(0)
        for name, d in (("query", dq), ("key", dk), ("value", dv)):
            g[name + ".weight"] += d.T @ xb
            g[name + ".bias"] += d.sum(0)
            dx[:, b] += d @ f[name + ".weight"]
    out = {"input": dx}
    out.update(g)
    return {k: v.numpy().astype(np.float32) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aft", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "aft"))
    ap.add_argument("--dir", default=None, help="keep the files here (default: a temporary directory)")
    a = ap.parse_args()
    d = a.dir or tempfile.mkdtemp(prefix="aft-grad-pipeline-")
    os.makedirs(d, exist_ok=True)

    torch.manual_seed(0)
    m = LabmlAFTLocal(D, TMAX, S)
    with torch.no_grad():
        m.pos_bias.uniform_(-1, 1)
    sd = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    rng = np.random.default_rng(1)
    x = rng.standard_normal((T, B, D)).astype(np.float32)
    dy = rng.standard_normal((T, B, D)).astype(np.float32)

    def p(name):
        return os.path.join(d, name)

    np.savez(p("weights.npz"), **sd)
    np.save(p("x.npy"), x)
    np.save(p("dy.npy"), dy)
    np.savez(p("mine.npz"), **hand_backward(sd, x, dy))

    aft = os.path.abspath(a.aft)
    cmds = [["grad", "--weights", "weights.npz", "--variant", "local", "--window", str(S), "--causal",
             "--layout", "tbd", "x.npy", "--grad-output", "dy.npy", "-o", "aft.npz"],
            ["compare", "mine.npz", "aft.npz", "--rtol", "1e-4", "--atol", "1e-5"]]
    print("in", d)
    for c in cmds:
        print("$ aft", " ".join(c), flush=True)
        rc = subprocess.run([aft] + c, cwd=d).returncode
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
