# mk/levels.mk - the kernels at every level, and the binary on older CPUs.
#
#   make test-levels   runs the kernels' tests (lib_ops/, lib_nn/, the
#                      layer, state, slices, model, the exponential) and the
#                      CLI tests that run them again at each kernel level
#                      this CPU runs below the one `make test` ran them at
#                      (the highest): the same programs with AFT_KERNELS=LEVEL
#   make test-qemu     runs the default ./aft under qemu-x86_64 -cpu Nehalem
#                      (base kernels) and -cpu Haswell (avx2): run, grad,
#                      stream and generate, each compared with the same
#                      command run natively within 2e-5 x max(1, |y|). A
#                      baseline instruction used outside the chosen kernels
#                      would stop it with SIGILL.
#   make check-aarch64 compiles lib/ and cli/ for aarch64 (below)
#
# The first two use the normal build. A level this CPU does not run is skipped, with
# a line saying so.

LEVEL_TESTS := $(filter build/tests/lib_ops/% build/tests/lib_nn/% build/tests/lib_cpu/%,$(TEST_BIN)) \
               $(addprefix build/tests/lib_test_,layer layer_chunks layer_grad state slice model numerics precision) \
               $(addprefix build/tests/cli_test_,run grad stream model mask json pipeline)

.PHONY: test-levels test-qemu
test-levels: deps
	@$(MAKE) --no-print-directory all $(LEVEL_TESTS)
	@top=$$(./aft --version | sed -n 's/^kernels: \([^ ]*\).*/\1/p'); \
	levels=$$(./aft --version | sed -n 's/^kernel levels: \([^(]*\).*/\1/p'); \
	pass=0; fail=0; \
	for l in $$levels; do \
	    if [ "$$l" = "$$top" ]; then echo "== level $$l: make test runs it"; continue; fi; \
	    if ! AFT_KERNELS=$$l ./aft --version > /dev/null 2>&1; then \
	        echo "== level $$l: skipped, this CPU does not run it"; continue; fi; \
	    for t in $(LEVEL_TESTS); do \
	        echo "== $$t at $$l"; \
	        if AFT_KERNELS=$$l AFT_BIN=$(CURDIR)/aft AFT_TESTDATA=$(CURDIR)/testdata ./$$t; then \
	            pass=$$((pass+1)); else fail=$$((fail+1)); echo "== $$t at $$l: FAILED"; fi; \
	    done; \
	done; \
	echo "test-levels: $$pass passed, $$fail failed"; \
	test $$fail -eq 0

QEMU_DIR := build/qemu
test-qemu: deps
	@sh third_party/install-deps.sh qemu-user
	@$(MAKE) --no-print-directory aft build/tests/lib_cpu/test_levels
	@rm -rf $(QEMU_DIR) && mkdir -p $(QEMU_DIR)
	@sh mk/qemu-check.sh $(QEMU_DIR) ./aft build/tests/lib_cpu/test_levels

# make check-aarch64: lib/ and cli/ compiled (not linked: this machine has
# no arm64 libraries) by Debian's aarch64 cross compiler with the normal
# build's warnings, as errors: the sources build with one level, base,
# where lib/cpu/arch.h has no x86 (docs/design.md, CPU levels)
CROSS_CC    := aarch64-linux-gnu-gcc
CROSS_FLAGS  = -O2 $(WARN) -Werror $(FPFLAGS) -std=c11 -D_GNU_SOURCE -fopenmp -Ilib -Icli $(PKG_CFLAGS)

.PHONY: check-aarch64
check-aarch64: deps
	@sh third_party/install-deps.sh gcc-aarch64-linux-gnu
	@rm -rf build/aarch64 && mkdir -p build/aarch64
	@for f in $(LIB_SRC) $(CLI_SRC); do \
	    $(CROSS_CC) $(CROSS_FLAGS) -c $$f -o build/aarch64/$$(echo $$f | tr / _).o || exit 1; \
	done
	@echo "check-aarch64: $(words $(LIB_SRC) $(CLI_SRC)) files of lib/ and cli/ compiled for aarch64, no warning"
