/*
 * test_bf16.c - the bf16 products (lib/nn/bf16.c): aft_gemm_bf16 and
 * aft_linear_init_bf16 against float64 loops over the operands rounded to
 * bf16, at whatever kernel level the run chose (make test-levels runs it
 * again at avx2 and base, where there is no engine).
 *
 * With an engine the bound is float32 summation's over exact products (a
 * bf16 times a bf16 fits float32's 24 bits): (K + 2) eps32 sum |a b|, and
 * the negative control asks that the result be farther from the product
 * of the unrounded operands than float32 rounding could put it: a silent
 * float32 fallback fails there. Without an engine the products are
 * float32's, aft_gemm's bits.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "aft.h"

#include "cases.h"       /* N_OF, MAX_REPORTS */
#include "cpu/arch.h"    /* aft_arch_bf16: what the CPU has */
#include "nn/bf16.h"
#include "rng.h"

static float rounded(float x)
{
    return aft_bf16_to_f32(aft_bf16_round(x));
}

/* the engine is the CPU's exactly at the avx512 level, none below */
static void test_engine(void **state)
{
    (void)state;
    int avx512bf16, amx;
    aft_arch_bf16(&avx512bf16, &amx);
    size_t n;
    const aft_level *lv = aft_levels(&n);
    const char *level = lv[aft_level_in_use()].name;
    aft_bf16_engine e = aft_bf16_engine_now();
    int top = strcmp(level, "avx512") == 0 || strcmp(level, "fixed") == 0;
    print_message("level %s, CPU: avx512_bf16 %d amx %d, engine %s\n", level, avx512bf16, amx,
                  aft_bf16_engine_name(e));
    if (strcmp(level, "fixed") != 0) assert_int_equal(e, top && avx512bf16 ? AFT_BF16_AVX512 : AFT_BF16_NONE);
    assert_string_equal(aft_bf16_engine_name(AFT_BF16_NONE), "none");
    assert_string_equal(aft_bf16_engine_name(AFT_BF16_AVX512), "avx512_bf16");
    assert_string_equal(aft_bf16_engine_name(AFT_BF16_AMX), "amx");
    /* the rounding: ties to even, overflow to infinity, NaN kept */
    assert_int_equal(aft_bf16_round(1.0f), 0x3f80);
    assert_int_equal(aft_bf16_round(1.0f + 0x1p-8f), 0x3f80);             /* a tie, down to even */
    assert_int_equal(aft_bf16_round(1.0f + 3 * 0x1p-8f), 0x3f82);         /* a tie, up to even */
    assert_int_equal(aft_bf16_round(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  /* past the tie */
    assert_int_equal(aft_bf16_round(-INFINITY), 0xff80);
    assert_int_equal(aft_bf16_round(3.4e38f), 0x7f80);
    assert_true(isnan(aft_bf16_to_f32(aft_bf16_round(NAN))));
}

/* op(X)(i, k) of a row-major array with rows ld apart, X^T when t */
static double at(const float *X, size_t ld, int t, size_t i, size_t k, int round)
{
    float v = t ? X[k * ld + i] : X[i * ld + k];
    return round ? rounded(v) : v;
}

/* every transpose case, sizes on and off the tiles (12 x 32, 256 deep,
 * 96 rows a block), beta 0, 1 and 0.5, 1 and 2 threads, strides wider than
 * the rows; the gaps between C's rows must survive */
static void test_gemm(void **state)
{
    (void)state;
    const size_t Ms[] = {1, 15, 17, 33, 100};
    const size_t Ns[] = {1, 15, 17, 33, 70};
    const size_t Ks[] = {1, 15, 17, 33, 300};
    const float betas[] = {0.0f, 1.0f, 0.5f};
    const float sentinel = -12345.0f;
    int engine = aft_bf16_engine_now() != AFT_BF16_NONE;
    int fails = 0, cases = 0, reports = 0;
    double worst_ratio = 0.0, control_ratio = 1e30;   /* error / float32 bound: the largest; the control's smallest */
    rng r = {777};
    for (size_t mi = 0; mi < N_OF(Ms); mi++)
        for (size_t ni = 0; ni < N_OF(Ns); ni++)
            for (size_t ki = 0; ki < N_OF(Ks); ki++)
                for (int ta = 0; ta < 2; ta++)
                    for (int tb = 0; tb < 2; tb++) {
                        size_t M = Ms[mi], N = Ns[ni], K = Ks[ki];
                        size_t lda = (ta ? M : K) + cases % 3, ldb = (tb ? K : N) + cases % 2, ldc = N + 1 + cases % 4;
                        float beta = betas[cases % 3];
                        float *A = randf(&r, (ta ? K : M) * lda, 1.0), *B = randf(&r, (tb ? N : K) * ldb, 1.0);
                        float *C0 = randf(&r, M * ldc, 1.0), *C = xmalloc(M * ldc * sizeof *C),
                              *C2 = xmalloc(M * ldc * sizeof *C2);
                        for (size_t i = 0; i < M * ldc; i++)
                            if (i % ldc >= N) C0[i] = sentinel;
                        for (int th = 1; th <= 2; th++) {
                            float *out = th == 1 ? C : C2;
                            memcpy(out, C0, M * ldc * sizeof *out);
                            aft_gemm_bf16(th, ta, tb, M, N, K, A, lda, B, ldb, beta, out, ldc);
                        }
                        /* the engine's sums do not depend on the split
                         * (OpenBLAS's need not) */
                        int bad = engine && memcmp(C, C2, M * ldc * sizeof *C) != 0;
                        if (bad && reports++ < MAX_REPORTS)
                            print_message("FAIL 2 threads not the bits of 1: M=%zu N=%zu K=%zu ta=%d tb=%d\n", M, N,
                                          K, ta, tb);
                        double far = 0.0;   /* the largest distance from the unrounded product, in its bound */
                        for (size_t i = 0; i < M && !bad; i++)
                            for (size_t j = 0; j < ldc && !bad; j++) {
                                float y = C[i * ldc + j];
                                if (j >= N) {
                                    if (y != sentinel) {
                                        bad = 1;
                                        if (reports++ < MAX_REPORTS)
                                            print_message("FAIL wrote C's gap at %zu, %zu\n", i, j);
                                    }
                                    continue;
                                }
                                double c0 = beta == 0.0f ? 0.0 : (double)beta * C0[i * ldc + j];
                                double s = c0, s32 = c0, mag = fabs(c0);
                                for (size_t k = 0; k < K; k++) {
                                    double a = at(A, lda, ta, i, k, engine), b = at(B, ldb, !tb, j, k, engine);
                                    s += a * b;
                                    s32 += at(A, lda, ta, i, k, 0) * at(B, ldb, !tb, j, k, 0);
                                    mag += fabs(a * b);
                                }
                                double tol = (double)(K + 2) * 0x1p-24 * mag + 1e-30, e = fabs(y - s);
                                if (e / tol > worst_ratio) worst_ratio = e / tol;
                                if (fabs(y - s32) / tol > far) far = fabs(y - s32) / tol;
                                if (!(e <= tol)) {
                                    bad = 1;
                                    if (reports++ < MAX_REPORTS)
                                        print_message("FAIL |err| %.3g > %.3g at %zu, %zu (y %.9g ref %.9g): M=%zu "
                                                      "N=%zu K=%zu ta=%d tb=%d beta=%g\n",
                                                      e, tol, i, j, (double)y, s, M, N, K, ta, tb, (double)beta);
                                }
                            }
                        /* the negative control, on products deep enough that
                         * bf16's rounding must show: an engine's result lies
                         * beyond float32's bound from the unrounded product */
                        if (engine && !bad && K >= 17 && M * N >= 15) {
                            if (far < control_ratio) control_ratio = far;
                            if (!(far > 4.0)) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS)
                                    print_message("FAIL within float32's rounding of the float32 product (%.3g of the "
                                                  "bound): did it run in float32? M=%zu N=%zu K=%zu ta=%d tb=%d\n",
                                                  far, M, N, K, ta, tb);
                            }
                        }
                        /* no engine: aft_gemm's bits, where aft_gemm does
                         * the same product */
                        if (!engine && !bad && !ta && beta == 0.0f)
                            for (int th = 1; th <= 2 && !bad; th++) {
                                memcpy(C2, C0, M * ldc * sizeof *C2);
                                aft_gemm(th, tb, M, N, K, A, lda, B, ldb, NULL, C2, ldc);
                                memcpy(C, C0, M * ldc * sizeof *C);
                                aft_gemm_bf16(th, 0, tb, M, N, K, A, lda, B, ldb, 0.0f, C, ldc);
                                if (memcmp(C, C2, M * ldc * sizeof *C) != 0) {
                                    bad = 1;
                                    if (reports++ < MAX_REPORTS)
                                        print_message("FAIL without an engine not aft_gemm's bits: M=%zu N=%zu K=%zu "
                                                      "tb=%d threads=%d\n", M, N, K, tb, th);
                                }
                            }
                        fails += bad;
                        cases++;
                        free(A); free(B); free(C0); free(C); free(C2);
                    }
    print_message("gemm: %d of %d cases failed; largest error %.3g of the float32 bound%s", fails, cases, worst_ratio,
                  engine ? "" : "\n");
    if (engine) print_message(", smallest distance from float32's product %.3g of it\n", control_ratio);
    assert_int_equal(fails, 0);
}

