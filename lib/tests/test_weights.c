/* test_weights.c - a layer's tensors found by name (lib/weights.c):
 *  - the biases a layer may lack: every one, or all but the output's
 *    (labml's AFTLocal with bias=False) load; a bias only some of the
 *    projections have is refused, naming the one missing; so is a bias
 *    that the same module at another layer number has and this one lacks;
 *  - the names used (names[]: weights, position bias, biases);
 *  - tensors under the prefix that are none of a layer's: counted and the
 *    first named (as messages show names), for aft_weights_load and for
 *    aft_bias_load alike; local_mask and tensors outside the prefix are not;
 *  - a grid's conv bias, (heads, 2S-1, 2S-1) or one (2S-1, 2S-1) square,
 *    gives the window and heads; without the grid the 3-D bias is refused
 *    and the square read as a 1-D (heads, 2S-1) bias; shapes that are not a
 *    grid's bias are refused, naming the shape wanted; local on a grid
 *    reads (Tmax, Tmax) as on a sequence.
 * The files are written here, in temporary directories. */
#include <dirent.h>
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
#include "rng.h"

enum { D = 4, C = 6, TM = 8, MAXT = 64 };
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static char tmpdir[] = "/tmp/aft_test_weights_XXXXXX";
static char path[128];

/* the tensors of a file being made: names and float32 data of any shape */
typedef struct {
    char names[MAXT][96];
    aft_tensor t[MAXT];
    size_t n;
    rng r;
} layerfile;

static void add(layerfile *lf, const char *name, size_t d0, size_t d1)
{
    assert_true(lf->n < MAXT);
    aft_tensor *t = &lf->t[lf->n];
    memset(t, 0, sizeof *t);
    t->dtype = AFT_F32;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->nelem = d0 * (d1 ? d1 : 1);
    t->nbytes = t->nelem * sizeof(float);
    t->data = t->owned = randf(&lf->r, t->nelem, 0.5);
    snprintf(lf->names[lf->n], sizeof lf->names[0], "%s", name);
    lf->n++;
}

/* one layer under prefix: weights with stems (query, key, value, output or
 * rish-16's), the biases whose letter is in `biases` ("qkvo": every one),
 * and a [TM, TM] pos_bias */
static void add_layer(layerfile *lf, const char *prefix, const char *const stems[4], const char *biases)
{
    static const char letters[4] = {'q', 'k', 'v', 'o'};
    const size_t rows[4] = {C, C, C, D}, cols[4] = {D, D, D, C};
    char name[96];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "%s%s.weight", prefix, stems[i]);
        add(lf, name, rows[i], cols[i]);
        if (!strchr(biases, letters[i])) continue;
        snprintf(name, sizeof name, "%s%s.bias", prefix, stems[i]);
        add(lf, name, rows[i], 0);
    }
    snprintf(name, sizeof name, "%spos_bias", prefix);
    add(lf, name, TM, TM);
}

static const char *const labml[4] = {"query", "key", "value", "output"};
static const char *const rish[4] = {"to_q", "to_k", "to_v", "project"};

static aft_st_file *write_open(layerfile *lf)
{
    const char *names[MAXT];
    for (size_t i = 0; i < lf->n; i++) names[i] = lf->names[i];
    aft_error err = {{0}};
    if (aft_st_write(path, names, lf->t, lf->n, NULL, 0, &err) != AFT_OK) fail_msg("write: %s", err.msg);
    for (size_t i = 0; i < lf->n; i++) aft_tensor_free(&lf->t[i]);
    lf->n = 0;
    aft_st_file *f;
    if (aft_st_open(path, &f, &err) != AFT_OK) fail_msg("open: %s", err.msg);
    return f;
}

/* the layer under prefix loads (full variant); w is the caller's to free */
static void loads(const aft_st_file *f, const char *prefix, aft_weights *w)
{
    aft_error err = {{0}};
    if (aft_weights_load(f, prefix, AFT_FULL, w, &err) != AFT_OK) fail_msg("'%s': %s", prefix, err.msg);
}

