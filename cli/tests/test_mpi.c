/* test_mpi.c - aft run under `mpirun --oversubscribe -np N` against the
 * one-process run: every variant, causal and not, both layouts, B = 1 and
 * 3, N = 1 to 4, T not divisible by N and smaller than N x S, keys of
 * +-500 and biases of +-250 (from --weights), a mask; the output within
 * 1e-6 x max(1, |Y|). The cost model on a small simulation: the bytes a
 * rank sends do not grow with T for the band (O(S d) a neighbour, O(d) a
 * collective) and grow as T for full (the ring of K, V). Failures: a rank
 * whose rows of the input are cut short, and a rank killed mid-run, leave
 * no output, a non-zero exit, one message and no process behind.
 *
 * Open MPI refuses to run as root (as CI does) unless told it may: this
 * program sets OMPI_ALLOW_RUN_AS_ROOT and its confirmation for the mpirun
 * it starts, so users never need to. Without mpirun, or an aft built
 * without MPI, every test is skipped, and under make test-valgrind too. */
#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
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

#include "harness.h"

static int have_mpi;     /* mpirun runs and aft was built with MPI */
static char tag[64];     /* AFT_MPI_TEST_TAG of every rank this program starts */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- running mpirun */

/* /proc/PID/environ, NUL-separated, quietly (a process may be gone) */
static char *environ_of(const char *pid, size_t *len)
{
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/environ", pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    ssize_t r;
    while (buf && (r = read(fd, buf + n, cap - n)) > 0) {
        n += (size_t)r;
        if (n == cap) {
            char *b = realloc(buf, 2 * cap + 1);
            if (!b) break;
            buf = b;
            cap *= 2;
        }
    }
    close(fd);
    if (buf) buf[n] = '\0';
    *len = n;
    return buf;
}

typedef struct {
    int status;       /* exit status, -1 when a signal ended mpirun or it timed out */
    int timed_out;
    char *err;        /* stderr */
    double seconds;
} mpi_result;

static void mpi_result_free(mpi_result *r)
{
    free(r->err);
    memset(r, 0, sizeof *r);
}

/* mpirun --oversubscribe -np N AFT ARGS..., stderr to a file; a kill of
 * rank `kill_rank` (>= 0) kill_after seconds after it is seen running */
static void mpirun_aft(mpi_result *res, int np, int kill_rank, double kill_after, const char *const *args)
{
    memset(res, 0, sizeof *res);
    char *errpath = harness_tmp("mpirun.err"), npbuf[16];
    snprintf(npbuf, sizeof npbuf, "%d", np);
    const char *argv[64];
    int n = 0;
    argv[n++] = "mpirun";
    argv[n++] = "--oversubscribe";
    argv[n++] = "-np";
    argv[n++] = npbuf;
    argv[n++] = "-x";
    argv[n++] = "AFT_MPI_TEST_TAG";
    argv[n++] = harness_aft_bin();
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n] = NULL;
    double t0 = now_s();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int nul = open("/dev/null", O_RDWR);
        if (fd < 0 || nul < 0) _exit(126);
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(fd, 2);
        execvp("mpirun", (char *const *)argv);
        _exit(127);
    }
    setpgid(pid, pid);
    double limit = 120.0;
    int st = 0, killed = kill_rank < 0;
    double seen = -1.0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) break;
        double t = now_s() - t0;
        if (t > limit) {
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            res->timed_out = 1;
            break;
        }
        if (!killed) {   /* find the rank by its environment */
            char want[32];
            snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", kill_rank);
            DIR *d = opendir("/proc");
            struct dirent *e;
            while (d && (e = readdir(d))) {
                size_t len = 0;
                if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
                char *env = environ_of(e->d_name, &len);
                if (!env) continue;
                int mine = 0, rank = 0;
                for (size_t i = 0; i < len; i += strlen(env + i) + 1) {
                    if (strncmp(env + i, "AFT_MPI_TEST_TAG=", 17) == 0 && strcmp(env + i + 17, tag) == 0) mine = 1;
                    if (strcmp(env + i, want) == 0) rank = 1;
                }
                free(env);
                if (mine && rank) {
                    if (seen < 0) seen = t;
                    if (t - seen >= kill_after) {
                        kill((pid_t)atoi(e->d_name), SIGKILL);
                        killed = 1;
                    }
                }
            }
            if (d) closedir(d);
        }
        usleep(20000);
    }
    res->seconds = now_s() - t0;
    res->status = !res->timed_out && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    size_t len;
    if (harness_read_file(errpath, &res->err, &len) != 0) res->err = strdup("");
    free(errpath);
}

