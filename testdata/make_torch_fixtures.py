#!/usr/bin/python3
"""Make (or, with --check, verify) the PyTorch fixtures in testdata/torch/.

Run with Debian's interpreter, which has torch and numpy:

    /usr/bin/python3 testdata/make_torch_fixtures.py          # write fixtures
    /usr/bin/python3 testdata/make_torch_fixtures.py --check  # verify them

The modules (testdata/torch_aft.py, shared with bench_torch.py) each mirror
the computation and the parameter names (hence the state_dict keys, shapes,
dtypes and order) of one public PyTorch class; nothing is imported from those
projects. What each mirrors is stated on the class. See testdata/torch/README.md
for the cases and the upstream facts they rest on.
"""
import argparse
import ast
import copy
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "torch")


# --------------------------------------------------------------------- modules

sys.path.insert(0, HERE)
from torch_aft import (LabmlAFTLocal, RishAFTFull, RishAFTLocal,  # noqa: E402
                       RishAFTSimple, band, labml_causal_mask, write_safetensors)


def sd_list(module):
    return [(k, v) for k, v in module.state_dict().items()]


def convert_sd(named, dtype):
    return [(k, v.to(dtype) if v.is_floating_point() else v) for k, v in named]


# ------------------------------------------------------- float64 reference

