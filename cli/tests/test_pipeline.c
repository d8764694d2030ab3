/* test_pipeline.c - aft in shell pipelines under `set -o pipefail`: stdout
 * feeds stdin, and the verdicts travel as exit statuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "aft.h"
#include "harness.h"

static char *x_path, *ref_path, *other_path, *big_path;

static int setup(void **state)
{
    harness_setup(state);
    x_path = harness_tmp("x.npy");
    ref_path = harness_tmp("ref.npy");
    other_path = harness_tmp("other.npy");
    float x[2 * 7 * 6];
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (float)((i * 37) % 11) / 5.0f - 1.0f;
    aft_tensor t = {.dtype = AFT_F32, .ndim = 3, .shape = {2, 7, 6}, .nelem = 84, .nbytes = sizeof x, .data = x};
    aft_error err;
    if (aft_npy_write(x_path, &t, &err) != AFT_OK) return -1;
    /* an input whose output (4 MiB) cannot fit in a pipe's buffer */
    size_t nb = 16384 * 64;
    float *big = calloc(nb, sizeof(float));
    if (!big) return -1;
    aft_tensor tb = {.dtype = AFT_F32, .ndim = 2, .shape = {16384, 64}, .nelem = nb, .nbytes = nb * 4, .data = big};
    big_path = harness_tmp("big.npy");
    int bad = aft_npy_write(big_path, &tb, &err) != AFT_OK;
    free(big);
    if (bad) return -1;
    const char *a[] = {"run", "--variant", "local", "--window", "3", x_path, "-o", ref_path, NULL};
    const char *b[] = {"run", "--variant", "local", "--window", "3", "--seed", "7", x_path, "-o", other_path, NULL};
    harness_result r;
    if (harness_run(&r, a, NULL, 0) != 0 || r.exit_code != 0) return -1;
    harness_result_free(&r);
    if (harness_run(&r, b, NULL, 0) != 0 || r.exit_code != 0) return -1;
    harness_result_free(&r);
    return 0;
}

static int teardown(void **state)
{
    harness_teardown(state);
    free(x_path); free(ref_path); free(other_path); free(big_path);
    return 0;
}

/* exit status of `bash -c "set -o pipefail; SCRIPT"`, AFT set to the binary */
static int pipeline(const char *script)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "AFT='%s' bash -c 'set -o pipefail; %s' >/dev/null 2>&1", harness_aft_bin(), script);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_run_into_compare(void **state)
{
    (void)state;
    char s[4096];
    /* the same layer through a pipe: close */
    snprintf(s, sizeof s, "\"$AFT\" run --variant local --window 3 %s | \"$AFT\" compare - %s", x_path, ref_path);
    assert_int_equal(pipeline(s), 0);
    /* stdin in, stdout out, twice over */
    snprintf(s, sizeof s, "cat %s | \"$AFT\" run --variant local --window 3 - | \"$AFT\" compare - %s", x_path,
             ref_path);
    assert_int_equal(pipeline(s), 0);
    /* a different seed: not close, and the pipeline says so */
    snprintf(s, sizeof s, "\"$AFT\" run --variant local --window 3 %s | \"$AFT\" compare - %s", x_path, other_path);
    assert_int_equal(pipeline(s), 1);
    /* the producer fails: pipefail reports it even though compare reads nothing */
    snprintf(s, sizeof s, "\"$AFT\" run --variant local --window 3 %s/missing.npy | \"$AFT\" compare - %s",
             harness_dir(), ref_path);
    assert_int_not_equal(pipeline(s), 0);
    /* the consumer stops early: aft reports the closed pipe with status 1 */
    snprintf(s, sizeof s, "\"$AFT\" run --variant simple %s | head -c 10", big_path);
    assert_int_equal(pipeline(s), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_run_into_compare)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
