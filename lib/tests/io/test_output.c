/* test_output.c - atomic outputs (lib/io/output.c): commit renames the
 * temporary into place, abort removes it and leaves an existing target
 * alone, a stale file with the temporary's name is never taken over, and a
 * signal that arrives the moment the temporary exists finds it registered
 * (its handler removes it).
 *
 * For that last test this program defines open() and mkstemp() itself:
 * linked statically, libaft's calls reach these, which call the C
 * library's (dlsym RTLD_NEXT) and then, when asked, raise SIGUSR1 right
 * after a temporary was created, before the library's next statement.
 * mkstemp is covered too so that going back to it would be caught. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "aft.h"
#include "files.h"

static volatile sig_atomic_t raise_after_create, handler_calls;

static void after_create(const char *path)
{
    if (raise_after_create && strstr(path, ".tmp.")) raise(SIGUSR1);
}

int open(const char *path, int flags, ...)
{
    static int (*real)(const char *, int, ...);
    if (!real) real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    mode_t mode = 0;
    if (flags & O_CREAT) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    int fd = real(path, flags, mode);
    if (fd >= 0 && (flags & O_CREAT)) after_create(path);
    return fd;
}

int mkstemp(char *tmpl)
{
    static int (*real)(char *);
    if (!real) real = (int (*)(char *))dlsym(RTLD_NEXT, "mkstemp");
    int fd = real(tmpl);
    if (fd >= 0) after_create(tmpl);
    return fd;
}

static void on_usr1(int sig)
{
    (void)sig;
    aft_out_abort_all_signal_safe();
    handler_calls++;
}

/* the names in the temporary directory that hold ".tmp." (and start with prefix, if given) */
static int temporaries_of(const char *prefix)
{
    DIR *d = opendir(files_tmpdir());
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, ".tmp.") && (!prefix || strncmp(e->d_name, prefix, strlen(prefix)) == 0)) n++;
    if (d) closedir(d);
    return n;
}

static int temporaries(void) { return temporaries_of(NULL); }

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

static void assert_file_is(const char *path, const char *text)
{
    char buf[256] = {0};
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    assert_int_equal(n, strlen(text));
    assert_string_equal(buf, text);
}

static int setup(void **state)
{
    (void)state;
    if (files_tmpdir_make("/tmp/aft-test-output-XXXXXX")) return -1;
    signal(SIGUSR1, on_usr1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    files_tmpdir_remove();
    return 0;
}

/* Runs first: this process has made no temporary yet, so the names it
 * would try first are known (NAME.tmp.PID.N from N = 0). Files already
 * there under them are left alone and the next name is taken. */
static void test_stale_temporaries_are_not_taken_over(void **state)
{
    (void)state;
    const char *out = files_tmp("stale.npy");
    char name[256];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s.tmp.%ld.%d", out, (long)getpid(), i);
        write_file(name, "stale\n");
    }
    aft_out o;
    aft_error err;
    assert_int_equal(aft_out_open(&o, out, &err), AFT_OK);
    snprintf(name, sizeof name, "%s.tmp.%ld.3", out, (long)getpid());
    assert_string_equal(o.tmp, name);
    assert_int_equal(fputs("new\n", o.fp) >= 0, 1);
    assert_int_equal(aft_out_commit(&o, &err), AFT_OK);
    assert_file_is(out, "new\n");
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s.tmp.%ld.%d", out, (long)getpid(), i);
        assert_file_is(name, "stale\n");
        unlink(name);
    }
    assert_int_equal(temporaries(), 0);
}

static void test_commit_replaces_abort_keeps(void **state)
{
    (void)state;
    const char *out = files_tmp("out.npy");
    write_file(out, "earlier\n");
    aft_out o;
    aft_error err;
    /* abort: the target as it was, no temporary */
    assert_int_equal(aft_out_open(&o, out, &err), AFT_OK);
    assert_non_null(o.tmp);
    assert_int_equal(access(o.tmp, F_OK), 0);
    assert_int_equal(temporaries(), 1);
    assert_int_equal(fputs("half", o.fp) >= 0, 1);
    aft_out_abort(&o);
    assert_file_is(out, "earlier\n");
    assert_int_equal(temporaries(), 0);
    /* commit: the new content under the target's name, no temporary, and
     * the mode a plain new file gets under the umask */
    mode_t um = umask(022);
    assert_int_equal(aft_out_open(&o, out, &err), AFT_OK);
    assert_int_equal(fputs("later\n", o.fp) >= 0, 1);
    assert_int_equal(aft_out_commit(&o, &err), AFT_OK);
    umask(um);
    assert_file_is(out, "later\n");
    assert_int_equal(temporaries(), 0);
    struct stat sb;
    assert_int_equal(stat(out, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0644);
}

/* A signal the moment the temporary exists: the handler must find it */
static void test_signal_right_after_create_removes_it(void **state)
{
    (void)state;
    const char *out = files_tmp("sig.npy");
    aft_out o;
    aft_error err;
    handler_calls = 0;
    raise_after_create = 1;
    aft_status st = aft_out_open(&o, out, &err);
    raise_after_create = 0;
    assert_int_equal(st, AFT_OK);
    assert_int_equal(handler_calls, 1);
    /* the handler removed it (with the name registered only after the file
     * was made, it was left behind) */
    assert_int_equal(access(o.tmp, F_OK), -1);
    assert_int_equal(temporaries_of("sig.npy"), 0);
    aft_out_abort(&o);
    assert_int_equal(temporaries_of("sig.npy"), 0);
    assert_int_equal(access(out, F_OK), -1);
}

static void test_missing_directory_is_an_error(void **state)
{
    (void)state;
    aft_out o;
    aft_error err;
    assert_int_equal(aft_out_open(&o, files_tmp("no-such-dir/out.npy"), &err), AFT_ERR_IO);
    assert_non_null(strstr(err.msg, "cannot create"));
    assert_int_equal(temporaries(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stale_temporaries_are_not_taken_over),
        cmocka_unit_test(test_commit_replaces_abort_keeps),
        cmocka_unit_test(test_signal_right_after_create_removes_it),
        cmocka_unit_test(test_missing_directory_is_an_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
