# mk/fuzz.mk - libFuzzer targets for the file readers (see fuzz/README.md).
#
#   make fuzz                  build the targets, run each for FUZZ_SECONDS
#                              (FUZZ_JOBS at a time, default one per CPU)
#   make fuzz FUZZ_SECONDS=10  the same, shorter
#   make fuzz-regress          run each target once over its seeds and the
#                              malformed corpus, no mutation (seconds)
#   make fuzz-merge            keep what `make fuzz` found: add the inputs of
#                              build/fuzz/corpus/TARGET/ that reach code the
#                              seeds do not to testdata/fuzz-seeds/TARGET/found/
#   make fuzz-build            build only: build/fuzz/fuzz_{npy,npz,safetensors,state,weights,model}
#   make fuzz-state-seeds      write fuzz_state's seeds (states of its layers)
#
# The targets are built with clang -fsanitize=fuzzer,address,undefined against
# lib/*.c compiled by clang into build/fuzz/ (never the gcc-built
# lib/libaft.a). lib/ is compiled without -fopenmp: its `#pragma omp` lines
# are ignored, and fuzz/omp_stub/ stands in for omp.h and the few runtime
# functions lib/system.c calls, so no OpenMP runtime is needed.
#
# Each run starts from testdata/fuzz-seeds/TARGET/ and testdata/malformed/
# (read only) and keeps what it finds in build/fuzz/corpus/TARGET/; a crash
# leaves its input in build/fuzz/artifacts/TARGET/ and fails the make. Add
# such an input to testdata/malformed/ as a regression case (see
# testdata/malformed/make_malformed.py).

FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_DIR     := build/fuzz
FUZZ_TARGETS := fuzz_npy fuzz_npz fuzz_safetensors fuzz_state fuzz_weights fuzz_model

# -O1 -g: exact stacks in reports at a good execution speed. -Werror: the
# one build by clang and without OpenMP (a variable only a pragma reads is
# unused here) keeps the project's zero warnings, and CI builds it
FUZZ_SAN    := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS  = -O1 -g $(FUZZ_SAN) $(WARN) -Werror -Wno-psabi -std=c11 -D_GNU_SOURCE \
               -Ifuzz/omp_stub -Ilib $(PKG_CFLAGS)
FUZZ_LIB_OBJ = $(call lib_objs,$(FUZZ_DIR))

# per-input time limit and memory ceiling: a slow or greedy input is a finding
FUZZ_OPTS = -timeout=10 -rss_limit_mb=2048 -print_final_stats=1

.PHONY: fuzz fuzz-build fuzz-regress fuzz-merge fuzz-deps
fuzz-deps:
	@sh third_party/install-deps.sh clang libclang-rt-14-dev

# lib/ is instrumented for coverage (fuzzer-no-link) so libFuzzer sees its branches
$(FUZZ_DIR)/lib/%.o: lib/%.c $(LIB_HDR) fuzz/omp_stub/omp.h
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(LEVEL_DEFS) -fsanitize=fuzzer-no-link -c $< -o $@

# the kernels once per level, as in the normal build (kern_level)
$(foreach l,$(LEVELS),$(eval $(call kern_level,$(FUZZ_DIR),$$(FUZZ_CC) $$(FUZZ_CFLAGS) $$(LEVEL_DEFS) \
    -fsanitize=fuzzer-no-link,$(l))))

