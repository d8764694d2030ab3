#!/usr/bin/python3
"""Writes the corpus of malformed .npy, .npz and .safetensors files in this
directory, and expected.tsv: one line per file, "NAME<TAB>SUBSTRING", where
SUBSTRING must appear in the one-line error message aft prints for it.

    testdata/malformed/make_malformed.py

Standard library only (no numpy, no torch): every file is assembled byte by
byte from the two formats:

  .npy          "\\x93NUMPY", major, minor, header length (2 bytes
                little-endian in 1.0, 4 in 2.0/3.0), a Python dict literal
                padded with spaces to a multiple of 64 and ending in '\\n',
                then the array data.
  .safetensors  8-byte little-endian header size N, N bytes of UTF-8 JSON,
                then the data buffer that the entries' data_offsets tile.

Each case starts from a small valid file and breaks exactly one thing, so the
message aft gives must name that thing. cli/tests/test_malformed.c runs
`aft info` and `aft run` on every file listed in expected.tsv; the fuzz
targets (fuzz/) use the directory as seeds.

Files that are not made here may also live in this directory: inputs that a
fuzzer found crashing, kept as regression cases. They are listed in
EXTRA_EXPECTED below so that expected.tsv covers them too; this script never
deletes a file.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# (name, expected substring) of regression inputs committed as found
EXTRA_EXPECTED = []

cases = []   # (file name, bytes, expected substring of the message)


def case(name, data, expect):
    assert all(n != name for n, _, _ in cases), name
    assert "\t" not in expect and "\n" not in expect
    cases.append((name, bytes(data), expect))


# ---------------------------------------------------------------- .npy

NPY_MAGIC = b"\x93NUMPY"
VALID_DICT = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
VALID_DATA = struct.pack("<6f", 0, 1, 2, 3, 4, 5)


def npy(dict_text, data=VALID_DATA, major=1, minor=0, hlen=None, end=b"\n"):
    """A .npy with the header text given (str, or bytes kept as they are),
    padded like numpy pads it so the data starts on a 64-byte boundary.
    hlen overrides the stored header length; end is the header's last byte."""
    text = dict_text.encode("latin1") if isinstance(dict_text, str) else dict_text
    prefix = 10 if major == 1 else 12
    body = text + end
    pad = (-(prefix + len(body))) % 64
    header = text + b" " * pad + end
    n = len(header) if hlen is None else hlen
    size = struct.pack("<H", n) if major == 1 else struct.pack("<I", n)
    return NPY_MAGIC + bytes([major, minor]) + size + header + data


def header_dict(descr="'<f4'", fortran="False", shape="(2, 3)"):
    return "{'descr': %s, 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)


VALID_NPY = npy(VALID_DICT)
DATA_OFF = len(VALID_NPY) - len(VALID_DATA)

# truncation at every boundary of the preamble, the header and the data
case("npy_empty.npy", b"", "bad magic: not a .npy file")
case("npy_trunc_in_magic.npy", VALID_NPY[:3], "file ends inside the .npy preamble (3 bytes)")
case("npy_trunc_after_magic.npy", VALID_NPY[:6], "file ends inside the .npy preamble (6 bytes)")
case("npy_trunc_in_version.npy", VALID_NPY[:7], "file ends inside the .npy preamble (7 bytes)")
case("npy_trunc_in_hlen.npy", VALID_NPY[:9], "file ends inside the .npy preamble (9 bytes)")
case("npy_trunc_after_hlen.npy", VALID_NPY[:10],
     "header extends past the end of the file: needs %d bytes, file holds 10" % DATA_OFF)
case("npy_trunc_in_header.npy", VALID_NPY[:40],
     "header extends past the end of the file: needs %d bytes, file holds 40" % DATA_OFF)
case("npy_trunc_before_newline.npy", VALID_NPY[:DATA_OFF - 1],
     "header extends past the end of the file")
case("npy_trunc_no_data.npy", VALID_NPY[:DATA_OFF],
     "data truncated: header promises 24 bytes, file holds 0")
case("npy_trunc_in_data.npy", VALID_NPY[:-5],
     "data truncated: header promises 24 bytes, file holds 19")
case("npy_v2_trunc_in_hlen.npy", npy(VALID_DICT, major=2)[:11],
     "file ends inside the .npy preamble (11 bytes)")
case("npy_trailing_bytes.npy", VALID_NPY + b"\0\0\0", "3 trailing bytes after the data")

# the preamble
case("npy_bad_magic.npy", b"\x93NUMPX" + VALID_NPY[6:], "bad magic: not a .npy file")
case("npy_version_4_0.npy", npy(VALID_DICT, major=4), "unknown .npy version 4.0")
case("npy_version_1_1.npy", npy(VALID_DICT, minor=1), "unknown .npy version 1.1")
case("npy_version_0_0.npy", npy(VALID_DICT, major=0), "unknown .npy version 0.0")
case("npy_v1_hlen_65535.npy", npy(VALID_DICT, hlen=0xFFFF),
     "header of 65535 bytes is over the 10000-byte limit")
case("npy_v2_hlen_4g.npy", npy(VALID_DICT, major=2, hlen=0xFFFFFFFF),
     "header of 4294967295 bytes is over the 10000-byte limit")
case("npy_v2_hlen_past_end.npy", npy(VALID_DICT, major=2, hlen=9000),
     "header extends past the end of the file: needs 9012 bytes")
