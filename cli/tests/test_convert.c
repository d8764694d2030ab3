/* test_convert.c - `aft convert`: pack and extract round trips, dtype
 * conversions against an independent rounding oracle, metadata, standard
 * input and output, errors, atomic output, streaming memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "aft.h"
#include "harness.h"

/* ---------------------------------------------------------------- helpers */

/* name in the temporary directory, malloc'd */
static char *in_dir(const char *name)
{
    char *p = harness_tmp(name);
    assert_non_null(p);
    return p;
}

/* writes name, in the temporary directory, as a .npy; returns its malloc'd path */
static char *npy(const char *name, aft_dtype dt, const void *data, size_t ndim, const size_t *shape)
{
    char *path = in_dir(name);
    aft_tensor t = harness_tensor(dt, data, ndim, shape);
    aft_error err = {{0}};
    if (aft_npy_write(path, &t, &err) != AFT_OK) fail_msg("writing %s: %s", path, err.msg);
    return path;
}

/* a 1-D .npy of n elements */
static char *npy1(const char *name, aft_dtype dt, const void *data, size_t n)
{
    return npy(name, dt, data, 1, (size_t[]){n});
}

static aft_tensor read_npy(const char *path)
{
    aft_tensor t;
    aft_error err = {{0}};
    if (aft_npy_read(path, &t, NULL, &err) != AFT_OK) fail_msg("reading %s: %s", path, err.msg);
    return t;
}

static aft_st_file *open_st(const char *path)
{
    aft_st_file *f;
    aft_error err = {{0}};
    if (aft_st_open(path, &f, &err) != AFT_OK) fail_msg("reading %s: %s", path, err.msg);
    return f;
}

static const aft_tensor *st_tensor(const aft_st_file *f, const char *name)
{
    const aft_tensor *t = aft_st_find(f, name);
    if (!t) fail_msg("no tensor '%s'", name);
    return t;
}

/* the value of metadata key in f, or NULL */
static const char *st_meta(const aft_st_file *f, const char *key)
{
    for (size_t i = 0; i < aft_st_metadata_count(f); i++) {
        const char *k, *v;
        aft_st_metadata(f, i, &k, &v);
        if (strcmp(k, key) == 0) return v;
    }
    return NULL;
}

/* same dtype, shape and bytes */
static void assert_same_tensor(const aft_tensor *a, const aft_tensor *b)
{
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->ndim, b->ndim);
    for (size_t i = 0; i < a->ndim; i++) assert_int_equal(a->shape[i], b->shape[i]);
    assert_int_equal(a->nbytes, b->nbytes);
    assert_memory_equal(a->data, b->data, a->nbytes);
}

/* runs `aft convert ARGS...` (args NULL-terminated, after "convert") */
static void run(harness_result *r, const char *const *args, const void *in, size_t in_len)
{
    const char *argv[64] = {"convert"};
    size_t n = 1;
    while (args[n - 1]) {
        assert_true(n < 63);
        argv[n] = args[n - 1];
        n++;
    }
    argv[n] = NULL;
    assert_int_equal(harness_run(r, argv, in, in_len), 0);
    assert_int_equal(r->timed_out, 0);
}
#define CONVERT(r, ...) run((r), (const char *const[]){__VA_ARGS__, NULL}, NULL, 0)
#define CONVERT_STDIN(r, in, len, ...) run((r), (const char *const[]){__VA_ARGS__, NULL}, (in), (len))

/* runs and expects success with nothing on stderr */
#define CONVERT_OK(...)                                          \
    do {                                                         \
        harness_result r_;                                       \
        CONVERT(&r_, __VA_ARGS__);                               \
        if (r_.exit_code != 0) fail_msg("exit %d: %s", r_.exit_code, r_.err); \
        assert_int_equal(r_.err_len, 0);                         \
        harness_result_free(&r_);                                \
    } while (0)

/* a failed run: exit status, one message line (plus the hint line for a
 * usage error) that contains want */
static void assert_failed(const harness_result *r, int code, const char *want)
{
    if (r->exit_code != code) fail_msg("exit %d, wanted %d: %s", r->exit_code, code, r->err);
    if (!strstr(r->err, want)) fail_msg("stderr lacks '%s': %s", want, r->err);
    if (code == 2) {
        assert_int_equal(harness_count_lines(r->err), 2);
        assert_true(strncmp(r->err, "aft convert: ", 13) == 0);
        assert_non_null(strstr(r->err, "Try 'aft convert --help'."));
    } else {
        assert_int_equal(harness_count_lines(r->err), 1);
        assert_true(strncmp(r->err, "aft convert: ", 13) == 0);
    }
    assert_int_equal(r->out_len, 0);
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double bits_f64(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static uint16_t u16_at(const aft_tensor *t, size_t i)
{
    uint16_t v;
    memcpy(&v, (const unsigned char *)t->data + 2 * i, 2);
    return v;
}

/* a small deterministic generator (xorshift64*) */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* ---------------------------------------------------------------- the rounding oracle */

/* An independent model of f16 and bf16 rounding: the positive bit patterns
 * of a binary format are ordered like their values, so the nearest value is
 * found by bisection over patterns, and ties go to the even pattern. The
 * infinity pattern stands for 2^(emax+1), the next binade: a value rounds to
 * infinity exactly when IEEE overflow says it does. */
typedef enum { F16, BF16 } narrow;

static uint16_t inf_bits(narrow k)
{
    return k == F16 ? 0x7c00 : 0x7f80;
}

/* value of a positive finite pattern (or of the infinity pattern, as above),
 * decoded from the definition of the format, not with the library */
static double narrow_value(narrow k, uint16_t p)
{
    int mbits = k == F16 ? 10 : 7, bias = k == F16 ? 15 : 127;
    int e = p >> mbits, m = p & ((1 << mbits) - 1);
    if (e == 0) return ldexp(m, 1 - bias - mbits);                 /* subnormal */
    return ldexp((1 << mbits) + m, e - bias - mbits);               /* normal; inf: 2^(emax+1) */
}

/* the pattern the value d must round to (d not NaN) */
static uint16_t oracle(narrow k, double d)
{
    uint16_t sign = signbit(d) ? 0x8000 : 0, inf = inf_bits(k);
    double a = fabs(d);
    if (a >= narrow_value(k, inf)) return sign | inf;
    uint16_t lo = 0, hi = inf;   /* value(lo) <= a < value(hi) */
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)(lo + (hi - lo) / 2);
        if (narrow_value(k, mid) <= a) lo = mid;
        else hi = mid;
    }
    double vl = narrow_value(k, lo), vh = narrow_value(k, hi);
    double half = (vl + vh) / 2;  /* exact: two neighbours of a short format */
    if (a < half) return sign | lo;
    if (a > half) return sign | hi;
    return sign | ((lo & 1) ? hi : lo);
}

