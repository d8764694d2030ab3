# aft - Attention Free Transformer tool and library
#   make          build ./aft, lib/libaft.a and lib/libaft.so
#   make test     install missing packages, build, run every cmocka test, then the Python tests
#   make demo     install missing packages, build, run aft on the bundled example
#   make deps     install missing Debian packages only

CC      ?= cc
OPT     ?= -O3
# The default build runs on any CPU of its architecture: lib/'s kernels are
# compiled once per level of LEVELS, each with its own -march
# (LEVEL_FLAGS_NAME), and lib/cpu/ picks the level at run time (the highest
# the CPU and its OS run; AFT_KERNELS chooses another). The rest is compiled
# for the baseline, ARCH. Setting ARCH (make ARCH=-march=native, or ARCH=
# for the compiler's default) builds everything with it instead, the
# kernels once, as the level "fixed".
MACHINE := $(shell $(CC) -dumpmachine 2>/dev/null)
X86     := $(filter x86_64-%,$(MACHINE))
ifeq ($(origin ARCH),undefined)
ARCH    := $(if $(X86),-march=x86-64 -mtune=generic)
LEVELS  := $(if $(X86),base avx2 avx512,base)
else
LEVELS  := fixed
endif
LEVEL_FLAGS_avx2   := -march=x86-64-v3
LEVEL_FLAGS_avx512 := -march=x86-64-v4
# AVX-512 code uses whole 64-byte vectors (GCC's default for some tunings
# is 256 bits, halving the kernels' width)
WIDE    := $(if $(X86),-mprefer-vector-width=512)
CFLAGS  ?= $(OPT) $(ARCH) $(WIDE) -g
WARN    := -Wall -Wextra -Wshadow -Wno-unused-parameter -Wno-psabi
# contract a*b+c into fused multiply-adds (ISO C mode would forbid it); this
# is not -ffast-math: NaN, infinities and signed zeros keep their meaning
FPFLAGS := -ffp-contract=fast
PKGS    := libcjson openblas zlib
# OpenBLAS's OpenMP build (Debian's libopenblas-openmp-dev) runs on OpenMP's
# threads, the ones aft's kernels use, and starts no thread pool of its own:
# the pthread build starts one when it loads, whose workers spin for a tenth
# of a second and take CPU from aft's threads. Where it is not installed,
# pkg-config finds the default OpenBLAS.
MULTIARCH := $(shell gcc -print-multiarch 2>/dev/null)
BLAS_OMP  := /usr/lib/$(MULTIARCH)/openblas-openmp
PKG_ENV    = PKG_CONFIG_PATH=$(BLAS_OMP)/pkgconfig$${PKG_CONFIG_PATH:+:$$PKG_CONFIG_PATH}
# pkg-config is queried lazily, after `deps` had its chance to install it
PKG_CFLAGS = $(shell $(PKG_ENV) pkg-config --cflags $(PKGS) 2>/dev/null)
BLAS_RPATH := -Wl,-rpath,$(BLAS_OMP)
PKG_LIBS   = $(shell $(PKG_ENV) pkg-config --libs $(PKGS) 2>/dev/null) \
             $(if $(wildcard $(BLAS_OMP)/libopenblas.so),$(BLAS_RPATH))
# (lib/cpu/levels.c: the fixed level's flags, for aft --version)
LEVEL_DEFS = $(if $(filter fixed,$(LEVELS)),-DAFT_FIXED_LEVEL='"$(or $(strip $(ARCH)),no -march)"')
ALL_CFLAGS = $(CFLAGS) $(WARN) $(FPFLAGS) -std=c11 -D_GNU_SOURCE -fopenmp -Ilib $(PKG_CFLAGS) $(LEVEL_DEFS)
LDLIBS_ALL = $(PKG_LIBS) -fopenmp -lpthread -lm

# Open MPI, when its development files are there: cli/shard.c runs aft run
# over mpirun's ranks (the library never links it); without them shard.c
# builds to a stub that says MPI is not built in
MPI_CFLAGS = $(shell pkg-config --cflags ompi-c 2>/dev/null || mpicc --showme:compile 2>/dev/null)
MPI_LIBS   = $(shell pkg-config --libs ompi-c 2>/dev/null || mpicc --showme:link 2>/dev/null)
MPI_FOUND  = $(if $(strip $(MPI_LIBS)),yes)