/* aft ARGS... in one process */
static void one_aft(const char *const *args)
{
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != 0) print_error("aft: %s\n", r.err);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
}

/* processes started for this program still running */
static int stray_processes(void)
{
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t len = 0;
        if (e->d_name[0] < '0' || e->d_name[0] > '9' || atoi(e->d_name) == (int)getpid()) continue;
        char *env = environ_of(e->d_name, &len);
        if (!env) continue;
        for (size_t i = 0; i < len; i += strlen(env + i) + 1)
            if (strncmp(env + i, "AFT_MPI_TEST_TAG=", 17) == 0 && strcmp(env + i + 17, tag) == 0) n++;
        free(env);
    }
    if (d) closedir(d);
    return n;
}

/* ---------------------------------------------------------------- files */

typedef struct { uint64_t s; } rng;
static double rng_sym(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return 2.0 * (double)(z >> 11) * 0x1.0p-53 - 1.0;
}

static float *randf(rng *r, size_t n, double scale)
{
    float *x = malloc(n * sizeof *x + 1);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_sym(r));
    return x;
}

static char *write_npy(const char *name, const float *x, size_t ndim, const size_t *shape)
{
    char *path = harness_tmp(name);
    aft_tensor t = harness_tensor(AFT_F32, x, ndim, shape);
    aft_error err;
    assert_int_equal(aft_npy_write(path, &t, &err), AFT_OK);
    return path;
}

/* an input of [B, T, D] (B 0: [T, D]) */
static char *make_input(const char *name, size_t B, size_t T, size_t D, uint64_t seed)
{
    rng r = {seed};
    size_t n = (B ? B : 1) * T * D;
    float *x = randf(&r, n, 1.0);
    size_t shape3[3] = {B, T, D}, shape2[2] = {T, D};
    char *p = B ? write_npy(name, x, 3, shape3) : write_npy(name, x, 2, shape2);
    free(x);
    return p;
}

/* a layer's weights D -> C -> D with keys of +-500 (its key bias) and a
 * position bias of +-250: (tmax, tmax) for full and local, (heads, 2S-1)
 * for conv */
static char *make_weights(const char *name, aft_variant v, size_t D, size_t C, size_t tmax, size_t heads, size_t S)
{
    rng r = {99};
    float *w[4], *b[4];
    size_t rows[4] = {C, C, C, D}, cols[4] = {D, D, D, C};
    const char *names[10] = {"query.weight", "key.weight", "value.weight", "output.weight",
                             "query.bias", "key.bias", "value.bias", "output.bias", "pos_bias", NULL};
    aft_tensor ts[9];
    for (int i = 0; i < 4; i++) {
        w[i] = randf(&r, rows[i] * cols[i], 0.5);
        b[i] = randf(&r, rows[i], i == 1 ? 500.0 : 0.3);
        size_t s2[2] = {rows[i], cols[i]}, s1[1] = {rows[i]};
        ts[i] = harness_tensor(AFT_F32, w[i], 2, s2);
        ts[4 + i] = harness_tensor(AFT_F32, b[i], 1, s1);
    }
    size_t n = 8;
    float *pb = NULL;
    if (v == AFT_FULL || v == AFT_LOCAL) {
        size_t s2[2] = {tmax, tmax};
        pb = randf(&r, tmax * tmax, 250.0);
        ts[n++] = harness_tensor(AFT_F32, pb, 2, s2);
    } else if (v == AFT_CONV) {
        size_t s2[2] = {heads, 2 * S - 1};
        pb = randf(&r, heads * (2 * S - 1), 250.0);
        ts[n++] = harness_tensor(AFT_F32, pb, 2, s2);
    }
    char *path = harness_tmp(name);
    aft_error err;
    assert_int_equal(aft_st_write(path, names, ts, n, NULL, 0, &err), AFT_OK);
    for (int i = 0; i < 4; i++) {
        free(w[i]);
        free(b[i]);
    }
    free(pb);
    return path;
}