static int narrow_isnan(narrow k, uint16_t p)
{
    uint16_t inf = inf_bits(k);
    return (p & inf) == inf && (p & (uint16_t)~(inf | 0x8000)) != 0;
}

/* checks out[i] (patterns) against the oracle for every value vals[i] */
static void check_rounded(narrow k, const double *vals, const aft_tensor *out, size_t n)
{
    assert_int_equal(out->dtype, k == F16 ? AFT_F16 : AFT_BF16);
    assert_int_equal(out->nelem, n);
    for (size_t i = 0; i < n; i++) {
        uint16_t got = u16_at(out, i);
        if (isnan(vals[i])) {
            if (!narrow_isnan(k, got)) fail_msg("NaN at %zu became 0x%04x", i, got);
            assert_int_equal(got & 0x8000, signbit(vals[i]) ? 0x8000 : 0);
            continue;
        }
        uint16_t want = oracle(k, vals[i]);
        if (got != want) {
            uint64_t bits;
            memcpy(&bits, &vals[i], 8);
            fail_msg("%s: %.17g (0x%016llx) gave 0x%04x, want 0x%04x", k == F16 ? "f16" : "bf16",
                     vals[i], (unsigned long long)bits, got, want);
        }
    }
}

/* Values that probe one narrow format: specials, the overflow threshold,
 * subnormals, exact ties and values a hair to either side of a tie (the
 * hair is far below float precision, so converting through float would
 * turn them into ties and round them the wrong way), then random ones.
 * Fills v (capacity cap) and returns the count. */
static size_t probe_values(narrow k, double *v, size_t cap, int float_exact)
{
    size_t n = 0;
    uint16_t inf = inf_bits(k);
    double maxv = narrow_value(k, inf - 1), infv = narrow_value(k, inf);
    double fixed[] = {0.0, -0.0, 1.0, -1.0, 0.5, INFINITY, -INFINITY, NAN, -NAN,
                      maxv, -maxv, (maxv + infv) / 2, -(maxv + infv) / 2, infv, 1e300, -1e300,
                      narrow_value(k, 1), narrow_value(k, 1) / 2, narrow_value(k, 1) * 1.5,
                      narrow_value(k, 1) / 4, 1e-300, -1e-300, DBL_MIN, 4.9e-324, 3.0, 1.0 / 3};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) v[n++] = fixed[i];
    /* every tie between neighbouring patterns in a sample across the range,
     * and its neighbours one part in 2^40 away */
    while (n + 3 <= cap / 2) {
        uint16_t p = (uint16_t)(rng() % inf);   /* p and p + 1 <= inf */
        double lo = narrow_value(k, p), hi = narrow_value(k, p + 1), mid = (lo + hi) / 2;
        double hair = ldexp(hi - lo, -40);
        v[n++] = mid;
        if (!float_exact) {
            v[n++] = mid + hair;
            v[n++] = mid - hair;
        } else {
            v[n++] = nextafterf((float)mid, INFINITY);
            v[n++] = nextafterf((float)mid, -INFINITY);
        }
        if (rng() & 1)
            for (size_t j = n - 3; j < n; j++) v[j] = -v[j];
    }
    /* random values over the format's exponent range and a bit beyond */
    int lo_e = k == F16 ? -30 : -140, hi_e = k == F16 ? 17 : 129;
    while (n < cap) {
        double m = 1.0 + (double)(rng() >> 11) * 0x1p-53;
        int e = lo_e + (int)(rng() % (uint64_t)(hi_e - lo_e + 1));
        double d = ldexp(m, e);
        if (float_exact) d = (float)d;
        v[n++] = rng() & 1 ? -d : d;
    }
    if (float_exact)   /* every value must be a float for the f32 tests */
        for (size_t i = 0; i < n; i++)
            if (!isnan(v[i]) && (double)(float)v[i] != v[i]) v[i] = (float)v[i];
    return n;
}

/* ---------------------------------------------------------------- tests */

/* children's peak resident set so far, in KiB (it only ever grows) */
static long children_peak_kib(void)
{
    struct rusage ru;
    assert_int_equal(getrusage(RUSAGE_CHILDREN, &ru), 0);
    return ru.ru_maxrss;
}

/* Streaming: packing three 16 MiB .npy files (converted to f32) needs no
 * more memory than packing one; holding the inputs together would need 32
 * MiB more. RUSAGE_CHILDREN's peak only grows, so this test runs first and
 * the one-file pack comes before the three-file one. A sanitizer's
 * quarantine would keep freed blocks, so it is switched off for these runs
 * (the option means nothing to a normal build). */