/* the layer under prefix is refused with exactly the message want */
static void refused(const aft_st_file *f, const char *prefix, const char *want)
{
    aft_weights w;
    aft_error err = {{0}};
    if (aft_weights_load(f, prefix, AFT_FULL, &w, &err) == AFT_OK) fail_msg("'%s' loaded", prefix);
    if (strcmp(err.msg, want) != 0) fail_msg("'%s':\n got  %s\n want %s", prefix, err.msg, want);
}

static void test_bias_sets(void **state)
{
    (void)state;
    layerfile lf = {.r = {1}};
    add_layer(&lf, "all.", labml, "qkvo");
    add_layer(&lf, "none.", labml, "");
    add_layer(&lf, "out.", labml, "o");          /* labml's AFTLocal with bias=False */
    add_layer(&lf, "rish.", rish, "qkvo");
    add_layer(&lf, "noval.", labml, "qko");
    add_layer(&lf, "noout.", rish, "qkv");
    add_layer(&lf, "keyonly.", labml, "k");
    aft_st_file *f = write_open(&lf);
    aft_weights w;
    loads(f, "all.", &w);
    assert_string_equal(w.names[6], "all.query.bias");
    assert_string_equal(w.names[9], "all.output.bias");
    assert_string_equal(w.names[4], "all.pos_bias");
    assert_non_null(w.p.bq);
    assert_non_null(w.p.bo);
    aft_weights_free(&w);
    loads(f, "none.", &w);
    for (int i = 6; i < 10; i++) assert_string_equal(w.names[i], "");
    assert_null(w.p.bq);
    assert_null(w.p.bo);
    aft_weights_free(&w);
    loads(f, "out.", &w);
    assert_null(w.p.bq);
    assert_null(w.p.bk);
    assert_null(w.p.bv);
    assert_non_null(w.p.bo);
    assert_string_equal(w.names[9], "out.output.bias");
    aft_weights_free(&w);
    loads(f, "rish.", &w);
    assert_string_equal(w.names[8], "rish.to_v.bias");
    aft_weights_free(&w);
    refused(f, "noval.", "missing tensor 'noval.value.bias' beside 'noval.query.bias': a layer has a bias for every "
                         "projection, for none, or for its output alone");
    refused(f, "noout.", "missing tensor 'noout.project.bias' beside 'noout.to_q.bias': a layer has a bias for every "
                         "projection, for none, or for its output alone");
    refused(f, "keyonly.", "missing tensor 'keyonly.query.bias' beside 'keyonly.key.bias': a layer has a bias for "
                           "every projection, for none, or for its output alone");
    aft_st_close(f);
}

/* the same module at other layer numbers: its biases are this layer's too */
static void test_peers(void **state)
{
    (void)state;
    layerfile lf = {.r = {2}};
    add_layer(&lf, "blocks.0.attn.", labml, "qkvo");
    add_layer(&lf, "blocks.1.attn.", labml, "o");
    add_layer(&lf, "blocks.2.attn.", rish, "qkvo");   /* the other names count as the same biases */
    add_layer(&lf, "blocks.10.attn.", labml, "qkvo");
    add_layer(&lf, "stack.3.attn.", labml, "o");        /* another module: not a peer */
    add_layer(&lf, "solo.", labml, "o");                /* no number: no peers */
    aft_st_file *f = write_open(&lf);
    aft_weights w;
    refused(f, "blocks.1.attn.",
            "missing tensor 'blocks.1.attn.query.bias', which the layer 'blocks.0.attn.' has");
    /* the ones with every bias lack nothing their peers have */
    loads(f, "blocks.0.attn.", &w);
    aft_weights_free(&w);
    loads(f, "blocks.2.attn.", &w);
    aft_weights_free(&w);
    loads(f, "blocks.10.attn.", &w);
    aft_weights_free(&w);
    loads(f, "stack.3.attn.", &w);
    aft_weights_free(&w);
    loads(f, "solo.", &w);
    aft_weights_free(&w);
    aft_st_close(f);
    /* every layer without its query, key and value biases: all load */
    add_layer(&lf, "blocks.0.attn.", labml, "o");
    add_layer(&lf, "blocks.1.attn.", labml, "o");
    f = write_open(&lf);
    loads(f, "blocks.1.attn.", &w);
    aft_weights_free(&w);
    aft_st_close(f);
}