/* past every block: more rows than a block of A's (96), columns than a
 * block of B's (512), inputs than two blocks (256 each), each transpose
 * case, on one thread and two */
static void test_gemm_blocks(void **state)
{
    (void)state;
    enum { M = 101, N = 600, K = 520 };
    int engine = aft_bf16_engine_now() != AFT_BF16_NONE;
    rng r = {4711};
    float *A = randf(&r, M * K, 1.0), *B = randf(&r, K * N, 1.0), *C0 = randf(&r, M * N, 1.0);
    float *At = xmalloc(M * K * sizeof *At), *Bt = xmalloc(K * N * sizeof *Bt), *C = xmalloc(M * N * sizeof *C);
    double *ref = xmalloc(M * N * sizeof *ref), *mag = xmalloc(M * N * sizeof *mag);
    for (size_t i = 0; i < M; i++)
        for (size_t k = 0; k < K; k++) At[k * M + i] = A[i * K + k];
    for (size_t k = 0; k < K; k++)
        for (size_t j = 0; j < N; j++) Bt[j * K + k] = B[k * N + j];
    for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < N; j++) {
            double s = 0.5 * C0[i * N + j], m = fabs(s);
            for (size_t k = 0; k < K; k++) {
                double p = (engine ? (double)rounded(A[i * K + k]) * rounded(B[k * N + j])
                                   : (double)A[i * K + k] * B[k * N + j]);
                s += p;
                m += fabs(p);
            }
            ref[i * N + j] = s;
            mag[i * N + j] = m;
        }
    int bad = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int th = 1; th <= 2; th++) {
                memcpy(C, C0, M * N * sizeof *C);
                aft_gemm_bf16(th, ta, tb, M, N, K, ta ? At : A, ta ? M : K, tb ? Bt : B, tb ? K : N, 0.5f, C, N);
                for (size_t i = 0; i < (size_t)M * N; i++) {
                    double tol = (K + 2) * 0x1p-24 * mag[i] + 1e-30;
                    if (!(fabs(C[i] - ref[i]) <= tol)) {
                        if (bad++ < MAX_REPORTS)
                            print_message("FAIL at %zu, %zu: %.9g, ref %.9g (ta=%d tb=%d threads=%d)\n", i / N, i % N,
                                          (double)C[i], ref[i], ta, tb, th);
                        break;
                    }
                }
            }
    free(A); free(B); free(C0); free(At); free(Bt); free(C); free(ref); free(mag);
    assert_int_equal(bad, 0);
}

