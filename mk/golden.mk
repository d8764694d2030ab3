# mk/golden.mk - this tree's aft against a reference aft built from a commit.
#
#   make golden                    every case of testdata/golden/cases.py, run
#                                  by ./aft and by the aft of GOLDEN_REF
#                                  (default HEAD): exit statuses, stdout,
#                                  stderr and output files must be identical
#   make golden GOLDEN_REF=COMMIT  against another commit-ish
#   make golden GOLDEN_JOBS=1      cases at a time (default 2)
#   make -j2 golden                the reference's build runs two jobs too
#
# For changes that must not move a number or a message (moving files,
# splitting functions): run it before and after. The reference is built from
# `git archive GOLDEN_REF` in build/golden/ref-SHA/ with this make's CC, OPT
# and ARCH when given, once per full sha (and flags); its build log is build.log there.
# The driver (testdata/golden/golden.py, Python's standard library only)
# writes seeded inputs, runs both binaries in scratch directories under
# build/golden/run/ with the same relative file names, and keeps a failing
# case's files in build/golden/diff/CASE/. It uses only the two binaries, the
# Makefile's `aft` target and testdata/, never lib/'s layout. Not part of
# `make test`: the two binaries of one tree always agree.

GOLDEN_REF  ?= HEAD
GOLDEN_JOBS ?= 2
GOLDEN_DIR  := build/golden
# what the reference is built with; a cached build made otherwise is rebuilt
# (ARCH only when it was given: otherwise each tree builds its own default)
GOLDEN_FLAGS = CC='$(CC)' OPT='$(OPT)' $(if $(filter fixed,$(LEVELS)),ARCH='$(ARCH)')

.PHONY: golden
golden: aft
	@sha=$$(git rev-parse --verify --quiet '$(GOLDEN_REF)^{commit}') || \
	    { echo "golden: '$(GOLDEN_REF)' names no commit"; exit 2; }; \
	ref=$(GOLDEN_DIR)/ref-$$sha; \
	if [ -x $$ref/aft ] && [ "$$(cat $$ref/.golden-flags 2>/dev/null)" = "$(GOLDEN_FLAGS)" ]; then \
	    echo "golden: reference aft of $(GOLDEN_REF) ($$sha) from $$ref"; \
	else \
	    echo "golden: building the reference aft of $(GOLDEN_REF) ($$sha) in $$ref"; \
	    rm -rf $$ref && mkdir -p $$ref && git archive $$sha | tar -x -C $$ref && \
	    $(MAKE) --no-print-directory -C $$ref $(GOLDEN_FLAGS) aft > $$ref/build.log 2>&1 || \
	        { tail -n 30 $$ref/build.log; echo "golden: the reference build failed (log: $$ref/build.log)"; exit 1; }; \
	    echo "$(GOLDEN_FLAGS)" > $$ref/.golden-flags; \
	fi; \
	python3 -B testdata/golden/golden.py --ref $$ref/aft --cur ./aft --work $(GOLDEN_DIR) --jobs $(GOLDEN_JOBS)
