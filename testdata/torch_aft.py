"""PyTorch versions of the public AFT modules, shared by the fixture maker
(testdata/make_torch_fixtures.py) and the side-by-side timing
(testdata/bench_torch.py), and a .safetensors writer for their state dicts.

Each module mirrors the computation and the parameter names (hence the
state_dict keys, shapes, dtypes and order) of one public PyTorch class,
operation for operation, so both its results and its cost are upstream's;
nothing is imported from those projects. What each mirrors is stated on the
class; testdata/torch/README.md records the upstream facts they rest on.
Imports torch: bench_torch.py loads this only in its worker processes.
"""
import json
import struct

import torch
from torch import nn


def band(n, s):
    """bool (n, n): True where |i - j| < s."""
    i = torch.arange(n)
    return (i[:, None] - i[None, :]).abs() < s


class LabmlAFTLocal(nn.Module):
    """Mirrors labml AFTLocal (labmlai/annotated_deep_learning_paper_implementations,
    labml_nn/transformers/aft/__init__.py).

    Same parameters, registered in the same order: query, key, value
    (Linear d_model->d_model, bias optional), pos_bias (seq_len, seq_len) float
    Parameter (upstream initialises it to zeros), local_mask (seq_len, seq_len)
    BOOL Parameter with requires_grad=False, True where |t - t'| < s (upstream
    builds it with tril(.., s-1) then triu(.., -(s-1))), output (Linear, always
    with bias).  Layout [seq, batch, d].  forward(query=, key=, value=, mask=)
    takes mask of shape [T_q, T_k, batch or 1] (bool, True = visible; upstream
    applies ~mask unconditionally, so mask=None fails there).  Computation:
      w   = pos_bias[:T,:T] * local_mask[:T,:T]   (0 outside the window,
             keys outside the window stay visible)
      w   = w[..., None] filled with -inf where ~mask
      ek  = exp(K - max over ALL t' of K)            (per batch, channel)
      ew  = exp(w - max over t' of w)                (per query row, batch)
      y   = sigmoid(Q) * einsum(ew, ek*V) / einsum(ew, ek);  output(y)
    The two maxima are taken separately, not the max of K + w.
    """

    def __init__(self, d_model, seq_len, local_window_size, bias=True):
        super().__init__()
        self.local_window_size = local_window_size
        self.query = nn.Linear(d_model, d_model, bias=bias)
        self.key = nn.Linear(d_model, d_model, bias=bias)
        self.value = nn.Linear(d_model, d_model, bias=bias)
        self.pos_bias = nn.Parameter(torch.zeros(seq_len, seq_len))
        self.local_mask = nn.Parameter(band(seq_len, local_window_size),
                                       requires_grad=False)
        self.activation = nn.Sigmoid()
        self.output = nn.Linear(d_model, d_model)

    def forward(self, *, query, key, value, mask):
        T = query.shape[0]
        q = self.query(query)
        k = self.key(key)
        v = self.value(value)
        w = (self.pos_bias[:T, :T] * self.local_mask[:T, :T]).unsqueeze(-1)
        w.masked_fill_(~mask, float("-inf"))     # in place, as upstream
        k_max = k.max(dim=0, keepdim=True).values
        w_max = w.max(dim=1, keepdim=True).values
        ek = torch.exp(k - k_max)
        ew = torch.exp(w - w_max)
        num = torch.einsum("ijb,jbd->ibd", ew, ek * v)
        den = torch.einsum("ijb,jbd->ibd", ew, ek)
        return self.output(self.activation(q) * num / den)


def labml_causal_mask(T):
    """What labml_nn/transformers/utils.py subsequent_mask(T) returns:
    lower-triangular bool, shape [T, T, 1]."""
    return torch.ones(T, T).tril().bool().unsqueeze(-1)


class _RishProjections(nn.Module):
    """rish-16's modules all start with to_q, to_k, to_v (Linear
    dim->hidden_dim) and project (Linear hidden_dim->dim), registered (and
    initialised) in that order."""

    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.dim = dim
        self.hidden_dim = hidden_dim
        self.to_q = nn.Linear(dim, hidden_dim)
        self.to_k = nn.Linear(dim, hidden_dim)
        self.to_v = nn.Linear(dim, hidden_dim)
        self.project = nn.Linear(hidden_dim, dim)