/* beta 0 does not read C (NaN there stays out), K = 0 leaves beta C, and
 * NaN and infinities in the operands reach the sums they are in */
static void test_gemm_special(void **state)
{
    (void)state;
    enum { M = 20, N = 40, K = 37 };
    rng r = {99};
    float *A = randf(&r, M * K, 1.0), *B = randf(&r, K * N, 1.0), *C = xmalloc(M * N * sizeof *C);
    for (size_t i = 0; i < M * N; i++) C[i] = NAN;
    aft_gemm_bf16(2, 0, 0, M, N, K, A, K, B, N, 0.0f, C, N);
    for (size_t i = 0; i < M * N; i++) assert_true(isfinite(C[i]));
    for (size_t i = 0; i < M * N; i++) C[i] = 2.0f;
    aft_gemm_bf16(2, 0, 0, M, N, 0, A, K, B, N, 0.5f, C, N);
    for (size_t i = 0; i < M * N; i++) assert_true(C[i] == 1.0f);
    /* a NaN at A (3, 5): row 3 all NaN; +inf at B (7, 11), with A's column
     * 7 made positive: column 11 +inf but row 3 */
    A[3 * K + 5] = NAN;
    for (size_t i = 0; i < M; i++) A[i * K + 7] = 0.5f;
    B[7 * N + 11] = INFINITY;
    for (int ta = 0; ta < 2; ta++) {
        float *Ao = A, *At = NULL;
        if (ta) {   /* the same operand, given transposed */
            At = xmalloc(M * K * sizeof *At);
            for (size_t i = 0; i < M; i++)
                for (size_t k = 0; k < K; k++) At[k * M + i] = A[i * K + k];
            Ao = At;
        }
        aft_gemm_bf16(1, ta, 0, M, N, K, Ao, ta ? M : K, B, N, 0.0f, C, N);
        for (size_t i = 0; i < M; i++)
            for (size_t j = 0; j < N; j++) {
                float y = C[i * N + j];
                if (i == 3) assert_true(isnan(y));
                else if (j == 11) assert_true(isinf(y) && y > 0);
                else assert_true(isfinite(y));
            }
        free(At);
    }
    free(A); free(B); free(C);
}

