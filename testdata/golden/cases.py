"""The cases of `make golden`: aft command lines whose results must not move.

A case is a name and one or more steps, each the words after `aft` (a
trailing `< FILE` feeds FILE to stdin), run in order in one scratch
directory where in/ holds the seeded inputs of inputs.py and td/ is
testdata/. Every step's exit status, stdout and stderr and every file the
case leaves are compared, except:
  keys=(NAME, ...)    timing outputs (a file, "stdout"): their JSON keys only
  ignore=(NAME, ...)  streams not compared at all ("stdout", "stderr")
  env={...}           variables for every step
  mpi=N               every step under `mpirun --oversubscribe -np N`

Runs whose kernels hand blocks to threads as they come free (grad of
full, of masks and of grids) use --threads 1: with more threads their last
bits vary from run to run.
"""
import os

TESTDATA = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = []


class Case:
    def __init__(self, name, steps, keys=(), ignore=(), env=None, mpi=0):
        self.name, self.steps = name, list(steps)
        self.keys, self.ignore, self.env, self.mpi = set(keys), set(ignore), dict(env or {}), mpi


def case(name, *steps, **kw):
    assert all(c.name != name for c in CASES), name
    CASES.append(Case(name, steps, **kw))


def testdata(sub, pick=lambda n: True):
    """td/SUB/NAME for the files of testdata/SUB, sorted, that pick(NAME) keeps."""
    names = sorted(n for n in os.listdir(os.path.join(TESTDATA, sub))
                   if os.path.isfile(os.path.join(TESTDATA, sub, n)) and pick(n))
    return ["td/%s/%s" % (sub, n) for n in names]


X = "in/x_b2_t50_d16.npy"          # the usual input: B = 2, T = 50, D = 16
VARIANTS = {                         # each variant's options
    "full": "--variant full",
    "local": "--variant local --window 4",
    "simple": "--variant simple",
    "conv": "--variant conv --window 3 --heads 4",
}
TORCH = "td/torch"
MODEL = "td/model/labml_aft_fortunes.safetensors"

# ---------------------------------------------------------------- aft run

for v, opts in VARIANTS.items():
    for causal in ("", " --causal"):
        case("run-%s%s" % (v, causal.replace(" --", "-")),
             *["run %s%s --threads %d %s -o y%d.npy" % (opts, causal, t, X, t) for t in (1, 2)])

# windows 0, 1, small, T and past T
WINDOWS = (0, 1, 2, 17, 50, 200)
case("run-local-windows", *["run --variant local --window %d --threads 1 %s -o y%d.npy" % (s, X, s) for s in WINDOWS])
case("run-local-windows-causal", *["run --variant local --window %d --causal --threads 2 %s -o y%d.npy" % (s, X, s)
                                   for s in WINDOWS])
case("run-conv-windows", *["run --variant conv --window %d --heads 2 --threads 1 %s -o y%d.npy" % (s, X, s)
                           for s in (1, 2, 25, 60)])
case("run-conv-w5-h8-causal", "run --variant conv --window 5 --heads 8 --causal %s -o y.npy" % X)
case("run-conv-w3-h1", "run --variant conv --window 3 %s -o y.npy" % X)

# masks: [T, T] bool and 0/1, [B, T, T], one equal to causality, one hiding all
for v in VARIANTS:
    case("run-%s-mask" % v, "run %s --mask in/mask_t50.npy %s -o y.npy" % (VARIANTS[v], X))
case("run-full-mask-causal", "run --variant full --causal --mask in/mask_t50.npy --threads 2 %s -o y.npy" % X)
case("run-local-mask-batch", "run --variant local --window 6 --mask in/mask_b2_t50.npy %s -o y.npy" % X)
case("run-full-mask-u1", "run --variant full --mask in/mask_t50_u1.npy --threads 1 %s -o y.npy" % X)
case("run-local-mask-is-causal", "run --variant local --window 4 --mask in/mask_causal_t50.npy %s -o y.npy" % X)
case("run-full-mask-none", "run --variant full --mask in/mask_none_t12.npy in/x_t12_d16.npy -o y.npy")

# layouts and ranks: [T, B, D], [T, D], stdin, stdout
case("run-tbd", *["run %s --layout tbd in/x_t20_b3_d16.npy -o y_%s.npy" % (VARIANTS[v], v) for v in VARIANTS])
case("run-local-tbd-causal", "run --variant local --window 3 --causal --layout tbd in/x_t20_b3_d16.npy -o y.npy")
case("run-full-2d", "run --variant full --causal in/x_t12_d16.npy -o y.npy")
case("run-simple-b3-d8", "run --variant simple --causal in/x_b3_t37_d8.npy -o y.npy")
case("run-local-stdin-stdout", "run --variant local --window 4 - < %s" % X, "run --variant simple %s -o -" % X)

# input dtypes and .npy forms
case("run-local-x-forms", *["run --variant local --window 5 in/x_b2_t50_d16_%s.npy -o y_%s.npy" % (f, f)
                            for f in ("f64", "f16", "be", "fortran", "v2")])

# the seeded initialisation's knobs
case("run-full-seed7", "run --variant full --seed 7 %s -o y.npy" % X)
case("run-local-dhidden24", "run --variant local --window 4 --d-hidden 24 %s -o y.npy" % X)
case("run-conv-dhidden8", "run --variant conv --window 3 --heads 2 --d-hidden 8 --causal %s -o y.npy" % X)
case("run-strict-max-memory", "run --variant local --window 4 --strict --max-memory 1G %s -o y.npy" % X,
     "run --variant local --window 3 --max-memory 64M --weights td/npz/weights_rish_local_deflated.npz "
     "td/torch/rish_local/x.npy -o y2.npy")

