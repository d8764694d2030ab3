"""aft.Layer: forward and backward against PyTorch's outputs and gradients
(testdata/torch/*) and bit for bit against aft run and aft grad on the same
files and options; aft.State against a stream of aft run processes."""

import unittest

from common import MODEL, TmpDir, aft, case, case_args, cli, close_to, layer_kwargs, np

# every case directory whose args.txt the layer runs (the *_extreme ones: y.npy
# is float64's truth where PyTorch's modules give NaN)
CASES = ["labml_local", "rish_full", "rish_simple", "rish_local", "labml_local_extreme", "rish_full_extreme",
         "grid_conv", "grid_conv_shared", "grid_conv_wide_keys", "grid_local", "grid_conv_extreme"]
GRAD_CASES = ["labml_local", "rish_full", "rish_simple", "rish_local"]
THREADS = 2


def layer(name, file="args.txt", **more):
    kw = dict(layer_kwargs(case_args(name, file)), threads=THREADS)
    kw.update(more)
    return aft.Layer(case(name, "weights.safetensors"), **kw)


class Forward(TmpDir):
    def test_against_pytorch(self):
        for name in CASES:
            with self.subTest(case=name):
                y = layer(name).forward(np.load(case(name, "x.npy")))
                close_to(self, y, np.load(case(name, "y.npy")), 2e-5)

    def test_args_alt(self):
        # labml's causal mask as --mask, rish_local's band as full
        for name in ("labml_local", "rish_local"):
            with open(case(name, "args_alt.txt")) as f:
                for line in f:
                    kw = layer_kwargs(line.split())
                    if "mask" in kw:
                        continue  # a layer has no mask: aft.op takes one (test_op)
                    y = aft.Layer(case(name, "weights.safetensors"), **kw).forward(np.load(case(name, "x.npy")))
                    close_to(self, y, np.load(case(name, "y.npy")), 2e-5)

    def test_same_bits_as_aft_run(self):
        for name in CASES:
            with self.subTest(case=name):
                out = self.path(name + ".npy")
                cli("run", "--weights", case(name, "weights.safetensors"), *case_args(name), "--threads", THREADS,
                    case(name, "x.npy"), "-o", out)
                y = layer(name).forward(np.load(case(name, "x.npy")))
                self.assertTrue(np.array_equal(y, np.load(out), equal_nan=True))

    def test_weights_dict_and_path_agree(self):
        w = aft.load(case("rish_full", "weights.safetensors"))
        x = np.load(case("rish_full", "x.npy"))
        a = aft.Layer(w, variant="full").forward(x)
        b = aft.Layer(case("rish_full", "weights.safetensors"), variant="full").forward(x)
        self.assertTrue(np.array_equal(a, b))

    def test_other_dtypes_of_weights(self):
        # f16, bf16 and f64 files: the module run on those rounded weights
        x = np.load(case("rish_full", "x.npy"))
        for dt in ("f16", "bf16", "f64"):
            y = aft.Layer(case("rish_full", "weights_%s.safetensors" % dt)).forward(x)
            close_to(self, y, np.load(case("rish_full", "y_%s.npy" % dt)), 2e-5)

    def test_prefix_in_the_model(self):
        # a layer of labml's model, under its prefix, as aft run runs it
        m = MODEL
        p = "encoder.layers.1.self_attn."
        x = np.random.default_rng(1).standard_normal((20, 2, 128)).astype(np.float32)
        xin, out = self.path("x.npy"), self.path("y.npy")
        np.save(xin, x)
        cli("run", "--weights", m, "--prefix", p, "--variant", "local", "--window", 32, "--causal", "--layout", "tbd",
            "--threads", 1, xin, "-o", out)
        lay = aft.Layer(m, prefix=p, variant="local", window=32, causal=True, layout="tbd", threads=1)
        self.assertEqual((lay.d_model, lay.d_hidden), (128, 128))
        self.assertTrue(np.array_equal(lay.forward(x), np.load(out)))

    def test_two_dims_is_one_sequence(self):
        lay = layer("rish_full")
        x = np.load(case("rish_full", "x.npy"))
        self.assertTrue(np.array_equal(lay.forward(x[1]), lay.forward(x)[1]))

    def test_out(self):
        lay = layer("rish_simple")
        x = np.load(case("rish_simple", "x.npy"))
        out = np.empty_like(x)
        self.assertIs(lay.forward(x, out=out), out)
        self.assertTrue(np.array_equal(out, lay.forward(x)))
        with self.assertRaises(ValueError):
            lay.forward(x, out=np.empty((1,) + x.shape[1:], np.float32))
        with self.assertRaises(TypeError):
            lay.forward(x, out=np.empty(x.shape, np.float64))

    def test_attributes_and_close(self):
        lay = layer("rish_full")
        self.assertEqual((lay.d_model, lay.d_hidden), (16, 24))
        self.assertIn("variant=full", repr(lay))
        with lay:
            pass
        self.assertIn("closed", repr(lay))
        with self.assertRaises(ValueError):
            lay.forward(np.zeros((1, 2, 16), np.float32))
        lay.close()  # twice: nothing

    def test_borrowed_weights(self):
        # float32 C-contiguous weights are the layer's memory: changed in place, the layer sees it
        w = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in aft.load(case("rish_full", "weights.safetensors")).items()}
        x = np.load(case("rish_full", "x.npy"))
        lay = aft.Layer(w)
        before = lay.forward(x)
        w["project.bias"] += 1
        self.assertTrue(np.allclose(lay.forward(x), before + 1, atol=1e-5))

    def test_refusals(self):
        w = case("rish_full", "weights.safetensors")
        with self.assertRaisesRegex(ValueError, "variant"):
            aft.Layer(w, variant="nope")
        with self.assertRaisesRegex(ValueError, "layout"):
            aft.Layer(w, layout="dbt")
        with self.assertRaises(ValueError):
            aft.Layer(w, prefix="two words")
        with self.assertRaises(TypeError):
            aft.Layer(w, window="3")
        with self.assertRaises(ValueError):
            aft.Layer(w, window=-1)
        with self.assertRaises(ValueError):
            aft.Layer({})  # no weights
        with self.assertRaises(OSError):
            aft.Layer(self.path("missing.safetensors"))
        with self.assertRaises(TypeError):
            aft.Layer(42)
        w_dict = dict(aft.load(w))
        del w_dict["to_k.weight"]
        with self.assertRaisesRegex(ValueError, "to_k"):
            aft.Layer(w_dict)


