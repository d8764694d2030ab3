#!/usr/bin/python3
"""Writes the .npz fixtures under testdata/npz/ for lib/tests/io/test_npz.c and
the CLI tests, each checked with np.load; the outputs are committed, so the C
tests never need Python.

    testdata/make_npz_fixtures.py    (Debian's python3 with numpy)

Values are the formulas of make_npy_fixtures.py (value(code, i) of the
element's C-order flat index i), which test_npy.c and test_npz.c recompute.

  savez.npz, savez_compressed.npz
        np.savez / np.savez_compressed of one array per dtype code (key =
        code, shape (2, 3, 4)), plus "be_f8" (big-endian), "F_i2" (Fortran
        order), "scalar_u8" (0-d), "empty_f4" (shape (0, 3)) and
        "blocks.0.attn.query.weight" (a dotted key, f4 (3, 4))
  empty.npz         np.savez with no array
  descriptor.npz    np.savez to a pipe-like file that cannot seek: Python's
                    zipfile then puts CRC and sizes in data descriptors after
                    each member (flag bit 3), with zeros in the local headers
  zip64.npz         members "a" (f4 (2, 3, 4)) and "b" (i8 (2, 3, 4)), stored,
                    with every size and offset in zip64 records (central
                    directory extras, zip64 end record and locator) as in an
                    archive over 4 GiB; written by hand from the zip format
  names.npz         a member named in UTF-8 with the flag, one in code page
                    437 (no flag: byte 0x82 is 'é'), one named by every byte
                    from 0x80 to 0xff in code page 437; names.txt holds the
                    keys np.load reports, one a line
  writer_expect.npz what aft_npz_write must write, byte for byte, for keys
                    "f4", "i2", "blocks.0.attn.query.weight" and "b1" (the
                    arrays above): Python's zipfile with fixed dates, one
                    stored member each holding numpy's .npy bytes
  writer_zip64_expect.npz  the same two members as zip64.npz, laid out as
                    aft's writer does when it is told to use zip64 records
                    everywhere (lib/tests/io/test_npz.c forces it)
  qkv.npz           np.savez_compressed of q, k, v (f4 (2, 5, 4)) for the bare
                    operator; y_simple.npy its output for --variant simple,
                    computed here in float64: sigmoid(q) * sum_t' softmax_t'(k)
                    v, per batch and channel
  weights_<case>.npz, weights_<case>_deflated.npz  the weights of the
                    PyTorch fixture testdata/torch/<case>/weights.safetensors,
                    as np.savez and np.savez_compressed would store them
"""
import io
import json
import os
import struct
import sys
import zipfile
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "npz")
sys.path.insert(0, HERE)
from make_npy_fixtures import make, npy_bytes  # noqa: E402

CODES = ["f2", "f4", "f8", "b1", "u1", "i1", "i2", "u2", "i4", "u4", "i8", "u8"]


def path(name):
    return os.path.join(OUT, name)


def arrays():
    d = {code: make(code, (2, 3, 4)) for code in CODES}
    d["be_f8"] = make("f8", (2, 3, 4), ">")
    d["F_i2"] = np.asfortranarray(make("i2", (3, 5)))
    d["scalar_u8"] = make("u8", ())
    d["empty_f4"] = make("f4", (0, 3))
    d["blocks.0.attn.query.weight"] = make("f4", (3, 4))
    return d


def check(name, want):
    """np.load must give exactly these arrays, keys in this order"""
    with np.load(path(name), allow_pickle=False) as z:
        assert list(z.files) == list(want), (name, z.files)
        for k, v in want.items():
            got = z[k]
            assert got.dtype == v.dtype and got.shape == v.shape and np.array_equal(got, v), (name, k)


class NoSeek(io.RawIOBase):
    """a file that can only be written forward, like a pipe"""

    def __init__(self, f):
        self.f = f

    def writable(self):
        return True

    def write(self, b):
        return self.f.write(b)


# ---------------------------------------------------------------- zip by hand

def u16(v):
    return struct.pack("<H", v)


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def zip64_archive(members):
    """stored members, every size and offset in zip64 form, as aft's writer
    forced to zip64 lays them out (see lib/io/npz.c, aft_npz_writer_*)"""
    out = b""
    entries = []
    for name, data in members:
        nb = name.encode()
        crc = zlib.crc32(data)
        off = len(out)
        out += (u32(0x04034b50) + u16(45) + u16(0) + u16(0) + u16(0) + u16(0x21) + u32(crc)
                + u32(0xffffffff) + u32(0xffffffff) + u16(len(nb)) + u16(20)
                + nb + u16(1) + u16(16) + u64(len(data)) + u64(len(data)) + data)
        entries.append((nb, crc, len(data), off))
    cd_off = len(out)
    for nb, crc, size, off in entries:
        extra = u16(1) + u16(24) + u64(size) + u64(size) + u64(off)
        out += (u32(0x02014b50) + u16(0x0300 | 45) + u16(45) + u16(0) + u16(0) + u16(0) + u16(0x21)
                + u32(crc) + u32(0xffffffff) + u32(0xffffffff) + u16(len(nb)) + u16(len(extra)) + u16(0)
                + u16(0) + u16(0) + u32(0o600 << 16) + u32(0xffffffff) + nb + extra)
    cd_size = len(out) - cd_off
    end64 = len(out)
    n = len(entries)
    out += (u32(0x06064b50) + u64(44) + u16(0x0300 | 45) + u16(45) + u32(0) + u32(0) + u64(n) + u64(n)
            + u64(cd_size) + u64(cd_off))
    out += u32(0x07064b50) + u32(0) + u64(end64) + u32(1)
    out += u32(0x06054b50) + u16(0) + u16(0) + u16(0xffff) + u16(0xffff) + u32(0xffffffff) + u32(0xffffffff) + u16(0)
    return out


