#!/bin/sh
# valgrind-aft.sh - runs a program under valgrind's memcheck; `make
# test-valgrind` sets AFT_BIN to this script, so every aft run a CLI test
# makes is checked.
#
#   AFT_VALGRIND_BIN   the program (default: build/valgrind/aft beside fuzz/)
#   AFT_VALGRIND_LOGS  a directory: reports go to LOGS/vg.PID.log instead of
#                      stderr, where they would break the tests' one-line
#                      message checks; `make test-valgrind` prints them
#
# An error, or a definitely lost block, makes the exit status 99. "Possibly
# lost" blocks are not errors: libgomp and OpenBLAS keep their thread pools'
# stacks and TLS until exit, which memcheck reports as possibly lost.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${AFT_VALGRIND_BIN:-$here/../build/valgrind/aft}
log=""
if [ -n "${AFT_VALGRIND_LOGS:-}" ]; then log="--log-file=$AFT_VALGRIND_LOGS/vg.%p.log"; fi
# aft re-executes itself through /proc/self/exe to change OPENBLAS_CORETYPE,
# OMP_WAIT_POLICY or OPENBLAS_NUM_THREADS before OpenBLAS and OpenMP load.
# Under valgrind that path names valgrind's own tool binary, which refuses to run ("You cannot
# run ... directly"), so give aft the settings it would restart for:
#  - AFT_BLAS_CORETYPE=keep, and no OPENBLAS_CORETYPE: OpenBLAS keeps the
#    kernel it picks for valgrind's virtual CPU (valgrind cannot execute the
#    AVX-512 kernels a restart would choose);
#  - OMP_WAIT_POLICY=PASSIVE and OPENBLAS_NUM_THREADS=1 unless the caller
#    chose otherwise.
unset OPENBLAS_CORETYPE
export AFT_BLAS_CORETYPE=keep
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
# shellcheck disable=SC2086
exec valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
    --show-leak-kinds=definite --child-silent-after-fork=yes \
    --suppressions="$here/valgrind.supp" $log "$bin" "$@"
