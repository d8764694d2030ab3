#!/usr/bin/python3
"""Writes the .npy fixtures for lib/tests/io/test_npy.c into testdata/npy/.

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
    # written by hand: a Python 2 long suffix (valid: numpy drops it), an
    # unknown version
    save("py2_long.npy",
         header("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }") + make("f4", (2, 3)).tobytes())
    check_loads("py2_long.npy", make("f4", (2, 3)))
    save("bad_version.npy",
         b"\x93NUMPY\x04\x00" + header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }")[8:]
         + bytes(8))


# ---------------------------------------------------------------- header spellings
#
# numpy reads a header with ast.literal_eval (after dropping a Python 2 'L'
# after a number in 1.0 and 2.0 headers), so many spellings besides the one
# it writes are valid. Each case below is a header text written by hand;
# np.load decides whether it is valid, and spell/expected.tsv records what it
# said, for test_npy.c to check that aft agrees:
#   NAME <TAB> ok <TAB> CODE <TAB> SHAPE <TAB> TEXT   numpy loads it; the data
#                                           holds value() of CODE in C order
#                                           (SHAPE "2x3", or "scalar")
#   NAME <TAB> refused <TAB> TEXT           numpy refuses it
#   NAME <TAB> differs <TAB> WHY            numpy loads it and aft refuses it
#                                           on purpose (WHY says why)

SPELL = os.path.join(OUT, "spell")
D = "{'descr': %s, 'fortran_order': %s, 'shape': %s, }"
TQ = "'" * 3
TQQ = '"' * 3

# (header text, version, code, shape, byteorder of the data, why aft differs)
SPELLINGS = [
    # what numpy writes, and whitespace, commas and quotes around it
    (D % ("'<f4'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    ("{'descr':'<f4','fortran_order':False,'shape':(2,3)}", 1, "f4", (2, 3), "<", None),
    ("  {  'descr'  :  '<f4' ,  'fortran_order' : False , 'shape' : ( 2 , 3 , ) , }", 1, "f4", (2, 3), "<", None),
    ("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}", 1, "f4", (2, 3), "<", None),
    ("{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}", 1, "f4", (2, 3), "<", None),
    ("{'descr': '<f4',\n\t'fortran_order': False,\r\n 'shape': (2,\f 3)}", 1, "f4", (2, 3), "<", None),
    ("\n # a comment first\n" + D % ("'<f4'", "False", "(2, # and one inside\n 3)") + " # and after", 1,
     "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(2, 3)") + " \\\n", 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(2\\\n, 3)"), 1, "f4", (2, 3), "<", None),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", 1, "f4", (2, 3), "<", None),
    ("({'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)})", 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "True", "(2, 3)"), 3, "f4", (2, 3), "<", None),
    # Python 2's long suffix, in the versions whose headers numpy filters
    (D % ("'<f4'", "False", "(2L, 3L)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(2L, 3L,)"), 2, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(6L,)"), 1, "f4", (6,), "<", None),
    (D % ("'<f4'", "False", "(2 L, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(0x2L, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(2L, 3)"), 3, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(2l, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(2Lx, 3)"), 1, "f4", (2, 3), "<", None),
    # integers as Python 3 spells them
    (D % ("'<f4'", "False", "(0x2, 0o3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(0B10, 0X_3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(2, 1_2)"), 1, "f4", (2, 12), "<", None),
    (D % ("'<f4'", "False", "(00, 3)"), 1, "f4", (0, 3), "<", None),
    (D % ("'<f4'", "False", "(+2, + 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(+(2), -0)"), 1, "f4", (2, 0), "<", None),
    (D % ("'<f4'", "False", "((2), ((3)),)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(((2, 3)))"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(02, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(0_2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(2__0, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(2_, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(-+2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(True, 6)"), 1, "f4", (1, 6), "<", None),
    (D % ("'<f4'", "False", "(2, 3.0)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(2, 3j)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(2, 1<<1)"), 1, "f4", (2, 2), "<", None),
    (D % ("'<f4'", "False", "(2, 3,,)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "[2, 3]"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4'", "False", "(6)"), 1, "f4", (6,), "<", None),
    # strings: prefixes, escapes, triple quotes, joined literals
    (D % ("u'<f4'", "(False)", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("r'<f4'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("U'<f4'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<' \"f\" '4'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % (TQ + "<f4" + TQ, "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % (TQQ + "<f4" + TQQ, "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<\\x664'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<\\1464'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<\\u0066\\U00000034'", "False", "(2, 3)"), 3, "f4", (2, 3), "<", None),
    (D % ("'<f\\\n4'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    ("{'des' 'cr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", 1, "f4", (2, 3), "<", None),
    (D % ("b'<f4'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("Ur'<f4'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'\\<f4'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4' b''", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<\\u0066\\N{DIGIT FOUR}'", "False", "(2, 3)"), 1, "f4", (2, 3), "<",
     "\\N{...} escapes name characters by their Unicode names, a table aft does not carry"),
    # a key twice: the last value counts
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (6,), 'shape': (2, 3), 'descr': '<f4'}", 1,
     "f4", (2, 3), "<", None),
    ("{'descr': x, 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", 1, "f4", (2, 3), "<", None),
    # not the dict numpy wants
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'extra': 0}", 1, "f4", (2, 3), "<", None),
    ("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3)}", 1, "f4", (2, 3), "<", None),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} ;", 1, "f4", (2, 3), "<", None),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}\v", 1, "f4", (2, 3), "<", None),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}\\", 1, "f4", (2, 3), "<", None),
    ("[{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}]", 1, "f4", (2, 3), "<", None),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}\0", 1, "f4", (2, 3), "<", None),
    # dtype strings numpy reads for the types aft reads
    (D % ("'f4'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'=f4'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'|f4'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'>d'", "False", "(2, 3)"), 1, "f8", (2, 3), ">", None),
    (D % ("'e'", "False", "(2, 3)"), 1, "f2", (2, 3), "<", None),
    (D % ("'?'", "False", "(2, 3)"), 1, "b1", (2, 3), "|", None),
    (D % ("'<b1'", "False", "(2, 3)"), 1, "b1", (2, 3), "|", None),
    (D % ("'b'", "False", "(2, 3)"), 1, "i1", (2, 3), "|", None),
    (D % ("'B'", "False", "(2, 3)"), 1, "u1", (2, 3), "|", None),
    (D % ("'>h'", "False", "(2, 3)"), 1, "i2", (2, 3), ">", None),
    (D % ("'<H'", "False", "(2, 3)"), 1, "u2", (2, 3), "<", None),
    (D % ("'<i'", "False", "(2, 3)"), 1, "i4", (2, 3), "<", None),
    (D % ("'I'", "False", "(2, 3)"), 1, "u4", (2, 3), "<", None),
    (D % ("'<l'", "False", "(2, 3)"), 1, "i8", (2, 3), "<", None),
    (D % ("'>Q'", "False", "(2, 3)"), 1, "u8", (2, 3), ">", None),
    (D % ("'float32'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'double'", "False", "(2, 3)"), 1, "f8", (2, 3), "<", None),
    (D % ("'bool'", "False", "(2, 3)"), 1, "b1", (2, 3), "|", None),
    (D % ("'uint16'", "False", "(2, 3)"), 1, "u2", (2, 3), "<", None),
    (D % ("'int64'", "True", "(2, 3)"), 1, "i8", (2, 3), "<", None),
    (D % ("'<float32'", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<f4 '", "False", "(2, 3)"), 1, "f4", (2, 3), "<", None),
    (D % ("'<c8'", "False", "(2, 3)"), 1, "f8", (2, 3), "<", "complex64, a dtype aft does not read"),
    # numpy's leniencies that aft keeps out on purpose
    (D % ("'<f4'", "False", "(-1, 3)"), 1, "f4", (2, 3), "<",
     "a negative dimension: np.load of a file takes -1 for 'whatever fits' (of a file object it refuses)"),
    (D % ("'<f4'", "False", "(2, 2)"), 1, "f4", (2, 3), "<",
     "8 bytes after the data: np.load of a file ignores them"),
]


def spellings():
    os.makedirs(SPELL, exist_ok=True)
    for f in os.listdir(SPELL):
        os.remove(os.path.join(SPELL, f))
    rows = []
    for i, (text, version, code, shape, bo, why) in enumerate(SPELLINGS):
        arr = make(code, shape, bo)
        if "(2, 2)" in text:
            arr = make(code, (2, 3), bo)   # data for (2, 3) under a (2, 2) header
            shape = (2, 3)
        fortran = "'fortran_order': True" in text
        data = arr.tobytes(order="F" if fortran else "C")
        body = text.encode("utf-8" if version == 3 else "latin1")
        lenbytes = 2 if version == 1 else 4
        pad = (-(8 + lenbytes + len(body) + 1)) % 64
        body += b" " * pad + b"\n"
        image = b"\x93NUMPY" + bytes([version, 0]) + len(body).to_bytes(lenbytes, "little") + body + data
        name = "s%03d_v%d.npy" % (i, version)
        save(os.path.join("spell", name), image)
        try:
            got = np.load(os.path.join(SPELL, name), allow_pickle=False)
            assert why or (got.shape == shape and np.array_equal(got, arr)), (text, got.shape, got)
            loads = True
        except (ValueError, TypeError, SyntaxError) as e:   # numpy's refusals
            loads = False
            assert why is None, (text, e)
        text_shown = repr(text).replace("\t", "\\t")
        if not loads:
            rows.append("%s\trefused\t%s" % (name, text_shown))
        elif why:
            rows.append("%s\tdiffers\t%s" % (name, why))
        else:
            rows.append("%s\tok\t%s\t%s\t%s" % (name, code, "x".join(map(str, shape)) or "scalar", text_shown))
    with open(os.path.join(SPELL, "expected.tsv"), "w") as f:
        f.write("# made by testdata/make_npy_fixtures.py: what np.load(allow_pickle=False) does with each file\n")
        f.write("\n".join(rows) + "\n")
    print("%d spellings, %d that numpy loads" % (len(rows), sum("\tok\t" in r for r in rows)), file=sys.stderr)


# numpy's own test files (numpy/lib/tests/data), copied as they are
NUMPY_DATA = "/usr/lib/python3/dist-packages/numpy/lib/tests/data"


def numpy_test_files():
    dst = os.path.join(OUT, "numpy")
    os.makedirs(dst, exist_ok=True)
    for f in sorted(os.listdir(NUMPY_DATA)):
        if f.endswith((".npy", ".npz")):
            with open(os.path.join(NUMPY_DATA, f), "rb") as src:
                data = src.read()
            with open(os.path.join(dst, f), "wb") as out:
                out.write(data)


if __name__ == "__main__":
    main()
    spellings()
    numpy_test_files()
