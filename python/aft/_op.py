"""aft.op and aft.op_backward: the bare operator on q, k, v
(aft_api_op_forward, aft_api_op_backward)."""

import numpy as np

from . import _lib
from ._util import as_f32, as_mask, options, shape_str

_lib_ = _lib.lib


class _Args:
    """q, k, v, bias and mask checked and converted, with the sizes."""

    def __init__(self, q, k, v, bias, mask, layout):
        if layout not in ("btd", "tbd"):
            raise ValueError("layout: 'btd' or 'tbd', not %r" % (layout,))
        self.tbd = layout == "tbd"
        self.q, self.k, self.v = (self._btd(as_f32(a, n), n) for a, n in ((q, "q"), (k, "k"), (v, "v")))
        self.B, self.T, self.C = self.q.shape
        self.kc = self.k.shape[2]
        for name, a, last in (("k", self.k, self.kc), ("v", self.v, self.C)):
            if a.shape != (self.B, self.T, last):
                raise ValueError("%s: shape %s, but q is %s" % (name, shape_str(a.shape), shape_str(self.q.shape)))
        if min(self.B, self.T, self.C, self.kc) == 0:
            raise ValueError("q, k, v: shapes %s, %s, %s are empty"
                             % (shape_str(self.q.shape), shape_str(self.k.shape), shape_str(self.v.shape)))
        self.bias = None if bias is None else as_f32(bias, "bias")
        if self.bias is not None and self.bias.ndim != 2:
            raise ValueError("bias: shape %s; a bias is 2-D: [Tmax, Tmax] (full, local) or [heads, 2S-1] (conv)"
                             % shape_str(self.bias.shape))
        self.bias_rows, self.bias_cols = (0, 0) if self.bias is None else self.bias.shape
        self.mask, self.mask_batched = None, 0
        if mask is not None:
            self.mask = as_mask(mask, "mask")
            if self.mask.shape == (self.T, self.T):
                pass
            elif self.mask.shape == (self.B, self.T, self.T):
                self.mask_batched = 1
            else:
                raise ValueError("mask: shape %s; [T, T] or [B, T, T] is wanted, T = %d, B = %d"
                                 % (shape_str(self.mask.shape), self.T, self.B))
        self.rank = np.ndim(q)
        self.shape = (self.T, self.C) if self.rank == 2 else (self.T, self.B, self.C) if self.tbd \
            else (self.B, self.T, self.C)

    def _btd(self, a, name):
        if a.ndim == 2:
            return a.reshape(1, a.shape[0], a.shape[1])
        if a.ndim != 3:
            raise ValueError("%s: shape %s; [B, T, C] ([T, B, C] with layout 'tbd') or [T, C] is wanted"
                             % (name, shape_str(a.shape)))
        return np.ascontiguousarray(a.transpose(1, 0, 2)) if self.tbd else a

    def out(self, arr):
        """A (B, T, C) result in the caller's layout and rank."""
        if self.rank == 2:
            return arr.reshape(arr.shape[1], arr.shape[2])
        return np.ascontiguousarray(arr.transpose(1, 0, 2)) if self.tbd else arr


def _opts(variant, window, heads, causal, threads, impl, grid, precision):
    return options(variant=variant, window=window, heads=heads, causal=bool(causal), threads=threads, impl=impl,
                   grid=grid, precision=precision)


def op(q, k, v, variant="full", bias=None, causal=False, mask=None, window=None, heads=None, layout="btd",
       threads=None, impl=None, grid=None, precision=None):
    """The bare AFT operator, as `aft run` computes it on a file of q, k, v:

        out[b,t,c] = sigmoid(q[b,t,c]) * sum_t' exp(k[b,t',c] + w[t,t']) v[b,t',c]
                                       / sum_t' exp(k[b,t',c] + w[t,t'])

    q, v: [B, T, C] ([T, B, C] with layout "tbd") or [T, C]; k: the same
    with kc channels (C, or conv's heads). bias: None, or the position bias
    w: [Tmax, Tmax] for full and local (Tmax >= T: its top-left block), or
    [heads or 1, 2S-1] for conv. mask: None, [T, T] or [B, T, T], nonzero =
    visible. variant, window, heads, causal, threads, impl, grid and
    precision as aft.Layer's. Any real dtype, order and strides (converted to float32).
    Returns out, float32, q's shape.
    """
    a = _Args(q, k, v, bias, mask, layout)
    out = np.empty((a.B, a.T, a.C), dtype=np.float32)
    _lib.call(_lib_.aft_api_op_forward, out.ctypes.data, a.q.ctypes.data, a.k.ctypes.data, a.v.ctypes.data, a.B,
              a.T, a.C, a.kc, None if a.bias is None else a.bias.ctypes.data, a.bias_rows, a.bias_cols,
              None if a.mask is None else a.mask.ctypes.data, a.mask_batched,
              _opts(variant, window, heads, causal, threads, impl, grid, precision))
    return a.out(out)


def op_backward(q, k, v, dout=None, variant="full", bias=None, causal=False, mask=None, window=None, heads=None,
                layout="btd", threads=None, impl=None, grid=None, output=False, precision=None):
    """The bare operator's gradients of L = sum(out * dout), as `aft grad`
    computes them on a file of q, k, v.

    Arguments as aft.op's, and dout: dL/dout, q's shape (default: ones).
    Returns a dict: "q", "k", "v" (each its input's shape) and, with a bias,
    "bias" (the bias's shape; entries the run did not use are 0). output:
    also the forward output, as "out" (in the same call).
    """
    a = _Args(q, k, v, bias, mask, layout)
    if dout is None:
        d = np.ones((a.B, a.T, a.C), dtype=np.float32)
    else:
        d = as_f32(dout, "dout")
        if d.shape != tuple(a.shape):
            raise ValueError("dout: shape %s, but out is %s" % (shape_str(d.shape), shape_str(a.shape)))
        d = a._btd(d, "dout")
    dq, dv = np.empty_like(a.q), np.empty_like(a.v)
    dk = np.empty_like(a.k)
    db = None if a.bias is None else np.empty_like(a.bias)
    out = np.empty_like(a.q) if output else None
    _lib.call(_lib_.aft_api_op_backward, dq.ctypes.data, dk.ctypes.data, dv.ctypes.data,
              None if db is None else db.ctypes.data, None if out is None else out.ctypes.data, d.ctypes.data,
              a.q.ctypes.data, a.k.ctypes.data, a.v.ctypes.data, a.B, a.T, a.C, a.kc,
              None if a.bias is None else a.bias.ctypes.data, a.bias_rows, a.bias_cols,
              None if a.mask is None else a.mask.ctypes.data, a.mask_batched,
              _opts(variant, window, heads, causal, threads, impl, grid, precision))
    grads = {"q": a.out(dq), "k": a.out(dk), "v": a.out(dv)}
    if db is not None:
        grads["bias"] = db
    if output:
        grads["out"] = a.out(out)
    return grads
