#!/bin/sh
# make demo: run aft on a real example - a labml AFTLocal layer saved from
# PyTorch (testdata/torch/labml_local), its input, and the module's own output -
# and check that aft agrees. Then the same module with keys near +-500, where
# PyTorch's code gives NaN and aft stays finite and right.
set -eu
AFT=${1:-./aft}
D=testdata/torch/labml_local
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

echo "== the weights, as PyTorch saved them"
echo "\$ aft info $D/weights.safetensors"
"$AFT" info "$D/weights.safetensors"
echo
echo "== run the layer: causal AFT-local, window 4, labml's [seq, batch, d] layout"
set -- --weights "$D/weights.safetensors" --variant local --window 4 --causal --layout tbd
echo "\$ aft run $* $D/x.npy -o out.npy --timing timing.json --repeat 20"
"$AFT" run "$@" "$D/x.npy" -o "$OUT/out.npy" --timing "$OUT/timing.json" --repeat 20
echo
echo "== compare with the PyTorch module's output"
echo "\$ aft compare out.npy $D/y.npy --rtol 1e-5 --atol 1e-6"
"$AFT" compare "$OUT/out.npy" "$D/y.npy" --rtol 1e-5 --atol 1e-6
echo
echo "== timing (ms)"
cat "$OUT/timing.json"
echo
E=testdata/torch/labml_local_extreme
echo "== keys near +-500, position biases in +-250 ($E)"
"$AFT" run --weights "$E/weights.safetensors" --variant local --window 4 --causal --layout tbd \
    "$E/x.npy" -o "$OUT/extreme.npy"
echo "PyTorch's own output (y_torch.npy) against the exact float64 answer:"
"$AFT" compare "$E/y_torch.npy" "$E/y.npy" --rtol 1e-5 --atol 1e-6 || true
echo "aft's output against the same answer:"
"$AFT" compare "$OUT/extreme.npy" "$E/y.npy" --rtol 1e-5 --atol 1e-6
echo
echo "demo: aft agrees with PyTorch where PyTorch is finite, and stays right where it is not."
