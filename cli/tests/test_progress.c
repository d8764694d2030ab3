/* test_progress.c - progress lines appear only on a terminal: a run longer
 * than a second with stderr on a pipe must leave stderr empty. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "aft.h"
#include "harness.h"

static void test_no_progress_in_pipes(void **state)
{
    (void)state;
    char *dir = harness_mkdtemp();
    assert_non_null(dir);
    char *x = harness_path(dir, "x.npy"), *y = harness_path(dir, "y.npy");
    /* T = 1500, D = 64: the float64 reference of full takes over a second */
    size_t T = 1500, D = 64;
    float *data = malloc(T * D * sizeof(float));
    assert_non_null(data);
    for (size_t i = 0; i < T * D; i++) data[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    aft_tensor t = {.dtype = AFT_F32, .ndim = 2, .shape = {T, D}, .nelem = T * D, .nbytes = T * D * 4, .data = data};
    aft_error err;
    assert_int_equal(aft_npy_write(x, &t, &err), AFT_OK);
    harness_result r;
    const char *args[] = {"run", "--variant", "full", "--impl", "reference", x, "-o", y, NULL};
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.err_len, 0);   /* nothing on a pipe, not even a carriage return */
    harness_result_free(&r);
    free(data);
    harness_rmtree(dir);
    free(x); free(y); free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_no_progress_in_pipes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
