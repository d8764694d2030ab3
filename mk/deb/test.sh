#!/bin/sh
# mk/deb/test.sh - checks the Debian package that make deb built ($DEB_FILE;
# make test-deb runs it, see mk/deb.mk), then installs it on this machine,
# runs it, and removes it again:
#
#   - its fields (dpkg-deb -f): name, version, architecture, and a Depends
#     entry for the package of every library the binary needs
#   - its files (dpkg-deb -c): exactly the list below, modes included
#   - its binary and its shared library: no run path
#   - lintian: no error (warnings and notes are printed)
#   - apt-get install ./$DEB_FILE, as root (sudo otherwise), where no aft is
#     installed (it refuses to replace one); then, outside the tree, the
#     installed aft: --version; generate without --weights, which must find
#     the model in /usr/share/aft and give PyTorch's greedy text for the
#     first run of testdata/model/greedy.json; bench --generate on it; the
#     README's library example built with pkg-config --libs and --static
#     --libs against the installed libaft.so and aft.pc, run (the dynamic
#     loader finds libaft.so.N, which ldconfig's cache lists) and compared
#   - apt-get remove aft, also when a check failed, and that nothing of it
#     is left (/usr/bin/aft, /usr/share/aft)
#
# The first failure stops it with "test-deb: what failed" on one line.
set -eu
: "${DEB_VERSION:?}" "${DEB_HOST_ARCH:?}" "${DEB_MULTIARCH:?}" "${DEB_FILE:?}"
fail() { echo "test-deb: $*" >&2; exit 1; }
say() { echo "test-deb: $*"; }
[ -f "$DEB_FILE" ] || fail "$DEB_FILE is not there (make deb builds it)"
for tool in dpkg-deb lintian apt-get readelf jq cc pkg-config; do
    command -v "$tool" > /dev/null || fail "$tool is not installed (make deps installs what this needs)"
done
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else
    command -v sudo > /dev/null || fail "not root and no sudo: apt-get install needs root"
    SUDO="sudo"
fi
top=$(pwd)
work=$(mktemp -d)
installed=""

# ---------------------------------------------------------------- the fields
field() { dpkg-deb -f "$DEB_FILE" "$1"; }
[ "$(field Package)" = aft ] || fail "Package is '$(field Package)', not aft"
[ "$(field Version)" = "$DEB_VERSION" ] || fail "Version is '$(field Version)', not lib/aft.h's $DEB_VERSION"
[ "$(field Architecture)" = "$DEB_HOST_ARCH" ] || fail "Architecture is '$(field Architecture)', not $DEB_HOST_ARCH"
depends=$(field Depends)
# the package each library comes from: OpenBLAS's OpenMP build (not the
# libopenblas0 metapackage, whose first choice is the pthread build)
dpkg-deb -x "$DEB_FILE" "$work/x"
so=$(cd "$work/x/usr/lib/$DEB_MULTIARCH" && ls libaft.so.*.*.*)
needed=$(readelf -d "$work/x/usr/bin/aft" "$work/x/usr/lib/$DEB_MULTIARCH/$so" |
    sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u)
for lib in $needed; do
    case $lib in
    libc.so.* | libm.so.*) pkg=libc6 ;;
    libgomp.so.1) pkg=libgomp1 ;;
    libcjson.so.1) pkg=libcjson1 ;;
    libz.so.1) pkg=zlib1g ;;
    libopenblas.so.0) pkg=libopenblas0-openmp ;;
    libmpi.so.40) pkg=libopenmpi3 ;;
    *) fail "aft or $so needs $lib, which this test does not know the package of: add it here" ;;
    esac
    echo ", $depends," | grep -Eq ", $pkg( \([^)]*\))?," || fail "Depends lacks $pkg (for $lib): $depends"
done
for f in usr/bin/aft "usr/lib/$DEB_MULTIARCH/$so"; do
    if readelf -d "$work/x/$f" | grep -Eq 'RPATH|RUNPATH'; then
        fail "/$f has a run path: $(readelf -d "$work/x/$f" | grep -E 'RPATH|RUNPATH')"
    fi
done
soname=${so%.*.*}
[ "$(dpkg-deb -I "$DEB_FILE" shlibs)" = "libaft ${soname#libaft.so.} aft (>= $DEB_VERSION)" ] ||
    fail "its shlibs is '$(dpkg-deb -I "$DEB_FILE" shlibs 2>&1)'"
