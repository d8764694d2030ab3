"""aft.load and aft.save: tensors from and to .npy, .npz and .safetensors
files through aft's own readers and writers (aft_api_file_*)."""

import ctypes

import numpy as np

from . import _lib
from ._util import path_bytes

_lib_ = _lib.lib

# aft's dtype names and numpy's (little-endian); BF16 has no numpy dtype and
# is read as float32 (exact)
_FROM_AFT = {
    "F32": "<f4", "F16": "<f2", "F64": "<f8",
    "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
    "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8",
    "BOOL": "?",
}
_TO_AFT = {np.dtype(v): k for k, v in _FROM_AFT.items()}
_MAX_DIMS = 8


class Tensors(dict):
    """What aft.load returns: a dict of numpy arrays, name to array, in the
    file's order, with the file's metadata (.safetensors' __metadata__, a
    dict of strings; empty for .npy and .npz) as .metadata."""

    def __init__(self, items=(), metadata=None):
        super().__init__(items)
        self.metadata = dict(metadata or {})


def _bf16_to_f32(raw, shape):
    """bfloat16 bytes to float32: the 16 bits are a float32's upper half."""
    u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return u.view(np.float32).reshape(shape)


def _tensor(f, i):
    name, dtype = ctypes.c_char_p(), ctypes.c_char_p()
    ndim, nbytes = ctypes.c_size_t(), ctypes.c_size_t()
    shape = (ctypes.c_size_t * _MAX_DIMS)()
    _lib.call(_lib_.aft_api_file_tensor, f, i, ctypes.byref(name), ctypes.byref(dtype), ctypes.byref(ndim), shape,
              ctypes.byref(nbytes))
    dims = tuple(shape[d] for d in range(ndim.value))
    dt = dtype.value.decode("ascii")
    raw = np.empty(nbytes.value, dtype=np.uint8)
    _lib.call(_lib_.aft_api_file_copy, f, i, raw.ctypes.data, nbytes.value)
    if dt == "BF16":
        arr = _bf16_to_f32(raw, dims)
    else:
        arr = raw.view(np.dtype(_FROM_AFT[dt])).reshape(dims)
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
    return name.value.decode("utf-8"), arr


def load(path):
    """Read every tensor of a .npy, .npz or .safetensors file.

    Returns an aft.Tensors: a dict of numpy arrays, name to array, in the
    file's order (a .npy's one array is named "arr_0", as numpy's savez
    names it), with the file's metadata as .metadata (a dict of strings).
    The format comes from the file's first bytes. dtypes are the file's (F32
    float32, F16 float16, F64 float64, integers, BOOL bool), except BF16,
    which numpy lacks: it is read as float32 (exactly).

    The readers are aft's, with the CLI's checks and refusals (truncated
    data, sizes that overflow, zip bombs, pickles, ...): a file the CLI
    refuses raises ValueError with the CLI's message (OSError when it cannot
    be opened or read, MemoryError when it would not fit).
    """
    f = ctypes.c_void_p()
    _lib.call(_lib_.aft_api_file_read, ctypes.byref(f), path_bytes(path))
    try:
        out = Tensors()
        for i in range(_lib_.aft_api_file_count(f)):
            name, arr = _tensor(f, i)
            out[name] = arr
        key, value = ctypes.c_char_p(), ctypes.c_char_p()
        for i in range(_lib_.aft_api_file_metadata_count(f)):
            _lib_.aft_api_file_metadata(f, i, ctypes.byref(key), ctypes.byref(value))
            out.metadata[key.value.decode("utf-8")] = value.value.decode("utf-8")
        return out
    finally:
        _lib_.aft_api_file_free(f)


def _aft_dtype(a, name):
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    try:
        return _TO_AFT[dt], dt
    except KeyError:
        raise TypeError("%s: dtype %s cannot be saved (float16/32/64, integers up to 64 bits, bool)"
                        % (name, a.dtype)) from None


def _strs(seq, what):
    out = []
    for s in seq:
        if not isinstance(s, str):
            raise TypeError("%s must be strings, not %r" % (what, s))
        b = s.encode("utf-8")
        if b"\0" in b:
            raise ValueError("%s: %r holds a NUL character" % (what, s))
        out.append(b)
    return out


def save(path, arrays, metadata=None):
    """Write arrays to path atomically (beside it, renamed into place only
    when whole: on an error an existing file is untouched).

    arrays: a dict of name to array (anything numpy.asarray takes), or one
    array (named "arr_0"). The format comes from path's extension: .npy (one
    array, no metadata), .npz (no metadata) or .safetensors; metadata, a
    dict of strings to strings, goes to a .safetensors' __metadata__.
    dtypes are kept: float16, float32, float64, integers of 8 to 64 bits and
    bool; others (complex, object, strings) are a TypeError. Data are written
    little-endian in C order whatever the arrays' order and strides.
    aft's refusals (an unknown extension, names a format forbids, metadata
    where the format has none) are ValueError with aft's message; a
    directory that cannot be written is OSError.
    """
    if isinstance(arrays, dict):
        items = list(arrays.items())
    else:
        items = [("arr_0", arrays)]
    names = _strs([k for k, _ in items], "tensor names")
    dtypes, ndims, shapes, datas, keep = [], [], [], [], []
    for (name, v), bname in zip(items, names):
        a = np.asarray(v)
        if a.ndim > _MAX_DIMS:
            raise ValueError("%s: %d dimensions; aft's files hold at most %d" % (name, a.ndim, _MAX_DIMS))
        code, dt = _aft_dtype(a, name)
        a = np.asarray(a, dtype=dt, order="C")
        keep.append(a)
        dtypes.append(code.encode("ascii"))
        ndims.append(a.ndim)
        shapes.append((ctypes.c_size_t * max(a.ndim, 1))(*a.shape))
        datas.append(a.ctypes.data)
    meta = dict(metadata or {})
    keys = _strs(list(meta.keys()), "metadata keys")
    values = _strs(list(meta.values()), "metadata values")
    n, nm = len(items), len(keys)
    c_names = (ctypes.c_char_p * max(n, 1))(*names)
    c_dtypes = (ctypes.c_char_p * max(n, 1))(*dtypes)
    c_ndims = (ctypes.c_size_t * max(n, 1))(*ndims)
    c_shapes = (ctypes.POINTER(ctypes.c_size_t) * max(n, 1))(
        *[ctypes.cast(s, ctypes.POINTER(ctypes.c_size_t)) for s in shapes])
    c_data = (ctypes.c_void_p * max(n, 1))(*datas)
    c_keys = (ctypes.c_char_p * max(nm, 1))(*keys)
    c_values = (ctypes.c_char_p * max(nm, 1))(*values)
    _lib.call(_lib_.aft_api_file_write, path_bytes(path), n, c_names, c_dtypes, c_ndims, c_shapes, c_data, nm,
              c_keys, c_values)
