#!/bin/sh
# mk/deb/build.sh - builds the Debian package of aft (make deb runs it; see
# mk/deb.mk for the variables it is given).
#
#   1. copies the tree to build/deb/src (its build/ kept between runs, so an
#      unchanged tree compiles nothing) and builds it there for the package:
#      PREFIX=/usr (so aft looks for the shipped model in /usr/share/aft),
#      LIBDIR the multiarch directory, the default build (its kernels at
#      every CPU level, chosen at run time: the package runs on any machine
#      of its architecture, each at its best) or ARCH=$DEB_MARCH if given,
#      Debian's hardening flags, and no run path (BLAS_RPATH=, below);
#   2. make install DESTDIR=build/deb/root, then what Debian's tools would
#      do: strip the binary, the shared library and the archive, gzip the
#      man page, add /usr/share/doc/aft/copyright and changelog.gz,
#      DEBIAN/control (the Depends from dpkg-shlibdeps), DEBIAN/shlibs
#      (libaft.so.N is this package's), DEBIAN/triggers (ldconfig runs when
#      it is installed or removed) and DEBIAN/md5sums;
#   3. dpkg-deb --build, files owned by root.
#
# The run path: the tree's aft finds OpenBLAS's OpenMP build through a run
# path to /usr/lib/<multiarch>/openblas-openmp (the Makefile's BLAS_RPATH).
# A Debian binary carries no such path (lintian: custom-library-search-path),
# so the package's aft loads libopenblas.so.0 as the system's alternatives
# choose it: the OpenMP build where it is the only one installed, as on a
# machine that got OpenBLAS through this package's Depends; where the
# pthread build is installed too, that one (priority 100 against 95),
# unless `update-alternatives --config libopenblas.so.0-<multiarch>` picks
# the OpenMP build. aft computes the same either way (it calls OpenBLAS one
# thread a call); the pthread build starts a thread pool of its own.
set -eu
: "${DEB_VERSION:?}" "${DEB_HOST_ARCH:?}" "${DEB_MULTIARCH:?}" "${DEB_FILE:?}"
MAKE=${MAKE:-make}
DIR=build/deb
SRC=$DIR/src
ROOT=$DIR/root
fail() { echo "make deb: $*" >&2; exit 1; }
[ -n "${DEB_MAINTAINER:-}" ] || fail "no Maintainer: no git history to take it from; give DEB_MAINTAINER='Name <address>'"

# ---------------------------------------------------------------- 1. build
# the package's flags: the Makefile's -O3, and dpkg-buildflags' hardening
# (stack protector, fortified functions, read-only relocations) and
# reproducibility (no build path in the objects)
opt="-O3 -ffile-prefix-map=$(pwd)/$SRC=. -fstack-protector-strong -Wformat -Werror=format-security"
opt="$opt -Wdate-time -D_FORTIFY_SOURCE=2 -Wl,-z,relro -Wl,-z,now"
flags="ARCH=$DEB_MARCH|OPT=$opt"
mkdir -p "$SRC"
# other flags than last time: compile everything again
if [ "$(cat "$DIR/flags" 2>/dev/null)" != "$flags" ]; then rm -rf "$SRC/build"; fi
find "$SRC" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
tar -cf - --exclude=./build --exclude=./.git --exclude=./aft --exclude=./lib/libaft.a --exclude=./lib/libaft.so \
    --exclude='./aft_*.deb' . |
    tar -xf - -C "$SRC"
printf '%s\n' "$flags" > "$DIR/flags"
set -- OPT="$opt" PREFIX=/usr LIBDIR="/usr/lib/$DEB_MULTIARCH" BLAS_RPATH=
# (ARCH given at all, even empty, builds one level: only when asked)
if [ -n "${DEB_MARCH:-}" ]; then set -- "$@" ARCH="$DEB_MARCH"; fi
$MAKE --no-print-directory -C "$SRC" "$@" all > "$DIR/build.log" 2>&1 ||
    { cat "$DIR/build.log"; fail "the build failed (above; log: $DIR/build.log)"; }
if grep -i warning "$DIR/build.log"; then fail "the build warned (above; log: $DIR/build.log)"; fi
rm -rf "$ROOT"
$MAKE --no-print-directory -C "$SRC" "$@" DESTDIR="$(pwd)/$ROOT" install > "$DIR/install.log" 2>&1 ||
    { cat "$DIR/install.log"; fail "make install DESTDIR=$ROOT failed (above)"; }

