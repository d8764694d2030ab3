#!/bin/sh
# Installs the Debian packages aft builds against, if any is missing:
#   libcjson-dev     cJSON, the JSON parser/writer (safetensors headers, --json, --timing)
#   libcmocka-dev    cmocka, the unit-test framework (make test)
#   libopenblas-dev  OpenBLAS, the CBLAS used for the matrix products aft's own
#                    kernels do not run; libopenblas-openmp-dev its OpenMP build,
#                    which aft links (it starts no thread pool of its own)
#   zlib1g-dev       zlib, to inflate the deflated members of .npz archives
#   pkg-config       to find the four above
#   libopenmpi-dev   Open MPI's headers and libraries: aft run under mpirun
#                    shards the sequence over ranks (cli/shard.c); without
#                    them aft builds with no MPI support
#   openmpi-bin      mpirun, which the MPI tests (cli/tests/test_mpi.c) start
#   jq               the README's pipeline examples, which cli/tests/test_readme.c runs
#   dpkg-dev         dpkg-shlibdeps, which make deb (mk/deb/build.sh) takes the
#                    package's Depends from; dpkg-deb, which builds it, is dpkg's
#   lintian          Debian's package checker, which make test-deb runs on it
#   python3-numpy    the Python package's tests (make test-python, run by make
#                    test with /usr/bin/python3); python3-venv, python3-pip and
#                    python3-setuptools install it in make test-python-install
# Uses apt-get, through sudo when not root. Prints nothing when all are there.
set -eu
pkgs="libcjson-dev libcmocka-dev libopenblas-dev libopenblas-openmp-dev zlib1g-dev pkg-config libopenmpi-dev openmpi-bin jq dpkg-dev lintian python3-numpy python3-venv python3-pip python3-setuptools $*"
missing=""
for p in $pkgs; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0
echo "third_party/install-deps.sh: installing:$missing" >&2
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# refresh the package lists first; a stale or empty list finds nothing
$SUDO apt-get update -qq >&2 || echo "third_party/install-deps.sh: apt-get update failed; trying the install anyway" >&2
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >&2