static void test_streaming_memory(void **state)
{
    (void)state;
    /* a wrapper (make test-valgrind runs aft under memcheck, whose freed-block
     * queue keeps memory) measures the wrapper, not aft: only a binary counts */
    if (!harness_aft_is_binary()) {
        print_message("skipped: %s is not an executable binary\n", harness_aft_bin());
        skip();
    }
    const size_t n = 2u << 20;   /* 2 Mi doubles = 16 MiB */
    double *x = malloc(n * sizeof *x);
    assert_non_null(x);
    char *in[3];
    for (int f = 0; f < 3; f++) {
        for (size_t i = 0; i < n; i++) x[i] = (double)i * 0.25 + f;
        char name[32];
        snprintf(name, sizeof name, "big%d.npy", f);
        in[f] = npy1(name, AFT_F64, x, n);
    }
    const char *asan = getenv("ASAN_OPTIONS");
    char *saved = asan ? strdup(asan) : NULL, opts[1024];
    snprintf(opts, sizeof opts, "%s%squarantine_size_mb=0", asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);

    char *out = in_dir("big.safetensors");
    long base = children_peak_kib();
    CONVERT_OK("--dtype", "f32", "-o", out, in[0]);
    long one = children_peak_kib();
    CONVERT_OK("--dtype", "f32", "-o", out, in[0], in[1], in[2]);
    long three = children_peak_kib();
    if (saved) setenv("ASAN_OPTIONS", saved, 1);
    else unsetenv("ASAN_OPTIONS");
    free(saved);
    print_message("peak RSS: %ld MiB before, %ld MiB packing one 16 MiB .npy, %ld MiB packing three\n",
                  base / 1024, one / 1024, three / 1024);
    assert_true(three - one < 8 * 1024);

    aft_st_file *f = open_st(out);
    const aft_tensor *t = st_tensor(f, "big2");
    assert_int_equal(t->dtype, AFT_F32);
    float last;
    memcpy(&last, (const unsigned char *)t->data + 4 * (n - 1), 4);
    assert_true(last == (float)((double)(n - 1) * 0.25 + 2));
    aft_st_close(f);
    for (int i = 0; i < 3; i++) {
        unlink(in[i]);
        free(in[i]);
    }
    unlink(out);
    free(out);
    free(x);
}

/* pack .npy files of several dtypes, read them back with the library, then
 * extract each again: every byte survives, NaN payloads included */
static void test_pack_extract_round_trip(void **state)
{
    (void)state;
    const float f[6] = {1.5f, -0.0f, bits_f32(0x7fc12345u), INFINITY, 1e-45f, -3.25f};
    const double d[3] = {bits_f64(0x7ff8000000000123ull), -1e300, 0.1};
    const uint16_t h[4] = {0x3c00, 0x7e01, 0x0001, 0xfbff};
    const int32_t i32[5] = {INT32_MIN, -1, 0, 7, INT32_MAX};
    const uint8_t b[3] = {1, 0, 1};
    const int64_t i64[2] = {INT64_MIN, 123456789012345ll};
    char *p[6] = {
        npy("f.npy", AFT_F32, f, 2, (size_t[]){2, 3}),
        npy1("d.npy", AFT_F64, d, 3),
        npy("h.npy", AFT_F16, h, 2, (size_t[]){2, 2}),
        npy1("i.npy", AFT_I32, i32, 5),
        npy1("b.npy", AFT_BOOL, b, 3),
        npy("s.npy", AFT_I64, i64, 3, (size_t[]){1, 2, 1}),
    };
    char *out = in_dir("packed.safetensors");
    char a0[300], a1[300], a2[300];
    snprintf(a0, sizeof a0, "weight=%s", p[0]);
    snprintf(a1, sizeof a1, "dbl=%s", p[1]);
    snprintf(a2, sizeof a2, "blocks.0.half=%s", p[2]);
    /* NAME= operands, then bare files named after themselves */
    CONVERT_OK("-o", out, a0, a1, a2, p[3], "--metadata", "format=pt", p[4], p[5],
               "--metadata=note=a \"quoted\" \\ value\twith tab");

    aft_st_file *st = open_st(out);
    static const char *const names[6] = {"weight", "dbl", "blocks.0.half", "i", "b", "s"};
    assert_int_equal(aft_st_count(st), 6);
    for (int i = 0; i < 6; i++) {
        const char *name;
        aft_st_get(st, (size_t)i, &name);
        assert_string_equal(name, names[i]);   /* data in command-line order */
        aft_tensor t = read_npy(p[i]);
        assert_same_tensor(st_tensor(st, names[i]), &t);
        aft_tensor_free(&t);
    }
    assert_int_equal(aft_st_metadata_count(st), 2);
    assert_string_equal(st_meta(st, "format"), "pt");
    assert_string_equal(st_meta(st, "note"), "a \"quoted\" \\ value\twith tab");
    aft_st_close(st);

    /* extract every tensor back to .npy: identical to the input */
    char *x = in_dir("x.npy");
    for (int i = 0; i < 6; i++) {
        char op[300];
        snprintf(op, sizeof op, "%s:%s", out, names[i]);
        CONVERT_OK("-o", x, op);
        aft_tensor a = read_npy(x), b2 = read_npy(p[i]);
        assert_same_tensor(&a, &b2);
        aft_tensor_free(&a);
        aft_tensor_free(&b2);
    }
    /* and a .npy written by aft to .npy again: the same bytes */
    CONVERT_OK("-o", x, p[0]);
    char *got, *want;
    size_t gl, wl;
    assert_int_equal(harness_read_file(x, &got, &gl), 0);
    assert_int_equal(harness_read_file(p[0], &want, &wl), 0);
    assert_int_equal(gl, wl);
    assert_memory_equal(got, want, gl);
    free(got);
    free(want);

    for (int i = 0; i < 6; i++) free(p[i]);
    free(out);
    free(x);
}