# grids: 4-D inputs and --grid H,W
GRID = {"full": "--variant full", "local": "--variant local --window 2", "simple": "--variant simple",
        "conv": "--variant conv --window 2 --heads 2"}
case("run-grid", *["run %s --threads 1 in/x_grid_b2_4x5_d8.npy -o y_%s.npy" % (GRID[v], v) for v in GRID])
case("run-grid-local-causal", "run --variant local --window 2 --causal in/x_grid_b2_4x5_d8.npy -o y.npy")
case("run-grid-local-mask", "run --variant local --window 3 --mask in/mask_t20.npy in/x_grid_b2_4x5_d8.npy -o y.npy")
case("run-grid-flag-local", "run --variant local --window 3 --grid 6,7 --threads 2 in/x_b2_t42_d12.npy -o y.npy")
case("run-grid-flag-conv-causal", "run --variant conv --window 2 --heads 3 --grid 6,7 --causal in/x_b2_t42_d12.npy -o y.npy")

# the bare operator: q, k, v from a .safetensors or .npz
Q = "in/qkv_b2_t40_c16.safetensors"
for v in VARIANTS:
    case("op-%s" % v, "run %s %s -o y.npy" % (VARIANTS[v], Q), "run %s --causal --threads 2 %s -o yc.npy" % (VARIANTS[v], Q))
case("op-local-npz", "run --variant local --window 3 in/qkv_t30_c8.npz -o y.npy")
case("op-full-npz-deflated", "run --variant full --causal in/qkv_t30_c8_deflated.npz -o y.npy")
case("op-conv-key-per-head", "run --variant conv --window 3 --heads 4 in/qkv_heads_b2_t40_c16.safetensors -o y.npy")
for v in ("full", "local"):
    case("op-%s-extreme-keys" % v, "run %s in/qkv_ext_b2_t40_c16.safetensors -o y.npy" % VARIANTS[v],
         "run %s --causal in/qkv_ext_b2_t40_c16.safetensors -o yc.npy" % VARIANTS[v])
case("op-local-weights-bias", "run --variant local --window 4 --weights in/w_prefix.safetensors "
     "--prefix blocks.2.attn. %s -o y.npy" % Q)

# the float64 reference kernels
case("run-reference", *["run %s --impl reference %s%s -o y_%s%s.npy" % (VARIANTS[v], c, X, v, c.strip("- "))
                         for v in VARIANTS for c in ("", "--causal ")])
case("run-grid-conv-reference", "run --variant conv --window 2 --heads 2 --impl reference in/x_grid_b2_4x5_d8.npy -o y.npy")
case("op-local-reference-extreme", "run --variant local --window 4 --causal --impl reference "
     "in/qkv_ext_b2_t40_c16.safetensors -o y.npy")

# inputs in the hundreds: keys far beyond exp's range
case("run-extreme", *["run %s in/x_ext_b2_t40_d16.npy -o y_%s.npy" % (VARIANTS[v], v) for v in VARIANTS])
case("run-local-extreme-causal", "run --variant local --window 4 --causal in/x_ext_b2_t40_d16.npy -o y.npy")

# weights saved from PyTorch: each fixture's own option lines
for d in sorted(os.listdir(os.path.join(TESTDATA, "torch"))):
    for i, fname in enumerate(("args.txt", "args_alt.txt")):
        path = os.path.join(TESTDATA, "torch", d, fname)
        if os.path.exists(path):
            opts = open(path).read().strip().replace("mask.npy", "%s/%s/mask.npy" % (TORCH, d))
            case("torch-%s%s" % (d, "-alt" if i else ""),
                 "run --weights %s/%s/weights.safetensors %s %s/%s/x.npy -o y.npy" % (TORCH, d, opts, TORCH, d))
for dt in ("bf16", "f16", "f64"):
    case("torch-rish_full-weights-%s" % dt,
         "run --variant full --weights %s/rish_full/weights_%s.safetensors %s/rish_full/x.npy -o y.npy" % (TORCH, dt, TORCH))
for form in ("x_be", "x_f64", "x_fortran"):
    case("torch-rish_full-%s" % form,
         "run --variant full --weights %s/rish_full/weights.safetensors %s/rish_full/%s.npy -o y.npy" % (TORCH, TORCH, form))
case("torch-rish_local-preforward", "run --variant local --window 3 --weights %s/rish_local/weights_preforward.safetensors "
     "%s/rish_local/x.npy -o y.npy" % (TORCH, TORCH))
NPZ_W = {"labml_local": ("--variant local --window 4 --causal --layout tbd", "labml_local"),
         "labml_local_extreme": ("--variant local --window 4 --causal --layout tbd", "labml_local_extreme"),
         "rish_full": ("--variant full", "rish_full"), "rish_full_extreme": ("--variant full", "rish_full_extreme"),
         "rish_local": ("--variant local --window 3", "rish_local"), "rish_simple": ("--variant simple", "rish_simple")}
for w, (opts, d) in sorted(NPZ_W.items()):
    case("npz-%s" % w, *["run --weights td/npz/weights_%s%s.npz %s %s/%s/x.npy -o y%s.npy"
                         % (w, deflated, opts, TORCH, d, deflated) for deflated in ("", "_deflated")])

