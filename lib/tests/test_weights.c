/* test_weights.c - a layer's tensors found by name (lib/weights.c):
 *  - the biases a layer may lack: every one, or all but the output's
 *    (labml's AFTLocal with bias=False) load; a bias only some of the
 *    projections have is refused, naming the one missing; so is a bias
 *    that the same module at another layer number has and this one lacks;
 *  - the names used (names[]: weights, position bias, biases);
 *  - tensors under the prefix that are none of a layer's: counted and the
 *    first named (as messages show names), for aft_weights_load and for
 *    aft_bias_load alike; local_mask and tensors outside the prefix are not.
 * The files are written here, in a temporary directory. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bias_sets),
        cmocka_unit_test(test_peers),
        cmocka_unit_test(test_unexpected),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
