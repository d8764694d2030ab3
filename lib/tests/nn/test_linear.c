/*
 * test_linear.c - the projections (lib/nn/linear.c): aft_linear with its own
 * kernel, with OpenBLAS and as the default picks, against double loops; and
 * the products on aft's threads (lib/nn/gemm.c).
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

#include "nn/linear.h"   /* aft_linear */
#include "opcheck.h"     /* op_finish */
#include "rng.h"

/* aft_linear (linear.c) with its own kernel forced (every build, whatever
 * the default there), with OpenBLAS, and as the default picks, against
 * double loops written here: M, K, N on and off the tile sizes (rows of 6
 * or 12, 16 or 32 features, 256 inputs a block, 96 rows a block), strides
 * wider than the rows, with and without bias, 1-3 threads. The error bound
 * is the float summation's: (K + 2) eps sum |x w|. The strides' gaps and the
 * rows past M hold a sentinel that must survive, and the own kernel's rows
 * are the same bits whatever the thread count. */
static void test_linear(void **state)
{
    (void)state;
    const size_t Ms[] = {1, 5, 6, 7, 13, 97, 200};
    const size_t Ks[] = {1, 3, 256, 257, 600};
    const size_t Ns[] = {1, 15, 16, 17, 40};
    const aft_kernel modes[] = {AFT_KERNEL_OWN, AFT_KERNEL_BLAS, AFT_KERNEL_AUTO};
    const float sentinel = -12345.0f;
    int fails = 0, cases = 0, reports = 0;
    rng r = {4242};
    for (size_t mi = 0; mi < N_OF(Ms); mi++)
        for (size_t ki = 0; ki < N_OF(Ks); ki++)
            for (size_t ni = 0; ni < N_OF(Ns); ni++) {
                size_t M = Ms[mi], K = Ks[ki], N = Ns[ni], ldx = K + (cases % 3), ldy = N + (cases % 2) * 5;
                int with_bias = cases % 4 != 1;
                float *x = randf(&r, (M + 1) * ldx, 2.0), *w = randf(&r, N * K, 1.0), *b = randf(&r, N, 3.0);
                double *ref = xmalloc(M * N * sizeof *ref), *mag = xmalloc(M * N * sizeof *mag);
                for (size_t m = 0; m < M; m++)
                    for (size_t n = 0; n < N; n++) {
                        double s = with_bias ? b[n] : 0.0, a = fabs(s);
                        for (size_t i = 0; i < K; i++) {
                            s += (double)x[m * ldx + i] * (double)w[n * K + i];
                            a += fabs((double)x[m * ldx + i] * (double)w[n * K + i]);
                        }
                        ref[m * N + n] = s;
                        mag[m * N + n] = a;
                    }
                size_t ny = (M + 1) * ldy;
                float *y = xmalloc(ny * sizeof *y), *y1 = xmalloc(ny * sizeof *y1), *y2 = xmalloc(ny * sizeof *y2),
                      *y3 = xmalloc(ny * sizeof *y3);
                for (size_t mo = 0; mo < N_OF(modes); mo++)
                    for (int th = 1; th <= 3; th++) {
                        char what[200];
                        snprintf(what, sizeof what, "linear M=%zu K=%zu N=%zu ldx=%zu ldy=%zu bias=%d mode=%d threads=%d",
                                 M, K, N, ldx, ldy, with_bias, modes[mo], th);
                        aft_linear l;
                        aft_error err = {{0}};
                        assert_int_equal(aft_linear_init(&l, w, with_bias ? b : NULL, N, K, modes[mo], th, &err), AFT_OK);
                        if (modes[mo] == AFT_KERNEL_OWN && !l.pk) fail_msg("the own kernel was not packed: %s", what);
                        /* packed weights on a cache line: a token's products
                         * stream through them with 64-byte loads */
                        if (l.pk && ((uintptr_t)l.pk % 64 != 0 || (uintptr_t)l.bpad % 64 != 0))
                            fail_msg("packed weights not on a cache line (%p, %p): %s", (void *)l.pk, (void *)l.bpad,
                                     what);
                        for (size_t i = 0; i < ny; i++) y[i] = sentinel;
                        aft_linear_apply(&l, M, x, ldx, y, ldy);
                        int bad = 0;
                        /* x read in place (the layer's output projection):
                         * the same bits, nothing written outside y */
                        for (size_t i = 0; i < ny; i++) y2[i] = sentinel;
                        aft_linear_apply_x(&l, M, x, ldx, y2, ldy, 1);
                        if (memcmp(y, y2, ny * sizeof *y) != 0) {
                            bad = 1;
                            if (reports++ < MAX_REPORTS)
                                print_message("FAIL x in place: not the bits of x packed: %s\n", what);
                        }
                        /* from W^T, as the backward's dy Wo and dQKV Wcat
                         * are run (no bias): aft's kernel packs it as it packs
                         * W, so the same bits; OpenBLAS within the tolerance */
                        if (!with_bias && !bad) {
                            size_t ldwt = N + 3;
                            float *wt = xmalloc(K * ldwt * sizeof *wt);
                            for (size_t i = 0; i < K; i++)
                                for (size_t n = 0; n < N; n++) wt[i * ldwt + n] = w[n * K + i];
                            aft_linear lt;
                            assert_int_equal(aft_linear_init_t(&lt, wt, ldwt, N, K, modes[mo], th, &err), AFT_OK);
                            if (!lt.pk != !l.pk) fail_msg("W^T packed unlike W: %s", what);
                            for (size_t i = 0; i < ny; i++) y2[i] = sentinel;
                            aft_linear_apply_x(&lt, M, x, ldx, y2, ldy, th == 2);
                            aft_linear_free(&lt);
                            free(wt);
                            for (size_t i = 0; i < ny && !bad; i++) {
                                size_t m = i / ldy, n = i % ldy;
                                int in = m < M && n < N;
                                double tol = in ? (double)(K + 2) * 0x1p-24 * mag[m * N + n] + 1e-30 : 0.0;
                                if (l.pk ? y2[i] != y[i] : in ? !(fabs((double)y2[i] - ref[m * N + n]) <= tol)
                                                              : y2[i] != sentinel) {
                                    bad = 1;
                                    if (reports++ < MAX_REPORTS)
                                        print_message("FAIL from W^T at m=%zu n=%zu (%.9g, from W %.9g): %s\n", m,
                                                      n, (double)y2[i], (double)y[i], what);
                                }
                            }
                        }
                        /* views of features [f0, N) (in the packing, or
                         * packed anew off a panel's edge): the bits of W's
                         * rows from f0 set up on their own, in y's columns */
                        const size_t f0s[] = {16, 1};
                        for (size_t fi = 0; fi < N_OF(f0s) && !bad; fi++) {
                            size_t f0 = f0s[fi];
                            if (f0 >= N) continue;
                            aft_linear v, sub;
                            assert_int_equal(aft_linear_view(&v, &l, f0, N - f0, &err), AFT_OK);
                            assert_int_equal(aft_linear_init(&sub, w + f0 * K, with_bias ? b + f0 : NULL, N - f0, K,
                                                             modes[mo], th, &err), AFT_OK);
                            for (size_t i = 0; i < ny; i++) y2[i] = y3[i] = sentinel;
                            aft_linear_apply(&v, M, x, ldx, y2, ldy);
                            aft_linear_apply(&sub, M, x, ldx, y3, ldy);
                            aft_linear_free(&v);
                            aft_linear_free(&sub);
                            if (memcmp(y3, y2, ny * sizeof *y) != 0) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS)
                                    print_message("FAIL view from %zu: not the bits of its rows alone: %s\n", f0, what);
                            }
                            /* and aft's kernel gives a column the same bits
                             * whatever the columns beside it (OpenBLAS need not) */
                            for (size_t m = 0; m < M && !bad && l.pk; m++)
                                for (size_t n = f0; n < N; n++)
                                    if (y2[m * ldy + n - f0] != y[m * ldy + n]) {
                                        bad = 1;
                                        if (reports++ < MAX_REPORTS)
                                            print_message("FAIL view from %zu: column %zu is not the whole's: %s\n",
                                                          f0, n, what);
                                        break;
                                    }
                        }
                        /* each row alone (a token at a time: the one-row
                         * path) gives the bits it got among all M rows */
                        for (size_t m = 0; m < M && !bad && modes[mo] == AFT_KERNEL_OWN; m++) {
                            float row[64];
                            aft_linear_apply(&l, 1, x + m * ldx, ldx, row, N);
                            if (memcmp(row, y + m * ldy, N * sizeof *row) != 0) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS)
                                    print_message("FAIL row %zu alone: not the bits it had among %zu: %s\n", m, M,
                                                  what);
                            }
                        }
                        aft_linear_free(&l);
                        for (size_t i = 0; i < ny && !bad; i++) {
                            size_t m = i / ldy, n = i % ldy;
                            if (m >= M || n >= N) {
                                if (y[i] != sentinel) {
                                    bad = 1;
                                    if (reports++ < MAX_REPORTS)
                                        print_message("FAIL wrote outside the rows at m=%zu n=%zu: %s\n", m, n, what);
                                }
                                continue;
                            }
                            double e = fabs((double)y[i] - ref[m * N + n]);
                            double tol = (double)(K + 2) * 0x1p-24 * mag[m * N + n] + 1e-30;
                            if (!(e <= tol)) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS)
                                    print_message("FAIL |err| %.3g > %.3g at m=%zu n=%zu (y %.9g ref %.9g): %s\n", e,
                                                  tol, m, n, (double)y[i], ref[m * N + n], what);
                            }
                        }
                        if (!bad && modes[mo] == AFT_KERNEL_OWN) {
                            if (th == 1) memcpy(y1, y, ny * sizeof *y);
                            else if (memcmp(y1, y, ny * sizeof *y) != 0) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS)
                                    print_message("FAIL not the bits of one thread: %s\n", what);
                            }
                        }
                        fails += bad;
                        cases++;
                    }
                free(x); free(w); free(b); free(ref); free(mag); free(y); free(y1); free(y2); free(y3);
            }
    /* a view past the product's features is refused */
    {
        float w[2 * 32] = {0};
        aft_linear l, v;
        aft_error err = {{0}};
        assert_int_equal(aft_linear_init(&l, w, NULL, 32, 2, AFT_KERNEL_OWN, 1, &err), AFT_OK);
        assert_int_equal(aft_linear_view(&v, &l, 16, 17, &err), AFT_ERR_ARG);
        assert_int_equal(aft_linear_view(&v, &l, 33, 0, &err), AFT_ERR_ARG);
        aft_linear_free(&l);
        /* and any view of a product given W^T */
        assert_int_equal(aft_linear_init_t(&l, w, 32, 32, 2, AFT_KERNEL_OWN, 1, &err), AFT_OK);
        assert_int_equal(aft_linear_view(&v, &l, 0, 16, &err), AFT_ERR_ARG);
        aft_linear_free(&l);
    }
    op_finish(fails, cases);
}

