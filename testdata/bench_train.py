#!/usr/bin/python3
"""A training step with aft.torch against the PyTorch AFT modules, side by
side in one run.

Run with Debian's interpreter (torch, numpy) after make (it needs
lib/libaft.so and ./aft):

    /usr/bin/python3 testdata/bench_train.py                 # T = 4096, d = 256, 2 threads
    /usr/bin/python3 testdata/bench_train.py --repeat 5 --rounds 3
    /usr/bin/python3 testdata/bench_train.py --seq-len 1024 --cases labml-local

Cases, each a whole layer (projections included), batch 1, d_hidden =
d_model, the peer's state dict loaded into aft.torch's module with
strict=True:

  labml-local  labml's AFTLocal (testdata/torch_aft.py LabmlAFTLocal), seq-first,
               window --window, with labml's causal mask, against
               aft.torch.AFTLocal                      target: >= 10x
  rish-full    rish-16's AFTFull against aft.torch.RishAFTFull    >= 1.5x
  rish-simple  rish-16's AFTSimple against aft.torch.RishAFTSimple  >= 2x

A training step's forward and backward: y = module(x); y.backward(dy), x and
every parameter requiring grad, the gradients set to None between steps
(untimed). Both modules live in one worker process and take turns: --rounds
rounds of --repeat steps each (after --warmup untimed), torch then aft; each
side keeps its round with the lowest median. The optimiser step (Adam over
the module's parameters, after a backward) is timed apart, as often, and
printed beside, not inside. Before timing, one step of each side is
compared: y within 2e-5 x max(1, |y|) and every gradient within 1e-4 x
max(1, max|g|) of the peer's, float32 both (the tests hold aft.torch to
float64 autograd; here the check only guards the timing).

Python's overhead: aft.torch.AFTLocal (causal, window --window) at T =
--overhead-len, d = --overhead-d, batch 1: the median time of a forward
under torch.no_grad(), and of a training step (zero_grad, forward,
backward), over --overhead-calls calls, against the C time `aft bench
--json` reports for the same layer (compute_ms, and compute_ms + backward_ms
with --grad: medians; the backward runs the forward again) on the same
threads; the difference is Python's (target: at most 20 us a forward call).
Both sides take --rounds turns and keep their best. Beside it the time of
the bare ctypes call of aft_api_layer_forward on the module's layer (what
the library takes inside this process).

The worker runs with OPENBLAS_CORETYPE=SkylakeX on a CPU with AVX-512 (so
that PyTorch's products use AVX-512 whatever OpenBLAS detects; elsewhere
OpenBLAS's own choice; --torch-coretype to choose), as
testdata/bench_torch.py does, and with OPENBLAS_NUM_THREADS, OMP_NUM_THREADS,
MKL_NUM_THREADS and torch.set_num_threads at --threads; aft.torch runs on
torch.get_num_threads() threads, the same. `aft bench` gets the same
environment. The table names the BLAS core OpenBLAS reports.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CASES = ("labml-local", "rish-full", "rish-simple")
TARGETS = {"labml-local": 10.0, "rish-full": 1.5, "rish-simple": 2.0}
OVERHEAD_TARGET_US = 20.0
FWD_TOL, GRAD_TOL = 2e-5, 1e-4


# =====================================================================
# worker side: torch, aft.torch and the peers' modules
# =====================================================================

def _worker_setup(spec):
    """torch on spec's threads; (torch, the OpenBLAS info of this process,
    a function that sets OpenBLAS's threads back to spec's)."""
    import torch
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import bench_torch
    torch.set_num_threads(spec["threads"])
    info, ob = bench_torch._openblas_info()

    def blas_threads():
        bench_torch._set_openblas_threads(ob, spec["threads"])
    blas_threads()
    return torch, info, blas_threads


def _blas_threads_now():
    """OpenBLAS's thread count in this process now (None: not OpenBLAS)."""
    import bench_torch
    return bench_torch._openblas_info()[0].get("openblas_threads")


