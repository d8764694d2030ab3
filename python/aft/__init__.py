"""aft: the Attention Free Transformer (Zhai et al., 2021) from Python and
numpy, through libaft.so (ctypes; no compiled extension).

The API mirrors the aft command line:

    aft.load(path) -> dict of arrays     aft.save(path, arrays, metadata=None)
    aft.Layer(weights, variant=..., window=..., causal=..., ...)
        .forward(x) -> y   .backward(x, dy) -> dict of gradients   .stream() -> aft.State
    aft.State: .step(chunk), .save(path), aft.State.load(path, layer, batch)
    aft.op(q, k, v, ...) -> out          aft.op_backward(q, k, v, dout, ...) -> dict
    aft.Model(path): .logits(tokens), .generate(prompt, n, ...), .encode(text), .decode(ids)
    aft.levels(), aft.level(), aft.use_level(name): the CPU kernel levels

Outputs are the CLI's, bit for bit, for the same files and options. Inputs
of any real dtype, order or strides are converted to C-contiguous float32
(never misread); shapes are checked before any call. aft's errors raise
ValueError (bad arguments or file contents), OSError (a file that cannot be
read or written) or MemoryError, with aft's one-line message; a dtype that
is not real numbers raises TypeError. The GIL is released while aft
computes. threads= sets the threads of a call (default: the cores it may run on; Model:
1). AFT_LIBRARY names the libaft.so to load; AFT_KERNELS chooses the kernel
level, as for the CLI. aft.torch (PyTorch modules) is imported on its own.
"""

import collections
import ctypes
import os

from . import _lib
from ._files import Tensors, load, save
from ._layer import Layer, State
from ._model import Model
from ._op import op, op_backward

__version__ = "0.1.0"
API_VERSION = _lib.API_VERSION
__all__ = ["load", "save", "Tensors", "Layer", "State", "op", "op_backward", "Model", "levels", "level",
           "use_level", "bf16_engine", "library_path", "API_VERSION"]

#: where libaft.so was loaded from
library_path = _lib.path

LevelInfo = collections.namedtuple("LevelInfo", "name needs runs why in_use")
LevelInfo.__doc__ = """A kernel level built into libaft: its name ("base", "avx2", "avx512"
or "fixed"), what it needs, whether this CPU and OS run it, why not, and
whether it is the level in use."""


def levels():
    """The kernel levels built in, lowest first, as LevelInfo tuples (name,
    needs, runs, why, in_use), as `aft --version` lists them. Asking
    chooses the level if none is chosen yet (the highest this CPU runs)."""
    n = ctypes.c_size_t()
    p = _lib.lib.aft_levels(ctypes.byref(n))
    used = _lib.lib.aft_level_in_use()
    return [LevelInfo(p[i].name.decode(), p[i].needs.decode(), bool(p[i].runs),
                      p[i].why.decode("utf-8", "replace"), i == used) for i in range(n.value)]


def level():
    """The name of the kernel level in use ("avx512", "avx2", "base" or
    "fixed")."""
    return [lv.name for lv in levels() if lv.in_use][0]


def bf16_engine():
    """The bf16 engine precision="bf16" runs its products on at the kernel
    level in use: "amx", "avx512_bf16", or "none" (they then run in
    float32)."""
    return _lib.lib.aft_bf16_engine_in_use().decode()


def use_level(name):
    """Run the kernels at level name from now on, as AFT_KERNELS=name does
    for the CLI. ValueError for a level this build lacks or this CPU does not
    run, or once kernels have run at another level (choose before the
    first call)."""
    _lib.call(_lib.lib.aft_level_use, str(name).encode("utf-8"))


def _level_from_env():
    want = os.environ.get("AFT_KERNELS")
    if want:
        try:
            use_level(want)
        except ValueError as e:
            raise ImportError("aft: AFT_KERNELS=%s: %s" % (want, e)) from None


_level_from_env()