$(FUZZ_DIR)/libaft.a: $(FUZZ_LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

$(FUZZ_DIR)/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz_check.h fuzz/state_layer.h fuzz/omp_stub.c $(FUZZ_DIR)/libaft.a lib/aft.h
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -Ifuzz -o $@ $< fuzz/omp_stub.c $(FUZZ_DIR)/libaft.a \
	    $(PKG_LIBS) -lm

fuzz-build: deps fuzz-deps
	@$(MAKE) --no-print-directory $(FUZZ_TARGETS:%=$(FUZZ_DIR)/%)

# the seed directories of target $(1): its own seeds, then the malformed corpus
fuzz_seeds = testdata/fuzz-seeds/$(1) testdata/malformed

# libFuzzer's -merge=1 copies into the first directory only the inputs of the
# others that add coverage to what it already holds
fuzz-merge: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p testdata/fuzz-seeds/$$t/found $(FUZZ_DIR)/corpus/$$t; \
	    $(FUZZ_DIR)/$$t -merge=1 testdata/fuzz-seeds/$$t/found $(FUZZ_DIR)/corpus/$$t > $(FUZZ_DIR)/$$t.merge.log 2>&1 \
	        || { tail -n 30 $(FUZZ_DIR)/$$t.merge.log; exit 1; }; \
	    echo "$$t: $$(grep -E 'MERGE-OUTER: [0-9]+ new files' $(FUZZ_DIR)/$$t.merge.log)"; \
	done

fuzz-regress: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	    echo "== $$t: seeds and malformed corpus, once each"; \
	    $(FUZZ_DIR)/$$t $(FUZZ_OPTS) -runs=0 $(call fuzz_seeds,$$t) > $(FUZZ_DIR)/$$t.regress.log 2>&1 \
	        || { tail -n 60 $(FUZZ_DIR)/$$t.regress.log; echo "fuzz-regress: $$t failed; log: $(FUZZ_DIR)/$$t.regress.log"; exit 1; }; \
	    grep -E 'INITED|DONE' $(FUZZ_DIR)/$$t.regress.log | tail -n 1; \
	done

# One run per target, FUZZ_JOBS at a time (default: one per CPU); each writes
# its log to build/fuzz/TARGET.log and "passed" or "FAILED" to
# build/fuzz/runs/TARGET.result.
FUZZ_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_RESULTS = $(FUZZ_TARGETS:%=$(FUZZ_DIR)/runs/%.result)

$(FUZZ_DIR)/runs/%.result: $(FUZZ_DIR)/% fuzz/%.dict
	@mkdir -p $(@D) $(FUZZ_DIR)/corpus/$* $(FUZZ_DIR)/artifacts/$*
	@if ./$< $(FUZZ_OPTS) -max_total_time=$(FUZZ_SECONDS) -dict=fuzz/$*.dict \
	    -artifact_prefix=$(FUZZ_DIR)/artifacts/$*/ \
	    $(FUZZ_DIR)/corpus/$* $(call fuzz_seeds,$*) > $(FUZZ_DIR)/$*.log 2>&1; \
	then echo passed > $@; else echo FAILED > $@; fi

fuzz: fuzz-build
	@rm -rf $(FUZZ_DIR)/runs
	@echo "fuzzing $(FUZZ_TARGETS), $(FUZZ_SECONDS) s each, $(FUZZ_JOBS) at a time"
	@$(MAKE) --no-print-directory -j$(FUZZ_JOBS) $(FUZZ_RESULTS)
	@fail=0; for t in $(FUZZ_TARGETS); do \
	    echo "== $$t: $$(cat $(FUZZ_DIR)/runs/$$t.result) (log: $(FUZZ_DIR)/$$t.log)"; \
	    grep -E 'DONE|stat::number_of_executed_units|stat::peak_rss_mb' $(FUZZ_DIR)/$$t.log; \
	    if [ "$$(cat $(FUZZ_DIR)/runs/$$t.result)" != passed ]; then \
	        fail=$$((fail+1)); tail -n 60 $(FUZZ_DIR)/$$t.log; \
	        echo "fuzz: $$t found a problem; inputs in $(FUZZ_DIR)/artifacts/$$t/, newest first:"; \
	        ls -t $(FUZZ_DIR)/artifacts/$$t/; \
	    fi; \
	done; \
	test $$fail -eq 0

# the seeds of fuzz_state: states of its layers (fuzz/state_layer.h), written
# by the normal build of the library
.PHONY: fuzz-state-seeds
fuzz-state-seeds: lib/libaft.a
	@mkdir -p $(FUZZ_DIR) testdata/fuzz-seeds/fuzz_state
	$(CC) $(ALL_CFLAGS) -Ifuzz -o $(FUZZ_DIR)/make_state_seeds fuzz/make_state_seeds.c lib/libaft.a $(LDLIBS_ALL)
	$(FUZZ_DIR)/make_state_seeds testdata/fuzz-seeds/fuzz_state
