"""A NaN key reaches exactly the outputs whose sums hold it, fast and
reference alike: aft.op and aft.op_backward against the set written from
the rule, for every variant, causal or not, with masks, on a grid, with
keys one per head, and on 1 and 2 threads.

The rule (exact arithmetic, IEEE NaN): key t' of channel c is in the sum of
row t when t sees t' (the mask lets it, and under causality t' <= t),
whatever the bias w[t, t'] is (NaN + -inf is NaN, as 0 * a NaN value is).
Then out[t, c] and dq[t, c] are NaN for every row t that sees a NaN key of
channel c; dk[j, c] and dv[j, c] for every key j such a row sees (its
denominator is NaN); the bias gradient's entry w[t, j] for j seen by a row
t reached in any channel (of its head), where w[t, j] is a parameter."""

import unittest

from common import aft, np

IMPLS = ("fast", "reference")


def visible(B, T, causal, mask):
    t = np.arange(T)
    vis = np.ones((B, T, T), bool)
    if causal:
        vis &= t[:, None] >= t[None, :]
    if mask is not None:
        vis &= np.broadcast_to(np.asarray(mask) != 0, (B, T, T))
    return vis


def expected(k, C, causal, mask):
    """(out and dq, dk and dv, rows reached per (b, t, head)) NaN sets"""
    B, T, kc = k.shape
    nan = np.isnan(k)
    if kc != C:
        nan = np.repeat(nan, C // kc, axis=2)
    vis = visible(B, T, causal, mask)
    y = np.einsum("btj,bjc->btc", vis.astype(np.int64), nan.astype(np.int64)) > 0
    kv = np.einsum("btj,btc->bjc", vis.astype(np.int64), y.astype(np.int64)) > 0
    return y, kv, vis


def nan_keys(rng, B, T, kc, n):
    k = rng.standard_normal((B, T, kc)).astype(np.float32)
    for _ in range(n):
        k[rng.integers(B), rng.integers(T), rng.integers(kc)] = np.nan
    return k


class NanKeys(unittest.TestCase):
    def check(self, B, T, C, kw, kc=None, causal=False, mask=None, nnan=2, seed=0, bias_check=None):
        rng = np.random.default_rng(seed)
        kc = kc or C
        q = rng.standard_normal((B, T, C)).astype(np.float32)
        v = rng.standard_normal((B, T, C)).astype(np.float32)
        k = nan_keys(rng, B, T, kc, nnan)
        y_exp, kv_exp, vis = expected(k, C, causal, mask)
        kw = dict(kw, causal=causal, mask=mask)
        outs = {}
        for impl in IMPLS:
            for threads in (1, 2):
                what = "%s %s threads=%d" % (kw.get("variant"), impl, threads)
                y = aft.op(q, k, v, impl=impl, threads=threads, **kw)
                np.testing.assert_array_equal(np.isnan(y), y_exp, err_msg=what + ": out")
                g = aft.op_backward(q, k, v, impl=impl, threads=threads, output=True, **kw)
                np.testing.assert_array_equal(np.isnan(g["out"]), y_exp, err_msg=what + ": backward's out")
                np.testing.assert_array_equal(np.isnan(g["q"]), y_exp, err_msg=what + ": dq")
                np.testing.assert_array_equal(np.isnan(g["v"]), kv_exp, err_msg=what + ": dv")
                dk = np.isnan(g["k"])
                dk_exp = kv_exp if kc == C else kv_exp.reshape(B, T, kc, C // kc).any(axis=3)
                np.testing.assert_array_equal(dk, dk_exp, err_msg=what + ": dk")
                if bias_check is not None and "bias" in g:
                    np.testing.assert_array_equal(np.isnan(g["bias"]), bias_check(y_exp, vis),
                                                  err_msg=what + ": dbias")
                outs[impl, threads] = (y, g)
        # what the NaN does not reach: the fast kernels as the reference
        yr, gr = outs["reference", 1]
        for (impl, threads), (y, g) in outs.items():
            np.testing.assert_allclose(y, yr, rtol=2e-5, atol=2e-5, equal_nan=True)
            for name in ("q", "k", "v"):
                np.testing.assert_allclose(g[name], gr[name], rtol=2e-4, atol=2e-4, equal_nan=True)
        return y_exp

    def dense_bias(self, Tm, window=None):
        """the dense bias gradient's NaN set: (t, j) seen from a reached row
        (inside local's window, where w[t, j] is a parameter)"""
        def f(y_exp, vis):
            B, T, _ = y_exp.shape
            hit = (y_exp.any(axis=2)[:, :, None] & vis).any(axis=0)
            if window is not None:
                t = np.arange(T)
                hit &= np.abs(t[:, None] - t[None, :]) < window
            out = np.zeros((Tm, Tm), bool)
            out[:T, :T] = hit
            return out
        return f

    def test_rule_in_numbers(self):
        # the brief's case: NaN at (5, 3); every row non-causal, rows 5.. causal
        k = np.zeros((1, 16, 8), np.float32)
        k[0, 5, 3] = np.nan
        y, _, _ = expected(k, 8, True, None)
        self.assertEqual(y[0].any(axis=1).tolist(), [False] * 5 + [True] * 11)
        self.assertEqual(y[0].any(axis=0).tolist(), [c == 3 for c in range(8)])

    def test_simple(self):
        for causal in (False, True):
            for T in (9, 300):
                with self.subTest(causal=causal, T=T):
                    self.check(2, T, 6, dict(variant="simple"), causal=causal, nnan=3)

    def test_local(self):
        for causal in (False, True):
            for T in (11, 300):
                with self.subTest(causal=causal, T=T):
                    rng = np.random.default_rng(1)
                    bias = (rng.standard_normal((T + 1, T + 1)) * 0.5).astype(np.float32)
                    self.check(2, T, 5, dict(variant="local", window=3, bias=bias), causal=causal,
                               bias_check=self.dense_bias(T + 1, 3))

    def test_full(self):
        for causal in (False, True):
            for T in (10, 270):
                with self.subTest(causal=causal, T=T):
                    rng = np.random.default_rng(2)
                    bias = (rng.standard_normal((T, T)) * 0.5).astype(np.float32)
                    bias[:, 1] = -np.inf   # masked by its bias: reached all the same
                    self.check(2, T, 4, dict(variant="full", bias=bias), causal=causal,
                               bias_check=self.dense_bias(T))

    def test_masks(self):
        rng = np.random.default_rng(3)
        T = 12
        for batched in (False, True):
            m = rng.random((2, T, T) if batched else (T, T)) < 0.5
            for var, kw in (("full", {}), ("local", dict(window=4)), ("simple", {})):
                for causal in (False, True):
                    with self.subTest(var=var, batched=batched, causal=causal):
                        self.check(2, T, 4, dict(variant=var, **kw), causal=causal, mask=m.astype(np.uint8),
                                   nnan=4, seed=5)

    def test_conv_keys_per_head(self):
        rng = np.random.default_rng(4)
        bias = rng.standard_normal((2, 5)).astype(np.float32)
        for causal in (False, True):
            with self.subTest(causal=causal):
                self.check(2, 9, 6, dict(variant="conv", window=3, heads=2, bias=bias), kc=2, causal=causal)

    def test_grid(self):
        rng = np.random.default_rng(6)
        T = 20
        bias = (rng.standard_normal((T, T)) * 0.5).astype(np.float32)
        for causal in (False, True):
            with self.subTest(causal=causal):
                self.check(2, T, 4, dict(variant="local", window=2, bias=bias, grid=(4, 5)), causal=causal,
                           nnan=2, seed=7)

    def test_finite_keys_unchanged(self):
        # no NaN: nothing NaN (the old path)
        y = self.check(2, 9, 4, dict(variant="full"), nnan=0)
        self.assertFalse(y.any())


if __name__ == "__main__":
    unittest.main()