/* every .npy fixture made by numpy (versions 1 to 3, both byte orders,
 * Fortran order, scalars, empty arrays, 32 dimensions) packs and extracts
 * to the same values */
static void test_numpy_fixtures(void **state)
{
    (void)state;
    char *npydir = harness_path(harness_testdata(), "npy");
    DIR *dp = opendir(npydir);
    assert_non_null(dp);
    const char *args[64] = {"-o", NULL};
    char *paths[64];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(dp)) && n < 40) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".npy") != 0 || strncmp(e->d_name, "bad_", 4) == 0 ||
            strcmp(e->d_name, "pad64_f4.npy") == 0)   /* below: too large for .safetensors */
            continue;
        /* a spread of fixtures: every version-3 file and every special one */
        if (e->d_name[0] == 'v' && e->d_name[1] != '3') continue;
        paths[n] = harness_path(npydir, e->d_name);
        args[2 + n] = paths[n];
        n++;
    }
    closedir(dp);
    assert_true(n >= 20);
    char *out = in_dir("fixtures.safetensors");
    args[1] = out;
    args[2 + n] = NULL;
    harness_result r;
    run(&r, args, NULL, 0);
    if (r.exit_code != 0) fail_msg("%s", r.err);
    harness_result_free(&r);

    aft_st_file *st = open_st(out);
    assert_int_equal(aft_st_count(st), n);
    char *x = in_dir("fixture.npy");
    for (size_t i = 0; i < n; i++) {
        const char *base = strrchr(paths[i], '/') + 1;
        char name[128], op[512];
        snprintf(name, sizeof name, "%.*s", (int)(strlen(base) - 4), base);
        aft_tensor want = read_npy(paths[i]);
        assert_same_tensor(st_tensor(st, name), &want);
        snprintf(op, sizeof op, "%s:%s", out, name);
        CONVERT_OK("-o", x, op);
        aft_tensor got = read_npy(x);
        assert_same_tensor(&got, &want);
        aft_tensor_free(&got);
        aft_tensor_free(&want);
        free(paths[i]);
    }
    aft_st_close(st);

    /* pad64_f4.npy is empty but has a dimension of 10^17, which .npy can
     * hold and .safetensors cannot (2^53 or more): refused, not written */
    char *pad = harness_path(npydir, "pad64_f4.npy");
    CONVERT(&r, "-o", out, pad);
    char msg[600];
    snprintf(msg, sizeof msg, "aft convert: %s: dimension 8 of 'pad64_f4' is 100000000000000000, 2^53 or more", pad);
    assert_failed(&r, 1, msg);
    harness_result_free(&r);
    CONVERT_OK("-o", x, pad);   /* .npy to .npy is fine */
    aft_tensor got = read_npy(x), want = read_npy(pad);
    assert_same_tensor(&got, &want);
    aft_tensor_free(&got);
    aft_tensor_free(&want);

    free(pad);
    free(x);
    free(out);
    free(npydir);
}

/* f64 -> f16 and bf16: one correct rounding, checked against the oracle
 * on ties, near-ties, overflow, subnormals, NaN and random values */
static void test_f64_to_half(void **state)
{
    (void)state;
    enum { N = 30000 };
    double *v = malloc(N * sizeof *v);
    assert_non_null(v);
    char *out16 = in_dir("h.npy"), *outst = in_dir("h.safetensors");
    for (int k = F16; k <= BF16; k++) {
        size_t n = probe_values((narrow)k, v, N, 0);
        char *in = npy1("d.npy", AFT_F64, v, n);
        aft_tensor t;
        aft_st_file *st = NULL;
        if (k == F16) {
            CONVERT_OK("--dtype", "f16", "-o", out16, in);
            t = read_npy(out16);
            check_rounded(F16, v, &t, n);
            aft_tensor_free(&t);
        } else {
            /* bf16 only fits a .safetensors */
            CONVERT_OK("--dtype", "bf16", "-o", outst, in);
            st = open_st(outst);
            check_rounded(BF16, v, st_tensor(st, "d"), n);
            aft_st_close(st);
        }
        free(in);
    }

    /* the cases where rounding through float would be wrong, spelled out */
    const double d[] = {1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-11, 1 + 0x1p-8 + 0x1p-40, 1 + 0x1p-8,
                        0x1p-25 + 0x1p-60, 65520.0 - 0x1p-30};
    char *in = npy1("d.npy", AFT_F64, d, 6);
    CONVERT_OK("--dtype", "f16", "-o", out16, in);
    aft_tensor t = read_npy(out16);
    assert_int_equal(u16_at(&t, 0), 0x3c01);   /* above the tie: up */
    assert_int_equal(u16_at(&t, 1), 0x3c00);   /* the tie: to even */
    assert_int_equal(u16_at(&t, 2), 0x3c04);   /* 1 + 4 ulps, a hair above */
    assert_int_equal(u16_at(&t, 4), 0x0001);   /* above half the smallest subnormal */
    assert_int_equal(u16_at(&t, 5), 0x7bff);   /* just below overflow */
    aft_tensor_free(&t);
    CONVERT_OK("--dtype", "bf16", "-o", outst, in);
    aft_st_file *st = open_st(outst);
    const aft_tensor *b = st_tensor(st, "d");
    assert_int_equal(u16_at(b, 2), 0x3f81);    /* above bf16's tie: up */
    assert_int_equal(u16_at(b, 3), 0x3f80);    /* the tie: to even */
    aft_st_close(st);
    free(in);
    free(out16);
    free(outst);
    free(v);
}

