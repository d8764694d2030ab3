"""The package itself: where it finds libaft (and its refusals at import),
the interface version, docstrings on everything public, the kernel levels
as aft --version names them, threads, the GIL released during compute, and
that import aft does not import torch."""

import inspect
import os
import subprocess
import sys
import threading
import time
import unittest

from common import ROOT, TmpDir, aft, case, cli, np


def python(code, env=None, cwd=None):
    """code run by this interpreter in a new process, the tree's python/ on
    its path; returns the CompletedProcess."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python")
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=cwd)


class Import(TmpDir):
    def test_finds_the_tree_library(self):
        p = python("import aft; print(aft.library_path)", env={"AFT_LIBRARY": ""}, cwd=self.tmp)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(os.path.realpath(p.stdout.strip()), os.path.realpath(os.path.join(ROOT, "lib", "libaft.so")))

    def test_aft_library(self):
        lib = os.path.join(ROOT, "lib", "libaft.so")
        p = python("import aft; print(aft.library_path)", env={"AFT_LIBRARY": lib})
        self.assertEqual(p.stdout.strip(), lib)
        p = python("import aft", env={"AFT_LIBRARY": self.path("nothing.so")})
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("ImportError: aft: AFT_LIBRARY=%s" % self.path("nothing.so"), p.stderr)
        # a library that is not libaft: refused, naming what it lacks
        libm = "libm.so.6"
        p = python("import aft", env={"AFT_LIBRARY": libm})
        self.assertIn("ImportError", p.stderr)
        self.assertIn("lacks aft_api_version", p.stderr)

    def test_version_checked(self):
        self.assertEqual(aft.API_VERSION, 1)
        from aft import _lib
        self.assertEqual(_lib.lib.aft_api_version(), aft.API_VERSION)
        # a package written for another version refuses this library, naming both
        code = ("import aft._lib as L\n"
                "src = open(L.__file__).read().replace('API_VERSION = 1', 'API_VERSION = 99')\n"
                "exec(compile(src, L.__file__, 'exec'), {'__file__': L.__file__, '__name__': 'x'})")
        p = python(code)
        self.assertIn("ImportError", p.stderr)
        self.assertIn("has interface version 1, but this aft package was written for version 99", p.stderr)

    def test_no_torch_imported(self):
        p = python("import sys, aft; print('torch' in sys.modules)")
        self.assertEqual(p.stdout.strip(), "False", p.stderr)

    def test_docstrings(self):
        names = [n for n in aft.__all__ if not n.isupper()]
        self.assertTrue(inspect.getdoc(aft))
        for n in names + ["LevelInfo"]:
            obj = getattr(aft, n)
            if isinstance(obj, str):
                continue
            self.assertTrue(inspect.getdoc(obj), n)
            if inspect.isclass(obj):
                for m, f in vars(obj).items():
                    if not m.startswith("_") and callable(f) or isinstance(f, (classmethod, property)):
                        self.assertTrue(inspect.getdoc(getattr(obj, m)), "%s.%s" % (n, m))


class Levels(unittest.TestCase):
    def test_as_aft_version(self):
        lv = aft.levels()
        self.assertTrue(lv)
        self.assertEqual(sum(l.in_use for l in lv), 1)
        out = cli("--version").stdout
        self.assertIn("kernels: %s " % aft.level(), out)
        self.assertIn("kernel levels: " + " ".join(l.name for l in lv), out)
        for l in lv:
            self.assertEqual(bool(l.why), not l.runs, l)
        aft.use_level(aft.level())  # the level in use: nothing changes
        with self.assertRaises(ValueError):
            aft.use_level("no-such-level")

    def test_aft_kernels(self):
        lv = aft.levels()
        low = lv[0].name
        p = python("import aft; print(aft.level())", env={"AFT_KERNELS": low})
        self.assertEqual(p.stdout.strip(), low, p.stderr)
        p = python("import aft", env={"AFT_KERNELS": "pentium"})
        self.assertIn("ImportError: aft: AFT_KERNELS=pentium", p.stderr)


class Threads(unittest.TestCase):
    def test_thread_counts_agree(self):
        lay1 = aft.Layer(case("rish_full", "weights.safetensors"), threads=1)
        lay2 = aft.Layer(case("rish_full", "weights.safetensors"), threads=2)
        x = np.load(case("rish_full", "x.npy"))
        np.testing.assert_allclose(lay1.forward(x), lay2.forward(x), rtol=1e-5, atol=1e-6)

    def test_layers_on_threads_at_once(self):
        x = np.random.default_rng(0).standard_normal((2, 11, 16)).astype(np.float32)
        layers = [aft.Layer(case("rish_simple", "weights.safetensors"), variant="simple", threads=1) for _ in range(2)]
        want = layers[0].forward(x)
        bad = []

        def work(lay):
            for _ in range(50):
                if not np.array_equal(lay.forward(x), want):
                    bad.append(1)

        ts = [threading.Thread(target=work, args=(lay,)) for lay in layers + layers]  # and one layer from two
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(bad, [])

    def test_gil_released(self):
        # a call of a tenth of a second or more, and another Python thread's ticks
        # inside it: with the GIL held during the call there would be none
        rng = np.random.default_rng(0)
        spans = []

        def work():
            T, C = 1000, 32  # O(T^2 C) in float64; longer until a call takes 0.1 s
            while T <= 8000:
                q, k, v = (rng.standard_normal((1, T, C)).astype(np.float32) for _ in range(3))
                start = time.perf_counter()
                aft.op(q, k, v, variant="full", bias=np.zeros((T, T), np.float32), threads=1, impl="reference")
                spans.append((start, time.perf_counter()))
                if spans[-1][1] - start >= 0.1:
                    break
                T *= 2

        t = threading.Thread(target=work)
        ticks = []
        t.start()
        while t.is_alive():
            ticks.append(time.perf_counter())
            time.sleep(0.001)
        t.join()
        start, end = max(spans, key=lambda se: se[1] - se[0])
        self.assertGreater(end - start, 0.1, "no call long enough to tell")
        inside = [s for s in ticks if start + 0.02 < s < end - 0.02]
        self.assertGreater(len(inside), 10)


if __name__ == "__main__":
    unittest.main()
