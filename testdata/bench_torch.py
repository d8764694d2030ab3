#!/usr/bin/python3
"""Side-by-side timing of aft and PyTorch versions of the AFT layer.

Run with Debian's interpreter (torch 1.13, numpy 1.24); the pyenv `python3`
on PATH has neither:

    /usr/bin/python3 testdata/bench_torch.py                       # T = 1024, 4096
    /usr/bin/python3 testdata/bench_torch.py --seq-len 256,1024,8192 --repeat 10
    /usr/bin/python3 testdata/bench_torch.py --check-only          # agreement only
    /usr/bin/python3 testdata/bench_torch.py --json                # JSON lines
    /usr/bin/python3 testdata/bench_torch.py --stream              # a token at a time
    /usr/bin/python3 testdata/bench_torch.py --grid                # AFT-conv, 56 x 56
    /usr/bin/python3 testdata/bench_torch.py --grad                # forward + backward
    /usr/bin/python3 testdata/bench_torch.py --generate            # text from labml's model
    /usr/bin/python3 testdata/bench_torch.py --bf16                # bf16: autocast against --precision bf16

Cases (each a whole layer: Linear q, k, v, the AFT core, Linear output;
float32, batch 1, d_model = d_hidden):

  labml-local  computed the way labml's AFTLocal does it: a T x T position
               bias times the local mask, the causal mask filled with -inf, one
               key max and one bias max subtracted, then two einsums over the
               full T x T (O(T^2 d) time, several T x T arrays).
               aft: run --variant local --window S --causal
  rish-full    rish-16's AFTFull: exp(w) @ (exp(K) * V) / (exp(w) @ exp(K)),
               w the T x T bias (O(T^2 d)).        aft: run --variant full
  rish-simple  rish-16's AFTSimple: softmax of K over time, times V, summed
               over time (O(T d)).                 aft: run --variant simple

The modules are ours, in testdata/torch_aft.py (shared with the fixture
maker); nothing is imported from the upstream projects
(testdata/torch/README.md records what they compute).

Every PyTorch measurement runs in its own subprocess (this file, re-invoked
with a hidden --worker argument), so its peak RSS is its own, with
OPENBLAS_CORETYPE=SkylakeX on a CPU with AVX-512 (so that PyTorch's products
use AVX-512 whatever OpenBLAS detects; elsewhere OpenBLAS's own choice, or
--torch-coretype),
OPENBLAS_NUM_THREADS and
OMP_NUM_THREADS set to --threads, and torch.set_num_threads(--threads).
Timings: torch.no_grad(), --warmup untimed calls, then the fastest of
--repeat calls.  aft: `aft run ... --threads N --repeat N --timing FILE`,
compute_min_ms and peak_rss_bytes from that JSON.  Torch and aft take
turns --rounds times (default 3) and each side keeps its fastest round: the
speed of a shared machine drifts by up to 2x within a minute, and a single
pair of measurements can land one side in a slow moment.

Beside both times the default mode prints the machine's floor for each
layer: its useful FLOPs (the four projections and the AFT sums over the
visible pairs) at the 2048^3 torch.mm rate, or its bytes (x, y, the
weights, full's T x T bias) at the copy rate, whichever takes longer;
aft/floor is how far aft is from it.  A shared machine's rate drifts, and a
floor set by a rate measured in a slow moment is no floor (aft once came in
at 0.4x it), so the rate is the highest of several measured in the same run:
before the cases and in every torch round, after its timing (or alone, for
a case torch skips); the copy rate the higher of one before and one after.
The table, printed once the last rate is in, names the rate it used, the
lowest and the first.

Before timing, each case is checked once at --check-len (default 256): the
torch module's state dict (position bias set to randn * 0.5 so it matters) is
written to a .safetensors file under the names aft resolves, aft runs on it,
and the outputs are compared with the float32 module and the same module run
in float64.

--stream (issue 22) times decoding a token at a time: labml-local's layer,
d = 256, window 32, causal, batch 1, one thread by default, --seq-len tokens
(default 4096, at most 4096).  PyTorch runs it as a decoding loop is written
(stream_decode): a cache of every past token's projected K and V, and for
token t its three projections, then labml's formula over all t + 1 cached
keys with bias row t, pos_bias[t] * local_mask[t] (0 outside the window:
those keys still count, so the loop cannot keep only the window), then
sigmoid(Q) *, then the output projection; float32, torch.no_grad().  Its
time a token is the fastest decode's total over the tokens (the first and
last 256 tokens are shown too: the loop's cost grows with t).  aft's is
stream_us_per_token of `aft bench --stream` (a step of one row, the state
in memory, seeded weights; the time does not depend on their values).  The
check runs the loop over --check-len tokens against `aft run --causal
--variant local` on the same weights and against labml's one-shot forward
in float64, within --check-tol of max|y|.

--grid [H,W] (issue 25) times AFT-conv on an H x W grid (default 56 x 56),
d = 192, 32 heads, S = 6 (an 11 x 11 kernel), --batch 8, not causal:
PaperAFTConv2d (testdata/torch_aft.py, the paper's formula with
torch.nn.functional.conv2d, groups = channels, one key channel per head)
against `aft run --variant conv --grid H,W` on the module's state dict and
the same x.  The check compares the outputs on the full grid (against the
module in float32 and float64, within --check-tol of max|y|).  Besides both
times and their ratio it prints a floor: the operator's FLOPs (2 x 11 x 11
multiply-adds a token and channel, numerator and denominator) plus the
projections' (2 B T d (3 d + heads): to_k has one channel per head) at the
faster of two measured torch matrix-product rates (a Linear of the
projection's size, the 2048^3 torch.mm), and the bytes of x, y and the
weights once at a measured copy rate; the floor is the larger time.

--grad (issue 23) times forward + backward of the three cases at --seq-len
(default 4096): torch.autograd, y = module(x); y.backward(dy) with x and
every parameter requiring grad, against `aft grad --weights W <the case's
aft run options> x.npy --grad-output dy.npy --timing FILE --repeat N` on
the same files (the module's state dict, x, dy).  Both sides are medians:
torch's of --repeat calls after --warmup, aft's backward_ms (the
gradient call, its forward included); each side keeps its round with the
lowest median.  Beside them the forward alone (torch under no_grad, aft's
forward_ms) and each side's ratio forward+backward / forward (aft's
backward_over_forward: the median of the ratios of each gradient call to the
forward pass aft runs right after it).  First, at --check-len, every gradient aft writes
(input, each parameter under its state_dict name) is checked against
torch.autograd in float64 within --check-tol x max(1, max|g64|); a case
that disagrees is not timed.  Last, one `aft grad` of causal local with
seeded weights at --grad-memory-len (default 65536, a few seconds; 0: none)
for its peak RSS.  Targets, printed pass or MISS: aft >= 10x torch for
labml-local, 1.5x rish-full, 2x rish-simple; backward_over_forward <= 3x
each; the peak RSS under 1.5 GB.  Beside the ratio it prints the ratio the
FLOPs alone set (grad_flop_ratio: 11 projections and 3 times the sums
against 4 and once): the ratio of a backward pass that ran its FLOPs at
the forward's rate (a forward with time beyond its FLOPs, as at small T,
brings the measured ratio below it).

--bf16 (issue 46) times bf16 products in the same run, each case at --seq-len
(default 4096), d = 256, and labml's own shape (labml-shape: labml-local with
B = 32, T = 256, d = 128, window 32, causal): the PyTorch module in float32
and under torch.autocast("cpu", dtype=torch.bfloat16), and `aft run` with
--precision f32 and --precision bf16, taking turns --rounds times, each
keeping its fastest round. Beside them the ratios aft bf16 / aft f32 and
aft bf16 / torch autocast, the machine's floors (the layer's FLOPs at the
sgemm ceiling and at the bf16 floor of `aft bench --precision bf16`), and
aft bf16's normwise relative distance from aft f32's output. Targets
(issue 46), printed pass or MISS: aft bf16 >= 2x aft f32 for rish-full and
labml-shape; against autocast, labml-local >= 10x, rish-full >= 1.5x,
rish-simple >= 2x. Where aft has no bf16 engine it says so and exits 1.

--generate (issue 24) times text generation with the shipped model,
testdata/model/labml_aft_fortunes.safetensors (labml's AutoregressiveTransformer,
defined in testdata/model/train_labml_aft.py), greedy from --prompt (default
'It is '), --seq-len characters (default 256), one thread by default:
  labml    labml's own sampling loop as a module (LabmlSampler): for every
           character the whole text so far tokenized and run through the
           model, the argmax at every position, the last one's appended;
  stepper  the same model decoded as aft decodes it, in PyTorch
           (TorchStepper): the prompt in one pass, then a token at a time
           against a cache of each layer's keys and values;
  aft      `aft generate --greedy --timing` in a fresh process each round:
           tokens_per_s of its timing (new characters over the time from
           handing over the prompt to the last character), and beside it the
           warm figure of `aft bench --generate`.
Past the context (256) all three keep the last 128 characters and encode
them again (labml's pos_bias covers 256 positions). The check comes first:
the three greedy texts must be equal. Targets (issue 24): aft at least 5000
characters/s and 50x labml's loop.
"""
import argparse
import json
import math
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL_CKPT = os.path.join(HERE, "model", "labml_aft_fortunes.safetensors")
CASES = ("labml-local", "rish-full", "rish-simple")
QUADRATIC = ("labml-local", "rish-full")       # hold T x T arrays in torch
GIB = float(1 << 30)
MIB = float(1 << 20)


# =====================================================================
# worker side: everything that imports torch runs here, in a subprocess
# =====================================================================

def _modules():
    """The torch modules, testdata/torch_aft.py (imports torch; worker only)."""
    sys.path.insert(0, HERE)
    import torch_aft
    return torch_aft


def _build_case(spec, for_check):
    """(module, x, call) for spec['case'] at length spec['T'].
    call(module, x) runs the forward; x is float32 in the module's layout."""
    import torch
    M = _modules()
    T, d, h, s = spec["T"], spec["d_model"], spec["d_hidden"], spec["window"]
    torch.manual_seed(spec["seed"])
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    case = spec["case"]
    if case == "labml-local":
        m = M.LabmlAFTLocal(d, T, s)
        x = torch.randn(T, spec.get("batch", 1), d, generator=g)   # [T, B, d]
        mask = M.labml_causal_mask(T)                      # built once, as labml caches it

        def call(mod, xx):
            return mod(query=xx, key=xx, value=xx, mask=mask)
        bias_name = "pos_bias"
    elif case == "rish-full":
        m = M.RishAFTFull(T, d, h)
        x = torch.randn(1, T, d, generator=g)

        def call(mod, xx):
            return mod(xx)
        bias_name = "wbias"
    elif case == "rish-simple":
        m = M.RishAFTSimple(T, d, h)
        x = torch.randn(1, T, d, generator=g)

        def call(mod, xx):
            return mod(xx)
        bias_name = None
    else:
        raise ValueError("unknown case " + case)
    if for_check and bias_name:
        with torch.no_grad():
            p = getattr(m, bias_name)
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    m.eval()
    return m, x, call


def _maxrss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _openblas_info():
    """What BLAS library this process has loaded and, for OpenBLAS, its
    core, config and thread count (through ctypes on the loaded library)."""
    import ctypes
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6:
                base = os.path.basename(parts[5])
                if any(k in base for k in ("openblas", "mkl", "blis", "libblas", "atlas")):
                    libs.add(parts[5])
    info = {"loaded_blas_libs": sorted(libs)}
    ob = [p for p in libs if "openblas" in os.path.basename(p)]
    if ob:
        lib = ctypes.CDLL(ob[0])
        for fn, key in (("openblas_get_corename", "core"), ("openblas_get_config", "config")):
            f = getattr(lib, fn, None)
            if f is not None:
                f.restype = ctypes.c_char_p
                info[key] = f().decode()
        f = getattr(lib, "openblas_get_num_threads", None)
        if f is not None:
            f.restype = ctypes.c_int
            info["openblas_threads"] = f()
    return info, (ob[0] if ob else None)


def _set_openblas_threads(path, n):
    import ctypes
    if path:
        f = getattr(ctypes.CDLL(path), "openblas_set_num_threads", None)
        if f is not None:
            f.argtypes = [ctypes.c_int]
            f(n)


def _worker_setup(spec):
    import torch
    torch.set_num_threads(spec["threads"])
    info, ob = _openblas_info()
    _set_openblas_threads(ob, spec["threads"])
    return torch


def _mm_gflops(torch, n):
    """GFLOP/s of an n^3 float32 torch.mm, the best of 3 after one untimed:
    the rate the floor is set by (a moment's rate: the caller keeps the
    highest of several)."""
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    with torch.no_grad():
        torch.mm(a, b)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9