class RishAFTFull(_RishProjections):
    """Mirrors rish-16 AFTFull (rish-16/aft-pytorch, aft_pytorch/aft_pytorch.py).

    Parameters in upstream's order: to_q, to_k, to_v (Linear dim->hidden_dim),
    project (Linear hidden_dim->dim, present even when dim == hidden_dim),
    wbias (max_seqlen, max_seqlen), xavier_uniform_ initialised.  Layout
    [B, T, dim].  Computation, with no max subtracted anywhere:
      ew = exp(wbias[:T,:T])   (evaluated twice, as upstream)
      y  = project(sigmoid(Q) * (ew @ (exp(K) * V)) / (ew @ exp(K)))
    """

    def __init__(self, max_seqlen, dim, hidden_dim=64):
        super().__init__(dim, hidden_dim)
        self.wbias = nn.Parameter(torch.empty(max_seqlen, max_seqlen))
        nn.init.xavier_uniform_(self.wbias)

    def _core(self, x, w):
        T = x.shape[1]
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        wt = w[:T, :T].unsqueeze(0)
        # exp(w) and exp(K) evaluated twice each, as upstream does
        num = torch.exp(wt) @ (torch.exp(k) * v)
        den = torch.exp(wt) @ torch.exp(k)
        return self.project(torch.sigmoid(q) * num / den)

    def forward(self, x):
        return self._core(x, self.wbias)


class RishAFTSimple(_RishProjections):
    """Mirrors rish-16 AFTSimple (same file).  Constructor takes max_seqlen but
    has no position bias.  Parameters: to_q, to_k, to_v, project.
      y = project(sigmoid(Q) * sum over T of (softmax(K, dim=1) * V))
    dim=1 is the time axis of [B, T, hidden]; the weighted sum keeps dim, so
    every t gets the same context vector."""

    def __init__(self, max_seqlen, dim, hidden_dim=64):
        super().__init__(dim, hidden_dim)

    def forward(self, x):
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        ctx = (torch.softmax(k, dim=1) * v).sum(dim=1, keepdim=True)
        return self.project(torch.sigmoid(q) * ctx)


class RishAFTLocal(RishAFTFull):
    """Mirrors rish-16 AFTLocal (same file).  Same parameters as AFTFull plus
    plain attributes max_seqlen and s.  Upstream forward first REPLACES
    self.wbias by a new Parameter holding wbias[i][j] where |i - j| < s
    (math.fabs, symmetric) and 0 elsewhere, over the whole max_seqlen square,
    then computes exactly as AFTFull with the replaced wbias.  Outside the
    window w is 0, so those keys still count (exp(K) * 1).
    Upstream builds the replacement with torch.Tensor(nested list), i.e. in
    the default dtype (float32) on the CPU, detached from the old parameter;
    this mirror keeps the old dtype/device so it can also run in float64 --
    the values are the same."""

    def __init__(self, max_seqlen, dim, hidden_dim=64, s=256):
        super().__init__(max_seqlen, dim, hidden_dim)
        self.max_seqlen = max_seqlen
        self.s = s

    def forward(self, x):
        keep = band(self.max_seqlen, self.s).to(self.wbias.device)
        masked = torch.where(keep, self.wbias.detach(),
                             torch.zeros((), dtype=self.wbias.dtype))
        self.wbias = nn.Parameter(masked)
        return self._core(x, self.wbias)


ST_DTYPE = {torch.float32: ("F32", "<f4"), torch.float64: ("F64", "<f8"),
            torch.float16: ("F16", "<f2"), torch.bool: ("BOOL", "|b1")}


