#!/usr/bin/python3
"""Writes the .npy fixtures for lib/tests/test_npy.c into testdata/npy/.

Run from anywhere: ./testdata/make_npy_fixtures.py  (Debian's python3 with numpy).
The outputs are committed, so the C tests never need Python.

Every valid fixture holds values that are a formula of the element's C-order
flat index i (see value() below); test_npy.c recomputes the same formulas
independently. Keep the two in step. All arrays have at most 24 elements so
each formula stays inside its dtype's range.
"""
import io
import os
import sys

import numpy as np
from numpy.lib import format as npf

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "npy")

CODES = ["f2", "f4", "f8", "b1", "u1", "i1", "i2", "u2", "i4", "u4", "i8", "u8"]


def value(code, i):
    """The value stored at C-order flat index i (0 <= i < 24) for a dtype."""
    if code[0] == "f":
        return i * 0.5 - 3
    return {
        "b1": i % 3 == 0,
        "u1": (i * 37 + 5) % 256,
        "i1": (i * 37 + 5) % 256 - 128,
        "i2": (i - 12) * 2730,
        "u2": i * 2849 + 3,
        "i4": (i - 12) * 178956970,
        "u4": i * 186737708 + 1,
        "i8": (i - 12) * 768614336404564650,
        "u8": i * 802032351030850070 + 5,   # i = 23 gives 2**64 - 1
    }[code]


def make(code, shape, byteorder="<"):
    """A C-order array of the given shape filled with value(code, i)."""
    n = int(np.prod(shape, dtype=np.int64))
    assert n <= 24
    size = int(code[1])
    dt = np.dtype(("|" if size == 1 else byteorder) + code)
    flat = np.array([value(code, i) for i in range(n)], dtype=object)
    return np.array(flat.tolist(), dtype=dt).reshape(shape)


def npy_bytes(arr, version=(1, 0), allow_pickle=False):
    f = io.BytesIO()
    npf.write_array(f, arr, version=version, allow_pickle=allow_pickle)
    return f.getvalue()


def patch(data, old, new):
    """Replaces one occurrence of old in the header by new of the same length."""
    assert len(old) == len(new) and data.count(old) == 1, (old, new)
    return data.replace(old, new)


