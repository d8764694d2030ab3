/* test_state.c - the streaming state: a causal layer or operator fed in
 * chunks gives the one-shot output (and the float64 reference's) within
 * 2e-5 x max(1, |Y|), for every variant and key form, B = 1 and 3, chunks of
 * one row, random sizes, one chunk, and chunks long enough for the layer's
 * pipeline; keys of +-500 and biases of +-250. A state written to a file
 * and read back continues with the same bits as in memory; states made for
 * something else are refused, naming what differs; hostile files are
 * refused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "aft.h"
#include "ref_aft.h"
#include "layers.h"
#include "rng.h"

#define TOL_REL 2e-5

enum { D = LAYER_D, C = LAYER_C, T = LAYER_TMAX, H = LAYER_H };

/* y (B, T, D) from x fed to a state in chunks of sizes[0], sizes[1], ...
 * (sum T); with save_at, the state is written to a file after that many
 * rows and a new state read from it carries on */
static void run_chunks(const layer *L, float *y, const float *x, size_t B, const size_t *sizes, size_t nsizes,
                       size_t save_at)
{
    aft_error err = {{0}};
    aft_state *s;
    assert_int_equal(aft_state_new(&s, &L->p, &L->cfg, B, &err), AFT_OK);
    float *xc = xmalloc(B * T * D * sizeof *xc), *yc = xmalloc(B * T * D * sizeof *yc);
    size_t t0 = 0;
    char path[] = "/tmp/aft_test_state_XXXXXX";
    for (size_t i = 0; i < nsizes; i++) {
        size_t n = sizes[i];
        for (size_t b = 0; b < B; b++) memcpy(xc + b * n * D, x + (b * T + t0) * D, n * D * sizeof *xc);
        if (aft_state_step(s, yc, xc, n, &err) != AFT_OK) fail_msg("step at %zu (+%zu): %s", t0, n, err.msg);
        for (size_t b = 0; b < B; b++) memcpy(y + (b * T + t0) * D, yc + b * n * D, n * D * sizeof *yc);
        t0 += n;
        assert_int_equal(aft_state_position(s), t0);
        if (t0 == save_at) {
            int fd = mkstemp(path);
            assert_true(fd >= 0);
            close(fd);
            assert_int_equal(aft_state_save(s, path, &err), AFT_OK);
            aft_state_free(s);
            assert_int_equal(aft_state_new(&s, &L->p, &L->cfg, B, &err), AFT_OK);
            aft_st_file *f;
            assert_int_equal(aft_st_open(path, &f, &err), AFT_OK);
            if (aft_state_load(s, f, &err) != AFT_OK) fail_msg("load: %s", err.msg);
            aft_st_close(f);
            unlink(path);
            assert_int_equal(aft_state_position(s), t0);
        }
    }
    assert_int_equal(t0, T);
    aft_state_free(s);
    free(xc);
    free(yc);
}

/* max |a - ref| against TOL_REL max(1, max |ref|); a finite wherever ref is */
static void check_close(const char *what, const float *a, const double *ref, size_t n)
{
    double scale = 1.0, e = 0.0;
    for (size_t i = 0; i < n; i++) scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(ref[i]) && !isfinite(a[i])) fail_msg("%s: entry %zu is %g, the reference %g", what, i, a[i], ref[i]);
        double d = fabs((double)a[i] - ref[i]);
        e = d > e ? d : e;
    }
    if (!(e <= TOL_REL * scale)) fail_msg("%s: max |diff| %.3g > %.3g", what, e, TOL_REL * scale);
}

/* the chunkings every case runs: ones, random sizes, one chunk, and chunks
 * long enough for the layer's pipeline before, after and between others */
