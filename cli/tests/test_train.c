/* test_train.c - aft train against PyTorch and against itself.
 *
 *  - step for step: testdata/train/ (make_train_fixtures.py: labml's model in
 *    PyTorch, 50 steps from init.safetensors on batches.npy, dropout off):
 *    the losses within 1e-4 x max(1, |loss|), the parameters after step 1
 *    within 1e-5 relative, normwise per tensor (outside the entries whose
 *    gradient is zero in exact arithmetic, where Adam's first step turns
 *    rounding noise into a move of at most the learning rate: held to that)
 *  - --resume: stopped at step 12 and resumed, the same losses and the same
 *    checkpoint (byte for byte) as a run that never stopped, dropout on
 *  - mpirun -np 2 with batch b against one process with batch 2 b: the losses
 *    within 1e-5 relative (skipped without mpirun or MPI built in)
 *  - bad input: an empty text, a binary one, one shorter than a window, a
 *    --resume state of another configuration, a non-finite loss: one line,
 *    exit 1, no checkpoint; a full disk (a file-size limit) while saving: one
 *    line, no checkpoint, no temporary left
 *  - --threads 1 and 2: the same tensors, bit for bit, dropout on
 *  - PyTorch's load_state_dict(strict=True) takes the checkpoint (where
 *    torch is installed; skipped otherwise)
 *  - SIGTERM mid-run: the checkpoint and the state saved, exit 143, and
 *    --resume finishes the run with the losses of one that never stopped
 * No torch at test time. */
#include <cJSON.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

/* the small model every run here trains: a fresh one on a text */
#define SMALL "--layers", "2", "--d-model", "16", "--d-ff", "32", "--window", "4", "--seq-len", "16", \
              "--warmup", "5", "--threads", "1", "-q"

static char *fixture(const char *name)
{
    char *dir = harness_path(harness_testdata(), "train");
    char *p = harness_path(dir, name);
    free(dir);
    return p;
}

/* a text to train on: a sentence repeated */
static char *text_file(void)
{
    char *p = harness_tmp("text.txt");
    char buf[4096] = "";
    for (int i = 0; i < 40; i++) strcat(buf, "the quick brown fox jumps over the lazy dog. ");
    assert_int_equal(harness_write_file(p, buf, strlen(buf)), 0);
    return p;
}

/* the "loss" of each line of a --log file; *n lines */
static double *read_losses(const char *path, size_t *n)
{
    char *s;
    assert_int_equal(harness_read_file(path, &s, NULL), 0);
    double *v = NULL;
    *n = 0;
    for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "loss");
        assert_true(cJSON_IsNumber(l));
        v = realloc(v, (*n + 1) * sizeof *v);
        v[(*n)++] = l->valuedouble;
        cJSON_Delete(j);
    }
    free(s);
    return v;
}

