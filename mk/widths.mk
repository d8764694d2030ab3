# mk/widths.mk - the kernel tests at vector widths other than this machine's.
#
#   make test-widths   builds lib/ and the tests of the forward kernels
#                      (lib_ops/: the rules, the dispatch, full, the band,
#                      simple, grids, the running sums), of the projections
#                      (lib_nn/test_linear), of the layer around them
#                      (lib_test_layer, lib_test_layer_chunks), of the
#                      exponential (lib_test_numerics) and of the streaming
#                      stores (lib_test_util) for x86-64-v2 (SSE4.2: vectors
#                      of 4 floats) and x86-64-v3 (AVX2: 8 floats) into
#                      build/width-LEVEL/, and runs those this CPU can
#                      execute
#
# The normal build is -march=native, and the kernels' vector width and
# register tiles follow from the CPU they are built for (aft_vf in
# lib/numerics.h: 16 floats with AVX-512, 8 with AVX, 4 otherwise; the band
# kernel's rows per group, the fused product's tile), so `make test` covers
# one width: on an AVX-512 machine the AVX2 code is never built, and the
# other way round. This builds the other widths' code from the same sources
# and runs the same tests on it. Uses san_build from mk/sanitize.mk (mk/*.mk
# are included in name order).

WIDTH_LEVELS := x86-64-v2 x86-64-v3
WIDTH_PROGS  := $(addprefix lib_ops/,test_spec test_op test_full test_local_conv test_simple test_grid test_sums) \
                lib_nn/test_linear lib_test_layer lib_test_layer_chunks lib_test_numerics lib_test_util
CPU_LEVEL    := build/cpu-level
# lib_ops/test_op also holds the backward's tables (every variant through
# aft_op_backward); the backward kernels' tests do not run at other widths,
# so there it runs its forward tests only (each program's environment:
# WIDTH_ENV_PROGRAM)
WIDTH_ENV_lib_ops/test_op := TEST_OP_FILTER='test_op_*'

$(CPU_LEVEL): mk/cpu-level.c
	@mkdir -p $(@D)
	$(CC) -O2 $(WARN) -o $@ $<

# width_level(LEVEL): the build of LEVEL and the rule running one of its
# tests; a run on a CPU that cannot execute LEVEL records "skipped"
define width_level
$(eval $(call san_build,build/width-$(1),-O3 -march=$(1) -g))
build/width-$(1)/runs/%.result: build/width-$(1)/tests/% $(CPU_LEVEL)
	@mkdir -p $$(@D)
	@if ! ./$(CPU_LEVEL) $(1); then \
	    echo "this CPU cannot run $(1) code" > $$(@:.result=.log); echo "skipped" > $$@; \
	else \
	    s=$$$$(date +%s); \
	    if env $$(WIDTH_ENV_$$*) AFT_TESTDATA=$(CURDIR)/testdata ./$$< > $$(@:.result=.log) 2>&1; then r=passed; else r=FAILED; fi; \
	    echo "$$$$r $$$$(( $$$$(date +%s) - s )) s" > $$@; \
	fi
endef
$(foreach l,$(WIDTH_LEVELS),$(eval $(call width_level,$(l))))

WIDTH_TESTS   = $(foreach l,$(WIDTH_LEVELS),$(WIDTH_PROGS:%=build/width-$(l)/tests/%))
WIDTH_RESULTS = $(patsubst build/width-%,build/width-%.result,$(subst /tests/,/runs/,$(WIDTH_TESTS)))

.PHONY: test-widths
test-widths: deps
	@$(MAKE) --no-print-directory -j$(SAN_JOBS) $(CPU_LEVEL) $(WIDTH_TESTS)
	@rm -rf $(foreach l,$(WIDTH_LEVELS),build/width-$(l)/runs)
	@$(MAKE) --no-print-directory -j$(SAN_JOBS) $(WIDTH_RESULTS)
	$(call san_report,$(WIDTH_RESULTS),test-widths)
