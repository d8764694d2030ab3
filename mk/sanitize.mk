# mk/sanitize.mk - the tests under AddressSanitizer + UndefinedBehaviorSanitizer,
# and the CLI tests with every aft run under valgrind.
#
#   make test-asan       builds lib, cli and every test with
#                        gcc -fsanitize=address,undefined into build/asan/ and
#                        runs every test program, AFT_BIN = build/asan/aft
#   make test-valgrind   runs the default build's ./aft under memcheck on a
#                        small run (at the level it picks there), then the
#                        CLI test programs with AFT_BIN = fuzz/valgrind-aft.sh
#                        (every aft run under memcheck), and the format tests
#                        (lib_io/test_npy, test_npz, test_safetensors,
#                        test_detect) under memcheck
#
# test-asan builds from the same sources as the main Makefile (its LIB_SRC,
# CLI_SRC, test lists, warnings and FPFLAGS) into its own directory under
# build/ (so `make clean` removes it) with its own flags: the normal objects,
# ./aft and lib/libaft.a are never touched; test-valgrind runs the normal
# build. Either target fails when a test
# fails or when any process wrote a sanitizer or valgrind report, even a
# process whose test only looked at its exit status: the reports go to log
# files (build/asan/logs/, build/valgrind/logs/), which are printed at the end.

SAN_CC ?= gcc
SAN_PKG_CFLAGS = $(shell pkg-config --cflags cmocka 2>/dev/null)
SAN_PKG_LIBS   = $(shell pkg-config --libs cmocka 2>/dev/null)

# ---------------------------------------------------------------- shared rules

# san_build(DIR, FLAGS): DIR/libaft.a, DIR/aft and the test programs
# DIR/tests/lib_ROOM/test_* and DIR/tests/cli_test_* (their helpers once, in
# DIR/tests/help/) compiled with FLAGS (used for compiling and linking).
define san_build
$(1)/lib/%.o: lib/%.c $(LIB_HDR)
	@mkdir -p $$(@D)
	$$(SAN_CC) $(2) $$(WARN) $$(FPFLAGS) -std=c11 -D_GNU_SOURCE -fopenmp -Ilib $$(PKG_CFLAGS) $$(LEVEL_DEFS) -c $$< -o $$@

$(1)/cli/%.o: cli/%.c lib/aft.h cli/cli.h
	@mkdir -p $$(@D)
	$$(SAN_CC) $(2) $$(WARN) $$(FPFLAGS) -std=c11 -D_GNU_SOURCE -fopenmp -Ilib -Icli $$(PKG_CFLAGS) -c $$< -o $$@

$(1)/libaft.a: $$(call lib_objs,$(1))
	rm -f $$@
	ar rcs $$@ $$^

# testdata beside it: aft finds the shipped model beside its binary, as the
# tree's ./aft does (aft bench --generate, aft generate without --weights)
$(1)/aft: $$(CLI_SRC:cli/%.c=$(1)/cli/%.o) $(1)/libaft.a
	$$(SAN_CC) $(2) -o $$@ $$^ $$(LDLIBS_ALL)
	ln -sfn $(CURDIR)/testdata $(1)/testdata

$(1)/tests/help/%.o: %.c $$(TEST_HELP_HDR) lib/aft.h
	@mkdir -p $$(@D)
	$$(SAN_CC) $(2) $$(WARN) $$(FPFLAGS) -std=c11 -D_GNU_SOURCE -fopenmp $$(TEST_INC) $$(PKG_CFLAGS) $$(SAN_PKG_CFLAGS) -c $$< -o $$@

$(1)/tests/lib_%: lib/tests/%.c $$(LIBTEST_HELP_OBJ:build/tests/%=$(1)/tests/%) $$(TEST_HELP_HDR) $(1)/libaft.a lib/aft.h
	@mkdir -p $$(@D)
	$$(SAN_CC) $(2) $$(WARN) $$(FPFLAGS) -std=c11 -D_GNU_SOURCE -fopenmp -Ilib/tests/common -Ilib $$(PKG_CFLAGS) $$(SAN_PKG_CFLAGS) \
	    -o $$@ $$< $$(LIBTEST_HELP_OBJ:build/tests/%=$(1)/tests/%) $(1)/libaft.a $$(SAN_PKG_LIBS) $$(LDLIBS_ALL)

$(1)/tests/cli_%: cli/tests/%.c $$(CLITEST_HELP_OBJ:build/tests/%=$(1)/tests/%) $$(TEST_HELP_HDR) $$(filter-out $(1)/cli/main.o,$$(CLI_SRC:cli/%.c=$(1)/cli/%.o)) $(1)/libaft.a lib/aft.h
	@mkdir -p $$(@D)
	$$(SAN_CC) $(2) $$(WARN) $$(FPFLAGS) -std=c11 -D_GNU_SOURCE -fopenmp -Icli/tests -Icli -Ilib $$(PKG_CFLAGS) $$(SAN_PKG_CFLAGS) \
	    -o $$@ $$< $$(CLITEST_HELP_OBJ:build/tests/%=$(1)/tests/%) $$(filter-out $(1)/cli/main.o,$$(CLI_SRC:cli/%.c=$(1)/cli/%.o)) \
	    $(1)/libaft.a $$(SAN_PKG_LIBS) $$(LDLIBS_ALL)
