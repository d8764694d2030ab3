"""The seeded inputs of `make golden`, written with the standard library only.

make(DIR) writes every file the cases in cases.py name as in/NAME: layer
inputs, masks, dY, the bare operator's q, k, v, weights, token ids and a
vocabulary, plus a few broken files. The values come from splitmix64 with
fixed seeds, so every run writes the same bytes; both binaries read the
same files.
"""
import io
import json
import os
import struct
import zipfile

M64 = (1 << 64) - 1
HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "model", "labml_aft_fortunes.safetensors")


class Rng:
    """splitmix64: the same numbers on every machine and Python version."""

    def __init__(self, seed):
        self.s = seed & M64

    def next64(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def uniform(self, lo, hi, n):
        return [lo + (hi - lo) * ((self.next64() >> 11) * 2.0 ** -53) for _ in range(n)]

    def bools(self, p, n):
        return [(self.next64() >> 11) * 2.0 ** -53 < p for _ in range(n)]

    def ints(self, lo, hi, n):
        return [lo + self.next64() % (hi - lo) for _ in range(n)]


def count(shape):
    n = 1
    for s in shape:
        n *= s
    return n


# ---------------------------------------------------------------- encoding

PACK = {"<f4": "<%df", ">f4": ">%df", "<f8": "<%dd", "<f2": "<%de", "|b1": "%dB",
        "|u1": "%dB", "<i4": "<%di", "<i8": "<%dq"}
ST_DTYPE = {"<f4": "F32", "<f8": "F64", "<f2": "F16", "|b1": "BOOL", "<i4": "I32", "<i8": "I64"}


def raw(descr, values):
    return struct.pack(PACK[descr] % len(values), *values)


def fortran(values, shape):
    """C-order values of an array, reordered into Fortran order (first index fastest)."""
    strides = [count(shape[i + 1:]) for i in range(len(shape))]
    out, idx = [], [0] * len(shape)
    for _ in range(count(shape)):
        out.append(values[sum(i * s for i, s in zip(idx, strides))])
        for d in range(len(shape)):
            idx[d] += 1
            if idx[d] < shape[d]:
                break
            idx[d] = 0
    return out


def npy_bytes(descr, shape, values, order="C", version=1):
    """A .npy as numpy writes it: header padded so the data is 64-byte aligned."""
    if order == "F":
        values = fortran(values, shape)
    shp = "(%d,)" % shape[0] if len(shape) == 1 else "(" + ", ".join(str(s) for s in shape) + ")"
    text = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if order == "F" else "False", shp)
    lenbytes = 2 if version == 1 else 4
    pad = (-(6 + 2 + lenbytes + len(text) + 1)) % 64
    head = (text + " " * pad + "\n").encode("latin1")
    lenfield = struct.pack("<H" if version == 1 else "<I", len(head))
    return b"\x93NUMPY" + bytes([version, 0]) + lenfield + head + raw(descr, values)