/* f32 -> f16 and bf16 (the library's conversions) against the same oracle */
static void test_f32_to_half(void **state)
{
    (void)state;
    enum { N = 30000 };
    double *v = malloc(N * sizeof *v);
    float *f = malloc(N * sizeof *f);
    assert_non_null(v);
    assert_non_null(f);
    char *outst = in_dir("hf.safetensors");
    for (int k = F16; k <= BF16; k++) {
        size_t n = probe_values((narrow)k, v, N, 1);
        for (size_t i = 0; i < n; i++) f[i] = (float)v[i];
        char *in = npy1("x.npy", AFT_F32, f, n);
        CONVERT_OK("--dtype", k == F16 ? "f16" : "bf16", "-o", outst, in);
        aft_st_file *st = open_st(outst);
        check_rounded((narrow)k, v, st_tensor(st, "x"), n);
        aft_st_close(st);
        free(in);
    }
    free(outst);
    free(f);
    free(v);
}

/* f16 and bf16, all 65536 patterns each: widening to f32 and f64 is exact;
 * f16 <-> bf16 is rounded once, as the oracle says */
static void test_half_patterns(void **state)
{
    (void)state;
    uint16_t *all = malloc(65536 * sizeof *all);
    double *val = malloc(65536 * sizeof *val);
    assert_non_null(all);
    assert_non_null(val);
    for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    aft_tensor src = harness_tensor(AFT_F16, all, 1, (size_t[]){65536});
    char *in16 = in_dir("all16.safetensors"), *inbf = in_dir("allbf.safetensors");
    aft_error err = {{0}};
    const char *nm[] = {"v"};
    assert_int_equal(aft_st_write(in16, nm, &src, 1, NULL, 0, &err), AFT_OK);
    src.dtype = AFT_BF16;
    assert_int_equal(aft_st_write(inbf, nm, &src, 1, NULL, 0, &err), AFT_OK);
    char *out = in_dir("wide.safetensors");

    for (int k = F16; k <= BF16; k++) {
        narrow from = (narrow)k, to = k == F16 ? BF16 : F16;
        /* the pattern's value from its definition (NaN and infinity aside) */
        for (uint32_t i = 0; i < 65536; i++) {
            uint16_t mag = (uint16_t)(i & 0x7fff);
            double a = mag < inf_bits(from) ? narrow_value(from, mag) : mag == inf_bits(from) ? INFINITY : NAN;
            val[i] = (i & 0x8000) ? -a : a;
        }
        const char *in = k == F16 ? in16 : inbf;
        static const char *const wide[] = {"f32", "f64"};
        for (int w = 0; w < 2; w++) {
            CONVERT_OK("--dtype", wide[w], "-o", out, in);
            aft_st_file *st = open_st(out);
            const aft_tensor *t = st_tensor(st, "v");
            assert_int_equal(t->dtype, w ? AFT_F64 : AFT_F32);
            for (uint32_t i = 0; i < 65536; i++) {
                double got;
                if (w) memcpy(&got, (const unsigned char *)t->data + 8 * i, 8);
                else { float g; memcpy(&g, (const unsigned char *)t->data + 4 * i, 4); got = g; }
                if (isnan(val[i])) assert_true(isnan(got) && !signbit(got) == !(i & 0x8000));
                else if (got != val[i] || !signbit(got) != !signbit(val[i]))
                    fail_msg("pattern 0x%04x: got %.17g, want %.17g", i, got, val[i]);
            }
            aft_st_close(st);
        }
        /* to the other 16-bit format */
        CONVERT_OK("--dtype", to == F16 ? "f16" : "bf16", "-o", out, in);
        aft_st_file *st = open_st(out);
        check_rounded(to, val, st_tensor(st, "v"), 65536);
        aft_st_close(st);
    }
    free(in16);
    free(inbf);
    free(out);
    free(all);
    free(val);
}

/* f64 -> f32 at its edges, and f32 -> f64 exact */
static void test_f64_f32(void **state)
{
    (void)state;
    const double d[] = {
        0x1p128 - 0x1p103,               /* FLT_MAX + half an ulp: a tie, to even = inf */
        0x1p128 - 0x1p103 - 0x1p75,      /* just below: FLT_MAX */
        1 + 0x1p-24,                     /* a tie: to even = 1 */
        1 + 0x1p-24 + 0x1p-50,           /* above the tie: 1 + 2^-23 */
        0x1p-150,                        /* half the smallest subnormal: to even = 0 */
        0x1p-150 + 0x1p-200,             /* just above: the smallest subnormal */
        -1e300, NAN,
    };
    const uint32_t want[] = {0x7f800000u, 0x7f7fffffu, 0x3f800000u, 0x3f800001u,
                             0x00000000u, 0x00000001u, 0xff800000u};
    char *in = npy1("d.npy", AFT_F64, d, 8), *out = in_dir("f.npy");
    CONVERT_OK("--dtype", "f32", "-o", out, in);
    aft_tensor t = read_npy(out);
    assert_int_equal(t.dtype, AFT_F32);
    for (size_t i = 0; i < 7; i++) {
        uint32_t got;
        memcpy(&got, (const unsigned char *)t.data + 4 * i, 4);
        assert_int_equal(got, want[i]);
    }
    float last;
    memcpy(&last, (const unsigned char *)t.data + 28, 4);
    assert_true(isnan(last));
    aft_tensor_free(&t);

    /* and back: f32 -> f64 is exact */
    const float f[] = {FLT_MAX, 1e-45f, -0.0f, 0.1f};
    char *inf32 = npy1("f32.npy", AFT_F32, f, 4), *outd = in_dir("dd.npy");
    CONVERT_OK("--dtype", "float64", "-o", outd, inf32);
    t = read_npy(outd);
    assert_int_equal(t.dtype, AFT_F64);
    for (size_t i = 0; i < 4; i++) {
        double got;
        memcpy(&got, (const unsigned char *)t.data + 8 * i, 8);
        assert_true(got == (double)f[i] && !signbit(got) == !signbit(f[i]));
    }
    aft_tensor_free(&t);
    free(in);
    free(out);
    free(inf32);
    free(outd);
}