# our own weights: a prefix, a factorised bias, conv biases, extreme biases, dtypes
WP = "--weights in/w_prefix.safetensors --prefix blocks.2.attn."
case("w-prefix-full", "run --variant full %s %s -o y.npy" % (WP, X))
case("w-prefix-local-causal", "run --variant local --window 5 --causal %s %s -o y.npy" % (WP, X))
case("w-factor-full", "run --variant full --weights in/w_factor.safetensors %s -o y.npy" % X)
case("w-factor-local-causal", "run --variant local --window 3 --causal --weights in/w_factor.safetensors %s -o y.npy" % X)
case("w-conv-heads", "run --variant conv --weights in/w_conv_h4_s3.safetensors %s -o y.npy" % X)
case("w-conv-heads-causal", "run --variant conv --causal --weights in/w_conv_h4_s3.safetensors %s -o y.npy" % X)
case("w-conv-1d-npz", "run --variant conv --weights in/w_conv_s4.npz in/x_b2_t42_d12.npy -o y.npy")
case("w-extreme-full", "run --variant full --weights in/w_ext.safetensors %s -o y.npy" % X)
case("w-extreme-local-causal", "run --variant local --window 6 --causal --weights in/w_ext.safetensors %s -o y.npy" % X)
case("w-extreme-full-reference", "run --variant full --impl reference --weights in/w_ext.safetensors %s -o y.npy" % X)
case("w-f64-npz-deflated", "run --variant local --window 4 --weights in/w_f64.npz %s -o y.npy" % X)
case("w-f16", "run --variant full --causal --weights in/w_f16.safetensors %s -o y.npy" % X)
case("w-nobias", "run --variant full --weights in/w_nobias.safetensors %s -o y.npy" % X)
case("w-model-layer", "run --variant local --window 32 --causal --weights %s --prefix encoder.layers.3.self_attn. "
     "in/x_t100_d128.npy -o y.npy" % MODEL)

# sizes that take the chunked and threaded paths
case("big-local-causal-t2048", "run --variant local --window 32 --causal --threads 2 in/x_t2048_d64.npy -o y.npy")
case("big-local-t2048", "run --variant local --window 16 --threads 2 in/x_t2048_d64.npy -o y.npy")
case("big-conv-causal-t2048", "run --variant conv --window 8 --heads 4 --causal --threads 2 in/x_t2048_d64.npy -o y.npy")
case("big-simple-causal-t2048", "run --variant simple --causal --threads 2 in/x_t2048_d64.npy -o y.npy")
case("big-full-t512", "run --variant full --threads 2 in/x_t512_d64.npy -o y.npy")
case("big-full-t512-t1", "run --variant full --threads 1 in/x_t512_d64.npy -o y.npy")
case("big-full-causal-t512", "run --variant full --causal --threads 2 in/x_t512_d64.npy -o y.npy")
case("big-full-mask-t300", "run --variant full --mask in/mask_t300.npy --threads 2 in/x_t300_d64.npy -o y.npy")
case("big-local-t300-w7", "run --variant local --window 7 in/x_t300_d64.npy -o y.npy")
case("big-linear-blas", "run --variant local --window 8 --causal in/x_t300_d64.npy -o y.npy", env={"AFT_LINEAR_BLAS": "1"})
case("big-dense-blas", "run --variant full --causal in/x_t300_d64.npy -o y.npy", env={"AFT_DENSE_BLAS": "1"})

# streaming: the sequence in chunks of 1, 7 and 42 rows, each run continuing the state
CHUNKS = ["in/chunk_%s_b2_d16.npy" % c for c in "abc"]


def stream(name, opts, chunks=CHUNKS):
    steps = ["run %s --causal --state-out s.safetensors %s -o y0.npy" % (opts, chunks[0])]
    steps += ["run %s --causal --state-in s.safetensors --state-out s.safetensors %s -o y%d.npy" % (opts, c, i + 1)
              for i, c in enumerate(chunks[1:])]
    case(name, *steps)


for v in VARIANTS:
    stream("stream-%s" % v, VARIANTS[v])
stream("stream-local-weights", "--variant local --window 5 " + WP)
stream("stream-conv-weights", "--variant conv --weights in/w_conv_h4_s3.safetensors")
stream("stream-local-tbd", "--variant local --window 3 --layout tbd", ["in/chunk_a_tbd.npy", "in/chunk_b_tbd.npy"])
# a state refused: another window, another batch, rows past the learned bias
case("err-stream",
     "run --variant local --window 4 --causal --state-out s1.safetensors %s -o y1.npy" % CHUNKS[0],
     "run --variant local --window 5 --causal --state-in s1.safetensors %s -o y.npy" % CHUNKS[1],
     "run --variant simple --causal --state-out s2.safetensors %s -o y2.npy" % CHUNKS[0],
     "run --variant simple --causal --state-in s2.safetensors in/chunk_a_tbd.npy -o y.npy",
     "run --variant full --causal --weights in/w_short_bias.safetensors --state-out s3.safetensors "
     "in/x_t12_d16.npy -o y3.npy",
     "run --variant full --causal --weights in/w_short_bias.safetensors --state-in s3.safetensors %s -o y.npy" % CHUNKS[2])
# the spoilt states of testdata/malformed/, for the layer they were made for
STATE_RUN = "run --variant local --window 3 --seed 7 --causal in/x_t4_d8.npy -o y.npy --state-in "
case("stream-malformed-states", *[STATE_RUN + f for f in testdata("malformed", lambda n: n.startswith("state_"))]
     + [STATE_RUN + "in/state_text.safetensors", STATE_RUN + "td/malformed/state_nan_sum.safetensors --state-out s.safetensors"])

