/* formula.h - the values testdata/make_npy_fixtures.py and
 * make_npz_fixtures.py store: element i (C-order flat index, i < 24) of
 * each dtype is a formula of i, recomputed here independently. */
#ifndef AFT_TEST_FORMULA_H
#define AFT_TEST_FORMULA_H

#include <stddef.h>

#include "aft.h"

/* n values of dtype dt into buf, native (little-endian) order */
void formula_fill(aft_dtype dt, void *buf, size_t n);
/* 0 when t holds the formula values, else 1 + the first differing index */
size_t formula_differs(const aft_tensor *t);
/* the dtype of numpy's code "f4", "b1", ... (AFT_DTYPE_COUNT if unknown) */
aft_dtype formula_dtype(const char *code);

#endif