/* a whole .safetensors to another: floats converted, integers and bool
 * copied, names, order and metadata kept; --metadata replaces a key */
static void test_whole_file(void **state)
{
    (void)state;
    const double d[4] = {1 + 0x1p-8 + 0x1p-40, -2.5, 1e39, NAN};
    const float f[2] = {3.0f, 1 + 0x1p-8f};
    const int64_t i64[3] = {-5, 0, INT64_MAX};
    const uint8_t b[2] = {0, 1};
    const uint16_t h[2] = {0x3c00, 0xc000};
    aft_tensor ts[5] = {
        harness_tensor(AFT_I64, i64, 1, (size_t[]){3}),
        harness_tensor(AFT_F64, d, 2, (size_t[]){2, 2}),
        harness_tensor(AFT_BOOL, b, 1, (size_t[]){2}),
        harness_tensor(AFT_F32, f, 1, (size_t[]){2}),
        harness_tensor(AFT_F16, h, 1, (size_t[]){2}),
    };
    const char *names[5] = {"layer.steps", "layer.w", "mask", "scale", "half"};
    const char *meta[4] = {"format", "pt", "source", "test"};
    char *in = in_dir("model.safetensors"), *out = in_dir("small.safetensors");
    aft_error err = {{0}};
    assert_int_equal(aft_st_write(in, names, ts, 5, meta, 2, &err), AFT_OK);

    CONVERT_OK("--dtype", "bf16", "-o", out, in, "--metadata", "source=converted");
    aft_st_file *st = open_st(out);
    assert_int_equal(aft_st_count(st), 5);
    for (size_t i = 0; i < 5; i++) {
        const char *name;
        const aft_tensor *t = aft_st_get(st, i, &name);
        assert_string_equal(name, names[i]);
        assert_int_equal(t->ndim, ts[i].ndim);
        if (!aft_dtype_is_float(ts[i].dtype)) {
            assert_same_tensor(t, &ts[i]);
            continue;
        }
        assert_int_equal(t->dtype, AFT_BF16);
        double v[4];
        for (size_t j = 0; j < ts[i].nelem; j++)
            v[j] = ts[i].dtype == AFT_F64 ? d[j] : ts[i].dtype == AFT_F32 ? f[j] : aft_f16_to_f32(h[j]);
        check_rounded(BF16, v, t, ts[i].nelem);
    }
    assert_int_equal(u16_at(st_tensor(st, "layer.w"), 0), 0x3f81);   /* rounded once, up */
    assert_int_equal(u16_at(st_tensor(st, "layer.w"), 2), 0x7f80);   /* 1e39 overflows */
    assert_int_equal(u16_at(st_tensor(st, "scale"), 1), 0x3f80);     /* float tie: even */
    assert_int_equal(aft_st_metadata_count(st), 2);
    assert_string_equal(st_meta(st, "format"), "pt");
    assert_string_equal(st_meta(st, "source"), "converted");
    aft_st_close(st);

    /* without --dtype: the same bytes (a copy), and in place over itself */
    char *copy = in_dir("copy.safetensors");
    CONVERT_OK("-o", copy, in);
    st = open_st(copy);
    for (size_t i = 0; i < 5; i++) assert_same_tensor(st_tensor(st, names[i]), &ts[i]);
    aft_st_close(st);
    CONVERT_OK("--dtype", "f16", "-o", copy, copy);
    st = open_st(copy);
    assert_int_equal(st_tensor(st, "layer.w")->dtype, AFT_F16);
    assert_int_equal(st_tensor(st, "mask")->dtype, AFT_BOOL);
    aft_st_close(st);

    /* renaming one tensor out of a file into a new one */
    char op[300];
    snprintf(op, sizeof op, "w=%s:layer.w", in);
    CONVERT_OK("-o", out, op);
    st = open_st(out);
    assert_int_equal(aft_st_count(st), 1);
    assert_same_tensor(st_tensor(st, "w"), &ts[1]);
    assert_int_equal(aft_st_metadata_count(st), 0);
    aft_st_close(st);

    /* --dtype leaves an integer .npy alone */
    char *ints = npy1("ints.npy", AFT_I64, i64, 3), *intout = in_dir("ints_out.npy");
    CONVERT_OK("--dtype", "f16", "-o", intout, ints);
    aft_tensor t = read_npy(intout);
    assert_same_tensor(&t, &ts[0]);
    aft_tensor_free(&t);

    free(ints);
    free(intout);
    free(copy);
    free(in);
    free(out);
}

