"""Hostile input: wrong dtypes, ranks and shapes, strided, reversed and
Fortran views, NaN, empty arrays, huge claimed sizes, bad options and paths.
Every one ends in a Python exception or in the correct result (a view gives
what its contiguous copy gives); none crashes the interpreter."""

import os
import unittest

from common import MODEL, TmpDir, aft, case, cli, np

ERRORS = (ValueError, TypeError, MemoryError, OSError)
W = case("rish_full", "weights.safetensors")  # D = 16, C = 24, Tmax = 12


def layer(**kw):
    return aft.Layer(W, **kw)


def x0():
    return np.load(case("rish_full", "x.npy"))  # [2, 9, 16]


class Dtypes(unittest.TestCase):
    def test_convertible_give_the_float32_result(self):
        lay, x = layer(), x0()
        want = lay.forward(x)
        for conv in (lambda a: a.astype(np.float64), lambda a: a.astype(">f4"), lambda a: a.astype(">f8"),
                     lambda a: a.tolist()):
            got = lay.forward(conv(x))
            self.assertTrue(np.array_equal(got, want))
        xi = np.round(x * 4).astype(np.int64)
        self.assertTrue(np.array_equal(lay.forward(xi), lay.forward(xi.astype(np.float32))))
        xb = x > 0
        self.assertTrue(np.array_equal(lay.forward(xb), lay.forward(xb.astype(np.float32))))
        self.assertTrue(np.array_equal(lay.forward(x.astype(np.float16)), lay.forward(x.astype(np.float16).astype(np.float32))))

    def test_refused(self):
        lay, x = layer(), x0()
        for bad in (x.astype(np.complex64), np.full(x.shape, "a"), np.full(x.shape, None, dtype=object),
                    x.astype(object),  # even of numbers: an object may be anything
                    np.zeros(x.shape, "M8[s]"), np.zeros(x.shape, dtype=[("a", "f4")])):
            with self.subTest(dtype=str(bad.dtype)):
                with self.assertRaises(ERRORS):
                    lay.forward(bad)
        with self.assertRaises(TypeError):
            aft.op(x.astype(np.complex128), x, x)
        with self.assertRaises(TypeError):
            aft.op(x, x, x, mask=np.full((9, 9), "yes"))
        with self.assertRaises(TypeError):
            lay.backward(x, x.astype(np.complex64))
        w = dict(aft.load(W))
        w["wbias"] = w["wbias"].astype(np.complex64)
        with self.assertRaises(TypeError):
            aft.Layer(w)


class Shapes(unittest.TestCase):
    def test_ranks_and_sizes(self):
        lay, x = layer(), x0()
        for bad in (x[0, 0], x[None], x[..., :15], np.zeros((2, 9, 17), np.float32), np.float32(1.0),
                    np.zeros((2, 13, 16), np.float32)):  # T = 13 > Tmax = 12: aft's message
            with self.subTest(shape=np.shape(bad)):
                with self.assertRaises(ValueError):
                    lay.forward(bad)
        for bad in (np.zeros((0, 9, 16), np.float32), np.zeros((2, 0, 16), np.float32), np.zeros((0, 16)),
                    np.zeros((2, 9, 0))):
            with self.subTest(empty=bad.shape):
                with self.assertRaises(ValueError):
                    lay.forward(bad)
                with self.assertRaises(ValueError):
                    lay.backward(bad)

    def test_weights(self):
        good = dict(aft.load(W))
        for name, bad in (("to_q.weight", np.zeros((24, 15))), ("to_q.weight", np.zeros(24)),
                          ("to_k.bias", np.zeros(23)), ("project.weight", np.zeros((16, 24, 1))),
                          ("wbias", np.zeros(12)), ("wbias", np.zeros((12, 11))), ("wbias", np.zeros((0, 0))),
                          ("to_v.weight", np.zeros((0, 16)))):
            with self.subTest(name=name, shape=bad.shape):
                w = dict(good, **{name: bad})
                with self.assertRaises(ValueError):
                    aft.Layer(w).forward(x0())

    def test_weight_names(self):
        good = dict(aft.load(W))
        with self.assertRaisesRegex(ValueError, "NUL"):
            aft.Layer(dict(good, **{"to_q.weight\0x": good["to_q.weight"]}))
        with self.assertRaises(TypeError):
            aft.Layer({**good, 3: good["wbias"]})

    def test_op_shapes(self):
        rng = np.random.default_rng(0)
        q = rng.standard_normal((2, 5, 3)).astype(np.float32)
        for args in ((q[0, 0], q[0, 0], q[0, 0]), (q[None], q[None], q[None]), (q, q[:, :4], q), (q, q, q[:1]),
                     (q[:, :0], q[:, :0], q[:, :0]), (q[:, :, :0], q[:, :, :0], q[:, :, :0])):
            with self.subTest(shapes=[np.shape(a) for a in args]):
                with self.assertRaises(ValueError):
                    aft.op(*args, variant="simple")
        for bias in (np.zeros(5), np.zeros((5, 5, 5)), np.zeros((4, 4)), np.zeros((0, 0))):
            with self.subTest(bias=bias.shape):
                with self.assertRaises(ValueError):
                    aft.op(q, q, q, variant="full", bias=bias)
        for mask in (np.ones((5,)), np.ones((3, 5, 5)), np.ones((5, 4))):
            with self.subTest(mask=mask.shape):
                with self.assertRaises(ValueError):
                    aft.op(q, q, q, variant="full", bias=np.zeros((5, 5)), mask=mask)

    def test_huge_claimed_sizes(self):
        lay = layer()
        # a view that claims 2^40 rows of zero stride: the conversion cannot allocate them
        huge = np.lib.stride_tricks.as_strided(np.zeros(16, np.float32), shape=(1 << 40, 16), strides=(0, 4))
        with self.assertRaises((MemoryError, ValueError)):
            lay.forward(huge)
        big = np.broadcast_to(np.float32(0), (1 << 20, 1 << 20, 16))
        with self.assertRaises((MemoryError, ValueError)):
            aft.op(big, big, big, variant="simple")
        with self.assertRaises((MemoryError, ValueError)):
            aft.save(os.devnull + ".npy", big)