# an empty header is no dict (a header that does not end in '\n' is
# fine: numpy pads with one but does not insist on it)
case("npy_hlen_zero.npy", npy(VALID_DICT, hlen=0, data=b""),
     "expected '{' (the header must be a dict)")

# the header dict
case("npy_not_a_dict.npy", npy("[1, 2, 3]"), "expected '{' (the header must be a dict)")
case("npy_empty_dict.npy", npy("{}"), "missing key 'descr'")
case("npy_missing_shape.npy", npy("{'descr': '<f4', 'fortran_order': False, }"),
     "missing key 'shape'")
case("npy_unknown_key.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'extra': 1, }"),
     "unexpected key 'extra'")
# a terminal escape sequence in a key must not reach the terminal
case("npy_escape_seq_key.npy", npy(b"{'\x1b[31mred': 1, }"), "unexpected key '?[31mred'")
case("npy_text_after_dict.npy", npy(VALID_DICT + " x"), "unexpected text after the dict")
case("npy_misplaced_quote.npy", npy("{'descr: '<f4'}"), "unexpected key 'descr: '")
case("npy_string_runs_to_end.npy", npy("{'descr': '<f4"), "unterminated string")
# a key written twice keeps its last value (numpy reads the dict as Python
# does), and that value must be right too
case("npy_duplicate_key_last_bad.npy",
     npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'descr': '<f4 ', }"),
     "unsupported dtype '<f4 '")
case("npy_bad_escape.npy", npy(header_dict(descr="'<f\\x3'")), "a truncated \\x, \\u or \\U escape")
case("npy_nul_in_header.npy", npy(b"{'descr'\0: '<f4', }"), "expected ':' after a key")
case("npy_fortran_not_bool.npy", npy(header_dict(fortran="1")),
     "'fortran_order' must be True or False")
case("npy_fortran_lowercase.npy", npy(header_dict(fortran="false")),
     "'fortran_order' must be True or False")

# shapes: negative, non-integer, wrapping, overflowing, too many
case("npy_negative_dim.npy", npy(header_dict(shape="(-1, 3)")), "negative dimension in shape")
case("npy_float_dim.npy", npy(header_dict(shape="(2.0, 3)")), "non-integer dimension in shape")
case("npy_exponent_dim.npy", npy(header_dict(shape="(2e0, 3)")), "non-integer dimension in shape")
case("npy_name_dim.npy", npy(header_dict(shape="(n, 3)")), "non-integer dimension in shape")
# Python 2's long suffix is dropped by numpy in 1.0 and 2.0 headers only
case("npy_py2_long_dim_v3.npy", npy(header_dict(shape="(2L, 3)"), major=3), "Python 2 long suffix 'L'")
case("npy_leading_zero_dim.npy", npy(header_dict(shape="(02, 3)")), "dimension with a leading zero")
case("npy_shape_list.npy", npy(header_dict(shape="[2, 3]")), "'shape' must be a tuple")
case("npy_shape_bare_int.npy", npy(header_dict(shape="(6)"), data=VALID_DATA),
     "one dimension needs a trailing comma")
case("npy_shape_nested.npy", npy(header_dict(shape="((2, 3),)")), "expected a dimension in shape")
case("npy_dim_over_size_t.npy", npy(header_dict(shape="(18446744073709551616,)")),
     "dimension too large in shape")
case("npy_dims_overflow.npy", npy(header_dict(shape="(4294967296, 4294967296)")),
     "array too large: element count overflows")
# 5962 * 3094053014711431 = 2^64 + 6: the element count wraps to exactly the
# 6 elements present, so only a checked product notices
case("npy_dims_wrap_to_fit.npy", npy(header_dict(shape="(5962, 3094053014711431)")),
     "array too large: element count overflows")
# 2981 * 3094053014711431 elements of 8 bytes = 2^64 + 24 bytes: the element
# count fits, the byte count wraps to the 24 bytes present
case("npy_bytes_wrap_to_fit.npy", npy(header_dict(descr="'<f8'", shape="(2981, 3094053014711431)")),
     "array too large: byte count overflows")
# a zero dimension makes the array empty, but the rest must still multiply
case("npy_zero_dim_overflow.npy", npy(header_dict(shape="(0, 4294967296, 4294967296)"), data=b""),
     "array too large: element count overflows")
case("npy_too_many_dims.npy", npy(header_dict(shape="(" + "1, " * 33 + ")"), data=VALID_DATA[:4]),
     "too many dimensions in shape (at most 32)")
# a tiny file claiming 4 TB: refused before anything is allocated
case("npy_huge_shape_no_data.npy", npy(header_dict(shape="(1000000, 1000000)"), data=b""),
     "data truncated: header promises 4000000000000 bytes, file holds 0")

# dtypes
case("npy_object_dtype.npy", npy(header_dict(descr="'|O'")),
     "object arrays would need unpickling")
case("npy_structured_dtype.npy", npy(header_dict(descr="[('a', '<f4')]")),
     "structured dtypes are not supported")
case("npy_unicode_dtype.npy", npy(header_dict(descr="'<U1'")), "unsupported dtype '<U1'")
case("npy_complex_dtype.npy", npy(header_dict(descr="'<c8'")), "unsupported dtype '<c8'")
case("npy_datetime_dtype.npy", npy(header_dict(descr="'<M8[s]'")), "unsupported dtype '<M8[s]'")
# found by fuzz_npy: a NUL byte-order character was taken for '<' (a
# strchr over "<>|=" also matches the terminator); sized so that, read that
# way, the file would be a valid little-endian int16 array
case("npy_nul_byteorder.npy", npy(header_dict(descr="'\x00i2'"), data=VALID_DATA[:12]),
     "unsupported dtype '?i2'")