[ "$(dpkg-deb -I "$DEB_FILE" triggers)" = "activate-noawait ldconfig" ] ||
    fail "its triggers is '$(dpkg-deb -I "$DEB_FILE" triggers 2>&1)', not ldconfig's"

say "fields: aft $DEB_VERSION $DEB_HOST_ARCH, Depends: $depends"

# ---------------------------------------------------------------- the files
ma=$DEB_MULTIARCH
cat > "$work/want" <<LIST
-rwxr-xr-x root/root ./usr/bin/aft
-rw-r--r-- root/root ./usr/include/aft.h
-rw-r--r-- root/root ./usr/lib/$ma/libaft.a
lrwxrwxrwx root/root ./usr/lib/$ma/libaft.so
lrwxrwxrwx root/root ./usr/lib/$ma/$soname
-rw-r--r-- root/root ./usr/lib/$ma/$so
-rw-r--r-- root/root ./usr/lib/$ma/pkgconfig/aft.pc
-rw-r--r-- root/root ./usr/share/aft/README.md
-rw-r--r-- root/root ./usr/share/aft/labml_aft_fortunes.safetensors
-rw-r--r-- root/root ./usr/share/bash-completion/completions/aft
-rw-r--r-- root/root ./usr/share/doc/aft/changelog.gz
-rw-r--r-- root/root ./usr/share/doc/aft/copyright
-rw-r--r-- root/root ./usr/share/man/man1/aft.1.gz
LIST
dpkg-deb -c "$DEB_FILE" | awk '$1 !~ /^d/ { print $1, $2, $6 }' | LC_ALL=C sort -k3 > "$work/got"
if ! cmp -s "$work/want" "$work/got"; then
    diff "$work/want" "$work/got" >&2 || true
    fail "its files are not the expected list (diff above: < expected, > in the package)"
fi
cmp -s "$work/x/usr/share/aft/labml_aft_fortunes.safetensors" testdata/model/labml_aft_fortunes.safetensors ||
    fail "/usr/share/aft/labml_aft_fortunes.safetensors differs from testdata/model's"
grep -qx "libdir=/usr/lib/$ma" "$work/x/usr/lib/$ma/pkgconfig/aft.pc" ||
    fail "aft.pc does not name libdir=/usr/lib/$ma"
[ "$(readlink "$work/x/usr/lib/$ma/libaft.so")" = "$soname" ] && [ "$(readlink "$work/x/usr/lib/$ma/$soname")" = "$so" ] ||
    fail "the links libaft.so -> $soname -> $so are not there"
say "files: the $(wc -l < "$work/want") expected, no run path; $so: soname $soname, shlibs, the ldconfig trigger"

# ---------------------------------------------------------------- lintian
if ! lintian --tag-display-limit 0 --fail-on error -EvI "$DEB_FILE" > "$work/lintian" 2>&1; then
    grep -v 'running with root privileges' "$work/lintian" >&2 || true
    fail "lintian reports errors (above)"
fi
grep -v 'running with root privileges' "$work/lintian" || true
say "lintian: no error"

# ---------------------------------------------------------------- installed
if dpkg-query -W -f='${Status}' aft 2> /dev/null | grep -q 'ok installed'; then
    fail "a package aft is installed already: remove it first (apt-get remove aft); this test installs its own"
