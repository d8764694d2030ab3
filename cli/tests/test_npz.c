/* test_npz.c - .npz archives through every command: aft info (text and
 * --json), aft run --weights x.npz and aft run x.npz (the bare operator),
 * aft compare a.npz:name, aft convert (members out, .npy files packed in,
 * .npz to .safetensors and back), --max-memory, and formats told apart by
 * their first bytes. The numbers are checked against what numpy and PyTorch
 * wrote (testdata/npz, made by make_npz_fixtures.py; testdata/torch). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "aft.h"
#include "harness.h"

/* testdata/SUB/NAME, in rotating buffers */
static const char *td(const char *sub, const char *name)
{
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s/%s", harness_testdata(), sub, name);
    return b;
}

static const char *tmp(const char *name)
{
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", harness_dir(), name);
    return b;
}

/* runs aft and requires exit status want; returns the result to free */
static void run_expect(harness_result *r, int want, const char *const *args)
{
    assert_int_equal(harness_run(r, args, NULL, 0), 0);
    if (r->exit_code != want) {
        print_error("aft %s %s ...: exit %d, want %d\nstderr: %s\n", args[0], args[1] ? args[1] : "", r->exit_code,
                    want, r->err);
        fail();
    }
}
#define RUN(r, want, ...) run_expect((r), (want), (const char *const[]){__VA_ARGS__, NULL})

/* a data error: exit 1, one line on stderr holding want, nothing on stdout */
static void expect_error(const char *want, const char *const *args)
{
    harness_result r;
    run_expect(&r, 1, args);
    if (harness_count_lines(r.err) != 1 || !strstr(r.err, want)) {
        print_error("want one line holding \"%s\", got: %s", want, r.err);
        fail();
    }
    assert_int_equal(r.out_len, 0);
    harness_result_free(&r);
}
#define EXPECT_ERROR(want, ...) expect_error((want), (const char *const[]){__VA_ARGS__, NULL})