# non-finite inputs, timing files, repeats
case("run-nan-warning", "run --variant local --window 3 in/x_nan_t20_d8.npy -o y.npy")
case("run-nan-causal", "run --variant full --causal in/x_nan_t20_d8.npy -o y.npy")
case("run-timing", "run --variant local --window 4 --repeat 3 --timing t.json %s -o y.npy" % X, keys=("t.json",))
case("op-timing", "run --variant full --timing t.json %s -o y.npy" % Q, keys=("t.json",))

# ---------------------------------------------------------------- aft grad

for v, opts in VARIANTS.items():
    case("grad-%s" % v, "grad %s --threads 1 %s --dy in/dy_b2_t50_d16.npy -o g.safetensors" % (opts, X),
         "grad %s --causal --threads 1 %s --dy in/dy_b2_t50_d16.npy -o gc.safetensors" % (opts, X),
         "grad %s --threads 1 %s -o g1.safetensors" % (opts, X))
for v in ("local", "simple", "conv"):
    case("grad-%s-causal-t2" % v, "grad %s --causal --threads 2 %s --grad-output in/dy_b2_t50_d16.npy -o g.npz"
         % (VARIANTS[v], X))
case("grad-full-mask", "grad --variant full --mask in/mask_t50.npy --threads 1 %s --dy in/dy_b2_t50_d16.npy -o g.safetensors" % X)
case("grad-local-mask-batch", "grad --variant local --window 5 --causal --mask in/mask_b2_t50.npy --threads 1 %s -o g.safetensors" % X)
case("grad-local-tbd", "grad --variant local --window 3 --causal --layout tbd in/x_t20_b3_d16.npy --dy in/dy_t20_b3_d16.npy -o g.safetensors")
case("grad-full-2d", "grad --variant full --threads 1 in/x_t12_d16.npy --dy in/dy_t12_d16.npy -o g.safetensors")
case("grad-grid-local", "grad --variant local --window 2 --threads 1 in/x_grid_b2_4x5_d8.npy --dy in/dy_grid_b2_4x5_d8.npy -o g.safetensors")
case("grad-grid-conv-causal", "grad --variant conv --window 2 --heads 2 --causal --threads 1 in/x_grid_b2_4x5_d8.npy -o g.safetensors")
case("grad-local-dhidden24", "grad --variant local --window 4 --d-hidden 24 --seed 3 %s -o g.safetensors" % X)
case("grad-local-stdout", "grad --variant local --window 4 --causal %s" % X)
case("grad-local-extreme", "grad --variant local --window 4 --causal in/x_ext_b2_t40_d16.npy -o g.safetensors")
for v in ("full", "local"):
    case("grad-%s-reference" % v, "grad %s --causal --impl reference %s --dy in/dy_b2_t50_d16.npy -o g.safetensors"
         % (VARIANTS[v], X))
case("grad-op", *["grad %s --threads 1 %s --dy in/dy_b2_t40_c16.npy -o g_%s.safetensors" % (VARIANTS[v], Q, v)
                   for v in VARIANTS])
case("grad-op-conv-key-per-head", "grad --variant conv --window 3 --heads 4 --causal in/qkv_heads_b2_t40_c16.safetensors -o g.safetensors")
case("grad-op-full-extreme-keys", "grad --variant full --threads 1 in/qkv_ext_b2_t40_c16.safetensors -o g.safetensors")
for d, opts in (("labml_local", "--variant local --window 4 --causal --layout tbd"), ("rish_full", "--variant full"),
                ("rish_local", "--variant local --window 3"), ("rish_simple", "--variant simple")):
    case("grad-torch-%s" % d, "grad --threads 1 --weights %s/%s/weights.safetensors %s %s/%s/x.npy --dy %s/%s/dy.npy -o g.safetensors"
         % (TORCH, d, opts, TORCH, d, TORCH, d))
case("grad-torch-labml_local-npz", "grad --weights td/npz/weights_labml_local.npz --variant local --window 4 --mask "
     "%s/labml_local/mask.npy --layout tbd --threads 1 %s/labml_local/x.npy -o g.npz" % (TORCH, TORCH))
for d in ("grid_conv", "grid_conv_shared", "grid_local"):
    opts = open(os.path.join(TESTDATA, "torch", d, "args.txt")).read().strip()
    case("grad-torch-%s" % d, "grad --threads 1 --weights %s/%s/weights.safetensors %s %s/%s/x.npy -o g.safetensors"
         % (TORCH, d, opts, TORCH, d))
case("grad-w-prefix", "grad --variant full --causal --threads 1 %s %s -o g.safetensors" % (WP, X))
case("grad-w-factor", "grad --variant local --window 3 --causal --weights in/w_factor.safetensors %s -o g.safetensors" % X)
case("grad-w-conv-heads", "grad --variant conv --weights in/w_conv_h4_s3.safetensors %s -o g.safetensors" % X)
case("grad-w-extreme", "grad --variant local --window 6 --causal --weights in/w_ext.safetensors %s -o g.safetensors" % X)
case("grad-w-nobias", "grad --variant full --threads 1 --weights in/w_nobias.safetensors %s -o g.npz" % X)
case("grad-big-local-causal-t2048", "grad --variant local --window 32 --causal --threads 2 in/x_t2048_d64.npy -o g.safetensors")
case("grad-timing", "grad --variant local --window 4 --repeat 2 --timing t.json %s -o g.safetensors" % X, keys=("t.json",))
case("err-grad", "grad --variant local --window 4 %s --dy in/dy_b2_t49_d16.npy -o g.safetensors" % X,
     "grad --variant local --window 4 %s --dy in/nothing.npy -o g.safetensors" % X,
     "grad --variant local --window 4 %s --dy" % X, "grad --variant local %s" % X, "grad --bogus %s" % X,
     "grad --variant simple --dy in/mask_t50.npy %s -o g.safetensors" % X,
     "grad --variant simple %s -o nodir/g.safetensors" % X)