/* |a - b| <= 1e-6 max(1, |b|) everywhere, same shapes; the worst ratio */
static int outputs_agree(const char *a, const char *b, const char *what)
{
    aft_tensor ta, tb;
    aft_error err;
    if (aft_npy_read(a, &ta, NULL, &err) != AFT_OK) {
        print_error("%s: %s: %s\n", what, a, err.msg);
        return 0;
    }
    assert_int_equal(aft_npy_read(b, &tb, NULL, &err), AFT_OK);
    int ok = ta.ndim == tb.ndim && ta.nelem == tb.nelem;
    for (size_t i = 0; ok && i < ta.ndim; i++) ok = ta.shape[i] == tb.shape[i];
    if (!ok) print_error("%s: shapes differ\n", what);
    const float *x = ta.data, *y = tb.data;
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; ok && i < ta.nelem; i++) {
        double d = fabs((double)x[i] - (double)y[i]) / fmax(1.0, fabs((double)y[i]));
        if (!(d <= worst)) {
            worst = d;
            at = i;
        }
    }
    if (ok && !(worst <= 1e-6)) {
        print_error("%s: entry %zu is %.9g, one process's %.9g (%.3g x max(1, |Y|))\n", what, at, (double)x[at],
                    (double)y[at], worst);
        ok = 0;
    }
    aft_tensor_free(&ta);
    aft_tensor_free(&tb);
    return ok;
}

/* ---------------------------------------------------------------- the comparisons */

/* aft run ARGS INPUT in one process, then on N ranks for N = 1 to 4;
 * returns the failures */
static int compare_runs(const char *what, const char *input, const char *const *opts, int with_n)
{
    char *one = harness_tmp("one.npy"), *many = harness_tmp("many.npy");
    const char *args[40];
    int n = 0, failures = 0;
    args[n++] = "run";
    for (int i = 0; opts[i]; i++) args[n++] = opts[i];
    args[n++] = input;
    args[n++] = "-o";
    int at = n;
    args[n++] = one;
    args[n] = NULL;
    one_aft(args);
    args[at] = many;
    for (int np = with_n ? with_n : 1; np <= (with_n ? with_n : 4); np++) {
        unlink(many);
        mpi_result r;
        mpirun_aft(&r, np, -1, 0, args);
        char w[300];
        snprintf(w, sizeof w, "%s, N = %d", what, np);
        if (r.status != 0) {
            print_error("%s: mpirun exited %d: %s\n", w, r.status, r.err);
            failures++;
        } else if (!outputs_agree(many, one, w)) {
            failures++;
        }
        mpi_result_free(&r);
    }
    free(one);
    free(many);
    return failures;
}

static void skip_without_mpi(void)
{
    if (!have_mpi) skip();
}

/* every variant, causal and not; the layouts and batch sizes in turn */
static void test_variants(void **state)
{
    (void)state;
    skip_without_mpi();
    /* T = 50: not divisible by 3 or 4, and below N x S for a window of 16 */
    char *btd1 = make_input("b1.npy", 1, 50, 8, 1), *btd3 = make_input("b3.npy", 3, 50, 8, 2);
    char *t2 = make_input("t2.npy", 0, 50, 8, 3);
    static const char *const variants[][6] = {
        {"--variant", "local", "--window", "16", NULL},
        {"--variant", "conv", "--window", "5", "--heads", "2"},
        {"--variant", "simple", NULL},
        {"--variant", "full", NULL},
    };
    int failures = 0;
    for (size_t v = 0; v < 4; v++)
        for (int causal = 0; causal < 2; causal++)
            for (int form = 0; form < 3; form++) {
                const char *opts[12];
                int n = 0;
                for (int i = 0; i < 6 && variants[v][i]; i++) opts[n++] = variants[v][i];
                if (causal) opts[n++] = "--causal";
                const char *input = form == 0 ? btd1 : form == 1 ? btd3 : t2;
                if (form == 1 && (v + causal) % 2) {   /* B = 3 as [T, B, D] */
                    opts[n++] = "--layout";
                    opts[n++] = "tbd";
                }
                opts[n] = NULL;
                char what[160];
                snprintf(what, sizeof what, "%s%s %s", variants[v][1], causal ? " causal" : "",
                         form == 0 ? "[1, T, D]" : form == 2 ? "[T, D]" : n > 4 && !strcmp(opts[n - 1], "tbd") ?
                         "[T, 3, D] tbd" : "[3, T, D]");
                /* every N for the batch of three; N = 2 and 3 for the others */
                failures += compare_runs(what, input, opts, form == 1 ? 0 : 2 + (int)(v + causal) % 2);
            }
    free(btd1); free(btd3); free(t2);
    assert_int_equal(failures, 0);
}

