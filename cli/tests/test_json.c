/* test_json.c - the JSON aft writes and the list of its keys in man/aft.1
 * (JSON OUTPUT) agree: every command that writes JSON runs here on small
 * inputs (run, grad, generate, model and train --timing; bench --json plain, --stream,
 * --grad, --impl both, with the ceiling, --precision bf16 with the bf16
 * floor, and --generate; info, compare and
 * mask --json; run --timing under mpirun when there is one), every key it
 * writes, at any depth, must be listed, and every key listed must be
 * written by one of them. A key holding a quantity ends in its unit
 * ("compute_ms", never "ms_compute"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aft.h"
#include "harness.h"

#define MAX_KEYS 256

typedef struct {
    char *name[MAX_KEYS];
    char *where[MAX_KEYS];   /* written: the first command seen writing it; listed: its subsection */
    size_t n;
} keyset;

static char *dir;
static keyset written;

static void keyset_add(keyset *s, const char *name, const char *where)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->name[i], name) == 0) return;
    assert_true(s->n < MAX_KEYS);
    s->name[s->n] = strdup(name);
    s->where[s->n] = strdup(where);
    s->n++;
}

static int keyset_has(const keyset *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->name[i], name) == 0) return 1;
    return 0;
}

static void keyset_free(keyset *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->name[i]);
        free(s->where[i]);
    }
    s->n = 0;
}

/* every key of v at any depth into written; "metadata" holds a file's own
 * keys, which are not aft's */
static void collect(const cJSON *v, const char *where)
{
    for (const cJSON *c = v->child; c; c = c->next) {
        if (cJSON_IsObject(v)) keyset_add(&written, c->string, where);
        if (c->string && strcmp(c->string, "metadata") == 0) continue;
        collect(c, where);
    }
}

/* text holds one JSON document, or one a line */
static void collect_text(const char *text, const char *where)
{
    /* one document and nothing after it (cJSON_Parse would take the first
     * of several lines and drop the rest) */
    cJSON *j = cJSON_ParseWithOpts(text, NULL, 1);
    if (j) {
        collect(j, where);
        cJSON_Delete(j);
        return;
    }
    char *copy = strdup(text), *save = NULL;
    assert_non_null(copy);
    int lines = 0;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save), lines++) {
        j = cJSON_Parse(line);
        if (!j) fail_msg("%s: a line that is not JSON: %s", where, line);
        collect(j, where);
        cJSON_Delete(j);
    }
    free(copy);
    if (!lines) fail_msg("%s wrote no JSON", where);
}

static char *path(const char *name) { return harness_path(dir, name); }

/* runs aft with args, which must succeed; its stdout's keys (stdout_json)
 * or those of the file json_file into written; returns stdout, malloc'd */