def zipinfo(name):
    zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    zi.external_attr = 0o600 << 16
    zi.create_system = 3
    zi.compress_type = zipfile.ZIP_STORED
    return zi


# ---------------------------------------------------------------- the AFT operator, simple

def aft_simple(q, k, v):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    e = np.exp(k - k.max(axis=1, keepdims=True))          # (B, T, C), softmax over T
    num = (e * v).sum(axis=1, keepdims=True)
    den = e.sum(axis=1, keepdims=True)
    return 1 / (1 + np.exp(-q)) * (num / den)


# ---------------------------------------------------------------- safetensors, read by hand

ST_NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BOOL": "|b1", "U8": "|u1", "I8": "|i1",
            "I16": "<i2", "U16": "<u2", "I32": "<i4", "U32": "<u4", "I64": "<i8", "U64": "<u8"}


def read_safetensors(p):
    with open(p, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    data = b[8 + n:]
    out = {}
    for name, e in h.items():
        if name == "__metadata__":
            continue
        s, t = e["data_offsets"]
        out[name] = np.frombuffer(data[s:t], dtype=ST_NUMPY[e["dtype"]]).reshape(e["shape"])
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(path(f))
    a = arrays()

    np.savez(path("savez.npz"), **a)
    check("savez.npz", a)
    np.savez_compressed(path("savez_compressed.npz"), **a)
    check("savez_compressed.npz", a)
    with zipfile.ZipFile(path("savez_compressed.npz")) as z:
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())

    np.savez(path("empty.npz"))
    check("empty.npz", {})

    small = {"f4": a["f4"], "i2": a["i2"]}
    with open(path("descriptor.npz"), "wb") as f:
        np.savez(NoSeek(f), **small)
    check("descriptor.npz", small)
    with zipfile.ZipFile(path("descriptor.npz")) as z:
        assert all(i.flag_bits & 0x08 for i in z.infolist())

    two = [("a.npy", npy_bytes(a["f4"])), ("b.npy", npy_bytes(a["i8"]))]
    with open(path("zip64.npz"), "wb") as f:
        f.write(zip64_archive(two))
    check("zip64.npz", {"a": a["f4"], "b": a["i8"]})
    with open(path("writer_zip64_expect.npz"), "wb") as f:
        f.write(zip64_archive(two))

    # names: one in UTF-8 with the flag, one in code page 437 without it
    raw = names_archive(a)
    with open(path("names.npz"), "wb") as f:
        f.write(raw)
    with np.load(path("names.npz")) as z:
        keys = list(z.files)
        assert np.array_equal(z[keys[0]], a["u1"]) and np.array_equal(z[keys[1]], a["i1"])
        assert np.array_equal(z[keys[2]], a["u2"])
    with open(path("names.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(keys) + "\n")
    print("names.npz keys:", keys, file=sys.stderr)

    # what aft_npz_write writes: Python's zipfile, dates fixed, stored
    keys = ["f4", "i2", "blocks.0.attn.query.weight", "b1"]
    with zipfile.ZipFile(path("writer_expect.npz"), "w") as z:
        for k in keys:
            z.writestr(zipinfo(k + ".npy"), npy_bytes(a[k]))
    check("writer_expect.npz", {k: a[k] for k in keys})

    # the bare operator's q, k, v and numpy's answer
    rng = np.random.default_rng(20261125)
    qkv = {n: rng.standard_normal((2, 5, 4)).astype("<f4") for n in ("q", "k", "v")}
    np.savez_compressed(path("qkv.npz"), **qkv)
    check("qkv.npz", qkv)
    np.save(path("y_simple.npy"), aft_simple(qkv["q"], qkv["k"], qkv["v"]))

    # the PyTorch fixtures' weights, as numpy stores them
    torch_dir = os.path.join(HERE, "torch")
    for case in sorted(os.listdir(torch_dir)):
        w = os.path.join(torch_dir, case, "weights.safetensors")
        if not os.path.isfile(w):
            continue
        t = read_safetensors(w)
        np.savez(path("weights_%s.npz" % case), **t)
        np.savez_compressed(path("weights_%s_deflated.npz" % case), **t)
        check("weights_%s.npz" % case, t)
        check("weights_%s_deflated.npz" % case, t)


def names_archive(a):
    """names.npz written by hand: member 1 "café.npy" in UTF-8 with the
    flag, member 2 "été.npy" in code page 437 without it"""
    members = [("caf\u00e9.npy".encode(), 0x800, npy_bytes(a["u1"])),
               ("\u00e9t\u00e9.npy".encode("cp437"), 0, npy_bytes(a["i1"])),
               (bytes(range(0x80, 0x100)) + b".npy", 0, npy_bytes(a["u2"]))]
    out, cd = b"", b""
    for nb, flag, data in members:
        crc = zlib.crc32(data)
        off = len(out)
        out += (u32(0x04034b50) + u16(20) + u16(flag) + u16(0) + u16(0) + u16(0x21) + u32(crc)
                + u32(len(data)) + u32(len(data)) + u16(len(nb)) + u16(0) + nb + data)
        cd += (u32(0x02014b50) + u16(0x0314) + u16(20) + u16(flag) + u16(0) + u16(0) + u16(0x21) + u32(crc)
               + u32(len(data)) + u32(len(data)) + u16(len(nb)) + u16(0) + u16(0) + u16(0) + u16(0)
               + u32(0o600 << 16) + u32(off) + nb)
    n = len(members)
    end = u32(0x06054b50) + u16(0) + u16(0) + u16(n) + u16(n) + u32(len(cd)) + u32(len(out)) + u16(0)
    return out + cd + end


if __name__ == "__main__":
    main()
