#!/bin/sh
# make demo: run aft on a real example - a labml AFTLocal layer saved from
# PyTorch (testdata/torch/labml_local), its input, and the module's own output -
# and check that aft agrees. Then the same module with keys near +-500, where
# PyTorch's code gives NaN and aft stays finite and right. Then labml's whole
# AFT language model (testdata/model): its logits against PyTorch's, and
# text generated from it, greedy (against PyTorch's greedy text) and sampled.
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
echo
M=testdata/model
W=$M/labml_aft_fortunes.safetensors
echo "== labml's AFT language model ($M): six layers of causal AFT-local, trained on Debian's fortunes"
echo "\$ aft model --weights $W $M/seq_tokens.npy | aft compare - $M/seq_logits.npy --rtol 1e-4 --atol 1e-4"
"$AFT" model --weights "$W" "$M/seq_tokens.npy" | "$AFT" compare - "$M/seq_logits.npy" --rtol 1e-4 --atol 1e-4
echo
echo "== greedy text, against PyTorch's greedy decoding of the same model ($M/greedy.json)"
echo "\$ aft generate --weights $W --prompt 'It is ' -n 200 --greedy"
"$AFT" generate --weights "$W" --prompt 'It is ' -n 200 --greedy > "$OUT/greedy.txt"
cat "$OUT/greedy.txt"
# the first run of greedy.json: prompt 'It is ', 200 characters, no JSON escapes
want="It is $(sed -n 's/^   "text": "\(.*\)",$/\1/p' "$M/greedy.json" | head -n 1)"
if [ "$(cat "$OUT/greedy.txt")" = "$want" ]; then
    echo "(the same 200 characters as PyTorch's)"
else
    echo "demo: aft's greedy text differs from PyTorch's" >&2
    exit 1
fi
echo
echo "== sampled: temperature 0.8, seed 1, 400 characters (past the model's 256: it keeps the last 128 and goes on)"
echo "\$ aft generate --weights $W --prompt 'Q:' -n 400 --temperature 0.8 --seed 1 --timing timing.json"
"$AFT" generate --weights "$W" --prompt 'Q:' -n 400 --temperature 0.8 --seed 1 --timing "$OUT/gen.json"
echo
echo "== timing"
grep -E '"(prompt_tokens|generated_tokens|time_to_first_token_ms|tokens_per_s|threads)"' "$OUT/gen.json"