def worker_env(spec):
    torch = _worker_setup(spec)
    info, _ = _openblas_info()
    cfg = torch.__config__.show()
    m = re.search(r"BLAS_INFO=([^,\s]+)", cfg)
    blas_info = "BLAS_INFO=" + (m.group(1) if m else "?")
    cap = next((line.split(":", 1)[1].strip() for line in cfg.splitlines()
                if "CPU capability usage" in line), "?")
    n = spec.get("matmul_n", 2048)
    gflops = _mm_gflops(torch, n)
    info.update(torch_version=torch.__version__, torch_blas_info=blas_info,
                torch_cpu_capability=cap, torch_threads=torch.get_num_threads(),
                mkl=torch.backends.mkl.is_available(),
                matmul_n=n, matmul_gflops=gflops,
                env_OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE"))
    return info


def worker_bench(spec):
    torch = _worker_setup(spec)
    base = _maxrss_bytes()
    m, x, call = _build_case(spec, for_check=False)
    if spec.get("autocast"):   # --bf16: the module's products in bf16, as PyTorch users ask for them
        plain = call

        def call(mod, xx):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return plain(mod, xx)
    times = []
    with torch.no_grad():
        for _ in range(spec["warmup"]):
            call(m, x)
        for _ in range(spec["repeat"]):
            t0 = time.perf_counter()
            y = call(m, x)
            times.append((time.perf_counter() - t0) * 1e3)
            del y
    info, _ = _openblas_info()
    peak = _maxrss_bytes()
    res = {"ms_min": min(times), "ms_median": statistics.median(times),
           "ms_all": times, "rss_after_import": base, "rss_peak": peak,
           "blas_core": info.get("core")}
    if spec.get("matmul_n"):
        # the floor's rate, measured again in this round (its arrays after
        # the peak was read, so they do not count in it)
        res["matmul_gflops"] = _mm_gflops(torch, spec["matmul_n"])
    return res


def worker_mm(spec):
    """The floor's rate alone, where no torch round measured it."""
    torch = _worker_setup(spec)
    return {"matmul_gflops": _mm_gflops(torch, spec["matmul_n"])}


def worker_check(spec):
    import copy
    import numpy as np
    torch = _worker_setup(spec)
    m, x, call = _build_case(spec, for_check=True)
    with torch.no_grad():
        y32 = call(m, x)
        m64 = copy.deepcopy(m).double()                  # bool local_mask stays bool
        y64 = call(m64, x.double())
    out = spec["dir"]
    sd = list(m.state_dict().items())
    M = _modules()
    M.write_safetensors(os.path.join(out, "weights.safetensors"), sd,
                        {"format": "pt", "written_by": "testdata/bench_torch.py"})
    np.save(os.path.join(out, "x.npy"), x.numpy().astype("<f4"))
    np.save(os.path.join(out, "y_torch32.npy"), y32.numpy())
    np.save(os.path.join(out, "y_torch64.npy"), y64.numpy())
    return {"tensors": [[k, list(v.shape), M.tensor_bytes(v)[0]] for k, v in sd],
            "finite32": bool(torch.isfinite(y32).all())}


# ---- --stream: labml's layer decoded a token at a time, with a KV cache

def _stream_case(spec, n):
    """(LabmlAFTLocal with Tmax = n and a randn * 0.5 bias, x [n, 1, d])."""
    import torch
    M = _modules()
    torch.manual_seed(spec["seed"])
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    m = M.LabmlAFTLocal(spec["d_model"], n, spec["window"])
    x = torch.randn(n, 1, spec["d_model"], generator=g)    # [T, B, d]
    with torch.no_grad():
        m.pos_bias.copy_(torch.randn(m.pos_bias.shape, generator=g) * 0.5)
    return m.eval(), x


def stream_decode(m, x, n):
    """The per-token loop as a decoding loop is usually written: the projected
    K and V of every past token kept in a cache, and for token t its own
    projections, then labml's formula over all t + 1 cached keys with bias
    row t (pos_bias[t] * local_mask[t]: 0 outside the window, those keys
    still count).  x [T, 1, d] -> (y [n, 1, d], seconds of each token)."""
    import torch
    d = x.shape[-1]
    K = torch.empty(n, 1, d, dtype=x.dtype)
    V = torch.empty(n, 1, d, dtype=x.dtype)
    y = torch.empty(n, 1, d, dtype=x.dtype)
    secs = []
    clock = time.perf_counter
    for t in range(n):
        t0 = clock()
        xt = x[t:t + 1]                                              # [1, 1, d]
        q = m.query(xt)
        K[t:t + 1] = m.key(xt)
        V[t:t + 1] = m.value(xt)
        k, v = K[:t + 1], V[:t + 1]                                  # [t+1, 1, d]
        w = (m.pos_bias[t, :t + 1] * m.local_mask[t, :t + 1]).unsqueeze(-1)   # [t+1, 1]
        ek = torch.exp(k - k.max(dim=0, keepdim=True).values)
        ew = torch.exp(w - w.max(dim=0, keepdim=True).values)
        num = torch.einsum("jb,jbd->bd", ew, ek * v)
        den = torch.einsum("jb,jbd->bd", ew, ek)
        y[t:t + 1] = m.output(torch.sigmoid(q[0]) * num / den)
        secs.append(clock() - t0)
    return y, secs


def worker_stream_check(spec):
    """The loop over check_len tokens, labml's one-shot forward in float32
    and float64, and the weights and x for aft, written to spec['dir']."""
    import copy
    import numpy as np
    torch = _worker_setup(spec)
    M = _modules()
    n = spec["T"]
    m, x = _stream_case(spec, n)
    mask = M.labml_causal_mask(n)
    with torch.no_grad():
        y_loop, _ = stream_decode(m, x, n)
        y32 = m(query=x, key=x, value=x, mask=mask)
        m64 = copy.deepcopy(m).double()
        x64 = x.double()
        y64 = m64(query=x64, key=x64, value=x64, mask=mask)
    out = spec["dir"]
    sd = list(m.state_dict().items())
    M.write_safetensors(os.path.join(out, "weights.safetensors"), sd,
                        {"format": "pt", "written_by": "testdata/bench_torch.py --stream"})
    np.save(os.path.join(out, "x.npy"), x.numpy().astype("<f4"))
    for name, y in (("y_loop", y_loop), ("y_torch32", y32), ("y_torch64", y64)):
        np.save(os.path.join(out, name + ".npy"), y.numpy())
    return {"tensors": [[k, list(v.shape), M.tensor_bytes(v)[0]] for k, v in sd]}


def worker_stream_bench(spec):
    """--repeat decodes of T tokens after --warmup untimed decodes of up to
    64; the fastest decode's mean time a token, and over its first and last
    256 tokens."""
    torch = _worker_setup(spec)
    n = spec["T"]
    m, x = _stream_case(spec, n)
    best = None
    with torch.no_grad():
        for _ in range(spec["warmup"]):
            stream_decode(m, x, min(n, 64))
        for _ in range(spec["repeat"]):
            _, secs = stream_decode(m, x, n)
            if best is None or sum(secs) < sum(best):
                best = secs
    edge = min(256, n)
    return {"us_per_token": sum(best) / n * 1e6,
            "us_first": sum(best[:edge]) / edge * 1e6,
            "us_last": sum(best[-edge:]) / edge * 1e6,
            "edge": edge, "rss_peak": _maxrss_bytes()}


# ---- --grid: PaperAFTConv2d on an H x W grid

def _grid_case(spec):
    """(PaperAFTConv2d with a randn * 0.5 bias, x [B, H, W, d])."""
    import torch
    M = _modules()
    torch.manual_seed(spec["seed"])
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    m = M.PaperAFTConv2d(spec["d_model"], spec["d_hidden"], spec["heads"], spec["window"])
    x = torch.randn(spec["B"], spec["H"], spec["W"], spec["d_model"], generator=g)
    with torch.no_grad():
        m.pos_bias.copy_(torch.randn(m.pos_bias.shape, generator=g) * 0.5)
    return m.eval(), x


def worker_grid_prepare(spec):
    """Weights and x for aft, the module's output in float32 and (for the
    check) float64, written to spec['dir']."""
    import copy
    import numpy as np
    torch = _worker_setup(spec)
    M = _modules()
    m, x = _grid_case(spec)
    out = spec["dir"]
    sd = list(m.state_dict().items())
    M.write_safetensors(os.path.join(out, "weights.safetensors"), sd,
                        {"format": "pt", "written_by": "testdata/bench_torch.py --grid"})
    np.save(os.path.join(out, "x.npy"), x.numpy().astype("<f4"))
    if spec["check"]:
        with torch.no_grad():
            np.save(os.path.join(out, "y_torch32.npy"), m(x).numpy())
            np.save(os.path.join(out, "y_torch64.npy"), copy.deepcopy(m).double()(x.double()).numpy())
    return {"tensors": [[k, list(v.shape), M.tensor_bytes(v)[0]] for k, v in sd]}


def _best_seconds(fn, n):
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def worker_grid_bench(spec):
    """The module timed as the other cases are; then the rate of one
    projection alone (Linear d -> d on all B H W tokens) and of a 256 MiB
    copy, for the floor."""
    torch = _worker_setup(spec)
    base = _maxrss_bytes()
    m, x = _grid_case(spec)
    times = []
    with torch.no_grad():
        for _ in range(spec["warmup"]):
            m(x)
        for _ in range(spec["repeat"]):
            t0 = time.perf_counter()
            y = m(x)
            times.append((time.perf_counter() - t0) * 1e3)
            del y
        peak = _maxrss_bytes()
        rows = x.reshape(-1, x.shape[-1])
        lin = m.to_q
        lin(rows)
        s = _best_seconds(lambda: lin(rows), max(3, spec["repeat"]))
        proj_gflops = 2.0 * rows.shape[0] * lin.in_features * lin.out_features / s / 1e9
        src = torch.ones(1 << 26)
        dst = torch.empty_like(src)
        dst.copy_(src)
        s = _best_seconds(lambda: dst.copy_(src), 3)
        copy_gbs = 2.0 * src.numel() * 4 / s / 1e9          # read + write
    return {"ms_min": min(times), "ms_all": times, "rss_after_import": base,
            "rss_peak": peak, "proj_gflops": proj_gflops, "copy_gbs": copy_gbs}


# ---- --grad: forward + backward through torch.autograd

def _grad_inputs(spec, x):
    """dL/dy for the case: standard normal, the output's shape (= x's), seeded
    apart from x and the weights."""
    import torch
    g = torch.Generator().manual_seed(spec["seed"] + 2)
    return torch.randn(x.shape, generator=g)


def _autograd(m, x, dy, call, dtype):
    """[(name, gradient)] of sum(y * dy) in dtype: "input" first, then every
    parameter with a gradient, in state_dict order (as aft grad names them)."""
    import copy
    m = copy.deepcopy(m).to(dtype)                       # a bool local_mask stays bool
    x = x.to(dtype).clone().requires_grad_(True)
    call(m, x).backward(dy.to(dtype))
    params = dict(m.named_parameters())
    named = [("input", x.grad)]
    for k in m.state_dict():
        p = params.get(k)
        if p is not None and p.grad is not None:
            named.append((k, p.grad))
    return named


def worker_grad_prepare(spec):
    """The module's state dict, x and dy written to spec['dir'] for both
    sides; with spec['check'] (the bias randn * 0.5 so it matters) also
    torch.autograd's gradients in float64 and float32, g64.npz and g32.npz."""
    import numpy as np
    torch = _worker_setup(spec)
    M = _modules()
    m, x, call = _build_case(spec, for_check=spec["check"])
    dy = _grad_inputs(spec, x)
    out = spec["dir"]
    sd = list(m.state_dict().items())
    M.write_safetensors(os.path.join(out, "weights.safetensors"), sd,
                        {"format": "pt", "written_by": "testdata/bench_torch.py --grad"})
    np.save(os.path.join(out, "x.npy"), x.numpy().astype("<f4"))
    np.save(os.path.join(out, "dy.npy"), dy.numpy().astype("<f4"))
    if spec["check"]:
        for name, dtype in (("g64.npz", torch.float64), ("g32.npz", torch.float32)):
            np.savez(os.path.join(out, name),
                     **{k: v.detach().numpy() for k, v in _autograd(m, x, dy, call, dtype)})
    return {"tensors": [[k, list(v.shape), M.tensor_bytes(v)[0]] for k, v in sd]}


def worker_grad_bench(spec):
    """The module loaded from spec['dir'] (the files aft reads), x and every
    parameter requiring grad: --warmup untimed then --repeat timed calls of
    y = module(x); y.backward(dy), the gradients set to None between calls
    (untimed); then the forward alone under torch.no_grad(), as often."""
    import numpy as np
    torch = _worker_setup(spec)
    base = _maxrss_bytes()
    m, _, call = _build_case(spec, for_check=False)
    d = spec["dir"]
    sd = read_safetensors(os.path.join(d, "weights.safetensors"))
    m.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()}, strict=True)
    x = torch.from_numpy(np.load(os.path.join(d, "x.npy"))).requires_grad_(True)
    dy = torch.from_numpy(np.load(os.path.join(d, "dy.npy")))
    fwd, bwd, total = [], [], []
    for i in range(spec["warmup"] + spec["repeat"]):
        m.zero_grad(set_to_none=True)
        x.grad = None
        t0 = time.perf_counter()
        y = call(m, x)
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        del y
        if i >= spec["warmup"]:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
            total.append((t2 - t0) * 1e3)
    peak = _maxrss_bytes()
    alone = []
    with torch.no_grad():
        for i in range(spec["warmup"] + spec["repeat"]):
            t0 = time.perf_counter()
            y = call(m, x)
            t1 = time.perf_counter()
            del y
            if i >= spec["warmup"]:
                alone.append((t1 - t0) * 1e3)
    med = statistics.median
    return {"ms_grad": med(total), "ms_grad_all": total, "ms_grad_fwd": med(fwd),
            "ms_grad_bwd": med(bwd), "ms_forward": med(alone), "ms_forward_all": alone,
            "rss_after_import": base, "rss_peak": peak}

# ---- --generate: labml's language model generating text

def _trained():
    """testdata/model/train_labml_aft.py, the model's definition (imports torch)."""
    sys.path.insert(0, os.path.join(HERE, "model"))
    import train_labml_aft
    return train_labml_aft


