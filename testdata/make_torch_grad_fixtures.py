#!/usr/bin/python3
"""Make (or, with --check, verify) the PyTorch gradient fixtures in testdata/torch/.

Run with Debian's interpreter, which has torch and numpy:

    /usr/bin/python3 testdata/make_torch_grad_fixtures.py          # write fixtures
    /usr/bin/python3 testdata/make_torch_grad_fixtures.py --check  # verify them

For the labml_local, rish_full, rish_simple and rish_local cases (built by
make_torch_fixtures.py, the same modules, weights and inputs) it writes into
each case directory

    dy.npy              dL/dy, <f4, the layout of y.npy (seeded normal values)
    grads.safetensors   torch.autograd's gradients of sum(y * dy): "input" (dL/dx,
                        the layout of x.npy) and every parameter that has a gradient,
                        named as in weights.safetensors, in its order; F32

The gradients are computed in float64 (the module and x converted from their
float32 values, so exactly the stored ones) and rounded to float32; --check
also runs autograd in float32 and reports how far that is from them. The
script is deterministic: running it again writes byte-identical files.
"""
import argparse
import copy
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_torch_fixtures as mtf  # noqa: E402
from torch_aft import write_safetensors  # noqa: E402

CASES = ["labml_local", "rish_full", "rish_simple", "rish_local"]
SEEDS = {"labml_local": 5001, "rish_full": 5002, "rish_simple": 5003, "rish_local": 5004}


def make_dy(case):
    g = torch.Generator().manual_seed(SEEDS[case["name"]])
    return torch.randn(case["y"].shape, generator=g, dtype=torch.float32)


def autograd(case, dy, dtype):
    """[(name, grad)]: "input" first, then the parameters with a gradient in
    state_dict order, each computed in dtype."""
    m = copy.deepcopy(case["module"]).to(dtype)
    x = case["x"].to(dtype).clone().requires_grad_(True)
    y = case["run"](m, x)   # rish_local replaces its wbias here, as upstream
    (y * dy.to(dtype)).sum().backward()
    params = dict(m.named_parameters())
    named = [("input", x.grad)]
    for k in m.state_dict():
        p = params.get(k)
        if p is not None and p.grad is not None:
            named.append((k, p.grad))
    return named


def to_f32(named):
    return [(k, v.detach().to(torch.float32).contiguous()) for k, v in named]


def write(case):
    d = os.path.join(mtf.OUT, case["name"])
    dy = make_dy(case)
    np.save(os.path.join(d, "dy.npy"), dy.numpy().astype("<f4"))
    meta = {"format": "pt", "mirrors": case["meta"]["mirrors"], "grad_of": "sum(y * dy)",
            "computed": "torch.autograd in float64 from the float32 weights and x, rounded to F32"}
    write_safetensors(os.path.join(d, "grads.safetensors"), to_f32(autograd(case, dy, torch.float64)), meta)


def check(case):
    d = os.path.join(mtf.OUT, case["name"])
    fails = []
    dy_file = mtf.read_npy(os.path.join(d, "dy.npy"))
    dy = make_dy(case)
    if not (dy_file.dtype == np.dtype("<f4") and np.array_equal(dy_file, dy.numpy())):
        fails.append("dy.npy")
    st, meta, order = mtf.read_safetensors(os.path.join(d, "grads.safetensors"))
    want = to_f32(autograd(case, dy, torch.float64))
    if order != [k for k, _ in want]:
        fails.append(f"tensor order {order}")
    for k, v in want:
        dt, arr = st[k]
        if dt != "F32" or not np.array_equal(arr, v.numpy()):
            fails.append(f"{k} values")
    # float32 autograd, for scale: how far torch's own float32 run is
    worst = 0.0
    for k, v in autograd(case, dy, torch.float32):
        ref = st[k][1].astype(np.float64)
        scale = max(1.0, float(np.max(np.abs(ref))))
        worst = max(worst, float(np.max(np.abs(v.detach().numpy().astype(np.float64) - ref))) / scale)
    print(f"  {len(order)} tensors; torch float32 autograd vs the float64 gradients: "
          f"max |diff| / max(1, max |g|) = {worst:.3g}")
    if worst > 1e-4:
        fails.append("float32 autograd disagrees")
    for f in fails:
        print(f"  FAIL {f}")
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="verify the files in testdata/torch/ instead of writing them")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cases = [mtf.build(n) for n in CASES]
    if not a.check:
        for c in cases:
            write(c)
            print("wrote", os.path.relpath(os.path.join(mtf.OUT, c["name"], "grads.safetensors"), os.getcwd()))
    fails = []
    for c in cases:
        print(c["name"] + ":")
        fails += [c["name"] + ": " + f for f in check(c)]
    if fails:
        print(f"{len(fails)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