class Backward(TmpDir):
    def test_against_pytorch(self):
        for name in GRAD_CASES:
            with self.subTest(case=name):
                lay = layer(name)
                g = lay.backward(np.load(case(name, "x.npy")), np.load(case(name, "dy.npy")))
                want = aft.load(case(name, "grads.safetensors"))
                self.assertEqual(sorted(g), sorted(want))  # torch's are in state_dict order
                self.assertEqual(["input"] + lay.grad_names, list(g))
                for k in want:
                    scale = max(1.0, float(np.abs(want[k]).max()))
                    if name == "rish_local" and k == "wbias":
                        continue  # torch's is a full bias's; local's is 0 outside the band (README)
                    err = float(np.abs(g[k] - want[k]).max()) / scale
                    self.assertLessEqual(err, 1e-4, "%s %s" % (name, k))

    def test_same_bits_as_aft_grad(self):
        for name in GRAD_CASES:
            with self.subTest(case=name):
                out = self.path(name + ".safetensors")
                cli("grad", "--weights", case(name, "weights.safetensors"), *case_args(name), "--threads", THREADS,
                    case(name, "x.npy"), "--grad-output", case(name, "dy.npy"), "-o", out)
                g = layer(name).backward(np.load(case(name, "x.npy")), np.load(case(name, "dy.npy")))
                want = aft.load(out)
                self.assertEqual(list(g), list(want))
                for k in want:
                    self.assertTrue(np.array_equal(g[k], want[k]), k)

    def test_default_dy_is_ones(self):
        lay = layer("rish_simple")
        x = np.load(case("rish_simple", "x.npy"))
        a, b = lay.backward(x), lay.backward(x, np.ones_like(x))
        for k in a:
            self.assertTrue(np.array_equal(a[k], b[k]))

    def test_wanted_out_and_y(self):
        lay = layer("rish_full")
        x, dy = np.load(case("rish_full", "x.npy")), np.load(case("rish_full", "dy.npy"))
        full = lay.backward(x, dy)
        some = lay.backward(x, dy, wanted=["wbias"])
        self.assertEqual(sorted(some), ["wbias"])
        self.assertEqual(sorted(lay.backward(x, dy, wanted=["input", "wbias"])), ["input", "wbias"])
        self.assertTrue(np.array_equal(some["wbias"], full["wbias"]))
        buf, y = np.empty_like(full["to_q.weight"]), np.empty_like(x)
        g = lay.backward(x, dy, out={"to_q.weight": buf}, y=y)
        self.assertIs(g["to_q.weight"], buf)
        self.assertTrue(np.array_equal(buf, full["to_q.weight"]))
        close_to(self, y, lay.forward(x), 1e-6)
        with self.assertRaisesRegex(ValueError, "not a gradient"):
            lay.backward(x, dy, wanted=["nope"])
        with self.assertRaises(ValueError):
            lay.backward(x, dy[:1])


