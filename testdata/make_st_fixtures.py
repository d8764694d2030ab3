#!/usr/bin/python3
"""Writes the .safetensors fixtures under testdata/st/ used by
lib/tests/io/test_safetensors.c, and checks files written by aft's own writer
with an independent reader.

    testdata/make_st_fixtures.py              write the fixtures, then check
                                              testdata/st/written_by_aft.safetensors
    testdata/make_st_fixtures.py --check F    check one file written by aft_st_write

There is no safetensors package here, so files are written by hand from the
format: 8-byte little-endian header size N, N bytes of UTF-8 JSON, the data
buffer. F16 and BF16 bit patterns come from torch, so the C test compares the
library's conversions against torch's.

Values are formulas of the element index i that the C test recomputes; keep
the two in step (see dtype_values below and expect_dtype_value in the test).
"""
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "st")

NUMPY = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BOOL": np.bool_,
    "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "I32": np.int32, "U32": np.uint32, "I64": np.int64, "U64": np.uint64,
}
SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "BOOL": 1, "U8": 1, "I8": 1,
        "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8}


def write_st(path, tensors, metadata=None, pad=True, header_order=None):
    """tensors: list of (name, dtype, shape, raw little-endian bytes), laid
    out in the data buffer in this order. header_order: names in the order
    the JSON header lists them (default: the same)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    entries, offset, blobs = {}, 0, []
    for name, dtype, shape, raw in tensors:
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        assert len(raw) == n * SIZE[dtype], name
        entries[name] = {"dtype": dtype, "shape": list(shape),
                         "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    for name in header_order or [t[0] for t in tensors]:
        header[name] = entries[name]
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if pad:
        text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def le(arr):
    return np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()


def bits16(t):
    """raw bytes of a float16/bfloat16 torch tensor, from its bit pattern"""
    return t.view(torch.int16).numpy().astype("<i2").tobytes()


def dtype_values(dtype, n):
    """The formula the C test recomputes: element i of the tensor of dtype."""
    i = np.arange(n, dtype=np.int64)
    if dtype == "F64":
        return (i - 11) / 3.0
    if dtype == "F32":
        return ((i - 11) / 3.0).astype(np.float32)
    if dtype == "BOOL":
        return i % 3 == 0
    if dtype == "U8":
        return ((i * 37) % 256).astype(np.uint8)
    if dtype == "I8":
        return ((i * 37) % 256 - 128).astype(np.int8)
    if dtype == "I16":
        return (i * 1000 - 12000).astype(np.int16)
    if dtype == "U16":
        return (i * 2700).astype(np.uint16)
    if dtype == "I32":
        return ((i - 12) * 100000007).astype(np.int32)
    if dtype == "U32":
        return (i * 178956970).astype(np.uint32)
    if dtype == "I64":
        return (i - 12) * 1000000000007
    if dtype == "U64":
        return i.astype(np.uint64) * np.uint64(800000000000000000)
    raise ValueError(dtype)


def make_dtypes():
    """One (2, 3, 4) tensor per dtype; F16 and BF16 are torch's rounding of
    the F32 values, with torch's widening back to float32 stored beside."""
    shape, n = (2, 3, 4), 24
    ts = []
    for dt in ["F64", "F32", "BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64"]:
        ts.append((dt.lower(), dt, shape, le(np.asarray(dtype_values(dt, n), dtype=NUMPY[dt]))))
    src = torch.from_numpy(dtype_values("F32", n))
    for dt, tt in [("F16", torch.float16), ("BF16", torch.bfloat16)]:
        half = src.to(tt)
        ts.append((dt.lower(), dt, shape, bits16(half)))
        ts.append((dt.lower() + "_as_f32", "F32", shape, le(half.to(torch.float32).numpy())))
    write_st(os.path.join(OUT, "dtypes.safetensors"), ts, metadata={"format": "pt"})