static char *run_json(const char *const *args, int stdout_json, const char *json_file)
{
    char where[256] = "aft";
    for (int i = 0; args[i] && i < 3; i++) {
        strncat(where, " ", sizeof where - strlen(where) - 1);
        strncat(where, args[i], sizeof where - strlen(where) - 1);
    }
    harness_result r;
    assert_int_equal(harness_run(&r, args, NULL, 0), 0);
    if (r.exit_code != 0) fail_msg("%s ...: exit %d: %s", where, r.exit_code, r.err);
    if (stdout_json) collect_text(r.out, where);
    if (json_file) {
        char *text;
        assert_int_equal(harness_read_file(json_file, &text, NULL), 0);
        collect_text(text, where);
        free(text);
    }
    char *out = strdup(r.out);
    harness_result_free(&r);
    return out;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static char *model_path(void)
{
    char *p;
    assert_true(asprintf(&p, "%s/model/labml_aft_fortunes.safetensors", harness_testdata()) > 0);
    return p;
}

/* run --timing under mpirun -np 2, when mpirun runs an aft built with MPI:
 * 1 if it did (its keys are in written) */
static int run_under_mpi(const char *x, const char *y, const char *t)
{
    /* not under make test-valgrind: Open MPI's runtime is not clean under
     * memcheck (test_mpi.c); make test checks these keys */
    if (!harness_aft_is_binary()) return 0;
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    char *cmd;
    assert_true(asprintf(&cmd, "command -v mpirun >/dev/null 2>&1 && timeout 120 mpirun --oversubscribe -np 2 '%s' "
                               "run --variant local --window 2 --threads 1 '%s' -o '%s' --timing '%s' >/dev/null 2>&1",
                         harness_aft_bin(), x, y, t) > 0);
    int st = system(cmd);
    free(cmd);
    char *text;
    if (st != 0 || harness_read_file(t, &text, NULL) != 0) return 0;
    collect_text(text, "mpirun aft run --timing");
    free(text);
    return 1;
}

/* the keys listed in man/aft.1's JSON OUTPUT: each entry ".TP", ".B KEY";
 * where: the subsection it is in */
static void listed_keys(keyset *listed)
{
    char p[4096], *man;
    snprintf(p, sizeof p, "%s/../man/aft.1", harness_testdata());
    assert_int_equal(harness_read_file(p, &man, NULL), 0);
    char *sec = strstr(man, "\n.SH JSON OUTPUT\n");
    if (!sec) fail_msg("man/aft.1 has no section JSON OUTPUT");
    sec++;
    char *end = strstr(sec + 1, "\n.SH ");
    if (end) end[1] = '\0';
    char group[128] = "";
    for (char *line = sec; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (strncmp(line, ".SS ", 4) == 0) snprintf(group, sizeof group, "%s", line + 4);
        if (strcmp(line, ".TP") == 0 && nl && strncmp(nl + 1, ".B ", 3) == 0) {
            char *key = nl + 4, *knl = strchr(key, '\n');
            if (knl) *knl = '\0';
            if (keyset_has(listed, key)) fail_msg("man/aft.1, JSON OUTPUT, lists %s twice", key);
            keyset_add(listed, key, group);
            if (knl) *knl = '\n';
        }
        line = nl ? nl + 1 : NULL;
    }
    free(man);
    if (listed->n < 50) fail_msg("man/aft.1, JSON OUTPUT, lists only %zu keys: is its form '.TP', '.B KEY'?", listed->n);
}

/* a key naming a unit ("ms", "us", "bytes") ends in it: "_ms", "_bytes",
 * "_us_per_token", "_per_s", or is the unit alone ("bytes") */
static void check_unit_last(const char *key)
{
    static const char *const units[] = {"_ms", "_us_per_token", "_bytes", "_per_s"};
    static const char *const words[] = {"ms", "us", "bytes"};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        size_t n = strlen(key), m = strlen(units[u]);
        if (strcmp(key, units[u] + 1) == 0 || (n > m && strcmp(key + n - m, units[u]) == 0)) return;
    }
    char *copy = strdup(key), *save = NULL;
    for (char *w = strtok_r(copy, "_", &save); w; w = strtok_r(NULL, "_", &save))
        for (size_t u = 0; u < sizeof words / sizeof words[0]; u++)
            if (strcmp(w, words[u]) == 0) fail_msg("JSON key %s names a unit (%s) that does not end it", key, w);
    free(copy);
}

