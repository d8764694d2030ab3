"""What every part of the package checks and converts before a call into
libaft: arrays (to C-contiguous float32, or refused), options (to the
interface's "key=value ..." string) and paths."""

import operator
import os

import numpy as np

# dtype kinds that convert to float32 as numbers: bool, signed and unsigned
# integers, floats. Complex (it would drop the imaginary part), object,
# strings, bytes, datetimes and structured records are refused.
_REAL_KINDS = "biuf"


def as_f32(x, name):
    """x as a C-contiguous float32 ndarray: x itself when it already is one
    (no copy: the caller's memory), a converted copy otherwise (another
    dtype, a strided or reversed view, Fortran order, big-endian). TypeError
    for a dtype that is not real numbers."""
    if type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous and x.dtype.isnative:
        return x
    a = np.asarray(x)
    if a.dtype.kind not in _REAL_KINDS:
        raise TypeError("%s: dtype %s is not real numbers (float32 is wanted)" % (name, a.dtype))
    return np.asarray(a, dtype=np.float32, order="C")


def as_mask(x, name):
    """x as a C-contiguous uint8 array, 1 where x is nonzero (visible)."""
    a = np.asarray(x)
    if a.dtype.kind not in _REAL_KINDS:
        raise TypeError("%s: dtype %s is not a mask (bool or numbers, nonzero = visible)" % (name, a.dtype))
    return np.asarray(a != 0, dtype=np.uint8, order="C")


def as_tokens(x, n_vocab, name="tokens"):
    """x as a C-contiguous int32 array of token ids, each in [0, n_vocab)."""
    a = np.asarray(x)
    if a.size == 0 and a.dtype.kind in _REAL_KINDS:
        a = a.astype(np.int32)  # np.asarray([]) is float64
    if a.dtype.kind not in "iu":
        raise TypeError("%s: dtype %s is not integers (token ids)" % (name, a.dtype))
    if a.size:
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi >= n_vocab:
            bad = lo if lo < 0 else hi
            raise ValueError("%s: token id %d is outside the vocabulary [0, %d)" % (name, bad, n_vocab))
    return np.asarray(a, dtype=np.int32, order="C")


def check_out(out, shape, name):
    """out, an array the caller gives for a result: it must be a C-contiguous
    float32 ndarray of shape (written in place, never converted)."""
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or not out.dtype.isnative \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise TypeError("%s: an output array must be a writeable C-contiguous float32 ndarray" % name)
    if out.shape != tuple(shape):
        raise ValueError("%s: shape %s, but the result is %s" % (name, out.shape, tuple(shape)))
    return out


def result(out, shape, name):
    """out checked (check_out), or a new float32 array of shape."""
    if out is None:
        return np.empty(shape, dtype=np.float32)
    return check_out(out, shape, name)


def shape_str(shape):
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def size(v, key, lo=0):
    """A whole number in [lo, 2**64) for key (an int, never a float cut
    short, never one that C's size_t would wrap)."""
    try:
        n = operator.index(v)
    except TypeError:
        raise TypeError("%s: a whole number is wanted, not %r" % (key, v)) from None
    if not lo <= n < 1 << 64:
        raise ValueError("%s: a whole number from %d to 2**64 - 1 is wanted, not %d" % (key, lo, n))
    return n


def _word(v, key):
    s = str(v)
    if not s or any(c.isspace() for c in s) or "\0" in s:
        raise ValueError("%s: %r: a value may not be empty or hold spaces" % (key, s))
    return s


def options(**kw):
    """The interface's options string: key=value for every keyword not None,
    in the order given. Booleans are 1/0, grids H,W, sizes whole numbers."""
    parts = []
    for key, v in kw.items():
        if v is None:
            continue
        if key == "causal":
            s = "1" if v else "0"
        elif key in ("window", "heads", "threads"):
            s = str(size(v, key))
        elif key == "grid":
            try:
                h, w = v
            except (TypeError, ValueError):
                raise TypeError("grid: (H, W) is wanted, not %r" % (v,)) from None
            s = "%d,%d" % (size(h, "grid"), size(w, "grid"))
        elif key == "prefix" and v == "":
            continue
        else:
            s = _word(v, key)
        parts.append("%s=%s" % (key, s))
    return " ".join(parts).encode("utf-8")


def path_bytes(p):
    """A path for C: bytes, without NUL (ValueError)."""
    b = os.fsencode(os.fspath(p))
    if b"\0" in b:
        raise ValueError("%r: a path may not hold a NUL byte" % (p,))
    return b


def addr(a):
    """The address of an ndarray's data (None for None)."""
    return None if a is None else a.ctypes.data