endef

# san_levels(DIR, FLAGS): san_build's kernels, once per level (kern_level)
san_levels = $(foreach l,$(LEVELS),$(eval $(call kern_level,$(1),$$(SAN_CC) $(2) $$(WARN) $$(FPFLAGS) -std=c11 \
    -D_GNU_SOURCE -fopenmp -Ilib $$(PKG_CFLAGS) $$(LEVEL_DEFS),$(l))))

# the test programs of a build directory, named as the main Makefile names them
san_lib_tests = $(LIBTEST_SRC:lib/tests/%.c=$(1)/tests/lib_%)
san_cli_tests = $(CLITEST_SRC:cli/tests/%.c=$(1)/tests/cli_%)

# Test programs run SAN_JOBS at a time (default: one per CPU): under the
# sanitizers and valgrind the suite is CPU-bound and the programs are
# independent (each works in its own temporary directory). Each run is a file
# DIR/runs/PROGRAM.result ("passed N s" or "FAILED N s") beside its output,
# DIR/runs/PROGRAM.log, made by a rule below; the target then prints the logs
# in order.
SAN_JOBS ?= $(shell nproc 2>/dev/null || echo 2)

# san_result(CMD): recipe lines running CMD, its output to the .log beside $@
define san_result
@mkdir -p $(@D)
@s=$$(date +%s); if $(1) > $(@:.result=.log) 2>&1; then r=passed; else r=FAILED; fi; \
	echo "$$r $$(( $$(date +%s) - s )) s" > $@
endef

# san_report(RESULTS, NAME): print each program's log and result (the
# program named by its path, DIR/PROGRAM), then the count; fail if one failed
define san_report
@fail=0; for r in $(1); do \
	    p=$$(echo $${r%.result} | sed 's,/runs/,/,'); echo "== $$p"; cat $${r%.result}.log; \
	    echo "== $$p: $$(cat $$r)"; \
	    case "$$(cat $$r)" in FAILED*) fail=$$((fail+1));; esac; \
	done; \
	echo "$(2): $(words $(1)) programs, $$fail failed"; \
	test $$fail -eq 0
endef

# Prints every non-empty report file under $(1) and fails if there is one.
define san_check_logs
@bad=0; for f in $$(find $(1) -type f -size +0 2>/dev/null | sort); do \
	    echo "==== $$f"; cat "$$f"; bad=$$((bad+1)); \
	done; \
	if [ $$bad -ne 0 ]; then echo "$(2): $$bad report(s) above, in $(1)"; exit 1; fi
endef

# the longest-running programs first, so parallel runs end together
SAN_SLOW_FIRST = %/cli_test_stream %/cli_test_model %/cli_test_run %/cli_test_malformed %/lib_test_slice \
                 %/lib_test_state %/lib_ops/test_op %/lib_test_model
san_order = $(filter $(SAN_SLOW_FIRST),$(1)) $(filter-out $(SAN_SLOW_FIRST),$(1))

.PHONY: test-asan test-valgrind sanitize-deps

# ---------------------------------------------------------------- test-asan

ASAN_DIR   := build/asan
# -O2: the operator tests' float64 reference kernels run 8x faster than at -O1
# (21 s against 3 min), and with frame pointers kept the reports' stacks stay
# readable; the kernels are built at every level, as in the normal build,
# and run at the highest this CPU runs
ASAN_FLAGS := -O2 -g $(ARCH) -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
$(eval $(call san_build,$(ASAN_DIR),$(ASAN_FLAGS)))
$(call san_levels,$(ASAN_DIR),$(ASAN_FLAGS))
ASAN_TESTS   = $(call san_lib_tests,$(ASAN_DIR)) $(call san_cli_tests,$(ASAN_DIR))
ASAN_RESULTS = $(patsubst $(ASAN_DIR)/tests/%,$(ASAN_DIR)/runs/%.result,$(call san_order,$(ASAN_TESTS)))

# exitcode: a report must not look like aft's own status 1 (data error).
# log_path: reports land in files, checked after the run whatever the tests
# asserted. allocator_may_return_null: a huge malloc returns NULL, as it does
# without ASan, so the code's own out-of-memory path runs instead of an abort.
ASAN_ENV = ASAN_OPTIONS=exitcode=86:log_path=$(CURDIR)/$(ASAN_DIR)/logs/asan:allocator_may_return_null=1:detect_leaks=1:check_initialization_order=1:strict_string_checks=1 \
           UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=87:log_path=$(CURDIR)/$(ASAN_DIR)/logs/ubsan \
           AFT_BIN=$(CURDIR)/$(ASAN_DIR)/aft AFT_TESTDATA=$(CURDIR)/testdata AFT_TEST_TIMEOUT=300