static size_t chunking(int which, rng *r, size_t *sizes)
{
    size_t n = 0, left = T;
    switch (which) {
    case 0: for (size_t i = 0; i < T; i++) sizes[n++] = 1; return n;
    case 1:
        while (left) {
            size_t k = 1 + (size_t)((rng_sym(r) + 1.0) * 0.5 * 97) % 97;
            k = k < left ? k : left;
            sizes[n++] = k;
            left -= k;
        }
        return n;
    case 2: sizes[0] = T; return 1;
    case 3: sizes[0] = 200; sizes[1] = 3; sizes[2] = 57; return 3;
    case 4: sizes[0] = 10; sizes[1] = 200; sizes[2] = 50; return 3;
    default: sizes[0] = 130; sizes[1] = 130; return 2;
    }
}

static void test_layer_chunkings(void **state)
{
    (void)state;
    size_t *sizes = xmalloc(T * sizeof *sizes);
    for (size_t ci = 0; ci < layer_ncases; ci++)
        for (int extreme = 0; extreme <= 1; extreme++)
            for (size_t B = 1; B <= 3; B += 2) {
                layer L;
                make_layer(&L, &layer_cases[ci], extreme, 1, 100 + ci * 7 + (uint64_t)extreme);
                rng r = {ci * 31 + B};
                float *x = randf(&r, B * T * D, 1.0), *y1 = xmalloc(B * T * D * sizeof *y1),
                      *y = xmalloc(B * T * D * sizeof *y);
                double *ref = xmalloc(B * T * D * sizeof *ref);
                aft_error err = {{0}};
                assert_int_equal(aft_layer_forward(y1, x, &L.p, &L.cfg, B, T, &err), AFT_OK);
                assert_int_equal(ref_aft_layer(ref, x, &L.p, &L.cfg, B, T), 0);
                char what[160];
                snprintf(what, sizeof what, "%s%s B=%zu one-shot", layer_cases[ci].name, extreme ? " extreme" : "", B);
                check_close(what, y1, ref, B * T * D);
                for (int which = 0; which < 6; which++) {
                    size_t n = chunking(which, &r, sizes);
                    run_chunks(&L, y, x, B, sizes, n, 0);
                    snprintf(what, sizeof what, "%s%s B=%zu chunking %d", layer_cases[ci].name, extreme ? " extreme" : "",
                             B, which);
                    check_close(what, y, ref, B * T * D);
                    /* and within the same bound of the one-shot float output */
                    double *y1d = xmalloc(B * T * D * sizeof *y1d);
                    for (size_t i = 0; i < B * T * D; i++) y1d[i] = y1[i];
                    check_close(what, y, y1d, B * T * D);
                    free(y1d);
                }
                free(x); free(y1); free(y); free(ref);
                free_layer(&L);
            }
    free(sizes);
}

/* written to a file mid-way and read back: the same bits as in memory */
static void test_save_load_same_bits(void **state)
{
    (void)state;
    const size_t idx[] = {0, 3, 4, 5, 6}, sizes[] = {1, 120, 7, 1, 1, 100, 30};
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++)
        for (size_t at = 1; at <= 129; at += 128) {
            layer L;
            make_layer(&L, &layer_cases[idx[i]], 0, 1, 900 + i);
            rng r = {77 + i};
            size_t B = 3;
            float *x = randf(&r, B * T * D, 1.0), *ya = xmalloc(B * T * D * sizeof *ya),
                  *yb = xmalloc(B * T * D * sizeof *yb);
            run_chunks(&L, ya, x, B, sizes, 7, 0);
            run_chunks(&L, yb, x, B, sizes, 7, at);
            assert_memory_equal(ya, yb, B * T * D * sizeof *ya);
            free(x); free(ya); free(yb);
            free_layer(&L);
        }
}

/* y (B, T, C) = L's operator on q, k (kc key channels), v, stepped through
 * chunks of sizes[0 .. ns) rows; with reload_at > 0 the state is saved
 * after the chunk that reaches row reload_at and loaded into a new one (its
 * file holds nan_keys: the NaN test's) */
