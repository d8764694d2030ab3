"""aft.Model: labml's AFT language model (aft_api_model_*), as aft model,
aft generate, aft encode and aft decode run it."""

import ctypes
import threading

import numpy as np

from . import _lib
from ._util import as_tokens, options, path_bytes, shape_str, size

_lib_ = _lib.lib


class Model(_lib.Owned):
    """labml's autoregressive AFT model (AutoregressiveTransformer) from a
    .safetensors of its state_dict(), as `aft model` and `aft generate` run
    it (sizes, vocabulary and each layer's variant from the tensors).

    Model(path, window=None, threads=1, precision=None)

    window: the layers' window S (default: the checkpoint's). threads:
    threads for its calls (0: the cores it may run on). precision: "f32" (default) or
    "bf16", as aft.Layer's. A checkpoint the CLI refuses is a
    ValueError with its message (OSError if it cannot be read).

    Attributes: n_vocab (V), d_model (D), context (the most tokens one pass
    reads; None: unbounded), vocab (the tokens' texts, by id).
    One model serialises its calls; distinct models run at once.
    """

    def __init__(self, path, window=None, threads=1, precision=None):
        self._h, self._lock = None, threading.Lock()
        h = ctypes.c_void_p()
        _lib.call(_lib_.aft_api_model_open, ctypes.byref(h), path_bytes(path),
                  options(window=window, threads=threads, precision=precision))
        self._h = h
        v, d, ctx = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
        _lib_.aft_api_model_dims(h, ctypes.byref(v), ctypes.byref(d), ctypes.byref(ctx))
        self.n_vocab, self.d_model = v.value, d.value
        self.context = None if ctx.value == ctypes.c_size_t(-1).value else ctx.value
        self.vocab = []
        for i in range(self.n_vocab):
            t = _lib_.aft_api_model_token(h, i)
            self.vocab.append(None if t is None else t.decode("utf-8", "replace"))
        self._token_bytes = max([len(t.encode("utf-8")) for t in self.vocab if t is not None] or [1])

    def close(self, _free=_lib_.aft_api_model_free):
        """Free the model now; any later call raises ValueError."""
        self._release(_free)

    def __repr__(self):
        return "aft.Model(V=%d, D=%d)" % (self.n_vocab, self.d_model) if self._h else "aft.Model(closed)"

    def _handle(self):
        if not self._h:
            raise ValueError("the model is closed")
        return self._h

    def logits(self, tokens, layout="btd"):
        """The logits of token ids, as `aft model`: tokens [T] or [B, T]
        (layout "tbd": [T, B]), integers in [0, V). Returns float32 [T, V] or
        [B, T, V] ([T, B, V] with "tbd")."""
        if layout not in ("btd", "tbd"):
            raise ValueError("layout: 'btd' or 'tbd', not %r" % (layout,))
        t = as_tokens(tokens, self.n_vocab)
        if t.ndim not in (1, 2):
            raise ValueError("tokens: shape %s; [T] or [B, T] is wanted" % shape_str(t.shape))
        if t.size == 0:
            raise ValueError("tokens: shape %s is empty" % shape_str(t.shape))
        tbd = layout == "tbd" and t.ndim == 2
        tb = np.ascontiguousarray(t.T) if tbd else t.reshape(1, -1) if t.ndim == 1 else t
        B, T = tb.shape
        out = np.empty((B, T, self.n_vocab), dtype=np.float32)
        with self._lock:
            _lib.call(_lib_.aft_api_model_logits, self._handle(), out.ctypes.data, tb.ctypes.data, B, T)
        if t.ndim == 1:
            return out.reshape(T, self.n_vocab)
        return np.ascontiguousarray(out.transpose(1, 0, 2)) if tbd else out

    def encode(self, text):
        """Text to token ids (int32 [n]), as `aft encode`: a character outside
        the vocabulary is a ValueError naming it."""
        if not isinstance(text, str):
            raise TypeError("text: a str is wanted, not %s" % type(text).__name__)
        b = text.encode("utf-8")
        cap = len(b)
        ids = np.empty(max(cap, 1), dtype=np.int32)
        n = ctypes.c_size_t()
        with self._lock:
            _lib.call(_lib_.aft_api_model_encode, self._handle(), ids.ctypes.data, cap, ctypes.byref(n), b, len(b))
        if n.value > cap:  # cannot happen: a character is at least a byte
            raise ValueError("text: %d tokens from %d bytes" % (n.value, cap))
        return ids[:n.value].copy()

    def decode(self, ids):
        """Token ids ([n], integers in [0, V)) to text, as `aft decode` (without
        its final newline)."""
        t = as_tokens(ids, self.n_vocab, "ids")
        if t.ndim != 1:
            raise ValueError("ids: shape %s; [n] is wanted" % shape_str(t.shape))
        out = []
        for i in t.tolist():
            if self.vocab[i] is None:
                raise ValueError("ids: token id %d has no text" % i)
            out.append(self.vocab[i])
        return "".join(out)

    def generate(self, prompt, n, temperature=1.0, top_k=0, seed=0, greedy=False):
        """n new tokens after prompt, as `aft generate` with the same
        arguments: the prompt in one pass, then one step of every layer's
        state a token. temperature 0 or greedy=True: the most likely token
        every time (PyTorch's greedy text); otherwise draws with probability
        proportional to exp(logit / temperature), among the top_k most likely
        (0: all), reproducible by seed. Returns the new text (not the prompt;
        aft generate prints both)."""
        if not isinstance(prompt, str):
            raise TypeError("prompt: a str is wanted, not %s" % type(prompt).__name__)
        n, top_k, seed = size(n, "n"), size(top_k, "top_k"), size(seed, "seed")
        temperature = float(temperature)
        if not temperature >= 0:
            raise ValueError("temperature: a number >= 0 is wanted (0: greedy), not %r" % temperature)
        if greedy:
            temperature = 0.0
        p = prompt.encode("utf-8")
        if b"\0" in p:
            raise ValueError("prompt: holds a NUL character")
        cap = min(n * self._token_bytes + 1, 1 << 20)  # a longer text is asked for again, whole
        while True:
            buf = ctypes.create_string_buffer(cap)
            need = ctypes.c_size_t()
            with self._lock:
                _lib.call(_lib_.aft_api_model_generate, self._handle(), buf, cap, ctypes.byref(need), p, n,
                          temperature, top_k, seed)
            if need.value <= cap:  # the whole text and its NUL
                return buf.raw[:need.value - 1].decode("utf-8", "replace")
            cap = need.value
