/* op.c - aft_op_forward: check the arguments, then pick the kernel:
 *   reference impl            -> op_ref.c (float64, O(T^2 C))
 *   local/conv/simple         -> op_band.c (O(T s C)), unless a mask that is
 *                                neither all-visible nor exactly causal is given
 *   full, or any masked run   -> op_dense.c (blocked products through CBLAS) */
#include "internal.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

static aft_status check_args(const aft_bias *bias, const aft_config *cfg, size_t B, size_t T,
                             size_t C, size_t kc, aft_error *err)
{
    if (!bias || !cfg)
        return aft_fail(err, AFT_ERR_ARG, "missing bias or configuration (NULL)");
    size_t H = cfg->heads ? cfg->heads : 1;
    if ((unsigned)bias->kind > AFT_BIAS_CONV)
        return aft_fail(err, AFT_ERR_ARG, "unknown position bias kind %d", (int)bias->kind);
    if (cfg->variant > AFT_CONV)
        return aft_fail(err, AFT_ERR_ARG, "unknown variant %d", (int)cfg->variant);
    if (T > INT_MAX || C > INT_MAX / 2 || B > INT_MAX)
        return aft_fail(err, AFT_ERR_ARG, "sizes B = %zu, T = %zu, C = %zu exceed the supported range", B, T, C);
    size_t n;
    if (!aft_mul3_ok(B, T, C, &n) || !aft_mul_ok(n, 2 * sizeof(float), &n))
        return aft_fail(err, AFT_ERR_ARG, "sizes B = %zu, T = %zu, C = %zu overflow", B, T, C);
    if (cfg->variant == AFT_CONV) {
        if (cfg->heads == 0)
            return aft_fail(err, AFT_ERR_ARG, "conv: the number of heads must be at least 1");
        if (C % H != 0)
            return aft_fail(err, AFT_ERR_ARG, "conv: %zu heads do not divide the %zu hidden channels", H, C);
        if (kc != C && kc != H)
            return aft_fail(err, AFT_ERR_ARG,
                            "conv: keys have %zu channels; expected %zu (one per value channel) or %zu (one per head)",
                            kc, C, H);
        if (bias->kind != AFT_BIAS_CONV || !bias->conv)
            return aft_fail(err, AFT_ERR_ARG, "conv: needs a per-head position bias of shape (heads, 2*window-1)");
        if (cfg->window == 0)
            return aft_fail(err, AFT_ERR_ARG, "conv: a per-head bias needs a window of at least 1");
    } else {
        if (kc != C)
            return aft_fail(err, AFT_ERR_ARG, "keys have %zu channels but values have %zu", kc, C);
        if (bias->kind == AFT_BIAS_CONV)
            return aft_fail(err, AFT_ERR_ARG, "a per-head (conv) bias needs the conv variant");
    }
    if (cfg->variant == AFT_FULL || cfg->variant == AFT_LOCAL) {
        if ((bias->kind == AFT_BIAS_DENSE || bias->kind == AFT_BIAS_FACTORED) && bias->tmax < T)
            return aft_fail(err, AFT_ERR_ARG,
                            "sequence length T = %zu exceeds the position bias size Tmax = %zu", T, bias->tmax);
        if (bias->kind == AFT_BIAS_DENSE && !bias->dense)
            return aft_fail(err, AFT_ERR_ARG, "dense position bias without data");
        if (bias->kind == AFT_BIAS_FACTORED && (!bias->u || !bias->v || bias->rank == 0))
            return aft_fail(err, AFT_ERR_ARG, "factored position bias needs u, v and a rank >= 1");
    }
    return AFT_OK;
}

/* Does this batch's mask (combined with causality) equal plain causality
 * (*is_causal) or see everything (*all)? Then the mask adds nothing and the
 * fast kernels apply. */
static void classify_mask(const uint8_t *m, size_t T, int causal, int *all, int *is_causal)
{
    *all = !causal;
    *is_causal = 1;
    for (size_t t = 0; t < T && (*all || *is_causal); t++)
        for (size_t j = 0; j < T; j++) {
            int vis = m[t * T + j] != 0 && !(causal && j > t);
            if (!vis) *all = 0;
            if (vis != (j <= t)) *is_causal = 0;
        }
}

