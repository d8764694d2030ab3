#!/usr/bin/python3
"""Make (or, with --check, verify) the PyTorch fixtures of AFT on 2-D grids,
testdata/torch/grid_*/, which lib/tests/ops/test_grid.c reads.

Run with Debian's interpreter, which has torch and numpy:

    /usr/bin/python3 testdata/make_torch_grid_fixtures.py          # write fixtures
    /usr/bin/python3 testdata/make_torch_grid_fixtures.py --check  # verify them

The modules are ours, in testdata/torch_aft.py: PaperAFTConv2d (AFT-conv from
the paper's formula with torch.nn.functional.conv2d, groups = channels) and
GridAFTLocal (AFT-local with a (Tmax, Tmax) bias kept inside the 2-D window).
Each case writes weights.safetensors (the module's state_dict), x.npy and
y.npy ([B, H, W, dim], <f4) and args.txt: the configuration as the
command line will spell it once it takes grids (not args.txt, which the CLI
tests run today). *_extreme cases hold the correct output in y.npy (float64,
the maximum of K + w subtracted per query and channel) and the module's own
in y_torch.npy. See testdata/torch/README.md. Deterministic: running it
again writes the same bytes.
"""
import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "torch")
sys.path.insert(0, HERE)
from torch_aft import GridAFTLocal, PaperAFTConv2d, write_safetensors  # noqa: E402
from make_torch_fixtures import maxdiff, read_npy, read_safetensors  # noqa: E402

CASES = {
    # the paper's form: one key channel per head
    "grid_conv": dict(kind="conv", B=2, H=5, W=7, dim=16, hidden=24, heads=4, S=3, key_per_head=True,
                      shared=False, seed=5001),
    # a key channel per hidden channel, a window of 2
    "grid_conv_wide_keys": dict(kind="conv", B=1, H=6, W=4, dim=12, hidden=12, heads=3, S=2,
                                key_per_head=False, shared=False, seed=5101),
    # one (2S-1, 2S-1) kernel for every head, S = 4 > H = 3
    "grid_conv_shared": dict(kind="conv", B=2, H=3, W=8, dim=8, hidden=16, heads=2, S=4, key_per_head=True,
                             shared=True, seed=5201),
    # local: a (Tmax, Tmax) bias in raster order, Tmax = 24 > H W = 20
    "grid_local": dict(kind="local", B=2, H=4, W=5, dim=10, hidden=12, heads=1, S=2, Tmax=24, seed=5301),
    # grid_conv with keys of about +-500 and biases of +-250: the module's
    # exponentials overflow and underflow
    "grid_conv_extreme": dict(kind="conv", B=2, H=5, W=7, dim=16, hidden=24, heads=4, S=3, key_per_head=True,
                              shared=False, seed=5401, extreme=True),
}


def build(name):
    c = dict(CASES[name], name=name)
    torch.manual_seed(c["seed"])
    if c["kind"] == "conv":
        m = PaperAFTConv2d(c["dim"], c["hidden"], c["heads"], c["S"], c["key_per_head"], c["shared"])
        mirrors = (f"PaperAFTConv2d(dim={c['dim']}, hidden={c['hidden']}, heads={c['heads']}, S={c['S']}, "
                   f"key_per_head={c['key_per_head']}, shared_kernel={c['shared']})")
    else:
        m = GridAFTLocal(c["Tmax"], c["dim"], c["hidden"], c["S"])
        mirrors = f"GridAFTLocal(max_tokens={c['Tmax']}, dim={c['dim']}, hidden_dim={c['hidden']}, S={c['S']})"
    g = torch.Generator().manual_seed(c["seed"] + 1)
    x = torch.randn(c["B"], c["H"], c["W"], c["dim"], generator=g)
    with torch.no_grad():
        if c.get("extreme"):
            m.pos_bias.copy_(torch.rand(m.pos_bias.shape, generator=g) * 500 - 250)
            k0 = x @ m.to_k.weight.T
            m.to_k.weight.mul_(400.0 / k0.abs().max())
            m.to_k.bias.copy_(torch.rand(m.to_k.bias.shape, generator=g) * 200 - 100)
        else:
            m.pos_bias.copy_(torch.randn(m.pos_bias.shape, generator=g) * 0.5)
        y = m(x)
    c.update(module=m, x=x, y=y, sd=list(m.state_dict().items()),
             meta={"format": "pt", "mirrors": mirrors})
    grid = f"--grid {c['H']},{c['W']}"
    c["args"] = (f"--variant conv {grid}" if c["kind"] == "conv"
                 else f"--variant local --window {c['S']} {grid}")
    return c


def grid_bias(c, p):
    """w (heads, T, T) in float64: each head's bias inside the 2-D window, 0 outside."""
    H, W, S, heads = c["H"], c["W"], c["S"], c["heads"]
    T = H * W
    r, col = np.arange(T) // W, np.arange(T) % W
    dr = r[None, :] - r[:, None]          # r' - r for query t (row), key t' (column)
    dc = col[None, :] - col[:, None]
    inside = (np.abs(dr) < S) & (np.abs(dc) < S)
    if c["kind"] == "local":
        return np.where(inside, p["pos"][:T, :T], 0.0)[None]
    k = p["pos"] if p["pos"].ndim == 3 else np.broadcast_to(p["pos"], (heads,) + p["pos"].shape)
    w = np.zeros((heads, T, T))
    for h in range(heads):
        w[h] = np.where(inside, k[h][np.clip(dr + S - 1, 0, 2 * S - 2), np.clip(dc + S - 1, 0, 2 * S - 2)], 0.0)
    return w