/* a random f16 (or bf16) in normal range: sign, exponent within +-4 of 1,
 * mantissa */
static uint16_t rand_half(rng *r, int bf)
{
    uint64_t u = rng_next(r);
    if (bf) return (uint16_t)((u & 0x8000) | ((127 - 4 + (u >> 16) % 8) << 7) | ((u >> 24) & 0x7f));
    return (uint16_t)((u & 0x8000) | ((15 - 4 + (u >> 16) % 8) << 10) | ((u >> 24) & 0x3ff));
}

/* aft_linear_init_bf16 from float32, f16 and bf16 W against float64 loops
 * over bf16-rounded x and W plus the float32 bias; x in place the same
 * bits; views in the packing and off a panel's edge the bits of their rows
 * set up alone; 1 and 3 threads the same bits; the sentinel past each row
 * survives. Without an engine: aft_linear_init's bits (float32 W; W16's
 * aft_linear_init_dt takes the 16-bit ones). */
static void test_linear_bf16(void **state)
{
    (void)state;
    const size_t Ms[] = {1, 15, 17, 33, 130};
    const size_t Ks[] = {1, 15, 17, 33, 300};
    const size_t Ns[] = {1, 15, 17, 33, 70};
    const aft_dtype dts[] = {AFT_F32, AFT_F16, AFT_BF16};
    const float sentinel = -12345.0f;
    int engine = aft_bf16_engine_now() != AFT_BF16_NONE;
    int fails = 0, cases = 0, reports = 0;
    rng r = {31337};
    for (size_t mi = 0; mi < N_OF(Ms); mi++)
        for (size_t ki = 0; ki < N_OF(Ks); ki++)
            for (size_t ni = 0; ni < N_OF(Ns); ni++)
                for (size_t di = 0; di < N_OF(dts); di++) {
                    size_t M = Ms[mi], K = Ks[ki], N = Ns[ni], ldx = K + cases % 3, ldy = N + 1 + cases % 2;
                    aft_dtype dt = dts[di];
                    if (!engine && dt != AFT_F32) continue;   /* W16's aft_linear_init_dt runs those */
                    float *x = randf(&r, M * ldx, 2.0), *b = randf(&r, N, 3.0), *wf = xmalloc(N * K * sizeof *wf);
                    uint16_t *wh = xmalloc(N * K * sizeof *wh);
                    for (size_t i = 0; i < N * K; i++) {
                        if (dt == AFT_F32) wf[i] = (float)rng_sym(&r);
                        else {
                            wh[i] = rand_half(&r, dt == AFT_BF16);
                            wf[i] = dt == AFT_BF16 ? aft_bf16_to_f32(wh[i]) : aft_f16_to_f32(wh[i]);
                        }
                    }
                    const void *w = dt == AFT_F32 ? (const void *)wf : (const void *)wh;
                    int with_bias = cases % 4 != 1;
                    char what[160];
                    snprintf(what, sizeof what, "M=%zu K=%zu N=%zu W %s bias=%d", M, K, N, aft_dtype_name(dt),
                             with_bias);
                    size_t ny = M * ldy;
                    float *y = xmalloc(ny * sizeof *y), *y2 = xmalloc(ny * sizeof *y2), *y3 = xmalloc(ny * sizeof *y3);
                    aft_error err = {{0}};
                    aft_linear l;
                    int bad = 0;
                    for (int th = 1; th <= 3; th += 2) {
                        assert_int_equal(aft_linear_init_bf16(&l, w, dt, with_bias ? b : NULL, N, K, th, &err), AFT_OK);
                        if (l.bf16 != engine) fail_msg("bf16 packing %d with engine %d: %s", l.bf16, engine, what);
                        float *out = th == 1 ? y : y2;
                        for (size_t i = 0; i < ny; i++) out[i] = sentinel;
                        aft_linear_apply(&l, M, x, ldx, out, ldy);
                        if (th == 3 && engine) {   /* (OpenBLAS's sums may depend on the split) */
                            if (memcmp(y, y2, ny * sizeof *y) != 0 && reports++ < MAX_REPORTS)
                                print_message("FAIL 3 threads not the bits of 1: %s\n", (bad = 1, what));
                            for (size_t i = 0; i < ny; i++) y2[i] = sentinel;
                            aft_linear_apply_x(&l, M, x, ldx, y2, ldy, 1);
                            if (memcmp(y, y2, ny * sizeof *y) != 0 && reports++ < MAX_REPORTS)
                                print_message("FAIL x in place not the bits of x packed: %s\n", (bad = 1, what));
                        }
                        if (th == 1) aft_linear_free(&l);
                    }
                    /* views: the rows from f0 alone (without an engine
                     * test_linear.c tests aft_linear's views) */
                    const size_t f0s[] = {32, 1};
                    for (size_t fi = 0; fi < N_OF(f0s) && !bad && engine; fi++) {
                        size_t f0 = f0s[fi];
                        if (f0 >= N) continue;
                        aft_linear v, sub;
                        const void *wsub = (const char *)w + f0 * K * aft_dtype_size(dt);
                        assert_int_equal(aft_linear_view(&v, &l, f0, N - f0, &err), AFT_OK);
                        assert_int_equal(aft_linear_init_bf16(&sub, wsub, dt, with_bias ? b + f0 : NULL, N - f0, K, 2,
                                                              &err), AFT_OK);
                        if (engine && f0 % 32 == 0 && !v.view) fail_msg("a view on a panel's edge packed anew: %s", what);
                        for (size_t i = 0; i < ny; i++) y2[i] = y3[i] = sentinel;
                        aft_linear_apply(&v, M, x, ldx, y2, ldy);
                        aft_linear_apply(&sub, M, x, ldx, y3, ldy);
                        aft_linear_free(&v);
                        aft_linear_free(&sub);
                        if (memcmp(y2, y3, ny * sizeof *y2) != 0 && reports++ < MAX_REPORTS)
                            print_message("FAIL view from %zu: not the bits of its rows alone: %s\n", f0, (bad = 1, what));
                        for (size_t m = 0; m < M && !bad && engine; m++)
                            for (size_t n = f0; n < N; n++)
                                if (y2[m * ldy + n - f0] != y[m * ldy + n]) {
                                    bad = 1;
                                    if (reports++ < MAX_REPORTS)
                                        print_message("FAIL view from %zu: column %zu not the whole's: %s\n", f0, n,
                                                      what);
                                    break;
                                }
                    }
                    aft_linear_free(&l);
                    if (!engine && !bad) {   /* float32: aft_linear_init's bits */
                        assert_int_equal(aft_linear_init(&l, wf, with_bias ? b : NULL, N, K, AFT_KERNEL_AUTO, 1, &err),
                                         AFT_OK);
                        for (size_t i = 0; i < ny; i++) y2[i] = sentinel;
                        aft_linear_apply(&l, M, x, ldx, y2, ldy);
                        aft_linear_free(&l);
                        if (memcmp(y, y2, ny * sizeof *y) != 0 && reports++ < MAX_REPORTS)
                            print_message("FAIL without an engine not aft_linear_init's bits: %s\n", (bad = 1, what));
                    }
                    for (size_t m = 0; m < M && !bad; m++)
                        for (size_t n = 0; n < ldy && !bad; n++) {
                            float v = y[m * ldy + n];
                            if (n >= N) {
                                if (v != sentinel && reports++ < MAX_REPORTS)
                                    print_message("FAIL wrote past row %zu: %s\n", m, (bad = 1, what));
                                continue;
                            }
                            double s = with_bias ? b[n] : 0.0, mag = fabs(s), s32 = s;
                            for (size_t i = 0; i < K; i++) {
                                double xv = engine ? rounded(x[m * ldx + i]) : x[m * ldx + i];
                                double wv = engine ? rounded(wf[n * K + i]) : wf[n * K + i];
                                s += xv * wv;
                                s32 += (double)x[m * ldx + i] * wf[n * K + i];
                                mag += fabs(xv * wv);
                            }
                            double tol = (double)(K + 2) * 0x1p-24 * mag + 1e-30;
                            if (!(fabs(v - s) <= tol) && reports++ < MAX_REPORTS)
                                print_message("FAIL |err| %.3g > %.3g at %zu, %zu (y %.9g ref %.9g): %s\n",
                                              fabs(v - s), tol, m, n, (double)v, s, (bad = 1, what));
                            (void)s32;
                        }
                    fails += bad;
                    cases++;
                    free(x); free(b); free(wf); free(wh); free(y); free(y2); free(y3);
                }
    print_message("linear: %d of %d cases failed\n", fails, cases);
    assert_int_equal(fails, 0);
}

