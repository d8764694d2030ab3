#!/bin/sh
# python/tests/install.sh [PYTHON] - the package as a user installs it: a
# fresh virtual environment (numpy from the system's site packages), pip
# install of ./python offline (--no-build-isolation: setuptools from the
# system too; --no-index: nothing downloaded), then, from another directory
# and without the tree on the path, import aft from the venv, check it loads
# the libaft.so the install put beside it, and run a layer saved from
# PyTorch against PyTorch's output. make test-python-install runs it.
set -eu
py=${1:-/usr/bin/python3}
tree=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
"$py" -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet --no-build-isolation --no-index "$tree/python"
cd "$tmp"
env -u PYTHONPATH -u AFT_LIBRARY AFT_CASE="$tree/testdata/torch/rish_local" "$tmp/venv/bin/python" -c '
import os, numpy as np, aft
case = os.environ["AFT_CASE"]
here = os.path.dirname(aft.__file__)
assert here.startswith(os.getcwd()), "aft imported from " + here
assert aft.library_path == os.path.join(here, "libaft.so"), aft.library_path
y = aft.Layer(case + "/weights.safetensors", variant="local", window=3).forward(np.load(case + "/x.npy"))
want = np.load(case + "/y.npy")
err = float(np.max(np.abs(y - want) / np.maximum(1, np.abs(want))))
assert err <= 2e-5, err
print("python/tests/install.sh: aft %s from %s, libaft at level %s: a layer within %.1e of PyTorch"
      % (aft.__version__, here, aft.level(), err))
'
