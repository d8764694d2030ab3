"""aft.Layer and aft.State: one AFT layer (its projections around the
operator), forward, backward and streaming (aft_api_layer_*, aft_api_state_*)."""

import ctypes
import os
import threading
import weakref

import numpy as np

from . import _lib
from ._files import load
from ._util import as_f32, options, path_bytes, result, shape_str, size

_lib_ = _lib.lib
_P_SIZE = ctypes.POINTER(ctypes.c_size_t)


class Layer(_lib.Owned):
    """One AFT layer, as `aft run --weights` and `aft grad` run it.

    Layer(weights, variant="full", window=None, causal=False, heads=None,
          prefix="", layout="btd", threads=None, impl=None, grid=None, precision=None)

    weights: a dict of arrays named as a weights file names them (query|to_q,
        key|to_k, value|to_v, output|project .weight and .bias, pos_bias or
        wbias, pos_bias_u/_v, local_mask), or a path to a .safetensors, .npz
        or .npy file, read with aft.load. Found and checked as `aft run
        --weights` finds and checks them.
    variant: "full", "local", "simple" or "conv".
    window: S (local, conv): keep the position bias where |t - t'| < S.
    causal: sums over t' <= t only.
    heads: conv's heads (default: from the bias).
    prefix: prepended to every weight name ("encoder.layers.2.self_attn.").
    layout: "btd" (x is [B, T, D]) or "tbd" (labml's [T, B, D]).
    threads: threads (default None: the library's, the cores it may run on).
    impl: "fast" (default) or "reference" (the float64 kernels).
    grid: (H, W): the T = H*W rows are a grid in raster order.
    precision: "f32" (default) or "bf16": the products with bf16 operands
        and float32 sums where the CPU has bf16 arithmetic (aft.bf16_engine()
        says which; "none": float32), as `aft run --precision bf16`.

    Each keyword becomes the interface's options string (window=4
    causal=1 ...); None leaves the library's default. A bad value or a
    combination the library refuses is a ValueError with aft's message.

    Weights that are C-contiguous float32 ndarrays are borrowed, not copied:
    the layer reads their memory at every call (a training loop that updates
    them in place needs no new layer); others are converted into copies the
    layer keeps. Distinct layers run at once from distinct threads (the GIL
    is released during compute); one layer serialises its calls.

    Attributes: d_model (D), d_hidden (C), grad_names (what backward
    returns, in order), options (the options string).
    """

    def __init__(self, weights, variant="full", window=None, causal=False, heads=None, prefix="", layout="btd",
                 threads=None, impl=None, grid=None, precision=None):
        self._h, self._lock = None, threading.Lock()
        if isinstance(weights, (str, bytes, os.PathLike)):
            weights = load(weights)
        if not isinstance(weights, dict):
            raise TypeError("weights: a dict of arrays or a path is wanted, not %s" % type(weights).__name__)
        if layout not in ("btd", "tbd"):
            raise ValueError("layout: 'btd' or 'tbd', not %r" % (layout,))
        self.options = options(variant=variant, window=window, heads=heads, causal=bool(causal), layout=layout,
                               threads=threads, impl=impl, prefix=prefix, grid=grid, precision=precision)
        self.layout = layout
        self.grid = None if grid is None else (int(grid[0]), int(grid[1]))
        self._states = weakref.WeakSet()  # closed before the layer: they borrow it
        self._arrays = []
        names, shapes, ndims, datas = [], [], [], []
        for name, v in weights.items():
            if not isinstance(name, str):
                raise TypeError("weights: names must be strings, not %r" % (name,))
            if "\0" in name:
                raise ValueError("weights: %r: a name may not hold a NUL character" % (name,))
            a = as_f32(v, name)
            self._arrays.append(a)
            names.append(name.encode("utf-8"))
            ndims.append(a.ndim)
            shapes.append((ctypes.c_size_t * max(a.ndim, 1))(*a.shape))
            datas.append(a.ctypes.data)
        n = len(names)
        h = ctypes.c_void_p()
        _lib.call(_lib_.aft_api_layer_new, ctypes.byref(h), n, (ctypes.c_char_p * max(n, 1))(*names),
                  (ctypes.c_void_p * max(n, 1))(*datas), (ctypes.c_size_t * max(n, 1))(*ndims),
                  (_P_SIZE * max(n, 1))(*[ctypes.cast(s, _P_SIZE) for s in shapes]), self.options)
        self._h = h
        d, c = ctypes.c_size_t(), ctypes.c_size_t()
        _lib_.aft_api_layer_dims(h, ctypes.byref(d), ctypes.byref(c))
        self.d_model, self.d_hidden = d.value, c.value
        self._grads = self._grad_info()
        self.grad_names = [g[0] for g in self._grads]

    def _grad_info(self):
        out = []
        name, ndim = ctypes.c_char_p(), ctypes.c_size_t()
        shape = (ctypes.c_size_t * 4)()
        for i in range(_lib_.aft_api_layer_grad_count(self._h)):
            _lib.call(_lib_.aft_api_layer_grad_info, self._h, i, ctypes.byref(name), ctypes.byref(ndim), shape)
            out.append((name.value.decode("utf-8"), tuple(shape[d] for d in range(ndim.value))))
        return out

    def close(self, _free=_lib_.aft_api_layer_free):
        """Free the layer now (it is freed when collected otherwise), and the
        states made from it first; any later call raises ValueError."""
        for s in list(getattr(self, "_states", ())):
            s.close()
        self._release(_free)

    def __repr__(self):
        return "aft.Layer(%s, D=%d, C=%d)" % (self.options.decode(), self.d_model, self.d_hidden) \
            if self._h else "aft.Layer(closed)"

    def _handle(self):
        if not self._h:
            raise ValueError("the layer is closed")
        return self._h

    def _sizes(self, x, name="x"):
        """(B, T) of an input x in the layer's layout: [B, T, D] (tbd:
        [T, B, D]), [T, D] (B = 1), or on a grid [B, H, W, D]."""
        shape = x.shape
        if x.ndim == 2:
            B, T = 1, shape[0]
        elif x.ndim == 3:
            B, T = (shape[1], shape[0]) if self.layout == "tbd" else (shape[0], shape[1])
        elif x.ndim == 4 and self.grid is not None and self.layout == "btd":
            if tuple(shape[1:3]) != self.grid:
                raise ValueError("%s: a grid of %d x %d, but the layer's grid is %d x %d"
                                 % (name, shape[1], shape[2], self.grid[0], self.grid[1]))
            B, T = shape[0], shape[1] * shape[2]
        else:
            want = "[T, B, D] or [T, D]" if self.layout == "tbd" else "[B, T, D] or [T, D]"
            if self.grid is not None and self.layout == "btd":
                want += " or [B, H, W, D]"
            raise ValueError("%s: shape %s; the layer takes %s" % (name, shape_str(shape), want))
        if shape[-1] != self.d_model:
            raise ValueError("%s: shape %s, but the layer's D is %d" % (name, shape_str(shape), self.d_model))
        if B == 0 or T == 0:
            raise ValueError("%s: shape %s is empty" % (name, shape_str(shape)))
        return B, T

    def forward(self, x, out=None):
        """y = the layer of x, as `aft run` computes it.

        x: [B, T, D] ([T, B, D] with layout "tbd"), [T, D] (one sequence) or,
        on a grid, [B, H, W, D]; any real dtype, order or strides (converted
        to C-contiguous float32). Returns y, float32 in x's shape (D is both
        the input's and the output's features); out: an array to write it
        into instead (C-contiguous float32 of that shape).
        """
        x = as_f32(x, "x")
        B, T = self._sizes(x)
        y = result(out, x.shape, "out")
        with self._lock:
            _lib.call(_lib_.aft_api_layer_forward, self._handle(), y.ctypes.data, x.ctypes.data, B, T)
        return y

    __call__ = forward

    def backward(self, x, dy=None, out=None, wanted=None, y=None):
        """The gradients of L = sum(y * dy) for the input and every parameter,
        as `aft grad` computes them.

        x: as forward's. dy: dL/dy, y's shape (default: ones). Returns a dict
        named as aft grad names them: "input" (dL/dx, x's shape), then each
        weight, bias and position bias under its name in the weights, in
        their shapes (grad_names lists them). A bias the layer lacks has no
        entry.

        wanted: the names to compute (default all, "input" too); the others
        are skipped and not in the dict. out: a dict of arrays to write some
        gradients into (C-contiguous float32 of the gradient's shape; the
        rest are allocated). y: an array to receive the forward output as
        well (y's shape), in the same call.
        """
        x = as_f32(x, "x")
        B, T = self._sizes(x)
        if dy is None:
            dy = np.ones(x.shape, dtype=np.float32)
        else:
            dy = as_f32(dy, "dy")
            if dy.shape != x.shape:
                raise ValueError("dy: shape %s, but the output is %s" % (shape_str(dy.shape), shape_str(x.shape)))
        out = dict(out or {})
        known = {"input"} | set(self.grad_names)
        for k in list(out) + list(wanted or []):
            if k not in known:
                raise ValueError("%r: not a gradient of this layer (%s)" % (k, ", ".join(sorted(known))))
        grads = {}
        if wanted is None or "input" in wanted or "input" in out:
            grads["input"] = result(out.get("input"), x.shape, "input")
        ptrs = (ctypes.c_void_p * max(len(self._grads), 1))()
        for i, (name, shape) in enumerate(self._grads):
            if wanted is None or name in wanted or name in out:
                grads[name] = result(out.get(name), shape, name)
                ptrs[i] = grads[name].ctypes.data
        if y is not None:
            result(y, x.shape, "y")
        dx = grads.get("input")
        with self._lock:
            _lib.call(_lib_.aft_api_layer_backward, self._handle(), None if dx is None else dx.ctypes.data, ptrs,
                      None if y is None else y.ctypes.data, dy.ctypes.data, x.ctypes.data, B, T)
        return grads

    def stream(self, batch=1):
        """A streaming state at position 0 for batch sequences: a causal
        layer fed a few rows at a time (aft.State)."""
        return State(self, batch)


