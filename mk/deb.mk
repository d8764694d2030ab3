# mk/deb.mk - a Debian package of aft, and its test.
#
#   make deb        aft_VERSION_ARCH.deb in the top directory: VERSION is
#                   lib/aft.h's AFT_VERSION, ARCH `dpkg --print-architecture`.
#                   mk/deb/build.sh builds it (in build/deb/: a copy of the
#                   tree built for /usr, staged by make install DESTDIR=)
#                   and says how. It holds /usr/bin/aft, libaft.a and aft.pc
#                   in /usr/lib/MULTIARCH, aft.h, the man page, the bash
#                   completion, the shipped model and its README in
#                   /usr/share/aft, and /usr/share/doc/aft/.
#   make test-deb   builds it when the tree changed (a run after make deb
#                   compiles nothing), then mk/deb/test.sh: its fields, its
#                   files, lintian (no error), then, as root (through sudo
#                   otherwise), apt-get install of the .deb, the installed
#                   aft run (generate without --weights, from the data
#                   directory), a program built with pkg-config, and
#                   apt-get remove. It refuses to run where aft is already
#                   installed. Any failure stops it with a one-line reason.
#
#   DEB_MARCH       the package's ARCH (default: none, the default build,
#                   whose kernels are chosen at run time for every machine
#                   of the architecture; given, one level built with it)
#   DEB_MAINTAINER  its Maintainer (default: the author of the commit built)

DEB_VERSION     = $(AFT_VERSION_STRING)
DEB_HOST_ARCH  := $(shell dpkg --print-architecture 2>/dev/null)
DEB_MULTIARCH  := $(shell dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null)
DEB_FILE        = aft_$(DEB_VERSION)_$(DEB_HOST_ARCH).deb
DEB_MARCH      ?=
DEB_MAINTAINER ?= $(shell git log -1 --format='%an <%ae>' 2>/dev/null)

DEB_ENV = DEB_VERSION='$(DEB_VERSION)' DEB_HOST_ARCH='$(DEB_HOST_ARCH)' DEB_MULTIARCH='$(DEB_MULTIARCH)' \
          DEB_FILE='$(DEB_FILE)' DEB_MARCH='$(DEB_MARCH)' DEB_MAINTAINER='$(DEB_MAINTAINER)' MAKE='$(MAKE)'

.PHONY: deb test-deb clean-deb
deb: deps
	@$(DEB_ENV) sh mk/deb/build.sh

test-deb: deb
	@$(DEB_ENV) sh mk/deb/test.sh

clean: clean-deb
clean-deb:
	rm -f aft_*.deb