def tensor_bytes(t):
    """(safetensors dtype, raw little-endian bytes) of a torch tensor."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return "BF16", t.view(torch.int16).numpy().astype("<i2").tobytes()
    name, npdt = ST_DTYPE[t.dtype]
    return name, t.numpy().astype(npdt).tobytes()


def write_safetensors(path, named, metadata=None):
    """named: list of (name, torch tensor), written in that order."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name, t in named:
        dt, raw = tensor_bytes(t)
        header[name] = {"dtype": dt, "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


class PaperAFTConv2d(nn.Module):
    """AFT-conv on an H x W grid written from the paper's formula (Zhai et
    al. 2021, AFT-conv), per head, with torch.nn.functional.conv2d (groups =
    channels):

      Y = sigmoid(Q) * (conv2d(e^K * V, e^w - 1) + sum e^K * V)
                     / (conv2d(e^K, e^w - 1) + sum e^K)

    w the head's (2S-1, 2S-1) kernel, zero-padded at the borders (S - 1 on
    each side), the sums over the whole grid. K is first shifted by its
    maximum over the grid per channel (a shift that cancels in the ratio).
    Parameters: to_q, to_v (Linear dim -> hidden), to_k (dim -> heads, one key
    channel per head as in the paper, or dim -> hidden with key_per_head
    False), project (hidden -> dim), pos_bias (heads, 2S-1, 2S-1), or (2S-1,
    2S-1) shared by every head with shared_kernel. Layout [B, H, W, dim].
    """

    def __init__(self, dim, hidden, heads, S, key_per_head=True, shared_kernel=False):
        super().__init__()
        self.heads, self.S = heads, S
        self.to_q = nn.Linear(dim, hidden)
        self.to_k = nn.Linear(dim, heads if key_per_head else hidden)
        self.to_v = nn.Linear(dim, hidden)
        self.project = nn.Linear(hidden, dim)
        shape = (2 * S - 1, 2 * S - 1) if shared_kernel else (heads, 2 * S - 1, 2 * S - 1)
        self.pos_bias = nn.Parameter(torch.zeros(shape))

    def op(self, q, k, v):
        """q, v: (B, H, W, C); k: (B, H, W, heads or C) -> (B, H, W, C)"""
        C = v.shape[-1]
        ch = C // self.heads
        if k.shape[-1] != C:
            k = k.repeat_interleave(C // k.shape[-1], dim=-1)
        q, k, v = (t.permute(0, 3, 1, 2) for t in (q, k, v))          # (B, C, H, W)
        k = k - k.amax(dim=(2, 3), keepdim=True)
        ek = torch.exp(k)
        ekv = ek * v
        w = self.pos_bias if self.pos_bias.dim() == 3 else self.pos_bias.expand(self.heads, -1, -1)
        kern = (torch.exp(w) - 1).repeat_interleave(ch, dim=0).unsqueeze(1)   # (C, 1, 2S-1, 2S-1)
        pad = self.S - 1
        num = torch.nn.functional.conv2d(ekv, kern, padding=pad, groups=C) + ekv.sum(dim=(2, 3), keepdim=True)
        den = torch.nn.functional.conv2d(ek, kern, padding=pad, groups=C) + ek.sum(dim=(2, 3), keepdim=True)
        return (torch.sigmoid(q) * num / den).permute(0, 2, 3, 1)

    def forward(self, x):
        return self.project(self.op(self.to_q(x), self.to_k(x), self.to_v(x)))


def grid_window(H, W, S):
    """bool (H W, H W): True where |r - r'| < S and |c - c'| < S, raster order."""
    r = torch.arange(H * W) // W
    c = torch.arange(H * W) % W
    return ((r[:, None] - r[None, :]).abs() < S) & ((c[:, None] - c[None, :]).abs() < S)


class GridAFTLocal(_RishProjections):
    """AFT-local on an H x W grid as the paper defines it: the learned bias
    pos_bias (Tmax, Tmax), indexed in raster order, kept inside the 2-D window
    |r - r'| < S, |c - c'| < S and 0 outside it (those keys still count), then
      y = sigmoid(Q) * (exp(w) @ (exp(K) V)) / (exp(w) @ exp(K))
    over the T = H W tokens, with the key's maximum per channel and the bias's
    maximum per query row subtracted first (shifts that cancel in the ratio).
    Parameters as rish-16's (to_q, to_k, to_v, project) plus pos_bias.
    Layout [B, H, W, dim]."""

    def __init__(self, max_tokens, dim, hidden_dim, S):
        super().__init__(dim, hidden_dim)
        self.S = S
        self.pos_bias = nn.Parameter(torch.zeros(max_tokens, max_tokens))

    def forward(self, x):
        B, H, W, _ = x.shape
        T = H * W
        xs = x.reshape(B, T, -1)
        q, k, v = self.to_q(xs), self.to_k(xs), self.to_v(xs)
        w = self.pos_bias[:T, :T] * grid_window(H, W, self.S)
        w = w - w.amax(dim=1, keepdim=True)
        ek = torch.exp(k - k.amax(dim=1, keepdim=True))
        ew = torch.exp(w)
        y = torch.sigmoid(q) * (ew @ (ek * v)) / (ew @ ek)
        return self.project(y).reshape(B, H, W, -1)