case("npy_descr_not_string.npy", npy(header_dict(descr="4")), "'descr' must be a string")
# version 3.0 headers are UTF-8; this one is not, and the bytes must not
# reach the message raw
case("npy_v3_bad_utf8_descr.npy", npy(header_dict(descr="'\xff\xfe'"), major=3),
     "unsupported dtype '??'")

# ---------------------------------------------------------------- .safetensors


def st_raw(header, data=b"", size=None):
    """A .safetensors with the header given as bytes (or str, UTF-8) exactly,
    padded with spaces to a multiple of 8; size overrides the stored size."""
    h = header.encode("utf-8") if isinstance(header, str) else header
    h += b" " * ((-len(h)) % 8)
    n = len(h) if size is None else size
    return struct.pack("<Q", n) + h + data


def st(entries, data=b"", size=None):
    """The header as JSON from a dict (key order kept)."""
    return st_raw(json.dumps(entries, separators=(",", ":")), data, size)


def entry(dtype="F32", shape=(2, 3), offsets=(0, 24)):
    """One tensor entry; a tuple becomes a JSON array, anything else is kept."""
    as_json = lambda v: list(v) if isinstance(v, tuple) else v
    return {"dtype": dtype, "shape": as_json(shape), "data_offsets": as_json(offsets)}


def st_entry_text(text, data=VALID_DATA, name="a"):
    """One tensor whose entry is the JSON text given verbatim."""
    return st_raw('{"%s":%s}' % (name, text), data)


VALID_ST = st({"a": entry()}, VALID_DATA)
ST_HLEN = struct.unpack("<Q", VALID_ST[:8])[0]

# truncation at every boundary
case("st_empty.safetensors", b"", "file is 0 bytes, too short for the 8-byte header size")
case("st_trunc_in_size.safetensors", VALID_ST[:5], "file is 5 bytes, too short for the 8-byte header size")
case("st_trunc_after_size.safetensors", VALID_ST[:8],
     "header size %d runs past the end of the file (8 bytes)" % ST_HLEN)
case("st_trunc_in_header.safetensors", VALID_ST[:30],
     "header size %d runs past the end of the file (30 bytes)" % ST_HLEN)
case("st_trunc_no_data.safetensors", VALID_ST[:8 + ST_HLEN],
     "run past the end of the data buffer (0 bytes)")
case("st_trunc_in_data.safetensors", VALID_ST[:-4],
     "run past the end of the data buffer (20 bytes)")
case("st_trailing_bytes.safetensors", VALID_ST + b"\0" * 8,
     "data buffer holds 32 bytes but the tensors end at 24 (8 trailing bytes)")
case("st_no_tensors_trailing.safetensors", st({}, b"\0" * 4),
     "header lists no tensors (trailing bytes)")

# the header size
case("st_size_zero.safetensors", st_raw(b"", size=0), "header is not valid JSON")
case("st_size_max_u64.safetensors", st({"a": entry()}, VALID_DATA, size=2**64 - 1),
     "header size 18446744073709551615 exceeds the limit of 100000000 bytes")
case("st_size_over_limit.safetensors", st({"a": entry()}, VALID_DATA, size=100000001),
     "header size 100000001 exceeds the limit of 100000000 bytes")
case("st_size_past_end.safetensors", st({"a": entry()}, VALID_DATA, size=99999999),
     "header size 99999999 runs past the end of the file")

# the header's bytes: UTF-8, control characters, strings, escapes
case("st_bad_utf8.safetensors", st_raw(b'{"\xff":' + json.dumps(entry()).encode() + b"}", VALID_DATA),
     "header is not valid UTF-8 (byte 2)")
case("st_overlong_utf8.safetensors", st_raw(b'{"\xc0\xaf":' + json.dumps(entry()).encode() + b"}", VALID_DATA),
     "header is not valid UTF-8 (byte 2)")
case("st_surrogate_utf8.safetensors", st_raw(b'{"\xed\xa0\x80":' + json.dumps(entry()).encode() + b"}", VALID_DATA),
     "header is not valid UTF-8 (byte 2)")
case("st_utf8_cut_at_end.safetensors", st_raw(b'{"a":' + json.dumps(entry()).encode() + b"}\xe2\x82", VALID_DATA),
     "header is not valid UTF-8")
case("st_above_u10ffff.safetensors", st_raw(b'{"\xf4\x90\x80\x80":' + json.dumps(entry()).encode() + b"}", VALID_DATA),
     "header is not valid UTF-8 (byte 2)")
case("st_nul_in_header.safetensors", st_raw(b'{"a\0":' + json.dumps(entry()).encode() + b"}", VALID_DATA),
     "header has a raw control character 0x00 inside a string at byte 3")
case("st_nul_outside_string.safetensors", st_raw(b'{\0"a":' + json.dumps(entry()).encode() + b"}", VALID_DATA),
     "header has a control character 0x00 at byte 1")
case("st_newline_in_name.safetensors", st_raw(b'{"a\nb":' + json.dumps(entry()).encode() + b"}", VALID_DATA),
     "raw control character 0x0a inside a string")
case("st_escaped_nul.safetensors", st_raw('{"a\\u0000b":' + json.dumps(entry()) + "}", VALID_DATA),
     "\\u0000 escape")