class Views(unittest.TestCase):
    def test_strided_reversed_fortran_views(self):
        rng = np.random.default_rng(2)
        lay = layer()
        base = rng.standard_normal((4, 18, 32)).astype(np.float32)
        for view in (base[::2, ::2, ::2], base[::-2, ::-2, 1::2], base[1:3, 3:12, :16],
                     np.asfortranarray(base[:2, :9, :16]), base[:2, :9, :16].transpose(0, 1, 2)[:, ::-1],
                     np.lib.stride_tricks.as_strided(base, shape=(2, 9, 16), strides=(4, 8, 128))):
            with self.subTest(strides=view.strides):
                want = lay.forward(np.ascontiguousarray(view))
                self.assertTrue(np.array_equal(lay.forward(view), want))
                g, gc = lay.backward(view, view[::-1]), lay.backward(np.ascontiguousarray(view),
                                                                     np.ascontiguousarray(view[::-1]))
                for k in gc:
                    self.assertTrue(np.array_equal(g[k], gc[k]), k)
                self.assertTrue(np.array_equal(aft.op(view, view, view, variant="simple"),
                                               aft.op(*[np.ascontiguousarray(view)] * 3, variant="simple")))

    def test_read_only_and_strided_weights(self):
        w = {k: np.asfortranarray(v) for k, v in aft.load(W).items()}
        for v in w.values():
            v.setflags(write=False)
        x = x0()
        self.assertTrue(np.array_equal(aft.Layer(w).forward(x), layer().forward(x)))
        x.setflags(write=False)
        layer().forward(x)

    def test_out_must_fit_exactly(self):
        lay, x = layer(), x0()
        for out in (np.empty(x.shape, np.float64), np.empty(x.shape[::-1], np.float32).T,
                    np.empty((2, 9, 32), np.float32)[..., ::2], [[0.0]]):
            with self.subTest(out=type(out).__name__):
                with self.assertRaises((TypeError, ValueError)):
                    lay.forward(x, out=out)
        ro = np.empty(x.shape, np.float32)
        ro.setflags(write=False)
        with self.assertRaises(TypeError):
            lay.forward(x, out=ro)


