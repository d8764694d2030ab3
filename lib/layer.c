/* layer.c - the AFT layer: projections, the operator, the output projection.
 * The layer reaches the operator through op.h alone; the chunked paths are in
 * layer_chunks.c. */
#include "layer.h"
#include "nn/bf16.h"

#include <limits.h>
#include <omp.h>
#include <stdlib.h>

/* the sizes and pointers every entry point checks first */
static aft_status check_params(const aft_params *p, aft_error *err)
{
    size_t D = p->d_model, C = p->d_hidden, KC = p->k_out ? p->k_out : C;
    if (!p->wq || !p->wk || !p->wv || !p->wo)
        return aft_fail(err, AFT_ERR_ARG, "the layer needs query, key, value and output weights");
    if (D == 0 || C == 0)
        return aft_fail(err, AFT_ERR_ARG, "model size %zu and hidden size %zu must be positive", D, C);
    if (D > INT_MAX || C > INT_MAX / 4 || KC > INT_MAX / 4)
        return aft_fail(err, AFT_ERR_ARG, "sizes D = %zu, C = %zu exceed the supported range", D, C);
    return AFT_OK;
}

aft_status aft_layer_prep_linear(const aft_layer_prep *lp, aft_linear *l, const void *w, aft_dtype wdt,
                                 const float *bias, size_t n, size_t k, int threads, aft_error *err)
{
    if (lp->bf16) return aft_linear_init_bf16(l, w, wdt, bias, n, k, threads, err);
    return aft_linear_init_dt(l, w, wdt, bias, n, k, lp->kernel, threads, err);
}

aft_status aft_layer_prep_init(aft_layer_prep *lp, const aft_params *p, aft_kernel kernel, aft_precision precision,
                               int threads, aft_error *err)
{
    memset(lp, 0, sizeof *lp);
    aft_status st = check_params(p, err);
    if (st) return st;
    size_t D = p->d_model, C = p->d_hidden, KC = p->k_out ? p->k_out : C, W = 2 * C + KC;
    *lp = (aft_layer_prep){.p = p, .D = D, .C = C, .KC = KC, .W = W, .kernel = kernel, .threads = threads,
                           .bf16 = aft_bf16_wanted(precision)};
    /* 16-bit weights stay 16-bit: stacked as stored, packed so */
    aft_dtype wdt = aft_dtype_is16(p->w_dtype) ? p->w_dtype : AFT_F32;
    size_t es = aft_dtype_size(wdt);
    lp->wcat = aft_alloc_array(W, D * es);
    lp->bcat = aft_alloc_array(W, sizeof(float));
    if (!lp->wcat || !lp->bcat) {
        aft_layer_prep_free(lp);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the stacked weights (%zu x %zu)", W, D);
    }
    char *wc = lp->wcat;
    memcpy(wc, p->wq, C * D * es);
    memcpy(wc + C * D * es, p->wk, KC * D * es);
    memcpy(wc + (C + KC) * D * es, p->wv, C * D * es);
    int any_bias = p->bq || p->bk || p->bv;
    const float *bs[3] = {p->bq, p->bk, p->bv};
    size_t bn[3] = {C, KC, C}, off = 0;
    for (int i = 0; i < 3; i++) {
        if (bs[i]) memcpy(lp->bcat + off, bs[i], bn[i] * sizeof(float));
        else memset(lp->bcat + off, 0, bn[i] * sizeof(float));
        off += bn[i];
    }
    st = aft_layer_prep_linear(lp, &lp->qkv, lp->wcat, wdt, any_bias ? lp->bcat : NULL, W, D, threads, err);
    if (st == AFT_OK) {
        st = aft_layer_prep_linear(lp, &lp->o, p->wo, wdt, p->bo, D, C, threads, err);
        if (st != AFT_OK) aft_linear_free(&lp->qkv);
    }
    if (st != AFT_OK) {
        free(lp->wcat);
        free(lp->bcat);
        memset(lp, 0, sizeof *lp);
    }
    return st;
}

void aft_layer_prep_free(aft_layer_prep *lp)
{
    if (lp->wcat && lp->bcat) {
        aft_linear_free(&lp->qkv);
        aft_linear_free(&lp->o);
    }
    if (lp->has_t) {
        aft_linear_free(&lp->dh_t);
        aft_linear_free(&lp->dx_t);
    }
    free(lp->wcat);
    free(lp->bcat);
    memset(lp, 0, sizeof *lp);
}

