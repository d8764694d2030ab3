# mk/install.mk - make install / make uninstall.
#
#   make install   [PREFIX=/usr/local] [DESTDIR=]
#       $(PREFIX)/bin/aft
#       $(PREFIX)/lib/libaft.a
#       $(PREFIX)/lib/libaft.so.N.0.0, and the links libaft.so.N (its
#         soname; N: AFT_API_VERSION) and libaft.so to it
#       $(PREFIX)/include/aft.h
#       $(PREFIX)/lib/pkgconfig/aft.pc                  (from mk/aft.pc.in)
#       $(PREFIX)/share/man/man1/aft.1
#       $(PREFIX)/share/bash-completion/completions/aft (completion/aft.bash)
#       $(PREFIX)/share/aft/labml_aft_fortunes.safetensors, README.md
#                                                       (testdata/model/'s)
#     each under $(DESTDIR), which only stages the files: aft.pc names
#     PREFIX. BINDIR, LIBDIR, INCLUDEDIR, MANDIR, PKGCONFIGDIR, BASHCOMPDIR
#     and DATADIR override single places.
#   make uninstall [PREFIX=...] [DESTDIR=...]
#     removes exactly those files (directories stay: others may use them).
#
# install depends on `all` and then only copies what `all` built, so an
# install right after a build compiles nothing. The one exception: cli/ is
# compiled with DATADIR, where aft generate and aft bench --generate look
# for the shipped model when it is not beside the binary (cli/cli.h), so a
# build or install with another PREFIX or DATADIR compiles cli/ again
# (build/datadir holds the one it was compiled with). The build uses
# ARCH=-march=native: to install files for other machines, build with
# e.g. `make clean && make ARCH=-march=x86-64-v2` first.

PREFIX       ?= /usr/local
BINDIR       ?= $(PREFIX)/bin
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
MANDIR       ?= $(PREFIX)/share/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
BASHCOMPDIR  ?= $(PREFIX)/share/bash-completion/completions
DATADIR      ?= $(PREFIX)/share/aft
INSTALL      ?= install

# the version in lib/aft.h, for aft.pc
AFT_VERSION_STRING = $(shell sed -n 's/^\#define AFT_VERSION "\(.*\)"$$/\1/p' lib/aft.h)
# the shared library's names: its soname and the file it links to
SO_NAME = libaft.so.$(AFT_API_VERSION)
SO_FILE = $(SO_NAME).0.0

# A program linked with pkg-config --libs aft gets libaft.so (the linker
# prefers it to libaft.a); where LIBDIR is none of the directories the
# dynamic loader searches of itself, aft.pc gives such a program a run path
# to it, so it runs without ldconfig or LD_LIBRARY_PATH (make install
# PREFIX=/usr/local, a home directory); in /usr/lib or its multiarch
# directory (the Debian package's) it needs none.
SYSTEM_LIBDIRS = /lib /usr/lib $(if $(MULTIARCH),/lib/$(MULTIARCH) /usr/lib/$(MULTIARCH))
PC_RPATH_FLAG = -Wl,-rpath,$${libdir}
PC_LIB_RPATH = $(if $(filter $(patsubst %/,%,$(LIBDIR)),$(SYSTEM_LIBDIRS)),,$(PC_RPATH_FLAG))

# the OpenBLAS aft links, as the Makefile finds it (PKG_ENV: the OpenMP
# build where it is installed), with the Makefile's run path for it; and the
# libraries that OpenBLAS needs besides when linked statically (its
# Libs.private), for aft.pc
PC_BLAS_LIBS = $(strip $(shell $(PKG_ENV) pkg-config --libs openblas) \
    $(if $(wildcard $(BLAS_OMP)/libopenblas.so),$(BLAS_RPATH)))
PC_BLAS_LIBS_PRIVATE = $(strip $(filter-out $(shell $(PKG_ENV) pkg-config --libs openblas), \
    $(shell $(PKG_ENV) pkg-config --static --libs openblas)))