$(ASAN_DIR)/runs/%.result: $(ASAN_DIR)/tests/%
	$(call san_result,env $(ASAN_ENV) ./$<)

test-asan: deps
	@$(MAKE) --no-print-directory -j$(SAN_JOBS) $(ASAN_DIR)/aft $(ASAN_TESTS)
	@rm -rf $(ASAN_DIR)/logs $(ASAN_DIR)/runs && mkdir -p $(ASAN_DIR)/logs
	@$(MAKE) --no-print-directory -j$(SAN_JOBS) $(ASAN_RESULTS)
	$(call san_report,$(ASAN_RESULTS),test-asan)
	$(call san_check_logs,$(ASAN_DIR)/logs,test-asan)

# ---------------------------------------------------------------- test-valgrind

VG_DIR   := build/valgrind
# The default build itself: valgrind shows a CPU without AVX-512, so aft
# picks a level it can execute. Under valgrind: the CLI tests (every aft run
# they make, the malformed corpus included) and the format tests. The
# operator's tests (lib_ops/) are left out: their float64 reference kernels
# take tens of minutes under memcheck; `make test-asan` covers them.
VG_CLI_TESTS = $(filter build/tests/cli_%,$(TEST_BIN))
VG_LIB_TESTS = $(addprefix build/tests/lib_io/,test_npy test_npz test_safetensors test_detect)
VG_RESULTS   = $(patsubst build/tests/%,$(VG_DIR)/runs/%.result,$(call san_order,$(VG_CLI_TESTS) $(VG_LIB_TESTS)))

# AFT_TEST_QUICK=1: fewer cases of the same paths (harness_quick()):
# test_malformed runs one command per file (aft info and aft run in turn)
# instead of four, test_stream feeds one row at a time for local alone, and
# test_model generates shorter texts. AFT_TEST_TIMEOUT: one aft run under
# memcheck takes a second or more instead of milliseconds.
# AFT_KERNELS and OPENBLAS_CORETYPE: aft and OpenBLAS choose their kernels
# from CPUID, and valgrind shows a CPU without AVX-512, so an aft under
# valgrind would multiply with other kernels than the test program beside
# it, and the tests that compare the two byte for byte would differ in the
# last bits. avx2 and Haswell's kernels run natively and under valgrind on
# every x86-64 host CI uses.
VG_ENV = AFT_KERNELS=avx2 OPENBLAS_CORETYPE=Haswell AFT_VALGRIND_BIN=$(CURDIR)/aft \
         AFT_VALGRIND_LOGS=$(CURDIR)/$(VG_DIR)/logs \
         AFT_TESTDATA=$(CURDIR)/testdata AFT_TEST_TIMEOUT=600 AFT_TEST_QUICK=1

# a CLI test runs natively, every aft it starts under valgrind; a library
# test runs under valgrind itself
$(VG_DIR)/runs/cli_%.result: build/tests/cli_%
	$(call san_result,env $(VG_ENV) AFT_BIN=$(CURDIR)/fuzz/valgrind-aft.sh ./$<)
$(VG_DIR)/runs/lib_%.result: build/tests/lib_%
	$(call san_result,env $(VG_ENV) AFT_VALGRIND_BIN=$(CURDIR)/$< sh fuzz/valgrind-aft.sh)

# aft itself under memcheck, no wrapper and no AFT_KERNELS: the level it
# picks under valgrind (named by --version), and runs at it
VG_RUN  := valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
           --show-leak-kinds=definite --suppressions=fuzz/valgrind.supp
VG_X    := testdata/torch/rish_local/x.npy
define vg_plain
	$(VG_RUN) ./aft --version
	$(VG_RUN) ./aft run --variant local --window 4 -o $(VG_DIR)/y.npy $(VG_X)
	$(VG_RUN) ./aft run --variant full --causal --threads 2 -o $(VG_DIR)/y2.npy $(VG_X)
	./aft run --variant local --window 4 --impl reference -o $(VG_DIR)/yr.npy $(VG_X) && \
	    ./aft compare --rtol 2e-5 --atol 2e-5 $(VG_DIR)/y.npy $(VG_DIR)/yr.npy
endef

sanitize-deps:
	@sh third_party/install-deps.sh valgrind

test-valgrind: deps sanitize-deps
	@$(MAKE) --no-print-directory all $(VG_CLI_TESTS) $(VG_LIB_TESTS)
	@rm -rf $(VG_DIR) && mkdir -p $(VG_DIR)/logs
	$(vg_plain)
	@$(MAKE) --no-print-directory -j$(SAN_JOBS) $(VG_RESULTS)
	$(call san_report,$(VG_RESULTS),test-valgrind)
	$(call san_check_logs,$(VG_DIR)/logs,test-valgrind)