static void test_step_for_step(void **state)
{
    (void)state;
    char *init = fixture("init.safetensors"), *batches = fixture("batches.npy"), *ref_losses = fixture("losses.npy"),
         *step1 = fixture("step1.safetensors");
    char *log = harness_tmp("pt.jsonl"), *out = harness_tmp("pt.safetensors"), *out1 = harness_tmp("pt1.safetensors");
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "train", "--init", init, "--batches", batches, "--steps", "50", "--lr", "2e-3",
                                 "--warmup", "10", "--dropout", "0", "--threads", "1", "-q", "--log", log, "-o", out),
                     0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    size_t n;
    double *got = read_losses(log, &n);
    aft_tensor ref;
    aft_error err;
    assert_int_equal(aft_npy_read(ref_losses, &ref, NULL, &err), AFT_OK);
    assert_int_equal(ref.dtype, AFT_F64);
    assert_int_equal(n, ref.nelem);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double want = ((const double *)ref.data)[i];
        double e = fabs(got[i] - want) / fmax(1.0, fabs(want));
        if (e > worst) worst = e;
        if (e > 1e-4) fail_msg("step %zu: loss %.8f, PyTorch's %.8f", i + 1, got[i], want);
    }
    print_message("50 losses against PyTorch's: worst %.2e x max(1, |loss|)\n", worst);
    free(got);
    aft_tensor_free(&ref);

    /* the parameters after the first step */
    assert_int_equal(HARNESS_RUN(&r, "train", "--init", init, "--batches", batches, "--steps", "50", "--lr", "2e-3",
                                 "--warmup", "10", "--dropout", "0", "--threads", "1", "-q", "--stop-at", "1", "-o",
                                 out1),
                     0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    aft_st_file *want, *have, *start;
    assert_int_equal(aft_st_open(step1, &want, &err), AFT_OK);
    assert_int_equal(aft_st_open(out1, &have, &err), AFT_OK);
    assert_int_equal(aft_st_open(init, &start, &err), AFT_OK);
    size_t tensors = 0;
    worst = 0;
    for (size_t i = 0; i < aft_st_count(want); i++) {
        const char *name;
        const aft_tensor *w = aft_st_get(want, i, &name);
        if (strncmp(name, "zero.", 5) == 0) continue;
        char zname[300];
        snprintf(zname, sizeof zname, "zero.%s", name);
        const aft_tensor *z = aft_st_find(want, zname), *h = aft_st_find(have, name), *s = aft_st_find(start, name);
        assert_non_null(z);
        assert_non_null(h);
        assert_non_null(s);
        assert_int_equal(h->dtype, AFT_F32);
        assert_int_equal(h->nelem, w->nelem);
        const float *wv = w->data, *hv = h->data, *sv = s->data;
        const uint8_t *zv = z->data;
        double dn = 0, wn = 0;
        for (size_t k = 0; k < w->nelem; k++) {
            wn += (double)wv[k] * wv[k];
            if (zv[k]) {
                /* Adam's first step moves at most lr (x 100 for pos_bias) */
                double bound = 2e-4 * (strstr(name, "pos_bias") ? 100 : 1) * 1.001;
                if (fabs((double)hv[k] - sv[k]) > bound) fail_msg("%s[%zu]: moved %g, more than lr", name, k,
                                                                   fabs((double)hv[k] - sv[k]));
            } else {
                dn += ((double)hv[k] - wv[k]) * ((double)hv[k] - wv[k]);
            }
        }
        double rel = sqrt(dn) / fmax(sqrt(wn), 1e-30);
        if (rel > worst) worst = rel;
        if (rel > 1e-5) fail_msg("%s after step 1: %.2e relative to PyTorch's", name, rel);
        tensors++;
    }
    print_message("%zu tensors after step 1 against PyTorch's: worst %.2e relative (normwise)\n", tensors, worst);
    assert_true(tensors >= 20);
    aft_st_close(want);
    aft_st_close(have);
    aft_st_close(start);
    free(init), free(batches), free(ref_losses), free(step1), free(log), free(out), free(out1);
}