/* the negative control for the projections: with an engine, a product
 * whose x is not already bf16 lands beyond float32's rounding of the
 * float32 product; a NaN in x reaches its row, an infinity in W its column */
static void test_linear_control(void **state)
{
    (void)state;
    enum { M = 40, K = 256, N = 64 };
    rng r = {2024};
    float *x = randf(&r, M * K, 1.0), *w = randf(&r, N * K, 1.0), *y = xmalloc(M * N * sizeof *y);
    aft_error err = {{0}};
    aft_linear l;
    assert_int_equal(aft_linear_init_bf16(&l, w, AFT_F32, NULL, N, K, 2, &err), AFT_OK);
    aft_linear_apply(&l, M, x, K, y, N);
    double far = 1e30;   /* the smallest row-wise distance from the float32 product, in float32's bound */
    for (size_t m = 0; m < M; m++) {
        double e = 0.0, tol = 0.0;
        for (size_t n = 0; n < N; n++) {
            double s = 0.0, mag = 0.0;
            for (size_t i = 0; i < K; i++) {
                s += (double)x[m * K + i] * w[n * K + i];
                mag += fabs((double)x[m * K + i] * w[n * K + i]);
            }
            e += fabs(y[m * N + n] - s);
            tol += (double)(K + 2) * 0x1p-24 * mag;
        }
        if (e / tol < far) far = e / tol;
    }
    print_message("engine %s: rows' distance from the float32 product %.3g of float32's bound at least\n",
                  aft_bf16_engine_name(aft_bf16_engine_now()), far);
    if (aft_bf16_engine_now() != AFT_BF16_NONE) assert_true(far > 4.0);
    else assert_true(far <= 1.0);
    x[5 * K + 9] = NAN;
    w[7 * K + 3] = INFINITY;
    for (size_t m = 0; m < M; m++) x[m * K + 3] = 0.25f;
    aft_linear_free(&l);
    assert_int_equal(aft_linear_init_bf16(&l, w, AFT_F32, NULL, N, K, 2, &err), AFT_OK);
    aft_linear_apply(&l, M, x, K, y, N);
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++) {
            float v = y[m * N + n];
            if (m == 5) assert_true(isnan(v));
            else if (n == 7) assert_true(isinf(v) && v > 0);
            else assert_true(isfinite(v));
        }
    aft_linear_free(&l);
    /* nonsense dtypes are refused where bf16 packing runs */
    if (aft_bf16_engine_now() != AFT_BF16_NONE) {
        assert_int_equal(aft_linear_init_bf16(&l, w, AFT_I32, NULL, N, K, 1, &err), AFT_ERR_ARG);
        aft_linear_free(&l);
    }
    free(x); free(w); free(y);
}

/* the rates: positive where there is an engine, 0 where there is none */
static void test_rates(void **state)
{
    (void)state;
    double peak = aft_bf16_peak(1);
    print_message("bf16 peak on one thread: %.1f GFLOP/s\n", peak);
    if (aft_bf16_engine_now() != AFT_BF16_NONE) assert_true(peak > 0.0);
    else assert_true(peak == 0.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_blocks),
        cmocka_unit_test(test_gemm_special),
        cmocka_unit_test(test_linear_bf16),
        cmocka_unit_test(test_linear_control),
        cmocka_unit_test(test_rates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