static void step_op_chunks(float *y, const layer *L, const float *q, const float *k, const float *v, size_t B,
                           size_t kc, const size_t *sizes, size_t ns, size_t reload_at, const char *name)
{
    const size_t n = B * T * C;
    size_t t0 = 0;
    aft_error err = {{0}};
    aft_state *s;
    assert_int_equal(aft_state_new_op(&s, &L->p.bias, &L->cfg, B, C, kc, &err), AFT_OK);
    float *qc = xmalloc(n * sizeof *qc), *kc_ = xmalloc(B * T * kc * sizeof *kc_), *vc = xmalloc(n * sizeof *vc),
          *oc = xmalloc(n * sizeof *oc);
    for (size_t i = 0; i < ns; i++) {
        size_t m = sizes[i];
        for (size_t b = 0; b < B; b++) {
            memcpy(qc + b * m * C, q + (b * T + t0) * C, m * C * sizeof *qc);
            memcpy(kc_ + b * m * kc, k + (b * T + t0) * kc, m * kc * sizeof *kc_);
            memcpy(vc + b * m * C, v + (b * T + t0) * C, m * C * sizeof *vc);
        }
        if (aft_state_step_op(s, oc, qc, kc_, vc, m, &err) != AFT_OK) fail_msg("%s: %s", name, err.msg);
        for (size_t b = 0; b < B; b++) memcpy(y + (b * T + t0) * C, oc + b * m * C, m * C * sizeof *oc);
        t0 += m;
        if (reload_at && t0 >= reload_at && t0 - m < reload_at) {
            char path[] = "/tmp/aft_test_state_XXXXXX";
            int fd = mkstemp(path);
            assert_true(fd >= 0);
            close(fd);
            assert_int_equal(aft_state_save(s, path, &err), AFT_OK);
            aft_state_free(s);
            assert_int_equal(aft_state_new_op(&s, &L->p.bias, &L->cfg, B, C, kc, &err), AFT_OK);
            aft_st_file *f;
            assert_int_equal(aft_st_open(path, &f, &err), AFT_OK);
            assert_non_null(aft_st_find(f, "nan_keys"));
            if (aft_state_load(s, f, &err) != AFT_OK) fail_msg("load: %s", err.msg);
            aft_st_close(f);
            unlink(path);
        }
    }
    aft_state_free(s);
    free(qc); free(kc_); free(vc); free(oc);
}

/* the bare operator: q, k, v in chunks against the one-shot and the reference */
static void test_operator_chunkings(void **state)
{
    (void)state;
    const size_t B = 2, n = B * T * C;
    size_t *sizes = xmalloc(T * sizeof *sizes);
    for (size_t ci = 0; ci < layer_ncases; ci++) {
        layer L;
        make_layer(&L, &layer_cases[ci], 1, 1, 500 + ci);
        size_t kc = layer_cases[ci].shared_keys ? H : C;
        rng r = {600 + ci};
        float *q = randf(&r, n, 3), *k = randf(&r, B * T * kc, 500), *v = randf(&r, n, 1);
        float *y1 = xmalloc(n * sizeof *y1), *y = xmalloc(n * sizeof *y);
        double *ref = xmalloc(n * sizeof *ref);
        aft_error err = {{0}};
        assert_int_equal(aft_op_forward(y1, q, k, v, &L.p.bias, &L.cfg, B, T, C, kc, &err), AFT_OK);
        assert_int_equal(ref_aft_op(ref, q, k, v, &L.p.bias, &L.cfg, B, T, C, kc), 0);
        for (int which = 0; which < 4; which++) {
            size_t ns = chunking(which, &r, sizes);
            step_op_chunks(y, &L, q, k, v, B, kc, sizes, ns, 0, layer_cases[ci].name);
            char what[128];
            snprintf(what, sizeof what, "operator %s chunking %d", layer_cases[ci].name, which);
            check_close(what, y, ref, n);
        }
        free(q); free(k); free(v); free(y1); free(y); free(ref);
        free_layer(&L);
    }
    free(sizes);
}

/* A NaN key at row t' of sequence b, channel c (or head): that channel's
 * output from row t' on is NaN, in that sequence only (every variant sees
 * every earlier key), whatever the chunks, and through a save and load
 * (the nan_keys tensor); everything else as the reference. */