/* 16-bit weights (aft_linear_init_dt): the panels hold f16 or bf16 and the
 * kernels widen them in registers, so every product gives the bits of the
 * same weights widened to float32 first: y, x in place, views and a row
 * alone, each against the float32 linear of the widened W, byte for byte,
 * with aft's kernel and with OpenBLAS (which reads a widened copy). The
 * panels' dtype is what the level can widen: bf16 everywhere, f16 from
 * avx2 up (base packs it widened); OpenBLAS holds float32. */
static void test_linear_16(void **state)
{
    (void)state;
    const size_t Ms[] = {1, 5, 13, 97};
    const size_t Ks[] = {3, 257, 600};
    const size_t Ns[] = {15, 17, 40};
    const aft_kernel modes[] = {AFT_KERNEL_OWN, AFT_KERNEL_BLAS, AFT_KERNEL_AUTO};
    const aft_dtype dts[] = {AFT_F16, AFT_BF16};
    const char *level = aft_levels(&(size_t){0})[aft_level_in_use()].name;
    int f16_in_regs = strcmp(level, "base") != 0;
    int fails = 0, cases = 0, reports = 0;
    rng r = {1616};
    for (size_t mi = 0; mi < N_OF(Ms); mi++)
        for (size_t ki = 0; ki < N_OF(Ks); ki++)
            for (size_t ni = 0; ni < N_OF(Ns); ni++)
                for (size_t di = 0; di < N_OF(dts); di++) {
                    size_t M = Ms[mi], K = Ks[ki], N = Ns[ni], ldx = K + (cases % 3), ldy = N + 2;
                    aft_dtype dt = dts[di];
                    float *x = randf(&r, M * ldx, 2.0), *wr = randf(&r, N * K, 1.0), *b = randf(&r, N, 3.0);
                    /* W as stored (16 bits, odd-aligned in the buffer: any
                     * alignment is allowed) and widened */
                    unsigned char *wbuf = xmalloc(N * K * 2 + 1), *w16 = wbuf + 1;
                    float *w = xmalloc(N * K * sizeof *w);
                    for (size_t i = 0; i < N * K; i++) {
                        uint16_t h = dt == AFT_F16 ? aft_f32_to_f16(wr[i]) : aft_f32_to_bf16(wr[i]);
                        if (i % 97 == 3 && dt == AFT_F16) h = (uint16_t)(0x0001 + i % 0x3ff);   /* subnormals */
                        memcpy(w16 + 2 * i, &h, 2);
                        w[i] = dt == AFT_F16 ? aft_f16_to_f32(h) : aft_bf16_to_f32(h);
                    }
                    size_t ny = M * ldy;
                    float *y = xmalloc(ny * sizeof *y), *y2 = xmalloc(ny * sizeof *y2);
                    for (size_t mo = 0; mo < N_OF(modes); mo++) {
                        char what[200];
                        snprintf(what, sizeof what, "linear %s M=%zu K=%zu N=%zu mode=%d", aft_dtype_name(dt), M, K,
                                 N, modes[mo]);
                        int th = 1 + (int)(cases % 2), bad = 0;
                        aft_linear l, lf;
                        aft_error err = {{0}};
                        const float *bias = cases % 3 ? b : NULL;
                        assert_int_equal(aft_linear_init_dt(&l, w16, dt, bias, N, K, modes[mo], th, &err), AFT_OK);
                        assert_int_equal(aft_linear_init(&lf, w, bias, N, K, modes[mo], th, &err), AFT_OK);
                        aft_dtype want = !l.pk ? AFT_F32 : dt == AFT_F16 && !f16_in_regs ? AFT_F32 : dt;
                        if (aft_linear_dtype(&l) != want)
                            fail_msg("held as %s, not %s: %s", aft_dtype_name(aft_linear_dtype(&l)),
                                     aft_dtype_name(want), what);
                        if (!l.pk != !lf.pk) fail_msg("packed unlike the float32 W: %s", what);
                        for (int xc = 0; xc < 2 && !bad; xc++) {
                            memset(y, 0, ny * sizeof *y);
                            memset(y2, 0, ny * sizeof *y2);
                            aft_linear_apply_x(&l, M, x, ldx, y, ldy, xc);
                            aft_linear_apply_x(&lf, M, x, ldx, y2, ldy, xc);
                            if (memcmp(y, y2, ny * sizeof *y) != 0) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS)
                                    print_message("FAIL not the float32 bits (x in place %d): %s\n", xc, what);
                            }
                        }
                        for (size_t m = 0; m < M && !bad && l.pk; m++) {   /* a row alone */
                            float row[64];
                            aft_linear_apply(&l, 1, x + m * ldx, ldx, row, N);
                            if (memcmp(row, y2 + m * ldy, N * sizeof *row) != 0) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS) print_message("FAIL row %zu alone: %s\n", m, what);
                            }
                        }
                        const size_t f0s[] = {16, 1};
                        for (size_t fi = 0; fi < N_OF(f0s) && !bad; fi++) {
                            if (f0s[fi] >= N) continue;
                            aft_linear v, vf;
                            assert_int_equal(aft_linear_view(&v, &l, f0s[fi], N - f0s[fi], &err), AFT_OK);
                            assert_int_equal(aft_linear_view(&vf, &lf, f0s[fi], N - f0s[fi], &err), AFT_OK);
                            memset(y, 0, ny * sizeof *y);
                            memset(y2, 0, ny * sizeof *y2);
                            aft_linear_apply(&v, M, x, ldx, y, ldy);
                            aft_linear_apply(&vf, M, x, ldx, y2, ldy);
                            aft_linear_free(&v);
                            aft_linear_free(&vf);
                            if (memcmp(y, y2, ny * sizeof *y) != 0) {
                                bad = 1;
                                if (reports++ < MAX_REPORTS)
                                    print_message("FAIL view from %zu: %s\n", f0s[fi], what);
                            }
                        }
                        aft_linear_free(&l);
                        aft_linear_free(&lf);
                        fails += bad;
                        cases++;
                    }
                    free(x); free(wr); free(b); free(wbuf); free(w); free(y); free(y2);
                }
    /* a dtype a product does not take is refused */
    {
        aft_linear l;
        aft_error err = {{0}};
        float w[4] = {0};
        assert_int_equal(aft_linear_init_dt(&l, w, AFT_F64, NULL, 2, 2, AFT_KERNEL_OWN, 1, &err), AFT_ERR_ARG);
    }
    op_finish(fails, cases);
}