def _build(spec, case, T, d):
    """(peer module, aft module, x, dy, call): the peer with its own
    initialisation under the seed, its position bias randn * 0.5 (so that it
    matters), loaded into aft.torch's module with strict=True."""
    import torch
    import torch_aft as P
    import aft.torch as at
    torch.manual_seed(spec["seed"])
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    w = spec["window"]
    if case == "labml-local":
        peer, mine = P.LabmlAFTLocal(d, T, w), at.AFTLocal(d, T, w)
        x = torch.randn(T, 1, d, generator=g)
        mask = P.labml_causal_mask(T)            # made once, as a training loop of fixed T can

        def call(m, xx):
            return m(query=xx, key=xx, value=xx, mask=mask)
        bias = "pos_bias"
    elif case == "rish-full":
        peer, mine = P.RishAFTFull(T, d, d), at.RishAFTFull(T, d, d)
        x = torch.randn(1, T, d, generator=g)
        call, bias = (lambda m, xx: m(xx)), "wbias"
    else:
        peer, mine = P.RishAFTSimple(T, d, d), at.RishAFTSimple(T, d, d)
        x = torch.randn(1, T, d, generator=g)
        call, bias = (lambda m, xx: m(xx)), None
    if bias:
        with torch.no_grad():
            p = getattr(peer, bias)
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    mine.load_state_dict(peer.state_dict(), strict=True)
    dy = torch.randn(x.shape, generator=g)
    return peer, mine, x.requires_grad_(True), dy, call


def _step(m, x, dy, call):
    """One forward + backward; the seconds it took."""
    m.zero_grad(set_to_none=True)
    x.grad = None
    t0 = time.perf_counter()
    call(m, x).backward(dy)
    return time.perf_counter() - t0


def _check(torch, peer, mine, x, dy, call):
    """worst differences of y and of the gradients, aft's against the peer's
    (float32 both)"""
    grads = []
    ys = []
    for m in (peer, mine):
        m.zero_grad(set_to_none=True)
        x.grad = None
        y = call(m, x)
        y.backward(dy)
        ys.append(y.detach().double())
        grads.append({"input": x.grad.double()} |
                     {k: p.grad.double() for k, p in m.named_parameters() if p.grad is not None})
    y_rel = float(((ys[1] - ys[0]).abs() / ys[0].abs().clamp(min=1)).max())
    g_rel, g_name = 0.0, None
    for k, ref in grads[0].items():
        got = grads[1].get(k)
        if got is None:
            return y_rel, float("inf"), k + " (none from aft)"
        r = float((got - ref).abs().max()) / max(1.0, float(ref.abs().max()))
        if r > g_rel or g_name is None:
            g_rel, g_name = r, k
    return y_rel, g_rel, g_name


def worker_case(spec):
    torch, info, _ = _worker_setup(spec)
    case, T, d = spec["case"], spec["T"], spec["d_model"]
    peer, mine, x, dy, call = _build(spec, case, T, d)
    y_rel, g_rel, g_name = _check(torch, peer, mine, x, dy, call)
    opts = {"torch": torch.optim.Adam(peer.parameters(), lr=1e-4),
            "aft": torch.optim.Adam(mine.parameters(), lr=1e-4)}
    mods = {"torch": peer, "aft": mine}
    res = {"case": case, "T": T, "d_model": d, "y_rel": y_rel, "grad_rel": g_rel, "grad_worst": g_name,
           "blas_core": info.get("core"), "rounds": {"torch": [], "aft": []}, "adam": {"torch": [], "aft": []}}
    for _ in range(spec["warmup"]):
        for side in ("torch", "aft"):
            _step(mods[side], x, dy, call)
    for _ in range(spec["rounds"]):
        for side in ("torch", "aft"):
            m = mods[side]
            if side == "torch":
                # libaft shares the process's OpenBLAS, the one torch loaded
                # (one soname), and puts its thread count back after every
                # call: torch's turn finds its own (reported, not reset)
                res["blas_threads_after_aft"] = _blas_threads_now()
            times = [_step(m, x, dy, call) * 1e3 for _ in range(spec["repeat"])]
            res["rounds"][side].append(statistics.median(times))
            adam = []
            for _ in range(spec["repeat"]):
                t0 = time.perf_counter()
                opts[side].step()
                adam.append((time.perf_counter() - t0) * 1e3)
            res["adam"][side].append(statistics.median(adam))
    return res


def worker_overhead(spec):
    """aft.torch.AFTLocal's call at a small size, and the bare C call."""
    torch, info, _ = _worker_setup(spec)
    import aft.torch as at
    from aft import _lib
    T, d, n = spec["T"], spec["d_model"], spec["calls"]
    torch.manual_seed(spec["seed"])
    m = at.AFTLocal(d, T, spec["window"])
    with torch.no_grad():
        m.pos_bias.normal_(0, 0.5)
    x = torch.randn(T, 1, d)
    mask = torch.ones(T, T, dtype=torch.bool).tril().unsqueeze(-1)

    def timed(fn):
        for _ in range(min(50, n)):
            fn()
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(out)

    with torch.no_grad():
        fwd = timed(lambda: m(query=x, key=x, value=x, mask=mask))
    xg = x.clone().requires_grad_(True)
    dy = torch.randn(x.shape)

    def train_step():
        m.zero_grad(set_to_none=True)
        m(query=xg, key=xg, value=xg, mask=mask).backward(dy)
    both = timed(train_step)
    # the bare C call: the module's library layer, its forward through ctypes
    names, params = m._weights()
    spec_ = at._spec(names, "variant=local window=%d causal=1 layout=tbd threads=%d"
                     % (spec["window"], torch.get_num_threads()), "tbd")
    err = _lib.error_buffer()
    h, _, kept = spec_.acquire(params, err)
    y = torch.empty_like(x)
    f = _lib.lib.aft_api_layer_forward
    xp, yp = x.data_ptr(), y.data_ptr()
    bare = timed(lambda: f(h, yp, xp, 1, T, err))
    spec_.release(h, kept)
    return {"forward_us": fwd, "train_step_us": both, "c_call_us": bare, "threads": torch.get_num_threads(),
            "torch_version": torch.__version__, "blas_core": info.get("core")}