# lib/ in rooms: io/ (file formats), ops/ (the operator), nn/ (products and
# the layers around the operator); the layer, state and model at the top
LIB_ROOMS := io ops nn cpu api
LIB_SRC := $(wildcard lib/*.c $(LIB_ROOMS:%=lib/%/*.c))
# The kernels: compiled once per level into DIR/lib/LEVEL/, where every
# global name a level's objects define is suffixed _LEVEL (objcopy, from
# the names nm lists), so each level's code calls its own copies and the
# levels link side by side; lib/cpu/dispatch.c reaches them through each
# level's table (lib/cpu/entries.h). The rest of lib/ is compiled once.
KERN_SRC := lib/cpu/table.c lib/layer_chunks.c lib/slice.c \
    $(addprefix lib/ops/,op.c full.c full_grad.c local_conv.c local_conv_grad.c simple.c simple_grad.c grid.c \
                         bias.c bias_grad.c sums.c) \
    $(addprefix lib/nn/,linear.c gemm.c norm.c loss.c elem.c ffn.c bf16.c)
BASE_SRC := $(filter-out $(KERN_SRC),$(LIB_SRC))
# lib_objs(DIR): the objects of DIR/libaft.a
lib_objs = $(BASE_SRC:lib/%.c=$(1)/lib/%.o) $(foreach l,$(LEVELS),$(KERN_SRC:lib/%.c=$(1)/lib/$(l)/%.o))
LIB_OBJ := $(call lib_objs,build)
CLI_SRC := $(wildcard cli/*.c)
CLI_OBJ := $(CLI_SRC:cli/%.c=build/cli/%.o)
# the tests mirror the code: lib/tests/ROOM/test_NAME.c tests lib/ROOM/NAME.c
# and builds to build/tests/lib_ROOM/test_NAME; lib/tests/common/ holds the
# lib tests' shared helpers (and the test of their float64 reference)
TEST_ROOMS  := common $(LIB_ROOMS)
LIBTEST_SRC := $(wildcard lib/tests/test_*.c $(TEST_ROOMS:%=lib/tests/%/test_*.c))
CLITEST_SRC := $(wildcard cli/tests/test_*.c)
TEST_BIN := $(LIBTEST_SRC:lib/tests/%.c=build/tests/lib_%) $(CLITEST_SRC:cli/tests/%.c=build/tests/cli_%)
TEST_HELP_SRC := $(filter-out $(LIBTEST_SRC) $(CLITEST_SRC),$(wildcard lib/tests/common/*.c cli/tests/*.c))
TEST_HELP_HDR := $(wildcard lib/tests/common/*.h cli/tests/*.h)
# the helpers are compiled once, into build/tests/help/, and linked into
# every test program of their side
LIBTEST_HELP_OBJ := $(patsubst %.c,build/tests/help/%.o,$(filter lib/tests/%,$(TEST_HELP_SRC)))
CLITEST_HELP_OBJ := $(patsubst %.c,build/tests/help/%.o,$(filter cli/tests/%,$(TEST_HELP_SRC)))
# (the CLI tests' own calls into lib/ honour AFT_KERNELS too, as aft does)
CLITEST_HELP_OBJ += build/tests/help/lib/tests/common/levels.o
TEST_INC := -Ilib/tests/common -Icli/tests -Icli -Ilib

.PHONY: all deps test demo clean check-deps
all: aft lib/libaft.a lib/libaft.so

deps:
	@sh third_party/install-deps.sh

LIB_HDR := $(wildcard lib/*.h $(LIB_ROOMS:%=lib/%/*.h))
CLI_HDR := $(wildcard cli/*.h)

# lib/ is compiled position-independent, so that libaft.so and libaft.a
# are the same objects; -fno-semantic-interposition keeps GCC inlining and
# calling the library's own functions directly, as it does without -fPIC
# (no caller may replace them: libaft.so exports only aft.h's names)
PIC := -fPIC -fno-semantic-interposition

build/lib/%.o: lib/%.c $(LIB_HDR)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(PIC) -c $< -o $@

# kern_level(DIR, COMPILE, LEVEL): the rules for LEVEL's kernels in DIR,
# COMPILE the command that compiles one (the level's flags follow it: the
# last -march wins). Raw objects in DIR/raw/LEVEL/, renamed into
# DIR/lib/LEVEL/.
define kern_level
$(1)/raw/$(3)/%.o: lib/%.c $$(LIB_HDR)
	@mkdir -p $$(@D)
	$(2) $$(LEVEL_FLAGS_$(3)) -c $$< -o $$@
$(1)/raw/$(3)/names: $$(KERN_SRC:lib/%.c=$(1)/raw/$(3)/%.o)
	nm -g --defined-only $$^ | awk 'NF == 3 { print $$$$3, $$$$3 "_$(3)" }' | sort -u > $$@
$(1)/lib/$(3)/%.o: $(1)/raw/$(3)/%.o $(1)/raw/$(3)/names
	@mkdir -p $$(@D)
	objcopy --redefine-syms=$(1)/raw/$(3)/names $$< $$@
endef
$(foreach l,$(LEVELS),$(eval $(call kern_level,build,$$(CC) $$(ALL_CFLAGS) $$(PIC),$(l))))

build/cli/%.o: cli/%.c lib/aft.h $(CLI_HDR)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Icli -c $< -o $@

build/cli/shard.o build/cli/train_mpi.o: build/cli/%.o: cli/%.c lib/aft.h $(CLI_HDR)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(if $(MPI_FOUND),-DAFT_MPI $(MPI_CFLAGS)) -Icli -c $< -o $@

lib/libaft.a: $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

# The shared library: the same objects, linked with what they call (cJSON,
# OpenBLAS with its run path, zlib, OpenMP, libm), soname libaft.so.N for
# the binding interface's AFT_API_VERSION N. It exports the functions
# lib/aft.h declares and nothing else (build/libaft.map, a version script
# of every aft_NAME( in the preprocessed header, which has no comments):
# lib/internal.h's helpers and the kernels' per-level copies (aft_..._avx2)
# stay local.
AFT_API_VERSION := $(shell sed -n 's/^\#define AFT_API_VERSION \([0-9]*\)$$/\1/p' lib/aft.h)

build/libaft.map: lib/aft.h
	@mkdir -p $(@D)
	{ echo '{'; echo 'global:'; \
	  $(CC) -E -P $< | grep -o '\baft_[a-z0-9_]*[[:space:]]*(' | tr -d ' (' | sort -u | \
	  sed 's/.*/    &;/'; echo 'local:'; echo '    *;'; echo '};'; } > $@.tmp
	@grep -q 'aft_api_version;' $@.tmp || { echo "$@: lib/aft.h's functions not found ($(CC) -E -P)"; exit 1; }
	mv -f $@.tmp $@

