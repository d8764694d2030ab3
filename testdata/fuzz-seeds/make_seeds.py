#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets (fuzz/) into
testdata/fuzz-seeds/TARGET/.

    testdata/fuzz-seeds/make_seeds.py

Standard library only. Seeds are small valid files, so the fuzzer starts from
inputs that get deep into the readers; the malformed corpus in
testdata/malformed/ is passed to every target as a second seed directory by
`make fuzz`, so it is not copied here.

  fuzz_npy           a selection of testdata/npy/ fixtures: every version,
                     both orders, both byte orders, empty, scalar, 32 dims
  fuzz_safetensors   the small testdata/st/ fixtures
  fuzz_npz           the small testdata/npz/ archives: np.savez and
                     np.savez_compressed of every dtype, data descriptors,
                     zip64 records, code page 437 names, an empty archive,
                     a layer's weights (stored and deflated)
  fuzz_weights       two PyTorch-made layers from testdata/torch/ and small
                     layers written here, one per naming scheme aft resolves
                     (query|to_q ..., pos_bias|wbias, pos_bias_u + _v, a conv
                     bias of one or two rows, a prefix, F16/BF16/F64 weights)
  fuzz_model         small models in labml's state_dict names, one per
                     variant aft finds (local by a window in the metadata,
                     full, full factored, conv, simple without positional
                     encodings), with and without a vocabulary, F32 and F16

TARGET/found/ is not made here: it holds inputs the fuzzers found that reach
code these seeds do not (kept with `make fuzz-merge`, named by their SHA-1),
so that `make fuzz-regress` replays them without fuzzing anew.
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.dirname(HERE)

NPY_SEEDS = [
    "scalar_f4.npy", "scalar_b1.npy", "scalar_be_f8.npy", "vec5_f8.npy", "vec5_F_i4.npy",
    "v1_C_le_f4.npy", "v1_F_be_i2.npy", "v2_C_be_u8.npy", "v2_F_le_f2.npy", "v3_C_le_i8.npy",
    "v3_F_any_u1.npy", "empty_0x3.npy", "empty_2x0x4_u8.npy", "empty_3x0_be_i2.npy",
    "dims32_u1.npy", "t2x1x3x2_F_f4.npy", "pad64_f4.npy", "mat3x5_F_be_i2.npy",
]
ST_SEEDS = [
    "dtypes.safetensors", "empty.safetensors", "halfs.safetensors", "metadata.safetensors",
    "only_zero_size.safetensors", "scalars.safetensors", "unaligned.safetensors",
    "zero_size.safetensors", "written_by_aft.safetensors",
]
NPZ_SEEDS = [
    "savez.npz", "savez_compressed.npz", "descriptor.npz", "zip64.npz", "names.npz", "empty.npz",
    "writer_expect.npz", "qkv.npz", "weights_rish_simple.npz", "weights_rish_simple_deflated.npz",
]
TORCH_SEEDS = [
    ("labml_local/weights.safetensors", "labml_local.safetensors"),
    ("rish_full/weights_f16.safetensors", "rish_full_f16.safetensors"),
]

# element encoders for the dtypes used below (F16/BF16 values are exact
# small halves, written as their bit patterns)
PACK = {"F32": "<f", "F64": "<d"}
HALF_BITS = {0.0: 0x0000, 0.5: 0x3800, -0.5: 0xB800, 1.0: 0x3C00, -1.0: 0xBC00, 0.25: 0x3400}
BF16_BITS = {0.0: 0x0000, 0.5: 0x3F00, -0.5: 0xBF00, 1.0: 0x3F80, -1.0: 0xBF80, 0.25: 0x3E80}


def encode(dtype, values):
    if dtype in PACK:
        return b"".join(struct.pack(PACK[dtype], v) for v in values)
    bits = HALF_BITS if dtype == "F16" else BF16_BITS
    return b"".join(struct.pack("<H", bits[v]) for v in values)


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape); values cycle through a few
    exact numbers so every dtype can hold them."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    cycle = [0.5, -0.5, 1.0, 0.0, 0.25, -1.0]
    for name, dtype, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        blob = encode(dtype, [cycle[i % len(cycle)] for i in range(n)])
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


def layer(q="query", k="key", v="value", o="output", d=2, c=2, kc=None, dtype="F32",
          bias=True, prefix="", extra=()):
    """(name, dtype, shape) of a layer's projections: model size d, hidden c,
    key outputs kc (default c)."""
    kc = c if kc is None else kc
    t = []
    for stem, out, inp in ((q, c, d), (k, kc, d), (v, c, d), (o, d, c)):
        t.append((prefix + stem + ".weight", dtype, (out, inp)))
        if bias:
            t.append((prefix + stem + ".bias", dtype, (out,)))
    return t + [(prefix + n, dt, s) for n, dt, s in extra]