case("st_bad_escape.safetensors", st_raw('{"a\\x":' + json.dumps(entry()) + "}", VALID_DATA),
     "invalid escape '\\x'")
case("st_short_u_escape.safetensors", st_raw('{"a\\u12":' + json.dumps(entry()) + "}", VALID_DATA),
     "\\u escape without 4 hex digits")
case("st_lone_surrogate_escape.safetensors", st_raw('{"a\\ud800":' + json.dumps(entry()) + "}", VALID_DATA),
     "header is not valid JSON")
case("st_unterminated_string.safetensors", st_raw('{"a', VALID_DATA), "unterminated string starting at byte 1")

# JSON structure
case("st_invalid_json.safetensors", st_raw('{"a":', VALID_DATA), "header is not valid JSON")
case("st_json_trailing_text.safetensors", st_raw('{"a":' + json.dumps(entry()) + "} x", VALID_DATA),
     "header is not valid JSON")
case("st_header_is_array.safetensors", st_raw("[]"), "header is not a JSON object")
case("st_header_is_string.safetensors", st_raw('"a"'), "header is not a JSON object")
case("st_deep_nesting.safetensors", st_raw('{"a":' + "[" * 100 + "]" * 100 + "}"),
     "header nests more than 64 levels deep")
case("st_deep_unclosed.safetensors", st_raw("[" * 5000), "header nests more than 64 levels deep")
case("st_duplicate_name.safetensors",
     st_raw('{"a":%s,"a":%s}' % (json.dumps(entry(offsets=(0, 24))), json.dumps(entry(offsets=(24, 48)))),
            VALID_DATA * 2),
     "tensor name 'a' appears twice")

# __metadata__
case("st_metadata_twice.safetensors",
     st_raw('{"__metadata__":{},"__metadata__":{},"a":%s}' % json.dumps(entry()), VALID_DATA),
     "header has '__metadata__' twice")
case("st_metadata_dup_key.safetensors",
     st_raw('{"__metadata__":{"k":"1","k":"2"},"a":%s}' % json.dumps(entry()), VALID_DATA),
     "__metadata__ has key 'k' twice")
case("st_metadata_not_string.safetensors", st({"__metadata__": {"k": 1}, "a": entry()}, VALID_DATA),
     "__metadata__ value for key 'k' is not a string")
case("st_metadata_nested.safetensors", st({"__metadata__": {"k": {"x": "y"}}, "a": entry()}, VALID_DATA),
     "__metadata__ value for key 'k' is not a string")
case("st_metadata_not_object.safetensors", st({"__metadata__": ["k"], "a": entry()}, VALID_DATA),
     "__metadata__ is not a JSON object")

# a tensor entry's keys and dtype
case("st_entry_not_object.safetensors", st({"a": [1, 2]}, VALID_DATA), "tensor 'a' is not a JSON object")
case("st_entry_unknown_key.safetensors", st({"a": dict(entry(), extra=1)}, VALID_DATA),
     "tensor 'a' has an unknown key 'extra'")
case("st_entry_key_twice.safetensors",
     st_entry_text('{"dtype":"F32","dtype":"F32","shape":[2,3],"data_offsets":[0,24]}'),
     "tensor 'a' has key 'dtype' twice")
case("st_entry_no_dtype.safetensors", st({"a": {"shape": [2, 3], "data_offsets": [0, 24]}}, VALID_DATA),
     "tensor 'a' has no 'dtype'")
case("st_entry_no_shape.safetensors", st({"a": {"dtype": "F32", "data_offsets": [0, 24]}}, VALID_DATA),
     "tensor 'a' has no 'shape'")
case("st_entry_no_offsets.safetensors", st({"a": {"dtype": "F32", "shape": [2, 3]}}, VALID_DATA),
     "tensor 'a' has no 'data_offsets'")
case("st_dtype_unknown.safetensors", st({"a": entry(dtype="F8")}, VALID_DATA), "unknown dtype 'F8' for tensor 'a'")
case("st_dtype_lowercase.safetensors", st({"a": entry(dtype="f32")}, VALID_DATA), "unknown dtype 'f32'")
case("st_dtype_object.safetensors", st({"a": entry(dtype="O")}, VALID_DATA), "unknown dtype 'O'")
case("st_dtype_not_string.safetensors", st({"a": entry(dtype=4)}, VALID_DATA), "tensor 'a': dtype is not a string")
# a name and a dtype holding a terminal escape sequence: shown as '?'
case("st_escape_seq_name.safetensors", st({"\x1b[31mred": entry(dtype="\x1b[0m")}, VALID_DATA),
     "unknown dtype '?[0m' for tensor '?[31mred'")
# a 5000-byte name is cut short in the message, which stays one line
case("st_long_name.safetensors", st({"n" * 5000: entry(dtype="F8")}, VALID_DATA), "unknown dtype 'F8' for tensor 'nnn")

# shapes
case("st_shape_not_array.safetensors", st({"a": entry(shape=6)}, VALID_DATA), "tensor 'a': shape is not an array")
case("st_shape_string.safetensors", st({"a": entry(shape=["2", "3"])}, VALID_DATA),
     "tensor 'a': shape entry 0 is not a number")
case("st_shape_negative.safetensors", st({"a": entry(shape=(-2, -3))}, VALID_DATA),
     "shape entry 0 (-2) is not a non-negative integer")