/* keys of +-500 and position biases of +-250 from --weights */
static void test_extreme_weights(void **state)
{
    (void)state;
    skip_without_mpi();
    char *x = make_input("e.npy", 3, 61, 8, 4);
    int failures = 0;
    struct { aft_variant v; const char *name; const char *opts[8]; } cases[] = {
        {AFT_LOCAL, "local", {"--variant", "local", "--window", "9", NULL}},
        {AFT_CONV, "conv", {"--variant", "conv", NULL}},
        {AFT_FULL, "full", {"--variant", "full", NULL}},
        {AFT_SIMPLE, "simple", {"--variant", "simple", NULL}},
    };
    for (size_t i = 0; i < 4; i++) {
        char *w = make_weights("w.safetensors", cases[i].v, 8, 12, 64, 2, 6);
        for (int causal = 0; causal < 2; causal++) {
            const char *opts[12];
            int n = 0;
            for (int k = 0; cases[i].opts[k]; k++) opts[n++] = cases[i].opts[k];
            opts[n++] = "--weights";
            opts[n++] = w;
            if (causal) opts[n++] = "--causal";
            if (i % 2) {
                opts[n++] = "--layout";
                opts[n++] = "tbd";
            }
            opts[n] = NULL;
            char what[96];
            snprintf(what, sizeof what, "%s%s, keys +-500, biases +-250", cases[i].name, causal ? " causal" : "");
            failures += compare_runs(what, x, opts, 3 + causal);
        }
        free(w);
    }
    free(x);
    assert_int_equal(failures, 0);
}

/* a mask, read by rows: [B, T, T] */
static void test_mask(void **state)
{
    (void)state;
    skip_without_mpi();
    char *x = make_input("m.npy", 3, 41, 8, 5);
    rng r = {6};
    size_t B = 3, T = 41;
    float *m = malloc(B * T * T * sizeof *m);
    for (size_t i = 0; i < B * T * T; i++) m[i] = rng_sym(&r) > -0.5 ? 1.0f : 0.0f;
    size_t shape[3] = {B, T, T};
    char *mp = write_npy("mask.npy", m, 3, shape);
    free(m);
    int failures = 0;
    const char *o1[] = {"--variant", "local", "--window", "6", "--mask", mp, NULL};
    const char *o2[] = {"--variant", "full", "--causal", "--mask", mp, NULL};
    failures += compare_runs("local masked", x, o1, 3);
    failures += compare_runs("full causal masked", x, o2, 4);
    free(x);
    free(mp);
    assert_int_equal(failures, 0);
}

/* the bytes each rank sent, from --timing */
static void sent_bytes(const char *timing, double *out, int np)
{
    char *text;
    assert_int_equal(harness_read_file(timing, &text, NULL), 0);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    cJSON *per = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "mpi"), "per_rank");
    assert_int_equal(cJSON_GetArraySize(per), np);
    for (int i = 0; i < np; i++)
        out[i] = cJSON_GetObjectItem(cJSON_GetArrayItem(per, i), "sent_bytes")->valuedouble;
    cJSON_Delete(j);
}

/* The cost model, on a small simulation: a rank of the band sends its last
 * S rows of K | V (2 S C floats a sequence) to its neighbour and 4 C floats
 * a sequence in each scan, whatever T; full sends every row to every later
 * rank. */
