/* test_progress.c - progress lines appear only on a terminal: a run longer
 * than a second with stderr on a pipe or a file must leave it empty; with
 * stderr on a terminal (a pseudo-terminal here) it shows one, with the
 * fraction done and an estimate of the time left, drawn over itself and
 * erased at the end, unless --quiet (or -q) comes before the command's
 * name or among its options. */
#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "aft.h"
#include "harness.h"

/* an input for a run of over a second, in a new directory: its path and
 * the output's, malloc'd (free dir with harness_rmtree) */
static void long_input(char **dir, char **x, char **y)
{
    *dir = harness_mkdtemp();
    assert_non_null(*dir);
    *x = harness_path(*dir, "x.npy");
    *y = harness_path(*dir, "y.npy");
    /* T = 1500, D = 64: the float64 reference of full takes over a second;
     * AFT_TEST_QUICK (make test-valgrind, where aft runs some 50 times
     * slower) T = 300, still seconds there */
    size_t T = harness_quick() ? 300 : 1500, D = 64;
    float *data = malloc(T * D * sizeof(float));
    assert_non_null(data);
    for (size_t i = 0; i < T * D; i++) data[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    aft_tensor t = {.dtype = AFT_F32, .ndim = 2, .shape = {T, D}, .nelem = T * D, .nbytes = T * D * 4, .data = data};
    aft_error err;
    assert_int_equal(aft_npy_write(*x, &t, &err), AFT_OK);
    free(data);
}

static void test_no_progress_in_pipes(void **state)
{
    (void)state;
    char *dir, *x, *y;
    long_input(&dir, &x, &y);
    harness_result r;
    const char *args[] = {"run", "--variant", "full", "--impl", "reference", x, "-o", y, NULL};
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.err_len, 0);   /* nothing on a pipe, not even a carriage return */
    harness_result_free(&r);
    harness_rmtree(dir);
    free(x); free(y); free(dir);
}

/* Runs aft with args (args[0] is its first argument) and its stderr on a
 * pseudo-terminal (stdin, stdout: /dev/null); returns how many bytes it
 * wrote there (the first cap - 1 of them into buf, NUL-terminated, when buf
 * is not NULL), or -1 when no pseudo-terminal can be had. The run must
 * exit 0. */
static long on_terminal_text(const char *const *args, char *buf_out, size_t cap)
{
    int master;
    pid_t pid = forkpty(&master, NULL, NULL, NULL);
    if (pid < 0) return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        const char *argv[32] = {harness_aft_bin()};
        for (size_t i = 0; args[i] && i < 30; i++) argv[i + 1] = args[i];
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    long got = 0;
    char buf[4096];
    for (;;) {
        ssize_t n = read(master, buf, sizeof buf);
        if (n > 0 && buf_out && (size_t)got < cap - 1) {
            size_t room = cap - 1 - (size_t)got;
            memcpy(buf_out + got, buf, (size_t)n < room ? (size_t)n : room);
        }
        if (n > 0) got += n;
        else if (n < 0 && errno == EINTR) continue;
        else break;   /* EIO: the child closed its side */
    }
    close(master);
    if (buf_out) buf_out[(size_t)got < cap - 1 ? (size_t)got : cap - 1] = 0;
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return got;
}

static long on_terminal(const char *const *args)
{
    return on_terminal_text(args, NULL, 0);
}

/* a run of about two seconds and more on a terminal: the line counts the
 * rows done and says how long is left ("aft run: full T=1500 B=1, run 1
 * of 2: 37% (1.3 s, about 2.2 s left)"), each time over the last, and is
 * erased at the end */
static void test_fraction_and_time_left(void **state)
{
    (void)state;
    if (!harness_aft_is_binary()) skip();
    char *dir, *x, *y;
    long_input(&dir, &x, &y);
    static char text[1 << 16];
    long n = on_terminal_text((const char *const[]){"run", "--variant", "full", "--impl", "reference", "--repeat",
                                                   "2", x, "-o", y, NULL},
                              text, sizeof text);
    harness_rmtree(dir);
    free(x); free(y); free(dir);
    if (n < 0) skip();
    assert_true(n > 0 && (size_t)n < sizeof text);
    const char *line = strstr(text, "aft run: full T=1500 B=1, run ");
    if (!line) fail_msg("no progress line in '%s'", text);
    /* a fraction, then the time left */
    const char *pct = strchr(line, '%');
    assert_non_null(pct);
    assert_true(pct[-1] >= '0' && pct[-1] <= '9');
    if (!strstr(text, " left)")) fail_msg("no estimate of the time left in '%s'", text);
    assert_null(strchr(text, '\n'));   /* drawn over itself, never a line of its own */
    const char *end = "\r\033[K";
    assert_true((size_t)n >= strlen(end));
    assert_string_equal(text + n - strlen(end), end);   /* erased at the end */
}

/* stderr on a file: nothing written to it, not even a carriage return */
static void test_no_progress_in_files(void **state)
{
    (void)state;
    char *dir, *x, *y;
    long_input(&dir, &x, &y);
    char *log = harness_path(dir, "stderr.txt");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR), f = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (null < 0 || f < 0) _exit(126);
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        dup2(f, STDERR_FILENO);
        const char *argv[] = {harness_aft_bin(), "run", "--variant", "full", "--impl", "reference", x, "-o", y, NULL};
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char *got;
    size_t len;
    assert_int_equal(harness_read_file(log, &got, &len), 0);
    assert_int_equal(len, 0);
    free(got);
    free(log);
    harness_rmtree(dir);
    free(x); free(y); free(dir);
}

static void test_quiet_anywhere(void **state)
{
    (void)state;
    if (!harness_aft_is_binary()) skip();   /* a wrapper's own terminal output would count */
    char *dir, *x, *y;
    long_input(&dir, &x, &y);
    /* two runs of the reference: over a second and a half, with room */
    long shown = on_terminal((const char *const[]){"run", "--variant", "full", "--impl", "reference", "--repeat", "2",
                                                   x, "-o", y, NULL});
    if (shown < 0) {
        harness_rmtree(dir);
        free(x); free(y); free(dir);
        skip();
    }
    assert_true(shown > 0);   /* the progress line, then its erasure */
    const char *const quiet[][12] = {
        {"--quiet", "run", "--variant", "full", "--impl", "reference", "--repeat", "2", x, "-o", y, NULL},
        {"-q", "run", "--variant", "full", "--impl", "reference", "--repeat", "2", x, "-o", y, NULL},
        {"run", "--variant", "full", "--quiet", "--impl", "reference", "--repeat", "2", x, "-o", y, NULL},
        {"run", "--variant", "full", "--impl", "reference", "--repeat", "2", x, "-o", y, "-q", NULL},
    };
    for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++) {
        long n = on_terminal(quiet[i]);
        if (n != 0) fail_msg("case %zu: %ld bytes on the terminal with --quiet", i, n);
    }
    harness_rmtree(dir);
    free(x); free(y); free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_progress_in_pipes),
        cmocka_unit_test(test_no_progress_in_files),
        cmocka_unit_test(test_fraction_and_time_left),
        cmocka_unit_test(test_quiet_anywhere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