case("st_shape_fraction.safetensors", st({"a": entry(shape=(2.5, 3))}, VALID_DATA),
     "shape entry 0 (2.5) is not a non-negative integer")
case("st_shape_float_whole.safetensors", st_entry_text('{"dtype":"F32","shape":[2.0,3],"data_offsets":[0,24]}'),
     "header number '2.0' at byte 29 is not a plain non-negative integer")
case("st_shape_exponent.safetensors", st_entry_text('{"dtype":"F32","shape":[2,3e0],"data_offsets":[0,24]}'),
     "header number '3e0'")
case("st_shape_leading_zero.safetensors", st_entry_text('{"dtype":"F32","shape":[02,3],"data_offsets":[0,24]}'),
     "header number '02'")
case("st_shape_minus_zero.safetensors",
     st_entry_text('{"dtype":"F32","shape":[-0,2,3],"data_offsets":[0,0]}', data=b""),
     "header number '-0'")
case("st_shape_2_53.safetensors", st({"a": entry(shape=(2**53,))}, VALID_DATA),
     "shape entry 0 (9007199254740992) is 2^53 or more")
case("st_shape_1e400.safetensors", st_entry_text('{"dtype":"F32","shape":[1e400],"data_offsets":[0,24]}'),
     "shape entry 0 (inf) is 2^53 or more")
case("st_shape_too_many_dims.safetensors", st({"a": entry(shape=[1] * 33, offsets=(0, 4))}, VALID_DATA[:4]),
     "shape has 33 dimensions, more than the 32 supported")
case("st_dims_overflow.safetensors", st({"a": entry(shape=(2**32, 2**32, 2**32))}, VALID_DATA),
     "has more elements than fit in size_t")
# as in the .npy cases: element and byte counts that wrap to the data present
case("st_dims_wrap_to_fit.safetensors", st({"a": entry(shape=(5962, 3094053014711431))}, VALID_DATA),
     "has more elements than fit in size_t")
case("st_bytes_wrap_to_fit.safetensors", st({"a": entry(dtype="F64", shape=(2981, 3094053014711431))}, VALID_DATA),
     "of F64 needs more bytes than fit in size_t")

# data_offsets
case("st_offsets_not_pair.safetensors", st({"a": entry(offsets=(0, 24, 48))}, VALID_DATA),
     "data_offsets is not a [begin, end] pair")
case("st_offsets_not_array.safetensors", st({"a": entry(offsets=24)}, VALID_DATA),
     "data_offsets is not a [begin, end] pair")
case("st_offsets_strings.safetensors", st({"a": entry(offsets=("0", "24"))}, VALID_DATA),
     "data_offsets entry 0 is not a number")
case("st_offsets_bools.safetensors", st({"a": entry(offsets=(False, True))}, VALID_DATA),
     "data_offsets entry 0 is not a number")
case("st_offsets_negative.safetensors", st({"a": entry(offsets=(-24, 0))}, VALID_DATA),
     "data_offsets entry 0 (-24) is not a non-negative integer")
case("st_offsets_reversed.safetensors", st({"a": entry(offsets=(24, 0))}, VALID_DATA),
     "data_offsets [24, 0] end before they begin")
case("st_offsets_wrong_size.safetensors", st({"a": entry(offsets=(0, 20))}, VALID_DATA[:20]),
     "data_offsets [0, 20] hold 20 bytes but shape [2, 3] of F32 needs 24")
case("st_offsets_2_53.safetensors", st({"a": entry(offsets=(0, 2**53 + 2))}, VALID_DATA),
     "data_offsets entry 1 (9007199254740994) is 2^53 or more")
case("st_offsets_past_end.safetensors", st({"a": entry(shape=(2**38,), offsets=(0, 2**40))}, VALID_DATA),
     "data_offsets [0, 1099511627776] run past the end of the data buffer (24 bytes)")
case("st_offsets_hole_at_start.safetensors", st({"a": entry(offsets=(8, 32))}, b"\0" * 8 + VALID_DATA),
     "tensor 'a' starts at 8 but the data buffer starts at 0 (hole)")
case("st_offsets_hole.safetensors",
     st({"a": entry(shape=(2,), offsets=(0, 8)), "b": entry(shape=(2,), offsets=(16, 24))}, VALID_DATA),
     "tensor 'b' starts at 16 but the previous tensor 'a' ends at 8 (hole)")
case("st_offsets_overlap.safetensors",
     st({"a": entry(shape=(4,), offsets=(0, 16)), "b": entry(shape=(4,), offsets=(8, 24))}, VALID_DATA),
     "tensor 'b' starts at 8 but the previous tensor 'a' ends at 16 (overlap)")
case("st_offsets_same_range.safetensors",
     st({"a": entry(), "b": entry()}, VALID_DATA),
     "ends at 24 (overlap)")


# ---------------------------------------------------------------- .npz
#
# A zip archive of .npy members (numpy's np.savez), assembled field by field
# (APPNOTE.TXT 4.3): local header "PK\3\4" + name + data for each member,
# then the central directory ("PK\1\2" entries), then the end record
# "PK\5\6". Each case starts from an archive np.load reads and breaks one
# thing; the message names the member.

import zlib  # noqa: E402

GOOD_NPY = npy(VALID_DICT)   # a valid (2, 3) float32 .npy