lib/libaft.so: $(LIB_OBJ) build/libaft.map
	$(CC) $(ALL_CFLAGS) -shared -Wl,-soname,libaft.so.$(AFT_API_VERSION) -Wl,--version-script=build/libaft.map \
	    -Wl,-z,defs -o $@ $(LIB_OBJ) $(LDLIBS_ALL)

aft: $(CLI_OBJ) lib/libaft.a
	$(CC) $(ALL_CFLAGS) -o $@ $(CLI_OBJ) lib/libaft.a $(LDLIBS_ALL) $(if $(MPI_FOUND),$(MPI_LIBS))

build/tests/help/%.o: %.c $(TEST_HELP_HDR) lib/aft.h
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) $(shell pkg-config --cflags cmocka) -c $< -o $@

build/tests/lib_%: lib/tests/%.c $(LIBTEST_HELP_OBJ) $(TEST_HELP_HDR) lib/libaft.a lib/aft.h
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Ilib/tests/common -Ilib $(shell pkg-config --cflags cmocka) -o $@ $< $(LIBTEST_HELP_OBJ) lib/libaft.a $(shell pkg-config --libs cmocka) $(LDLIBS_ALL)

# the CLI tests also link the CLI's objects but main (the option tables, the
# numpy-style printer), to check them directly
CLI_TEST_OBJ = $(filter-out build/cli/main.o,$(CLI_OBJ))

build/tests/cli_%: cli/tests/%.c $(CLITEST_HELP_OBJ) $(TEST_HELP_HDR) aft
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Icli/tests -Icli -Ilib $(shell pkg-config --cflags cmocka) -o $@ $< $(CLITEST_HELP_OBJ) $(CLI_TEST_OBJ) lib/libaft.a $(shell pkg-config --libs cmocka) $(LDLIBS_ALL) $(if $(MPI_FOUND),$(MPI_LIBS))

# Each test binary prints cmocka's summary; the last line sums them up.
test: deps
	@$(MAKE) --no-print-directory all $(TEST_BIN)
	@pass=0; fail=0; for t in $(TEST_BIN); do \
	    echo "== $$t"; \
	    if AFT_BIN=$(CURDIR)/aft AFT_TESTDATA=$(CURDIR)/testdata ./$$t; then pass=$$((pass+1)); else fail=$$((fail+1)); fi; \
	done; \
	echo "programs: $$pass passed, $$fail failed"; \
	echo "== python/tests (make test-python)"; \
	py=0; $(MAKE) --no-print-directory test-python || py=1; \
	test $$fail -eq 0 && test $$py -eq 0

demo: deps
	@$(MAKE) --no-print-directory all
	@sh testdata/demo.sh ./aft

clean:
	rm -rf build aft lib/libaft.a lib/libaft.so

# further targets (fuzzing, sanitizers, install, ...) live in mk/, one file each
-include $(wildcard mk/*.mk)