def _labml_sampler_class():
    import torch
    from torch import nn

    class LabmlSampler(nn.Module):
        """labml's own sampling loop (NLPAutoRegressionConfigs.sample in
        labml_nn/experiments/nlp_autoregression.py) as a module: for every
        new character the whole text so far is tokenized, run through the
        model, the argmax taken over the vocabulary at every position, and
        the last position's appended.  Past seq_len the context keeps its
        last seq_len / 2 characters (aft's rule: labml's pos_bias covers
        seq_len positions, so its loop cannot go past them)."""

        def __init__(self, model, itos, seq_len, keep):
            super().__init__()
            self.model, self.itos, self.seq_len, self.keep = model, itos, seq_len, keep
            self.stoi = {c: i for i, c in enumerate(itos)}

        def forward(self, prompt, n):
            context, out = prompt, []
            if len(context) > self.seq_len:
                context = context[-self.keep:]
            for _ in range(n):
                data = torch.tensor([self.stoi[c] for c in context], dtype=torch.long).unsqueeze(-1)
                output = self.model(data)
                output = output.argmax(dim=-1).squeeze(-1)
                c = self.itos[output[-1]]
                out.append(c)
                if len(context) == self.seq_len:
                    context = context[self.seq_len - self.keep:]
                context += c
            return "".join(out)

    return LabmlSampler


class TorchStepper:
    """The same model decoded as aft does it, in PyTorch: per layer a cache
    of the context's keys and values; the prompt in one pass, then a new
    token's embedding at its position, through each layer's norms, its
    projections (its own row only), labml's formula for that row over the
    cached keys (bias row t, pos_bias * local_mask, the -inf of the causal
    mask left out: no later key is cached) and the feed-forward network.
    Past seq_len: the last seq_len / 2 tokens encoded again from position 0."""

    def __init__(self, model, seq_len, keep):
        import torch
        self.torch, self.m, self.seq_len, self.keep = torch, model, seq_len, keep
        d = model.src_embed.d_model
        n_layers = len(model.encoder.layers)
        self.K = torch.empty(n_layers, seq_len, 1, d)
        self.V = torch.empty(n_layers, seq_len, 1, d)
        self.tokens = []

    def _rows(self, toks):
        """toks (the next tokens, positions len(self.tokens) on) through the
        model, caching each layer's K and V; the last row's logits."""
        torch, m = self.torch, self.m
        t0, n = len(self.tokens), len(toks)
        T = t0 + n
        emb = m.src_embed
        x = emb.linear(torch.tensor(toks, dtype=torch.long).unsqueeze(-1)) * math.sqrt(emb.d_model) \
            + emb.positional_encodings[t0:T]
        for li, layer in enumerate(m.encoder.layers):
            a = layer.self_attn
            z = layer.norm_self_attn(x)
            q = a.query(z)
            self.K[li, t0:T] = a.key(z)
            self.V[li, t0:T] = a.value(z)
            k, v = self.K[li, :T], self.V[li, :T]                       # [T, 1, d]
            w = (a.pos_bias[t0:T, :T] * a.local_mask[t0:T, :T]).unsqueeze(-1)   # [n, T, 1]
            if n > 1:                                                   # the prompt: causal
                hide = torch.arange(T)[None, :] > torch.arange(t0, T)[:, None]
                w = w.masked_fill(hide.unsqueeze(-1), float("-inf"))
            ek = torch.exp(k - k.max(dim=0, keepdim=True).values)
            ew = torch.exp(w - w.max(dim=1, keepdim=True).values)
            num = torch.einsum("ijb,jbd->ibd", ew, ek * v)
            den = torch.einsum("ijb,jbd->ibd", ew, ek)
            x = x + a.output(torch.sigmoid(q) * num / den)
            x = x + layer.feed_forward(layer.norm_ff(x))
        self.tokens.extend(toks)
        return m.generator(m.encoder.norm(x[-1:]))[0, 0]

    def feed(self, toks):
        """the next tokens, with the context rule; the last one's logits"""
        logits, i = None, 0
        while i < len(toks):
            if len(self.tokens) == self.seq_len:
                kept = self.tokens[self.seq_len - self.keep:]
                self.tokens = []
                self._rows(kept)
            k = min(len(toks) - i, self.seq_len - len(self.tokens))
            logits = self._rows(toks[i:i + k])
            i += k
        return logits


def _generate_setup(spec):
    torch = _worker_setup(spec)
    T = _trained()
    named, meta = T.read_safetensors(os.path.join(HERE, "model", T.CKPT_NAME))
    itos = json.loads(meta["vocab"])
    model = T.load_model(named, len(itos))
    return torch, T, model, itos


def worker_generate(spec):
    """labml's loop and the PyTorch stepper, each generating spec['T']
    characters greedily from spec['prompt'] after --warmup untimed runs of 16;
    the fastest of --repeat runs of each, and their texts."""
    torch, T, model, itos = _generate_setup(spec)
    L, keep = T.SEQ_LEN, T.SEQ_LEN // 2
    labml = _labml_sampler_class()(model, itos, L, keep).eval()
    stoi = {c: i for i, c in enumerate(itos)}
    prompt, n = spec["prompt"], spec["T"]

    def stepper(count):
        st = TorchStepper(model, L, keep)
        logits = st.feed([stoi[c] for c in prompt])
        out = []
        for i in range(count):
            nxt = int(torch.argmax(logits))
            out.append(itos[nxt])
            if i + 1 < count:
                logits = st.feed([nxt])
        return "".join(out)

    res = {}
    with torch.no_grad():
        for name, run in (("labml", lambda c: labml(prompt, c)), ("stepper", stepper)):
            for _ in range(spec["warmup"]):
                run(min(n, 16))
            best, text = float("inf"), None
            for _ in range(spec["repeat"]):
                t0 = time.perf_counter()
                text = run(n)
                best = min(best, time.perf_counter() - t0)
            res[name] = {"s": best, "text": text}
    res["rss_peak"] = _maxrss_bytes()
    return res


def worker_main(spec):
    fn = {"env": worker_env, "bench": worker_bench, "mm": worker_mm, "check": worker_check,
          "stream_check": worker_stream_check, "stream_bench": worker_stream_bench,
          "grid_prepare": worker_grid_prepare, "grid_bench": worker_grid_bench,
          "grad_prepare": worker_grad_prepare, "grad_bench": worker_grad_bench,
          "generate": worker_generate}[spec["task"]]
    res = fn(spec)
    sys.stdout.write("@@RESULT " + json.dumps(res) + "\n")
    sys.stdout.flush()


# =====================================================================
# parent side: no torch here
# =====================================================================

def cpu_has_avx512():
    """The AVX-512 subsets OpenBLAS's SkylakeX kernels use, as aft checks
    them (lib/system.c), from /proc/cpuinfo's flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    except OSError:
        return False
    return all(f in flags for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"))


def torch_env(args, coretype):
    """Environment for a torch subprocess.  coretype None: remove
    OPENBLAS_CORETYPE (OpenBLAS picks its own kernel); "inherit": as is."""
    env = dict(os.environ)
    if coretype is None:
        env.pop("OPENBLAS_CORETYPE", None)
    elif coretype != "inherit":
        env["OPENBLAS_CORETYPE"] = coretype
    n = str(args.threads)
    env["OPENBLAS_NUM_THREADS"] = n
    env["OMP_NUM_THREADS"] = n
    env["MKL_NUM_THREADS"] = n
    if args.aten_cpu_capability:
        env["ATEN_CPU_CAPABILITY"] = args.aten_cpu_capability
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy
    return env


def aft_env(args):
    """aft gets this environment as is, plus the same OMP_WAIT_POLICY as
    torch when one is asked for."""
    env = dict(os.environ)
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy
    return env


def run_worker(args, spec, coretype):
    """Run one worker task in a fresh interpreter; (result dict, error str)."""
    spec = dict(spec, threads=args.threads)
    cmd = [args.python, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    try:
        p = subprocess.run(cmd, env=torch_env(args, coretype), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {args.timeout} s"
    for line in p.stdout.splitlines():
        if line.startswith("@@RESULT "):
            return json.loads(line[len("@@RESULT "):]), None
    tail = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
    if p.returncode < 0:
        tail = f"killed by signal {-p.returncode} ({tail})"
    return None, tail


def aft_argv(args, opts, tail):
    """`aft run` arguments: opts, --threads, --timing timing.json, then tail
    (the input and -o)."""
    return opts + ["--threads", str(args.threads), "--timing", "timing.json"] + tail


def run_aft(args, argv, cwd, sub="run"):
    """Run `aft SUB argv...` (run, or grad) in cwd (argv from aft_argv);
    (timing dict, error str)."""
    tfile = os.path.join(cwd, "timing.json")
    cmd = [args.aft, sub] + argv
    try:
        p = subprocess.run(cmd, cwd=cwd, env=aft_env(args), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {args.timeout} s"
    if p.returncode != 0:
        return None, (p.stderr.strip() or f"exit status {p.returncode}")
    with open(tfile) as f:
        return json.load(f), None


ST_NP_DTYPE = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "BOOL": "?", "I64": "<i8",
               "I32": "<i4", "U8": "u1"}


def read_safetensors(path):
    """{name: numpy array} of a .safetensors file, in the file's order
    (numpy only: the parent reads aft's gradients, a worker its weights)."""
    import struct
    import numpy as np
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[a:b], dtype=ST_NP_DTYPE[v["dtype"]]).reshape(v["shape"])
    return out


def aft_variant_args(case, window):
    return {"labml-local": ["--variant", "local", "--window", str(window), "--causal"],
            "rish-full": ["--variant", "full"],
            "rish-simple": ["--variant", "simple"]}[case]


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def torch_peak_estimate(case, T, d):
    """Rough bytes the torch case holds at its peak: a few T x T float32
    arrays (bias, bias * mask, exp, the masks) for the quadratic cases."""
    tt = 4.0 * T * T
    if case == "labml-local":
        return 5.5 * tt + 16.0 * T * d * 4
    if case == "rish-full":
        return 4.0 * tt + 16.0 * T * d * 4
    return 16.0 * T * d * 4


class Out:
    """Table or JSON-lines output."""

    def __init__(self, as_json):
        self.json = as_json

    def note(self, text, **obj):
        if self.json:
            print(json.dumps(obj), flush=True)
        else:
            print(text, flush=True)


def fmt_gflops(r):
    return f"{r['matmul_gflops']:.1f} GFLOP/s (OpenBLAS core {r.get('core', '?')})"


def print_env(args, out):
    results = {}
    variants = [("torch-run", args.torch_coretype)]
    inherited = os.environ.get("OPENBLAS_CORETYPE")
    if args.torch_coretype is not None:
        variants.append(("unset", None))
    if inherited and inherited != args.torch_coretype:
        variants.append(("inherited", "inherit"))
    for label, ct in variants:
        r, err = run_worker(args, {"task": "env", "matmul_n": args.matmul_n}, ct)
        results[label] = (ct, r, err)
    _, main, err = results["torch-run"]
    if main is None:
        sys.exit(f"bench_torch: torch worker failed: {err}")
    libs = ", ".join(main["loaded_blas_libs"]) or "none found in /proc/self/maps"
    if main.get("core"):
        blas = (f"OpenBLAS ({main.get('config', '?')}), loaded: {libs}")
    elif main["mkl"]:
        blas = f"MKL (torch's own); loaded: {libs}"
    else:
        blas = f"not OpenBLAS; loaded: {libs}"
    lines = [
        f"torch {main['torch_version']} ({main['torch_blas_info']}, MKL "
        f"{'available' if main['mkl'] else 'not available'}, CPU capability "
        f"{main['torch_cpu_capability']}"
        + (f" [ATEN_CPU_CAPABILITY={args.aten_cpu_capability}]" if args.aten_cpu_capability else "")
        + ")",
        f"torch BLAS: {blas}",
        f"threads: torch.set_num_threads({args.threads}) -> {main['torch_threads']}, "
        f"OpenBLAS threads {main.get('openblas_threads', '?')}, aft --threads {args.threads}"
        f", OMP_WAIT_POLICY {args.omp_wait_policy or os.environ.get('OMP_WAIT_POLICY') or 'unset'}"
        f"; machine has {os.cpu_count()} CPUs, load average "
        + " ".join(f"{v:.2f}" for v in os.getloadavg()),
        f"{args.matmul_n}^3 float32 torch.mm, best of 3:",
    ]
    names = {"torch-run": (f"OPENBLAS_CORETYPE={args.torch_coretype}" if args.torch_coretype
                           else "OPENBLAS_CORETYPE unset") + " (used for torch below)",
             "unset": "OPENBLAS_CORETYPE unset (OpenBLAS's own choice)",
             "inherited": f"OPENBLAS_CORETYPE={inherited} (as in this environment)"}
    for label, (ct, r, e) in results.items():
        lines.append(f"  {names[label]:<58} " + (fmt_gflops(r) if r else f"failed: {e}"))
    if main.get("core") and args.torch_coretype and \
            main["core"].lower() != args.torch_coretype.lower():
        lines.append(f"  WARNING: asked OpenBLAS for {args.torch_coretype}, it reports {main['core']}")
    obj = {"type": "env", "python": args.python, "aft": args.aft,
           "threads": args.threads, "loadavg": os.getloadavg(),
           "torch": main, "matmul": {k: (v[1] if v[1] else {"error": v[2]})
                                     for k, v in results.items()}}
    out.note("\n".join(lines), **obj)
    return main