def zm(name, data=GOOD_NPY, method=0, flags=0, payload=None, crc=None, csize=None, usize=None,
       local=None, offset=None, extra=b""):
    """One member: name (str or bytes), its .npy bytes, stored or deflated
    (payload overrides what is stored); crc, sizes and offset as the
    central directory declares them (default: the true ones); local: a dict
    of local header fields that differ (crc, csize, usize, name, flags,
    method)."""
    nb = name.encode() if isinstance(name, str) else name
    if payload is None:
        if method == 8:
            c = zlib.compressobj(6, zlib.DEFLATED, -15)
            payload = c.compress(data) + c.flush()
        else:
            payload = data
    return dict(name=nb, flags=flags, method=method, payload=payload,
                crc=zlib.crc32(data) if crc is None else crc,
                csize=len(payload) if csize is None else csize,
                usize=len(data) if usize is None else usize,
                local=local or {}, offset=offset, extra=extra)


def zipfile_bytes(members, count=None, cd_size=None, cd_off=None, between=b"", cut=None):
    out = b""
    for m in members:
        lo = m["local"]
        m["at"] = len(out)
        name = lo.get("name", m["name"])
        out += (struct.pack("<IHHHHHIIIHH", 0x04034b50, 20, lo.get("flags", m["flags"]),
                            lo.get("method", m["method"]), 0, 0x21, lo.get("crc", m["crc"]),
                            lo.get("csize", m["csize"]), lo.get("usize", m["usize"]), len(name), 0)
                + name + m["payload"])
    start = len(out)
    for m in members:
        off = m["at"] if m["offset"] is None else m["offset"]
        out += (struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 0x0314, 20, m["flags"], m["method"], 0, 0x21,
                            m["crc"], m["csize"], m["usize"], len(m["name"]), len(m["extra"]), 0, 0, 0,
                            0o600 << 16, off) + m["name"] + m["extra"])
    size = len(out) - start
    n = len(members) if count is None else count
    out += between
    out += struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, n, n, size if cd_size is None else cd_size,
                       start if cd_off is None else cd_off, 0)
    return out if cut is None else out[:cut]


def deflate(data):
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


VALID_NPZ = zipfile_bytes([zm("a.npy"), zm("b.npy", method=8)])

# the archive's structure
# named .npz, an empty file goes to the zip reader ("zip archive of 0 bytes
# is truncated"); piped (aft run --weights /dev/stdin) nothing says it is a
# zip, and the .safetensors reader speaks ("file is 0 bytes, too short")
case("npz_empty.npz", b"", "0 bytes")
case("npz_no_end_record.npz", VALID_NPZ[:len(VALID_NPZ) - 22],
     "no end of central directory record")
case("npz_truncated_in_cd.npz", VALID_NPZ[:len(VALID_NPZ) - 40],
     "no end of central directory record")
case("npz_cd_past_end_record.npz", zipfile_bytes([zm("a.npy"), zm("b.npy")], cd_size=500),
     "truncated central directory")
case("npz_cd_count_too_big.npz", zipfile_bytes([zm("a.npy"), zm("b.npy")], count=3),
     "truncated central directory: 3 entries cannot fit")


def entry_cut():
    """the second central directory entry's name length runs past the
    directory's end"""
    z = bytearray(zipfile_bytes([zm("a.npy"), zm("b.npy")]))
    second = z.find(b"PK\x01\x02", z.find(b"PK\x01\x02") + 4)
    struct.pack_into("<H", z, second + 28, 200)
    return bytes(z)


case("npz_cd_entry_cut.npz", entry_cut(), "truncated central directory: entry 2 of 2 runs past its end")
case("npz_extra_corrupt.npz", zipfile_bytes([zm("a.npy", extra=b"\x99\x99\x40\x00")]),
     "member 'a.npy': its extra field is corrupt")
case("npz_bytes_before_end.npz", zipfile_bytes([zm("a.npy")], between=b"\0" * 7),
     "7 bytes between the central directory and the end record")
case("npz_zip64_extra_missing.npz", zipfile_bytes([zm("a.npy", usize=0xffffffff, csize=0xffffffff)]),
     "member 'a.npy': its zip64 sizes are missing")

# sizes that disagree, data that runs where it should not
case("npz_local_size_differs.npz",
     zipfile_bytes([zm("a.npy", local=dict(csize=len(GOOD_NPY) - 4, usize=len(GOOD_NPY) - 4))]),
     "member 'a.npy': its local header says %d bytes (%d compressed), the central directory %d (%d)"
     % ((len(GOOD_NPY) - 4,) * 2 + (len(GOOD_NPY),) * 2))
case("npz_stored_sizes_differ.npz", zipfile_bytes([zm("a.npy", usize=len(GOOD_NPY) + 8)]),
     "member 'a.npy': stored, but its sizes differ (%d bytes compressed, %d not)" % (len(GOOD_NPY), len(GOOD_NPY) + 8))
case("npz_local_crc_differs.npz", zipfile_bytes([zm("a.npy", local=dict(crc=1234))]),
     "its local header says CRC-32 000004d2")
case("npz_crc_mismatch.npz", zipfile_bytes([zm("a.npy", crc=zlib.crc32(GOOD_NPY) ^ 1)]),
     "member 'a.npy': CRC-32")
case("npz_data_into_cd.npz", zipfile_bytes([zm("a.npy", csize=len(GOOD_NPY) + 30, usize=len(GOOD_NPY) + 30,
                                               local=dict(csize=len(GOOD_NPY) + 30, usize=len(GOOD_NPY) + 30))]),
     "run past the start of the central directory")
