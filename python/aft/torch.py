"""aft's forward and backward inside PyTorch training.

``import aft.torch`` (PyTorch needed; ``import aft`` alone never imports it)
gives:

* :func:`layer` and :func:`op`: the AFT layer (projections included) and the
  bare operator as differentiable functions of CPU float32 tensors, through
  the :class:`torch.autograd.Function` classes :class:`LayerFunction` and
  :class:`OpFunction`, whose forward and backward are libaft's
  (``aft_api_layer_forward``/``_backward``, ``aft_api_op_forward``/
  ``_backward``);
* drop-in modules for the public PyTorch AFT modules, with their parameter
  names, shapes, registration order, initialisation and layouts, so a state
  dict saved from the peer loads with ``load_state_dict(strict=True)`` and
  ``torch.optim`` trains them:

  - :class:`AFTLocal`: labml's ``AFTLocal`` (labml_nn.transformers.aft),
    seq-first ``[T, B, d]``;
  - :class:`RishAFTFull`, :class:`RishAFTSimple`, :class:`RishAFTLocal`:
    rish-16's ``AFTFull``, ``AFTSimple`` and ``AFTLocal`` (aft_pytorch),
    ``[B, T, dim]``. (The prefix keeps rish-16's ``AFTLocal`` apart from
    labml's.)

Every tensor must be a CPU float32 tensor: another device or dtype raises
TypeError (aft computes in float32 on the CPU; convert with ``.float()`` or
``.cpu()``). Contiguous tensors are handed to the library in place, without
a copy; others are made contiguous first. The library's layer borrows the
parameters' memory and reads their values at every call, so an optimiser's
in-place updates are always seen (it is made again when a tensor moves). Errors from the
library raise ValueError (or OSError, MemoryError) with aft's one-line
message. Threads: each call runs on ``threads`` threads, by default
``torch.get_num_threads()``. The GIL is released while aft computes.
"""
import ctypes
import threading
import weakref

import torch
from torch import nn

from . import _lib

__all__ = ["layer", "op", "LayerFunction", "OpFunction", "AFTLocal", "RishAFTFull", "RishAFTSimple",
           "RishAFTLocal"]


# ------------------------------------------------------------------ the C calls
#
# Through aft's ctypes layer (aft._lib: the library, its argument types, its
# version checked at import, and its statuses raised as exceptions). Data
# pointers are c_void_p there: torch's data_ptr() goes in as it is.

_C = _lib.lib
_c_size_p = ctypes.POINTER(ctypes.c_size_t)
_F32, _STRIDED = torch.float32, torch.strided


def _ok(st, err):
    """Raises aft's error (ValueError, OSError, MemoryError) unless st is OK."""
    if st:
        _lib.raise_for(st, err)


# ------------------------------------------------------------------ checks

def _check(t, name):
    """t, a CPU float32 tensor, contiguous (a copy when it is not); TypeError
    for anything else."""
    if isinstance(t, torch.Tensor) and t.dtype is _F32 and t.is_cpu and t.layout is _STRIDED:
        return t if t.is_contiguous() else t.contiguous()
    if not isinstance(t, torch.Tensor):
        raise TypeError("aft.torch: %s is %s, not a torch.Tensor" % (name, type(t).__name__))
    if not t.is_cpu:
        raise TypeError("aft.torch: %s is on %s; aft computes on the CPU (move it with .cpu())" % (name, t.device))
    if t.dtype is not _F32:
        raise TypeError("aft.torch: %s is %s; aft computes in torch.float32 (convert it with .float())"
                        % (name, t.dtype))
    raise TypeError("aft.torch: %s is a %s tensor; aft takes dense (strided) tensors (use .to_dense())"
                    % (name, t.layout))


def _check_all(ts, names):
    """_check of every tensor of ts (named by names), in one quick pass when
    all are CPU float32, dense and contiguous (the usual case)."""
    try:
        for t in ts:
            if t.dtype is not _F32 or t.layout is not _STRIDED or not t.is_cpu or not t.is_contiguous():
                break
        else:
            return ts
    except AttributeError:
        pass
    return [_check(t, n) for t, n in zip(ts, names)]


