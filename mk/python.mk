# mk/python.mk - the Python package aft (python/, ctypes over lib/libaft.so).
#
#   make test-python          python/tests/test_*.py (unittest) with PYTHON on
#                             the tree's package and library; make test runs
#                             it after the C programs. The torch tests skip
#                             themselves when PYTHON lacks torch.
#   make test-python-install  pip installs ./python into a fresh venv (Debian's
#                             python3-venv, numpy from the system's site
#                             packages, offline: --no-build-isolation) and
#                             runs a layer from another directory
#                             (python/tests/install.sh)
#
# PYTHON is Debian's python3 (python3-numpy, and python3-torch where it is
# installed), not whatever python3 comes first on the PATH (a pyenv's may
# lack numpy).

PYTHON ?= /usr/bin/python3

.PHONY: test-python test-python-install
test-python: aft lib/libaft.so
	AFT_BIN=$(CURDIR)/aft AFT_TESTDATA=$(CURDIR)/testdata PYTHONPATH=$(CURDIR)/python \
	    $(PYTHON) -m unittest discover -s python/tests -t python/tests

test-python-install: lib/libaft.so
	sh python/tests/install.sh $(PYTHON)