fi
[ ! -e /usr/bin/aft ] || fail "/usr/bin/aft exists, from no package: this test would overwrite it"
cleanup() {
    st=$?
    if [ -n "$installed" ]; then
        $SUDO apt-get remove -y -qq aft > "$work/remove" 2>&1 || { cat "$work/remove" >&2; st=1; }
        if [ -e /usr/bin/aft ] || [ -e /usr/share/aft ] || [ -e "/usr/lib/$DEB_MULTIARCH/$soname" ]; then
            echo "test-deb: apt-get remove aft left /usr/bin/aft, /usr/share/aft or $soname behind" >&2
            st=1
        fi
        [ $st -ne 0 ] || echo "test-deb: removed: apt-get remove aft left nothing behind"
    fi
    rm -rf "$work"
    exit $st
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
export DEBIAN_FRONTEND=noninteractive
installed=yes
$SUDO apt-get install -y -qq "$top/$DEB_FILE" > "$work/install" 2>&1 ||
    { cat "$work/install" >&2; fail "apt-get install ./$DEB_FILE failed (above)"; }
[ "$(command -v aft)" = /usr/bin/aft ] || fail "aft on the PATH is '$(command -v aft)', not /usr/bin/aft"
ldd /usr/bin/aft > "$work/ldd"
! grep -q 'not found' "$work/ldd" || fail "/usr/bin/aft: a library is not found: $(grep 'not found' "$work/ldd")"
say "installed: $(aft --version | head -n 1); OpenBLAS loaded from $(sed -n 's/.*libopenblas.so.0 => \([^ ]*\).*/\1/p' "$work/ldd") -> $(readlink -f "$(sed -n 's/.*libopenblas.so.0 => \([^ ]*\).*/\1/p' "$work/ldd")")"
[ "$(aft --version | head -n 1)" = "aft $DEB_VERSION" ] || fail "aft --version says '$(aft --version | head -n 1)'"

# outside the tree, so only the data directory holds the model
mkdir "$work/run"
cd "$work/run"
prompt=$(jq -r '.runs[0].prompt' "$top/testdata/model/greedy.json")
n=$(jq -r '.runs[0].n_new' "$top/testdata/model/greedy.json")
jq -j '.runs[0] | .prompt + .text' "$top/testdata/model/greedy.json" > want.txt
[ "$(tail -c 1 want.txt)" = "" ] || echo >> want.txt   # aft ends the text with a newline
aft generate --prompt "$prompt" -n "$n" --greedy --timing timing.json > got.txt 2> err.txt ||
    fail "aft generate without --weights failed: $(cat err.txt)"
[ "$(jq -r .model timing.json)" = /usr/share/aft/labml_aft_fortunes.safetensors ] ||
    fail "aft generate ran $(jq -r .model timing.json), not /usr/share/aft/labml_aft_fortunes.safetensors"
cmp -s want.txt got.txt || fail "aft generate --greedy from '$prompt' differs from PyTorch's (testdata/model/greedy.json): $(head -c 200 got.txt)"
aft bench --generate --seq-len 8 --repeat 1 --threads 1 --json > bench.json 2> err.txt ||
    fail "aft bench --generate without --weights failed: $(cat err.txt)"
[ "$(jq -r .model bench.json)" = /usr/share/aft/labml_aft_fortunes.safetensors ] ||
    fail "aft bench --generate ran $(jq -r .model bench.json), not /usr/share/aft's model"
say "aft generate and aft bench --generate ran /usr/share/aft/labml_aft_fortunes.safetensors without --weights; generate gave PyTorch's greedy text"

# the README's library example, as the README builds and runs it, with
# pkg-config's default path (the package's aft.pc) and the installed aft
awk '/^    \/\* prog\.c:/ { on = 1 } on { sub(/^    /, ""); print } on && /^}$/ { exit }' "$top/README.md" > prog.c
awk '/^    cc prog\.c / { on = 1 } on && /^    / { sub(/^    /, ""); print; next } on { exit }' "$top/README.md" > run.sh
grep -q 'pkg-config --cflags --libs aft' run.sh || fail "README.md's example (prog.c and its lines) not found"
ln -s "$top/testdata" testdata
[ "$(pkg-config --modversion aft)" = "$DEB_VERSION" ] || fail "pkg-config --modversion aft: $(pkg-config --modversion aft 2>&1)"
for mode in "" "--static "; do
    sed "s/pkg-config --cflags/pkg-config ${mode}--cflags/" run.sh > run2.sh
    sh -e run2.sh > out.txt 2>&1 || { cat out.txt >&2; fail "the README's example with pkg-config ${mode}--libs failed (above)"; }
    grep -qx close out.txt || { cat out.txt >&2; fail "the README's example (pkg-config ${mode}--libs): aft compare did not say close"; }
    ldd prog | grep -q "$soname => /usr/lib/$DEB_MULTIARCH/$soname" ||
        fail "the README's example does not load /usr/lib/$DEB_MULTIARCH/$soname: $(ldd prog | grep libaft)"
    rm -f prog y.npy
done
ldc=$(command -v ldconfig || echo /sbin/ldconfig)
"$ldc" -p | grep -q "$soname " || fail "ldconfig's cache does not list $soname after the install"
say "the README's example built with pkg-config --libs and --static --libs aft against the package's $soname, and ran"
cd "$top"
say "passed"
