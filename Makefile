# aft - Attention Free Transformer tool and library
#   make          build ./aft and lib/libaft.a
#   make test     install missing packages, build, run every cmocka test
#   make demo     install missing packages, build, run aft on the bundled example
#   make deps     install missing Debian packages only

CC      ?= cc
ARCH    ?= -march=native
OPT     ?= -O3
CFLAGS  ?= $(OPT) $(ARCH) -mprefer-vector-width=512 -g
WARN    := -Wall -Wextra -Wshadow -Wno-unused-parameter -Wno-psabi
# contract a*b+c into fused multiply-adds (ISO C mode would forbid it); this
# is not -ffast-math: NaN, infinities and signed zeros keep their meaning
FPFLAGS := -ffp-contract=fast
PKGS    := libcjson openblas zlib
# pkg-config is queried lazily, after `deps` had its chance to install it
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
ALL_CFLAGS = $(CFLAGS) $(WARN) $(FPFLAGS) -std=c11 -D_GNU_SOURCE -fopenmp -Ilib $(PKG_CFLAGS)
LDLIBS_ALL = $(PKG_LIBS) -fopenmp -lpthread -lm

LIB_SRC := $(wildcard lib/*.c)
LIB_OBJ := $(LIB_SRC:lib/%.c=build/lib/%.o)
CLI_SRC := $(wildcard cli/*.c)
CLI_OBJ := $(CLI_SRC:cli/%.c=build/cli/%.o)
LIBTEST_SRC := $(wildcard lib/tests/test_*.c)
CLITEST_SRC := $(wildcard cli/tests/test_*.c)
TEST_BIN := $(LIBTEST_SRC:lib/tests/%.c=build/tests/lib_%) $(CLITEST_SRC:cli/tests/%.c=build/tests/cli_%)
TEST_HELP_SRC := $(filter-out $(LIBTEST_SRC) $(CLITEST_SRC),$(wildcard lib/tests/*.c cli/tests/*.c))

.PHONY: all deps test demo clean check-deps
all: aft lib/libaft.a

deps:
	@sh third_party/install-deps.sh

build/lib/%.o: lib/%.c lib/aft.h lib/internal.h
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

build/cli/%.o: cli/%.c lib/aft.h cli/cli.h
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Icli -c $< -o $@

lib/libaft.a: $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

aft: $(CLI_OBJ) lib/libaft.a
	$(CC) $(ALL_CFLAGS) -o $@ $(CLI_OBJ) lib/libaft.a $(LDLIBS_ALL)

build/tests/lib_%: lib/tests/%.c $(TEST_HELP_SRC) lib/libaft.a lib/aft.h
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Ilib/tests -Ilib $(shell pkg-config --cflags cmocka) -o $@ $< $(filter lib/tests/%,$(TEST_HELP_SRC)) lib/libaft.a $(shell pkg-config --libs cmocka) $(LDLIBS_ALL)

build/tests/cli_%: cli/tests/%.c $(TEST_HELP_SRC) aft
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Icli/tests -Ilib $(shell pkg-config --cflags cmocka) -o $@ $< $(filter cli/tests/%,$(TEST_HELP_SRC)) lib/libaft.a $(shell pkg-config --libs cmocka) $(LDLIBS_ALL)

# Each test binary prints cmocka's summary; the last line sums them up.
test: deps
	@$(MAKE) --no-print-directory all $(TEST_BIN)
	@pass=0; fail=0; for t in $(TEST_BIN); do \
	    echo "== $$t"; \
	    if AFT_BIN=$(CURDIR)/aft AFT_TESTDATA=$(CURDIR)/testdata ./$$t; then pass=$$((pass+1)); else fail=$$((fail+1)); fi; \
	done; \
	echo "programs: $$pass passed, $$fail failed"; \
	test $$fail -eq 0

demo: deps
	@$(MAKE) --no-print-directory all
	@sh testdata/demo.sh ./aft

clean:
	rm -rf build aft lib/libaft.a

# further targets (fuzzing, sanitizers, install, ...) live in mk/, one file each
-include $(wildcard mk/*.mk)