static void test_keys_documented(void **state)
{
    (void)state;
    if (strstr(harness_aft_bin(), "valgrind")) {
        print_message("skipped: aft bench starts its children through /proc/self/exe (valgrind's binary)\n");
        skip();
    }
    char *x = path("x.npy"), *y = path("y.npy"), *t = path("t.json"), *g = path("g.safetensors");
    char *a = path("a.safetensors"), *b = path("b.safetensors"), *m = model_path();
    float data[2 * 6 * 8];
    for (size_t i = 0; i < sizeof data / sizeof data[0]; i++) data[i] = (float)(i % 13) / 13.0f - 0.5f;
    aft_tensor xt = harness_tensor(AFT_F32, data, 3, (size_t[]){2, 6, 8});
    aft_tensor pair[2] = {harness_tensor(AFT_F32, data, 1, (size_t[]){4}), harness_tensor(AFT_F32, data, 1,
                                                                                          (size_t[]){4})};
    const char *names_a[2] = {"both", "a_only"}, *names_b[2] = {"both", "b_only"};
    aft_error err;
    assert_int_equal(aft_npy_write(x, &xt, &err), AFT_OK);
    assert_int_equal(aft_st_write(a, names_a, pair, 2, NULL, 0, &err), AFT_OK);
    assert_int_equal(aft_st_write(b, names_b, pair, 2, NULL, 0, &err), AFT_OK);

    /* the layer on a grid (for "grid") with its phases, and its gradients */
    free(run_json(ARGS("run", "--variant", "local", "--window", "2", "--grid", "2,3", "--repeat", "2", x, "-o", y,
                       "--timing", t),
                  0, t));
    free(run_json(ARGS("grad", "--variant", "local", "--window", "2", x, "-o", g, "--timing", t), 0, t));
    /* the model: generating, and bench's timing of it */
    free(run_json(ARGS("generate", "--weights", m, "--prompt", "It", "-n", "3", "--greedy", "--timing", t), 0, t));
    char *tok = path("tok.npy");
    int32_t ids[4] = {1, 2, 3, 4};
    aft_tensor tt = harness_tensor(AFT_I32, ids, 1, (size_t[]){4});
    assert_int_equal(aft_npy_write(tok, &tt, &err), AFT_OK);
    free(run_json(ARGS("model", "--weights", m, tok, "-o", y, "--timing", t), 0, t));
    /* training: a few steps of a small model on the model's README */
    char *text = path("text.txt"), *ck = path("trained.safetensors");
    const char *words = "the quick brown fox jumps over the lazy dog; the quick brown fox jumps over the dog. ";
    assert_int_equal(harness_write_file(text, words, strlen(words)), 0);
    free(run_json(ARGS("train", "--text", text, "--layers", "1", "--d-model", "8", "--d-ff", "8", "--window", "2",
                       "--seq-len", "8", "--batch", "2", "--steps", "2", "--threads", "1", "-o", ck, "--timing", t),
                  0, t));
    free(text), free(ck);
    free(tok);
    free(run_json(ARGS("bench", "--generate", "--weights", m, "--seq-len", "4", "--repeat", "1", "--threads", "1",
                       "--json"),
                  1, NULL));
    /* bench with everything it can add to a row, the ceiling included */
    free(run_json(ARGS("bench", "--seq-len", "16", "--d-model", "8", "--variant", "local", "--window", "2", "--causal",
                       "--stream", "--chunk", "4", "--grad", "--impl", "both", "--repeat", "1", "--json"),
                  1, NULL));
    /* bench in both precisions, the bf16 floor measured where the CPU has
     * a bf16 engine; without one (AFT_KERNELS=avx2, base) no command can
     * write its two keys, which count as written */
    free(run_json(ARGS("bench", "--seq-len", "16", "--d-model", "8", "--variant", "simple", "--repeat", "1",
                       "--precision", "bf16", "--json"),
                  1, NULL));
    if (strcmp(aft_bf16_engine_in_use(), "none") == 0) {
        keyset_add(&written, "bf16_floor_gflop_per_s", "aft bench --precision bf16 (no engine here)");
        keyset_add(&written, "bf16_floor_fraction", "aft bench --precision bf16 (no engine here)");
    }
    /* files: a .npy (its "npy" object), a .safetensors with metadata */
    free(run_json(ARGS("info", "--json", x, m), 1, NULL));
    /* a tensor against a tensor, and two files of them by name */
    free(run_json(ARGS("compare", "--json", x, x), 1, NULL));
    harness_result r;
    assert_int_equal(HARNESS_RUN(&r, "compare", "--json", a, b), 0);
    assert_int_equal(r.exit_code, 1);   /* a name in one file only: not close */
    collect_text(r.out, "aft compare --json (files)");
    harness_result_free(&r);
    /* mask: an array of arrays, no keys, the same as --format json */
    char *mj = run_json(ARGS("mask", "--len", "4", "--window", "2", "--json"), 1, NULL);
    char *mf = run_json(ARGS("mask", "--len", "4", "--window", "2", "--format", "json"), 0, NULL);
    assert_string_equal(mj, mf);
    cJSON *mask = cJSON_Parse(mj);
    assert_true(cJSON_IsArray(mask) && cJSON_GetArraySize(mask) == 4);
    cJSON_Delete(mask);
    free(mj);
    free(mf);
    int mpi = run_under_mpi(x, y, t);
    if (!mpi) print_message("no mpirun running an aft built with MPI: the keys under MPI are not checked\n");

    keyset listed = {0};
    listed_keys(&listed);
    for (size_t i = 0; i < written.n; i++) {
        check_unit_last(written.name[i]);
        if (!keyset_has(&listed, written.name[i]))
            fail_msg("%s writes the JSON key %s, which man/aft.1 (JSON OUTPUT) does not list", written.where[i],
                     written.name[i]);
    }
    for (size_t i = 0; i < listed.n; i++) {
        if (!mpi && strstr(listed.where[i], "MPI")) continue;
        if (!keyset_has(&written, listed.name[i]))
            fail_msg("man/aft.1 (JSON OUTPUT, %s) lists the key %s, which no command here wrote", listed.where[i],
                     listed.name[i]);
    }
    keyset_free(&listed);
    free(x); free(y); free(t); free(g); free(a); free(b); free(m);
}

static int setup(void **state)
{
    (void)state;
    dir = harness_mkdtemp();
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    keyset_free(&written);
    harness_rmtree(dir);
    free(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_documented),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