def _threads(threads):
    if threads is None:
        return torch.get_num_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError("aft.torch: threads must be an int >= 0 (0: every core), not %r" % (threads,))
    return threads


def _options(**kw):
    """'key=value ...' for the library, None values left out."""
    parts = []
    for k, v in kw.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = int(v)
        elif isinstance(v, (tuple, list)):
            v = ",".join(str(int(i)) for i in v)
        parts.append("%s=%s" % (k, v))
    return " ".join(parts)


# ------------------------------------------------------------------ the layer

_KEEP = 64      # library layers a spec keeps, one for each place its weights live


class _LayerSpec:
    """What stays from call to call of one layer: its options, its weights'
    names, its layout and, for each set of shapes, the C arrays of the names
    and shapes, the model's D and the gradients' plan (which tensor each of
    aft's gradients belongs to).

    And the library's layers for the places the weights live (their
    addresses; several modules with the same names and options share a
    spec). aft_api_layer_new looks at names and shapes only; the layer
    borrows the arrays and reads their values at every call. So while the
    tensors stay where they are, which an optimiser's in-place steps do, the
    layer kept for their addresses and shapes is the layer made from their
    current memory; tensors elsewhere get a new one. One thread uses a layer
    at a time (the interface's rule for a handle): a call that finds it in
    use makes one of its own."""

    def __init__(self, names, options, layout):
        self.names = tuple(names)
        self.options = options
        self.layout = layout
        self.c_options = options.encode()
        n = len(self.names)
        self.c_names = (ctypes.c_char_p * max(1, n))(*[s.encode() for s in self.names])
        self._shaped = {}
        self._lock = threading.Lock()
        self._kept = {}         # addresses -> [layer, shaped()'s list, in use]

    def __del__(self):
        kept, self._kept = getattr(self, "_kept", {}), {}
        try:
            for e in kept.values():
                _C.aft_api_layer_free(e[0])
        except Exception:           # interpreter shutdown: the library may be gone
            pass

    def shaped(self, shapes):
        """[shapes, c_ndims, c_shapes, rows, D, grad plan, saved sizes] for these shapes
        (a tuple of torch.Size), made once for them (D and the plan filled in
        by the first layer made)."""
        got = self._shaped.get(shapes)
        if got is not None:
            return got
        n = len(shapes)
        rows = [(ctypes.c_size_t * max(1, len(s)))(*s) for s in shapes]
        c_ndims = (ctypes.c_size_t * max(1, n))(*[len(s) for s in shapes])
        c_shapes = (_c_size_p * max(1, n))(*[ctypes.cast(r, _c_size_p) for r in rows])
        got = [shapes, c_ndims, c_shapes, rows, None, None, {}]
        if len(self._shaped) >= _KEEP:
            self._shaped.clear()
        self._shaped[shapes] = got
        return got

    def _new(self, ptrs, sh, err):
        h = ctypes.c_void_p()
        n = len(ptrs)
        _ok(_C.aft_api_layer_new(ctypes.byref(h), n, self.c_names, (ctypes.c_void_p * max(1, n))(*ptrs), sh[1],
                                 sh[2], self.c_options, err), err)
        if sh[4] is None:
            d, c = ctypes.c_size_t(), ctypes.c_size_t()
            _C.aft_api_layer_dims(h, ctypes.byref(d), ctypes.byref(c))
            sh[4] = d.value
        return h

    def acquire(self, params, err):
        """(a library layer over params' memory, shaped()'s list, entry);
        params are contiguous float32 tensors in the order of names. Hand the
        layer back with release(layer, entry) when the call is done."""
        ptrs = tuple([p.data_ptr() for p in params])
        sh = self.shaped(tuple([p.shape for p in params]))
        with self._lock:
            e = self._kept.get(ptrs)
            if e is not None and not e[2]:
                if e[1] is sh:
                    e[2] = True
                    return e[0], sh, e
                del self._kept[ptrs]            # other shapes at these addresses
                _C.aft_api_layer_free(e[0])
        h = self._new(ptrs, sh, err)
        with self._lock:
            if ptrs not in self._kept:
                if len(self._kept) >= _KEEP:    # the rest were left behind: let them go
                    for k in [k for k, v in self._kept.items() if not v[2]]:
                        _C.aft_api_layer_free(self._kept.pop(k)[0])
                e = self._kept[ptrs] = [h, sh, True]
                return h, sh, e
        return h, sh, None

    def release(self, h, entry):
        if entry is None:
            _C.aft_api_layer_free(h)
        else:
            entry[2] = False

    def sizes(self, x, D):
        """(B, T) of the input x, checked against the layer's D."""
        if x.dim() != 3:
            raise ValueError("aft.torch: the layer's input must be 3-D, %s, not of shape %s"
                             % ("[T, B, d]" if self.layout == "tbd" else "[B, T, d]", list(x.shape)))
        if x.shape[2] != D:
            raise ValueError("aft.torch: the input has %d features, the layer's weights take %d" % (x.shape[2], D))
        return (x.shape[1], x.shape[0]) if self.layout == "tbd" else (x.shape[0], x.shape[1])

    def saved_size(self, h, sh, B, T, err):
        """the floats of aft_api_layer_forward_saved's buffer for (B, T),
        asked once for each"""
        key = (B, T)
        n = sh[6].get(key)
        if n is None:
            c = ctypes.c_size_t()
            _ok(_C.aft_api_layer_saved_size(h, B, T, ctypes.byref(c), err), err)
            n = c.value
            if len(sh[6]) >= _KEEP:
                sh[6].clear()
            sh[6][key] = n
        return n

    def plan(self, h, sh, err):
        """[(tensor index, shape)] of aft's gradients, in its order."""
        if sh[5] is None:
            out = []
            for i in range(_C.aft_api_layer_grad_count(h)):
                name = ctypes.c_char_p()
                ndim = ctypes.c_size_t()
                shape = (ctypes.c_size_t * 8)()
                _ok(_C.aft_api_layer_grad_info(h, i, ctypes.byref(name), ctypes.byref(ndim), shape, err), err)
                gname = name.value.decode()
                gshape = tuple(shape[j] for j in range(ndim.value))
                if gname not in self.names:
                    raise ValueError("aft.torch: aft's gradient %s names no tensor given" % gname)
                j = self.names.index(gname)
                if gshape != tuple(sh[0][j]):
                    raise ValueError("aft.torch: aft's gradient of %s is %s, the tensor %s"
                                     % (gname, list(gshape), list(sh[0][j])))
                out.append((j, gshape))
            sh[5] = out
        return sh[5]