WEIGHT_SEEDS = {
    "dense_pos_bias.safetensors": layer(extra=[("pos_bias", "F32", (3, 3))]),
    "to_q_wbias_no_bias.safetensors": layer("to_q", "to_k", "to_v", "project", bias=False,
                                            extra=[("wbias", "F32", (4, 4))]),
    "factored.safetensors": layer(extra=[("pos_bias_u", "F32", (3, 2)), ("pos_bias_v", "F32", (3, 2))]),
    "conv_two_heads.safetensors": layer(d=2, c=4, kc=2, extra=[("pos_bias", "F32", (2, 3))]),
    "conv_one_row.safetensors": layer(extra=[("wbias", "F32", (5,))]),
    "prefixed_f16.safetensors": layer(dtype="F16", prefix="blocks.0.attn.",
                                      extra=[("pos_bias", "F16", (2, 2))]),
    "prefixed_bf16.safetensors": layer(dtype="BF16", prefix="attn.", extra=[("pos_bias", "BF16", (2, 2))]),
    "f64_with_mask.safetensors": layer(dtype="F64", extra=[("pos_bias", "F64", (2, 2)),
                                                           ("local_mask", "F32", (2, 2))]),
}


def model(attn_extra, d=4, c=4, kc=None, f=6, v=5, layers=2, p=8, positions=True, dtype="F32"):
    """(name, dtype, shape) of labml's autoregressive transformer, under its
    state_dict names (lib/aft.h, "the model")"""
    t = [("src_embed.positional_encodings", dtype, (p, 1, d)), ("src_embed.linear.weight", dtype, (v, d))] \
        if positions else [("src_embed.weight", dtype, (v, d))]
    for i in range(layers):
        pre = "encoder.layers.%d." % i
        t += layer(d=d, c=c, kc=kc, dtype=dtype, prefix=pre + "self_attn.", extra=attn_extra)
        t += [(pre + "feed_forward.layer1.weight", dtype, (f, d)), (pre + "feed_forward.layer1.bias", dtype, (f,)),
              (pre + "feed_forward.layer2.weight", dtype, (d, f)), (pre + "feed_forward.layer2.bias", dtype, (d,))]
        t += [(pre + n, dtype, (d,)) for n in ("norm_self_attn.weight", "norm_self_attn.bias",
                                               "norm_ff.weight", "norm_ff.bias")]
    return t + [("encoder.norm.weight", dtype, (d,)), ("encoder.norm.bias", dtype, (d,)),
                ("generator.projection.weight", dtype, (v, d)), ("generator.projection.bias", dtype, (v,))]


VOCAB = json.dumps(["a", "b", " ", "\n", "\u00e9"])
MODEL_SEEDS = {
    "local.safetensors": (model([("pos_bias", "F32", (6, 6))]), {"window": "2", "vocab": VOCAB}),
    "full.safetensors": (model([("pos_bias", "F32", (6, 6))]), {"vocab": VOCAB}),
    "factored.safetensors": (model([("pos_bias_u", "F32", (6, 2)), ("pos_bias_v", "F32", (6, 2))]), {}),
    "conv.safetensors": (model([("pos_bias", "F32", (2, 3))], c=4, kc=2), {"vocab": VOCAB}),
    "simple_no_positions.safetensors": (model([], positions=False, c=6), {}),
    "local_f16.safetensors": (model([("pos_bias", "F16", (4, 4))], dtype="F16", layers=1), {"window": "3"}),
}


def main():
    for target in ("fuzz_npy", "fuzz_npz", "fuzz_safetensors", "fuzz_weights", "fuzz_model"):
        os.makedirs(os.path.join(HERE, target), exist_ok=True)
    for name in NPY_SEEDS:
        shutil.copyfile(os.path.join(TESTDATA, "npy", name), os.path.join(HERE, "fuzz_npy", name))
    for name in ST_SEEDS:
        shutil.copyfile(os.path.join(TESTDATA, "st", name), os.path.join(HERE, "fuzz_safetensors", name))
    for name in NPZ_SEEDS:
        shutil.copyfile(os.path.join(TESTDATA, "npz", name), os.path.join(HERE, "fuzz_npz", name))
    for src, name in TORCH_SEEDS:
        shutil.copyfile(os.path.join(TESTDATA, "torch", src), os.path.join(HERE, "fuzz_weights", name))
    for name, tensors in WEIGHT_SEEDS.items():
        with open(os.path.join(HERE, "fuzz_weights", name), "wb") as f:
            f.write(safetensors(tensors, {"made_by": "make_seeds.py"}))
    for name, (tensors, meta) in MODEL_SEEDS.items():
        with open(os.path.join(HERE, "fuzz_model", name), "wb") as f:
            f.write(safetensors(tensors, dict(meta, made_by="make_seeds.py")))
    print("seeds written under %s" % HERE)


if __name__ == "__main__":
    main()