static void test_resume(void **state)
{
    (void)state;
    char *text = text_file(), *a = harness_tmp("a.safetensors"), *b = harness_tmp("b.safetensors"),
         *la = harness_tmp("a.jsonl"), *lb = harness_tmp("b.jsonl"), *bstate = harness_tmp("b.safetensors.state");
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "train", "--text", text, SMALL, "--batch", "2", "--steps", "30", "--dropout",
                                 "0.1", "--log", la, "-o", a),
                     0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    assert_int_equal(HARNESS_RUN(&r, "train", "--text", text, SMALL, "--batch", "2", "--steps", "30", "--dropout",
                                 "0.1", "--log", lb, "-o", b, "--stop-at", "12"),
                     0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    assert_int_equal(HARNESS_RUN(&r, "train", "--text", text, SMALL, "--batch", "2", "--steps", "30", "--dropout",
                                 "0.1", "--log", lb, "-o", b, "--resume", bstate),
                     0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    size_t na, nb;
    double *va = read_losses(la, &na), *vb = read_losses(lb, &nb);
    assert_int_equal(na, 30);
    assert_int_equal(nb, 30);
    for (size_t i = 0; i < na; i++)
        if (va[i] != vb[i]) fail_msg("step %zu: %.9g uninterrupted, %.9g resumed", i + 1, va[i], vb[i]);
    char *da, *db;
    size_t za, zb;
    assert_int_equal(harness_read_file(a, &da, &za), 0);
    assert_int_equal(harness_read_file(b, &db, &zb), 0);
    assert_true(za == zb && memcmp(da, db, za) == 0);
    free(da), free(db), free(va), free(vb);

    /* a state of another configuration */
    char *c = harness_tmp("c.safetensors");
    assert_int_equal(HARNESS_RUN(&r, "train", "--text", text, SMALL, "--batch", "3", "--steps", "30", "--dropout",
                                 "0.1", "-o", c, "--resume", bstate),
                     0);
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(harness_count_lines(r.err), 1);
    assert_non_null(strstr(r.err, "another configuration: batch 2, this run's 3"));
    assert_false(harness_exists(c));
    harness_result_free(&r);
    free(text), free(a), free(b), free(la), free(lb), free(bstate), free(c);
}

/* one line, exit 1, no checkpoint */
static void expect_refusal(const char *text_bytes, size_t len, const char *msg)
{
    char *text = harness_tmp("bad.txt"), *out = harness_tmp("bad.safetensors");
    assert_int_equal(harness_write_file(text, text_bytes, len), 0);
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "train", "--text", text, SMALL, "--batch", "2", "--steps", "3", "-o", out), 0);
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(harness_count_lines(r.err), 1);
    if (!strstr(r.err, msg)) fail_msg("expected '%s' in: %s", msg, r.err);
    assert_false(harness_exists(out));
    harness_result_free(&r);
    free(text), free(out);
}

static void test_bad_text(void **state)
{
    (void)state;
    expect_refusal("", 0, "the text is empty");
    expect_refusal("ab\0\x01\xff", 5, "not UTF-8 text: a NUL byte at byte 2");
    expect_refusal("ab\xff", 3, "not UTF-8 text: a byte that starts no UTF-8 character at byte 2");
    expect_refusal("too short", 9, "the text holds 9 characters, fewer than --seq-len + 2 = 18");
}

/* a weight of +inf: the first loss is not finite; stop, name the step */
static void test_nonfinite(void **state)
{
    (void)state;
    char *init = fixture("init.safetensors"), *batches = fixture("batches.npy");
    aft_st_file *f;
    aft_error err;
    assert_int_equal(aft_st_open(init, &f, &err), AFT_OK);
    size_t n = aft_st_count(f);
    const char **names = calloc(n, sizeof *names);
    aft_tensor *ts = calloc(n, sizeof *ts);
    float *bad = NULL;
    for (size_t i = 0; i < n; i++) {
        ts[i] = *aft_st_get(f, i, &names[i]);
        ts[i].owned = NULL;
        if (strcmp(names[i], "generator.projection.bias") == 0) {
            bad = malloc(ts[i].nbytes);
            memcpy(bad, ts[i].data, ts[i].nbytes);
            bad[3] = INFINITY;
            ts[i].data = bad;
        }
    }
    assert_non_null(bad);
    const char *meta[] = {"vocab", aft_st_metadata_find(f, "vocab"), "window", aft_st_metadata_find(f, "window")};
    char *binit = harness_tmp("inf.safetensors"), *out = harness_tmp("inf_out.safetensors");
    assert_int_equal(aft_st_write(binit, names, ts, n, meta, 2, &err), AFT_OK);
    aft_st_close(f);
    free(bad), free(names), free(ts);
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "train", "--init", binit, "--batches", batches, "--steps", "5", "--dropout", "0",
                                 "-q", "-o", out),
                     0);
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(harness_count_lines(r.err), 1);
    if (!strstr(r.err, "step 1: the loss is not finite")) fail_msg("%s", r.err);
    assert_false(harness_exists(out));
    harness_result_free(&r);
    free(init), free(batches), free(binit), free(out);
}