static void test_operator_nan_keys(void **state)
{
    (void)state;
    const size_t B = 2, n = B * T * C;
    size_t *sizes = xmalloc(T * sizeof *sizes);
    for (size_t ci = 0; ci < layer_ncases; ci++) {
        layer L;
        make_layer(&L, &layer_cases[ci], 1, 1, 700 + ci);
        size_t kc = layer_cases[ci].shared_keys ? H : C;
        rng r = {800 + ci};
        float *q = randf(&r, n, 3), *k = randf(&r, B * T * kc, 5), *v = randf(&r, n, 1);
        /* (sequence, row, key channel) */
        const size_t bad[3][3] = {{0, 40, 1}, {1, 0, kc - 1}, {1, 150, 0}};
        for (size_t i = 0; i < 3; i++) k[(bad[i][0] * T + bad[i][1]) * kc + bad[i][2]] = NAN;
        float *y = xmalloc(n * sizeof *y);
        double *ref = xmalloc(n * sizeof *ref);
        assert_int_equal(ref_aft_op(ref, q, k, v, &L.p.bias, &L.cfg, B, T, C, kc), 0);
        for (size_t b = 0; b < B; b++)   /* the rule, written out */
            for (size_t t = 0; t < T; t++)
                for (size_t c = 0; c < C; c++) {
                    int want = 0;
                    for (size_t i = 0; i < 3; i++)
                        want |= bad[i][0] == b && bad[i][1] <= t && bad[i][2] == (kc == C ? c : c / (C / kc));
                    if (want != isnan(ref[(b * T + t) * C + c]))
                        fail_msg("%s: reference at b=%zu t=%zu c=%zu: %g", layer_cases[ci].name, b, t, c,
                                 ref[(b * T + t) * C + c]);
                }
        for (int which = 0; which < 4; which++) {
            size_t ns = chunking(which, &r, sizes);
            /* past the first NaN (row 40): written and read back */
            step_op_chunks(y, &L, q, k, v, B, kc, sizes, ns, 60, layer_cases[ci].name);
            char what[128];
            snprintf(what, sizeof what, "operator %s NaN keys, chunking %d", layer_cases[ci].name, which);
            for (size_t i = 0; i < n; i++)
                if (isnan(y[i]) != isnan(ref[i]))
                    fail_msg("%s: b=%zu t=%zu c=%zu: %g, reference %g", what, i / (T * C), i / C % T, i % C,
                             (double)y[i], ref[i]);
            check_close(what, y, ref, n);
        }
        free(q); free(k); free(v); free(y); free(ref);
        free_layer(&L);
    }
    free(sizes);
}

/* saves a state of L (batch B, after `rows` rows) to path */
static void save_state(const layer *L, size_t B, size_t rows, const char *path)
{
    aft_error err = {{0}};
    aft_state *s;
    assert_int_equal(aft_state_new(&s, &L->p, &L->cfg, B, &err), AFT_OK);
    float *x = xmalloc(B * rows * D * sizeof *x), *y = xmalloc(B * rows * D * sizeof *y);
    for (size_t i = 0; i < B * rows * D; i++) x[i] = (float)(i % 7) * 0.1f;
    assert_int_equal(aft_state_step(s, y, x, rows, &err), AFT_OK);
    assert_int_equal(aft_state_save(s, path, &err), AFT_OK);
    aft_state_free(s);
    free(x);
    free(y);
}

/* loading `path` into a state of L with batch B fails naming `word` */
static void expect_refused(const layer *L, size_t B, const char *path, const char *word)
{
    aft_error err = {{0}};
    aft_state *s;
    assert_int_equal(aft_state_new(&s, &L->p, &L->cfg, B, &err), AFT_OK);
    aft_st_file *f;
    assert_int_equal(aft_st_open(path, &f, &err), AFT_OK);
    aft_status st = aft_state_load(s, f, &err);
    aft_st_close(f);
    aft_state_free(s);
    if (st == AFT_OK) fail_msg("a state for something else was accepted (expected a message naming '%s')", word);
    if (!strstr(err.msg, word)) fail_msg("message '%s' does not name '%s'", err.msg, word);
    if (strchr(err.msg, '\n')) fail_msg("message is more than one line: %s", err.msg);
}