/* -o - and no -o write standard output; NAME=- reads standard input */
static void test_stdio(void **state)
{
    (void)state;
    const float f[3] = {1, 2, 3};
    char *in = npy1("v.npy", AFT_F32, f, 3);
    char *bytes;
    size_t len;
    assert_int_equal(harness_read_file(in, &bytes, &len), 0);

    harness_result r;
    CONVERT(&r, "--dtype", "f16", "-o", "-", in);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.err_len, 0);
    aft_tensor t;
    aft_error err = {{0}};
    assert_int_equal(aft_npy_read_mem(r.out, r.out_len, &t, NULL, &err), AFT_OK);
    assert_int_equal(t.dtype, AFT_F16);
    assert_int_equal(u16_at(&t, 2), 0x4200);
    aft_tensor_free(&t);
    harness_result_free(&r);

    /* a .npy from stdin to a .safetensors on stdout (the default output) */
    CONVERT_STDIN(&r, bytes, len, "x=-", "--metadata", "k=v");
    assert_int_equal(r.exit_code, 0);
    aft_st_file *st;
    assert_int_equal(aft_st_open_mem(r.out, r.out_len, &st, &err), AFT_OK);
    aft_tensor want = harness_tensor(AFT_F32, f, 1, (size_t[]){3});
    assert_same_tensor(st_tensor(st, "x"), &want);
    assert_string_equal(st_meta(st, "k"), "v");
    aft_st_close(st);
    harness_result_free(&r);

    /* '-' alone is a .npy in, a .npy out */
    CONVERT_STDIN(&r, bytes, len, "-");
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.out_len, len);
    assert_memory_equal(r.out, bytes, len);
    harness_result_free(&r);

    /* --format overrides the name */
    char *odd = in_dir("odd.bin");
    CONVERT_OK("--format", "safetensors", "-o", odd, in);
    st = open_st(odd);
    assert_same_tensor(st_tensor(st, "v"), &want);
    aft_st_close(st);

    /* standard output on a full device is named so: a .npy's, and a whole
     * .safetensors copied, past stdio's buffer (its writer's error named
     * standard input) */
    char *big = harness_path(harness_testdata(), "model/labml_aft_fortunes.safetensors");
    const char *const ins[] = {in, big};
    for (int i = 0; i < 2; i++) {
        char *log = in_dir("full.txt");
        char *cmd = harness_fmt("'%s' convert -o - '%s' >/dev/full 2>'%s'", harness_aft_bin(), ins[i], log);
        int st_code = system(cmd);
        assert_true(WIFEXITED(st_code) && WEXITSTATUS(st_code) == 1);
        char *got;
        size_t n;
        assert_int_equal(harness_read_file(log, &got, &n), 0);
        if (!strstr(got, "aft convert: standard output: write failed: No space left on device\n")) fail_msg("%s", got);
        free(got);
        free(cmd);
        free(log);
    }
    free(big);

    free(odd);
    free(bytes);
    free(in);
}

/* usage errors exit 2 with a hint; data errors exit 1 with "aft convert: FILE: ..." */
static void test_errors(void **state)
{
    (void)state;
    const float f[2] = {1, 2};
    const uint16_t h[2] = {0x3f80, 0x4000};
    char *a = npy1("a.npy", AFT_F32, f, 2), *b = npy1("sub_b.npy", AFT_F32, f, 2);
    char *out = in_dir("out.safetensors"), *outn = in_dir("out.npy");
    char *missing = in_dir("missing.npy");
    char *st = in_dir("two.safetensors"), *bf = in_dir("bf.safetensors");
    aft_tensor ts[2] = {harness_tensor(AFT_F32, f, 1, (size_t[]){2}), harness_tensor(AFT_BF16, h, 1, (size_t[]){2})};
    const char *names[2] = {"x", "y"};
    aft_error err = {{0}};
    assert_int_equal(aft_st_write(st, names, ts, 2, NULL, 0, &err), AFT_OK);
    assert_int_equal(aft_st_write(bf, names + 1, ts + 1, 1, NULL, 0, &err), AFT_OK);
    char op1[300], op2[300], msg[400];
    harness_result r;

    CONVERT(&r, "-o", out, missing);
    snprintf(msg, sizeof msg, "aft convert: %s: cannot open: No such file or directory\n", missing);
    assert_failed(&r, 1, msg);
    harness_result_free(&r);

    snprintf(op1, sizeof op1, "=%s", a);
    CONVERT(&r, "-o", out, op1);
    assert_failed(&r, 2, "no tensor name before '='");
    harness_result_free(&r);

    CONVERT(&r, "-o", out, "w=");
    assert_failed(&r, 2, "'w=': no input after '='");
    harness_result_free(&r);

    snprintf(op1, sizeof op1, "w=%s", a);
    snprintf(op2, sizeof op2, "w=%s", b);
    CONVERT(&r, "-o", out, op1, op2);
    assert_failed(&r, 2, "tensor name 'w' is given twice");
    harness_result_free(&r);

    /* a bare file named like a tensor from another input */
    snprintf(op1, sizeof op1, "a=%s:x", st);
    CONVERT(&r, "-o", out, op1, a);
    assert_failed(&r, 2, "tensor name 'a' is given twice");
    harness_result_free(&r);

    CONVERT(&r, "--dtype", "f8", "-o", out, a);
    assert_failed(&r, 2, "unknown --dtype 'f8': want f32, f16, bf16 or f64");
    harness_result_free(&r);

    CONVERT(&r, "--dtype", "bf16", "-o", outn, a);
    assert_failed(&r, 2, ".npy cannot hold bfloat16");
    harness_result_free(&r);

    snprintf(op1, sizeof op1, "%s:y", bf);
    CONVERT(&r, "-o", outn, op1);
    snprintf(msg, sizeof msg, "aft convert: %s: tensor 'y' is BF16, which .npy cannot hold; add --dtype f32", bf);
    assert_failed(&r, 1, msg);
    harness_result_free(&r);
    CONVERT_OK("--dtype", "f32", "-o", outn, op1);   /* the way out it names */

    snprintf(op1, sizeof op1, "%s:nope", st);
    CONVERT(&r, "-o", outn, op1);
    assert_failed(&r, 1, "no tensor named 'nope'");
    harness_result_free(&r);

    CONVERT(&r, "-o", outn, st);
    assert_failed(&r, 1, "holds 2 tensors; name one as");
    harness_result_free(&r);

    snprintf(op1, sizeof op1, "w=%s", st);
    CONVERT(&r, "-o", out, op1);
    assert_failed(&r, 1, "holds 2 tensors; name one as");
    harness_result_free(&r);

    CONVERT(&r, "-o", outn, a, b);
    assert_failed(&r, 2, "a .npy output holds one tensor, but 2 inputs are given");
    harness_result_free(&r);

    CONVERT(&r, "-o", outn, "--metadata", "k=v", a);
    assert_failed(&r, 2, "--metadata applies to a .safetensors output");
    harness_result_free(&r);

    CONVERT(&r, "-o", out, "--metadata", "novalue", a);
    assert_failed(&r, 2, "--metadata takes KEY=VALUE, not 'novalue'");
    harness_result_free(&r);

    CONVERT(&r, "-o", out, "--metadata", "k=1", "--metadata", "k=2", a);
    assert_failed(&r, 2, "--metadata key 'k' is given twice");
    harness_result_free(&r);

    snprintf(op1, sizeof op1, "__metadata__=%s", a);
    CONVERT(&r, "-o", out, op1);
    assert_failed(&r, 2, "'__metadata__' is reserved");
    harness_result_free(&r);

    CONVERT(&r, "-o", out, "-");
    assert_failed(&r, 2, "NAME=-");
    harness_result_free(&r);

    CONVERT(&r, "-o", out);
    assert_failed(&r, 2, "no INPUT given");
    harness_result_free(&r);

    CONVERT(&r, "-o", out, "--bogus", a);
    assert_failed(&r, 2, "unknown option '--bogus'");
    harness_result_free(&r);

    CONVERT(&r, a, "-o");
    assert_failed(&r, 2, "-o needs a file");
    harness_result_free(&r);

    /* a file that is not a .npy */
    char *junk = in_dir("junk.npy");
    assert_int_equal(harness_write_file(junk, "hello", 5), 0);
    CONVERT(&r, "-o", out, junk);
    snprintf(msg, sizeof msg, "aft convert: %s: ", junk);
    assert_failed(&r, 1, msg);
    harness_result_free(&r);

    /* none of these left an output behind */
    struct stat sb;
    assert_int_equal(stat(out, &sb), -1);

    free(junk);
    free(a);
    free(b);
    free(out);
    free(outn);
    free(missing);
    free(st);
    free(bf);
}