def save(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def check_loads(name, expect):
    """numpy itself must read a valid fixture back as the intended array."""
    got = np.load(os.path.join(OUT, name))
    assert got.dtype == expect.dtype.newbyteorder("=") or got.dtype == expect.dtype, name
    assert got.shape == expect.shape and np.array_equal(got, expect), name


def header(d, version=1, pad_to=64):
    """Raw preamble + header for a handwritten header text d (no newline)."""
    text = d.encode("latin1")
    lenbytes = 2 if version == 1 else 4
    total = 8 + lenbytes + len(text) + 1
    pad = (-total) % pad_to
    text += b" " * pad + b"\n"
    return b"\x93NUMPY" + bytes([version, 0]) + len(text).to_bytes(lenbytes, "little") + text


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".npy"):
            os.remove(os.path.join(OUT, f))

    # Every version x memory order x byte order x dtype, shape (2, 3, 4).
    # 1-byte types have no byte order ('|'): one file, named "any".
    for ver in (1, 2, 3):
        for order in ("C", "F"):
            for code in CODES:
                for bo in ("le", "be"):
                    if int(code[1]) == 1 and bo == "be":
                        continue
                    arr = make(code, (2, 3, 4), "<" if bo == "le" else ">")
                    if order == "F":
                        arr = np.asfortranarray(arr)
                    data = npy_bytes(arr, version=(ver, 0))
                    assert (b"'fortran_order': True" in data) == (order == "F")
                    name = "v%d_%s_%s_%s.npy" % (ver, order, "any" if int(code[1]) == 1 else bo, code)
                    save(name, data)
                    check_loads(name, arr)

    # 0-d scalars of every dtype, plus one big-endian
    for code in CODES:
        arr = make(code, ())
        save("scalar_%s.npy" % code, npy_bytes(arr))
        check_loads("scalar_%s.npy" % code, arr)
    arr = make("f8", (), ">")
    save("scalar_be_f8.npy", npy_bytes(arr))

    # zero-size arrays; numpy always writes them as C order, so the Fortran
    # one is patched (still a file numpy reads)
    save("empty_0x3.npy", npy_bytes(make("f4", (0, 3))))
    save("empty_0x3_F.npy", patch(npy_bytes(make("f4", (0, 3))), b"False", b"True "))
    save("empty_3x0_be_i2.npy", npy_bytes(make("i2", (3, 0), ">")))
    save("empty_2x0x4_u8.npy", npy_bytes(make("u8", (2, 0, 4))))
    save("empty_0_f8.npy", npy_bytes(make("f8", (0,))))
    for name, shape in [("empty_0x3_F.npy", (0, 3)), ("empty_3x0_be_i2.npy", (3, 0)),
                        ("empty_2x0x4_u8.npy", (2, 0, 4)), ("empty_0_f8.npy", (0,))]:
        assert np.load(os.path.join(OUT, name)).shape == shape

    # 1-D (C and Fortran order are the same thing), 2-D and 4-D Fortran
    save("vec5_f8.npy", npy_bytes(make("f8", (5,))))
    save("vec5_F_i4.npy", patch(npy_bytes(make("i4", (5,))), b"False", b"True "))
    check_loads("vec5_F_i4.npy", make("i4", (5,)))
    arr = np.asfortranarray(make("i2", (3, 5), ">"))
    save("mat3x5_F_be_i2.npy", npy_bytes(arr))
    check_loads("mat3x5_F_be_i2.npy", arr)
    arr = np.asfortranarray(make("f4", (2, 1, 3, 2)))
    save("t2x1x3x2_F_f4.npy", npy_bytes(arr))
    check_loads("t2x1x3x2_F_f4.npy", arr)

    # byte-order characters numpy reads but does not write: '=' (native,
    # taken as little-endian) and '<' / '>' on 1-byte types
    save("eq_i4.npy", patch(npy_bytes(make("i4", (6,))), b"'<i4'", b"'=i4'"))
    save("eq_b1.npy", patch(npy_bytes(make("b1", (6,))), b"'|b1'", b"'=b1'"))
    save("lt_u1.npy", patch(npy_bytes(make("u1", (6,))), b"'|u1'", b"'<u1'"))
    save("gt_i1.npy", patch(npy_bytes(make("i1", (6,))), b"'|i1'", b"'>i1'"))
    for name, code in [("eq_i4.npy", "i4"), ("eq_b1.npy", "b1"), ("lt_u1.npy", "u1"), ("gt_i1.npy", "i1")]:
        check_loads(name, make(code, (6,)))

    # the most dimensions numpy and we allow
    arr = make("u1", (1,) * 30 + (2, 3))
    save("dims32_u1.npy", npy_bytes(arr))
    check_loads("dims32_u1.npy", arr)

    # a shape whose header text (dict plus numpy's growth spaces) plus the
    # preamble and the final '\n' is already a multiple of 64: numpy then pads
    # with a full 64 spaces, not none. Searched over empty arrays.
    found = None
    for k in range(0, 12):
        for digits in range(1, 19):
            shape = (0,) + (1,) * k + (10 ** digits,)
            text = "{'descr': '<f4', 'fortran_order': False, 'shape': %r, }" % (shape,)
            text += " " * (21 - len(repr(shape[0])))
            if (10 + len(text) + 1) % 64 == 0:
                found = shape
                break
        if found:
            break
    assert found
    d = npy_bytes(np.zeros(found, dtype="<f4"))
    assert len(d) == 10 + len(text) + 64 + 1, "numpy did not pad with 64 spaces"
    save("pad64_f4.npy", d)
    print("pad64 shape", found, file=sys.stderr)

    # refusals that numpy itself produces
    save("bad_object.npy", npy_bytes(np.array([1, "a", None], dtype=object), allow_pickle=True))
    save("bad_structured.npy", npy_bytes(np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])))
    save("bad_complex.npy", npy_bytes(np.zeros(3, dtype="<c8")))
    save("bad_unicode.npy", npy_bytes(np.array(["ab", "c"], dtype="<U2")))
    # and ones written by hand: a Python 2 long suffix, an unknown version
    save("bad_py2_long.npy",
         header("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }") + bytes(24))
    save("bad_version.npy",
         b"\x93NUMPY\x04\x00" + header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }")[8:]
         + bytes(8))


if __name__ == "__main__":
    main()
