/* checks.c - what the CLI tests assert of a run or its files (checks.h) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"

void check_ok_in(harness_result *r, const char *const *args, const void *in, size_t in_len)
{
    assert_int_equal(harness_run(r, args, in, in_len), 0);
    if (r->exit_code != 0 || r->err_len != 0) {
        fprintf(stderr, "exit %d, stderr: %s\n  command: aft", r->exit_code, r->err);
        for (size_t i = 0; args[i]; i++) fprintf(stderr, " %s", args[i]);
        fputc('\n', stderr);
    }
    assert_int_equal(r->exit_code, 0);
    assert_int_equal(r->err_len, 0);
}

void check_ok(harness_result *r, const char *const *args)
{
    check_ok_in(r, args, NULL, 0);
}

void check_stderr(const char *const *args, int code, const char *want)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != code || strcmp(r.err, want) != 0) {
        fprintf(stderr, "aft %s ...: exit %d (want %d), stderr:\n%s  want:\n%s", args[0], r.exit_code, code, r.err,
                want);
        fail();
    }
    if (code) assert_int_equal(r.out_len, 0);
    harness_result_free(&r);
}

void check_same_file(const char *a, const char *b)
{
    char *x, *y;
    size_t nx, ny;
    assert_int_equal(harness_read_file(a, &x, &nx), 0);
    assert_int_equal(harness_read_file(b, &y, &ny), 0);
    if (nx != ny || memcmp(x, y, nx) != 0) fail_msg("%s differs from %s", a, b);
    free(x);
    free(y);
}
