/*
 * harness.h - run the aft command from a test and look at what it did.
 *
 * The binary is $AFT_BIN (default ./aft); test data lives in $AFT_TESTDATA
 * (default ./testdata). The Makefile sets both for `make test`.
 *
 * A run forks, connects the child's stdin, stdout and stderr to pipes and
 * execs the binary directly (no shell, so arguments need no quoting). It
 * waits at most $AFT_TEST_TIMEOUT seconds (default 60); a child still
 * running then is killed with SIGKILL and the result says timed_out.
 *
 * Typical use inside a cmocka test:
 *
 *     harness_result r;
 *     assert_int_equal(HARNESS_RUN(&r, "info", "--json", path), 0);
 *     assert_int_equal(r.exit_code, 0);
 *     assert_non_null(strstr(r.out, "\"format\":\"npy\""));
 *     harness_result_free(&r);
 *
 * Every function here that can fail prints why on stderr ("harness: ...")
 * and returns -1 or NULL, so a test only has to assert on the return value.
 */
#ifndef AFT_CLI_TEST_HARNESS_H
#define AFT_CLI_TEST_HARNESS_H

#include <stddef.h>

#include "aft.h"

typedef struct {
    int exit_code;    /* the child's exit status, or -1 if a signal ended it;
                       * 127 (and "harness: cannot exec ..." in err) if the
                       * binary could not be executed */
    int term_signal;  /* the signal that ended the child, else 0 */
    int timed_out;    /* 1 if the harness killed the child at the timeout */
    char *out;        /* everything written to stdout, NUL-terminated */
    size_t out_len;   /* bytes in out, not counting the terminator */
    char *err;        /* everything written to stderr, NUL-terminated */
    size_t err_len;
} harness_result;

/* Runs the aft binary with the given arguments (args[0] is the first
 * argument after the program name, e.g. "info"; the list ends with NULL).
 * in_len bytes from in are written to the child's stdin, which is then
 * closed; in may be NULL (stdin is then empty). Fills *r; returns 0 when the
 * child ran (whatever its exit status), -1 if it could not be started or
 * watched. Free the result with harness_result_free either way. */
int harness_run(harness_result *r, const char *const *args,
                const void *in, size_t in_len);

/* harness_run with the arguments listed inline and empty stdin. */
#define HARNESS_RUN(r, ...) \
    harness_run((r), (const char *const[]){__VA_ARGS__, NULL}, NULL, 0)
/* the same with stdin bytes */
#define HARNESS_RUN_STDIN(r, in, in_len, ...) \
    harness_run((r), (const char *const[]){__VA_ARGS__, NULL}, (in), (in_len))

/* Frees out and err and zeroes *r (safe on a zeroed or freed result). */
void harness_result_free(harness_result *r);

/* $AFT_BIN or "./aft"; $AFT_TESTDATA or "./testdata" */
const char *harness_aft_bin(void);
const char *harness_testdata(void);
/* 1 if $AFT_BIN is an ELF executable itself, 0 if it is a wrapper (make
 * test-valgrind's script) or unreadable: measurements of the child's memory
 * then describe the wrapper, not aft */
int harness_aft_is_binary(void);
/* 1 when $AFT_TEST_QUICK is set and not "0" (make test-valgrind sets it,
 * where every aft run costs a second or more): a test then runs fewer
 * cases of the same paths */
int harness_quick(void);

/* Number of '\n' in s (so a message of one complete line counts 1). */
size_t harness_count_lines(const char *s);

/* A new empty directory under $TMPDIR (or /tmp), malloc'd path. */
char *harness_mkdtemp(void);

/* The temporary directory of a group of tests, as cmocka's group fixtures:
 *
 *     return cmocka_run_group_tests(tests, harness_setup, harness_teardown);
 *
 * harness_setup makes it (harness_mkdtemp); harness_teardown removes it and
 * everything in it. Both return 0 or -1. A group that writes fixtures of
 * its own calls them from its own setup and teardown. In between,
 * harness_dir() is its path and harness_tmp(name) a malloc'd path in it. */
int harness_setup(void **state);
int harness_teardown(void **state);
const char *harness_dir(void);
char *harness_tmp(const char *name);

/* A malloc'd string as printf would format it; NULL if out of memory. */
char *harness_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* 1 if path names something that exists (stat succeeds), else 0. */
int harness_exists(const char *path);

/* a tensor header over caller-owned data (C order; nelem and nbytes from the
 * shape), for writing fixtures with aft_npy_write / aft_st_write */
aft_tensor harness_tensor(aft_dtype dt, const void *data, size_t ndim, const size_t *shape);
/* dir + "/" + name, malloc'd. */
char *harness_path(const char *dir, const char *name);
/* Creates or truncates path and writes len bytes to it. 0 or -1. */
int harness_write_file(const char *path, const void *data, size_t len);
/* Reads a whole file into a malloc'd, NUL-terminated buffer (*len bytes,
 * not counting the terminator; len may be NULL). 0 or -1. */
int harness_read_file(const char *path, char **data, size_t *len);
/* Removes dir and everything below it (does not follow symlinks). 0 or -1. */
int harness_rmtree(const char *dir);

#endif
