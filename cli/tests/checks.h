/* checks.h - what the CLI tests assert of a run or its files, with cmocka
 * (harness.h runs aft; these fail the test, printing what went wrong). */
#ifndef AFT_CLI_TEST_CHECKS_H
#define AFT_CLI_TEST_CHECKS_H

#include <stddef.h>

#include "harness.h"

/* a successful run of args (stdin: in_len bytes of in, or none): exit 0,
 * nothing on stderr; *r holds it (harness_result_free it) */
void check_ok_in(harness_result *r, const char *const *args, const void *in, size_t in_len);
void check_ok(harness_result *r, const char *const *args);
/* a run that must exit `code` with exactly `want` on stderr (and, when it
 * fails, nothing on stdout) */
void check_stderr(const char *const *args, int code, const char *want);
/* files a and b hold the same bytes */
void check_same_file(const char *a, const char *b);

#endif