static void test_mismatches_refused(void **state)
{
    (void)state;
    char path[] = "/tmp/aft_test_state_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    layer L, other;
    make_layer(&L, &layer_cases[0], 0, 1, 11);
    save_state(&L, 1, 20, path);
    expect_refused(&L, 3, path, "batch");
    make_layer(&other, &layer_cases[0], 0, 1, 12);   /* other weights */
    expect_refused(&other, 1, path, "weights");
    free_layer(&other);
    lcase wider = layer_cases[0];
    wider.window = 9;
    make_layer(&other, &wider, 0, 1, 11);
    expect_refused(&other, 1, path, "window");
    free_layer(&other);
    make_layer(&other, &layer_cases[6], 0, 1, 11);   /* full */
    expect_refused(&other, 1, path, "variant");
    free_layer(&other);
    /* a state of the operator for a layer */
    aft_error err = {{0}};
    aft_state *s;
    assert_int_equal(aft_state_new_op(&s, &L.p.bias, &L.cfg, 1, C, C, &err), AFT_OK);
    assert_int_equal(aft_state_save(s, path, &err), AFT_OK);
    aft_state_free(s);
    expect_refused(&L, 1, path, "kind");
    unlink(path);
    free_layer(&L);
}

/* a file written by aft_st_write with the state's tensors and metadata, one
 * thing spoilt, is refused */
static void test_hostile_states(void **state)
{
    (void)state;
    char path[] = "/tmp/aft_test_state_XXXXXX", bad[] = "/tmp/aft_test_bad_XXXXXX";
    int fd = mkstemp(path), fd2 = mkstemp(bad);
    assert_true(fd >= 0 && fd2 >= 0);
    close(fd);
    close(fd2);
    layer L;
    make_layer(&L, &layer_cases[0], 0, 1, 21);
    save_state(&L, 1, 20, path);
    aft_error err = {{0}};
    aft_st_file *f;
    assert_int_equal(aft_st_open(path, &f, &err), AFT_OK);
    size_t nt = aft_st_count(f), nm = aft_st_metadata_count(f);
    /* spoil: 0 a position that is not a number, 1 a position past the kept
     * rows' tensors, 2 NaN in the sums, 3 a tensor missing, 4 the wrong dtype */
    for (int spoil = 0; spoil < 5; spoil++) {
        const char *names[8], *meta[32];
        aft_tensor ts[8];
        float *copy = NULL;
        size_t k = 0;
        for (size_t i = 0; i < nt; i++) {
            const char *name;
            const aft_tensor *t = aft_st_get(f, i, &name);
            if (spoil == 3 && strcmp(name, "keys") == 0) continue;
            names[k] = name;
            ts[k] = *t;
            ts[k].owned = NULL;
            if (spoil == 2 && strcmp(name, "sums_den") == 0) {
                copy = xmalloc(t->nbytes);
                memcpy(copy, t->data, t->nbytes);
                copy[3] = NAN;
                ts[k].data = copy;
            }
            if (spoil == 4 && strcmp(name, "values") == 0) ts[k].dtype = AFT_I32;
            k++;
        }
        for (size_t i = 0; i < nm; i++) {
            aft_st_metadata(f, i, &meta[2 * i], &meta[2 * i + 1]);
            if (strcmp(meta[2 * i], "position") == 0) meta[2 * i + 1] = spoil == 0 ? "2O" : spoil == 1 ? "4" : meta[2 * i + 1];
        }
        assert_int_equal(aft_st_write(bad, names, ts, k, meta, nm, &err), AFT_OK);
        free(copy);
        aft_state *s;
        assert_int_equal(aft_state_new(&s, &L.p, &L.cfg, 1, &err), AFT_OK);
        aft_st_file *g;
        assert_int_equal(aft_st_open(bad, &g, &err), AFT_OK);
        memset(&err, 0, sizeof err);
        aft_status st = aft_state_load(s, g, &err);
        aft_st_close(g);
        aft_state_free(s);
        if (st == AFT_OK) fail_msg("spoilt state %d accepted", spoil);
        assert_true(err.msg[0] != 0 && !strchr(err.msg, '\n'));
    }
    aft_st_close(f);
    unlink(path);
    unlink(bad);
    free_layer(&L);
}