/* a file-size limit (EFBIG, as a full disk's ENOSPC) while saving */
static void test_full_disk(void **state)
{
    (void)state;
    char *text = text_file(), *dir = harness_tmp("full"), *out;
    assert_int_equal(mkdir(dir, 0755), 0);
    out = harness_path(dir, "m.safetensors");
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 64 * 1024;   /* the checkpoint is larger: the positional encodings alone are 320 KB */
    void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    harness_result r;
    int rc = HARNESS_RUN(&r, "train", "--text", text, SMALL, "--batch", "2", "--steps", "3", "-o", out);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, oldsig);
    assert_int_equal(rc, 0);
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(harness_count_lines(r.err), 1);
    if (!strstr(r.err, "m.safetensors: write failed")) fail_msg("%s", r.err);
    harness_result_free(&r);
    char *cmd = harness_fmt("test -z \"$(ls -A '%s')\"", dir);   /* nothing: no checkpoint, no temporary */
    assert_int_equal(system(cmd), 0);
    free(cmd), free(text), free(dir), free(out);
}

/* SIGTERM saves and stops; --resume goes on as if nothing happened */
static void test_sigterm(void **state)
{
    (void)state;
    char *text = text_file(), *full = harness_tmp("full.jsonl"), *log = harness_tmp("sig.jsonl"),
         *a = harness_tmp("nosig.safetensors"), *b = harness_tmp("sig.safetensors"),
         *bstate = harness_tmp("sig.safetensors.state");
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "train", "--text", text, SMALL, "--batch", "2", "--steps", "400", "--log", full,
                                 "-o", a),
                     0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 2);
        execl(harness_aft_bin(), "aft", "train", "--text", text, SMALL, "--batch", "2", "--steps", "400", "--log",
              log, "-o", b, (char *)NULL);
        _exit(127);
    }
    /* once a step is logged, a signal */
    for (int i = 0; i < 2000; i++) {
        char *s = NULL;
        size_t n = 0;
        if (harness_read_file(log, &s, &n) == 0 && n > 0) {
            free(s);
            break;
        }
        free(s);
        usleep(5000);
    }
    kill(pid, SIGTERM);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    size_t done;
    free(read_losses(log, &done));
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        print_message("the run ended before the signal (%zu steps); nothing to check\n", done);
        skip();
    }
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM);
    assert_true(harness_exists(b) && harness_exists(bstate));
    assert_int_equal(HARNESS_RUN(&r, "train", "--text", text, SMALL, "--batch", "2", "--steps", "400", "--log", log,
                                 "-o", b, "--resume", bstate),
                     0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    size_t n1, n2;
    double *x = read_losses(full, &n1), *y = read_losses(log, &n2);
    assert_int_equal(n1, 400);
    assert_int_equal(n2, 400);
    for (size_t i = 0; i < n1; i++)
        if (x[i] != y[i]) fail_msg("step %zu: %.9g uninterrupted, %.9g after SIGTERM at %zu", i + 1, x[i], y[i], done);
    print_message("stopped by SIGTERM after step %zu of 400; resumed to the same losses\n", done);
    free(x), free(y), free(text), free(full), free(log), free(a), free(b), free(bstate);
}

/* a step's windows run in groups, a thread each: --threads 1 and 2 give
 * the same checkpoint, bit for bit, with dropout too */
static void test_threads(void **state)
{
    (void)state;
    char *init = fixture("init.safetensors"), *batches = fixture("batches.npy");
    char *out[2] = {harness_tmp("th1.safetensors"), harness_tmp("th2.safetensors")};
    for (int k = 0; k < 2; k++) {
        harness_result r;
        assert_int_equal(HARNESS_RUN(&r, "train", "--init", init, "--batches", batches, "--steps", "3", "--dropout",
                                     "0.1", "--threads", k ? "2" : "1", "-q", "-o", out[k]),
                         0);
        assert_int_equal(r.exit_code, 0);
        harness_result_free(&r);
    }
    aft_st_file *f[2];
    aft_error err;
    for (int k = 0; k < 2; k++) assert_int_equal(aft_st_open(out[k], &f[k], &err), AFT_OK);
    assert_int_equal(aft_st_count(f[0]), aft_st_count(f[1]));
    for (size_t i = 0; i < aft_st_count(f[0]); i++) {
        const char *name;
        const aft_tensor *a = aft_st_get(f[0], i, &name), *b = aft_st_find(f[1], name);
        assert_non_null(b);
        assert_int_equal(a->nbytes, b->nbytes);
        if (memcmp(a->data, b->data, a->nbytes) != 0) fail_msg("%s differs between --threads 1 and 2", name);
    }
    for (int k = 0; k < 2; k++) {
        aft_st_close(f[k]);
        free(out[k]);
    }
    free(init), free(batches);
}