class LayerFunction(torch.autograd.Function):
    """The AFT layer as a torch.autograd.Function:
    ``LayerFunction.apply(spec, save, x, *params)``, spec a _LayerSpec (what
    :func:`layer` makes: the options, the names of params, the layout), save
    whether a backward will follow (grad mode on and x or a param requiring
    grad). Forward is aft_api_layer_forward, or with save
    aft_api_layer_forward_saved, which keeps what the backward would compute
    again (Q, K, V, and full's sums) in a tensor of ctx; backward is
    aft_api_layer_backward_saved over it (the input's and every parameter's
    gradient, as aft grad computes them, bit for bit). Call :func:`layer` or
    the modules."""

    @staticmethod
    def forward(ctx, spec, save, x, *params):
        x = _check(x, "the input")
        params = _check_all(params, spec.names)
        y, saved = _layer_forward(spec, save, x, params)
        ctx.spec = spec
        ctx.save_for_backward(x, *params)
        ctx.saved = saved
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, *params = ctx.saved_tensors
        spec, saved = ctx.spec, ctx.saved
        ctx.saved = None            # the buffer goes with the step
        dy = _check(dy, "the output's gradient")
        grads = [None] * len(params)
        err = _lib.error_buffer()
        h, sh, kept = spec.acquire(params, err)
        try:
            B, T = spec.sizes(x, sh[4])
            plan = spec.plan(h, sh, err)
            ptrs = (ctypes.c_void_p * max(1, len(plan)))()
            for i, (j, shape) in enumerate(plan):
                if ctx.needs_input_grad[3 + j]:
                    grads[j] = torch.empty(shape, dtype=_F32)
                    ptrs[i] = grads[j].data_ptr()
            dx = torch.empty_like(x)
            if saved is not None:
                _ok(_C.aft_api_layer_backward_saved(h, dx.data_ptr(), ptrs, dy.data_ptr(), x.data_ptr(),
                                                    saved.data_ptr(), saved.numel(), B, T, err), err)
            else:
                _ok(_C.aft_api_layer_backward(h, dx.data_ptr(), ptrs, None, dy.data_ptr(), x.data_ptr(), B, T, err),
                    err)
        finally:
            spec.release(h, kept)
        return (None, None, dx if ctx.needs_input_grad[2] else None, *grads)