case("npz_local_offset_wrong.npz", zipfile_bytes([zm("a.npy"), zm("b.npy", offset=7)]),
     "member 'b.npy': no local header at offset 7")
case("npz_local_other_name.npz", zipfile_bytes([zm("a.npy", local=dict(name=b"c.npy"))]),
     "member 'a.npy': its local header names another member")


def overlapping():
    """member a's data is a whole member b (local header and data): the
    central directory lists both, b inside a"""
    inner = zipfile_bytes([zm("b.npy")])
    b_local = inner[:30 + 5 + len(GOOD_NPY)]
    a = zm("a.npy", data=b_local)
    b = zm("b.npy", offset=30 + 5)
    out = zipfile_bytes([a])           # to learn where a's data starts
    cd_at = 30 + 5 + len(b_local)
    # rebuild with both entries, b at a's data
    members = [a, dict(b, payload=b"", offset=30 + 5)]
    data = b""
    a["at"] = 0
    data += (struct.pack("<IHHHHHIIIHH", 0x04034b50, 20, 0, 0, 0, 0x21, a["crc"], a["csize"], a["usize"], 5, 0)
             + b"a.npy" + a["payload"])
    assert len(data) == cd_at
    cd = b""
    for m, off in ((a, 0), (b, 35)):
        cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 0x0314, 20, 0, 0, 0, 0x21, m["crc"], m["csize"],
                          m["usize"], 5, 0, 0, 0, 0, 0o600 << 16, off) + m["name"]
    del out, members
    return data + cd + struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, 2, 2, len(cd), len(data), 0)


case("npz_overlap.npz", overlapping(), "member 'b.npy': overlaps member 'a.npy'")
case("npz_same_offset.npz", zipfile_bytes([zm("a.npy"), zm("a.npy", offset=0)]),
     "overlaps member 'a.npy'")

# zip bombs: declared sizes deflate cannot reach, or that the data overruns
case("npz_bomb_ratio.npz",
     zipfile_bytes([zm("a.npy", method=8, usize=0xfffffff0, local=dict(usize=0xfffffff0))]),
     "member 'a.npy': declares 4294967280 bytes inflated from")
BIG = npy(header_dict(descr="'|u1'", shape="(4000,)"), data=b"\0" * 4000)
case("npz_inflates_past_size.npz",
     zipfile_bytes([zm("a.npy", data=BIG, method=8, usize=1000, local=dict(usize=1000))]),
     "member 'a.npy': inflates past its declared size of 1000 bytes")
case("npz_inflates_short.npz",
     zipfile_bytes([zm("a.npy", data=BIG, method=8, usize=5000, local=dict(usize=5000))]),
     "member 'a.npy': inflates to 4128 bytes, short of the 5000 declared")
case("npz_deflate_corrupt.npz",
     zipfile_bytes([zm("a.npy", method=8, payload=b"\xff" * 40)]),
     "member 'a.npy': corrupt deflate data")
case("npz_deflate_cut.npz",
     zipfile_bytes([zm("a.npy", data=BIG, method=8, payload=deflate(BIG)[:20])]),
     "member 'a.npy': its deflate data is cut short")
case("npz_deflate_trailing.npz",
     zipfile_bytes([zm("a.npy", method=8, payload=deflate(GOOD_NPY) + b"\0" * 5)]),
     "5 of its")

# what a member may not be
case("npz_encrypted.npz", zipfile_bytes([zm("a.npy", flags=1)]), "member 'a.npy': it is encrypted")
case("npz_encrypted_aes.npz", zipfile_bytes([zm("a.npy", method=99)]), "member 'a.npy': it is encrypted")
case("npz_method_bzip2.npz", zipfile_bytes([zm("a.npy", method=12)]),
     "member 'a.npy': compression method 12 (only stored and deflated members can be read)")
case("npz_name_parent.npz", zipfile_bytes([zm("../../evil.npy")]),
     "member '../../evil.npy': '/' in a key (members are keys, not paths)")
case("npz_name_slash.npz", zipfile_bytes([zm("dir/a.npy")]), "member 'dir/a.npy': '/' in a key")
case("npz_name_backslash.npz", zipfile_bytes([zm("..\\a.npy")]), "'\\' in a key")
case("npz_name_dotdot.npz", zipfile_bytes([zm("a..b.npy")]), "member 'a..b.npy': '..' in a key")
case("npz_name_empty_key.npz", zipfile_bytes([zm(".npy")]), "member '.npy': an empty key")
case("npz_name_nul.npz", zipfile_bytes([zm(b"a\0b.npy")]), "member 'a?b.npy': a NUL byte in its name")
case("npz_name_bad_utf8.npz", zipfile_bytes([zm(b"\xff.npy", flags=0x800)]),
     "its name is marked UTF-8 but is not")
case("npz_name_escape_seq.npz", zipfile_bytes([zm("\x1b[31m/x.npy")]), "member '?[31m/x.npy'")
case("npz_duplicate_key.npz", zipfile_bytes([zm("a.npy"), zm("a.npy")]),
     "duplicate key 'a' (members 'a.npy' and 'a.npy')")
case("npz_duplicate_key_suffix.npz", zipfile_bytes([zm("a.npy"), zm("a")]),
     "duplicate key 'a' (members 'a.npy' and 'a')")

# members that are no valid .npy: the member and the .npy reader's message
case("npz_member_not_npy.npz", zipfile_bytes([zm("a.npy", data=b"hello, world")]),
     "member 'a.npy': bad magic: not a .npy file")