def make_halfs():
    """Edge values for the half conversions: zeros, ties that must round to
    even, the largest finite values, overflow to inf, subnormals of both
    formats, inf and nan, then seeded random values over a wide range."""
    special = [
        0.0, -0.0, 1.0, -1.0, 0.1, 1.0 / 3.0, -3.14159265, 65504.0, 65519.99, 65520.0,
        1e5, -1e5, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, 2.0 ** -14, 1e-8, 6e-8,
        1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8,
        3.3895314e38, 3.4028235e38, 1e38, 1e-40, -1e-45, 2.0 ** -126,
        float("inf"), float("-inf"), float("nan"),
    ]
    g = torch.Generator().manual_seed(1234)
    rand = torch.randn(97, generator=g) * torch.exp2(torch.randint(-30, 30, (97,), generator=g).float())
    src = torch.cat([torch.tensor(special, dtype=torch.float32), rand.to(torch.float32)])
    n = src.numel()
    ts = [("src", "F32", (n,), le(src.numpy()))]
    for dt, tt in [("F16", torch.float16), ("BF16", torch.bfloat16)]:
        half = src.to(tt)
        ts.append((dt.lower(), dt, (n,), bits16(half)))
        ts.append((dt.lower() + "_as_f32", "F32", (n,), le(half.to(torch.float32).numpy())))
    write_st(os.path.join(OUT, "halfs.safetensors"), ts)


def make_metadata():
    meta = {"format": "pt", "note": "naïve ✓ \"quoted\" back\\slash\nnewline", "empty": ""}
    ts = [("x", "F32", (2,), le(np.array([1.0, 2.0], dtype=np.float32)))]
    write_st(os.path.join(OUT, "metadata.safetensors"), ts, metadata=meta)


def make_zero_size():
    """Zero-size tensors between and before others; the header lists them in
    another order than the data. File order: a b c d e (c and d tie at
    [8, 8] and keep header order)."""
    ts = [
        ("a", "U8", (0,), b""),
        ("b", "F32", (2,), le(np.array([1.5, -2.5], dtype=np.float32))),
        ("c", "F32", (2, 0, 3), b""),
        ("d", "I16", (0,), b""),
        ("e", "I8", (3,), le(np.array([-1, 0, 1], dtype=np.int8))),
    ]
    write_st(os.path.join(OUT, "zero_size.safetensors"), ts, header_order=["e", "c", "a", "d", "b"])
    # only zero-size tensors: the data buffer is empty
    write_st(os.path.join(OUT, "only_zero_size.safetensors"),
             [("z", "F32", (0, 4), b""), ("y", "U64", (3, 0), b"")])
    write_st(os.path.join(OUT, "empty.safetensors"), [])


def make_scalars():
    ts = [
        ("s_f32", "F32", (), le(np.array(3.5, dtype=np.float32))),
        ("s_i64", "I64", (), le(np.array(-42, dtype=np.int64))),
        ("s_bf16", "BF16", (), bits16(torch.tensor(1.5).to(torch.bfloat16).reshape(1))),
    ]
    write_st(os.path.join(OUT, "scalars.safetensors"), ts)


def many_tensor(k):
    """tensor k of many.safetensors: dtype cycles F32, I32, U8; length
    k % 5 + 1; element j is k + j/8, k*1000 + j, (k + j) % 256"""
    n = k % 5 + 1
    j = np.arange(n)
    if k % 3 == 0:
        return "F32", (n,), le((k + j / 8.0).astype(np.float32))
    if k % 3 == 1:
        return "I32", (n,), le((k * 1000 + j).astype(np.int32))
    return "U8", (n,), le(((k + j) % 256).astype(np.uint8))


def make_many():
    """300 tensors t000..t299 laid out in index order; the header lists them
    in the order k * 7 % 300, so file order must come from the offsets."""
    ts = [("t%03d" % k,) + many_tensor(k) for k in range(300)]
    order = ["t%03d" % (k * 7 % 300) for k in range(300)]
    write_st(os.path.join(OUT, "many.safetensors"), ts, header_order=order)