def _layer_forward(spec, save, x, params):
    """(y, the saved forward's buffer or None) of checked x and params"""
    err = _lib.error_buffer()
    h, sh, kept = spec.acquire(params, err)
    try:
        B, T = spec.sizes(x, sh[4])
        y = torch.empty_like(x)
        if save:
            n = spec.saved_size(h, sh, B, T, err)
            saved = torch.empty(n, dtype=_F32)
            _ok(_C.aft_api_layer_forward_saved(h, y.data_ptr(), saved.data_ptr(), n, x.data_ptr(), B, T, err), err)
        else:
            saved = None
            _ok(_C.aft_api_layer_forward(h, y.data_ptr(), x.data_ptr(), B, T, err), err)
    finally:
        spec.release(h, kept)
    return y, saved


def _apply(spec, x, params):
    """LayerFunction over x and params, saving for the backward when one
    can follow; with none to follow (torch.no_grad(), or nothing requires
    grad) the forward alone, without autograd's Function (a few us a call,
    what inference at small sizes notices)"""
    if torch.is_grad_enabled() and (getattr(x, "requires_grad", False) or any([p.requires_grad for p in params])):
        return LayerFunction.apply(spec, True, x, *params)
    return _layer_forward(spec, False, _check(x, "the input"), _check_all(params, spec.names))[0]


_SPECS = {}


def _spec(names, options, layout):
    """The _LayerSpec of (names, options, layout), made once."""
    key = (names, options, layout)
    s = _SPECS.get(key)
    if s is None:
        if len(_SPECS) > 256:
            _SPECS.clear()
        s = _SPECS[key] = _LayerSpec(names, options, layout)
    return s


def layer(x, weights, variant="full", window=None, causal=False, heads=None, layout="btd", grid=None,
          threads=None, precision=None):
    """y = the AFT layer on x, differentiable in x and every weight.

    x: a CPU float32 tensor ``[B, T, D]``, or ``[T, B, D]`` with
    ``layout="tbd"`` (labml's); y has x's shape. weights: a dict of CPU
    float32 tensors under the names a weights file has (``query|to_q``,
    ``key|to_k``, ``value|to_v``, ``output|project`` ``.weight`` as
    ``(out, in)`` with optional ``.bias``; ``pos_bias`` or ``wbias``, or
    ``pos_bias_u`` and ``pos_bias_v``), as ``aft run --weights`` finds them;
    labml's ``local_mask`` is left out (the window stands for it). variant,
    window, causal, heads, layout, grid and precision (``"f32"`` or
    ``"bf16"``) as ``aft run``'s options; threads:
    None for ``torch.get_num_threads()``, 0 for every core.
    Gradients flow to x and to every weight that requires them, computed by
    aft's backward (as ``aft grad``)."""
    if layout not in ("btd", "tbd"):
        raise ValueError("aft.torch: layout must be 'btd' or 'tbd', not %r" % (layout,))
    names = tuple(k for k in weights if k != "local_mask" and not k.endswith(".local_mask"))
    options = _options(variant=variant, window=window, causal=bool(causal), heads=heads, layout=layout,
                       grid=grid, threads=_threads(threads), precision=precision)
    return _apply(_spec(names, options, layout), x, [weights[k] for k in names])


# ------------------------------------------------------------------ the operator