def do_checks(args, out, tmp):
    """Check aft against the torch modules at T = args.check_len; returns
    (all ok, aft blas core seen)."""
    import numpy as np
    T = args.check_len
    ok_all, core = True, None
    for case in args.cases:
        d = os.path.join(tmp, f"check-{case}")
        os.makedirs(d, exist_ok=True)
        spec = {"task": "check", "case": case, "T": T, "d_model": args.d_model,
                "d_hidden": args.d_hidden if case != "labml-local" else args.d_model,
                "window": args.window, "seed": args.seed, "dir": d}
        r, err = run_worker(args, spec, args.torch_coretype)
        if r is None:
            ok_all = False
            out.note(f"check {case:<12} T={T}: torch failed: {err}",
                     type="check", case=case, T=T, ok=False, error="torch: " + err)
            continue
        argv = ["--weights", "weights.safetensors"] + aft_variant_args(case, args.window)
        if case == "labml-local":
            argv += ["--layout", "tbd"]
        argv = aft_argv(args, argv, ["x.npy", "-o", "y_aft.npy"])
        tj, err = run_aft(args, argv, d)
        if tj is None:
            ok_all = False
            out.note(f"check {case:<12} T={T}: aft failed: {err}",
                     type="check", case=case, T=T, ok=False, error="aft: " + err)
            continue
        core = tj.get("blas_core", core)
        ya = np.load(os.path.join(d, "y_aft.npy")).astype(np.float64)
        y32 = np.load(os.path.join(d, "y_torch32.npy")).astype(np.float64)
        y64 = np.load(os.path.join(d, "y_torch64.npy"))
        if ya.shape != y32.shape:
            ok_all = False
            out.note(f"check {case:<12} T={T}: shape {ya.shape} vs torch {y32.shape}",
                     type="check", case=case, T=T, ok=False, error="shape")
            continue
        d32 = float(np.max(np.abs(ya - y32)))
        d64 = float(np.max(np.abs(ya - y64)))
        t64 = float(np.max(np.abs(y32 - y64)))
        scale = float(np.max(np.abs(y64)))
        ok = bool(np.all(np.isfinite(ya))) and d32 <= args.check_tol * max(1.0, scale)
        ok_all &= ok
        cmd = "aft run " + " ".join(argv)
        out.note(f"check {case:<12} T={T}: max|aft - torch f32| = {d32:.3g}, "
                 f"max|aft - torch f64| = {d64:.3g} (torch f32 vs f64: {t64:.3g}; "
                 f"max|y| {scale:.3g}) {'ok' if ok else 'MISMATCH'}\n"
                 f"      `{cmd}`",
                 type="check", case=case, T=T, ok=ok, max_abs_aft_torch32=d32,
                 max_abs_aft_torch64=d64, max_abs_torch32_torch64=t64, max_abs_y=scale,
                 aft_command=cmd, tensors=r["tensors"])
    return ok_all, core


def fmt_mib(b):
    return "-" if b is None else f"{b / MIB:.0f} MiB"


def bench_round(args, case, T, d, row):
    """One torch measurement and one aft measurement of case at T, merged into
    row: the fastest times and the largest peaks over the rounds so far."""
    def keep_min(key, val):
        row[key] = val if key not in row else min(row[key], val)

    def keep_max(key, val):
        if val is not None:
            row[key] = val if row.get(key) is None else max(row[key], val)

    # ---- torch
    tt = 4.0 * T * T
    avail = mem_available()
    need = torch_peak_estimate(case, T, args.d_model)
    if case in QUADRATIC and T > args.skip_torch_above:
        row["torch_skipped"] = f"skipped (T x T = {tt / GIB:.3g} GiB)"
    elif case in QUADRATIC and avail is not None and need > 0.8 * avail:
        row["torch_skipped"] = (f"skipped (T x T = {tt / GIB:.3g} GiB; needs ~"
                                f"{need / GIB:.3g} GiB, {avail / GIB:.3g} available)")
    elif "torch_error" not in row:
        spec = {"task": "bench", "case": case, "T": T, "d_model": args.d_model,
                "d_hidden": args.d_hidden if case != "labml-local" else args.d_model,
                "window": args.window, "seed": args.seed,
                "warmup": args.warmup, "repeat": args.repeat, "matmul_n": args.matmul_n}
        r, err = run_worker(args, spec, args.torch_coretype)
        if r is None:
            row["torch_error"] = err
        else:
            if r.get("matmul_gflops"):
                row.setdefault("matmul_gflops_seen", []).append(r["matmul_gflops"])
            keep_min("torch_ms", r["ms_min"])
            row.setdefault("torch_ms_all", []).extend(r["ms_all"])
            row["torch_ms_median"] = statistics.median(row["torch_ms_all"])
            keep_max("torch_peak_rss", r["rss_peak"])
            row.update(torch_rss_after_import=r["rss_after_import"], torch_blas_core=r["blas_core"])
    # ---- aft
    argv = aft_variant_args(case, args.window)
    if case != "labml-local" and args.d_hidden != args.d_model:
        argv += ["--d-hidden", str(args.d_hidden)]
    argv = aft_argv(args, argv + ["--seed", str(args.seed), "--repeat", str(args.repeat)],
                    ["x.npy", "-o", f"y_{case}.npy"])
    row["aft_command"] = "aft run " + " ".join(argv)
    if "aft_error" in row:
        return
    tj, err = run_aft(args, argv, d)
    if tj is None:
        row["aft_error"] = err
    else:
        keep_min("aft_ms", tj["compute_min_ms"])
        row.setdefault("aft_ms_medians", []).append(tj["compute_ms"])
        row["aft_ms_median"] = statistics.median(row["aft_ms_medians"])
        keep_max("aft_peak_rss", tj.get("peak_rss_bytes"))
        row["aft_blas_core"] = tj.get("blas_core")


def layer_flops(args, case, T):
    """One projection's FLOPs (2 N d h) and the AFT sums' (4 h a visible
    (t, t') pair: numerator and denominator), for one layer's forward."""
    d = args.d_model
    h = d if case == "labml-local" else args.d_hidden
    s = min(args.window, T)
    pairs = {"labml-local": T * s - s * (s - 1) / 2, "rish-full": T * T, "rish-simple": T}[case]
    return 2.0 * T * d * h, 4.0 * pairs * h


def grad_flop_ratio(args, case, T):
    """The ratio forward+backward / forward that the FLOPs alone set: what
    aft's backward_over_forward would be were both passes run at one FLOP
    rate. aft's forward runs the 4 projections and the sums; its gradient
    call 11 projections (Q, K, V and dy Wo^T; then dX, whose 3 make one
    product, the 3 weight gradients and Wo's: it does not compute the
    output) and the sums 3 times (the forward's 2 a pair, then 2 for dw and
    1 each for dv and dk)."""
    proj, op = layer_flops(args, case, T)
    return (11 * proj + 3 * op) / (4 * proj + op)


def case_floor(args, case, T, mm_gflops, copy_gbs):
    """The machine's floor for one layer: its useful FLOPs (the four
    projections, 2 N d h each, and the AFT sums, 4 h a visible (t, t')
    pair: numerator and denominator) at mm_gflops (the 2048^3 torch.mm
    rate), and its bytes (x, y, the weights and a T x T bias once) at
    copy_gbs; the larger of the two times, in ms."""
    d = args.d_model
    h = d if case == "labml-local" else args.d_hidden
    proj, op = layer_flops(args, case, T)
    flops = 4 * proj + op
    nbytes = 4.0 * (2 * T * d + 4 * d * h + (T * T if case == "rish-full" else 0))
    return max(flops / (mm_gflops * 1e9), nbytes / (copy_gbs * 1e9)) * 1e3


COPY_RATE = """
import time, numpy as np
src = np.ones(1 << 26, dtype=np.float32); dst = np.empty_like(src); best = 1e9
for _ in range(5):
    t0 = time.perf_counter(); np.copyto(dst, src); best = min(best, time.perf_counter() - t0)
print(2.0 * src.nbytes / best / 1e9)
"""


def copy_rate(args):
    """GB/s of a 256 MiB copy (read and write counted), best of 5, in a
    process of its own: the children this one starts later would otherwise
    count its 512 MiB in their peak memory."""
    p = subprocess.run([args.python, "-c", COPY_RATE], stdout=subprocess.PIPE, text=True, check=True)
    return float(p.stdout)


def bench(args, out, tmp, mm_gflops=None):
    """Each case timed at each T, torch and aft taking turns, then the table.
    The floor's matmul rate is the highest of every measurement in the run:
    print_env's before the cases (mm_gflops), one after every torch round
    (in its worker), and one alone after a case whose torch side did not
    run; its copy rate the higher of one before and one after the cases.
    A floor is a bound only at the machine's best rate: one measured in a
    slow moment put aft under it (aft / floor 0.4x). The table comes once
    every rate is in, so every row's floor is at the same rate."""
    import numpy as np
    rows = []
    rates = [mm_gflops] if mm_gflops else []
    copies = [copy_rate(args)] if mm_gflops else []
    hdr = (f"{'case':<12} {'T':>6} {'torch ms':>12} {'aft ms':>9} {'speed-up':>9} {'floor ms':>9} "
           f"{'aft/floor':>9}  {'torch peak RSS (+ over import)':<32} {'aft peak RSS':>12}")
    if not out.json:
        print(f"\n{args.rounds} rounds, torch and aft taking turns; torch: best of "
              f"{args.repeat} after {args.warmup} warm-up; aft: compute_min_ms of --repeat "
              f"{args.repeat}; best round of each; d_model {args.d_model}, "
              f"d_hidden {args.d_hidden}, window {args.window}, batch 1, float32")
        for case in args.cases:
            opts = aft_variant_args(case, args.window)
            if case != "labml-local" and args.d_hidden != args.d_model:
                opts += ["--d-hidden", str(args.d_hidden)]
            cmd = "aft run " + " ".join(aft_argv(
                args, opts + ["--seed", str(args.seed), "--repeat", str(args.repeat)],
                ["x.npy", "-o", f"y_{case}.npy"]))
            print(f"  {case:<12} {cmd}")
        print(f"  (x.npy: [1, T, {args.d_model}] float32, standard normal)", flush=True)
    rng = np.random.default_rng(args.seed)
    for T in args.seq_len:
        d = os.path.join(tmp, f"T{T}")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "x.npy"),
                rng.standard_normal((1, T, args.d_model), dtype=np.float32))
        for case in args.cases:
            row = {"type": "row", "case": case, "T": T}
            # torch and aft take turns, --rounds times; each keeps its best
            # round, so a moment when the shared machine was slow counts
            # against neither side
            for _ in range(args.rounds):
                bench_round(args, case, T, d, row)
            try:
                os.remove(os.path.join(d, f"y_{case}.npy"))
            except OSError:
                pass
            if "torch_ms" in row and "aft_ms" in row and row["aft_ms"] > 0:
                row["speedup"] = row["torch_ms"] / row["aft_ms"]
            if mm_gflops:
                if not row.get("matmul_gflops_seen"):
                    r, _ = run_worker(args, {"task": "mm", "matmul_n": args.matmul_n}, args.torch_coretype)
                    if r:
                        row["matmul_gflops_seen"] = [r["matmul_gflops"]]
                rates.extend(row.get("matmul_gflops_seen", []))
            rows.append(row)
            if not out.json:   # the table waits for the last rate: progress meanwhile
                print(f"  measured {case} T={T}: torch {row.get('torch_ms', 0):.2f} ms, "
                      f"aft {row.get('aft_ms', 0):.2f} ms", file=sys.stderr, flush=True)
        shutil.rmtree(d, ignore_errors=True)
    if mm_gflops:
        copies.append(copy_rate(args))
        best, copy_gbs = max(rates), max(copies)
        for row in rows:
            row["floor_ms"] = case_floor(args, row["case"], row["T"], best, copy_gbs)
            if "aft_ms" in row:
                row["aft_over_floor"] = row["aft_ms"] / row["floor_ms"]
    if out.json:
        if mm_gflops:
            print(json.dumps({"type": "floor", "matmul_n": args.matmul_n, "matmul_gflops": best,
                              "matmul_gflops_seen": rates, "copy_gbs": copy_gbs, "copy_gbs_seen": copies}),
                  flush=True)
        for row in rows:
            print(json.dumps(row), flush=True)
    else:
        if mm_gflops:
            print(f"\nfloor: the layer's FLOPs at {best:.1f} GFLOP/s, the highest of the {len(rates)} "
                  f"{args.matmul_n}^3 torch.mm rates measured in this run (before the cases and after "
                  f"each torch round: lowest {min(rates):.1f}, first {rates[0]:.1f}), or its bytes at "
                  f"{copy_gbs:.1f} GB/s (the faster of {len(copies)} 256 MiB copies, before and after), "
                  f"the larger")
        print(hdr)
        print("-" * len(hdr))
        for row in rows:
            print(fmt_row(row), flush=True)
    return rows


def fmt_row(r):
    if "torch_ms" in r:
        tms = f"{r['torch_ms']:.2f}"
        trss = (f"{r['torch_peak_rss'] / MIB:.0f} MiB "
                f"(+{(r['torch_peak_rss'] - r['torch_rss_after_import']) / MIB:.0f})")
    elif "torch_skipped" in r:
        tms, trss = "-", r["torch_skipped"]
    else:
        tms, trss = "failed", "torch: " + r.get("torch_error", "?")
    if "aft_ms" in r:
        ams, arss = f"{r['aft_ms']:.2f}", fmt_mib(r.get("aft_peak_rss"))
    else:
        ams, arss = "failed", "aft: " + r.get("aft_error", "?")
    sp = f"{r['speedup']:.1f}x" if "speedup" in r else "-"
    fl = f"{r['floor_ms']:.2f}" if "floor_ms" in r else "-"
    af = f"{r['aft_over_floor']:.2f}x" if "aft_over_floor" in r else "-"
    return (f"{r['case']:<12} {r['T']:>6} {tms:>12} {ams:>9} {sp:>9} {fl:>9} {af:>9}  "
            f"{trss:<32} {arss:>12}")