class State(_lib.Owned):
    """A causal layer's streaming state (`aft run --state-in/--state-out`):
    a sequence fed in chunks of any size gives the one-shot causal output to
    rounding. Made by Layer.stream(batch) or State.load(path, layer, batch).

    step(chunk) runs the next rows; position is the rows run so far;
    save(path) writes the CLI's state file, which `aft run --state-in` and
    State.load read. The state keeps its layer (and the layer its weights).
    """

    def __init__(self, layer, batch=1):
        self._h, self._lock = None, threading.Lock()
        if not isinstance(layer, Layer):
            raise TypeError("layer: an aft.Layer is wanted, not %s" % type(layer).__name__)
        self.layer = layer
        self.batch = size(batch, "batch", lo=1)
        h = ctypes.c_void_p()
        with layer._lock:
            _lib.call(_lib_.aft_api_state_new, ctypes.byref(h), layer._handle(), self.batch)
            self._h = h
            layer._states.add(self)

    @classmethod
    def load(cls, path, layer, batch=1):
        """A state for layer and batch sequences, read from a state file
        (State.save's or aft run --state-out's); one made for other weights,
        options or batch is refused (ValueError naming what differs)."""
        s = cls(layer, batch)
        with s._lock:
            _lib.call(_lib_.aft_api_state_load, s._handle(), path_bytes(path))
        return s

    def close(self, _free=_lib_.aft_api_state_free):
        """Free the state now; any later call raises ValueError."""
        self._release(_free)

    def _handle(self):
        if not self._h:
            raise ValueError("the state is closed")
        return self._h

    @property
    def position(self):
        """The rows run so far (loaded states: the saved position)."""
        with self._lock:
            return _lib_.aft_api_state_position(self._handle())

    def step(self, x, out=None):
        """The next rows: x [B, n, D] ([n, B, D] with the layer's layout
        "tbd"; [n, D] when batch is 1), converted to float32. Returns their
        outputs in x's shape (out: an array to write them into)."""
        x = as_f32(x, "x")
        B, n = self.layer._sizes(x)
        if B != self.batch:
            raise ValueError("x: shape %s holds %d sequences, but the state runs %d"
                             % (shape_str(x.shape), B, self.batch))
        y = result(out, x.shape, "out")
        tbd = self.layer.layout == "tbd" and x.ndim == 3 and B > 1
        xb = np.ascontiguousarray(x.transpose(1, 0, 2)) if tbd else x
        yb = np.empty(xb.shape, dtype=np.float32) if tbd else y
        with self._lock:
            _lib.call(_lib_.aft_api_state_step, self._handle(), yb.ctypes.data, xb.ctypes.data, n)
        if tbd:
            y[...] = yb.transpose(1, 0, 2)
        return y

    def save(self, path):
        """Write the state (a .safetensors, atomically), as aft run
        --state-out does."""
        with self._lock:
            _lib.call(_lib_.aft_api_state_save, self._handle(), path_bytes(path))