# the data directory, compiled into cli/ (cli.h: AFT_DATADIR); build/datadir
# is rewritten only when it changes, so cli/ is compiled again only then
$(CLI_OBJ): ALL_CFLAGS += -DAFT_DATADIR='"$(DATADIR)"'
$(CLI_OBJ): build/datadir
build/datadir: FORCE
	@mkdir -p $(@D)
	@echo '$(DATADIR)' | cmp -s - $@ || echo '$(DATADIR)' > $@
.PHONY: FORCE
FORCE:

# the shipped model and its README, into DATADIR
SHIPPED_DATA = testdata/model/labml_aft_fortunes.safetensors testdata/model/README.md

# every file install writes, as uninstall removes them
INSTALLED_FILES = "$(DESTDIR)$(BINDIR)/aft" "$(DESTDIR)$(LIBDIR)/libaft.a" \
    "$(DESTDIR)$(LIBDIR)/$(SO_FILE)" "$(DESTDIR)$(LIBDIR)/$(SO_NAME)" "$(DESTDIR)$(LIBDIR)/libaft.so" \
    "$(DESTDIR)$(INCLUDEDIR)/aft.h" "$(DESTDIR)$(PKGCONFIGDIR)/aft.pc" \
    "$(DESTDIR)$(MANDIR)/man1/aft.1" "$(DESTDIR)$(BASHCOMPDIR)/aft" \
    $(SHIPPED_DATA:testdata/model/%="$(DESTDIR)$(DATADIR)/%")

.PHONY: install uninstall
install: all
	$(INSTALL) -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(LIBDIR)" "$(DESTDIR)$(INCLUDEDIR)" \
	    "$(DESTDIR)$(PKGCONFIGDIR)" "$(DESTDIR)$(MANDIR)/man1" "$(DESTDIR)$(BASHCOMPDIR)" \
	    "$(DESTDIR)$(DATADIR)"
	$(INSTALL) -m 755 aft "$(DESTDIR)$(BINDIR)/aft"
	$(INSTALL) -m 644 lib/libaft.a "$(DESTDIR)$(LIBDIR)/libaft.a"
	$(INSTALL) -m 644 lib/libaft.so "$(DESTDIR)$(LIBDIR)/$(SO_FILE)"
	ln -sfn $(SO_FILE) "$(DESTDIR)$(LIBDIR)/$(SO_NAME)"
	ln -sfn $(SO_NAME) "$(DESTDIR)$(LIBDIR)/libaft.so"
	$(INSTALL) -m 644 lib/aft.h "$(DESTDIR)$(INCLUDEDIR)/aft.h"
	$(INSTALL) -m 644 man/aft.1 "$(DESTDIR)$(MANDIR)/man1/aft.1"
	$(INSTALL) -m 644 completion/aft.bash "$(DESTDIR)$(BASHCOMPDIR)/aft"
	$(INSTALL) -m 644 $(SHIPPED_DATA) "$(DESTDIR)$(DATADIR)"
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(AFT_VERSION_STRING)|g' \
	    -e 's|@BLAS_LIBS@|$(PC_BLAS_LIBS)|g' -e 's|@BLAS_LIBS_PRIVATE@|$(PC_BLAS_LIBS_PRIVATE)|g' \
	    -e 's|@LIB_RPATH@|$(PC_LIB_RPATH)|g' \
	    mk/aft.pc.in > "$(DESTDIR)$(PKGCONFIGDIR)/aft.pc.tmp"
	chmod 644 "$(DESTDIR)$(PKGCONFIGDIR)/aft.pc.tmp"
	mv -f "$(DESTDIR)$(PKGCONFIGDIR)/aft.pc.tmp" "$(DESTDIR)$(PKGCONFIGDIR)/aft.pc"

uninstall:
	rm -f $(INSTALLED_FILES)