aft_dtype aft_weights_held(aft_dtype stored, aft_kernel projections)
{
    if (!aft_dtype_is16(stored)) return AFT_F32;
    /* a product of one weight, asked how it holds it */
    const uint16_t w[1] = {0};
    aft_linear l;
    if (aft_linear_init_dt(&l, w, stored, NULL, 1, 1, projections, 1, NULL) != AFT_OK) return AFT_F32;
    aft_dtype dt = aft_linear_dtype(&l);
    aft_linear_free(&l);
    return dt;
}

aft_status aft_params_widen(aft_params *out, float **mem, const aft_params *p, aft_error *err)
{
    *out = *p;
    *mem = NULL;
    if (!aft_dtype_is16(p->w_dtype)) return AFT_OK;
    size_t D = p->d_model, C = p->d_hidden, KC = p->k_out ? p->k_out : C, n = 0;
    /* the sizes are check_params's, so (3C + KC) D does not overflow */
    const float *ws[4] = {p->wq, p->wk, p->wv, p->wo};
    const size_t rows[4] = {C, KC, C, D}, cols[4] = {D, D, D, C};
    for (int i = 0; i < 4; i++) n += rows[i] * cols[i];
    float *m = aft_alloc_array(n, sizeof(float));
    if (!m) return aft_fail(err, AFT_ERR_NOMEM, "out of memory widening the weights (%zu values)", n);
    const float **outs[4] = {&out->wq, &out->wk, &out->wv, &out->wo};
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        size_t k = rows[i] * cols[i];
        for (size_t j = 0; j < k; j++) m[off + j] = aft_w_at(ws[i], p->w_dtype, j);
        *outs[i] = m + off;
        off += k;
    }
    out->w_dtype = AFT_F32;
    *mem = m;
    return AFT_OK;
}

aft_status aft_layer_forward(float *y, const float *x, const aft_params *p,
                             const aft_config *cfg, size_t B, size_t T, aft_error *err)
{
    return aft_layer_forward_timed(y, x, p, cfg, B, T, NULL, err);
}

aft_status aft_layer_forward_timed(float *y, const float *x, const aft_params *p,
                                   const aft_config *cfg, size_t B, size_t T,
                                   aft_layer_times *times, aft_error *err)
{
    return aft_layer_forward_chunked(y, x, p, cfg, B, T, AFT_LAYER_CHUNK_AUTO, times, NULL, err);
}

/* the plain path: each projection on its own, in double; the operator
 * counts the rows on cfg's counter (the projections are small beside its
 * O(T^2 C)), and takes them on when `take` */
static aft_status layer_reference(float *y, const float *x, const aft_params *p, const aft_config *cfg, size_t B,
                                  size_t T, int take, aft_layer_times *tm, aft_error *err)
{
    size_t D = p->d_model, C = p->d_hidden, KC = p->k_out ? p->k_out : C, N = B * T;
    float *q = aft_alloc_array(N, C * sizeof(float));
    float *k = aft_alloc_array(N, KC * sizeof(float));
    float *v = aft_alloc_array(N, C * sizeof(float));
    float *h = aft_alloc_array(N, C * sizeof(float));
    if (!q || !k || !v || !h) {
        free(q); free(k); free(v); free(h);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for Q, K, V of %zu x %zu", N, C);
    }
    double t0 = aft_now_ms();
    aft_linear_ref(q, C, x, D, p->wq, p->bq, N, D, C);
    aft_linear_ref(k, KC, x, D, p->wk, p->bk, N, D, KC);
    aft_linear_ref(v, C, x, D, p->wv, p->bv, N, D, C);
    double t1 = aft_now_ms();
    aft_status st = take ? aft_op_forward(h, q, k, v, &p->bias, cfg, B, T, C, KC, err)
                         : aft_op_forward_counted(h, q, k, v, &p->bias, cfg, B, T, C, KC, err);
    double t2 = aft_now_ms();
    if (st == AFT_OK) aft_linear_ref(y, D, h, C, p->wo, p->bo, N, C, D);
    *tm = (aft_layer_times){t1 - t0, t2 - t1, aft_now_ms() - t2};
    free(q); free(k); free(v); free(h);
    return st;
}