def reference_aft(x, p, w):
    """Stable float64 AFT layer.  x: (B, T, D); p: dict of float64 arrays
    wq bq wk bk wv bv wo bo (biases may be None); w: (T, T) effective bias,
    -inf where t' is not visible from t.  Per (b, t, c) the max of
    K[t', c] + w[t, t'] over visible t' is subtracted before exp.
    A row with nothing visible gives 0."""
    def lin(a, W, b):
        y = a @ W.T
        return y if b is None else y + b
    q = lin(x, p["wq"], p["bq"])
    k = lin(x, p["wk"], p["bk"])
    v = lin(x, p["wv"], p["bv"])
    s = k[:, None, :, :] + w[None, :, :, None]           # (B, t, t', C)
    m = s.max(axis=2, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    num = (e * v[:, None, :, :]).sum(axis=2)
    den = e.sum(axis=2)
    ctx = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    y = (1.0 / (1.0 + np.exp(-q))) * ctx
    return lin(y, p["wo"], p["bo"])


def resolve(st):
    """Pick weights by the names aft resolves, as float64 numpy arrays."""
    def get(*names):
        for n in names:
            if n in st:
                return np.asarray(st[n], dtype=np.float64)
        return None
    p = {}
    for short, names in (("q", ("query", "to_q")), ("k", ("key", "to_k")),
                         ("v", ("value", "to_v")), ("o", ("output", "project"))):
        p["w" + short] = get(*[n + ".weight" for n in names])
        p["b" + short] = get(*[n + ".bias" for n in names])
    p["pos"] = get("pos_bias", "wbias")
    return p


def parse_args_line(line):
    toks = line.split()
    o = {"variant": "full", "window": None, "causal": False, "layout": "btd",
         "mask": None}
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "--causal":
            o["causal"] = True
        elif t in ("--variant", "--window", "--layout", "--mask"):
            o[t[2:]] = toks[i + 1]
            i += 1
        else:
            raise ValueError("unknown option in args line: " + t)
        i += 1
    return o


def run_cli_semantics(opts, st, x, casedir):
    """What `aft run` should compute, per its documented options, in float64."""
    p = resolve(st)
    xb = np.asarray(x, dtype=np.float64)
    if opts["layout"] == "tbd":
        xb = xb.transpose(1, 0, 2)
    T = xb.shape[1]
    if opts["variant"] == "simple":
        w = np.zeros((T, T))
    else:
        w = p["pos"][:T, :T].copy()
        if opts["variant"] == "local":
            S = int(opts["window"])
            idx = np.arange(T)
            w[np.abs(idx[:, None] - idx[None, :]) >= S] = 0.0
    if opts["causal"]:
        w[np.triu(np.ones((T, T), bool), 1)] = -np.inf
    if opts["mask"]:
        m = read_npy(os.path.join(casedir, opts["mask"])).astype(bool)
        w[~m] = -np.inf
    y = reference_aft(xb, p, w)
    if opts["layout"] == "tbd":
        y = y.transpose(1, 0, 2)
    return y


# ------------------------------------------------------------------ cases

def randn_like_scaled(t, scale, gen):
    return torch.randn(t.shape, generator=gen, dtype=t.dtype) * scale


def make_labml(extreme=False):
    torch.manual_seed(1001)
    d, Tmax, T, B, s = 16, 12, 10, 3, 4
    m = LabmlAFTLocal(d, Tmax, s)
    g = torch.Generator().manual_seed(1002)
    x = torch.randn(T, B, d, generator=g)
    with torch.no_grad():
        if not extreme:
            m.pos_bias.copy_(randn_like_scaled(m.pos_bias, 0.5, g))
        else:
            m.pos_bias.copy_(torch.rand(Tmax, Tmax, generator=g) * 500 - 250)
            k0 = x @ m.key.weight.T
            m.key.weight.mul_(400.0 / k0.abs().max())
            m.key.bias.copy_(torch.rand(d, generator=g) * 200 - 100)
    mask = labml_causal_mask(T)
    with torch.no_grad():
        y = m(query=x, key=x, value=x, mask=mask)
    return dict(module=m, x=x, y=y, run=lambda mod, xx: mod(
                    query=xx, key=xx, value=xx, mask=labml_causal_mask(xx.shape[0])),
                args="--variant local --window 4 --causal --layout tbd",
                alt=["--variant local --window 4 --mask mask.npy --layout tbd"],
                extra_npy={"mask.npy": mask[:, :, 0].numpy()},
                meta={"format": "pt", "mirrors": "labml AFTLocal(d_model=16, seq_len=12, local_window_size=4)"})


def make_rish_full(extreme=False):
    torch.manual_seed(2001)
    Tmax, d, h, B, T = 12, 16, 24, 2, 9
    m = RishAFTFull(Tmax, d, h)
    g = torch.Generator().manual_seed(2002)
    x = torch.randn(B, T, d, generator=g)
    with torch.no_grad():
        if not extreme:
            m.wbias.copy_(randn_like_scaled(m.wbias, 0.5, g))
        else:
            m.wbias.copy_(torch.rand(Tmax, Tmax, generator=g) * 500 - 250)
            k0 = x @ m.to_k.weight.T
            m.to_k.weight.mul_(400.0 / k0.abs().max())
            m.to_k.bias.copy_(torch.rand(h, generator=g) * 200 - 100)
        y = m(x)
    return dict(module=m, x=x, y=y, run=lambda mod, xx: mod(xx),
                args="--variant full --layout btd", alt=[], extra_npy={},
                meta={"format": "pt", "mirrors": "rish-16 AFTFull(max_seqlen=12, dim=16, hidden_dim=24)"})


def make_rish_simple():
    torch.manual_seed(3001)
    d, h, B, T = 16, 8, 2, 11
    m = RishAFTSimple(12, d, h)
    g = torch.Generator().manual_seed(3002)
    x = torch.randn(B, T, d, generator=g)
    with torch.no_grad():
        y = m(x)
    return dict(module=m, x=x, y=y, run=lambda mod, xx: mod(xx),
                args="--variant simple --layout btd", alt=[], extra_npy={},
                meta={"format": "pt", "mirrors": "rish-16 AFTSimple(max_seqlen=12, dim=16, hidden_dim=8)"})


def make_rish_local():
    torch.manual_seed(4001)
    Tmax, d, h, s, B, T = 12, 16, 8, 3, 2, 10
    m = RishAFTLocal(Tmax, d, h, s)
    g = torch.Generator().manual_seed(4002)
    x = torch.randn(B, T, d, generator=g)
    with torch.no_grad():
        m.wbias.copy_(randn_like_scaled(m.wbias, 0.5, g))
    pre = [(k, v.clone()) for k, v in sd_list(m)]   # before any forward
    with torch.no_grad():
        y = m(x)                                      # replaces wbias
    return dict(module=m, x=x, y=y, run=lambda mod, xx: mod(xx),
                args="--variant local --window 3 --layout btd",
                alt=["--variant full --layout btd"], extra_npy={},
                pre=pre,
                meta={"format": "pt", "mirrors": "rish-16 AFTLocal(max_seqlen=12, dim=16, hidden_dim=8, s=3)",
                      "saved": "after one forward (wbias already band-masked)"})


CASES = {
    "labml_local": lambda: make_labml(False),
    "rish_full": lambda: make_rish_full(False),
    "rish_simple": make_rish_simple,
    "rish_local": make_rish_local,
    "labml_local_extreme": lambda: make_labml(True),
    "rish_full_extreme": lambda: make_rish_full(True),
}
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}