# ---------------------------------------------------------------- usage and data errors of run
# one case a kind of error, a step an error: a failure line names the step

case("err-run-usage",
     "run --bogus %s" % X, "run %s --window" % X, "run --variant local --window x %s" % X,
     "run --variant local --window -1 %s" % X, "run --variant blah %s" % X, "run --layout xyz %s" % X,
     "run --impl slow %s" % X, "run --threads 0 %s" % X, "run --repeat 0 %s" % X, "run --seed abc %s" % X,
     "run --d-hidden 0 %s" % X, "run --max-memory 10Q %s" % X, "run --variant local --window 2 --grid 5x10 %s" % X,
     "run --variant simple", "run --variant simple %s %s" % (X, X))
case("err-run-variant-rules",
     "run --variant local %s" % X, "run --variant conv %s" % X, "run --variant full --window 3 %s" % X,
     "run --variant simple --window 3 %s" % X, "run --variant conv --window 3 --heads 5 %s" % X,
     "run --variant local --window 3 --heads 2 %s" % X, "run --variant local --window 2 --grid 7,7 %s -o y.npy" % X)
case("err-run-state-rules",
     "run --variant local --window 3 --state-out s.safetensors %s" % X,
     "run --variant local --window 3 --causal --impl reference --state-out s.safetensors %s" % X,
     "run --variant local --window 3 --causal --mask in/mask_t50.npy --state-out s.safetensors %s" % X,
     "run --variant local --window 2 --causal --state-out s.safetensors in/x_grid_b2_4x5_d8.npy",
     "run --variant simple --causal --repeat 2 --state-out s.safetensors %s" % X,
     "run --variant simple --causal --state-in in/nothing.safetensors %s -o y.npy" % X)
case("err-run-files",
     "run --variant simple in/nothing.npy -o y.npy", "run --variant simple %s -o nodir/y.npy" % X,
     "run --variant simple in/x_i4.npy -o y.npy", "run --variant simple in/x_d16.npy -o y.npy",
     "run --variant simple in/empty.npy -o y.npy", "run --variant simple in/text.npy -o y.npy",
     "run --variant simple td/npz/savez.npz -o y.npy")
case("err-run-masks", "run --variant full --mask in/mask_t49.npy %s -o y.npy" % X,
     "run --variant full --mask in/mask_f4_t50.npy %s -o y.npy" % X,
     "run --variant full --mask in/nothing.npy %s -o y.npy" % X)
case("err-run-weights",
     "run --variant full --weights in/w_chain.safetensors %s -o y.npy" % X,
     "run --variant full --weights in/w_dup.safetensors %s -o y.npy" % X,
     "run --variant full --weights in/w_short_bias.safetensors %s -o y.npy" % X,
     "run --variant full --weights in/w_prefix.safetensors %s -o y.npy" % X,
     "run --variant full --weights in/w_prefix.safetensors --prefix blocks.1.attn. %s -o y.npy" % X,
     "run --variant full --weights in/w_f16.safetensors in/x_b2_t50_d15.npy -o y.npy",
     "run --variant full --weights in/text.safetensors %s -o y.npy" % X,
     "run --variant full --weights in/nothing.safetensors %s -o y.npy" % X,
     "run --variant local --window 4 --weights in/w_conv_h4_s3.safetensors %s -o y.npy" % X)
case("err-run-operator", "run --variant full in/qkv_badk.safetensors -o y.npy",
     "run --variant local --window 3 in/qkv_heads_b2_t40_c16.safetensors -o y.npy")
case("err-run-limits", "run --variant local --window 3 --strict in/x_nan_t20_d8.npy -o y.npy",
     "run --variant local --window 3 --max-memory 10K %s -o y.npy" % X)

# ---------------------------------------------------------------- aft model, aft generate

case("model-seq", "model --weights %s td/model/seq_tokens.npy -o l.npy" % MODEL)
case("model-batch", "model --weights %s --threads 2 td/model/bt_tokens.npy -o l.npy" % MODEL)
case("model-tbd", "model --weights %s --layout tbd --threads 1 td/model/tb_tokens.npy -o l.npy" % MODEL)
case("model-i8-stdout", "model --weights %s in/tok_t64.npy" % MODEL)
case("model-stdin", "model --weights %s --layout tbd - -o l.npy < in/tok_t30_b2.npy" % MODEL)
case("model-t256", "model --weights %s in/tok_t256.npy -o l.npy" % MODEL)
case("model-window32", "model --weights %s --window 32 in/tok_b2_t30.npy -o l.npy" % MODEL)
case("model-reference", "model --weights %s --impl reference in/tok_b2_t30.npy -o l.npy" % MODEL)
case("model-f32-npz", "convert --dtype f32 -o m.npz %s" % MODEL, "model --weights m.npz in/tok_t64.npy -o l.npy")
case("err-model", *["model --weights %s %s -o l.npy" % (MODEL, t) for t in (
    "in/tok_oob.npy", "in/tok_neg.npy", "in/tok_f4.npy", "in/tok_t257.npy", "--window 16 in/tok_t64.npy",
    "--layout xyz in/tok_t64.npy", "in/nothing.npy")],
     "model in/tok_t64.npy -o l.npy", "model --weights td/torch/rish_full/weights.safetensors in/tok_t64.npy -o l.npy")

