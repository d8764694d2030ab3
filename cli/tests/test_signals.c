/* test_signals.c - an interrupted aft leaves an existing output untouched
 * and no temporary behind: Ctrl-C (SIGINT) and SIGTERM while computing, and
 * while a temporary output exists (the run blocks opening its --timing FIFO
 * after the output's temporary was created). */

#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "aft.h"
#include "harness.h"

static const char precious[] = "an earlier result that must survive\n";

static char *x_path, *out_path;

static int setup(void **state)
{
    if (harness_setup(state) != 0) return -1;
    x_path = harness_tmp("x.npy");
    out_path = harness_tmp("out.npy");
    /* T = 2500, D = 32: the float64 reference of full takes seconds */
    size_t T = 2500, D = 32;
    float *x = malloc(T * D * sizeof(float));
    if (!x) return -1;
    for (size_t i = 0; i < T * D; i++) x[i] = (float)((i * 2654435761u) % 997) / 498.5f - 1.0f;
    aft_tensor t = {.dtype = AFT_F32, .ndim = 2, .shape = {T, D}, .nelem = T * D, .nbytes = T * D * 4, .data = x};
    aft_error err;
    int rc = aft_npy_write(x_path, &t, &err) == AFT_OK ? 0 : -1;
    free(x);
    return rc;
}

static int teardown(void **state)
{
    harness_teardown(state);
    free(x_path); free(out_path);
    return 0;
}

/* starts aft as a shell starts a foreground command: SIGINT and SIGTERM at
 * their defaults, whatever this test inherited (a test run from a script in
 * the background inherits SIGINT ignored), unless `ignore_int` asks for
 * SIGINT ignored, as a shell starts `aft ... &` */
static pid_t start_with(const char *const *args, int ignore_int)
{
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGINT, ignore_int ? SIG_IGN : SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        const char *argv[32];
        int n = 0;
        argv[n++] = harness_aft_bin();
        for (; args[n - 1] && n < 31; n++) argv[n] = args[n - 1];
        argv[n] = NULL;
        int devnull = open("/dev/null", 0);
        dup2(devnull, STDIN_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static pid_t start(const char *const *args)
{
    return start_with(args, 0);
}

/* names in the temporary directory other than the input, the output and the FIFO */
static int stray_files(void)
{
    DIR *d = opendir(harness_dir());
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void check_untouched(void)
{
    char *data;
    size_t len;
    assert_int_equal(harness_read_file(out_path, &data, &len), 0);
    assert_int_equal(len, sizeof precious - 1);
    assert_memory_equal(data, precious, len);
    free(data);
    assert_int_equal(stray_files(), 0);
}

static void interrupt_computation(int sig)
{
    assert_int_equal(harness_write_file(out_path, precious, sizeof precious - 1), 0);
    const char *args[] = {"run", "--variant", "full", "--impl", "reference", "--threads", "1", x_path,
                          "-o", out_path, NULL};
    pid_t pid = start(args);
    assert_true(pid > 0);
    sleep_ms(400);
    kill(pid, sig);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == sig);
    check_untouched();
}

static void test_sigint_while_computing(void **state)
{
    (void)state;
    interrupt_computation(SIGINT);
}

static void test_sigterm_while_computing(void **state)
{
    (void)state;
    interrupt_computation(SIGTERM);
}

/* starts `aft run ... --timing FIFO` over an earlier output and returns once
 * the run has its output's temporary: opening the FIFO for writing blocks
 * with no reader, and by then the temporary exists */
static pid_t start_blocked_on_fifo(const char *fifo, int ignore_int)
{
    assert_int_equal(harness_write_file(out_path, precious, sizeof precious - 1), 0);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *args[] = {"run", "--variant", "simple", x_path, "-o", out_path, "--timing", fifo, NULL};
    pid_t pid = start_with(args, ignore_int);
    assert_true(pid > 0);
    int seen = 0;
    for (int i = 0; i < 400 && !seen; i++) {
        seen = stray_files() > 0;
        if (!seen) sleep_ms(25);
    }
    assert_true(seen);
    return pid;
}

static void test_sigint_with_a_temporary_open(void **state)
{
    (void)state;
    char *fifo = harness_tmp("timing.fifo");
    pid_t pid = start_blocked_on_fifo(fifo, 0);
    kill(pid, SIGINT);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT);
    check_untouched();
    remove(fifo);
    free(fifo);
}

/* started with SIGINT ignored, aft keeps ignoring it: the run goes on to
 * write its output and exits 0 */
static void test_ignored_sigint_stays_ignored(void **state)
{
    (void)state;
    char *fifo = harness_tmp("timing2.fifo");
    pid_t pid = start_blocked_on_fifo(fifo, 1);
    kill(pid, SIGINT);
    sleep_ms(200);
    /* had SIGINT stopped it, opening the FIFO would wait for a writer forever */
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) fail_msg("aft ended on an ignored SIGINT (status %d)", st);
    /* the reader lets the blocked open go on; the run writes its timing */
    int fd = open(fifo, O_RDONLY);
    assert_true(fd >= 0);
    char buf[4096];
    size_t got = 0;
    for (ssize_t r; (r = read(fd, buf, sizeof buf)) > 0;) got += (size_t)r;
    close(fd);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_true(got > 0);
    aft_tensor y;
    aft_error err;
    assert_int_equal(aft_npy_read(out_path, &y, NULL, &err), AFT_OK);
    assert_int_equal(y.ndim, 2);
    aft_tensor_free(&y);
    assert_int_equal(stray_files(), 0);
    remove(fifo);
    free(fifo);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigint_while_computing),
        cmocka_unit_test(test_sigterm_while_computing),
        cmocka_unit_test(test_sigint_with_a_temporary_open),
        cmocka_unit_test(test_ignored_sigint_stays_ignored),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