# ---- --stream and --grid (parent side)

def run_aft_bench(args, argv):
    """Run `aft bench argv... --json`; (its last JSON object, error str)."""
    cmd = [args.aft, "bench"] + argv
    try:
        p = subprocess.run(cmd, env=aft_env(args), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {args.timeout} s"
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, (p.stderr.strip() or f"exit status {p.returncode}")
    return json.loads(lines[-1]), None


def compare_outputs(args, out, label, d, ya_name, ref32_name):
    """max |aft - torch f32| and |aft - torch f64| relative to max |y64|;
    the note printed and its fields returned (ok among them)."""
    import numpy as np
    ya = np.load(os.path.join(d, ya_name)).astype(np.float64)
    y32 = np.load(os.path.join(d, ref32_name)).astype(np.float64)
    y64 = np.load(os.path.join(d, "y_torch64.npy"))
    if ya.shape != y32.shape:
        out.note(f"check {label}: shape {ya.shape} vs torch {y32.shape}",
                 type="check", case=label, ok=False, error="shape")
        return {"ok": False}
    scale = float(np.max(np.abs(y64)))
    r = {"max_abs_aft_torch32": float(np.max(np.abs(ya - y32))),
         "max_abs_aft_torch64": float(np.max(np.abs(ya - y64))),
         "max_abs_torch32_torch64": float(np.max(np.abs(y32 - y64))), "max_abs_y": scale}
    r["rel_aft_torch32"] = r["max_abs_aft_torch32"] / scale if scale > 0 else float("inf")
    r["ok"] = bool(np.all(np.isfinite(ya))) and r["rel_aft_torch32"] <= args.check_tol
    return r


def stream_check(args, out, tmp):
    """The torch loop over --check-len tokens against `aft run` on the same
    weights; True when they agree."""
    d = os.path.join(tmp, "check-stream")
    os.makedirs(d, exist_ok=True)
    T = args.check_len
    spec = {"task": "stream_check", "T": T, "d_model": args.d_model, "window": args.window,
            "seed": args.seed, "dir": d}
    r, err = run_worker(args, spec, args.torch_coretype)
    if r is None:
        out.note(f"check stream T={T}: torch failed: {err}", type="check", case="stream",
                 ok=False, error="torch: " + err)
        return False
    argv = aft_argv(args, ["--weights", "weights.safetensors"]
                    + aft_variant_args("labml-local", args.window) + ["--layout", "tbd"],
                    ["x.npy", "-o", "y_aft.npy"])
    tj, err = run_aft(args, argv, d)
    if tj is None:
        out.note(f"check stream T={T}: aft failed: {err}", type="check", case="stream",
                 ok=False, error="aft: " + err)
        return False
    c = compare_outputs(args, out, "stream", d, "y_aft.npy", "y_loop.npy")
    if "max_abs_y" not in c:
        return False
    cmd = "aft run " + " ".join(argv)
    out.note(f"check stream T={T}: the torch per-token loop against aft, the first {T} tokens:\n"
             f"      max|aft - loop f32| = {c['max_abs_aft_torch32']:.3g} "
             f"({c['rel_aft_torch32']:.3g} of max|y| {c['max_abs_y']:.3g}), "
             f"max|aft - labml f64| = {c['max_abs_aft_torch64']:.3g}, "
             f"max|loop f32 - labml f64| = {c['max_abs_torch32_torch64']:.3g} "
             f"{'ok' if c['ok'] else 'MISMATCH'}\n      `{cmd}`",
             type="check", case="stream", T=T, aft_command=cmd, tensors=r["tensors"], **c)
    return c["ok"]


def stream_aft_argv(args, T):
    return ["--stream", "--causal", "--variant", "local", "--window", str(args.window),
            "--seq-len", str(T), "--d-model", str(args.d_model), "--threads", str(args.threads),
            "--repeat", str(args.repeat), "--json", "--no-ceiling"]


def stream_round(args, T, row):
    """One torch decode and one `aft bench --stream`, merged into row (the
    fastest of each so far)."""
    if "torch_error" not in row:
        spec = {"task": "stream_bench", "T": T, "d_model": args.d_model, "window": args.window,
                "seed": args.seed, "warmup": args.warmup, "repeat": args.repeat}
        r, err = run_worker(args, spec, args.torch_coretype)
        if r is None:
            row["torch_error"] = err
        elif "torch_us" not in row or r["us_per_token"] < row["torch_us"]:
            row.update(torch_us=r["us_per_token"], torch_us_first=r["us_first"],
                       torch_us_last=r["us_last"], torch_edge=r["edge"])
    if "aft_error" not in row:
        j, err = run_aft_bench(args, stream_aft_argv(args, T))
        if j is None:
            row["aft_error"] = err
        elif "aft_us" not in row or j["stream_us_per_token"] < row["aft_us"]:
            row.update(aft_us=j["stream_us_per_token"], aft_us_one_shot=j["one_shot_us_per_token"],
                       aft_us_floor=j["floor_us_per_token"])


def stream_mode(args, out, tmp):
    """--stream: the check, then per-token decoding, torch's loop against
    aft bench --stream; True when all went well."""
    ok = args.no_check or stream_check(args, out, tmp)
    if args.check_only:
        return ok
    if not out.json:
        print(f"\n--stream: d_model {args.d_model}, causal local, window {args.window}, batch 1, "
              f"float32, {args.threads} thread(s); {args.rounds} rounds, torch and aft taking "
              f"turns, best round of each\n"
              f"  torch: the KV-cache loop (stream_decode), fastest of {args.repeat} decode(s) "
              f"after {args.warmup} untimed of 64 tokens; us a token = the decode's time / tokens\n"
              f"  aft:   stream_us_per_token of `aft bench "
              f"{' '.join(stream_aft_argv(args, 'T'))}` (seeded weights, the state in memory)")
    for T in args.seq_len:
        row = {"type": "stream", "T": T, "aft_command": "aft bench " + " ".join(stream_aft_argv(args, T))}
        for _ in range(args.rounds):
            stream_round(args, T, row)
        if "torch_us" in row and "aft_us" in row:
            row["speedup"] = row["torch_us"] / row["aft_us"]
        if out.json:
            print(json.dumps(row), flush=True)
        elif "speedup" in row:
            print(f"  T = {T} tokens decoded: torch {row['torch_us']:.1f} us a token "
                  f"(first {row['torch_edge']}: {row['torch_us_first']:.1f}, last "
                  f"{row['torch_edge']}: {row['torch_us_last']:.1f}), aft {row['aft_us']:.2f} us "
                  f"a token (one-shot run {row['aft_us_one_shot']:.2f}, floor "
                  f"{row['aft_us_floor']:.2f}); aft is {row['speedup']:.1f}x torch (target >= 10x)",
                  flush=True)
        else:
            print(f"  T = {T}: torch: {row.get('torch_error', 'ok')}; aft: "
                  f"{row.get('aft_error', 'ok')}", flush=True)
        ok &= "speedup" in row
    return ok


def grid_flops(args):
    """(operator FLOPs, projection FLOPs, bytes of x, y and the weights):
    2 x (2S-1)^2 multiply-adds a token and channel (numerator and
    denominator), 2 B T d (3 hidden + heads) for to_q, to_v, project and a
    to_k of one channel per head."""
    T = args.grid[0] * args.grid[1]
    k2 = (2 * args.window - 1) ** 2
    op = 2.0 * 2 * k2 * args.batch * T * args.d_hidden
    proj = 2.0 * args.batch * T * args.d_model * (3 * args.d_hidden + args.heads)
    weights = 4.0 * (args.d_model * (3 * args.d_hidden + args.heads) + 3 * args.d_hidden
                     + args.heads + args.d_model + args.heads * k2)
    return op, proj, 2 * 4.0 * args.batch * T * args.d_model + weights


def grid_aft_argv(args):
    H, W = args.grid
    return aft_argv(args, ["--variant", "conv", "--grid", f"{H},{W}", "--weights",
                           "weights.safetensors", "--repeat", str(args.repeat)],
                    ["x.npy", "-o", "y_aft.npy"])


def grid_check(args, out, d):
    """aft on the module's weights and x against the module; True when they agree."""
    argv = grid_aft_argv(args)
    tj, err = run_aft(args, argv, d)
    if tj is None:
        out.note(f"check grid: aft failed: {err}", type="check", case="grid", ok=False,
                 error="aft: " + err)
        return False
    c = compare_outputs(args, out, "grid", d, "y_aft.npy", "y_torch32.npy")
    if "max_abs_y" not in c:
        return False
    cmd = "aft run " + " ".join(argv)
    out.note(f"check grid {args.batch}x{args.grid[0]}x{args.grid[1]}x{args.d_model}: "
             f"max|aft - torch f32| = {c['max_abs_aft_torch32']:.3g} "
             f"({c['rel_aft_torch32']:.3g} of max|y| {c['max_abs_y']:.3g}), "
             f"max|aft - torch f64| = {c['max_abs_aft_torch64']:.3g} (torch f32 vs f64: "
             f"{c['max_abs_torch32_torch64']:.3g}) {'ok' if c['ok'] else 'MISMATCH'}\n"
             f"      `{cmd}`", type="check", case="grid", aft_command=cmd, **c)
    return c["ok"]


def grid_round(args, d, row):
    """One torch measurement and one aft run, merged into row."""
    if "torch_error" not in row:
        spec = dict(grid_spec(args), task="grid_bench", warmup=args.warmup, repeat=args.repeat)
        r, err = run_worker(args, spec, args.torch_coretype)
        if r is None:
            row["torch_error"] = err
        else:
            row["torch_ms"] = min(row.get("torch_ms", r["ms_min"]), r["ms_min"])
            row["proj_gflops"] = max(row.get("proj_gflops", 0.0), r["proj_gflops"])
            row["copy_gbs"] = max(row.get("copy_gbs", 0.0), r["copy_gbs"])
            row["torch_peak_rss"] = max(row.get("torch_peak_rss", 0), r["rss_peak"])
    if "aft_error" not in row:
        tj, err = run_aft(args, grid_aft_argv(args), d)
        if tj is None:
            row["aft_error"] = err
        elif tj["compute_min_ms"] < row.get("aft_ms", float("inf")):
            row.update(aft_ms=tj["compute_min_ms"],
                       aft_phases_ms={k: tj[k + "_ms"] for k in ("projections", "operator", "output")
                                      if k + "_ms" in tj},
                       aft_peak_rss=tj.get("peak_rss_bytes"))


def grid_spec(args):
    return {"d_model": args.d_model, "d_hidden": args.d_hidden, "heads": args.heads,
            "window": args.window, "B": args.batch, "H": args.grid[0], "W": args.grid[1],
            "seed": args.seed}


def grid_floor(args, row, mm_gflops):
    """The floor: every FLOP at the measured matrix-product rate (the faster
    of the projection's own product and the 2048^3 torch.mm of the
    environment check), every byte of x, y and the weights once at the
    measured copy rate; the larger of the two times."""
    op, proj, nbytes = grid_flops(args)
    row.update(op_gflop=op / 1e9, proj_gflop=proj / 1e9, min_bytes=nbytes,
               mm_gflops=mm_gflops)
    if row.get("proj_gflops"):
        row["floor_gflops"] = max(row["proj_gflops"], mm_gflops)
        row["flops_ms"] = (op + proj) / (row["floor_gflops"] * 1e9) * 1e3
        row["bytes_ms"] = nbytes / (row["copy_gbs"] * 1e9) * 1e3
        row["floor_ms"] = max(row["flops_ms"], row["bytes_ms"])
        if "torch_ms" in row:
            row["best_speedup_at_floor"] = row["torch_ms"] / row["floor_ms"]
        if "aft_ms" in row:
            row["aft_over_floor"] = row["aft_ms"] / row["floor_ms"]


def grid_mode(args, out, tmp, mm_gflops):
    """--grid: PaperAFTConv2d against aft run --variant conv --grid."""
    d = os.path.join(tmp, "grid")
    os.makedirs(d, exist_ok=True)
    ok = True
    r, err = run_worker(args, dict(grid_spec(args), task="grid_prepare", dir=d,
                                   check=not args.no_check), args.torch_coretype)
    if r is None:
        out.note(f"grid: torch failed: {err}", type="check", case="grid", ok=False,
                 error="torch: " + err)
        return False
    if not args.no_check:
        ok = grid_check(args, out, d)
    if args.check_only:
        return ok
    B, (H, W) = args.batch, args.grid
    cmd = "aft run " + " ".join(grid_aft_argv(args))
    if not out.json:
        print(f"\n--grid: PaperAFTConv2d(dim={args.d_model}, hidden={args.d_hidden}, "
              f"heads={args.heads}, S={args.window}) on x [{B}, {H}, {W}, {args.d_model}], "
              f"float32, {args.threads} thread(s); {args.rounds} rounds, torch and aft taking "
              f"turns, best round of each\n  torch: fastest of {args.repeat} after "
              f"{args.warmup} warm-up; aft: compute_min of `{cmd}`")
    row = {"type": "grid", "B": B, "H": H, "W": W, "aft_command": cmd}
    for _ in range(args.rounds):
        grid_round(args, d, row)
    if "torch_ms" in row and "aft_ms" in row:
        row["speedup"] = row["torch_ms"] / row["aft_ms"]
    grid_floor(args, row, mm_gflops)
    if out.json:
        print(json.dumps(row), flush=True)
    elif "speedup" in row:
        ph = row.get("aft_phases_ms") or {}
        print(f"  torch {row['torch_ms']:.1f} ms, aft {row['aft_ms']:.1f} ms (projections "
              f"{ph.get('projections', 0):.1f}, operator {ph.get('operator', 0):.1f}, output "
              f"{ph.get('output', 0):.1f}); aft is {row['speedup']:.2f}x torch (target >= 2x)\n"
              f"  floor: operator {row['op_gflop']:.2f} GFLOP (2 x {2 * args.window - 1}^2 "
              f"multiply-adds a token and channel) + projections {row['proj_gflop']:.2f} GFLOP "
              f"(2 B T d (3 d + heads)) at {row['floor_gflops']:.1f} GFLOP/s, the faster of "
              f"torch's Linear {args.d_model} -> {args.d_hidden} on all {B * H * W} tokens "
              f"({row['proj_gflops']:.1f}) and the {args.matmul_n}^3 torch.mm above "
              f"({mm_gflops:.1f}) = "
              f"{row['flops_ms']:.1f} ms; x, y and the weights read or written once: "
              f"{row['min_bytes'] / MIB:.0f} MiB at {row['copy_gbs']:.1f} GB/s (a 256 MiB copy) "
              f"= {row['bytes_ms']:.1f} ms; floor {row['floor_ms']:.1f} ms, the larger\n"
              f"  aft takes {row['aft_over_floor']:.2f}x the floor; torch / floor = "
              f"{row['best_speedup_at_floor']:.2f}x, the most any implementation at the floor "
              f"could be ahead of torch", flush=True)
    else:
        print(f"  torch: {row.get('torch_error', 'ok')}; aft: {row.get('aft_error', 'ok')}",
              flush=True)
    return ok and "speedup" in row


# ---- --grad (parent side)

GRAD_SPEEDUP_TARGET = {"labml-local": 10.0, "rish-full": 1.5, "rish-simple": 2.0}
GRAD_RATIO_TARGET = 3.0            # aft grad's backward_over_forward, each case
GRAD_MEMORY_TARGET = 1.5e9         # bytes: aft grad, causal local, at --grad-memory-len


def grad_aft_argv(args, case, repeat):
    """`aft grad` on the files a grad_prepare worker wrote: the module's state
    dict, x and dy, in the module's layout."""
    opts = ["--weights", "weights.safetensors"] + aft_variant_args(case, args.window)
    if case == "labml-local":
        opts += ["--layout", "tbd"]
    return aft_argv(args, opts + ["--repeat", str(repeat)],
                    ["x.npy", "--grad-output", "dy.npy", "-o", "g.safetensors"])


def grad_spec(args, case, T, d, check):
    return {"task": "grad_prepare", "case": case, "T": T, "d_model": args.d_model,
            "d_hidden": args.d_hidden if case != "labml-local" else args.d_model,
            "window": args.window, "seed": args.seed, "dir": d, "check": check}


def compare_grads(args, d):
    """Every gradient aft wrote (g.safetensors) against torch.autograd's in
    float64 (g64.npz): (per-tensor results, problems)."""
    import numpy as np
    ga = read_safetensors(os.path.join(d, "g.safetensors"))
    g64 = np.load(os.path.join(d, "g64.npz"))
    g32 = np.load(os.path.join(d, "g32.npz"))
    per, bad = [], []
    for name, a in ga.items():
        if name not in g64.files:
            bad.append(f"{name}: torch.autograd has no such gradient")
            continue
        ref = g64[name]
        if a.shape != ref.shape:
            bad.append(f"{name}: shape {list(a.shape)}, torch {list(ref.shape)}")
            continue
        a = a.astype(np.float64)
        scale = max(1.0, float(np.max(np.abs(ref))))
        err = float(np.max(np.abs(a - ref)))
        r = {"name": name, "shape": list(a.shape), "max_abs_aft_torch64": err,
             "max_abs_torch32_torch64": float(np.max(np.abs(g32[name].astype(np.float64) - ref))),
             "scale": scale, "rel": err / scale}
        r["ok"] = bool(np.all(np.isfinite(a))) and err <= args.check_tol * scale
        if not r["ok"]:
            bad.append(f"{name}: max|aft - torch f64| = {err:.3g}, {r['rel']:.3g} of "
                       f"max(1, max|g64|) = {scale:.3g}")
        per.append(r)
    bad += [f"{k}: torch.autograd has it, aft wrote none" for k in g64.files if k not in ga]
    return per, bad


def grad_check(args, out, tmp, case):
    """aft grad against torch.autograd in float64 at --check-len on the same
    weights, x and dy; True when every gradient agrees."""
    T = args.check_len
    d = os.path.join(tmp, f"grad-check-{case}")
    os.makedirs(d, exist_ok=True)
    r, err = run_worker(args, grad_spec(args, case, T, d, True), args.torch_coretype)
    if r is None:
        out.note(f"check grad {case:<12} T={T}: torch failed: {err}", type="grad_check",
                 case=case, T=T, ok=False, error="torch: " + err)
        return False
    argv = grad_aft_argv(args, case, 1)
    cmd = "aft grad " + " ".join(argv)
    tj, err = run_aft(args, argv, d, "grad")
    if tj is None:
        out.note(f"check grad {case:<12} T={T}: aft failed: {err}", type="grad_check",
                 case=case, T=T, ok=False, error="aft: " + err)
        return False
    per, bad = compare_grads(args, d)
    ok = not bad and bool(per)
    worst = max(per, key=lambda p: p["rel"]) if per else None
    t32 = max((p["max_abs_torch32_torch64"] / p["scale"] for p in per), default=float("nan"))
    text = (f"check grad {case:<12} T={T}: {len(per)} gradients ({', '.join(p['name'] for p in per)})"
            f"\n      worst max|aft - torch f64| / max(1, max|g64|) = "
            + (f"{worst['rel']:.3g} ({worst['name']})" if worst else "-")
            + f"; torch f32 vs f64: {t32:.3g}; tolerance {args.check_tol:g} "
            + ("ok" if ok else "MISMATCH: not timed") + f"\n      `{cmd}`")
    text += "".join(f"\n      {b}" for b in bad)
    out.note(text, type="grad_check", case=case, T=T, ok=ok, aft_command=cmd,
             gradients=per, problems=bad, tensors=r["tensors"])
    return ok


def grad_round(args, case, T, d, row):
    """One torch worker and one `aft grad` on the files in d, merged into row:
    each side keeps its round with the lowest median (and the largest peak)."""
    if "torch_skipped" not in row and "torch_error" not in row:
        spec = dict(grad_spec(args, case, T, d, False), task="grad_bench",
                    warmup=args.warmup, repeat=args.repeat)
        r, err = run_worker(args, spec, args.torch_coretype)
        if r is None:
            row["torch_error"] = err
        else:
            row.setdefault("torch_round_medians_ms", []).append(r["ms_grad"])
            if r["ms_grad"] < row.get("torch_ms", float("inf")):
                row.update(torch_ms=r["ms_grad"], torch_ms_all=r["ms_grad_all"],
                           torch_graph_forward_ms=r["ms_grad_fwd"],
                           torch_backward_call_ms=r["ms_grad_bwd"],
                           torch_forward_ms=r["ms_forward"],
                           torch_ratio=r["ms_grad"] / r["ms_forward"])
            row["torch_peak_rss"] = max(row.get("torch_peak_rss", 0), r["rss_peak"])
            row["torch_rss_after_import"] = r["rss_after_import"]
    if "aft_error" not in row:
        tj, err = run_aft(args, grad_aft_argv(args, case, args.repeat), d, "grad")
        if tj is None:
            row["aft_error"] = err
        else:
            row.setdefault("aft_round_medians_ms", []).append(tj["backward_ms"])
            if tj["backward_ms"] < row.get("aft_ms", float("inf")):
                row.update(aft_ms=tj["backward_ms"], aft_ms_min=tj["compute_min_ms"],
                           aft_forward_ms=tj["forward_ms"], aft_ratio=tj["backward_over_forward"])
            row["aft_peak_rss"] = max(row.get("aft_peak_rss", 0), tj.get("peak_rss_bytes") or 0)


def grad_row(args, case, T, tmp, checked):
    """The torch and aft rows of case at T (a dict), after the files are
    written; refused when the check disagreed."""
    row = {"type": "grad", "case": case, "T": T,
           "aft_command": "aft grad " + " ".join(grad_aft_argv(args, case, args.repeat))}
    if checked.get(case) is False:
        row["refused"] = f"not timed: the gradients disagree with torch.autograd at T={args.check_len}"
        return row
    if case in QUADRATIC and T > args.skip_torch_above:
        row["refused"] = (f"skipped: the module's T x T bias ({4.0 * T * T / GIB:.3g} GiB) above "
                          f"--skip-torch-above {args.skip_torch_above}")
        return row
    avail = mem_available()
    if case in QUADRATIC and avail is not None and \
            3 * torch_peak_estimate(case, T, args.d_model) > 0.8 * avail:
        row["torch_skipped"] = f"torch skipped ({avail / GIB:.3g} GiB available)"
    d = os.path.join(tmp, f"grad-T{T}-{case}")
    os.makedirs(d, exist_ok=True)
    r, err = run_worker(args, grad_spec(args, case, T, d, False), args.torch_coretype)
    if r is None:
        row["refused"] = "writing the weights, x and dy failed: " + err
        return row
    # torch and aft take turns, --rounds times; each keeps its round with the
    # lowest median, so a slow moment of the shared machine counts against neither
    for _ in range(args.rounds):
        grad_round(args, case, T, d, row)
    shutil.rmtree(d, ignore_errors=True)
    if "torch_ms" in row and "aft_ms" in row and row["aft_ms"] > 0:
        row["speedup"] = row["torch_ms"] / row["aft_ms"]
        row["speedup_target"] = GRAD_SPEEDUP_TARGET[case]
        row["speedup_pass"] = row["speedup"] >= row["speedup_target"]
    if "aft_ratio" in row:
        row["ratio_target"] = GRAD_RATIO_TARGET
        row["ratio_pass"] = row["aft_ratio"] <= GRAD_RATIO_TARGET
        row["flop_ratio"] = grad_flop_ratio(args, case, T)
    return row


def fmt_grad_row(r):
    if "refused" in r:
        return f"{r['case']:<12} {r['T']:>6}  {r['refused']}"
    if "torch_ms" in r:
        t = (f"{r['torch_ms']:>12.1f} {r['torch_forward_ms']:>7.1f} "
             f"{r['torch_backward_call_ms']:>8.1f} {r['torch_ratio']:>5.2f}x")
        trss = f"{r['torch_peak_rss'] / MIB:.0f}"
    else:
        t = f"{r.get('torch_skipped') or 'torch: ' + r.get('torch_error', '?'):>35}"
        trss = "-"
    if "aft_ms" in r:
        a = f"{r['aft_ms']:>11.1f} {r['aft_forward_ms']:>7.1f} {r['aft_ratio']:>5.2f}x"
        arss = f"{r['aft_peak_rss'] / MIB:.0f}"
    else:
        a, arss = f"{'aft: ' + r.get('aft_error', '?'):>25}", "-"
    sp = f"{r['speedup']:.1f}x" if "speedup" in r else "-"
    return f"{r['case']:<12} {r['T']:>6} {t} {a} {sp:>9}  {trss:>6} / {arss} MiB"


def grad_memory(args, out, tmp):
    """`aft grad` of causal local at --grad-memory-len (seeded weights: the
    dense T x T bias of a weights file would not fit), one call; its row."""
    import numpy as np
    T, D = args.grad_memory_len, args.d_model
    d = os.path.join(tmp, "grad-memory")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for name in ("x.npy", "dy.npy"):
        np.save(os.path.join(d, name), rng.standard_normal((T, 1, D), dtype=np.float32))
    argv = aft_argv(args, aft_variant_args("labml-local", args.window)
                    + ["--layout", "tbd", "--seed", str(args.seed), "--repeat", "1"],
                    ["x.npy", "--grad-output", "dy.npy", "-o", "g.safetensors"])
    row = {"type": "grad_memory", "case": "labml-local", "T": T,
           "aft_command": "aft grad " + " ".join(argv), "target_bytes": GRAD_MEMORY_TARGET}
    t0 = time.perf_counter()
    tj, err = run_aft(args, argv, d, "grad")
    row["wall_s"] = time.perf_counter() - t0
    shutil.rmtree(d, ignore_errors=True)
    if tj is None:
        row["aft_error"] = err
    else:
        row.update(aft_peak_rss=tj.get("peak_rss_bytes"), aft_ms=tj["backward_ms"],
                   aft_forward_ms=tj["forward_ms"],
                   aft_ratio=tj["backward_over_forward"])
        row["pass"] = row["aft_peak_rss"] is not None and row["aft_peak_rss"] < GRAD_MEMORY_TARGET
    return row


def pass_miss(ok):
    return "pass" if ok else "MISS"


def print_grad_targets(args, rows, mem):
    print(f"\ntargets (d_model {args.d_model}, window {args.window}, {args.threads} thread(s); "
          f"speed-up = torch forward+backward median / aft backward_ms median):")
    for r in rows:
        if "speedup" in r:
            print(f"  {r['case']:<12} T={r['T']:<6} aft grad >= {r['speedup_target']:g}x torch "
                  f"forward+backward: {r['speedup']:6.2f}x  {pass_miss(r['speedup_pass'])}")
        if "ratio_pass" in r:
            print(f"  {r['case']:<12} T={r['T']:<6} aft grad's backward_over_forward <= "
                  f"{GRAD_RATIO_TARGET:g}x: {r['aft_ratio']:6.2f}x  {pass_miss(r['ratio_pass'])}  "
                  f"(the FLOPs' own ratio {r['flop_ratio']:.2f}x; aft's is {r['aft_ratio'] / r['flop_ratio']:.2f} "
                  f"times it)")
        if "speedup" not in r and "ratio_pass" not in r:
            print(f"  {r['case']:<12} T={r['T']:<6} not measured")
    if mem is None:
        return
    head = f"  memory: `{mem['aft_command']}` (seeded weights), T={mem['T']}:"
    if "aft_error" in mem:
        print(f"{head} aft failed: {mem['aft_error']}")
    else:
        print(f"{head}\n    peak_rss_bytes {mem['aft_peak_rss']} ({mem['aft_peak_rss'] / MIB:.0f} MiB "
              f"= {mem['aft_peak_rss'] / 1e9:.2f} GB) < {GRAD_MEMORY_TARGET / 1e9:g} GB  "
              f"{pass_miss(mem['pass'])}  (gradient call {mem['aft_ms']:.0f} ms, forward alone "
              f"{mem['aft_forward_ms']:.0f} ms, backward_over_forward {mem['aft_ratio']:.2f}x; "
              f"{mem['wall_s']:.1f} s in all)")


def grad_mode(args, out, tmp):
    """--grad: the gradient check, then forward + backward, torch.autograd
    against aft grad, then aft grad's memory at --grad-memory-len; True when
    all went well (targets missed do not change it)."""
    ok, checked = True, {}
    if not args.no_check:
        for case in args.cases:
            checked[case] = grad_check(args, out, tmp, case)
            ok &= checked[case]
    if args.check_only:
        return ok
    if not out.json:
        print(f"\n--grad: forward + backward of the layer, d_model {args.d_model}, d_hidden "
              f"{args.d_hidden}, window {args.window}, batch 1, float32, {args.threads} thread(s); "
              f"{args.rounds} rounds, torch and aft taking turns, each side keeps its round with "
              f"the lowest median\n"
              f"  torch: median of {args.repeat} calls of y = module(x); y.backward(dy) (x and "
              f"every parameter requiring grad, the grads set to None between calls) after "
              f"{args.warmup} warm-up; fwd: the forward alone, median of {args.repeat} under "
              f"torch.no_grad(); bwd(): the y.backward(dy) call alone\n"
              f"  aft:   backward_ms (median of --repeat {args.repeat} gradient calls, each "
              f"running its own forward) and forward_ms (median of {args.repeat} forward "
              f"passes alone, one after each gradient call; the ratio is the median of the "
              f"pairs') from --timing of")
        for case in args.cases:
            print(f"    {case:<12} aft grad " + " ".join(grad_aft_argv(args, case, args.repeat)))
        print("  on the same files: weights.safetensors (the module's state dict), x.npy "
              "(the module's x) and dy.npy, standard normal, in the module's layout\n"
              "  ratio = forward+backward / forward alone (aft's backward_over_forward); "
              "speed-up = torch f+b / aft grad; times in ms, medians")
        hdr = (f"{'case':<12} {'T':>6} {'torch f+b':>12} {'fwd':>7} {'bwd()':>8} {'ratio':>6} "
               f"{'aft grad':>11} {'fwd':>7} {'ratio':>6} {'speed-up':>9}  peak RSS torch / aft")
        print(hdr)
        print("-" * len(hdr))
    rows = []
    for T in args.seq_len:
        for case in args.cases:
            row = grad_row(args, case, T, tmp, checked)
            rows.append(row)
            ok &= "speedup" in row
            print(json.dumps(row) if out.json else fmt_grad_row(row), flush=True)
    mem = grad_memory(args, out, tmp) if args.grad_memory_len else None
    if mem is not None:
        ok &= "aft_error" not in mem
        if out.json:
            print(json.dumps(mem), flush=True)
    if not out.json:
        print_grad_targets(args, rows, mem)


def generate_aft_argv(args, T):
    return ["generate", "--weights", MODEL_CKPT, "--prompt", args.prompt, "-n", str(T), "--greedy",
            "--threads", str(args.threads), "--timing", "timing.json"]


def run_aft_generate(args, T, cwd):
    """`aft generate --greedy --timing` in a fresh process; (text, timing dict, error str)."""
    cmd = [args.aft] + generate_aft_argv(args, T)
    try:
        p = subprocess.run(cmd, cwd=cwd, env=aft_env(args), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return None, None, f"timed out after {args.timeout} s"
    if p.returncode != 0:
        return None, None, (p.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1]
    with open(os.path.join(cwd, "timing.json")) as f:
        tj = json.load(f)
    return p.stdout.decode(), tj, None


def generate_round(args, T, d, row):
    """One torch worker (labml's loop and the stepper) and one aft generate,
    merged into row (the fastest of each so far); the texts checked."""
    if "torch_error" not in row:
        spec = {"task": "generate", "T": T, "prompt": args.prompt, "warmup": args.warmup,
                "repeat": args.repeat}
        r, err = run_worker(args, spec, args.torch_coretype)
        if r is None:
            row["torch_error"] = err
        else:
            for name in ("labml", "stepper"):
                row[name + "_s"] = min(row.get(name + "_s", float("inf")), r[name]["s"])
                row.setdefault("texts", {})[name] = args.prompt + r[name]["text"]
    if "aft_error" not in row:
        text, tj, err = run_aft_generate(args, T, d)
        if text is None:
            row["aft_error"] = err
        else:
            row.setdefault("texts", {})["aft"] = text
            if tj["tokens_per_s"] > row.get("aft_tokens_per_s", 0.0):
                row.update(aft_tokens_per_s=tj["tokens_per_s"], aft_ttft_ms=tj["time_to_first_token_ms"],
                           aft_ms=tj["generate_ms"])
    texts = row.get("texts", {})
    if len(texts) == 3 and len(set(texts.values())) != 1:
        row["mismatch"] = True


def generate_mode(args, out, tmp):
    """--generate: the shipped model generating text greedily, labml's loop
    and a PyTorch stepper against aft generate; True when all went well and
    the texts agree."""
    d = os.path.join(tmp, "generate")
    os.makedirs(d, exist_ok=True)
    ok = True
    if not out.json:
        print(f"\n--generate: {os.path.relpath(MODEL_CKPT, ROOT)} (labml's AutoregressiveTransformer, six "
              f"layers of AFTLocal, d_model 128, window 32, context 256), greedy from {args.prompt!r}, "
              f"{args.threads} thread(s); {args.rounds} rounds, torch and aft taking turns, best round "
              f"of each\n"
              f"  labml:   its sampling loop (LabmlSampler): the whole context through the model for "
              f"every character\n"
              f"  stepper: the same model decoded a token at a time in PyTorch (TorchStepper), a cache "
              f"of each layer's keys and values\n"
              f"  torch: fastest of {args.repeat} run(s) after {args.warmup} untimed of 16 characters; "
              f"aft: `aft {shlex.join(generate_aft_argv(args, 'T'))}`, a fresh process each round, "
              f"tokens_per_s of its --timing (new characters over the time from the prompt to the last)")
    for T in args.seq_len:
        row = {"type": "generate", "T": T, "prompt": args.prompt,
               "aft_command": "aft " + shlex.join(generate_aft_argv(args, T))}
        for _ in range(args.rounds):
            generate_round(args, T, d, row)
        texts = row.pop("texts", {})
        row["texts_agree"] = len(texts) == 3 and len(set(texts.values())) == 1 and not row.pop("mismatch", False)
        if "labml_s" in row:
            row["labml_tokens_per_s"] = T / row["labml_s"]
            row["stepper_tokens_per_s"] = T / row["stepper_s"]
        if "labml_s" in row and "aft_tokens_per_s" in row:
            row["aft_over_labml"] = row["aft_tokens_per_s"] / row["labml_tokens_per_s"]
            row["aft_over_stepper"] = row["aft_tokens_per_s"] / row["stepper_tokens_per_s"]
        j, err = run_aft_bench(args, ["--generate", "--weights", MODEL_CKPT, "--seq-len", str(T), "--threads",
                                      str(args.threads), "--repeat", "5", "--json"])
        if j is not None:
            row.update(bench_tokens_per_s=j["tokens_per_s"], bench_ttft_ms=j["time_to_first_token_ms"])
            if "labml_tokens_per_s" in row:
                row["bench_over_labml"] = row["bench_tokens_per_s"] / row["labml_tokens_per_s"]
        if out.json:
            print(json.dumps(row), flush=True)
        elif "aft_over_labml" in row:
            agree = "equal" if row["texts_agree"] else "DIFFERENT"
            print(f"  T = {T} characters: greedy texts of labml's loop, the stepper and aft: {agree}\n"
                  f"    labml's loop  {row['labml_tokens_per_s']:9.0f} characters/s ({row['labml_s']:.3f} s)\n"
                  f"    torch stepper {row['stepper_tokens_per_s']:9.0f} characters/s ({row['stepper_s']:.3f} s)\n"
                  f"    aft generate  {row['aft_tokens_per_s']:9.0f} characters/s ({row['aft_ms']:.1f} ms, first "
                  f"{row['aft_ttft_ms']:.2f} ms) (target >= 5000)\n"
                  + (f"    aft bench --generate {row['bench_tokens_per_s']:9.0f} characters/s (warm as torch is: "
                     f"after an untimed run, median of 5; first {row['bench_ttft_ms']:.2f} ms)\n"
                     if "bench_tokens_per_s" in row else "")
                  + f"    aft generate is {row['aft_over_labml']:.1f}x labml's loop (target >= 50x) and "
                  f"{row['aft_over_stepper']:.1f}x the torch stepper"
                  + (f"; warm, {row['bench_over_labml']:.1f}x labml's loop" if "bench_over_labml" in row else ""),
                  flush=True)
        else:
            print(f"  T = {T}: torch: {row.get('torch_error', 'ok')}; aft: {row.get('aft_error', 'ok')}",
                  flush=True)
        ok &= "aft_over_labml" in row and row["texts_agree"]
    return ok


# ---- --bf16 (parent side)

# (label, torch case, batch, T, d_model): the cases at --seq-len, and labml's own shape
LABML_SHAPE = ("labml-shape", "labml-local", 32, 256, 128)
# issue 46's targets: aft bf16 over aft f32, and over the PyTorch module under autocast
BF16_OVER_F32 = {"rish-full": 2.0, "labml-shape": 2.0}
BF16_OVER_AUTOCAST = {"labml-local": 10.0, "rish-full": 1.5, "rish-simple": 2.0}


def bf16_floors(args):
    """(sgemm ceiling, bf16 floor, bf16 engine) as `aft bench --precision
    bf16` measures them (a tiny configuration: the figures are the header's)."""
    r, err = run_aft_bench(args, ["--variant", "simple", "--seq-len", "64", "--d-model", "32", "--repeat", "1",
                                  "--threads", str(args.threads), "--precision", "bf16", "--json"])
    if r is None:
        sys.exit(f"bench_torch: aft bench failed: {err}")
    return r.get("sgemm_ceiling_gflop_per_s", 0.0), r.get("bf16_floor_gflop_per_s", 0.0), r.get("bf16_engine")


def bf16_round(args, label, case, B, T, dm, d, row):
    """One round of the four: torch float32, torch autocast, aft f32, aft
    bf16; each keeps its fastest round in row."""
    def keep_min(key, val):
        row[key] = val if key not in row else min(row[key], val)

    for key, autocast in (("torch_ms", False), ("torch_bf16_ms", True)):
        if key + "_error" in row:
            continue
        spec = {"task": "bench", "case": case, "T": T, "d_model": dm, "d_hidden": dm, "window": args.window,
                "seed": args.seed, "warmup": args.warmup, "repeat": args.repeat, "batch": B, "autocast": autocast}
        r, err = run_worker(args, spec, args.torch_coretype)
        if r is None:
            row[key + "_error"] = err
        else:
            keep_min(key, r["ms_min"])
    for key, prec in (("aft_ms", "f32"), ("aft_bf16_ms", "bf16")):
        if key + "_error" in row:
            continue
        argv = aft_argv(args, aft_variant_args(case, args.window) + [
            "--seed", str(args.seed), "--repeat", str(args.repeat), "--precision", prec],
            ["x.npy", "-o", f"y_{label}_{prec}.npy"])
        row.setdefault("aft_commands", {})[prec] = "aft run " + " ".join(argv)
        tj, err = run_aft(args, argv, d)
        if tj is None:
            row[key + "_error"] = err
        else:
            keep_min(key, tj["compute_min_ms"])


def fmt_bf16_row(r):
    def ms(key):
        return f"{r[key]:.2f}" if key in r else "failed"

    def ratio(a, b, target):
        if a not in r or b not in r or r[b] <= 0:
            return "-"
        x = r[a] / r[b]
        return f"{x:.2f}x" + ("" if target is None else (" pass" if x >= target else " MISS"))

    return (f"{r['label']:<12} {r['B']:>3} {r['T']:>5} {r['d']:>4} {ms('torch_ms'):>9} {ms('torch_bf16_ms'):>10} "
            f"{ms('aft_ms'):>8} {ms('aft_bf16_ms'):>8} {r.get('floor_ms', 0):>8.2f} {r.get('floor_bf16_ms', 0):>8.2f} "
            f"{ratio('aft_ms', 'aft_bf16_ms', BF16_OVER_F32.get(r['label'])):>12} "
            f"{ratio('torch_bf16_ms', 'aft_bf16_ms', BF16_OVER_AUTOCAST.get(r['label'])):>13} "
            f"{r.get('bf16_rel', float('nan')):>9.1e}")


def bf16_mode(args, out, tmp):
    """--bf16: the table, and whether every case ran and met its target."""
    import numpy as np
    ceiling, floor16, engine = bf16_floors(args)
    if not floor16:
        out.note(f"aft has no bf16 engine here ({engine}): --precision bf16 would compute float32",
                 type="error", bf16_engine=engine)
        return False
    out.note(f"floors: sgemm ceiling {ceiling:.1f} GFLOP/s, bf16 floor {floor16:.1f} GFLOP/s ({engine}), "
             f"as aft bench --precision bf16 measures them; {args.rounds} rounds, each side's fastest; "
             f"torch: best of {args.repeat} after {args.warmup} warm-up; aft: compute_min_ms of --repeat "
             f"{args.repeat}; {args.threads} threads",
             type="floor", sgemm_ceiling_gflop_per_s=ceiling, bf16_floor_gflop_per_s=floor16, bf16_engine=engine)
    shapes = [(case, case, 1, T, args.d_model) for T in args.seq_len for case in args.cases]
    if "labml-local" in args.cases:
        shapes.append(LABML_SHAPE)
    rng = np.random.default_rng(args.seed)
    rows, ok = [], True
    for label, case, B, T, dm in shapes:
        d = os.path.join(tmp, f"{label}_T{T}")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "x.npy"), rng.standard_normal((B, T, dm), dtype=np.float32))
        row = {"type": "bf16_row", "label": label, "case": case, "B": B, "T": T, "d": dm}
        for _ in range(args.rounds):
            bf16_round(args, label, case, B, T, dm, d, row)
        try:
            y32 = np.load(os.path.join(d, f"y_{label}_f32.npy")).astype(np.float64)
            y16 = np.load(os.path.join(d, f"y_{label}_bf16.npy")).astype(np.float64)
            row["bf16_rel"] = float(np.linalg.norm(y16 - y32) / np.linalg.norm(y32))
        except (OSError, ValueError):
            pass
        shutil.rmtree(d, ignore_errors=True)
        proj, op = layer_flops(argparse.Namespace(d_model=dm, d_hidden=dm, window=args.window), case, T)
        flops = B * (4 * proj + op)
        row["floor_ms"] = flops / (ceiling * 1e9) * 1e3 if ceiling else 0.0
        row["floor_bf16_ms"] = flops / (floor16 * 1e9) * 1e3
        for key, target, den in (("over_f32", BF16_OVER_F32.get(label), "aft_ms"),
                                 ("over_autocast", BF16_OVER_AUTOCAST.get(label), "torch_bf16_ms")):
            if den in row and "aft_bf16_ms" in row:
                row[key] = row[den] / row["aft_bf16_ms"]
                if target is not None and row[key] < target:
                    ok = False
        if any(k.endswith("_error") for k in row):
            ok = False
        rows.append(row)
        if not out.json:
            print(f"  measured {label} T={T}", file=sys.stderr, flush=True)
    if out.json:
        for row in rows:
            print(json.dumps(row), flush=True)
        return ok
    hdr = (f"{'case':<12} {'B':>3} {'T':>5} {'d':>4} {'torch ms':>9} {'autocast':>10} {'aft f32':>8} "
           f"{'aft bf16':>8} {'floor32':>8} {'floor16':>8} {'bf16/f32':>12} {'vs autocast':>13} {'rel diff':>9}")
    print(hdr)
    print("-" * len(hdr))
    for row in rows:
        print(fmt_bf16_row(row), flush=True)
        for k in [k for k in row if k.endswith("_error")]:
            print(f"  {k[:-6]}: {row[k]}")
    return ok