def float64_run(case, named):
    """Load named (any dtype) into a float64 copy of the case module, run on
    the case input in float64, return float32 numpy output."""
    m64 = copy.deepcopy(case["module"])
    m64.double()
    for k, v in named:
        if not v.is_floating_point():
            continue
        target = m64.get_parameter(k)
        with torch.no_grad():
            target.copy_(v.to(torch.float64))
    with torch.no_grad():
        y = case["run"](m64, case["x"].double())
    return y.float().numpy()


def stable_truth(case):
    """Correct output in float64 from the case's own args line."""
    st = {k: v.detach().double().numpy() for k, v in sd_list(case["module"])
          if v.is_floating_point()}
    return run_cli_semantics(parse_args_line(case["args"]), st,
                             case["x"].double().numpy(), None).astype(np.float32)


def bad_positions(y_torch, y_true, layout):
    """(b, t) positions where torch is non-finite or off by > 1e-3 rel."""
    yt, yr = y_torch, y_true
    if layout == "tbd":
        yt, yr = yt.transpose(1, 0, 2), yr.transpose(1, 0, 2)
    out = []
    for b in range(yt.shape[0]):
        for t in range(yt.shape[1]):
            a, r = yt[b, t], yr[b, t]
            if not np.all(np.isfinite(a)):
                kind = "nan" if np.any(np.isnan(a)) else "inf"
                out.append((b, t, kind, float("nan")))
            else:
                err = float(np.max(np.abs(a - r)))
                if err > 1e-3 * (1 + float(np.max(np.abs(r)))):
                    out.append((b, t, "wrong", err))
    return out


def build(name):
    case = CASES[name]()
    case["name"] = name
    case["sd"] = sd_list(case["module"])
    return case


def write_case(case):
    d = os.path.join(OUT, case["name"])
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "weights.safetensors"), case["sd"], case["meta"])
    x = case["x"].numpy().astype("<f4")
    np.save(os.path.join(d, "x.npy"), x)
    y_mod = case["y"].numpy().astype("<f4")
    with open(os.path.join(d, "args.txt"), "w") as f:
        f.write(case["args"] + "\n")
    if case["alt"]:
        with open(os.path.join(d, "args_alt.txt"), "w") as f:
            f.write("".join(a + "\n" for a in case["alt"]))
    for fn, arr in case["extra_npy"].items():
        np.save(os.path.join(d, fn), arr)
    if "pre" in case:
        meta = dict(case["meta"], saved="before any forward (wbias not yet masked)")
        write_safetensors(os.path.join(d, "weights_preforward.safetensors"), case["pre"], meta)
    if case["name"].endswith("_extreme"):
        np.save(os.path.join(d, "y_torch.npy"), y_mod)
        truth = stable_truth(case)
        np.save(os.path.join(d, "y.npy"), truth)
        layout = parse_args_line(case["args"])["layout"]
        bad = bad_positions(y_mod, truth, layout)
        with open(os.path.join(d, "torch_errors.txt"), "w") as f:
            f.write("# (batch, time) positions where y_torch.npy is not the correct "
                    "output y.npy\n# batch time kind max_abs_err\n")
            for b, t, kind, err in bad:
                f.write(f"{b} {t} {kind} {err:.6g}\n")
    else:
        np.save(os.path.join(d, "y.npy"), y_mod)
    if case["name"] == "rish_full":
        np.save(os.path.join(d, "x_be.npy"), x.astype(">f4"))
        np.save(os.path.join(d, "x_fortran.npy"), np.asfortranarray(x))
        np.save(os.path.join(d, "x_f64.npy"), x.astype("<f8"))
        for tag, dt in DTYPES.items():
            conv = convert_sd(case["sd"], dt)
            write_safetensors(os.path.join(d, f"weights_{tag}.safetensors"), conv,
                              dict(case["meta"], dtype=str(dt)))
            np.save(os.path.join(d, f"y_{tag}.npy"), float64_run(case, conv))