static void test_cost_model(void **state)
{
    (void)state;
    skip_without_mpi();
    const size_t D = 8, S = 16;
    double sent[2][2][3];   /* [band, full][T, 2T][rank] */
    for (int T2 = 0; T2 < 2; T2++) {
        char *x = make_input("c.npy", 1, T2 ? 800 : 400, D, 7), *y = harness_tmp("c_out.npy");
        char *tj = harness_tmp("c.json");
        for (int full = 0; full < 2; full++) {
            const char *args[] = {"run", "--variant", full ? "full" : "local", "--window", "16", "--causal", x,
                                  "-o", y, "--timing", tj, NULL};
            if (full) {
                args[3] = "--causal";
                args[4] = x;
                args[5] = "-o";
                args[6] = y;
                args[7] = "--timing";
                args[8] = tj;
                args[9] = NULL;
            }
            mpi_result r;
            mpirun_aft(&r, 3, -1, 0, args);
            if (r.status) print_error("%s\n", r.err);
            assert_int_equal(r.status, 0);
            mpi_result_free(&r);
            sent_bytes(tj, sent[full][T2], 3);
        }
        free(x); free(y); free(tj);
    }
    /* band: rank 0 and 1 send S rows of 2C floats (C = D) and 4C floats to
     * the scan, at T and at 2T alike */
    for (int q = 0; q < 2; q++) {
        assert_true(sent[0][0][q] == sent[0][1][q]);
        assert_true(sent[0][0][q] == (double)((2 * S * D + 4 * D) * sizeof(float)));
    }
    /* full: every row to every later rank, twice as much at 2T */
    assert_true(sent[1][1][0] == 2 * sent[1][0][0]);
    assert_true(sent[1][0][0] >= (double)(400 / 3 * 2 * 2 * D * sizeof(float)));
}

/* no output, no temporary beside it */
static void assert_no_output(const char *name)
{
    DIR *d = opendir(harness_dir());
    struct dirent *e;
    assert_non_null(d);
    while ((e = readdir(d)))
        if (strncmp(e->d_name, name, strlen(name)) == 0) {
            print_error("left behind: %s\n", e->d_name);
            fail();
        }
    closedir(d);
}

