#!/usr/bin/python3
"""The error of --precision bf16 (and of float32) against aft's float64
reference (impl="reference": lib/ops/ref.c, ref_grad.c): the normwise
relative error ||Y - Yref|| / ||Yref|| of the layer's output and of each
gradient, for every variant, causal and not.

    PYTHONPATH=python /usr/bin/python3 testdata/precision_error.py [--markdown]

Two sets of cases. The seeded layers: B = 2, T = 256, D = C = 64, weights
U(-1/sqrt(D), 1/sqrt(D)), position biases U(-0.5, 0.5), x ~ N(0, 1),
dY ~ N(0, 1); full (dense bias), full factorised (u v^T, rank 8), local
and conv (window 16; conv 4 heads), simple, each causal and not. And the
PyTorch fixtures of testdata/torch (rish_full, rish_local, rish_simple,
labml_local, grid_conv) under their own args.txt, with their dy.npy where
they have one. The reference's outputs are float32 roundings of float64
sums (a relative error of 6e-8 at most), which bounds how small the
float32 column can read. Prints one line a case and precision; with
--markdown, docs/design.md's table. Exit status 1 when bf16 was asked but
the library has no bf16 engine (the table would be float32's).
"""
import os
import shlex
import sys

import numpy as np

import aft

HERE = os.path.dirname(os.path.abspath(__file__))
COLS = ("Y", "dX", "dWq", "dWk", "dWv", "dWo", "db", "dw")


def rel(a, r):
    n = np.linalg.norm(r.astype(np.float64))
    return float(np.linalg.norm(a.astype(np.float64) - r.astype(np.float64)) / (n if n > 0 else 1.0))


def seeded(variant, causal, B=2, T=256, D=64, S=16, heads=4, rank=8):
    rng = np.random.default_rng(46)
    u = lambda *shape: rng.uniform(-1 / np.sqrt(D), 1 / np.sqrt(D), shape).astype(np.float32)
    kc = heads if variant == "conv" else D
    w = {"query.weight": u(D, D), "query.bias": u(D), "key.weight": u(kc, D), "key.bias": u(kc),
         "value.weight": u(D, D), "value.bias": u(D), "output.weight": u(D, D), "output.bias": u(D)}
    kw = {"variant": variant.split()[0], "causal": causal}
    if variant == "full":
        w["pos_bias"] = rng.uniform(-0.5, 0.5, (T, T)).astype(np.float32)
    elif variant == "full factorised":
        w["pos_bias_u"] = rng.uniform(-0.5, 0.5, (T, rank)).astype(np.float32)
        w["pos_bias_v"] = rng.uniform(-0.5, 0.5, (T, rank)).astype(np.float32)
    elif variant == "local":
        w["pos_bias"] = rng.uniform(-0.5, 0.5, (T, T)).astype(np.float32)
        kw["window"] = S
    elif variant == "conv":
        w["pos_bias"] = rng.uniform(-0.5, 0.5, (heads, 2 * S - 1)).astype(np.float32)
        kw["window"] = S
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    dy = rng.standard_normal((B, T, D)).astype(np.float32)
    return w, kw, x, dy


def fixture(name):
    d = os.path.join(HERE, "torch", name)
    args = shlex.split(open(os.path.join(d, "args.txt")).read())
    kw = {}
    i = 0
    while i < len(args):
        key = args[i][2:]
        if key == "causal":
            kw["causal"] = True
            i += 1
            continue
        val = args[i + 1]
        i += 2
        if key in ("window", "heads"):
            val = int(val)
        elif key == "grid":
            val = tuple(int(v) for v in val.split(","))
        kw[key] = val
    x = np.load(os.path.join(d, "x.npy"))
    p = os.path.join(d, "dy.npy")
    dy = np.load(p) if os.path.exists(p) else np.random.default_rng(46).standard_normal(x.shape).astype(np.float32)
    return aft.load(os.path.join(d, "weights.safetensors")), kw, x, dy


def errors(w, kw, x, dy, precision):
    ref = aft.Layer(w, impl="reference", **kw)
    run = aft.Layer(w, precision=precision, **kw)
    y_ref, y = np.empty_like(dy), np.empty_like(dy)
    g_ref = ref.backward(x, dy, y=y_ref)
    g = run.backward(x, dy, y=y)
    out = {"Y": rel(run.forward(x), y_ref), "dX": rel(g["input"], g_ref["input"])}
    # the projections' weights in the layer's order (q, k, v, o), whatever the file names them
    weights = [n for n in run.grad_names if n.endswith(".weight")]
    for col, name in zip(COLS[2:6], weights):
        out[col] = rel(g[name], g_ref[name])
    # the key bias's exact gradient is 0 (a constant added to a channel's keys cancels in its
    # softmax), so its relative error says nothing: the other biases
    biases = [n for n in g if n.endswith(".bias") and n != weights[1][:-len("weight")] + "bias"]
    out["db"] = max((rel(g[n], g_ref[n]) for n in biases), default=None)
    pos = [n for n in g if n.startswith("pos_bias") or n == "wbias"]
    out["dw"] = max((rel(g[n], g_ref[n]) for n in pos), default=None)
    ref.close()
    run.close()
    return out


def cases():
    for v in ("full", "full factorised", "local", "simple", "conv"):
        for causal in (False, True):
            yield "%s%s" % (v, ", causal" if causal else ""), seeded(v, causal)
    for name in ("rish_full", "rish_local", "rish_simple", "labml_local", "grid_conv"):
        yield "fixture " + name, fixture(name)


def main():
    md = "--markdown" in sys.argv[1:]
    if aft.bf16_engine() == "none":
        print("precision_error.py: this CPU has no bf16 engine at kernel level %s: bf16 would compute float32"
              % aft.level(), file=sys.stderr)
        return 1
    fmt = lambda e: "-" if e is None else "%.1e" % e
    if md:
        print("| case | precision | " + " | ".join(COLS) + " |")
        print("|---|---|" + "---:|" * len(COLS))
    for name, (w, kw, x, dy) in cases():
        for prec in ("f32", "bf16"):
            e = errors(w, kw, x, dy, prec)
            if md:
                print("| %s | %s | %s |" % (name, prec, " | ".join(fmt(e[c]) for c in COLS)))
            else:
                print("%-26s %-4s %s" % (name, prec, " ".join("%s %s" % (c, fmt(e[c])) for c in COLS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