/* a learned (Tmax, Tmax) bias: a step past Tmax is refused naming both */
static void test_past_tmax_refused(void **state)
{
    (void)state;
    layer L;
    make_layer(&L, &layer_cases[6], 0, 1, 31);   /* full dense, Tmax = T */
    aft_error err = {{0}};
    aft_state *s;
    assert_int_equal(aft_state_new(&s, &L.p, &L.cfg, 1, &err), AFT_OK);
    float *x = xmalloc((T + 1) * D * sizeof *x), *y = xmalloc((T + 1) * D * sizeof *y);
    for (size_t i = 0; i < (T + 1) * D; i++) x[i] = 0.01f * (float)(i % 13);
    assert_int_equal(aft_state_step(s, y, x, T - 1, &err), AFT_OK);
    assert_int_equal(aft_state_step(s, y, x, 2, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "260"));
    assert_non_null(strstr(err.msg, "Tmax"));
    assert_int_equal(aft_state_position(s), T - 1);
    assert_int_equal(aft_state_step(s, y, x, 1, &err), AFT_OK);
    aft_state_free(s);
    free(x);
    free(y);
    free_layer(&L);
}

/* what a state refuses to be made for */
static void test_state_needs_causal(void **state)
{
    (void)state;
    layer L;
    make_layer(&L, &layer_cases[0], 0, 1, 41);
    aft_error err = {{0}};
    aft_state *s;
    L.cfg.causal = 0;
    assert_int_equal(aft_state_new(&s, &L.p, &L.cfg, 1, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "causal"));
    L.cfg.causal = 1;
    uint8_t m[4] = {1, 0, 1, 1};
    L.p.bias.mask = m;
    assert_int_equal(aft_state_new(&s, &L.p, &L.cfg, 1, &err), AFT_ERR_ARG);
    assert_non_null(strstr(err.msg, "mask"));
    free_layer(&L);
}

/* a NaN input makes NaN keys: that row's output and every later one is
 * NaN (the output projection mixes the channels), not the rows before it in
 * its chunk, nor the other sequence's */
static void test_poisoned(void **state)
{
    (void)state;
    layer L;
    make_layer(&L, &layer_cases[0], 0, 1, 51);
    aft_error err = {{0}};
    aft_state *s;
    assert_int_equal(aft_state_new(&s, &L.p, &L.cfg, 2, &err), AFT_OK);
    float x[2 * 3 * D], y[2 * 3 * D];
    for (size_t i = 0; i < 2 * 3 * D; i++) x[i] = 0.1f;
    assert_int_equal(aft_state_step(s, y, x, 3, &err), AFT_OK);
    for (size_t i = 0; i < 2 * 3 * D; i++) assert_true(isfinite(y[i]));
    x[D + 2] = NAN;   /* sequence 0, row 1 of the chunk */
    assert_int_equal(aft_state_step(s, y, x, 3, &err), AFT_OK);
    for (size_t i = 0; i < 2 * 3 * D; i++) assert_int_equal(isnan(y[i]) != 0, i >= D && i < 3 * D);
    x[D + 2] = 0.1f;
    assert_int_equal(aft_state_step(s, y, x, 3, &err), AFT_OK);
    for (size_t i = 0; i < 2 * 3 * D; i++) assert_int_equal(isnan(y[i]) != 0, i < 3 * D);
    aft_state_free(s);
    free_layer(&L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_chunkings),
        cmocka_unit_test(test_save_load_same_bits),
        cmocka_unit_test(test_operator_chunkings),
        cmocka_unit_test(test_mismatches_refused),
        cmocka_unit_test(test_hostile_states),
        cmocka_unit_test(test_past_tmax_refused),
        cmocka_unit_test(test_state_needs_causal),
        cmocka_unit_test(test_poisoned),
        cmocka_unit_test(test_operator_nan_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
