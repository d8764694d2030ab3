#!/bin/sh
# qemu-check.sh DIR AFT LEVELS_TEST - aft on older CPUs (make test-qemu,
# mk/levels.mk).
#
# Runs AFT natively and under qemu-x86_64 -cpu Nehalem (SSE4.2: the base
# kernels) and -cpu Haswell (AVX2 and FMA: avx2) on a run, a causal full
# run, a backward pass, a stream (one run with --state-out, the next from
# it) and the model: its logits, and a greedy generation. Each output must
# be within 2e-5 of the native one (aft compare --atol 2e-5 --rtol 0,
# stricter than 2e-5 x max(1, |y|)), and each CPU must run at the level
# its features allow (aft --version), refuse a level above it
# (AFT_KERNELS=avx512), and pass LEVELS_TEST (lib/tests/cpu/test_levels.c:
# there the levels it lacks are refused with their reasons). Anything in
# the binary outside the
# chosen kernels that needs a newer CPU stops it with SIGILL (exit 132).
set -eu
dir=$1
aft=$2
levels_test=$3
x=testdata/torch/rish_local/x.npy
dy=testdata/torch/rish_local/dy.npy
model=testdata/model/labml_aft_fortunes.safetensors

# case_run NAME ARGS...: aft ARGS under $run, its log in $dir/$side/NAME.log
case_run() {
    name=$1
    shift
    if ! $run "$aft" "$@" > "$dir/$side/$name.log" 2>&1; then
        grep -v "TCG doesn't support" "$dir/$side/$name.log" >&2 || true
        echo "test-qemu: $side: aft $name failed (exit status above): aft $*" >&2
        exit 1
    fi
}

cases() {
    mkdir -p "$dir/$side"
    o=$dir/$side
    case_run run run --variant local --window 4 --threads 2 -o "$o/y_local.npy" "$x"
    case_run full run --variant full --causal --threads 2 -o "$o/y_full.npy" "$x"
    case_run grad grad --variant full --dy "$dy" -o "$o/g.safetensors" "$x"
    case_run stream1 run --variant local --window 3 --causal --state-out "$o/state" -o "$o/y_s1.npy" "$x"
    case_run stream2 run --variant local --window 3 --causal --state-in "$o/state" -o "$o/y_s2.npy" "$x"
    case_run model model --weights "$model" -o "$o/logits.npy" testdata/model/seq_tokens.npy
    case_run generate generate --weights "$model" --prompt "The " --greedy -n 40
    cp "$o/generate.log" "$o/gen.txt"
}

side=native run=""
cases
for cpu in Nehalem:base Haswell:avx2; do
    side=${cpu%%:*} want=${cpu#*:}
    run="qemu-x86_64 -cpu $side"
    got=$($run "$aft" --version 2>/dev/null | sed -n 's/^kernels: \([^ ]*\).*/\1/p')
    if [ "$got" != "$want" ]; then
        echo "test-qemu: under -cpu $side aft runs kernels '$got', not $want" >&2
        exit 1
    fi
    if AFT_KERNELS=avx512 $run "$aft" --version > "$dir/refused.log" 2>&1 ||
        ! grep -q "^aft: AFT_KERNELS=avx512: kernel level avx512 needs .*: the CPU lacks [A-Z0-9.]*$" "$dir/refused.log"; then
        cat "$dir/refused.log" >&2
        echo "test-qemu: -cpu $side did not refuse AFT_KERNELS=avx512 as it should" >&2
        exit 1
    fi
    if ! $run "$levels_test" > "$dir/levels_test.log" 2>&1; then
        cat "$dir/levels_test.log" >&2
        echo "test-qemu: -cpu $side: $levels_test failed" >&2
        exit 1
    fi
    cases
    for f in y_local.npy y_full.npy g.safetensors y_s1.npy y_s2.npy logits.npy; do
        if ! "$aft" compare --atol 2e-5 --rtol 0 "$dir/$side/$f" "$dir/native/$f" > "$dir/$side/$f.cmp"; then
            cat "$dir/$side/$f.cmp" >&2
            echo "test-qemu: -cpu $side: $f differs from the native run by more than 2e-5" >&2
            exit 1
        fi
    done
    grep -v "TCG doesn't support" "$dir/$side/gen.txt" > "$dir/$side/gen.clean" || true
    if ! cmp -s "$dir/$side/gen.clean" "$dir/native/gen.txt"; then
        echo "test-qemu: -cpu $side: the greedy generation differs from the native one" >&2
        exit 1
    fi
    echo "test-qemu: -cpu $side (kernels $got): run, grad, stream, model and generate agree with the native runs"
done
