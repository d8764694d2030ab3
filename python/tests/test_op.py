"""aft.op and aft.op_backward: the bare operator against a float64 numpy
definition, and bit for bit against aft run and aft grad on a .safetensors
of q, k, v (the position bias in --weights)."""

import unittest

from common import TmpDir, aft, cli, close_to, np

B, T, C = 2, 7, 6


def reference(q, k, v, bias=None, causal=False, mask=None, window=None):
    """The definition in float64: out = sigmoid(q) * softmax over visible t'
    of k[t'] + w[t, t'], applied to v; a row with nothing visible is 0."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    Bn, Tn, _ = q.shape
    w = np.zeros((Tn, Tn)) if bias is None else np.asarray(bias, np.float64)[:Tn, :Tn].copy()
    t = np.arange(Tn)
    if window is not None:
        w[np.abs(t[:, None] - t[None, :]) >= window] = 0
    vis = np.ones((Bn, Tn, Tn), bool)
    if causal:
        vis &= t[None, :, None] >= t[None, None, :]
    if mask is not None:
        vis &= np.broadcast_to(np.asarray(mask) != 0, (Bn, Tn, Tn))
    logit = k[:, None, :, :] + w[None, :, :, None]  # (B, t, t', C)
    logit = np.where(vis[..., None], logit, -np.inf)
    m = logit.max(axis=2, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(logit - m)
    den = e.sum(axis=2)
    num = (e * v[:, None, :, :]).sum(axis=2)
    ctx = np.where(den > 0, num / np.where(den > 0, den, 1), 0)
    return ctx / (1 + np.exp(-q))


def inputs(seed=0, kc=C):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, C)).astype(np.float32)
    k = rng.standard_normal((B, T, kc)).astype(np.float32)
    v = rng.standard_normal((B, T, C)).astype(np.float32)
    bias = (rng.standard_normal((T + 2, T + 2)) * 0.5).astype(np.float32)
    return q, k, v, bias


class Op(TmpDir):
    def test_against_the_definition(self):
        q, k, v, bias = inputs()
        mask = np.random.default_rng(3).random((T, T)) < 0.7
        for kw in (dict(variant="full", bias=bias), dict(variant="full", bias=bias, causal=True),
                   dict(variant="local", bias=bias, window=3), dict(variant="local", bias=bias, window=2, causal=True),
                   dict(variant="simple"), dict(variant="simple", causal=True),
                   dict(variant="full", bias=bias, mask=mask)):
            with self.subTest(**{k2: v2 for k2, v2 in kw.items() if k2 not in ("bias", "mask")}):
                got = aft.op(q, k, v, **kw)
                ref = reference(q, k, v, **{k2: v2 for k2, v2 in kw.items() if k2 != "variant"})
                close_to(self, got, ref, 2e-5)

    def _cli(self, cmd, q, k, v, bias, args, bias_name="pos_bias"):
        qkv, out = self.path("qkv.safetensors"), self.path("out.%s" % ("npy" if cmd == "run" else "safetensors"))
        aft.save(qkv, {"q": q, "k": k, "v": v})
        more = []
        if bias is not None:
            aft.save(self.path("w.safetensors"), {bias_name: bias})
            more = ["--weights", self.path("w.safetensors")]
        cli(cmd, *args, *more, "--threads", 2, qkv, "-o", out)
        return aft.load(out)

    def test_same_bits_as_aft_run_and_grad(self):
        q, k, v, bias = inputs(1)
        rng = np.random.default_rng(5)
        mask = rng.random((B, T, T)) < 0.6
        np.save(self.path("mask.npy"), mask)
        conv_k = rng.standard_normal((B, T, 2)).astype(np.float32)
        conv_bias = rng.standard_normal((2, 5)).astype(np.float32)
        cases = [  # (CLI args, aft.op keywords, k, bias)
            (["--variant", "full"], dict(variant="full"), k, bias),
            (["--variant", "full", "--causal"], dict(variant="full", causal=True), k, bias),
            (["--variant", "local", "--window", "3", "--causal"], dict(variant="local", window=3, causal=True), k,
             bias),
            (["--variant", "full", "--mask", self.path("mask.npy")], dict(variant="full", mask=mask), k, bias),
            (["--variant", "conv", "--window", "3", "--heads", "2"], dict(variant="conv", window=3, heads=2),
             conv_k, conv_bias),
        ]
        dout = rng.standard_normal((B, T, C)).astype(np.float32)
        for args, kw, kk, bb in cases:
            with self.subTest(args=" ".join(args)):
                want = self._cli("run", q, kk, v, bb, args)["arr_0"]
                got = aft.op(q, kk, v, bias=bb, threads=2, **kw)
                self.assertTrue(np.array_equal(got, want))
                np.save(self.path("dout.npy"), dout)
                wg = self._cli("grad", q, kk, v, bb, args + ["--grad-output", self.path("dout.npy")])
                g = aft.op_backward(q, kk, v, dout, bias=bb, threads=2, **kw)
                for mine, theirs in (("q", "q"), ("k", "k"), ("v", "v"), ("bias", "pos_bias")):
                    self.assertTrue(np.array_equal(g[mine], wg[theirs]), mine)

    def test_backward_against_finite_differences(self):
        q, k, v, bias = inputs(2)
        q64, k64, v64, b64 = (a.astype(np.float64) for a in (q, k, v, bias))
        dout = np.random.default_rng(9).standard_normal((B, T, C))
        g = aft.op_backward(q, k, v, dout, variant="local", window=3, bias=bias, causal=True)
        f = lambda q_, k_, v_, b_: float((reference(q_, k_, v_, b_, causal=True, window=3) * dout).sum())  # noqa: E731
        h = 1e-6
        for name, arrs, idx in (("q", 0, (1, 3, 2)), ("k", 1, (0, 2, 4)), ("v", 2, (1, 6, 0)), ("bias", 3, (4, 3))):
            args = [q64, k64, v64, b64]
            up, dn = [a.copy() for a in args], [a.copy() for a in args]
            up[arrs][idx] += h
            dn[arrs][idx] -= h
            fd = (f(*up) - f(*dn)) / (2 * h)
            self.assertAlmostEqual(float(g[name][idx]), fd, delta=1e-4 * max(1.0, abs(fd)), msg=name)

    def test_output_and_layouts(self):
        q, k, v, bias = inputs(4)
        out = aft.op(q, k, v, variant="full", bias=bias)
        g = aft.op_backward(q, k, v, variant="full", bias=bias, output=True)
        close_to(self, g["out"], out, 1e-6)
        self.assertEqual(g["bias"].shape, bias.shape)
        # seq-first [T, B, C] and one sequence [T, C] give the same numbers
        tb = [np.ascontiguousarray(a.transpose(1, 0, 2)) for a in (q, k, v)]
        self.assertTrue(np.array_equal(aft.op(*tb, variant="full", bias=bias, layout="tbd"), out.transpose(1, 0, 2)))
        self.assertTrue(np.array_equal(aft.op(q[1], k[1], v[1], variant="full", bias=bias), out[1]))
        gt = aft.op_backward(*tb, variant="full", bias=bias, layout="tbd")
        self.assertTrue(np.array_equal(gt["k"], g["k"].transpose(1, 0, 2)))

    def test_precision(self):
        # bf16 within docs/design.md's bounds of the float64 definition; with
        # an engine farther than float32 rounding from float32 (the negative
        # control), without one float32's bits
        rng = np.random.default_rng(46)
        q, k, v = (rng.standard_normal((2, 40, 16)).astype(np.float32) for _ in range(3))
        bias = (rng.standard_normal((40, 40)) * 0.5).astype(np.float32)
        for causal in (False, True):
            ref = reference(q, k, v, bias, causal)
            f32 = aft.op(q, k, v, bias=bias, causal=causal)
            b16 = aft.op(q, k, v, bias=bias, causal=causal, precision="bf16")
            g32 = aft.op_backward(q, k, v, bias=bias, causal=causal)
            g16 = aft.op_backward(q, k, v, bias=bias, causal=causal, precision="bf16")
            if aft.bf16_engine() == "none":
                self.assertTrue(np.array_equal(f32, b16))
                self.assertTrue(np.array_equal(g32["q"], g16["q"]))
                continue
            rel = lambda a, r: np.linalg.norm(a - r) / np.linalg.norm(r)
            self.assertLess(rel(b16, ref), 5e-3)
            self.assertGreater(rel(b16, f32), 1e-5)
            for name in ("q", "k", "v"):
                self.assertGreater(rel(g16[name], g32[name]), 1e-5)
                self.assertLess(rel(g16[name], g32[name]), 1.2e-2)
        with self.assertRaisesRegex(ValueError, "precision takes f32 or bf16"):
            aft.op(q, k, v, precision="f8")

    def test_refusals(self):
        q, k, v, bias = inputs()
        with self.assertRaisesRegex(ValueError, "k: shape"):
            aft.op(q, k[:, :3], v)
        with self.assertRaisesRegex(ValueError, "v: shape"):
            aft.op(q, k, v[:1])
        with self.assertRaisesRegex(ValueError, "bias"):
            aft.op(q, k, v, bias=bias[0])
        with self.assertRaisesRegex(ValueError, "mask"):
            aft.op(q, k, v, bias=bias, mask=np.ones((T, T + 1)))
        with self.assertRaises(ValueError):
            aft.op(q, k, v, bias=bias[:3, :3])  # T beyond the bias: aft's message
        with self.assertRaises(ValueError):
            aft.op(q, k, v, variant="conv")  # no window
        with self.assertRaises(ValueError):
            aft.op_backward(q, k, v, np.ones((B, T, C + 1)))
        with self.assertRaises(ValueError):
            aft.op(q, k, v, variant="full", impl="slow")


if __name__ == "__main__":
    unittest.main()
