# mk/portable.mk - a portable x86-64 build, and the plain binary under valgrind.
#
#   make test-portable   copies the tree to build/portable/, builds it there
#                        with `make ARCH=` (no -march: the baseline x86-64
#                        instruction set, which valgrind can execute), then runs
#                        `valgrind ./aft info` and `valgrind ./aft run` on a
#                        small input: aft itself under memcheck, no wrapper
#
# Any memcheck error, or a definitely lost block, fails the target.

PORT_DIR := build/portable
PORT_VG  := valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
            --show-leak-kinds=definite --suppressions=fuzz/valgrind.supp
PORT_X   := testdata/torch/rish_local/x.npy

.PHONY: test-portable
test-portable: deps
	@sh third_party/install-deps.sh valgrind
	@rm -rf $(PORT_DIR) && mkdir -p $(PORT_DIR)
	@tar -cf - --exclude=./build --exclude=./.git --exclude=./aft --exclude=./lib/libaft.a . | tar -xf - -C $(PORT_DIR)
	@$(MAKE) --no-print-directory -C $(PORT_DIR) ARCH= aft
	cd $(PORT_DIR) && $(PORT_VG) ./aft info $(PORT_X)
	cd $(PORT_DIR) && $(PORT_VG) ./aft run --variant local --window 4 -o y.npy $(PORT_X)
	cd $(PORT_DIR) && $(PORT_VG) ./aft run --variant full --causal --threads 2 -o y2.npy $(PORT_X)
	cd $(PORT_DIR) && ./aft run --variant local --window 4 --impl reference -o yr.npy $(PORT_X) && \
	    ./aft compare --rtol 2e-5 --atol 2e-5 y.npy yr.npy
	@echo "test-portable: valgrind ./aft info and ./aft run passed on the ARCH= build"