/* tensors under the prefix that no layer has: counted, the first named */
static void test_unexpected(void **state)
{
    (void)state;
    layerfile lf = {.r = {3}};
    add_layer(&lf, "a.", labml, "qkvo");
    add(&lf, "a.local_mask", TM, TM);    /* labml's buffer: a layer's own */
    add(&lf, "a.norm.weight", D, 0);
    add(&lf, "a.query.scale", C, 0);
    add(&lf, "b.extra", D, 0);           /* another prefix's */
    add_layer(&lf, "b.", rish, "o");
    aft_st_file *f = write_open(&lf);
    aft_weights w;
    loads(f, "a.", &w);
    assert_int_equal(w.n_unexpected, 2);
    assert_string_equal(w.unexpected, "a.norm.weight");
    aft_weights_free(&w);
    loads(f, "b.", &w);
    assert_int_equal(w.n_unexpected, 1);
    assert_string_equal(w.unexpected, "b.extra");
    aft_weights_free(&w);
    /* the bare operator's load counts the same way (projections are a layer's) */
    aft_error err = {{0}};
    memset(&w, 0, sizeof w);
    assert_int_equal(aft_bias_load(f, "a.", AFT_FULL, &w, &err), AFT_OK);
    assert_int_equal(w.n_unexpected, 2);
    assert_string_equal(w.unexpected, "a.norm.weight");
    aft_weights_free(&w);
    aft_st_close(f);
    /* none at all: 0 and "" */
    add_layer(&lf, "", labml, "o");
    f = write_open(&lf);
    loads(f, "", &w);
    assert_int_equal(w.n_unexpected, 0);
    assert_string_equal(w.unexpected, "");
    aft_weights_free(&w);
    aft_st_close(f);
}

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(tmpdir)) return -1;
    snprintf(path, sizeof path, "%s/layer.safetensors", tmpdir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    rmdir(tmpdir);
    return 0;
}

/* ---------------------------------------------------------------- loading a grid's bias */

static char grid_tmpdir[64];

static int setup_tmp(void **state)
{
    (void)state;
    snprintf(grid_tmpdir, sizeof grid_tmpdir, "/tmp/aft_test_grid_XXXXXX");
    return mkdtemp(grid_tmpdir) ? 0 : -1;
}