G = "generate --weights %s" % MODEL
case("gen-greedy", "%s --prompt 'It is ' -n 60 --greedy" % G)
case("gen-greedy-past-context", "%s --prompt 'The computer ' -n 300 --greedy --threads 2" % G)
case("gen-temperature-0", "%s --prompt 'It is ' -n 40 --temperature 0" % G)
case("gen-seed0", "%s --prompt 'It is ' -n 80" % G)
case("gen-seed1-t08", "%s --prompt 'It is ' -n 80 --temperature 0.8 --seed 1" % G)
case("gen-top-k5", "%s --prompt 'A ' -n 80 --top-k 5 --seed 2" % G)
case("gen-top-k1", "%s --prompt 'A ' -n 30 --top-k 1 --seed 9 --temperature 1.5" % G)
case("gen-top-k-all", "%s --prompt 'A ' -n 30 --top-k 500 --seed 3" % G)
case("gen-n0", "%s --prompt 'Just the prompt' -n 0" % G)
case("gen-vocab", "%s --prompt 'It' -n 30 --vocab in/vocab.json --seed 4" % G)
case("gen-timing", "%s --prompt 'It is ' -n 20 --greedy --timing t.json" % G, keys=("t.json",))
case("err-gen", *["%s %s" % (G, opts) for opts in (
    "--prompt 'It' --greedy --temperature 0.5", "--prompt 'It\u00e4 is' -n 5", "--prompt '' -n 5",
    "--prompt 'It' -n -1", "--prompt 'It' --temperature -1", "--prompt 'It' --top-k x",
    "--prompt 'It' -n 5 --vocab in/vocab_short.json", "--prompt 'It' -n 5 --vocab in/vocab_dup.json",
    "--prompt 'It' -n 5 --vocab in/vocab_bad.json", "--prompt 'It' -n 5 --vocab in/nothing.json", "-n 5")],
     "generate --weights td/torch/rish_full/weights.safetensors --prompt 'It' -n 5",
     "generate --prompt 'It' -n 5")

# ---------------------------------------------------------------- aft info

NPY_OK = testdata("npy", lambda n: n.endswith(".npy") and not n.startswith("bad_"))
case("info-npy", "info " + " ".join(NPY_OK), "info --json " + " ".join(NPY_OK))
case("info-npy-refused", *["info " + f for f in testdata("npy", lambda n: n.startswith("bad_"))]
     + ["info " + f for f in testdata("npy/numpy")])
NPZ = testdata("npz", lambda n: n.endswith(".npz"))
case("info-npz", *["info " + f for f in NPZ] + ["info --json " + f for f in NPZ]
     + ["info --max-memory 1K td/npz/savez_compressed.npz"])
ST = testdata("st")
case("info-st", "info " + " ".join(ST), "info --json " + " ".join(ST))
TORCH_FILES = ["%s/%s/%s" % (TORCH, d, f) for d in sorted(os.listdir(os.path.join(TESTDATA, "torch")))
               if os.path.isdir(os.path.join(TESTDATA, "torch", d))
               for f in sorted(os.listdir(os.path.join(TESTDATA, "torch", d))) if f.endswith((".npy", ".safetensors"))]
case("info-torch", "info " + " ".join(TORCH_FILES), "info --json " + " ".join(TORCH_FILES))
case("info-model", "info %s td/model/seq_tokens.npy" % MODEL, "info --json %s" % MODEL)
case("info-stdin", "info - < %s" % X, "info --json - < in/mask_t12.npy")
case("info-inputs", "info in/x_b2_t50_d16_be.npy in/x_b2_t50_d16_fortran.npy in/x_b2_t50_d16_v2.npy "
     "in/qkv_t30_c8_deflated.npz in/w_f64.npz in/w_prefix.safetensors in/tok_t64.npy")
case("err-info", "info %s in/nothing.npy %s" % (X, X), "info", "info --bogus %s" % X, "info in/text.npy",
     "info in/text.safetensors", "info in/empty.npy", "info in/vocab.json")

# ---------------------------------------------------------------- the malformed corpus

BAD = testdata("malformed", lambda n: n != "expected.tsv" and not n.endswith(".py"))
BAD_FILES = [f for f in BAD if not os.path.basename(f).startswith("state_")]
case("malformed-info", *["info " + f for f in BAD])
case("malformed-run-input", *["run --variant local --window 2 %s -o y.npy" % f for f in BAD_FILES])
case("malformed-run-weights", *["run --variant full --weights %s %s -o y.npy" % (f, X)
                                for f in BAD_FILES if not os.path.basename(f).startswith("npy_")])
case("malformed-convert", *["convert -o o.safetensors %s" % f for f in BAD])
case("malformed-compare", *["compare %s in/x_t12_d16.npy" % f for f in BAD])
case("malformed-grad", *["grad --variant simple %s -o g.safetensors" % f for f in BAD_FILES[::4]])

# ---------------------------------------------------------------- aft compare

