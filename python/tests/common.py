"""What the Python tests share: where the tree, testdata and ./aft are
($AFT_TESTDATA and $AFT_BIN as make test sets them, else the tree around
this file), the CLI run through subprocess, scratch directories, and a
case's args.txt as the CLI's options and as aft.Layer's keywords."""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TESTDATA = os.environ.get("AFT_TESTDATA") or os.path.join(ROOT, "testdata")
AFT_BIN = os.environ.get("AFT_BIN") or os.path.join(ROOT, "aft")
TORCH_CASES = os.path.join(TESTDATA, "torch")
MODEL = os.path.join(TESTDATA, "model", "labml_aft_fortunes.safetensors")

sys.path.insert(0, os.path.join(ROOT, "python"))
import aft  # noqa: E402,F401  (the tree's, after sys.path)
import numpy as np  # noqa: E402


def case(name, *parts):
    return os.path.join(TORCH_CASES, name, *parts)


def cli(*args, check=True, text=True, **kw):
    """./aft with args (strings); returns the CompletedProcess. check: fail
    the test (an AssertionError) unless the exit status is 0."""
    p = subprocess.run([AFT_BIN] + [str(a) for a in args], capture_output=True, text=text, **kw)
    if check and p.returncode != 0:
        raise AssertionError("aft %s: exit %d: %s" % (" ".join(map(str, args)), p.returncode, p.stderr))
    return p


def case_args(name, file="args.txt"):
    """A case's CLI options (the first line of args.txt), as a list."""
    with open(case(name, file)) as f:
        return shlex.split(f.readline())


def layer_kwargs(args):
    """CLI options as aft.Layer's keywords: --variant local --window 4
    --causal --layout tbd -> dict(variant="local", window=4, causal=True,
    layout="tbd")."""
    kw, i = {}, 0
    while i < len(args):
        a = args[i]
        if a == "--causal":
            kw["causal"] = True
            i += 1
            continue
        key, value = a[2:].replace("-", "_"), args[i + 1]
        if key in ("window", "heads", "threads"):
            value = int(value)
        elif key == "grid":
            value = tuple(int(v) for v in value.split(","))
        kw[key] = value
        i += 2
    return kw


class TmpDir(unittest.TestCase):
    """A test case with a scratch directory, self.tmp, removed afterwards."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="aft-py-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)


def close_to(test, got, want, rtol):
    """Every element within rtol x max(1, |want|) (NaN where want is)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    test.assertEqual(got.shape, want.shape)
    err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
    test.assertTrue(np.all(np.isfinite(got) == np.isfinite(want)), "finite where the reference is")
    worst = float(np.nanmax(err)) if err.size else 0.0
    test.assertLessEqual(worst, rtol, "worst relative error %.3g" % worst)