/* PyTorch's load_state_dict(strict=True) takes aft's checkpoint (skipped
 * where /usr/bin/python3 has no torch) */
static void test_pytorch_loads(void **state)
{
    (void)state;
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
        print_message("skipped: /usr/bin/python3 has no torch\n");
        skip();
    }
    char *init = fixture("init.safetensors"), *batches = fixture("batches.npy"), *out = harness_tmp("pt3.safetensors");
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "train", "--init", init, "--batches", batches, "--steps", "3", "--dropout", "0",
                                 "--threads", "1", "-q", "-o", out),
                     0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    char *dir = harness_path(harness_testdata(), "train");
    char *cmd = harness_fmt("cd '%s' && /usr/bin/python3 -c '\n"
                            "import json, sys, torch\n"
                            "import make_train_fixtures as mf, train_labml_aft as tl\n"
                            "named, meta = tl.read_safetensors(sys.argv[1])\n"
                            "model = mf.make_model(len(json.loads(meta[\"vocab\"])))\n"
                            "model.load_state_dict(dict(named), strict=True)\n"
                            "assert torch.isfinite(model(torch.zeros(5, 2, dtype=torch.long))).all()\n"
                            "' '%s'", dir, out);
    int st = system(cmd);
    if (st != 0) fail_msg("PyTorch did not load %s with strict=True (%s)", out, cmd);
    free(cmd), free(dir), free(init), free(batches), free(out);
}

/* mpirun -np 2, batch b, against one process with batch 2 b */
static void test_mpi(void **state)
{
    (void)state;
    if (!harness_aft_is_binary()) {
        /* memcheck reports Open MPI's own leaks and PMIx's writes, not
         * aft's; make test runs this (the sanitizer build has no MPI) */
        print_message("skipped: mpirun of a wrapper (make test-valgrind)\n");
        skip();
    }
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "--version"), 0);
    int built = strstr(r.out, "mpi: built in") != NULL;
    harness_result_free(&r);
    if (!built || system("command -v mpirun >/dev/null 2>&1") != 0) {
        print_message("skipped: no mpirun, or aft built without MPI\n");
        skip();
    }
    char *text = text_file(), *one = harness_tmp("one.jsonl"), *two = harness_tmp("two.jsonl"),
         *o1 = harness_tmp("one.safetensors"), *o2 = harness_tmp("two.safetensors");
    assert_int_equal(HARNESS_RUN(&r, "train", "--text", text, SMALL, "--batch", "4", "--steps", "10", "--dropout",
                                 "0", "--log", one, "-o", o1),
                     0);
    assert_int_equal(r.exit_code, 0);
    harness_result_free(&r);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    char *cmd = harness_fmt("mpirun --oversubscribe -np 2 %s train --text %s --layers 2 --d-model 16 --d-ff 32 "
                            "--window 4 --seq-len 16 --warmup 5 --threads 1 -q --batch 2 --steps 10 --dropout 0 "
                            "--log %s -o %s", harness_aft_bin(), text, two, o2);
    assert_int_equal(system(cmd), 0);
    free(cmd);
    size_t n1, n2;
    double *a = read_losses(one, &n1), *b = read_losses(two, &n2);
    assert_int_equal(n1, 10);
    assert_int_equal(n2, 10);
    for (size_t i = 0; i < n1; i++)
        if (fabs(a[i] - b[i]) > 1e-5 * fabs(a[i])) fail_msg("step %zu: %.9g one process, %.9g two", i + 1, a[i], b[i]);
    free(a), free(b), free(text), free(one), free(two), free(o1), free(o2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_text),  cmocka_unit_test(test_step_for_step), cmocka_unit_test(test_resume),
        cmocka_unit_test(test_nonfinite), cmocka_unit_test(test_full_disk), cmocka_unit_test(test_sigterm),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_pytorch_loads), cmocka_unit_test(test_mpi),
    };
    return cmocka_run_group_tests(tests, harness_setup, harness_teardown);
}