def st_bytes(tensors, metadata=None):
    """A .safetensors of (name, descr, shape, values), in the order given."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, descr, shape, values in tensors:
        blob = raw(descr, values)
        header[name] = {"dtype": ST_DTYPE[descr], "shape": list(shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def npz_bytes(tensors, deflate=False):
    """np.savez (stored) or np.savez_compressed (deflated) of (key, descr, shape, values)."""
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", method) as z:
        for key, descr, shape, values in tensors:
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            z.writestr(info, npy_bytes(descr, shape, values))
    return buf.getvalue()


# ---------------------------------------------------------------- the inputs

def layer_weights(rng, prefix, d, h, names=("query", "key", "value", "output"), bias=None, scale=1.0):
    """Linear weights (out, in) and biases uniform in +-1/sqrt(in), then bias."""
    out = []
    for i, name in enumerate(names):
        rows, cols = (d, h) if i == 3 else (h, d)
        lim = scale / cols ** 0.5
        out.append((prefix + name + ".weight", "<f4", (rows, cols), rng.uniform(-lim, lim, rows * cols)))
        out.append((prefix + name + ".bias", "<f4", (rows,), rng.uniform(-lim, lim, rows)))
    return out + list(bias or [])


def model_vocab():
    with open(MODEL, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(json.loads(f.read(n))["__metadata__"]["vocab"])


def make(out):
    os.makedirs(out, exist_ok=True)

    def put(name, data):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)

    def npy(name, shape, lo=-1.0, hi=1.0, seed=None, descr="<f4", **kw):
        rng = Rng(seed if seed is not None else sum(map(ord, name)))
        vals = rng.uniform(lo, hi, count(shape))
        put(name, npy_bytes(descr, shape, vals, **kw))
        return vals

    # layer inputs X, [T, D], [B, T, D], [T, B, D] and grids [B, H, W, D]
    npy("x_t4_d8.npy", (4, 8))
    npy("x_t12_d16.npy", (12, 16))
    x50 = npy("x_b2_t50_d16.npy", (2, 50, 16))
    npy("x_b3_t37_d8.npy", (3, 37, 8))
    npy("x_t100_d128.npy", (100, 128))
    npy("x_t300_d64.npy", (300, 64))
    npy("x_t512_d64.npy", (512, 64))
    npy("x_t2048_d64.npy", (2048, 64))
    x20 = npy("x_t20_b3_d16.npy", (20, 3, 16))
    npy("x_grid_b2_4x5_d8.npy", (2, 4, 5, 8))
    npy("x_b2_t42_d12.npy", (2, 42, 12))
    npy("x_ext_b2_t40_d16.npy", (2, 40, 16), -300.0, 300.0)
    npy("x_b2_t50_d16_f64.npy", (2, 50, 16), descr="<f8", seed=7)
    npy("x_b2_t50_d16_f16.npy", (2, 50, 16), descr="<f2", seed=7)
    npy("x_b2_t50_d16_be.npy", (2, 50, 16), descr=">f4", seed=7)
    npy("x_b2_t50_d16_fortran.npy", (2, 50, 16), order="F", seed=7)
    npy("x_b2_t50_d16_v2.npy", (2, 50, 16), version=2, seed=7)
    npy("x_d16.npy", (16,))
    npy("x_b2_t50_d15.npy", (2, 50, 15))
    put("x_i4.npy", npy_bytes("<i4", (2, 5, 4), list(range(40))))
    nan = Rng(3).uniform(-1, 1, 20 * 8)
    nan[37], nan[90] = float("nan"), float("inf")
    put("x_nan_t20_d8.npy", npy_bytes("<f4", (20, 8), nan))

    # the same sequences in chunks of rows, for --state-in/--state-out
    def rows_btd(vals, b, t, d, lo, hi):
        return [vals[(i * t + r) * d + c] for i in range(b) for r in range(lo, hi) for c in range(d)]
    for tag, lo, hi in (("a", 0, 1), ("b", 1, 8), ("c", 8, 50)):
        put("chunk_%s_b2_d16.npy" % tag, npy_bytes("<f4", (2, hi - lo, 16), rows_btd(x50, 2, 50, 16, lo, hi)))
    for tag, lo, hi in (("a", 0, 5), ("b", 5, 20)):   # tbd: rows are the leading axis
        put("chunk_%s_tbd.npy" % tag, npy_bytes("<f4", (hi - lo, 3, 16), x20[lo * 48:hi * 48]))

    # masks: true = visible, the diagonal always visible
    def mask(name, b, t, p, seed, descr="|b1", causal=False):
        rng = Rng(seed)
        vals = []
        for _ in range(max(b, 1)):
            for i in range(t):
                for j, v in enumerate(rng.bools(p, t)):
                    vis = (j <= i) if causal else (v or i == j)
                    vals.append(int(vis))
        put(name, npy_bytes(descr, (b, t, t) if b else (t, t), vals))
    mask("mask_t50.npy", 0, 50, 0.6, 11)
    mask("mask_b2_t50.npy", 2, 50, 0.4, 12)
    mask("mask_t50_u1.npy", 0, 50, 0.6, 13, descr="|u1")
    mask("mask_causal_t50.npy", 0, 50, 1.0, 0, causal=True)
    mask("mask_t20.npy", 0, 20, 0.5, 14)
    mask("mask_t12.npy", 0, 12, 0.5, 15)
    mask("mask_t300.npy", 0, 300, 0.3, 16)
    mask("mask_t49.npy", 0, 49, 0.5, 17)
    put("mask_none_t12.npy", npy_bytes("|b1", (12, 12), [0] * 144))
    npy("mask_f4_t50.npy", (50, 50), 0.0, 1.0)

    # dL/dY in the outputs' shapes
    npy("dy_b2_t50_d16.npy", (2, 50, 16))
    npy("dy_t12_d16.npy", (12, 16))
    npy("dy_t20_b3_d16.npy", (20, 3, 16))
    npy("dy_grid_b2_4x5_d8.npy", (2, 4, 5, 8))
    npy("dy_b2_t40_c16.npy", (2, 40, 16))
    npy("dy_b2_t49_d16.npy", (2, 49, 16))

    # the bare operator: q, k, v
    def qkv(name, shape, kshape=None, klim=1.0, seed=21, fmt="st"):
        rng = Rng(seed)
        ks = kshape or shape
        t = [("q", "<f4", shape, rng.uniform(-2, 2, count(shape))),
             ("k", "<f4", ks, rng.uniform(-klim, klim, count(ks))),
             ("v", "<f4", shape, rng.uniform(-1, 1, count(shape)))]
        put(name, st_bytes(t) if fmt == "st" else npz_bytes(t, deflate=(fmt == "npz-deflated")))
    qkv("qkv_b2_t40_c16.safetensors", (2, 40, 16))
    qkv("qkv_t30_c8.npz", (30, 8), fmt="npz")
    qkv("qkv_t30_c8_deflated.npz", (30, 8), fmt="npz-deflated")
    qkv("qkv_ext_b2_t40_c16.safetensors", (2, 40, 16), klim=500.0, seed=22)
    qkv("qkv_heads_b2_t40_c16.safetensors", (2, 40, 16), kshape=(2, 40, 4), seed=23)
    qkv("qkv_badk.safetensors", (2, 40, 16), kshape=(2, 39, 16), seed=24)

    # weights: D = 16 and hidden 24 under a prefix; factorised; conv; extreme
    rng = Rng(31)
    put("w_prefix.safetensors", st_bytes(layer_weights(
        rng, "blocks.2.attn.", 16, 24,
        bias=[("blocks.2.attn.pos_bias", "<f4", (64, 64), rng.uniform(-0.5, 0.5, 64 * 64)),
              ("blocks.1.attn.query.weight", "<f4", (2, 2), [1.0, 2.0, 3.0, 4.0])]),
        {"format": "pt"}))
    rng = Rng(32)
    put("w_factor.safetensors", st_bytes(layer_weights(
        rng, "", 16, 16, names=("to_q", "to_k", "to_v", "project"),
        bias=[("pos_bias_u", "<f4", (64, 4), rng.uniform(-0.5, 0.5, 256)),
              ("pos_bias_v", "<f4", (64, 4), rng.uniform(-0.5, 0.5, 256))])))
    rng = Rng(33)
    put("w_conv_h4_s3.safetensors", st_bytes(layer_weights(
        rng, "", 16, 16, bias=[("pos_bias", "<f4", (4, 5), rng.uniform(-1, 1, 20))])))
    rng = Rng(34)
    put("w_conv_s4.npz", npz_bytes(layer_weights(
        rng, "", 12, 12, bias=[("pos_bias", "<f4", (7,), rng.uniform(-1, 1, 7))])))
    rng = Rng(35)
    put("w_ext.safetensors", st_bytes(layer_weights(
        rng, "", 16, 16, scale=30.0, bias=[("pos_bias", "<f4", (64, 64), rng.uniform(-250, 250, 64 * 64))])))
    rng = Rng(36)
    w = layer_weights(rng, "", 16, 16, bias=[("pos_bias", "<f4", (64, 64), rng.uniform(-0.5, 0.5, 64 * 64))])
    put("w_f64.npz", npz_bytes([(n, "<f8", s, v) for n, _, s, v in w], deflate=True))
    put("w_f16.safetensors", st_bytes([(n, "<f2", s, v) for n, _, s, v in w]))
    put("w_nobias.safetensors", st_bytes([t for t in w if not t[0].endswith(".bias")]))
    put("w_short_bias.safetensors", st_bytes(
        [t for t in w if t[0] != "pos_bias"] + [("pos_bias", "<f4", (30, 30), [0.1] * 900)]))
    put("w_chain.safetensors", st_bytes(
        [t if t[0] != "key.weight" else ("key.weight", "<f4", (12, 16), t[3][:192]) for t in w]))
    put("w_dup.safetensors", st_bytes(w + [("to_q.weight", "<f4", (16, 16), w[0][3])]))

    # token ids for the model (V = 113, context 256) and its vocabulary
    tok = Rng(41)
    put("tok_t64.npy", npy_bytes("<i8", (64,), tok.ints(0, 113, 64)))
    put("tok_b2_t30.npy", npy_bytes("<i4", (2, 30), tok.ints(0, 113, 60)))
    put("tok_t30_b2.npy", npy_bytes("<i4", (30, 2), tok.ints(0, 113, 60)))
    put("tok_t256.npy", npy_bytes("<i4", (256,), tok.ints(0, 113, 256)))
    put("tok_t257.npy", npy_bytes("<i4", (257,), tok.ints(0, 113, 257)))
    put("tok_oob.npy", npy_bytes("<i4", (5,), [1, 2, 113, 4, 5]))
    put("tok_neg.npy", npy_bytes("<i8", (3,), [1, -1, 4]))
    npy("tok_f4.npy", (8,), 0.0, 100.0)
    vocab = model_vocab()
    put("vocab.json", json.dumps(vocab).encode())
    put("vocab_short.json", json.dumps(vocab[:50]).encode())
    put("vocab_dup.json", json.dumps(vocab[:-1] + [vocab[0]]).encode())
    put("vocab_bad.json", b'["a", "b", ')

    # files that are not what they claim
    put("empty.npy", b"")
    put("text.npy", b"hello, this is not a numpy file\n")
    put("text.safetensors", b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}")
    put("state_text.safetensors", st_bytes([("x", "<f4", (2,), [1.0, 2.0])], {"aft_state": "1"}))


if __name__ == "__main__":
    import sys
    make(sys.argv[1])