# ------------------------------------------------------ independent readers

def read_safetensors(path):
    """Parse a .safetensors file strictly; return {name: (dtype, np array)}, meta."""
    sizes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "BOOL": 1}
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    assert n % 8 == 0, "header length not a multiple of 8"
    raw = buf[8:8 + n]
    assert raw.rstrip(b" ").endswith(b"}"), "header must be JSON padded with spaces"
    hdr = json.loads(raw.decode())
    meta = hdr.pop("__metadata__", None)
    data = buf[8 + n:]
    entries = sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0])
    pos, out = 0, {}
    for name, e in entries:
        a, b = e["data_offsets"]
        assert a == pos, f"{name}: gap or overlap at {a} (expected {pos})"
        cnt = int(np.prod(e["shape"], dtype=np.int64))
        assert b - a == cnt * sizes[e["dtype"]], f"{name}: size mismatch"
        chunk = data[a:b]
        if e["dtype"] == "BF16":
            bits = np.frombuffer(chunk, "<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(chunk, {"F64": "<f8", "F32": "<f4", "F16": "<f2",
                                        "BOOL": "u1"}[e["dtype"]])
            if e["dtype"] == "BOOL":
                assert set(np.unique(arr)) <= {0, 1}, f"{name}: bool not 0/1"
                arr = arr.astype(bool)
        out[name] = (e["dtype"], arr.reshape(e["shape"]))
        pos = b
    assert pos == len(data), "trailing bytes after the last tensor"
    order = [name for name, _ in entries]
    return out, meta, order


def read_npy(path, want_info=False):
    with open(path, "rb") as f:
        buf = f.read()
    assert buf[:6] == b"\x93NUMPY", "not npy"
    major = buf[6]
    if major == 1:
        (hl,) = struct.unpack("<H", buf[8:10])
        start = 10
    else:
        (hl,) = struct.unpack("<I", buf[8:12])
        start = 12
    hdr = ast.literal_eval(buf[start:start + hl].decode("latin1"))
    assert (start + hl) % 64 == 0, "data not 64-byte aligned"
    shape = hdr["shape"]
    arr = np.frombuffer(buf[start + hl:], dtype=np.dtype(hdr["descr"]))
    assert arr.size == int(np.prod(shape, dtype=np.int64)), "size mismatch"
    arr = arr.reshape(shape, order="F" if hdr["fortran_order"] else "C")
    return (arr, hdr) if want_info else arr