/* one product's checks (test_gemm): y against the double loops within
 * (K + 2) eps sum |a b| (+ |bias|), the sentinel kept outside M x N of
 * ldc's rows and past them, and (own) the bits of aft's kernel when it
 * runs the product; 1 when something failed */
typedef struct {
    const char *what;
    size_t M, N, K, ldc;
    const double *ref, *mag;
    const float *own;   /* the bits aft's kernel gives, or NULL */
} gemm_case;

static int gemm_check(const gemm_case *g, const float *y, float sentinel, int *reports)
{
    for (size_t i = 0; i < (g->M + 1) * g->ldc; i++) {
        size_t m = i / g->ldc, n = i % g->ldc;
        if (m >= g->M || n >= g->N) {
            if (y[i] == sentinel) continue;
            if ((*reports)++ < MAX_REPORTS) print_message("FAIL wrote outside C at m=%zu n=%zu: %s\n", m, n, g->what);
            return 1;
        }
        double e = fabs((double)y[i] - g->ref[m * g->N + n]);
        double tol = (double)(g->K + 2) * 0x1p-24 * g->mag[m * g->N + n] + 1e-30;
        if (!(e <= tol)) {
            if ((*reports)++ < MAX_REPORTS)
                print_message("FAIL |err| %.3g > %.3g at m=%zu n=%zu: %s\n", e, tol, m, n, g->what);
            return 1;
        }
        if (g->own && memcmp(&y[i], &g->own[i], sizeof *y) != 0) {
            if ((*reports)++ < MAX_REPORTS)
                print_message("FAIL not aft's kernel's bits at m=%zu n=%zu (%.9g, %.9g): %s\n", m, n, (double)y[i],
                              (double)g->own[i], g->what);
            return 1;
        }
    }
    return 0;
}