def worker_main(spec):
    fn = {"case": worker_case, "overhead": worker_overhead}[spec["task"]]
    sys.stdout.write("@@RESULT " + json.dumps(fn(spec)) + "\n")
    sys.stdout.flush()


# =====================================================================
# parent side: no torch here
# =====================================================================

def worker_env(args):
    env = dict(os.environ)
    if args.torch_coretype:
        env["OPENBLAS_CORETYPE"] = args.torch_coretype
    else:
        env.pop("OPENBLAS_CORETYPE", None)
    for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(args.threads)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + (os.pathsep + env["PYTHONPATH"]
                                                        if env.get("PYTHONPATH") else "")
    return env


def run_worker(args, spec):
    spec = dict(spec, threads=args.threads, seed=args.seed, window=args.window)
    cmd = [args.python, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    p = subprocess.run(cmd, env=worker_env(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("@@RESULT "):
            return json.loads(line[len("@@RESULT "):])
    tail = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
    sys.exit("bench_train: worker %s failed (exit %d): %s" % (spec["task"], p.returncode, tail))


def aft_bench_ms(args):
    """(compute_ms, backward_ms) of `aft bench --grad` at the overhead's size:
    medians, milliseconds."""
    cmd = [args.aft, "bench", "--seq-len", str(args.overhead_len), "--d-model", str(args.overhead_d),
           "--variant", "local", "--window", str(args.window), "--causal", "--threads", str(args.threads),
           "--repeat", str(args.overhead_calls), "--grad", "--json", "--no-ceiling", "-q"]
    p = subprocess.run(cmd, env=worker_env(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("bench_train: %s: %s" % (" ".join(cmd), p.stderr.strip()))
    j = json.loads(p.stdout.splitlines()[-1])
    return j["compute_ms"], j["backward_ms"], " ".join(cmd[1:])


def pass_miss(ok):
    return "pass" if ok else "MISS"


def cpu_has_avx512():
    sys.path.insert(0, HERE)
    import bench_torch
    return bench_torch.cpu_has_avx512()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-len", type=int, default=4096, help="T (default 4096)")
    ap.add_argument("--d-model", type=int, default=256, help="d (default 256)")
    ap.add_argument("--window", type=int, default=32, help="labml's window (default 32)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of %s" % ", ".join(CASES))
    ap.add_argument("--threads", type=int, default=2, help="threads for both sides (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="timed steps a round (default 3)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds each side takes in turn (default 2)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps each side first (default 1)")
    ap.add_argument("--overhead-len", type=int, default=64, help="T of the overhead's layer (default 64)")
    ap.add_argument("--overhead-d", type=int, default=64, help="d of the overhead's layer (default 64)")
    ap.add_argument("--overhead-calls", type=int, default=400, help="calls timed for it (default 400)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch-coretype", default="auto",
                    help="OPENBLAS_CORETYPE for the worker (default auto: SkylakeX on a CPU with AVX-512, "
                         "else unset; '' to unset)")
    ap.add_argument("--aft", default=os.path.join(ROOT, "aft"), help="the aft binary for aft bench")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch (default: this one)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.worker))
        return 0
    cases = [c for c in args.cases.split(",") if c]
    if any(c not in CASES for c in cases):
        ap.error("unknown case in %r; choose from %s" % (args.cases, ", ".join(CASES)))
    for k in ("seq_len", "d_model", "window", "threads", "repeat", "rounds", "overhead_len", "overhead_d",
              "overhead_calls"):
        if getattr(args, k) < 1:
            ap.error("--%s must be >= 1" % k.replace("_", "-"))
    if args.torch_coretype == "auto":
        args.torch_coretype = "SkylakeX" if cpu_has_avx512() else None
    if not os.access(args.aft, os.X_OK):
        ap.error("%s not found: run make (or pass --aft)" % args.aft)

    core = ("OPENBLAS_CORETYPE=%s" % args.torch_coretype) if args.torch_coretype else "OPENBLAS_CORETYPE unset"
    print("bench_train: %d threads (torch.set_num_threads, OpenBLAS, OpenMP; aft.torch follows torch), %s; "
          "load average %s" % (args.threads, core, " ".join("%.2f" % v for v in os.getloadavg())), flush=True)
    rows = [run_worker(args, {"task": "case", "case": c, "T": args.seq_len, "d_model": args.d_model,
                              "repeat": args.repeat, "rounds": args.rounds, "warmup": args.warmup})
            for c in cases]
    # the overhead's two sides in turns too, each keeping its best round
    over, c_fwd, c_grad = None, float("inf"), float("inf")
    for _ in range(args.rounds):
        o = run_worker(args, {"task": "overhead", "T": args.overhead_len, "d_model": args.overhead_d,
                              "calls": args.overhead_calls})
        if over is None:
            over = o
        else:
            for k in ("forward_us", "train_step_us", "c_call_us"):
                over[k] = min(over[k], o[k])
        f, g, c_cmd = aft_bench_ms(args)
        c_fwd, c_grad = min(c_fwd, f), min(c_grad, g)
    print("torch %s, OpenBLAS core %s (as the worker reports it)"
          % (over["torch_version"], rows[0]["blas_core"] if rows else over["blas_core"]))
    print()
    print("forward + backward of a training step, T = %d, d = %d, batch 1 (medians of %d steps, the best of "
          "%d rounds; Adam's step beside, not inside)" % (args.seq_len, args.d_model, args.repeat, args.rounds))
    head = "%-12s %11s %9s %8s %7s %5s  %10s %8s  %9s %9s" % (
        "case", "torch ms", "aft ms", "speedup", "target", "", "Adam torch", "Adam aft", "y diff", "grad diff")
    print(head)
    print("-" * len(head))
    ok_all = True
    for r in rows:
        t, a = min(r["rounds"]["torch"]), min(r["rounds"]["aft"])
        sp = t / a
        ok = sp >= TARGETS[r["case"]]
        same = r["y_rel"] <= FWD_TOL and r["grad_rel"] <= GRAD_TOL
        ok_all &= ok and same
        print("%-12s %11.1f %9.2f %7.1fx %6gx %5s  %10.2f %8.2f  %9.1e %9.1e%s" % (
            r["case"], t, a, sp, TARGETS[r["case"]], pass_miss(ok), min(r["adam"]["torch"]),
            min(r["adam"]["aft"]), r["y_rel"], r["grad_rel"],
            "" if same else "  MISMATCH (%s)" % r["grad_worst"]))
    print("(y diff: max |y_aft - y_torch| / max(1, |y_torch|), at most %g; grad diff: the worst gradient's "
          "max |g_aft - g_torch| / max(1, max |g_torch|), at most %g; float32 both)" % (FWD_TOL, GRAD_TOL))
    after = sorted({str(r.get("blas_threads_after_aft")) for r in rows})
    print("OpenBLAS threads after aft's turns: %s (torch's: %d; the process has one OpenBLAS, whose count aft "
          "leaves as it found it)" % (", ".join(after), args.threads))
    ok_all &= all(a in ("None", str(args.threads)) for a in after)
    print()
    print("Python's overhead, aft.torch.AFTLocal, T = %d, d = %d, causal, window %d, %d threads (medians of %d "
          "calls, the best of %d rounds)" % (args.overhead_len, args.overhead_d, args.window, over["threads"],
                                             args.overhead_calls, args.rounds))
    fwd_over = over["forward_us"] - c_fwd * 1e3
    # a training step calls the forward, then the backward (which runs the forward again inside)
    step_over = over["train_step_us"] - (c_fwd + c_grad) * 1e3
    print("  forward (no_grad)    aft.torch %7.1f us   aft bench compute_ms               %7.1f us   "
          "overhead %6.1f us  target <= %g us  %s" % (over["forward_us"], c_fwd * 1e3, fwd_over,
                                                       OVERHEAD_TARGET_US, pass_miss(fwd_over <= OVERHEAD_TARGET_US)))
    print("  forward + backward   aft.torch %7.1f us   aft bench compute_ms + backward_ms %7.1f us   "
          "overhead %6.1f us  (zero_grad and autograd's engine included)"
          % (over["train_step_us"], (c_fwd + c_grad) * 1e3, step_over))
    print("  (the bare ctypes call of aft_api_layer_forward on the module's layer: %.1f us; `aft %s`)"
          % (over["c_call_us"], c_cmd))
    ok_all &= fwd_over <= OVERHEAD_TARGET_US
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