# ---------------------------------------------------------------- 2. the tree
# what dh_strip does: no debugging symbols, no .comment and .note sections
strip --remove-section=.comment --remove-section=.note --strip-unneeded "$ROOT/usr/bin/aft"
strip --strip-debug --remove-section=.comment --remove-section=.note --enable-deterministic-archives \
    "$ROOT/usr/lib/$DEB_MULTIARCH/libaft.a"
so=$(cd "$ROOT/usr/lib/$DEB_MULTIARCH" && ls libaft.so.*.*.*)
soname=$(readelf -d "$ROOT/usr/lib/$DEB_MULTIARCH/$so" | sed -n 's/.*(SONAME).*\[libaft\.so\.\(.*\)\]/\1/p')
[ -n "$soname" ] || fail "$so has no soname libaft.so.N"
strip --remove-section=.comment --remove-section=.note --strip-unneeded "$ROOT/usr/lib/$DEB_MULTIARCH/$so"
gzip -9n "$ROOT/usr/share/man/man1/aft.1"
doc=$ROOT/usr/share/doc/aft
mkdir -p "$doc"
# the changelog: one entry for this version, dated by the commit built (by
# now where the tree is no git checkout), which also dates every file in
# the package (SOURCE_DATE_EPOCH), so the same commit gives the same .deb;
# the copyright's years, those of the first commit and of that one
commit=$(git log -1 --format=%h 2>/dev/null || echo unknown)
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH
last=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y)
first=$(git log --reverse --format=%ad --date=format:%Y 2>/dev/null | head -n 1)
years=${first:-$last}
[ "$years" = "$last" ] || years="$years-$last"
sed "s/@YEARS@/$years/" mk/deb/copyright > "$doc/copyright"
{
    echo "aft ($DEB_VERSION) unstable; urgency=medium"
    echo
    echo "  * Built by make deb from the aft source tree at commit $commit."
    echo
    echo " -- $DEB_MAINTAINER  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} > "$doc/changelog"
gzip -9n "$doc/changelog"

# ---------------------------------------------------------------- 3. control
# Depends: dpkg-shlibdeps maps each library aft links to its package, with
# the version its symbols need; it wants a debian/control, so it runs in a
# scratch directory that has a minimal one. debian/shlibs.local replaces
# OpenBLAS's shlibs entry (libopenblas0, the metapackage whose first choice
# is the pthread build) by the OpenMP build, libopenblas0-openmp: the one aft
# is built against and meant to run on, which then provides
# libopenblas.so.0 wherever no other build is installed.
top=$(pwd)
shl=$DIR/shlibdeps
rm -rf "$shl" && mkdir -p "$shl/debian"
printf 'Source: aft\n\nPackage: aft\nArchitecture: any\n' > "$shl/debian/control"
echo "libopenblas 0 libopenblas0-openmp" > "$shl/debian/shlibs.local"
(cd "$shl" && dpkg-shlibdeps -O -e"$top/$ROOT/usr/bin/aft" -e"$top/$ROOT/usr/lib/$DEB_MULTIARCH/$so") \
    > "$shl/out" 2> "$shl/log" ||
    { cat "$shl/log"; fail "dpkg-shlibdeps failed (above)"; }
depends=$(sed -n 's/^shlibs:Depends=//p' "$shl/out")
[ -n "$depends" ] || { cat "$shl/out" "$shl/log"; fail "dpkg-shlibdeps found no dependencies (above)"; }
mkdir -p "$ROOT/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
sed -e "s|@VERSION@|$DEB_VERSION|" -e "s|@ARCH@|$DEB_HOST_ARCH|" -e "s|@MAINTAINER@|$DEB_MAINTAINER|" \
    -e "s|@SIZE@|$size|" -e "s|@DEPENDS@|$depends|" mk/deb/control.in > "$ROOT/DEBIAN/control"
(cd "$ROOT" && find usr -type f | LC_ALL=C sort | xargs md5sum) > "$ROOT/DEBIAN/md5sums"
# the shared library: programs linked with it depend on this package (the
# version that built them, or later); the dynamic loader's cache is made
# again when the package comes and goes
echo "libaft $soname aft (>= $DEB_VERSION)" > "$ROOT/DEBIAN/shlibs"
echo "activate-noawait ldconfig" > "$ROOT/DEBIAN/triggers"
# modes as Debian's tools leave them, whatever the umask was
find "$ROOT" -type d -exec chmod 755 {} +
find "$ROOT" -type f -exec chmod 644 {} +
chmod 755 "$ROOT/usr/bin/aft"

dpkg-deb --root-owner-group --build "$ROOT" "$DEB_FILE" > /dev/null
echo "make deb: $DEB_FILE (Depends: $depends)"