/* aft_gemm and aft_gemm_tn (gemm.c): against double loops, strides wider
 * than the rows, with and without bias, 1-3 threads. aft_gemm_tn runs on
 * aft's tile in a 16-float build, A and B read in place: there its bits,
 * at every thread count, must be aft_linear's own kernel's on a transposed
 * copy of A (the same sums in the same order), so a change of route or of
 * the in-place reads shows. */
static void test_gemm(void **state)
{
    (void)state;
    const size_t Ms[] = {5, 96, 200};
    const size_t Ns[] = {32, 113, 128, 256};
    const size_t Ks[] = {1, 113, 257};
    const float sentinel = -12345.0f;
    const char *kern = aft_linear_kernel();
    const int wide = kern && strcmp(kern, "aft 12x32") == 0;
    int fails = 0, cases = 0, reports = 0;
    rng r = {777};
    for (size_t mi = 0; mi < N_OF(Ms); mi++)
        for (size_t ni = 0; ni < N_OF(Ns); ni++)
            for (size_t ki = 0; ki < N_OF(Ks); ki++)
                for (int kind = 0; kind < 4; kind++) {   /* trans_b with bias, then not, B, A^T B */
                    size_t M = Ms[mi], N = Ns[ni], K = Ks[ki], ldc = N + 2 * (kind % 2);
                    int tb = kind < 2, tn = kind == 3, bias = kind == 0;
                    size_t lda = tn ? M + 3 : K + 1, ldb = tb ? K + (ki == 1 ? 3 : 0) : N + 5;
                    size_t arows = tn ? K : M, brows = tb ? N : K;
                    float *a = randf(&r, arows * lda, 2.0), *b = randf(&r, brows * ldb, 1.0), *bs = randf(&r, N, 3.0);
                    double *ref = xmalloc(M * N * sizeof *ref), *mag = xmalloc(M * N * sizeof *mag);
                    for (size_t m = 0; m < M; m++)
                        for (size_t n = 0; n < N; n++) {
                            double sum = bias ? bs[n] : 0.0, abs_sum = fabs(sum);
                            for (size_t i = 0; i < K; i++) {
                                double p = (double)(tn ? a[i * lda + m] : a[m * lda + i]) *
                                           (double)(tb ? b[n * ldb + i] : b[i * ldb + n]);
                                sum += p;
                                abs_sum += fabs(p);
                            }
                            ref[m * N + n] = sum;
                            mag[m * N + n] = abs_sum;
                        }
                    size_t ny = (M + 1) * ldc;
                    float *y = xmalloc(ny * sizeof *y), *y1 = xmalloc(ny * sizeof *y1), *own = NULL;
                    if (wide && tn) {   /* aft's kernel on the same product */
                        own = xmalloc(ny * sizeof *own);
                        for (size_t i = 0; i < ny; i++) own[i] = sentinel;
                        float *x = a;
                        size_t ldx = lda;
                        if (tn) {
                            x = xmalloc(M * K * sizeof *x);
                            for (size_t m = 0; m < M; m++)
                                for (size_t i = 0; i < K; i++) x[m * K + i] = a[i * lda + m];
                            ldx = K;
                        }
                        aft_linear l;
                        aft_error err = {{0}};
                        assert_int_equal(tb ? aft_linear_init(&l, b, bias ? bs : NULL, N, K, AFT_KERNEL_OWN, 1, &err)
                                            : aft_linear_init_t(&l, b, ldb, N, K, AFT_KERNEL_OWN, 1, &err),
                                         AFT_OK);
                        aft_linear_apply_x(&l, M, x, ldx, own, ldc, 1);
                        aft_linear_free(&l);
                        if (x != a) free(x);
                    }
                    for (int th = 1; th <= 3; th++) {
                        char what[160];
                        snprintf(what, sizeof what, "%s M=%zu N=%zu K=%zu lda=%zu ldb=%zu ldc=%zu bias=%d threads=%d",
                                 tn ? "gemm_tn" : tb ? "gemm B^T" : "gemm B", M, N, K, lda, ldb, ldc, bias, th);
                        for (size_t i = 0; i < ny; i++) y[i] = sentinel;
                        if (tn) aft_gemm_tn(th, M, N, K, a, lda, b, ldb, y, ldc);
                        else aft_gemm(th, tb, M, N, K, a, lda, b, ldb, bias ? bs : NULL, y, ldc);
                        gemm_case g = {what, M, N, K, ldc, ref, mag, own};
                        int bad = gemm_check(&g, y, sentinel, &reports);
                        /* (OpenBLAS's parts need not: its small-product
                         * kernels sum in another order than its large) */
                        if (!bad && th == 1) memcpy(y1, y, ny * sizeof *y);
                        else if (!bad && own && memcmp(y1, y, ny * sizeof *y) != 0) {
                            bad = 1;
                            if (reports++ < MAX_REPORTS) print_message("FAIL not the bits of one thread: %s\n", what);
                        }
                        fails += bad;
                        cases++;
                    }
                    free(a); free(b); free(bs); free(ref); free(mag); free(y); free(y1); free(own);
                }
    op_finish(fails, cases);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_linear_16),
        cmocka_unit_test(test_gemm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