aft_status aft_op_forward_ld(float *out, const float *q, size_t ldq, const float *k, size_t ldk,
                             const float *v, size_t ldv, const aft_bias *bias, const aft_config *cfg,
                             size_t B, size_t T, size_t C, size_t kc, aft_error *err)
{
    aft_status st = check_args(bias, cfg, B, T, C, kc, err);
    if (st) return st;
    if (B == 0 || T == 0 || C == 0) return AFT_OK;
    if (!out || !q || !k || !v)
        return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !out ? "out" : !q ? "q" : !k ? "k" : "v");
    if (bias->mask && T > SIZE_MAX / T / B)
        return aft_fail(err, AFT_ERR_ARG, "a mask of B x T x T = %zu x %zu x %zu entries overflows", B, T, T);
    if (cfg->threads != aft_get_threads() || cfg->threads == 0) aft_set_threads(cfg->threads);

    aft_wspec ws = {bias, cfg->variant, T, C, cfg->variant == AFT_CONV ? (cfg->heads ? cfg->heads : 1) : 1,
                    cfg->window, cfg->causal, ldq, ldk, ldv, 0, 0};
    size_t TC = T * C;

    /* one key channel per head (the paper's conv): widen to one per channel */
    float *kwide = NULL;
    if (kc != C) {
        size_t ch = C / kc;
        kwide = aft_alloc_array(B * T, C * sizeof(float));
        if (!kwide) return aft_fail(err, AFT_ERR_NOMEM, "out of memory widening keys to %zu channels", C);
        for (size_t bt = 0; bt < B * T; bt++)
            for (size_t c = 0; c < C; c++) kwide[bt * C + c] = k[bt * ldk + c / ch];
        k = kwide;
        ws.ldk = ldk = C;
    }

    if (cfg->impl == AFT_IMPL_REFERENCE) {
        for (size_t b = 0; b < B && !st; b++) {
            const uint8_t *m = bias->mask ? bias->mask + (bias->mask_batched ? b * T * T : 0) : NULL;
            st = aft_op_reference(out + b * TC, q + b * T * ldq, k + b * T * ldk, v + b * T * ldv, m, &ws, err);
        }
        free(kwide);
        return st;
    }

    /* a mask that is all-visible or exactly causal is dropped for the fast kernels */
    int dense_mask = 0;
    if (bias->mask) {
        size_t nm = bias->mask_batched ? B : 1;
        int all_all = 1, all_causal = 1;
        for (size_t b = 0; b < nm; b++) {
            int a, c;
            classify_mask(bias->mask + b * T * T, T, cfg->causal, &a, &c);
            all_all &= a;
            all_causal &= c;
        }
        if (all_causal) ws.causal = 1;
        else if (!all_all) dense_mask = 1;
    }

    if (!dense_mask && cfg->variant != AFT_FULL) {
        st = aft_op_band(out, q, k, v, B, &ws, err);
    } else {
        for (size_t b = 0; b < B && !st; b++) {
            const uint8_t *m = dense_mask ? bias->mask + (bias->mask_batched ? b * T * T : 0) : NULL;
            st = aft_op_dense(out + b * TC, q + b * T * ldq, k + b * T * ldk, v + b * T * ldv, m, &ws, err);
        }
    }
    free(kwide);
    return st;
}

int aft_op_band_rows_ok(const aft_bias *bias, const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc,
                        aft_wspec *ws)
{
    if (check_args(bias, cfg, B, T, C, kc, NULL) != AFT_OK || B == 0 || T == 0 || C == 0) return 0;
    if (cfg->impl != AFT_IMPL_FAST || bias->mask || kc != C || cfg->variant == AFT_FULL) return 0;
    size_t H = cfg->variant == AFT_CONV && cfg->heads ? cfg->heads : 1;
    *ws = (aft_wspec){bias, cfg->variant, T, C, H, cfg->window, cfg->causal != 0, C, C, C, 0, 0};
    if (cfg->causal) return 1;
    return aft_op_band_zero_bias(ws) ? 2 : 3;
}

aft_status aft_op_forward(float *out, const float *q, const float *k, const float *v,
                          const aft_bias *bias, const aft_config *cfg,
                          size_t B, size_t T, size_t C, size_t kc, aft_error *err)
{
    return aft_op_forward_ld(out, q, C, k, kc, v, C, bias, cfg, B, T, C, kc, err);
}