case("npz_member_bad_header.npz", zipfile_bytes([zm("a.npy", data=npy("{'descr': '<f4', 'fortran_order': False, }"))]),
     "member 'a.npy': missing key 'shape'")
case("npz_member_deflated_bad.npz",
     zipfile_bytes([zm("b.npy", method=8, data=npy(header_dict(shape="(2, -3)")))]),
     "member 'b.npy': negative dimension in shape")
case("npz_member_trailing.npz", zipfile_bytes([zm("a.npy", data=GOOD_NPY + b"\0\0")]),
     "member 'a.npy': 2 trailing bytes after the data")
case("npz_member_object.npz", zipfile_bytes([zm("x.npy", data=npy(header_dict(descr="'|O'")))]),
     "member 'x.npy': unsupported dtype '|O' (object arrays would need unpickling)")
case("npz_member_is_zip.npz", zipfile_bytes([zm("a.npy", data=VALID_NPZ)]),
     "member 'a.npy': not a .npy file: this is a .npz archive")


# ---------------------------------------------------------------- streaming states
#
# States for `aft run --causal --variant local --window 3 --seed 7 --state-in
# FILE x.npy`, x.npy a [4, 8] input (cli/tests/test_malformed.c): a valid one
# made by aft itself (its fingerprint names that seeded layer), then spoilt.

def base_state():
    import subprocess
    import tempfile
    aft = os.path.join(HERE, "..", "..", "aft")
    with tempfile.TemporaryDirectory() as tmp:
        x = os.path.join(tmp, "x.npy")
        head = VALID_DICT.replace("(2, 3)", "(4, 8)").encode()
        with open(x, "wb") as f:
            f.write(npy(head, data=struct.pack("<32f", *[(i % 7) * 0.25 - 0.5 for i in range(32)])))
        st = os.path.join(tmp, "s.safetensors")
        subprocess.run([aft, "run", "--causal", "--variant", "local", "--window", "3", "--seed", "7",
                        "--state-out", st, "-o", os.path.join(tmp, "y.npy"), x], check=True)
        with open(st, "rb") as f:
            return f.read()


def st_parts(data):
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def st_join(hdr, blob):
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + blob


def spoil_meta(key, value):
    hdr, blob = st_parts(BASE_STATE)
    if value is None:
        del hdr["__metadata__"][key]
    else:
        hdr["__metadata__"][key] = value
    return st_join(hdr, blob)


def spoil_tensor(name, fn):
    """fn(entry, bytes of the tensor) -> (entry, bytes), or None to drop it"""
    hdr, blob = st_parts(BASE_STATE)
    out, off = {"__metadata__": hdr["__metadata__"]}, 0
    items = sorted(((k, v) for k, v in hdr.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0])
    parts = []
    for k, v in items:
        b = blob[v["data_offsets"][0]:v["data_offsets"][1]]
        if k == name:
            r = fn(dict(v), b)
            if r is None:
                continue
            v, b = r
        v["data_offsets"] = [off, off + len(b)]
        off += len(b)
        out[k] = v
        parts.append(b)
    return st_join(out, b"".join(parts))


def float_at(index, value):
    def fn(e, b):
        return e, b[:4 * index] + struct.pack("<f", value) + b[4 * index + 4:]
    return fn


BASE_STATE = base_state() if os.path.exists(os.path.join(HERE, "..", "..", "aft")) else None
if BASE_STATE:
    case("state_position_not_number.safetensors", spoil_meta("position", "2O"), "position '2O' is not a whole number")
    case("state_position_huge.safetensors", spoil_meta("position", "99999999999"), "is not a whole number up to")
    case("state_position_rows_disagree.safetensors", spoil_meta("position", "2"), "tensor 'keys' must be F32 [1, 2, 8]")
    case("state_other_window.safetensors", spoil_meta("window", "4"), "the state was made for window 4, this run has 3")
    case("state_other_batch.safetensors", spoil_meta("batch", "2"), "the state was made for batch size 2")
    case("state_other_weights.safetensors", spoil_meta("fingerprint", "0123456789abcdef"), "other weights or bias")
    case("state_not_a_state.safetensors", spoil_meta("aft_state", None), "not an aft state: no 'aft_state'")
    case("state_missing_keys.safetensors", spoil_tensor("keys", lambda e, b: None), "not an aft state: no tensor 'keys'")
    case("state_nan_sum.safetensors", spoil_tensor("sums_den", float_at(3, float("nan"))),
         "sums hold NaN, infinite or negative values")
    case("state_negative_sum.safetensors", spoil_tensor("sums_den", float_at(0, -1.0)),
         "sums hold NaN, infinite or negative values")
    case("state_values_f16.safetensors",
         spoil_tensor("values", lambda e, b: (dict(e, dtype="F16"), b[:len(b) // 2])), "tensor 'values' must be F32")
    case("state_truncated.safetensors", BASE_STATE[:-20], "run past the end of the data buffer")


def main():
    for name, data, _ in cases:
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)
    rows = [(n, e) for n, _, e in cases] + list(EXTRA_EXPECTED)
    with open(os.path.join(HERE, "expected.tsv"), "w", encoding="utf-8") as f:
        f.write("# file\texpected substring of aft's one-line message (made by make_malformed.py)\n")
        for name, expect in sorted(rows):
            f.write("%s\t%s\n" % (name, expect))
    print("%d files, %d expectations in %s" % (len(cases), len(rows), HERE))


if __name__ == "__main__":
    main()