class Values(TmpDir):
    def test_nan_and_inf_as_aft_run(self):
        # non-finite inputs and weights: the CLI's outputs, NaN for NaN
        x = x0()
        x[1, 4, 3] = np.nan
        x[0, 2, 5] = np.inf
        w = dict(aft.load(W))
        w["to_v.weight"][3, 7] = np.nan
        aft.save(self.path("x.npy"), x)
        aft.save(self.path("w.safetensors"), w)
        for variant in ("full", "simple"):
            with self.subTest(variant=variant):
                cli("run", "--variant", variant, "--weights", self.path("w.safetensors"), self.path("x.npy"),
                    "-o", self.path("y.npy"), "--threads", 2)
                y = aft.Layer(w, variant=variant, threads=2).forward(x)
                self.assertTrue(np.array_equal(y, np.load(self.path("y.npy")), equal_nan=True))
                self.assertTrue(np.isnan(y).any())
                g = aft.Layer(w, variant=variant).backward(x)
                self.assertEqual(g["input"].shape, x.shape)

    def test_tokens(self):
        m = aft.Model(MODEL)
        for bad in (np.array([2 ** 40]), np.array([2 ** 64 - 1], np.uint64), np.array([-5]), np.array([2 ** 31])):
            with self.assertRaises(ValueError):
                m.logits(bad)
        for bad in (np.array([1.5]), np.array(["a"]), np.array([1j]), np.array([None])):
            with self.assertRaises(TypeError):
                m.logits(bad)
        self.assertEqual(m.logits(np.array([3, 4], np.uint8)).shape, (2, 113))
        self.assertEqual(m.logits(np.array([[3, 4]], np.int64)[:, ::-1]).shape, (1, 2, 113))


class OptionsAndPaths(TmpDir):
    def test_options(self):
        for kw in (dict(window=2 ** 70), dict(threads=10 ** 30), dict(heads=-3), dict(variant="full causal=1"),
                   dict(impl=""), dict(prefix="a\0b"), dict(layout=None), dict(grid=(1,)), dict(grid="3,4"),
                   dict(window=2.5), dict(variant=3)):
            with self.subTest(**{k: repr(v) for k, v in kw.items()}):
                with self.assertRaises(ERRORS):
                    layer(**kw)
        q = np.ones((1, 3, 2), np.float32)
        for kw in (dict(window=-1, variant="local"), dict(variant="local window=2"), dict(threads="x")):
            with self.assertRaises(ERRORS):
                aft.op(q, q, q, **kw)

    def test_paths(self):
        import pathlib
        p = pathlib.Path(self.path("a.npy"))
        aft.save(p, np.ones(3, np.float32))
        self.assertEqual(list(aft.load(p)), ["arr_0"])
        self.assertEqual(list(aft.load(os.fsencode(str(p)))), ["arr_0"])
        with self.assertRaises(ValueError):
            aft.load(self.path("a\0.npy"))
        with self.assertRaises(TypeError):
            aft.load(None)
        with self.assertRaises(OSError):
            aft.Model(self.tmp)


class Fuzz(unittest.TestCase):
    def test_random_arrays(self):
        """Random dtypes, ranks, sizes and strides into every entry point:
        each call returns or raises one of the documented exceptions."""
        rng = np.random.default_rng(1234)
        lay = layer(variant="local", window=3)
        st = aft.Layer(case("labml_local", "weights.safetensors"), variant="local", window=4, causal=True,
                       layout="tbd").stream(batch=2)
        dtypes = [np.float32, np.float64, np.float16, np.int32, np.uint8, np.bool_, np.complex64, object, ">f4"]
        for _ in range(300):
            ndim = int(rng.integers(0, 5))
            shape = tuple(int(rng.choice([0, 1, 2, 3, 9, 16, 13])) for _ in range(ndim))
            a = rng.standard_normal(shape) * 10.0 ** int(rng.integers(-3, 4))
            if rng.random() < 0.2 and a.size:
                a.flat[int(rng.integers(a.size))] = rng.choice([np.nan, np.inf, -np.inf])
            try:
                with np.errstate(invalid="ignore"):
                    a = a.astype(dtypes[int(rng.integers(len(dtypes)))])
            except (ValueError, TypeError):
                continue
            if ndim and rng.random() < 0.3:
                a = a[(slice(None, None, -1),) * ndim]
            which = int(rng.integers(6))
            try:
                if which == 0:
                    lay.forward(a)
                elif which == 1:
                    lay.backward(a, a)
                elif which == 2:
                    aft.op(a, a, a, variant=["full", "local", "simple"][int(rng.integers(3))], window=2,
                           bias=np.zeros((16, 16), np.float32) if rng.random() < 0.5 else a, causal=True)
                elif which == 3:
                    aft.op_backward(a, a, a, a, variant="simple")
                elif which == 4:
                    st.step(a)
                else:
                    aft.Layer({"to_q.weight": a, "to_k.weight": a, "to_v.weight": a, "project.weight": a})
            except ERRORS:
                pass


if __name__ == "__main__":
    unittest.main()