/* 1 if the temporary directory holds a leftover temporary (NAME.tmp.PID.N) */
static int has_tmp_files(void)
{
    DIR *dp = opendir(harness_dir());
    assert_non_null(dp);
    struct dirent *e;
    int found = 0;
    while ((e = readdir(dp)))
        if (strstr(e->d_name, ".tmp.")) found = 1;
    closedir(dp);
    return found;
}

/* A convert that fails leaves an existing output as it was and no
 * temporary: before the output is opened (a missing input) and after (an
 * input whose header promises more data than the file holds, noticed only
 * when its turn comes, after the first tensor was written). */
static void test_atomic(void **state)
{
    (void)state;
    const float f[256] = {1};
    char *good = npy1("good.npy", AFT_F32, f, 256), *cut = npy1("cut.npy", AFT_F32, f, 256);
    /* keep the header (128 bytes: 64-aligned) and a little of the data */
    assert_int_equal(truncate(cut, 128 + 40), 0);
    char *out = in_dir("keep.safetensors"), *outn = in_dir("keep.npy");
    static const char precious[] = "precious bytes";
    assert_int_equal(harness_write_file(out, precious, sizeof precious), 0);
    assert_int_equal(harness_write_file(outn, precious, sizeof precious), 0);
    char *missing = in_dir("missing.npy");

    harness_result r;
    CONVERT(&r, "--dtype", "f16", "-o", out, good, cut);
    assert_failed(&r, 1, "cut.npy");
    harness_result_free(&r);
    CONVERT(&r, "-o", out, good, missing);
    assert_failed(&r, 1, "missing.npy");
    harness_result_free(&r);
    CONVERT(&r, "-o", outn, cut);
    assert_failed(&r, 1, "cut.npy");
    harness_result_free(&r);

    char *data;
    size_t len;
    const char *paths[2] = {out, outn};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(harness_read_file(paths[i], &data, &len), 0);
        assert_int_equal(len, sizeof precious);
        assert_memory_equal(data, precious, len);
        free(data);
    }
    assert_false(has_tmp_files());

    /* and a successful one replaces it */
    CONVERT_OK("-o", out, good);
    aft_st_file *st = open_st(out);
    assert_int_equal(aft_st_count(st), 1);
    aft_st_close(st);
    assert_false(has_tmp_files());

    free(good);
    free(cut);
    free(out);
    free(outn);
    free(missing);
}

static void test_help(void **state)
{
    (void)state;
    harness_result r;
    CONVERT(&r, "--help");
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.err_len, 0);
    static const char first[] = "usage: aft convert [-o OUT] [--dtype f32|f16|bf16|f64]";
    assert_true(strncmp(r.out, first, sizeof first - 1) == 0);
    assert_non_null(strstr(r.out, "FILE.safetensors:NAME"));
    harness_result_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_streaming_memory),   /* first: it measures children's peak */
        cmocka_unit_test(test_pack_extract_round_trip),
        cmocka_unit_test(test_numpy_fixtures),
        cmocka_unit_test(test_f64_to_half),
        cmocka_unit_test(test_f32_to_half),
        cmocka_unit_test(test_half_patterns),
        cmocka_unit_test(test_f64_f32),
        cmocka_unit_test(test_whole_file),
        cmocka_unit_test(test_stdio),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_atomic),
        cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests_name("cli convert", tests, harness_setup, harness_teardown);
}