def _op_sizes(q, k, v, bias):
    if q.dim() != 3 or v.dim() != 3 or k.dim() != 3:
        raise ValueError("aft.torch.op: q, k and v must be 3-D (B, T, C), not %s, %s and %s"
                         % (list(q.shape), list(k.shape), list(v.shape)))
    if q.shape != v.shape or k.shape[:2] != q.shape[:2]:
        raise ValueError("aft.torch.op: q and v must be (B, T, C) and k (B, T, C or heads): got %s, %s and %s"
                         % (list(q.shape), list(k.shape), list(v.shape)))
    B, T, C = q.shape
    rows = cols = 0
    if bias is not None:
        if bias.dim() == 1:
            rows, cols = 1, bias.shape[0]
        elif bias.dim() == 2:
            rows, cols = bias.shape
        else:
            raise ValueError("aft.torch.op: the bias must be 1-D or 2-D, not of shape %s" % list(bias.shape))
    return B, T, C, k.shape[2], rows, cols


def _mask(mask, B, T):
    """(address, batched, keep-alive) of a (T, T) or (B, T, T) mask as bytes."""
    if mask is None:
        return None, 0, None
    if not isinstance(mask, torch.Tensor):
        raise TypeError("aft.torch.op: mask is %s, not a torch.Tensor" % type(mask).__name__)
    if mask.device.type != "cpu":
        raise TypeError("aft.torch.op: mask is on %s; aft computes on the CPU" % mask.device)
    if mask.dtype not in (torch.bool, torch.uint8):
        mask = mask != 0
    if tuple(mask.shape) == (T, T):
        batched = 0
    elif tuple(mask.shape) == (B, T, T):
        batched = 1
    else:
        raise ValueError("aft.torch.op: mask must be (T, T) or (B, T, T) = %s, not %s"
                         % ([B, T, T], list(mask.shape)))
    mask = mask.contiguous()
    return mask.data_ptr(), batched, mask


class OpFunction(torch.autograd.Function):
    """The bare AFT operator as a torch.autograd.Function:
    ``OpFunction.apply(options, mask, q, k, v, bias)`` (bias may be None;
    mask None or a (T, T) / (B, T, T) bool tensor, not differentiated);
    forward is aft_api_op_forward_saved (it keeps, where the dense kernel
    runs, the sums its backward would compute again), backward
    aft_api_op_backward_saved over them (aft_api_op_backward's bits). Use
    :func:`op`."""

    @staticmethod
    def forward(ctx, options, mask, q, k, v, bias):
        q, k, v = _check(q, "q"), _check(k, "k"), _check(v, "v")
        if bias is not None:
            bias = _check(bias, "the bias")
        B, T, C, kc, rows, cols = _op_sizes(q, k, v, bias)
        m, batched, keep = _mask(mask, B, T)
        out = torch.empty_like(q)
        err = _lib.error_buffer()
        c_opts = options.encode()
        bp = None if bias is None else bias.data_ptr()
        n = ctypes.c_size_t()
        _ok(_C.aft_api_op_saved_size(B, T, C, kc, bp, rows, cols, m, batched, c_opts, ctypes.byref(n), err), err)
        saved = torch.empty(n.value, dtype=_F32)
        _ok(_C.aft_api_op_forward_saved(out.data_ptr(), saved.data_ptr(), n.value, q.data_ptr(), k.data_ptr(),
                                        v.data_ptr(), B, T, C, kc, bp, rows, cols, m, batched, c_opts, err), err)
        ctx.options, ctx.mask, ctx.has_bias, ctx.saved = options, keep, bias is not None, saved
        ctx.save_for_backward(q, k, v, *([bias] if bias is not None else []))
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, *rest = ctx.saved_tensors
        bias = rest[0] if rest else None
        saved, ctx.saved = ctx.saved, None
        dout = _check(dout, "the output's gradient")
        B, T, C, kc, rows, cols = _op_sizes(q, k, v, bias)
        m, batched, _ = _mask(ctx.mask, B, T)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dbias = torch.empty_like(bias) if bias is not None and ctx.needs_input_grad[5] else None
        err = _lib.error_buffer()
        args = (q.data_ptr(), k.data_ptr(), v.data_ptr())
        tail = (B, T, C, kc, None if bias is None else bias.data_ptr(), rows, cols, m, batched, ctx.options.encode(),
                err)
        grads = (dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), None if dbias is None else dbias.data_ptr())
        if saved is not None:
            _ok(_C.aft_api_op_backward_saved(*grads, dout.data_ptr(), *args, saved.data_ptr(), saved.numel(), *tail),
                err)
        else:                       # a second backward (retain_graph): the buffer went with the first
            _ok(_C.aft_api_op_backward(*grads, None, dout.data_ptr(), *args, *tail), err)
        need = ctx.needs_input_grad
        return (None, None, dq if need[2] else None, dk if need[3] else None, dv if need[4] else None, dbias)