/* lines of stderr aft wrote ("aft ..."), not mpirun's */
static size_t aft_lines(const char *err)
{
    size_t n = 0;
    for (const char *p = err; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
        if (strncmp(p, "aft", 3) == 0) n++;
    return n;
}

/* the last rank's rows are missing from a file cut short */
static void test_rows_cut_short(void **state)
{
    (void)state;
    skip_without_mpi();
    char *x = make_input("cut.npy", 1, 100, 8, 8), *y = harness_tmp("cut_out.npy");
    struct stat sb;
    assert_int_equal(stat(x, &sb), 0);
    assert_int_equal(truncate(x, sb.st_size - 20 * 8 * 4), 0);   /* rows 80 to 99 gone */
    const char *args[] = {"run", "--variant", "local", "--window", "4", x, "-o", y, NULL};
    mpi_result r;
    mpirun_aft(&r, 3, -1, 0, args);
    assert_false(r.timed_out);
    assert_int_not_equal(r.status, 0);
    assert_int_equal(aft_lines(r.err), 1);
    assert_non_null(strstr(r.err, "aft run: "));
    assert_non_null(strstr(r.err, "rows 66 to 99: data truncated"));
    assert_no_output("cut_out.npy");
    assert_int_equal(stray_processes(), 0);
    mpi_result_free(&r);
    free(x);
    free(y);
}

/* one rank killed mid-run: mpirun ends the others */
static void test_rank_killed(void **state)
{
    (void)state;
    skip_without_mpi();
    /* full over 24000 rows: seconds of work, so the kill lands mid-run */
    char *x = make_input("kill.npy", 1, 24000, 64, 9), *y = harness_tmp("kill_out.npy");
    const char *args[] = {"run", "--variant", "full", "--threads", "1", x, "-o", y, NULL};
    mpi_result r;
    mpirun_aft(&r, 2, 1, 0.5, args);
    if (r.status == 0) print_error("not killed: the run took %.2f s\n", r.seconds);
    assert_false(r.timed_out);
    assert_int_not_equal(r.status, 0);
    assert_no_output("kill_out.npy");
    for (int i = 0; i < 100 && stray_processes(); i++) usleep(50000);
    assert_int_equal(stray_processes(), 0);
    mpi_result_free(&r);
    free(x);
    free(y);
}

/* the tensors of weights file src, less `drop` (NULL: none) and with a
 * float32 [3] named `extra` (NULL: none), into dst (malloc'd path) */
static char *rewrite_weights(const char *src, const char *drop, const char *extra, const char *dst)
{
    aft_st_file *f;
    aft_error err;
    assert_int_equal(aft_st_open(src, &f, &err), AFT_OK);
    const char *names[16];
    aft_tensor ts[16];
    size_t n = 0;
    static const float three[3] = {1, 2, 3};
    for (size_t i = 0; i < aft_st_count(f) && n < 15; i++) {
        const char *name;
        const aft_tensor *t = aft_st_get(f, i, &name);
        if (drop && strcmp(name, drop) == 0) continue;
        names[n] = name;
        ts[n] = *t;
        ts[n++].owned = NULL;
    }
    if (extra) {
        names[n] = extra;
        ts[n++] = harness_tensor(AFT_F32, three, 1, (size_t[]){3});
    }
    char *path = harness_tmp(dst);
    assert_int_equal(aft_st_write(path, names, ts, n, NULL, 0, &err), AFT_OK);
    aft_st_close(f);
    return path;
}

/* --weights with a tensor the layer does not use: one warning from rank 0
 * and the output; --strict: one error, no output. A bias missing beside the
 * others: one error. */
static void test_weights_checked(void **state)
{
    (void)state;
    skip_without_mpi();
    char *x = make_input("wc.npy", 1, 40, 8, 11), *y = harness_tmp("wc_out.npy");
    char *w = make_weights("wc_w.safetensors", AFT_LOCAL, 8, 8, 64, 1, 0);
    char *extra = rewrite_weights(w, NULL, "norm.weight", "wc_extra.safetensors");
    char *nobias = rewrite_weights(w, "value.bias", NULL, "wc_nobias.safetensors");
    const char *args[] = {"run", "--variant", "local", "--window", "4", "--causal", "--weights", extra, x, "-o", y,
                          NULL, NULL};
    mpi_result r;
    mpirun_aft(&r, 3, -1, 0, args);
    assert_int_equal(r.status, 0);
    char *want = NULL;
    assert_true(asprintf(&want, "aft run: warning: %s: unexpected tensor 'norm.weight', which the layer does not "
                         "use\n", extra) > 0);
    if (aft_lines(r.err) != 1 || !strstr(r.err, want)) print_error("stderr: %s\nwant: %s", r.err, want);
    assert_int_equal(aft_lines(r.err), 1);
    assert_non_null(strstr(r.err, want));
    free(want);
    mpi_result_free(&r);
    assert_int_equal(unlink(y), 0);
    args[11] = "--strict";
    mpirun_aft(&r, 3, -1, 0, args);
    assert_int_equal(r.status, 1);
    assert_true(asprintf(&want, "aft run: %s: unexpected tensor 'norm.weight', which the layer does not use; --strict "
                         "refuses it\n", extra) > 0);
    assert_int_equal(aft_lines(r.err), 1);
    assert_non_null(strstr(r.err, want));
    free(want);
    assert_no_output("wc_out.npy");
    mpi_result_free(&r);
    args[7] = nobias;
    args[11] = NULL;
    mpirun_aft(&r, 3, -1, 0, args);
    assert_int_equal(r.status, 1);
    assert_int_equal(aft_lines(r.err), 1);
    assert_non_null(strstr(r.err, "missing tensor 'value.bias' beside 'query.bias'"));
    assert_no_output("wc_out.npy");
    mpi_result_free(&r);
    free(x); free(y); free(w); free(extra); free(nobias);
}

/* options this form cannot run are usage errors, said once */
static void test_refused(void **state)
{
    (void)state;
    skip_without_mpi();
    char *x = make_input("r.npy", 1, 20, 8, 10);
    const char *args[] = {"run", "--variant", "local", "--window", "4", x, NULL};
    mpi_result r;
    mpirun_aft(&r, 2, -1, 0, args);
    assert_int_equal(r.status, 2);
    assert_int_equal(aft_lines(r.err), 1);
    assert_non_null(strstr(r.err, "give -o FILE"));
    mpi_result_free(&r);
    const char *bad[] = {"run", "--variant", "nonesuch", x, "-o", "y.npy", NULL};
    mpirun_aft(&r, 3, -1, 0, bad);
    assert_int_equal(r.status, 2);
    assert_int_equal(aft_lines(r.err), 1);
    mpi_result_free(&r);
    free(x);
}

/* srun's tasks with no MPI between them (srun without --mpi=pmix): every
 * task refuses, task 0 alone says why, and nothing is written. srun is
 * not needed: its variables are what aft reads */
static void test_srun_without_mpi(void **state)
{
    (void)state;
    char *x = make_input("s.npy", 1, 20, 8, 11), *y = harness_tmp("s_out.npy");
    setenv("SLURM_STEP_NUM_TASKS", "2", 1);
    for (int task = 0; task < 2; task++) {
        setenv("SLURM_PROCID", task ? "1" : "0", 1);
        harness_result r;
        assert_int_equal(HARNESS_RUN(&r, "run", "--variant", "simple", x, "-o", y), 0);
        assert_int_equal(r.exit_code, 2);
        if (task == 0) {
            assert_int_equal(aft_lines(r.err), 1);
            assert_non_null(strstr(r.err, "srun --mpi=pmix"));
        } else {
            assert_int_equal(r.err_len, 0);
        }
        assert_false(harness_exists(y));
        harness_result_free(&r);
    }
    /* one task: a plain run */
    setenv("SLURM_STEP_NUM_TASKS", "1", 1);
    setenv("SLURM_PROCID", "0", 1);
    one_aft((const char *const[]){"run", "--variant", "simple", x, "-o", y, NULL});
    assert_true(harness_exists(y));
    unsetenv("SLURM_STEP_NUM_TASKS");
    unsetenv("SLURM_PROCID");
    free(x);
    free(y);
}

/* a command that does not share its work, under mpirun with two ranks:
 * refused, said once, where each rank would have run it whole */
static void test_one_process_commands(void **state)
{
    (void)state;
    skip_without_mpi();
    char *x = make_input("o.npy", 1, 20, 8, 12);
    const char *args[] = {"compare", x, x, NULL};
    mpi_result r;
    mpirun_aft(&r, 2, -1, 0, args);
    assert_int_equal(r.status, 2);
    assert_int_equal(aft_lines(r.err), 1);
    assert_non_null(strstr(r.err, "aft compare: runs as one process"));
    mpi_result_free(&r);
    const char *one[] = {"compare", x, x, NULL};
    mpirun_aft(&r, 1, -1, 0, one);
    assert_int_equal(r.status, 0);
    mpi_result_free(&r);
    free(x);
}

static int setup(void **state)
{
    harness_setup(state);
    /* under make test-valgrind every aft runs under memcheck, and Open
     * MPI's own runtime is not clean there (pmix writes uninitialised
     * bytes, its components leak at exit): make test runs these */
    if (!harness_aft_is_binary()) {
        fprintf(stderr, "test_mpi: skipping: aft is a wrapper (make test-valgrind); make test runs the MPI tests\n");
        return 0;
    }
    snprintf(tag, sizeof tag, "%ld", (long)getpid());
    setenv("AFT_MPI_TEST_TAG", tag, 1);
    /* CI runs as root; Open MPI refuses that unless told */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    /* one probe: mpirun there, and an aft that knows MPI */
    char *x = make_input("probe.npy", 1, 4, 2, 0), *y = harness_tmp("probe_out.npy");
    const char *args[] = {"run", "--variant", "simple", x, "-o", y, NULL};
    mpi_result r;
    mpirun_aft(&r, 1, -1, 0, args);
    have_mpi = r.status == 0;
    if (!have_mpi)
        fprintf(stderr, "test_mpi: skipping: mpirun -np 1 aft run failed (%d): %s\n", r.status,
                r.err && *r.err ? r.err : "mpirun not found?\n");
    mpi_result_free(&r);
    free(x);
    free(y);
    return 0;
}

static int teardown(void **state)
{
    harness_teardown(state);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_variants),
        cmocka_unit_test(test_extreme_weights),
        cmocka_unit_test(test_mask),
        cmocka_unit_test(test_cost_model),
        cmocka_unit_test(test_rows_cut_short),
        cmocka_unit_test(test_rank_killed),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_weights_checked),
        cmocka_unit_test(test_srun_without_mpi),
        cmocka_unit_test(test_one_process_commands),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