static int teardown_tmp(void **state)
{
    (void)state;
    DIR *d = opendir(grid_tmpdir);
    if (d) {
        const struct dirent *e;
        char p[512];
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') {
                snprintf(p, sizeof p, "%s/%s", grid_tmpdir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(grid_tmpdir);
    return 0;
}

static int contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (const char *p = hay; *p; p++)
        if (strncasecmp(p, needle, n) == 0) return 1;
    return 0;
}

/* a layer's weights (D = C = 4, key of kc channels) and a position bias of
 * the given shape, written to grid_tmpdir/name; opened */
static aft_st_file *layer_file(const char *name, const size_t *bshape, size_t bdims, size_t kc)
{
    static float wq[16], wk[16], wv[16], wo[16], pb[4 * 7 * 7];
    for (size_t i = 0; i < N_OF(pb); i++) pb[i] = (float)i * 0.01f;
    aft_tensor t[5];
    memset(t, 0, sizeof t);
    const float *data[5] = {wq, wk, wv, wo, pb};
    for (int i = 0; i < 5; i++) {
        t[i].dtype = AFT_F32;
        t[i].data = data[i];
        t[i].ndim = i < 4 ? 2 : bdims;
        t[i].shape[0] = i == 1 ? kc : 4;
        t[i].shape[1] = 4;
        if (i == 4)
            for (size_t j = 0; j < bdims; j++) t[i].shape[j] = bshape[j];
        t[i].nelem = 1;
        for (size_t j = 0; j < t[i].ndim; j++) t[i].nelem *= t[i].shape[j];
        t[i].nbytes = t[i].nelem * sizeof(float);
    }
    const char *names[5] = {"to_q.weight", "to_k.weight", "to_v.weight", "project.weight", "pos_bias"};
    char file[128];
    snprintf(file, sizeof file, "%s/%s", grid_tmpdir, name);
    aft_error err = {{0}};
    if (aft_st_write(file, names, t, 5, NULL, 0, &err) != AFT_OK) fail_msg("writing %s: %s", file, err.msg);
    aft_st_file *f = NULL;
    if (aft_st_open(file, &f, &err) != AFT_OK) fail_msg("opening %s: %s", file, err.msg);
    return f;
}

static void test_grid_weights(void **state)
{
    (void)state;
    aft_error err = {{0}};
    aft_weights w;
    /* (heads, 2S-1, 2S-1): per head; the window and heads come from it */
    aft_st_file *f = layer_file("per_head.safetensors", (const size_t[]){4, 5, 5}, 3, 4);
    assert_int_equal(aft_weights_load_grid(f, "", AFT_CONV, 1, &w, &err), AFT_OK);
    assert_int_equal(w.conv_window, 3);
    assert_int_equal(w.conv_heads, 4);
    assert_true(w.p.bias.conv_2d && w.p.bias.conv_len == 5 && w.p.bias.conv_rows == 4);
    assert_true(w.p.bias.conv[5 * 5 + 2] == 27 * 0.01f);   /* head 1, row 0, column 2: entry 27 */
    aft_config cfg = {0};
    cfg.variant = AFT_CONV;
    cfg.window = AFT_WINDOW_FROM_BIAS;
    cfg.grid_h = 2;
    cfg.grid_w = 3;
    assert_int_equal(aft_config_settle(&cfg, &w.p.bias, 4, 4, &err), AFT_OK);
    assert_int_equal(cfg.window, 3);
    assert_int_equal(cfg.heads, 4);
    aft_weights_free(&w);
    /* without the grid the 3-D bias is refused, naming the grid */
    assert_int_not_equal(aft_weights_load(f, "", AFT_CONV, &w, &err), AFT_OK);
    assert_true(contains_ci(err.msg, "grid"));
    aft_st_close(f);

    /* (2S-1, 2S-1): one square for every head */
    f = layer_file("shared.safetensors", (const size_t[]){7, 7}, 2, 4);
    assert_int_equal(aft_bias_load_grid(f, "", AFT_CONV, 1, &w, &err), AFT_OK);
    assert_int_equal(w.conv_window, 4);
    assert_int_equal(w.conv_heads, 1);
    assert_true(w.p.bias.conv_2d && w.p.bias.conv_rows == 1);
    aft_weights_free(&w);
    /* without the grid the same tensor is a (heads = 7, 2S-1 = 7) 1-D bias */
    assert_int_equal(aft_bias_load(f, "", AFT_CONV, &w, &err), AFT_OK);
    assert_true(!w.p.bias.conv_2d && w.p.bias.conv_rows == 7);
    aft_weights_free(&w);
    aft_st_close(f);

    /* not square, 1-D, even: refused on a grid */
    const size_t shapes[][3] = {{4, 5, 0}, {5, 0, 0}, {4, 4, 4}, {2, 5, 3}};
    const size_t dims[] = {2, 1, 3, 3};
    for (size_t i = 0; i < N_OF(dims); i++) {
        char name[32];
        snprintf(name, sizeof name, "bad%zu.safetensors", i);
        f = layer_file(name, shapes[i], dims[i], 4);
        memset(&err, 0, sizeof err);
        assert_int_not_equal(aft_weights_load_grid(f, "", AFT_CONV, 1, &w, &err), AFT_OK);
        if (!contains_ci(err.msg, "2*window-1, 2*window-1")) fail_msg("bias %zu: \"%s\"", i, err.msg);
        aft_st_close(f);
    }
    /* local on a grid reads (Tmax, Tmax) as on a sequence */
    f = layer_file("local.safetensors", (const size_t[]){7, 7}, 2, 4);
    assert_int_equal(aft_weights_load_grid(f, "", AFT_LOCAL, 1, &w, &err), AFT_OK);
    assert_true(w.p.bias.kind == AFT_BIAS_DENSE && w.p.bias.tmax == 7);
    aft_weights_free(&w);
    aft_st_close(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bias_sets),
        cmocka_unit_test(test_peers),
        cmocka_unit_test(test_unexpected),
        cmocka_unit_test_setup_teardown(test_grid_weights, setup_tmp, teardown_tmp),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