/* The whole sequence at once: Q, K, V of every row (one product), the
 * operator reading them in place, rows W apart, the output projection.
 * Sequences whose operator needs none of the others' rows (a grid's, with
 * no mask) go one at a time through buffers of one sequence: for B images
 * of a 56 x 56 grid the buffers of all of them (60 MiB at d = 192) are
 * past what malloc keeps for reuse, so every call faulted them in again,
 * and one image's are still in the caches when the operator reads them.
 * A row's result does not depend on the split. */
static aft_status layer_whole(float *y, const float *x, const aft_layer_prep *lp, aft_opspec sp, size_t B, size_t T,
                              aft_layer_times *tm, aft_error *err)
{
    size_t C = lp->C, KC = lp->KC, W = lp->W, D = lp->D;
    size_t nb = aft_spec_on_grid(&sp) && !sp.bias->mask ? 1 : B, N = nb * T;
    float *qkv = aft_alloc_array(N, W * sizeof(float));
    float *h = aft_alloc_array(N, C * sizeof(float));
    aft_status st = AFT_OK;
    *tm = (aft_layer_times){0, 0, 0};
    if (!qkv || !h) st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for Q, K, V of %zu x %zu", N, W);
    sp.ldq = sp.ldk = sp.ldv = W;
    for (size_t b = 0; b < B && !st; b += nb) {
        double t0 = aft_now_ms();
        aft_linear_apply(&lp->qkv, N, x + b * T * D, D, qkv, W);
        double t1 = aft_now_ms();
        st = aft_op_run(h, qkv, qkv + C, qkv + C + KC, &sp, nb, KC, err);
        double t2 = aft_now_ms();
        if (st == AFT_OK) aft_linear_apply(&lp->o, N, h, C, y + b * T * D, D);
        tm->projections += t1 - t0;
        tm->op += t2 - t1;
        tm->output += aft_now_ms() - t2;
    }
    free(qkv);
    free(h);
    return st;
}

/* Short sequences, two or more (aft_batch_groups), each longer than a
 * chunk: each thread takes whole sequences as it comes free and runs the
 * layer on each alone, its Q, K, V and H in the thread's own buffers (in
 * its caches: 128 rows at C = 256 are 512 KiB), the operator on that
 * thread. No thread waits for another, where the pipeline's chunks each
 * wait for the chunk before (32 sequences of 128 rows ran 1.2 to 1.8
 * times slower so). Shorter sequences go whole through layer_whole, whose
 * operator groups them: one at a time, a call for 8 rows cost more than
 * its work. A row's result does not depend on the split. */
static aft_status layer_sequences(float *y, const float *x, const aft_layer_prep *lp, aft_opspec sp, size_t B,
                                  size_t T, aft_layer_times *tm, aft_error *err)
{
    const size_t C = lp->C, KC = lp->KC, W = lp->W, D = lp->D;
    const size_t nt = aft_batch_groups(sp.threads, B, T);
    float *buf = aft_alloc_array(nt, T * (W + C) * sizeof(float));
    if (!buf) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for Q, K, V of %zu x %zu rows", nt, T);
    sp.threads = 1;
    sp.ldq = sp.ldk = sp.ldv = W;
    aft_status st = AFT_OK;
    double tp = 0, to = 0, tw = 0;
    #pragma omp parallel num_threads((int)nt) reduction(+:tp, to, tw)
    {
        float *qkv = buf + (size_t)omp_get_thread_num() * T * (W + C), *h = qkv + T * W;
        #pragma omp for schedule(dynamic, 1)
        for (size_t b = 0; b < B; b++) {
            if (aft_first_error_seen(&st)) continue;
            /* this sequence's mask, when each has its own */
            aft_bias bb = *sp.bias;
            if (bb.mask && bb.mask_batched) bb.mask += b * T * T;
            aft_opspec one = sp;
            one.bias = &bb;
            aft_error e;
            double t0 = aft_now_ms();
            aft_linear_apply(&lp->qkv, T, x + b * T * D, D, qkv, W);
            double t1 = aft_now_ms();
            aft_status s = aft_op_run(h, qkv, qkv + C, qkv + C + KC, &one, 1, KC, &e);
            double t2 = aft_now_ms();
            if (s == AFT_OK) aft_linear_apply_x(&lp->o, T, h, C, y + b * T * D, D, 1);
            aft_first_error(&st, err, s, &e);
            tp += t1 - t0;
            to += t2 - t1;
            tw += aft_now_ms() - t2;
        }
    }
    /* each thread's sums, averaged over the threads */
    *tm = (aft_layer_times){tp / (double)nt, to / (double)nt, tw / (double)nt};
    free(buf);
    return st;
}

