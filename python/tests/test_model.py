"""aft.Model: logits against PyTorch's (testdata/model) and bit for bit
against aft model; generation, encoding and decoding as aft generate, aft
encode and aft decode print them."""

import json
import os
import unittest

from common import MODEL, TESTDATA, TmpDir, aft, cli, close_to, np

DATA = os.path.join(TESTDATA, "model")
_model = None


def model():
    global _model
    if _model is None:
        _model = aft.Model(MODEL, threads=2)
    return _model


class Model(TmpDir):
    def test_dims(self):
        m = model()
        self.assertEqual((m.n_vocab, m.d_model), (113, 128))
        self.assertEqual(len(m.vocab), 113)
        self.assertIn("V=113", repr(m))

    def test_logits_against_pytorch(self):
        m = model()
        close_to(self, m.logits(np.load(os.path.join(DATA, "seq_tokens.npy"))),
                 np.load(os.path.join(DATA, "seq_logits.npy")), 1e-4)
        close_to(self, m.logits(np.load(os.path.join(DATA, "bt_tokens.npy"))),
                 np.load(os.path.join(DATA, "bt_logits.npy")), 1e-4)
        close_to(self, m.logits(np.load(os.path.join(DATA, "tb_tokens.npy")), layout="tbd"),
                 np.load(os.path.join(DATA, "tb_logits.npy")), 1e-4)

    def test_logits_same_bits_as_aft_model(self):
        for name, layout in (("seq_tokens.npy", "btd"), ("bt_tokens.npy", "btd"), ("tb_tokens.npy", "tbd")):
            with self.subTest(tokens=name):
                out = self.path("logits.npy")
                tokens = os.path.join(DATA, name)
                cli("model", "--weights", MODEL, "--threads", 2, "--layout", layout, tokens, "-o", out)
                got = model().logits(np.load(tokens), layout=layout)
                self.assertTrue(np.array_equal(got, np.load(out)))

    def test_greedy_as_pytorch_and_aft_generate(self):
        with open(os.path.join(DATA, "greedy.json")) as f:
            runs = json.load(f)["runs"]
        for run in runs[:2]:
            with self.subTest(prompt=run["prompt"]):
                text = model().generate(run["prompt"], run["n_new"], greedy=True)
                self.assertEqual(text, run["text"])
                self.assertEqual(model().generate(run["prompt"], run["n_new"], temperature=0), text)
        p = cli("generate", "--weights", MODEL, "--prompt", runs[0]["prompt"], "-n", 50, "--greedy")
        self.assertEqual(p.stdout, runs[0]["prompt"] + model().generate(runs[0]["prompt"], 50, greedy=True) + "\n")

    def test_sampling_as_aft_generate(self):
        for kw in (dict(temperature=0.8, seed=1), dict(temperature=1.0, top_k=5, seed=7), dict(seed=0)):
            with self.subTest(**kw):
                args = []
                for k, v in kw.items():
                    args += ["--" + k.replace("_", "-"), v]
                p = cli("generate", "--weights", MODEL, "--prompt", "It is ", "-n", 60, *args)
                a = model().generate("It is ", 60, **kw)
                self.assertEqual(p.stdout, "It is " + a + "\n")
                self.assertEqual(model().generate("It is ", 60, **kw), a)  # the same seed, the same text

    def test_encode_decode_as_the_cli(self):
        m = model()
        text = "It is a truth\tuniversally acknowledged."
        out = self.path("t.npy")
        cli("encode", "--weights", MODEL, text, "-o", out)
        ids = m.encode(text)
        self.assertEqual(ids.dtype, np.int32)
        self.assertTrue(np.array_equal(ids, np.load(out)))
        self.assertEqual(m.decode(ids), text)
        self.assertEqual(cli("decode", "--weights", MODEL, out).stdout, text + "\n")
        self.assertEqual(len(m.encode("")), 0)
        self.assertEqual(m.decode([]), "")

    def test_refusals(self):
        m = model()
        with self.assertRaisesRegex(ValueError, "vocabulary"):
            m.logits([0, 1, 113])
        with self.assertRaisesRegex(ValueError, "vocabulary"):
            m.logits(np.array([-1, 2]))
        with self.assertRaises(TypeError):
            m.logits(np.array([1.0, 2.0]))
        with self.assertRaises(ValueError):
            m.logits(np.zeros((1, 2, 3), np.int32))
        with self.assertRaises(ValueError):
            m.logits(np.zeros((0,), np.int32))
        with self.assertRaises(ValueError):
            m.encode("\u2603 is not in the vocabulary")
        with self.assertRaises(ValueError):
            m.decode([500])
        with self.assertRaises(ValueError):
            m.generate("", 5)  # aft generate wants a prompt of one character at least
        with self.assertRaises(ValueError):
            m.generate("It", -1)
        with self.assertRaises(ValueError):
            m.generate("It", 3, temperature=float("nan"))
        for kw in (dict(top_k=2 ** 64), dict(seed=-1), dict(n=10 ** 9 + 1)):
            with self.assertRaises(ValueError):
                m.generate("It", **dict(dict(n=3), **kw))
        with self.assertRaises(TypeError):
            m.generate("It", 2.5)
        with self.assertRaises(OSError):
            aft.Model(self.path("missing.safetensors"))
        with self.assertRaises(ValueError):
            aft.Model(os.path.join(TESTDATA, "torch", "rish_full", "weights.safetensors"))  # a layer, not a model
        with self.assertRaises(ValueError):
            aft.Model(MODEL, threads=-1)


class SixteenBit(TmpDir):
    """A checkpoint converted to f16 or bf16 stays 16-bit (the products
    widen it exactly): aft.Model and aft.Layer on it give the bits of its
    widened float32 copy, forward, backward and streaming."""

    def test_16bit_checkpoints(self):
        x = np.random.default_rng(3).standard_normal((20, 2, 128)).astype(np.float32)
        for dt in ("f16", "bf16"):
            w16, w32 = self.path("m_%s.safetensors" % dt), self.path("m_%s_f32.safetensors" % dt)
            cli("convert", "--dtype", dt, "-o", w16, MODEL)
            cli("convert", "--dtype", "f32", "-o", w32, w16)
            a, b = aft.Model(w16, threads=2), aft.Model(w32, threads=2)
            t = a.encode("It is a")
            self.assertTrue(np.array_equal(a.logits(t), b.logits(t)), dt)
            self.assertEqual(a.generate("It is ", 30), b.generate("It is ", 30))
            kw = dict(prefix="encoder.layers.1.self_attn.", variant="local", window=8, causal=True, layout="tbd")
            la, lb = aft.Layer(w16, **kw), aft.Layer(w32, **kw)
            self.assertTrue(np.array_equal(la.forward(x), lb.forward(x)), dt)
            ga, gb = la.backward(x, x), lb.backward(x, x)
            self.assertEqual(sorted(ga), sorted(gb))
            for k in ga:
                self.assertTrue(np.array_equal(ga[k], gb[k]), (dt, k))
            sa, sb = la.stream(batch=2), lb.stream(batch=2)
            self.assertTrue(np.array_equal(sa.step(x[:5]), sb.step(x[:5])), dt)


if __name__ == "__main__":
    unittest.main()