def truth(c, st):
    """The grid layer from the definition, float64: per (b, t, c) the maximum
    of K[t', c] + w[t, t'] over all t' subtracted before exp."""
    p = {n: st[n].astype(np.float64) for n in st}
    p["pos"] = p["pos_bias"]
    x = c["x"].double().numpy()
    B, H, W = x.shape[:3]
    T = H * W
    xs = x.reshape(B, T, -1)
    lin = lambda a, n: a @ p[n + ".weight"].T + p[n + ".bias"]   # noqa: E731
    q, k, v = lin(xs, "to_q"), lin(xs, "to_k"), lin(xs, "to_v")
    C = v.shape[-1]
    heads = c["heads"]
    if k.shape[-1] != C:
        k = np.repeat(k, C // k.shape[-1], axis=-1)
    w = grid_bias(c, p)                                   # (heads or 1, T, T)
    wc = np.repeat(w, C // w.shape[0], axis=0)            # (C, T, T)
    s = k[:, None, :, :] + wc.transpose(1, 2, 0)[None]    # (B, t, t', C)
    e = np.exp(s - s.max(axis=2, keepdims=True))
    y = 1.0 / (1.0 + np.exp(-q)) * (e * v[:, None]).sum(axis=2) / e.sum(axis=2)
    out = lin(y, "project").reshape(B, H, W, -1)
    del heads
    return out.astype(np.float32)


def write_case(c):
    d = os.path.join(OUT, c["name"])
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "weights.safetensors"), c["sd"], c["meta"])
    np.save(os.path.join(d, "x.npy"), c["x"].numpy().astype("<f4"))
    y_mod = c["y"].numpy().astype("<f4")
    with open(os.path.join(d, "args.txt"), "w") as f:
        f.write(c["args"] + "\n")
    if c.get("extreme"):
        np.save(os.path.join(d, "y_torch.npy"), y_mod)
        st = {k: v.detach().double().numpy() for k, v in c["sd"]}
        np.save(os.path.join(d, "y.npy"), truth(c, st))
    else:
        np.save(os.path.join(d, "y.npy"), y_mod)


def check_case(c):
    d = os.path.join(OUT, c["name"])
    fails = []

    def expect(cond, msg):
        if not cond:
            fails.append(c["name"] + ": " + msg)
            print("  FAIL " + msg)

    st, meta, order = read_safetensors(os.path.join(d, "weights.safetensors"))
    expect(order == [k for k, _ in c["sd"]], "tensor order != state_dict order")
    for k, v in c["sd"]:
        expect(st[k][0] == "F32" and np.array_equal(st[k][1], v.numpy()), f"{k}")
    expect(meta == c["meta"], "metadata")
    x = read_npy(os.path.join(d, "x.npy"))
    expect(x.dtype == np.dtype("<f4") and np.array_equal(x, c["x"].numpy()), "x.npy")
    with open(os.path.join(d, "args.txt")) as f:
        expect(f.read().splitlines() == [c["args"]], "args.txt")
    y = read_npy(os.path.join(d, "y.npy"))
    st64 = {k: a.astype(np.float64) for k, (_, a) in st.items()}
    ref = truth(c, st64)
    md = maxdiff(ref, y)
    print(f"  definition (float64) vs y.npy: max|diff| = {md:.3g}")
    if c.get("extreme"):
        expect(md == 0.0, "y.npy != the float64 definition")
        yt = read_npy(os.path.join(d, "y_torch.npy"))
        expect(np.array_equal(yt, c["y"].numpy(), equal_nan=True), "y_torch.npy != module output")
        bad = int(np.sum(~np.isfinite(yt).all(axis=-1)))
        print(f"  module output non-finite at {bad} of {yt.shape[0] * yt.shape[1] * yt.shape[2]} positions")
        expect(bad > 0, "the extreme case no longer breaks the module")
    else:
        expect(md < 1e-5, "the definition disagrees with the module")
        expect(np.array_equal(y, c["y"].numpy()), "y.npy != module output")
        m64 = c["module"].double()
        with torch.no_grad():
            y64 = m64(c["x"].double()).float().numpy()
        c["module"].float()
        md = maxdiff(y64, y)
        print(f"  module float64 vs float32 y.npy: max|diff| = {md:.3g}")
        expect(md < 1e-5, "float64 run disagrees with float32 output")
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="verify testdata/torch/grid_* instead of writing them")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cases = [build(n) for n in CASES]
    if not a.check:
        for c in cases:
            write_case(c)
            print("wrote", os.path.relpath(os.path.join(OUT, c["name"]), os.getcwd()))
    fails = []
    for c in cases:
        print(c["name"] + ":")
        fails += check_case(c)
    if fails:
        print(f"{len(fails)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