/* aft_layer_forward_chunked; take: the rows go on cfg's counter's total
 * here (else the caller took them on) */
static aft_status layer_forward(float *y, const float *x, const aft_params *p, const aft_config *cfg, size_t B,
                                size_t T, size_t chunk, aft_layer_times *times, int *streamed_out, int take,
                                aft_error *err)
{
    if (streamed_out) *streamed_out = 0;
    aft_layer_times tm = {0, 0, 0};
    if (times) *times = tm;
    aft_status st = check_params(p, err);
    if (st) return st;
    size_t C = p->d_hidden, KC = p->k_out ? p->k_out : C, N;
    if (!aft_mul_ok(B, T, &N) || N > INT_MAX)
        return aft_fail(err, AFT_ERR_ARG, "B * T = %zu * %zu exceeds the supported range", B, T);
    if (N == 0) return AFT_OK;
    if (!x || !y) return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", !x ? "input x" : "output y");
    if (cfg->impl == AFT_IMPL_REFERENCE) {
        aft_params pw;
        float *wmem;
        if ((st = aft_params_widen(&pw, &wmem, p, err))) return st;
        st = layer_reference(y, x, &pw, cfg, B, T, take, &tm, err);
        free(wmem);
        if (times) *times = tm;
        return st;
    }
    aft_opspec sp;
    if ((st = aft_spec_settle(&sp, &p->bias, cfg, B, T, C, KC, err))) return st;
    aft_layer_prep lp;
    if ((st = aft_layer_prep_init(&lp, p, cfg->projections, cfg->precision, sp.threads, err))) return st;
    /* the rows on the caller's counter: each path counts them as it goes */
    const size_t seen0 = aft_progress_seen(cfg->progress);
    sp.progress = take ? aft_progress_plan(cfg->progress, N) : cfg->progress;
    /* short sequences, two or more, that the chunked paths would cut */
    if (chunk == AFT_LAYER_CHUNK_AUTO && T > aft_layer_step(&lp) && aft_batch_groups(sp.threads, B, T) > 1 &&
        !aft_spec_on_grid(&sp)) {
        st = layer_sequences(y, x, &lp, sp, B, T, &tm, err);
        if (times) *times = tm;
        aft_layer_prep_free(&lp);
        return st;
    }
    int streamed = aft_layer_chunked(y, x, &lp, &sp, B, T, chunk, &tm, NULL, &st, err);
    if (streamed_out) *streamed_out = streamed == 1;
    /* not chunked, or a key of +inf or NaN stopped it: the whole sequence
     * (the rows the chunks had counted are taken on again) */
    if (streamed == -2) aft_progress_plan(sp.progress, aft_progress_seen(sp.progress) - seen0);
    if (streamed == 0 || streamed == -2) st = layer_whole(y, x, &lp, sp, B, T, &tm, err);
    if (times) *times = tm;
    aft_layer_prep_free(&lp);
    return st;
}

aft_status aft_layer_forward_chunked(float *y, const float *x, const aft_params *p,
                                     const aft_config *cfg, size_t B, size_t T, size_t chunk,
                                     aft_layer_times *times, int *streamed_out, aft_error *err)
{
    return layer_forward(y, x, p, cfg, B, T, chunk, times, streamed_out, 1, err);
}

aft_status aft_layer_forward_counted(float *y, const float *x, const aft_params *p, const aft_config *cfg, size_t B,
                                     size_t T, aft_error *err)
{
    return layer_forward(y, x, p, cfg, B, T, AFT_LAYER_CHUNK_AUTO, NULL, NULL, 0, err);
}
