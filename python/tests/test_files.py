"""aft.load and aft.save: numpy's and torch's fixtures read as numpy reads
them, every malformed file refused with the CLI's message, round trips
through each format, and aft's files as the CLI writes them."""

import os
import unittest

from common import TESTDATA, TmpDir, aft, case, cli, np

MALFORMED = os.path.join(TESTDATA, "malformed")


def expected_messages():
    """(file, the substring of aft's message it must give), for the files the
    readers refuse (state_* files are valid .safetensors: the state loader
    refuses them)."""
    out = []
    with open(os.path.join(MALFORMED, "expected.tsv")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, msg = line.rstrip("\n").split("\t", 1)
            if not name.startswith("state_"):
                out.append((name, msg))
    return out


class Load(TmpDir):
    def test_npy_as_numpy(self):
        d = os.path.join(TESTDATA, "npy")
        n = 0
        for name in sorted(os.listdir(d)):
            if not name.endswith(".npy"):
                continue
            try:
                want = np.load(os.path.join(d, name), allow_pickle=False)
            except Exception:
                continue  # numpy itself refuses it
            if want.dtype.kind not in "biuf":
                continue
            try:
                got = aft.load(os.path.join(d, name))
            except ValueError:
                continue  # a dtype aft does not read (checked by the CLI's tests)
            with self.subTest(file=name):
                self.assertEqual(list(got), ["arr_0"])
                a = got["arr_0"]
                self.assertEqual(a.shape, want.shape)
                self.assertEqual(a.dtype, want.dtype.newbyteorder("="))
                self.assertTrue(np.array_equal(a, want, equal_nan=a.dtype.kind == "f"))
                self.assertTrue(a.flags.c_contiguous and a.dtype.isnative)
                n += 1
        self.assertGreater(n, 5)

    def test_npz_and_safetensors(self):
        z = os.path.join(TESTDATA, "npz", "weights_rish_local.npz")
        got, want = aft.load(z), np.load(z)
        self.assertEqual(sorted(got), sorted(want.files))
        for k in want.files:
            self.assertTrue(np.array_equal(got[k], want[k]))
        st = aft.load(case("labml_local", "weights.safetensors"))
        self.assertEqual(list(st)[:2], ["pos_bias", "local_mask"])  # the file's order
        self.assertEqual(st["local_mask"].dtype, np.bool_)
        self.assertEqual(st.metadata.get("format"), "pt")
        self.assertEqual(aft.load(z).metadata, {})

    def test_bf16_and_f16(self):
        f32 = aft.load(case("rish_full", "weights.safetensors"))
        for dt, npdt in (("bf16", np.float32), ("f16", np.float16)):
            got = aft.load(case("rish_full", "weights_%s.safetensors" % dt))
            for k in f32:
                self.assertEqual(got[k].dtype, npdt)
                self.assertLess(float(np.abs(got[k].astype(np.float32) - f32[k]).max()), 0.02)

    def test_malformed_files_refused_as_the_cli_refuses(self):
        cases = expected_messages()
        self.assertGreater(len(cases), 150)
        for name, msg in cases:
            path = os.path.join(MALFORMED, name)
            with self.subTest(file=name):
                with self.assertRaises((ValueError, OSError, MemoryError)) as cm:
                    aft.load(path)
                mine = str(cm.exception)
                self.assertIn(msg, mine)
                self.assertNotIn("\n", mine)
                p = cli("info", path, check=False)
                self.assertEqual(p.returncode, 1)
                line = p.stderr.splitlines()[0]
                self.assertTrue(line.endswith(mine), "CLI: %r\nPython: %r" % (line, mine))

    def test_missing_file(self):
        with self.assertRaises(OSError):
            aft.load(self.path("nothing.npy"))
        with self.assertRaises(OSError):
            aft.load(self.tmp)  # a directory


class Save(TmpDir):
    ARRAYS = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "f16": np.linspace(-2, 2, 5).astype(np.float16),
        "f64": np.array([[1.5, -np.inf], [np.nan, 0.0]]),
        "i8": np.array([-128, 127], dtype=np.int8),
        "u16": np.array([[65535]], dtype=np.uint16),
        "i64": np.array([-2 ** 62], dtype=np.int64),
        "bool": np.array([True, False, True]),
        "scalar": np.float32(3.0),
        "empty": np.zeros((0, 3), np.float32),
    }

    def _same(self, got, want):
        self.assertEqual(list(got), list(want))
        for k in want:
            w = np.asarray(want[k])
            self.assertEqual(got[k].shape, w.shape, k)
            self.assertEqual(got[k].dtype, w.dtype, k)
            self.assertTrue(np.array_equal(got[k], w, equal_nan=w.dtype.kind == "f"), k)

    def test_round_trips(self):
        for ext in ("safetensors", "npz"):
            with self.subTest(ext=ext):
                p = self.path("a." + ext)
                aft.save(p, self.ARRAYS)
                self._same(aft.load(p), self.ARRAYS)
                if ext == "npz":
                    z = np.load(p)
                    for k in self.ARRAYS:
                        self.assertTrue(np.array_equal(z[k], self.ARRAYS[k], equal_nan=True))
        p = self.path("one.npy")
        aft.save(p, self.ARRAYS["f64"])
        self.assertTrue(np.array_equal(np.load(p), self.ARRAYS["f64"], equal_nan=True))
        aft.save(p, {"x": self.ARRAYS["i8"]})
        self.assertTrue(np.array_equal(np.load(p), self.ARRAYS["i8"]))

    def test_metadata(self):
        p = self.path("m.safetensors")
        aft.save(p, {"w": np.ones(2, np.float32)}, metadata={"format": "pt", "note": "é"})
        self.assertEqual(aft.load(p).metadata, {"format": "pt", "note": "é"})
        info = cli("info", "--json", p).stdout
        self.assertIn('"format"', info)
        with self.assertRaises(ValueError):
            aft.save(self.path("m.npz"), {"w": np.ones(2)}, metadata={"a": "b"})

    def test_strided_and_big_endian_written_in_c_order(self):
        a = np.arange(24, dtype=">f4").reshape(4, 6)[::-1, ::2]
        p = self.path("s.safetensors")
        aft.save(p, {"a": a, "t": a.T})
        got = aft.load(p)
        self.assertTrue(np.array_equal(got["a"], a))
        self.assertTrue(np.array_equal(got["t"], a.T))
        # the CLI reads it as numpy wrote it
        np.save(self.path("ref.npy"), np.ascontiguousarray(a, dtype="<f4"))
        cli("compare", self.path("s.safetensors") + ":a", self.path("ref.npy"), "--atol", "0", "--rtol", "0")

    def test_atomic(self):
        p = self.path("keep.npz")
        aft.save(p, {"a": np.ones(3, np.float32)})
        with self.assertRaisesRegex(ValueError, "a/b"):
            aft.save(p, {"b": np.ones(2), "a/b": np.ones(1)})  # a key that is a path: refused
        self._same(aft.load(p), {"a": np.ones(3, np.float32)})
        self.assertEqual(sorted(os.listdir(self.tmp)), ["keep.npz"])

    def test_refusals(self):
        for bad in (np.array([1j]), np.array(["a"]), np.array([object()]), np.zeros(1, "M8[s]")):
            with self.subTest(dtype=str(bad.dtype)):
                with self.assertRaises(TypeError):
                    aft.save(self.path("x.safetensors"), {"x": bad})
        with self.assertRaises(ValueError):
            aft.save(self.path("x.npy"), {"a": np.ones(1), "b": np.ones(1)})  # .npy: one array
        with self.assertRaises(ValueError):
            aft.save(self.path("x.txt"), {"a": np.ones(1)})
        with self.assertRaises(ValueError):
            aft.save(self.path("x.safetensors"), {"a": np.ones([1] * 9)})
        with self.assertRaises(TypeError):
            aft.save(self.path("x.safetensors"), {1: np.ones(1)})
        with self.assertRaises(OSError):
            aft.save(os.path.join(self.tmp, "no", "such", "dir.npy"), np.ones(1))
        self.assertFalse(os.path.exists(self.path("x.safetensors")))


if __name__ == "__main__":
    unittest.main()
