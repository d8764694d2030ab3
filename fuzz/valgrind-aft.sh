#!/bin/sh
# valgrind-aft.sh - runs a program under valgrind's memcheck; `make
# test-valgrind` sets AFT_BIN to this script, so every aft run a CLI test
# makes is checked.
#
#   AFT_VALGRIND_BIN   the program (default: the aft beside fuzz/)
#   AFT_VALGRIND_LOGS  a directory: reports go to LOGS/vg.PID.log instead of
#                      stderr, where they would break the tests' one-line
#                      message checks; `make test-valgrind` prints them
#
# An error, or a definitely lost block, makes the exit status 99. "Possibly
# lost" blocks are not errors: libgomp and OpenBLAS keep their thread pools'
# stacks and TLS until exit, which memcheck reports as possibly lost.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${AFT_VALGRIND_BIN:-$here/../aft}
log=""
if [ -n "${AFT_VALGRIND_LOGS:-}" ]; then log="--log-file=$AFT_VALGRIND_LOGS/vg.%p.log"; fi
# shellcheck disable=SC2086
exec valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
    --show-leak-kinds=definite --child-silent-after-fork=yes \
    --suppressions="$here/valgrind.supp" $log "$bin" "$@"