class Stream(TmpDir):
    NAME = "labml_local"

    def _cli_chunks(self, x, cut):
        """aft run over x [T, B, D] in two processes, the state between them."""
        w = case(self.NAME, "weights.safetensors")
        state, ys = self.path("state.safetensors"), []
        for i, part in enumerate((x[:cut], x[cut:])):
            xin, out = self.path("x%d.npy" % i), self.path("y%d.npy" % i)
            np.save(xin, part)
            more = ["--state-in", state] if i else []
            cli("run", "--weights", w, *case_args(self.NAME), "--threads", 1, *more, "--state-out", state, xin,
                "-o", out)
            ys.append(np.load(out))
        return ys, state

    def test_two_steps_as_aft_run(self):
        x = np.load(case(self.NAME, "x.npy"))  # [T=10, B=3, 16]
        (y0, y1), cli_state = self._cli_chunks(x, 4)
        lay = layer(self.NAME, threads=1)
        s = lay.stream(batch=3)
        a = s.step(x[:4])
        self.assertEqual(s.position, 4)
        b = s.step(x[4:])
        self.assertEqual(s.position, 10)
        self.assertTrue(np.array_equal(a, y0))
        self.assertTrue(np.array_equal(b, y1))
        # the one-shot causal run, to rounding
        close_to(self, np.concatenate([a, b]), lay.forward(x), 1e-5)
        # the state file: the CLI's
        mine = self.path("mine.safetensors")
        s.save(mine)
        got, want = aft.load(mine), aft.load(cli_state)
        self.assertEqual(got.metadata, want.metadata)
        for k in want:
            self.assertTrue(np.array_equal(got[k], want[k]), k)

    def test_load_continues(self):
        x = np.load(case(self.NAME, "x.npy"))
        (y0, y1), cli_state = self._cli_chunks(x, 7)
        lay = layer(self.NAME, threads=1)
        # the CLI's state after both chunks, then one more row from it, as aft run --state-in
        xin, out = self.path("x2.npy"), self.path("y2.npy")
        np.save(xin, x[:1])
        cli("run", "--weights", case(self.NAME, "weights.safetensors"), *case_args(self.NAME), "--threads", 1,
            "--state-in", cli_state, xin, "-o", out)
        s = aft.State.load(cli_state, lay, batch=3)
        self.assertEqual(s.position, 10)
        self.assertTrue(np.array_equal(s.step(x[:1]), np.load(out)))

    def test_refusals(self):
        x = np.load(case(self.NAME, "x.npy"))
        lay = layer(self.NAME)
        s = lay.stream(batch=3)
        with self.assertRaisesRegex(ValueError, "sequences"):
            s.step(x[:, :2])
        with self.assertRaises(ValueError):
            aft.State(lay, batch=0)
        with self.assertRaises(TypeError):
            aft.State("not a layer")
        s.save(self.path("s.safetensors"))
        with self.assertRaises(ValueError):
            aft.State.load(self.path("s.safetensors"), lay, batch=2)  # another batch
        with self.assertRaises(OSError):
            aft.State.load(self.path("missing.safetensors"), lay, batch=3)
        with self.assertRaises(ValueError):
            layer("rish_full").stream()  # not causal
        s.close()
        with self.assertRaises(ValueError):
            s.step(x)
        # a layer closed frees its states first: they raise, never read freed memory
        s2 = lay.stream(batch=3)
        lay.close()
        with self.assertRaisesRegex(ValueError, "closed"):
            s2.step(x)
        with self.assertRaisesRegex(ValueError, "closed"):
            s2.position


if __name__ == "__main__":
    unittest.main()