def int_list(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {s!r}")
    if not v or any(x < 1 for x in v):
        raise argparse.ArgumentTypeError(f"lengths must be >= 1: {s!r}")
    return v


def grid_size(s):
    try:
        v = tuple(int(x) for x in s.split(","))
    except ValueError:
        v = ()
    if len(v) != 2 or min(v) < 1:
        raise argparse.ArgumentTypeError(f"not H,W (two integers >= 1): {s!r}")
    return v


def resolve_mode_defaults(ap, args):
    """Defaults that depend on the mode: the issues' layers for --stream
    (d 256, S 32, 1 thread, 4096 tokens), --grid (d 192, S 6), --grad (T 4096)
    and --generate (256 characters)."""
    if sum(map(bool, (args.stream, args.grid, args.grad, args.generate, args.bf16))) > 1:
        ap.error("--stream, --grid, --grad, --generate and --bf16 are separate modes: pick one")
    if args.d_model is None:
        args.d_model = 192 if args.grid else 256
    if args.window is None:
        args.window = 6 if args.grid else 32
    if args.threads is None:
        args.threads = 1 if args.stream or args.generate else 2
    if args.repeat is None:
        args.repeat = 1 if args.stream or args.generate else 5
    if args.seq_len is None:
        args.seq_len = [4096] if args.stream or args.grad or args.bf16 else [256] if args.generate else [1024, 4096]
    if args.stream and max(args.seq_len) > 4096:
        ap.error("--stream: --seq-len at most 4096 (aft bench --stream decodes the first 4096 tokens)")
    if args.grid and (args.window < 1 or args.d_hidden is not None and args.d_hidden % args.heads
                      or args.d_hidden is None and args.d_model % args.heads):
        ap.error("--grid: --window must be >= 1 and --heads must divide the hidden size")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Time aft against PyTorch versions of labml's AFTLocal and "
                    "rish-16's AFTFull and AFTSimple; check that they agree. "
                    "--stream: decoding a token at a time; --grid: AFT-conv on a grid; "
                    "--grad: forward + backward, torch.autograd against aft grad.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int_list, default=None,
                    help="comma-separated sequence lengths (default 1024,4096; "
                         "--stream: tokens decoded, default 4096, at most 4096; "
                         "--grad: default 4096; --generate: characters generated, default 256)")
    ap.add_argument("--d-model", type=int, default=None,
                    help="model width (default 256; --grid: 192)")
    ap.add_argument("--d-hidden", type=int, default=None,
                    help="hidden width of the rish cases and --grid (default: "
                         "--d-model; labml's AFTLocal has none)")
    ap.add_argument("--window", type=int, default=None,
                    help="local window s of labml-local and --stream (default 32); "
                         "--grid: S, a (2S-1) x (2S-1) kernel (default 6)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for both (default 2; --stream: 1)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="timed runs, best kept (default 5; --grad: their median; "
                         "--stream: decodes of the whole sequence, default 1)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed torch runs first (default 1)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="torch and aft take turns this many times per case; each "
                         "side keeps its fastest round (default 3): on a shared "
                         "machine whose speed drifts, neither side is measured "
                         "only in a slow moment")
    ap.add_argument("--stream", action="store_true",
                    help="time decoding a token at a time: a PyTorch KV-cache loop "
                         "over labml's layer against aft bench --stream")
    ap.add_argument("--grid", type=grid_size, nargs="?", const=(56, 56), default=None,
                    metavar="H,W",
                    help="time AFT-conv on an H x W grid (default 56,56): "
                         "PaperAFTConv2d against aft run --variant conv --grid")
    ap.add_argument("--grad", action="store_true",
                    help="time forward + backward: torch.autograd of each case against "
                         "aft grad on the same weights, x and dy, after a gradient check")
    ap.add_argument("--grad-memory-len", type=int, default=65536, metavar="T",
                    help="--grad: T of the aft grad peak-RSS row, causal local with seeded "
                         "weights (default 65536; 0: no such row)")
    ap.add_argument("--generate", action="store_true",
                    help="time text generation with the shipped model (testdata/model): labml's "
                         "sampling loop and a PyTorch stepper against aft generate")
    ap.add_argument("--prompt", default="It is ", help="--generate: the prompt (default 'It is ')")
    ap.add_argument("--bf16", action="store_true",
                    help="time bf16 products: each case under torch.autocast(bfloat16) and in float32 "
                         "against aft run --precision bf16 and f32, plus labml's shape (B 32, T 256, d 128)")
    ap.add_argument("--batch", type=int, default=8, help="--grid: batch size (default 8)")
    ap.add_argument("--heads", type=int, default=32, help="--grid: heads (default 32)")
    ap.add_argument("--aft", default=os.path.join(ROOT, "aft"),
                    help="the aft binary (default ./aft in the repository root)")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--skip-torch-above", type=int, default=8192, metavar="T",
                    help="skip the O(T^2)-memory torch cases for T above this (default 8192)")
    ap.add_argument("--check-len", type=int, default=256,
                    help="T of the agreement check (default 256; --stream: tokens "
                         "of the loop checked; --grid checks the full grid)")
    ap.add_argument("--check-tol", type=float, default=1e-4,
                    help="largest accepted max|aft - torch f32|, times max(1, max|y|) "
                         "(--stream, --grid: times max|y|); default 1e-4")
    ap.add_argument("--check-only", action="store_true", help="only run the agreement check "
                    "(--grad: the gradient check)")
    ap.add_argument("--no-check", action="store_true", help="skip the agreement check")
    ap.add_argument("--json", action="store_true", help="print JSON lines instead of the table")
    ap.add_argument("--torch-coretype", default="auto",
                    help="OPENBLAS_CORETYPE for the torch subprocesses: a core name, "
                         "'unset' (OpenBLAS's own choice) or 'auto' (default: SkylakeX "
                         "on a CPU with AVX-512, where Debian's OpenBLAS 0.3.21 may not "
                         "pick it itself, else unset; SkylakeX on a CPU without AVX-512 "
                         "dies of an illegal instruction)")
    ap.add_argument("--aten-cpu-capability", default=None,
                    help="ATEN_CPU_CAPABILITY for the torch subprocesses (default: unset, "
                         "torch's own choice; e.g. avx512)")
    ap.add_argument("--omp-wait-policy", type=str.upper, choices=("ACTIVE", "PASSIVE"),
                    default=None,
                    help="OMP_WAIT_POLICY for both torch and aft (default: unset). Both "
                         "use libgomp threads next to OpenBLAS's own; on a busy machine "
                         "spinning OpenMP threads can slow either by several times")
    ap.add_argument("--matmul-n", type=int, default=2048,
                    help="size of the BLAS check matmul (default 2048)")
    ap.add_argument("--seed", type=int, default=0, help="seed for inputs and weights")
    ap.add_argument("--timeout", type=float, default=1800,
                    help="seconds allowed per subprocess (default 1800)")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter with torch for the workers (default: this one)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.worker))
        return 0
    resolve_mode_defaults(ap, args)
    if args.d_hidden is None:
        args.d_hidden = args.d_model
    args.cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in args.cases if c not in CASES]
    if bad:
        ap.error(f"unknown case(s) {bad}; choose from {list(CASES)}")
    for name in ("d_model", "d_hidden", "threads", "repeat", "rounds", "check_len", "batch",
                 "heads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.window < 0 or args.warmup < 0 or args.grad_memory_len < 0:
        ap.error("--window, --warmup and --grad-memory-len must be >= 0")
    if args.torch_coretype == "auto":
        args.torch_coretype = "SkylakeX" if cpu_has_avx512() else None
    elif args.torch_coretype in ("", "unset"):
        args.torch_coretype = None
    args.aft = os.path.abspath(args.aft)
    if not (os.path.isfile(args.aft) and os.access(args.aft, os.X_OK)):
        ap.error(f"aft binary not found or not executable: {args.aft} (run make, or pass --aft)")

    out = Out(args.json)
    env = print_env(args, out)
    try:
        lines = subprocess.run([args.aft, "--version"], stdout=subprocess.PIPE,
                               text=True).stdout.strip().splitlines()
        # the first line is the version; then "kernels: LEVEL (why)", the
        # level that runs aft's kernels, which the figures depend on
        level = [l.split()[1] for l in lines[1:] if l.startswith("kernels: ")]
        ver = (lines[0] if lines else "?") + (f", kernels {level[0]}" if level else "")
    except OSError:
        ver = "?"
    ver += time.strftime(", built %Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(args.aft)))
    tmp = tempfile.mkdtemp(prefix="aft-bench-")
    try:
        if args.stream or args.grid or args.grad or args.generate or args.bf16:
            out.note(f"aft: {args.aft} ({ver})", type="aft", path=args.aft, version=ver)
            if args.bf16:
                ok = bf16_mode(args, out, tmp)
            elif args.grad:
                ok = grad_mode(args, out, tmp)
            elif args.generate:
                ok = generate_mode(args, out, tmp)
            elif args.grid:
                ok = grid_mode(args, out, tmp, env["matmul_gflops"])
            else:
                ok = stream_mode(args, out, tmp)
            return 0 if ok else 1
        return cases_mode(args, out, tmp, ver, env.get("matmul_gflops"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cases_mode(args, out, tmp, ver, mm_gflops):
    """The default mode: check and time each of --cases; the exit status."""
    status = 0
    if not args.no_check:
        ok, core = do_checks(args, out, tmp)
        out.note(f"aft: {args.aft} ({ver}), BLAS core {core or '?'}",
                 type="aft", path=args.aft, version=ver, blas_core=core)
        if not ok:
            status = 1
    else:
        out.note(f"aft: {args.aft} ({ver})", type="aft", path=args.aft, version=ver)
    if not args.check_only:
        rows = bench(args, out, tmp, mm_gflops)
        if any("torch_error" in r or "aft_error" in r for r in rows):
            status = 1
    return status

if __name__ == "__main__":
    sys.exit(main())