def maxdiff(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    both = np.isfinite(a) & np.isfinite(b)
    assert np.array_equal(np.isnan(a), np.isnan(b)), "NaN positions differ"
    assert np.array_equal(np.isinf(a), np.isinf(b)), "inf positions differ"
    return float(np.max(np.abs(a[both] - b[both]), initial=0.0))


def check_case(case):
    name = case["name"]
    d = os.path.join(OUT, name)
    fails = []

    def expect(cond, msg):
        if not cond:
            fails.append(msg)
            print(f"  FAIL {msg}")

    st, meta, order = read_safetensors(os.path.join(d, "weights.safetensors"))
    expect(order == [k for k, _ in case["sd"]], "tensor order != state_dict order")
    for k, v in case["sd"]:
        dt, arr = st[k]
        expect(arr.shape == tuple(v.shape), f"{k} shape")
        expect(np.array_equal(arr, v.numpy()), f"{k} values")
        expect(dt == ("BOOL" if v.dtype == torch.bool else "F32"), f"{k} dtype {dt}")
    expect(meta == case["meta"], "metadata")
    x = read_npy(os.path.join(d, "x.npy"))
    expect(x.dtype == np.dtype("<f4") and np.array_equal(x, case["x"].numpy()), "x.npy")
    with open(os.path.join(d, "args.txt")) as f:
        lines = f.read().splitlines()
    expect(lines == [case["args"]], "args.txt")
    st64 = {k: a.astype(np.float64) for k, (dt, a) in st.items() if dt != "BOOL"}
    y_file = read_npy(os.path.join(d, "y.npy"))
    expect(y_file.dtype == np.dtype("<f4"), "y.npy dtype")
    extreme = name.endswith("_extreme")

    # the args line (and alternatives) under aft's semantics, float64
    alts = []
    if os.path.exists(os.path.join(d, "args_alt.txt")):
        with open(os.path.join(d, "args_alt.txt")) as f:
            alts = f.read().splitlines()
    expect(alts == case["alt"], "args_alt.txt")
    for line in [case["args"]] + alts:
        ref = run_cli_semantics(parse_args_line(line), st64, x, d)
        md = maxdiff(ref, y_file)
        print(f"  aft semantics `{line}` (float64) vs y.npy: max|diff| = {md:.3g}")
        expect(md < 1e-5, f"args `{line}` does not reproduce y.npy")

    if not extreme:
        y_mod = case["y"].numpy()
        expect(np.array_equal(y_file, y_mod), "y.npy != module output")
        y64 = float64_run(case, [(k, torch.from_numpy(a.copy()))
                                 for k, (dt, a) in st.items() if dt != "BOOL"])
        md = maxdiff(y64, y_file)
        print(f"  mirror module float64 vs float32 y.npy: max|diff| = {md:.3g}")
        expect(md < 1e-5, "float64 run disagrees with float32 output")
    else:
        yt = read_npy(os.path.join(d, "y_torch.npy"))
        expect(yt.dtype == np.dtype("<f4"), "y_torch.npy dtype")
        expect(maxdiff(yt, case["y"].numpy()) == 0.0, "y_torch.npy != module output")
        truth = stable_truth(case)
        expect(np.array_equal(truth, y_file), "y.npy != stable float64 truth")
        # the same stable formulation in float32, to bound what a float32 tool can do
        opts = parse_args_line(case["args"])
        xf = x.transpose(1, 0, 2) if opts["layout"] == "tbd" else x
        p32 = resolve({k: a for k, (dt, a) in st.items() if dt != "BOOL"})
        with np.errstate(all="ignore"):
            p32 = {k: (None if v is None else v.astype(np.float32)) for k, v in p32.items()}
            # float32 pass: re-run the reference with float32 arrays
            T = xf.shape[1]
            w = p32["pos"][:T, :T].copy()
            if opts["variant"] == "local":
                idx = np.arange(T)
                w[np.abs(idx[:, None] - idx[None, :]) >= int(opts["window"])] = 0
            if opts["causal"]:
                w[np.triu(np.ones((T, T), bool), 1)] = -np.inf
            y32 = reference_aft32(xf.astype(np.float32), p32, w.astype(np.float32))
            if opts["layout"] == "tbd":
                y32 = y32.transpose(1, 0, 2)
        print(f"  stable float32 vs stable float64 (y.npy): max|diff| = {maxdiff(y32, y_file):.3g}"
              f"  (|y| max {np.max(np.abs(y_file)):.3g})")
        bad = bad_positions(yt, y_file, opts["layout"])
        kinds = {}
        for _, _, kind, _ in bad:
            kinds[kind] = kinds.get(kind, 0) + 1
        total = yt.shape[0] * yt.shape[1]
        print(f"  torch output wrong at {len(bad)}/{total} (batch,time) positions: {kinds}")
        with open(os.path.join(d, "torch_errors.txt")) as f:
            rows = [ln.split() for ln in f if not ln.startswith("#")]
        expect(len(rows) == len(bad) and all(int(r[0]) == b and int(r[1]) == t and r[2] == k
                                             for r, (b, t, k, _) in zip(rows, bad)),
               "torch_errors.txt")

    if "pre" in case:
        stp, _, _ = read_safetensors(os.path.join(d, "weights_preforward.safetensors"))
        for k, v in case["pre"]:
            expect(np.array_equal(stp[k][1], v.numpy()), f"preforward {k}")
        stp64 = {k: a.astype(np.float64) for k, (dt, a) in stp.items()}
        md = maxdiff(run_cli_semantics(parse_args_line(case["args"]), stp64, x, d), y_file)
        print(f"  preforward weights + `{case['args']}`: max|diff| = {md:.3g}")
        expect(md < 1e-5, "pre-forward weights with the local args do not reproduce y")
        md = maxdiff(run_cli_semantics(parse_args_line("--variant full --layout btd"),
                                       stp64, x, d), y_file)
        print(f"  preforward weights + `--variant full` (expected to differ): max|diff| = {md:.3g}")
        expect(md > 1e-3, "pre-forward full unexpectedly agrees")
        w_post = st["wbias"][1]
        w_pre = stp["wbias"][1]
        keep = band(12, 3).numpy()
        expect(np.array_equal(w_post, np.where(keep, w_pre, 0)), "post = band-masked pre")

    if name == "rish_full":
        for fn, descr, fortran in (("x_be.npy", ">f4", False), ("x_fortran.npy", "<f4", True),
                                   ("x_f64.npy", "<f8", False)):
            a, hdr = read_npy(os.path.join(d, fn), want_info=True)
            expect(hdr["descr"] == descr and hdr["fortran_order"] == fortran, f"{fn} header {hdr}")
            expect(np.array_equal(a.astype(np.float32), x), f"{fn} values")
        for tag, dt in DTYPES.items():
            s2, _, _ = read_safetensors(os.path.join(d, f"weights_{tag}.safetensors"))
            want = {"f16": "F16", "bf16": "BF16", "f64": "F64"}[tag]
            conv = convert_sd(case["sd"], dt)
            for k, v in conv:
                expect(s2[k][0] == want, f"{tag} {k} dtype")
                expect(np.array_equal(s2[k][1].astype(np.float64),
                                      v.to(torch.float64).numpy()), f"{tag} {k} values")
            yd = read_npy(os.path.join(d, f"y_{tag}.npy"))
            y64 = float64_run(case, conv)
            expect(np.array_equal(yd, y64), f"y_{tag}.npy")
            ref = run_cli_semantics(parse_args_line(case["args"]),
                                    {k: a.astype(np.float64) for k, (_, a) in s2.items()}, x, d)
            md = maxdiff(ref, yd)
            print(f"  weights_{tag}: aft semantics vs y_{tag}.npy max|diff| = {md:.3g}; "
                  f"y_{tag} vs y.npy max|diff| = {maxdiff(yd, y_file):.3g}")
            expect(md < 1e-5, f"{tag} disagreement")
    return fails


def reference_aft32(x, p, w):
    """reference_aft, but every step in float32 (numpy)."""
    f = np.float32

    def lin(a, W, b):
        y = (a @ W.T).astype(f)
        return y if b is None else (y + b).astype(f)
    q = lin(x, p["wq"], p["bq"])
    k = lin(x, p["wk"], p["bk"])
    v = lin(x, p["wv"], p["bv"])
    s = k[:, None, :, :] + w[None, :, :, None]
    m = s.max(axis=2, keepdims=True)
    m = np.where(np.isfinite(m), m, f(0))
    e = np.exp(s - m).astype(f)
    num = (e * v[:, None, :, :]).sum(axis=2, dtype=f)
    den = e.sum(axis=2, dtype=f)
    ctx = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    y = (f(1) / (f(1) + np.exp(-q))) * ctx
    return lin(y.astype(f), p["wo"], p["bo"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="verify the files in testdata/torch/ instead of writing them")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cases = [build(n) for n in CASES]
    if not a.check:
        for c in cases:
            write_case(c)
            print("wrote", os.path.relpath(os.path.join(OUT, c["name"]), os.getcwd()))
    allfails = []
    for c in cases:
        print(c["name"] + ":")
        allfails += [c["name"] + ": " + m for m in check_case(c)]
    total = sum(os.path.getsize(os.path.join(r, f))
                for r, _, fs in os.walk(OUT) for f in fs)
    print(f"total size of {os.path.relpath(OUT, os.getcwd())}: {total} bytes")
    if allfails:
        print(f"{len(allfails)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