def op(q, k, v, variant="full", bias=None, causal=False, mask=None, window=None, heads=None, grid=None,
       threads=None, precision=None):
    """out = the bare AFT operator, differentiable in q, k, v and bias.

    q, v: CPU float32 ``(B, T, C)``; k: ``(B, T, C)``, or ``(B, T, heads)``
    for conv; bias: None, or for full and local ``(Tmax, Tmax)`` with
    Tmax >= T, for conv ``(heads or 1, 2S - 1)``; mask: None, or a
    ``(T, T)`` or ``(B, T, T)`` tensor, nonzero = visible (not
    differentiated). variant, window, heads, causal, grid and precision as
    ``aft run``'s options; threads: None for ``torch.get_num_threads()``, 0 for every
    core. out: ``(B, T, C)``."""
    options = _options(variant=variant, window=window, heads=heads, causal=bool(causal), grid=grid,
                       threads=_threads(threads), precision=precision)
    return OpFunction.apply(options, mask, q, k, v, bias)


# ------------------------------------------------------------------ the modules

def _band(n, s):
    """bool (n, n): True where |i - j| < s (labml's local_mask)."""
    i = torch.arange(n)
    return (i[:, None] - i[None, :]).abs() < s


class _Checked:
    """Remembers the last tensor found good (by identity and version), so
    that a mask or local_mask passed again unchanged is not compared again.
    Not state: a copy or a pickle of the module starts empty."""

    def __init__(self):
        self._ref, self._version = None, None

    def __reduce__(self):
        return (_Checked, ())

    def seen(self, t):
        return self._ref is not None and self._ref() is t and self._version == t._version

    def remember(self, t):
        self._ref, self._version = weakref.ref(t), t._version


class _Layer(nn.Module):
    """What the drop-in modules share: their weights handed to
    LayerFunction under their state-dict names, which _ROLES lists with
    where each lives: (name, submodule or "", parameter)."""

    #: threads for aft's calls: None (the default) for torch.get_num_threads(), 0 for every core
    threads = None
    #: the products' number type, "f32" (the default) or "bf16" (aft run --precision)
    precision = "f32"
    _ROLES = ()

    def _weights(self):
        """(names, tensors) of the weights the module has now (a Linear
        without bias has none)."""
        names, tensors = [], []
        for name, sub, attr in self._ROLES:
            p = (self._modules[sub] if sub else self)._parameters[attr]
            if p is not None:
                names.append(name)
                tensors.append(p)
        return tuple(names), tensors

    def _run(self, x, layout, options):
        """the layer on x with the module's weights: options (variant,
        window, causal), then layout and threads"""
        names, tensors = self._weights()
        if self.precision not in ("f32", "bf16"):
            raise ValueError("aft.torch: precision must be 'f32' or 'bf16', not %r" % (self.precision,))
        options = "%s layout=%s threads=%d precision=%s" % (options, layout, _threads(self.threads), self.precision)
        return _apply(_spec(names, options, layout), x, tensors)


def _linear_roles(*subs):
    return tuple((sub + "." + attr, sub, attr) for sub in subs for attr in ("weight", "bias"))