def make_unaligned():
    """No padding, and a 1-byte tensor first: the F64 and F32 data sit at odd
    addresses in the mapping."""
    ts = [
        ("u", "U8", (1,), b"\x07"),
        ("d", "F64", (3,), le(np.array([0.5, -1.25, 1e300], dtype=np.float64))),
        ("f", "F32", (2,), le(np.array([3.25, -0.125], dtype=np.float32))),
    ]
    write_st(os.path.join(OUT, "unaligned.safetensors"), ts, pad=False)


# ---------------------------------------------------------------- checking aft's writer

def read_st(path):
    """An independent reader: parse the layout with json and numpy only and
    check the rules the C reader enforces."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "header runs past the file"
    assert (8 + n) % 8 == 0, "header not padded to a multiple of 8"
    text = raw[8:8 + n].decode("utf-8")
    assert text.rstrip(" ") == text.strip(), "padding other than trailing spaces"
    pairs = json.loads(text, object_pairs_hook=lambda kv: kv)
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), "duplicate keys"
    header = dict(pairs)
    meta = dict(header.pop("__metadata__", []))
    if "__metadata__" in keys:
        assert keys[0] == "__metadata__", "__metadata__ not first"
    data = raw[8 + n:]
    out, end = {}, 0
    for name, info in header.items():   # the writer lays tensors out in header order
        info = dict(info)
        assert set(info) == {"dtype", "shape", "data_offsets"}, name
        b, e = info["data_offsets"]
        assert b == end, "%s: not contiguous" % name
        count = int(np.prod(info["shape"], dtype=np.int64)) if info["shape"] else 1
        assert e - b == count * SIZE[info["dtype"]], "%s: size" % name
        end = e
        blob = data[b:e]
        if info["dtype"] == "BF16":
            bits = torch.from_numpy(np.frombuffer(blob, dtype="<i2").copy())
            arr = bits.view(torch.bfloat16).to(torch.float32).numpy()
        else:
            arr = np.frombuffer(blob, dtype=np.dtype(NUMPY[info["dtype"]]).newbyteorder("<"))
        out[name] = (info["dtype"], tuple(info["shape"]), arr.reshape(info["shape"]))
    assert end == len(data), "trailing bytes after the last tensor"
    return meta, out


def check_written(path):
    """written_by_aft.safetensors holds, as the C test writes it: metadata
    {"writer": "aft", "note": "tab\\there \"q\" é"}, one (2, 3, 4) tensor per
    dtype with the formula values (F16/BF16: narrowed from the F32 values by
    aft), an F32 scalar 3.5 and an empty (0, 3) I32."""
    meta, ts = read_st(path)
    assert meta == {"writer": "aft", "note": "tab\there \"q\" é"}, meta
    for dt in ["F64", "F32", "BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64"]:
        got_dt, shape, arr = ts[dt.lower()]
        assert got_dt == dt and shape == (2, 3, 4), dt
        want = np.asarray(dtype_values(dt, 24), dtype=NUMPY[dt]).reshape(2, 3, 4)
        assert np.array_equal(arr, want), dt
    src = torch.from_numpy(dtype_values("F32", 24)).reshape(2, 3, 4)
    got = torch.from_numpy(ts["f16"][2].astype(np.float32))
    assert torch.equal(got, src.to(torch.float16).to(torch.float32)), "f16 differs from torch"
    got = torch.from_numpy(ts["bf16"][2])
    assert torch.equal(got, src.to(torch.bfloat16).to(torch.float32)), "bf16 differs from torch"
    assert ts["scalar"][1] == () and ts["scalar"][2] == np.float32(3.5)
    assert ts["empty"][0] == "I32" and ts["empty"][1] == (0, 3)
    print("%s: ok (%d tensors, %d metadata)" % (path, len(ts), len(meta)))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check_written(sys.argv[2])
        return
    os.makedirs(OUT, exist_ok=True)
    make_dtypes()
    make_halfs()
    make_metadata()
    make_zero_size()
    make_scalars()
    make_many()
    make_unaligned()
    print("wrote fixtures in %s" % OUT)
    written = os.path.join(OUT, "written_by_aft.safetensors")
    if os.path.exists(written):
        check_written(written)


if __name__ == "__main__":
    main()