Y2 = ["run --variant local --window 4 %s -o y.npy" % X, "run --variant local --window 4 --impl reference %s -o yr.npy" % X]
case("compare-close", *Y2, "compare y.npy yr.npy", "compare yr.npy y.npy --json")
case("compare-not-close", *Y2, "compare y.npy yr.npy --rtol 0 --atol 0", "compare y.npy yr.npy --rtol 0 --atol 0 --json")
case("compare-tolerances", *Y2, "compare y.npy yr.npy --rtol 1e-7 --atol 1e-9", "compare y.npy yr.npy --atol 1e-3 --rtol 0")
case("compare-stdin", *Y2, "compare - yr.npy < y.npy")
case("compare-shapes", "compare %s in/x_b2_t42_d12.npy" % X, "compare %s in/x_b2_t42_d12.npy --json" % X)
case("compare-dtypes", "compare in/x_b2_t50_d16_f64.npy in/x_b2_t50_d16_f16.npy",
     "compare in/x_b2_t50_d16_be.npy in/x_b2_t50_d16_fortran.npy --json")
case("compare-nan", "compare in/x_nan_t20_d8.npy in/x_nan_t20_d8.npy",
     "compare in/x_nan_t20_d8.npy in/x_nan_t20_d8.npy --equal-nan --json")
case("compare-extreme", "compare in/x_ext_b2_t40_d16.npy in/qkv_ext_b2_t40_c16.safetensors:k",
     "compare in/qkv_ext_b2_t40_c16.safetensors:k in/x_ext_b2_t40_d16.npy --json")
case("compare-tensor-names", "compare td/npz/qkv.npz:q td/npz/qkv.npz:k",
     "compare %s/rish_full/grads.safetensors:input %s/rish_full/x.npy" % (TORCH, TORCH),
     "compare td/st/metadata.safetensors td/st/metadata.safetensors")
case("compare-files", "compare td/npz/weights_rish_full.npz %s/rish_full/weights.safetensors" % TORCH,
     "compare td/npz/weights_rish_full_deflated.npz %s/rish_full/weights_f16.safetensors --json" % TORCH,
     "compare %s/rish_full/grads.safetensors %s/rish_local/grads.safetensors" % (TORCH, TORCH),
     "compare %s/labml_local/weights.safetensors %s/labml_local/grads.safetensors --json" % (TORCH, TORCH),
     "compare %s/rish_full/weights.safetensors %s/rish_full/weights_bf16.safetensors --rtol 1e-2 --atol 1e-3" % (TORCH, TORCH))
case("compare-grads-vs-torch", "grad --weights %s/rish_local/weights.safetensors --variant local --window 3 "
     "--threads 1 %s/rish_local/x.npy --dy %s/rish_local/dy.npy -o g.safetensors" % (TORCH, TORCH, TORCH),
     "compare g.safetensors %s/rish_local/grads.safetensors --rtol 1e-4 --atol 1e-5" % TORCH,
     "compare g.safetensors %s/rish_local/grads.safetensors --json" % TORCH)
case("err-compare", "compare %s" % X, "compare %s %s --rtol -1" % (X, X), "compare %s %s --atol x" % (X, X),
     "compare %s %s --bogus" % (X, X), "compare %s in/nothing.npy" % X,
     "compare %s/rish_full/grads.safetensors %s/rish_full/x.npy" % (TORCH, TORCH),
     "compare td/npz/qkv.npz:zz %s" % X, "compare td/npz/savez_compressed.npz td/npz/savez.npz --max-memory 1K")

# ---------------------------------------------------------------- aft mask

case("mask-text", "mask --len 7 --window 3", "mask --len 7 --window 3 --causal")
case("mask-edges", "mask --len 1 --window 1", "mask --len 5 --window 0", "mask --len 4 --window 9 --causal")
case("mask-json", "mask --len 6 --window 2 --format json", "mask --len 6 --window 2 --causal --format json",
     "mask --len 6 --window 2 --causal --json")
case("mask-npy", "mask --len 50 --window 5 --format npy -o m.npy",
     "mask --len 12 --window 4 --causal --format npy -o mc.npy", "mask --len 3 --window 2 --format npy")
case("mask-file-text", "mask --len 9 --window 2 -o m.txt")
case("mask-used", "mask --len 50 --window 7 --format npy -o m.npy",
     "run --variant full --mask m.npy --threads 1 %s -o y.npy" % X)
case("err-mask", "mask --len 0 --window 2", "mask --len 3", "mask --window 2", "mask --len 3 --window 1 --format xml",
     "mask --len 3 --window -2", "mask --len 3 --window 1 --bogus", "mask --len 3 --window 1 -o nodir/m.txt")

# ---------------------------------------------------------------- aft convert

case("convert-pack-st", "convert -o o.safetensors a=%s b=in/mask_t12.npy in/tok_t64.npy --metadata format=pt "
     "--metadata note=golden" % X, "info o.safetensors")
case("convert-pack-npz", "convert -o o.npz in/x_t12_d16.npy in/tok_b2_t30.npy m=in/mask_t50_u1.npy", "info o.npz")
case("convert-extract", "convert -o w.npy %s/rish_full/weights.safetensors:wbias" % TORCH,
     "convert -o q.npy td/npz/qkv.npz:q", "convert -o f2.npy td/npz/savez_compressed.npz:f2")