static void read_tensor(const char *path, aft_tensor *t)
{
    aft_error err;
    if (aft_npy_read(path, t, NULL, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
}

/* |got - want| <= atol + rtol |want| for every element, as float64 */
static void assert_close(const char *what, const aft_tensor *got, const aft_tensor *want, double rtol, double atol)
{
    assert_int_equal(got->nelem, want->nelem);
    float *g, *w;
    aft_error err;
    assert_int_equal(aft_tensor_to_f32(got, &g, &err), AFT_OK);
    assert_int_equal(aft_tensor_to_f32(want, &w, &err), AFT_OK);
    for (size_t i = 0; i < got->nelem; i++)
        if (!(fabs((double)g[i] - w[i]) <= atol + rtol * fabs(w[i])))
            fail_msg("%s: element %zu: %.9g, want %.9g", what, i, (double)g[i], (double)w[i]);
    free(g);
    free(w);
}

/* ---------------------------------------------------------------- aft info */

static void test_info(void **state)
{
    (void)state;
    harness_result r;
    RUN(&r, 0, "info", td("npz", "savez.npz"));
    assert_non_null(strstr(r.out, "savez.npz: npz, 17 tensors\n"));
    assert_non_null(strstr(r.out, "  f4                          F32    [2, 3, 4]     96\n"));
    assert_non_null(strstr(r.out, "  blocks.0.attn.query.weight  F32    [3, 4]        48\n"));
    assert_non_null(strstr(r.out, "  scalar_u8                   U64    []             8\n"));
    harness_result_free(&r);

    /* --json: the schema of .safetensors, format "npz", members in order */
    RUN(&r, 0, "info", "--json", td("npz", "savez_compressed.npz"), td("npz", "empty.npz"));
    assert_int_equal(harness_count_lines(r.out), 2);
    assert_non_null(strstr(r.out, "\"format\":\"npz\",\"tensors\":[{\"name\":\"f2\",\"dtype\":\"F16\",\"shape\":[2,3,4],\"bytes\":48},"
                                  "{\"name\":\"f4\","));
    assert_non_null(strstr(r.out, "{\"name\":\"empty_f4\",\"dtype\":\"F32\",\"shape\":[0,3],\"bytes\":0}"));
    assert_non_null(strstr(r.out, "\"metadata\":{}}\n"));
    assert_non_null(strstr(r.out, "empty.npz\",\"format\":\"npz\",\"tensors\":[],\"metadata\":{}}\n"));
    harness_result_free(&r);

    /* told apart by the first bytes, not the name */
    char *copy = NULL;
    size_t len;
    assert_int_equal(harness_read_file(td("npz", "zip64.npz"), &copy, &len), 0);
    assert_int_equal(harness_write_file(tmp("looks_like.npy"), copy, len), 0);
    free(copy);
    RUN(&r, 0, "info", "--json", tmp("looks_like.npy"));
    assert_non_null(strstr(r.out, "\"format\":\"npz\""));
    harness_result_free(&r);
    assert_int_equal(harness_write_file(tmp("notes.txt"), "hello\n", 6), 0);
    EXPECT_ERROR("aft info: ", "info", tmp("notes.txt"));
    EXPECT_ERROR("notes.txt: not a .npy, .npz or .safetensors file", "info", tmp("notes.txt"));
    remove(tmp("looks_like.npy"));
}

/* ---------------------------------------------------------------- aft run */

/* the PyTorch cases' weights as numpy stores them give PyTorch's outputs */
static void test_run_weights(void **state)
{
    (void)state;
    static const struct { const char *name; const char *const args[8]; } cases[] = {
        {"rish_full", {"--variant", "full", "--layout", "btd", NULL}},
        {"labml_local", {"--variant", "local", "--window", "4", "--causal", "--layout", "tbd", NULL}},
        {"rish_simple", {"--variant", "simple", NULL}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int deflated = 0; deflated <= 1; deflated++) {
            char wname[128], xdir[128];
            snprintf(wname, sizeof wname, "weights_%s%s.npz", cases[c].name, deflated ? "_deflated" : "");
            snprintf(xdir, sizeof xdir, "torch/%s", cases[c].name);
            const char *args[24];
            size_t n = 0;
            args[n++] = "run";
            args[n++] = "--weights";
            args[n++] = td("npz", wname);
            for (size_t k = 0; cases[c].args[k]; k++) args[n++] = cases[c].args[k];
            if (strcmp(cases[c].name, "labml_local") == 0) {
                args[n++] = "--mask";
                args[n++] = td(xdir, "mask.npy");
            }
            args[n++] = td(xdir, "x.npy");
            args[n++] = "-o";
            args[n++] = tmp("y.npy");
            args[n] = NULL;
            harness_result r;
            run_expect(&r, 0, args);
            harness_result_free(&r);
            aft_tensor got, want;
            read_tensor(tmp("y.npy"), &got);
            read_tensor(td(xdir, "y.npy"), &want);
            assert_close(wname, &got, &want, 1e-4, 1e-5);
            aft_tensor_free(&got);
            aft_tensor_free(&want);
        }
}

/* q, k, v from numpy's archive; the output numpy computed in float64 */
static void test_run_bare(void **state)
{
    (void)state;
    harness_result r;
    RUN(&r, 0, "run", "--variant", "simple", td("npz", "qkv.npz"), "-o", tmp("bare.npy"));
    harness_result_free(&r);
    aft_tensor got, want;
    read_tensor(tmp("bare.npy"), &got);
    read_tensor(td("npz", "y_simple.npy"), &want);
    assert_int_equal(got.ndim, 3);
    assert_close("bare simple from qkv.npz", &got, &want, 1e-5, 1e-6);
    aft_tensor_free(&got);
    aft_tensor_free(&want);

    /* an archive without q, k, v: nothing written */
    remove(tmp("bare.npy"));
    EXPECT_ERROR("savez.npz: no tensor 'q'; a .npz INPUT holds q, k and v", "run", td("npz", "savez.npz"), "-o",
                 tmp("bare.npy"));
    assert_false(harness_exists(tmp("bare.npy")));
}

/* ---------------------------------------------------------------- aft compare */

static void test_compare(void **state)
{
    (void)state;
    harness_result r;
    /* numpy's archive member against numpy's .npy of the same values */
    RUN(&r, 0, "compare", td("npz", "savez.npz:f4"), td("npy", "v1_C_le_f4.npy"));
    assert_non_null(strstr(r.out, "\nclose\n"));
    harness_result_free(&r);
    RUN(&r, 0, "compare", td("npz", "savez_compressed.npz:be_f8"), td("npy", "v1_C_be_f8.npy"));
    harness_result_free(&r);
    RUN(&r, 0, "compare", "--json", td("npz", "zip64.npz:b"), td("npz", "savez.npz:i8"));
    assert_non_null(strstr(r.out, "\"close\":true"));
    harness_result_free(&r);
    /* different values: not close */
    RUN(&r, 1, "compare", td("npz", "savez.npz:f4"), td("npz", "savez.npz:i4"));
    assert_non_null(strstr(r.out, "not close"));
    harness_result_free(&r);
    /* a one-tensor archive may be named alone; others may not */
    EXPECT_ERROR("holds 17 tensors; name one as", "compare", td("npz", "savez.npz"), td("npy", "v1_C_le_f4.npy"));
    EXPECT_ERROR("savez.npz: no tensor named 'nope'", "compare", td("npz", "savez.npz:nope"),
                 td("npy", "v1_C_le_f4.npy"));
}

/* ---------------------------------------------------------------- aft convert */

static void test_convert_member_out(void **state)
{
    (void)state;
    harness_result r;
    /* a member out as .npy: numpy's own bytes for that array */
    RUN(&r, 0, "convert", "-o", tmp("m.npy"), td("npz", "savez_compressed.npz:f4"));
    harness_result_free(&r);
    char *a, *b;
    size_t la, lb;
    assert_int_equal(harness_read_file(tmp("m.npy"), &a, &la), 0);
    assert_int_equal(harness_read_file(td("npy", "v1_C_le_f4.npy"), &b, &lb), 0);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    /* with a dtype change, to standard output */
    RUN(&r, 0, "convert", "--dtype", "f64", "-o", "-", td("npz", "savez.npz:blocks.0.attn.query.weight"));
    assert_int_equal(harness_write_file(tmp("m64.npy"), r.out, r.out_len), 0);
    harness_result_free(&r);
    aft_tensor t;
    read_tensor(tmp("m64.npy"), &t);
    assert_int_equal(t.dtype, AFT_F64);
    assert_int_equal(t.nelem, 12);
    for (size_t i = 0; i < 12; i++) assert_true(((const double *)t.data)[i] == (double)i * 0.5 - 3);
    aft_tensor_free(&t);
}

/* .npy files packed into a .npz: the bytes Python's zipfile writes */
static void test_convert_pack(void **state)
{
    (void)state;
    harness_result r;
    /* f4 (2, 3, 4), i2, the dotted key and b1: writer_expect.npz's members */
    /* NAME=INPUT as one word */
    char *i2 = malloc(strlen(td("npy", "v1_C_le_i2.npy")) + 4);
    sprintf(i2, "i2=%s", td("npy", "v1_C_le_i2.npy"));
    char *f4 = malloc(strlen(td("npy", "v1_C_le_f4.npy")) + 4);
    sprintf(f4, "f4=%s", td("npy", "v1_C_le_f4.npy"));
    char *b1 = malloc(strlen(td("npy", "v1_C_any_b1.npy")) + 4);
    sprintf(b1, "b1=%s", td("npy", "v1_C_any_b1.npy"));
    /* the dotted key from an archive member, as it is */
    char *dotted = malloc(strlen(td("npz", "savez.npz")) + 40);
    sprintf(dotted, "%s:blocks.0.attn.query.weight", td("npz", "savez.npz"));
    RUN(&r, 0, "convert", "-o", tmp("packed.npz"), f4, i2, dotted, b1);
    harness_result_free(&r);
    char *a, *b;
    size_t la, lb;
    assert_int_equal(harness_read_file(tmp("packed.npz"), &a, &la), 0);
    assert_int_equal(harness_read_file(td("npz", "writer_expect.npz"), &b, &lb), 0);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);

    /* --format npz to a pipe: the same bytes */
    RUN(&r, 0, "convert", "--format", "npz", f4, i2, dotted, b1);
    assert_int_equal(harness_read_file(td("npz", "writer_expect.npz"), &b, &lb), 0);
    assert_int_equal(r.out_len, lb);
    assert_memory_equal(r.out, b, lb);
    free(b);
    harness_result_free(&r);

    /* a big-endian input is written little-endian, and reads back equal */
    RUN(&r, 0, "convert", "-o", tmp("be.npz"), td("npy", "v1_C_be_f8.npy"));
    harness_result_free(&r);
    RUN(&r, 0, "compare", tmp("be.npz:v1_C_be_f8"), td("npy", "v1_C_be_f8.npy"));
    harness_result_free(&r);
    free(i2);
    free(f4);
    free(b1);
    free(dotted);
}

/* .npz to .safetensors and back */
static void test_convert_both_ways(void **state)
{
    (void)state;
    harness_result r;
    RUN(&r, 0, "convert", "-o", tmp("s.safetensors"), td("npz", "savez_compressed.npz"));
    harness_result_free(&r);
    RUN(&r, 0, "convert", "-o", tmp("back.npz"), tmp("s.safetensors"));
    harness_result_free(&r);
    static const char *const codes[] = {"f2", "f4", "f8", "b1", "u1", "i1", "i2", "u2", "i4", "u4", "i8", "u8"};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        char name[64], ref[64];
        snprintf(name, sizeof name, "v1_C_%s_%s.npy", codes[i][1] == '1' ? "any" : "le", codes[i]);
        snprintf(ref, sizeof ref, "%s", td("npy", name));
        char sa[1100], sb[1100];
        snprintf(sa, sizeof sa, "%s:%s", tmp("s.safetensors"), codes[i]);
        snprintf(sb, sizeof sb, "%s:%s", tmp("back.npz"), codes[i]);
        RUN(&r, 0, "compare", sa, ref);
        harness_result_free(&r);
        RUN(&r, 0, "compare", sb, ref);
        harness_result_free(&r);
    }
    RUN(&r, 0, "info", "--json", tmp("back.npz"));
    assert_non_null(strstr(r.out, "\"format\":\"npz\",\"tensors\":[{\"name\":\"f2\""));
    assert_non_null(strstr(r.out, "{\"name\":\"blocks.0.attn.query.weight\",\"dtype\":\"F32\",\"shape\":[3,4]"));
    harness_result_free(&r);

    /* BF16 has no .npz dtype; safetensors names that are paths are no keys */
    aft_tensor t = {.dtype = AFT_BF16, .ndim = 1, .shape = {2}, .nelem = 2, .nbytes = 4, .data = "\0\0\0\0"};
    const char *names[1] = {"w"};
    aft_error err;
    assert_int_equal(aft_st_write(tmp("bf.safetensors"), names, &t, 1, NULL, 0, &err), AFT_OK);
    EXPECT_ERROR("tensor 'w' is BF16, which .npz cannot hold; add --dtype f32", "convert", "-o", tmp("bf.npz"),
                 tmp("bf.safetensors"));
    assert_false(harness_exists(tmp("bf.npz")));
    RUN(&r, 0, "convert", "--dtype", "f32", "-o", tmp("bf.npz"), tmp("bf.safetensors"));
    harness_result_free(&r);
    t.dtype = AFT_F32;
    t.nbytes = 8;
    t.data = "\0\0\0\0\0\0\0\0";
    names[0] = "model/layer.w";
    assert_int_equal(aft_st_write(tmp("slash.safetensors"), names, &t, 1, NULL, 0, &err), AFT_OK);
    RUN(&r, 2, "convert", "-o", tmp("slash.npz"), tmp("slash.safetensors"));
    assert_non_null(strstr(r.err, "key 'model/layer.w': '/' in a key (members are keys, not paths)"));
    harness_result_free(&r);
    assert_false(harness_exists(tmp("slash.npz")));
    char renamed[1100];
    snprintf(renamed, sizeof renamed, "w=%s", tmp("slash.safetensors"));
    RUN(&r, 0, "convert", "-o", tmp("slash.npz"), renamed);
    harness_result_free(&r);
    RUN(&r, 2, "convert", "-o", tmp("meta.npz"), "--metadata", "a=b", td("npy", "v1_C_le_f4.npy"));
    harness_result_free(&r);
}

/* ---------------------------------------------------------------- the memory bound */

/* --max-memory bounds inflating in every command that reads archives:
 * exit 1, one line naming the file and the member, nothing written */
static void test_max_memory(void **state)
{
    (void)state;
    const char *z = td("npz", "savez_compressed.npz");
    const char *want = "member 'f2.npy': inflates to 176 bytes, past the memory limit of 100 bytes";
    EXPECT_ERROR(want, "info", "--max-memory", "100", z);
    EXPECT_ERROR(want, "compare", "--max-memory", "100", td("npz", "savez_compressed.npz:f4"),
                 td("npy", "v1_C_le_f4.npy"));
    EXPECT_ERROR(want, "convert", "--max-memory=100", "-o", tmp("mm.safetensors"), z);
    assert_false(harness_exists(tmp("mm.safetensors")));
    /* the members' sizes add up: q fits in 500 bytes, q and k do not */
    EXPECT_ERROR("member 'k.npy': inflates to 288 bytes, past the memory limit of 500 bytes (288 taken before it)",
                 "run", "--max-memory", "500", "--variant", "simple", td("npz", "qkv.npz"), "-o", tmp("mm.npy"));
    assert_false(harness_exists(tmp("mm.npy")));
    EXPECT_ERROR("past the memory limit of 1024 bytes", "run", "--max-memory", "1K", "--weights",
                 td("npz", "weights_rish_full_deflated.npz"), td("torch/rish_full", "x.npy"), "-o", tmp("mm.npy"));
    assert_false(harness_exists(tmp("mm.npy")));
    /* enough memory: fine */
    harness_result r;
    RUN(&r, 0, "info", "--max-memory", "1M", z);
    harness_result_free(&r);
    RUN(&r, 2, "info", "--max-memory", "lots", z);
    harness_result_free(&r);
}

/* ---------------------------------------------------------------- formats where another is expected */

static void test_wrong_format(void **state)
{
    (void)state;
    /* a .npz where a .npy must be: the mask, standard input */
    EXPECT_ERROR("savez.npz: not a .npy file: this is a .npz archive (a zip of .npy files)", "run", "--mask",
                 td("npz", "savez.npz"), td("torch/rish_full", "x.npy"), "-o", tmp("o.npy"));
    char *bytes;
    size_t len;
    assert_int_equal(harness_read_file(td("npz", "savez.npz"), &bytes, &len), 0);
    harness_result r;
    assert_int_equal(HARNESS_RUN_STDIN(&r, bytes, len, "run", "-", "-o", tmp("o.npy")), 0);
    assert_int_equal(r.exit_code, 1);
    assert_non_null(strstr(r.err, "not a .npy file: this is a .npz archive"));
    harness_result_free(&r);
    free(bytes);
    assert_false(harness_exists(tmp("o.npy")));
    /* a .npy where named tensors must be */
    EXPECT_ERROR("v1_C_le_f4.npy: not a .safetensors or .npz file: this is a .npy file (one array)", "run",
                 "--weights", td("npy", "v1_C_le_f4.npy"), td("torch/rish_full", "x.npy"), "-o", tmp("o.npy"));
    char *npy;
    assert_int_equal(harness_read_file(td("npy", "v1_C_le_f4.npy"), &npy, &len), 0);
    assert_int_equal(harness_write_file(tmp("fake.npz"), npy, len), 0);
    free(npy);
    char fake[1100];
    snprintf(fake, sizeof fake, "%s:a", tmp("fake.npz"));
    EXPECT_ERROR("fake.npz: not a .safetensors or .npz file: this is a .npy file", "compare", fake,
                 td("npy", "v1_C_le_f4.npy"));
    /* by its bytes it is a .npy: read as one, whatever its name */
    RUN(&r, 0, "compare", tmp("fake.npz"), td("npy", "v1_C_le_f4.npy"));
    harness_result_free(&r);
    /* a file that is none of them */
    assert_int_equal(harness_write_file(tmp("w.bin"), "\x01\x02\x03", 3), 0);
    EXPECT_ERROR("w.bin: not a .npy, .npz or .safetensors file", "run", "--weights", tmp("w.bin"),
                 td("torch/rish_full", "x.npy"), "-o", tmp("o.npy"));
    EXPECT_ERROR("w.bin: not a .npy, .npz or .safetensors file", "run", tmp("w.bin"), "-o", tmp("o.npy"));
    EXPECT_ERROR("w.bin: not a .npy, .npz or .safetensors file", "compare", tmp("w.bin"), tmp("w.bin"));
    EXPECT_ERROR("w.bin: not a .npy, .npz or .safetensors file", "convert", "-o", tmp("o.npy"), tmp("w.bin"));
    assert_false(harness_exists(tmp("o.npy")));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_run_weights),
        cmocka_unit_test(test_run_bare),
        cmocka_unit_test(test_compare),
        cmocka_unit_test(test_convert_member_out),
        cmocka_unit_test(test_convert_pack),
        cmocka_unit_test(test_convert_both_ways),
        cmocka_unit_test(test_max_memory),
        cmocka_unit_test(test_wrong_format),
    };
    return cmocka_run_group_tests_name("cli npz", tests, harness_setup, harness_teardown);
}