class AFTLocal(_Layer):
    """labml's AFTLocal (labml_nn/transformers/aft), forward and backward by
    aft: ``aft.torch.AFTLocal(d_model, seq_len, local_window_size,
    bias=True)``.

    Its parameters as labml's, registered in the same order with the same
    initialisation (so the same seed gives the same weights, and a state
    dict or an optimiser's state moves between the two): ``query``, ``key``,
    ``value`` (Linear d_model -> d_model, bias optional), ``pos_bias``
    (seq_len, seq_len) zeros, ``local_mask`` (seq_len, seq_len) bool
    Parameter without gradient, True where ``|t - t'| < local_window_size``,
    ``output`` (Linear, with bias). State dict: pos_bias, local_mask,
    query.*, key.*, value.*, output.*.

    ``forward(*, query, key, value, mask=None)``: seq-first ``[T, B,
    d_model]`` tensors, T <= seq_len. aft computes self-attention, so query,
    key and value must be the same tensor (labml's TransformerLayer passes
    one); mask is None (every key visible) or labml's causal mask
    (``subsequent_mask(T)``: bool ``[T, T, 1]``, or ``[T, T, B]``, lower
    triangle True), which selects aft's causal layer; any other mask is a
    ValueError. The result is labml's (the position bias kept inside the
    window, 0 outside it) without its overflow: aft subtracts the maximum
    of K + w per query, so keys far apart do not give NaN. ``local_mask``
    must be the band of local_window_size (as labml makes it)."""

    _ROLES = _linear_roles("query", "key", "value", "output") + (("pos_bias", "", "pos_bias"),)

    def __init__(self, d_model, seq_len, local_window_size, bias=True):
        super().__init__()
        self.local_window_size = local_window_size
        self.query = nn.Linear(d_model, d_model, bias=bias)
        self.key = nn.Linear(d_model, d_model, bias=bias)
        self.value = nn.Linear(d_model, d_model, bias=bias)
        self.pos_bias = nn.Parameter(torch.zeros(seq_len, seq_len), requires_grad=True)
        self.local_mask = nn.Parameter(_band(seq_len, local_window_size), requires_grad=False)
        self.output = nn.Linear(d_model, d_model)
        self._mask_ok = _Checked()
        self._band_ok = _Checked()

    def extra_repr(self):
        return "seq_len=%d, local_window_size=%d" % (self.pos_bias.shape[0], self.local_window_size)

    def _causal(self, mask, T, B):
        """True for labml's causal mask, False for None; else an error."""
        if mask is None:
            return False
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError("aft.torch.AFTLocal: mask must be None or labml's causal mask, a bool tensor "
                            "[T, T, 1] (subsequent_mask), not %s"
                            % (mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__))
        if self._mask_ok.seen(mask):
            return True
        if mask.device.type != "cpu":
            raise TypeError("aft.torch.AFTLocal: mask is on %s; aft computes on the CPU" % mask.device)
        if mask.dim() != 3 or tuple(mask.shape[:2]) != (T, T) or mask.shape[2] not in (1, B):
            raise ValueError("aft.torch.AFTLocal: mask must be None or labml's causal mask [T, T, 1] "
                             "(or [T, T, B]) = %s, not of shape %s" % ([T, T, 1], list(mask.shape)))
        tril = torch.ones(T, T, dtype=torch.bool).tril_().unsqueeze(-1)
        if not torch.equal(mask, tril.expand(mask.shape)):
            raise ValueError("aft.torch.AFTLocal: mask is not causal (True exactly where t' <= t): aft's "
                             "layer takes labml's causal mask or None, no other mask")
        self._mask_ok.remember(mask)
        return True

    def _check_band(self):
        m = self.local_mask
        if self._band_ok.seen(m):
            return
        if m.dim() != 2 or m.shape != self.pos_bias.shape or \
                not torch.equal(m.detach().bool(), _band(m.shape[0], self.local_window_size)):
            raise ValueError("aft.torch.AFTLocal: local_mask is not the band |t - t'| < %d over %s that labml "
                             "makes for local_window_size %d"
                             % (self.local_window_size, list(self.pos_bias.shape), self.local_window_size))
        self._band_ok.remember(m)

    def forward(self, *, query, key, value, mask=None):
        if not (query is key and key is value):
            raise ValueError("aft.torch.AFTLocal: aft computes self-attention: query, key and value must be "
                             "the same tensor (labml's TransformerLayer passes one)")
        if not isinstance(query, torch.Tensor) or query.dim() != 3:
            raise ValueError("aft.torch.AFTLocal: query must be a [T, B, d_model] tensor")
        causal = self._causal(mask, query.shape[0], query.shape[1])
        self._check_band()
        return self._run(query, "tbd", "variant=local window=%d causal=%d" % (self.local_window_size, causal))