case("convert-st-to-npz", "convert -o o.npz %s/labml_local/weights.safetensors" % TORCH)
case("convert-npz-to-st", "convert -o o.safetensors td/npz/weights_rish_local_deflated.npz --metadata from=npz")
case("convert-dtype-f16", "convert --dtype f16 -o x16.npy %s" % X, "convert --dtype f16 -o e16.npy in/x_ext_b2_t40_d16.npy")
case("convert-dtype-bf16", "convert --dtype bf16 -o w.safetensors %s/rish_full/weights.safetensors" % TORCH,
     "convert --dtype bf16 -o x.safetensors x=in/x_nan_t20_d8.npy")
case("convert-dtype-f64", "convert --dtype f64 -o x64.npy %s" % X, "convert --dtype f64 -o w.npz in/w_prefix.safetensors")
case("convert-dtype-f32", "convert --dtype f32 -o w.safetensors %s/rish_full/weights_bf16.safetensors" % TORCH,
     "convert --dtype f32 -o x.npy in/x_b2_t50_d16_f16.npy", "convert --dtype f32 -o b.npy in/x_b2_t50_d16_be.npy")
case("convert-keeps-ints", "convert --dtype f16 -o o.safetensors in/tok_t64.npy in/mask_t12.npy %s" % X)
case("convert-format", "convert --format npz -o o.bin %s" % X, "convert --format npy -o q.bin td/npz/qkv.npz:q",
     "convert --format safetensors -o s.bin td/npz/qkv.npz")
case("convert-stdio", "convert --dtype f16 - < %s" % X, "convert -o x.safetensors x=- < in/x_t12_d16.npy")
case("convert-fixtures", "convert -o all.safetensors td/st/dtypes.safetensors", "convert -o z.npz td/npz/zip64.npz",
     "convert -o s.safetensors td/npz/savez.npz", "convert -o u.safetensors td/st/unaligned.safetensors")
case("convert-model-f16-roundtrip", "convert --dtype f32 -o m32.safetensors %s" % MODEL,
     "convert --dtype f16 -o m16.safetensors m32.safetensors", "compare m16.safetensors %s" % MODEL)
case("err-convert", "convert", "convert --dtype f99 %s" % X, "convert --dtype bf16 -o o.npy %s" % X,
     "convert -o o.npz %s/rish_full/weights_bf16.safetensors" % TORCH, "convert -o o.npz a/b=%s" % X,
     "convert -o o.safetensors a=%s a=%s" % (X, X), "convert -o o.safetensors td/npz/qkv.npz:zz",
     "convert -o o.npy td/npz/qkv.npz", "convert --metadata nokey -o o.safetensors %s" % X,
     "convert --format xml %s" % X, "convert -o o.safetensors in/nothing.npy", "convert -o nodir/o.npy %s" % X)

# ---------------------------------------------------------------- aft bench: exit status and JSON keys only

B = "bench --seq-len 64 --d-model 16 --repeat 1 --no-ceiling --threads 1"
case("bench-json", "%s --variant full,local,simple,conv --window 4 --heads 2 --json" % B, keys=("stdout",))
case("bench-json-causal-batch", "%s --variant local --causal --batch 2 --d-hidden 24 --json" % B, keys=("stdout",))
case("bench-grad", "%s --variant local,simple --window 4 --grad --json" % B, keys=("stdout",))
case("bench-stream", "%s --variant local --window 4 --causal --stream --chunk 16 --json" % B, keys=("stdout",))
case("bench-grid", "bench --grid 4,4 --d-model 8 --variant local,conv --window 2 --heads 2 --repeat 1 --no-ceiling --json",
     keys=("stdout",))
case("bench-impl-both", "%s --variant full,local --window 4 --impl both --json" % B, keys=("stdout",))
case("bench-generate", "bench --generate --seq-len 8 --repeat 1 --threads 1 --weights %s --json" % MODEL, keys=("stdout",))
case("bench-table", "%s --variant local,simple --window 4" % B, ignore=("stdout",))
case("err-bench", "bench --variant nope", "bench --seq-len 0", "bench --bogus", "bench --repeat x",
     "bench --generate --weights in/nothing.safetensors --seq-len 4 --repeat 1")

# ---------------------------------------------------------------- help, version, the command table

case("version", "--version")
case("help", "--help", "-h", "help")
case("help-commands", *["%s %s" % (cmd, h) for cmd in ("info", "run", "grad", "mask", "compare", "convert", "model",
                                                       "generate", "bench") for h in ("--help", "-h")]
     + ["help " + cmd for cmd in ("run", "grad", "convert")])
case("quiet", "--quiet info %s" % X, "-q mask --len 3 --window 1", "info -q %s" % X)
case("err-commands", "", "bogus", "help bogus", "--bogus", "run --help --bogus")

# ---------------------------------------------------------------- under mpirun: only aft's own lines of stderr

case("mpi-local-causal", "run --variant local --window 4 --causal --threads 1 %s -o y.npy" % X, mpi=2)
case("mpi-full", "run --variant full --threads 1 %s -o y.npy" % X, mpi=2)
case("mpi-conv-weights", "run --variant conv --weights in/w_conv_h4_s3.safetensors --threads 1 %s -o y.npy" % X, mpi=2)
case("mpi-simple-tbd", "run --variant simple --causal --layout tbd --threads 1 in/x_t20_b3_d16.npy -o y.npy", mpi=2)
case("mpi-timing", "run --variant local --window 3 --threads 1 --timing t.json %s -o y.npy" % X, keys=("t.json",), mpi=2)
case("mpi-errors", "run --variant local --window 4 --causal - -o y.npy < %s" % X,
     "run --variant local --window 4 %s" % X, "run --variant full in/nothing.npy -o y.npy", mpi=2)