class _Rish(_Layer):
    """rish-16's modules' projections: to_q, to_k, to_v (Linear dim ->
    hidden_dim) and project (Linear hidden_dim -> dim), registered and
    initialised in that order."""

    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.dim = dim
        self.hidden_dim = hidden_dim
        self.to_q = nn.Linear(dim, hidden_dim)
        self.to_k = nn.Linear(dim, hidden_dim)
        self.to_v = nn.Linear(dim, hidden_dim)
        self.project = nn.Linear(hidden_dim, dim)

    _ROLES = _linear_roles("to_q", "to_k", "to_v", "project")

    def _input(self, x):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError("aft.torch.%s: x must be a [B, T, dim] tensor" % type(self).__name__)
        return x


class RishAFTFull(_Rish):
    """rish-16's AFTFull (aft_pytorch), forward and backward by aft:
    ``aft.torch.RishAFTFull(max_seqlen, dim, hidden_dim=64)``.

    Parameters as rish-16's, in its order and initialisation: to_q, to_k,
    to_v, project, and ``wbias`` (max_seqlen, max_seqlen), xavier_uniform_.
    ``forward(x)``: x ``[B, T, dim]``, T <= max_seqlen, not causal. The
    result is rish-16's without its overflow (it subtracts no maximum: keys
    or biases above about 88 give NaN there, not here)."""

    _ROLES = _Rish._ROLES + (("wbias", "", "wbias"),)

    def __init__(self, max_seqlen, dim, hidden_dim=64):
        super().__init__(dim, hidden_dim)
        self.wbias = nn.Parameter(torch.empty(max_seqlen, max_seqlen))
        nn.init.xavier_uniform_(self.wbias)

    def forward(self, x):
        return self._run(self._input(x), "btd", "variant=full")


class RishAFTSimple(_Rish):
    """rish-16's AFTSimple (aft_pytorch), forward and backward by aft:
    ``aft.torch.RishAFTSimple(max_seqlen, dim, hidden_dim=64)`` (max_seqlen
    accepted and unused, as there). Parameters: to_q, to_k, to_v, project.
    ``forward(x)``: x ``[B, T, dim]``; every t gets the same context
    (softmax of K over time times V, summed over time)."""

    def __init__(self, max_seqlen, dim, hidden_dim=64):
        super().__init__(dim, hidden_dim)

    def forward(self, x):
        return self._run(self._input(x), "btd", "variant=simple")


class RishAFTLocal(RishAFTFull):
    """rish-16's AFTLocal (aft_pytorch), forward and backward by aft:
    ``aft.torch.RishAFTLocal(max_seqlen, dim, hidden_dim=64, s=256)``.

    Parameters as RishAFTFull's (wbias included), plus the attributes
    max_seqlen and s. The bias is kept where ``|t - t'| < s`` and is 0
    outside (those keys still count), as rish-16 computes it. Unlike
    rish-16's forward, which replaces ``wbias`` by a band-masked copy (a new
    Parameter, so an optimiser built before it no longer trains it), this
    one leaves ``wbias`` in place: it reads the band only, and the gradient
    outside the band is 0. A state dict saved from rish-16's module before
    or after its first forward gives the same outputs."""

    def __init__(self, max_seqlen, dim, hidden_dim=64, s=256):
        super().__init__(max_seqlen, dim, hidden_dim)
        self.max_seqlen = max_seqlen
        self.s = s

    def forward(self, x):
        return self._run(self._input(x), "btd", "variant=local window=%d" % self.s)
