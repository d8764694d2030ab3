/* layer_chunks.c - the layer a chunk of rows at a time: each chunk on one
 * thread from its Q, K, V to its output rows, so a chunk's Q, K, V and
 * operator output stay in that core's caches and the buffers stay small
 * whatever T is. Three paths: simple without causality (one softmax
 * average), the band without causality (sums from both ends), and the
 * causal pipeline, which can also continue a run from the rows and sums an
 * earlier one left (aft_layer_carry: the streaming state). */
#include "layer_chunks.h"

#include <omp.h>

#include <math.h>
#include <sched.h>
#include <stdlib.h>

/* The streamed path of simple without causality: Y = sigmoid(Q) * g, g the
 * softmax average of V over the whole sequence. Each sequence goes through
 * in chunks of rows, each on the next free thread: Q, K, V of the chunk (one
 * product), sigmoid(Q) kept (T x C), the chunk's keys and values taken into
 * softmax sums of its own, all while the chunk is in its core's caches.
 * Then the chunks' sums are added up in order, g is folded into the output
 * weights (Wo diag(g)) and the output comes from sigmoid(Q) a chunk at a
 * time, the same bits whatever the thread count. Q, K, V are never held
 * for the whole sequence.
 * Returns as layer_streamed. */
static int layer_streamed_simple(float *y, const float *x, const aft_params *p, const aft_opspec *sp, size_t B,
                                 size_t T, size_t chunk, const aft_layer_prep *lw, aft_layer_times *tm,
                                 aft_status *st, aft_error *err)
{
    size_t D = p->d_model, C = p->d_hidden, KC = p->k_out ? p->k_out : C, W = 2 * C + KC;
    size_t nch = (T + chunk - 1) / chunk;
    int nt = sp->threads;
    if ((size_t)nt > nch) nt = (int)nch;
    float *qkv = aft_alloc_array((size_t)nt * chunk, W * sizeof(float));
    float *sq = aft_alloc_array(T, C * sizeof(float));
    float *sums = aft_alloc_array(nch, 4 * C * sizeof(float));
    float *wog = aft_alloc_array(D, C * sizeof(float));
    if (!qkv || !sq || !sums || !wog) {
        free(qkv); free(sq); free(sums); free(wog);
        *st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for chunks of %zu rows of Q, K, V (%zu wide)", chunk, W);
        return -1;
    }
    int ret = 1;
    for (size_t b = 0; b < B && ret == 1; b++) {
        double tp = 0, to = 0;
        int r = 1;
        #pragma omp parallel num_threads(nt) reduction(+:tp, to) reduction(min:r)
        {
            float *buf = qkv + (size_t)omp_get_thread_num() * chunk * W;
            #pragma omp for schedule(dynamic, 1)
            for (size_t j = 0; j < nch; j++) {
                size_t R0 = j * chunk, len = T - R0 < chunk ? T - R0 : chunk;
                double t0 = aft_now_ms();
                aft_linear_apply(&lw->qkv, len, x + (b * T + R0) * D, D, buf, W);
                double t1 = aft_now_ms();
                /* the chunk's softmax sums (m, s0, s1; the fourth array
                 * scratch, then the keys' maximum: m itself) */
                float *sj = sums + j * 4 * C;
                if (aft_sums_of_rows(buf + C, W, buf + C + KC, W, 0, len, C, sj, sj + C, sj + 2 * C, sj + 3 * C))
                    r = 0;
                memcpy(sj + 3 * C, sj, C * sizeof(float));
                for (size_t t = 0; t < len; t++)
                    for (size_t c = 0; c < C; c++) sq[(R0 + t) * C + c] = aft_sigmoidf(buf[t * W + c]);
                tp += t1 - t0;
                to += aft_now_ms() - t1;
            }
        }
        tm->projections += tp / nt;
        tm->op += to / nt;
        if (!r) {   /* a key of +inf or NaN */
            ret = -2;   /* a key of +inf or NaN */
            break;
        }
        double t2 = aft_now_ms();
        for (size_t j = 1; j < nch; j++) aft_sums_merge(sums, sums + j * 4 * C, C);
        aft_wo_scaled(wog, sums, sums, p, D, C);
        aft_linear lo;
        *st = aft_layer_prep_linear(lw, &lo, wog, AFT_F32, p->bo, D, C, sp->threads, err);
        if (*st != AFT_OK) {
            ret = -1;
            break;
        }
        /* a chunk's rows at a time, so that each row comes from a product
         * of the same shape whatever the thread count (OpenBLAS takes
         * other paths for small products: a row's bits can depend on M) */
        #pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
        for (size_t j = 0; j < nch; j++) {
            size_t R0 = j * chunk, len = T - R0 < chunk ? T - R0 : chunk;
            aft_linear_apply(&lo, len, sq + R0 * C, C, y + (b * T + R0) * D, D);
            aft_progress_done(sp->progress, len);
        }
        aft_linear_free(&lo);
        tm->output += aft_now_ms() - t2;
    }
    free(qkv);
    free(sq);
    free(sums);
    free(wog);
    return ret;
}

/* The streamed path without causality: no mask, a band (local, or conv
 * with keys of one channel per value channel). A row needs the keys left
 * of its window and right of it, so K and V of the whole sequence come
 * first (one product, 2 x T x C floats), then the keys' running sums in
 * pieces, in parallel: the pieces end where a chunk's held rows start (its
 * first row less the halo) and where its window ends (its last row plus
 * the halo), so each key is in one piece (and checked once). Added up from
 * the start and from the end, they give each chunk the sums of every key
 * before its rows and after its window. Then every chunk is
 * independent: each on the next free thread, start to end there: its
 * Q, the band kernel on its rows, its output projection. Q, the operator's
 * output and the right part's per-row sums are a chunk's worth per thread,
 * not the sequence's, and the bits do not depend on the thread count.
 * Returns as layer_streamed. */
/* layer_streamed_both's buffers and sizes */
typedef struct {
    const aft_params *p;
    const aft_layer_prep *lw;
    aft_opspec ws;           /* rows of q C floats apart, of k and v 2C (in kv) */
    size_t T, chunk, halo, nch;
    int nt;
    float *kv;               /* (T, 2C): K | V of the sequence */
    float *q, *h;            /* (nt, chunk, C) each: a thread's chunk of Q and of the operator's output */
    size_t *pt, npt;         /* the pieces' ends (below): at most 2 nch */
    float *pre, *suf;        /* (2 nch, 4C) each: the keys' sums over [0, pt[i]) and [pt[i], T) */
    float *bm;               /* (nt, C): scratch of aft_sums_of_rows */
    aft_op_rows_ctx **ctx;   /* (nt): one a thread */
    aft_linear lq, lkv;      /* Q alone, and K, V together */
    aft_status sq, skv;      /* whether lq, lkv were made */
} both_job;

/* the points 0, j chunk - halo, j chunk + halo (0 < j < nch) and T,
 * clamped to T, in order and without repeats: at most 2 nch of them
 * (halo <= chunk) */
static void both_points(both_job *bj)
{
    const size_t nch = bj->nch, chunk = bj->chunk, halo = bj->halo, T = bj->T;
    size_t *pt = bj->pt, npt = 0;
    pt[npt++] = 0;
    for (size_t a = 1, b = 1; a < nch || b < nch;) {
        size_t va = a < nch ? a * chunk - halo : SIZE_MAX, vb = b < nch ? b * chunk + halo : SIZE_MAX;
        size_t v = va <= vb ? va : vb;
        if (va <= vb) a++;
        else b++;
        v = v < T ? v : T;
        if (v != pt[npt - 1]) pt[npt++] = v;
    }
    if (pt[npt - 1] != T) pt[npt++] = T;
    bj->npt = npt;
}

static void both_free(both_job *bj)
{
    for (int i = 0; bj->ctx && i < bj->nt; i++) aft_op_rows_free(bj->ctx[i]);
    free(bj->kv); free(bj->q); free(bj->h); free(bj->pt); free(bj->pre); free(bj->suf); free(bj->bm); free(bj->ctx);
    if (bj->sq == AFT_OK) aft_linear_free(&bj->lq);
    if (bj->skv == AFT_OK) aft_linear_free(&bj->lkv);
}

/* bj's buffers, its points and its products; returns 0 (and sets *st)
 * when out of memory, with nothing left to free */
static int both_alloc(both_job *bj, aft_status *st, aft_error *err)
{
    const size_t T = bj->T, C = bj->p->d_hidden, nch = bj->nch, nt = (size_t)bj->nt;
    bj->kv = aft_alloc_array(T, 2 * C * sizeof(float));
    bj->q = aft_alloc_array(nt * bj->chunk, C * sizeof(float));
    bj->h = aft_alloc_array(nt * bj->chunk, C * sizeof(float));
    bj->pt = calloc(2 * nch, sizeof *bj->pt);
    if (bj->pt) both_points(bj);
    bj->pre = aft_alloc_array(2 * nch, 4 * C * sizeof(float));
    bj->suf = aft_alloc_array(2 * nch, 4 * C * sizeof(float));
    bj->bm = aft_alloc_array(nt, C * sizeof(float));
    bj->ctx = calloc(nt, sizeof *bj->ctx);
    /* Q alone and K, V together: the stacked weights' rows [0, C) and
     * [C, 3C) (here KC = C), in their packing when C is a whole number of
     * its panels (no second packing of the same weights) */
    bj->sq = aft_linear_view(&bj->lq, &bj->lw->qkv, 0, C, err);
    bj->skv = bj->sq == AFT_OK ? aft_linear_view(&bj->lkv, &bj->lw->qkv, C, 2 * C, err) : bj->sq;
    int ok = bj->kv && bj->q && bj->h && bj->pt && bj->pre && bj->suf && bj->bm && bj->ctx && bj->skv == AFT_OK;
    bj->ws.ldq = C;
    bj->ws.ldk = bj->ws.ldv = 2 * C;
    for (int i = 0; ok && i < bj->nt; i++) ok = (bj->ctx[i] = aft_op_rows_new(&bj->ws, bj->chunk)) != NULL;
    if (ok) return 1;
    *st = bj->skv != AFT_OK ? bj->skv : aft_fail(err, AFT_ERR_NOMEM, "out of memory for K, V of %zu x %zu", T, C);
    both_free(bj);
    return 0;
}

/* Sequence b's K and V (all of them), then the keys' running sums in
 * pieces: each key in one piece [pt[i], pt[i + 1]), its sums in suf[i];
 * then the prefixes into pre and the suffixes in place. Returns 0 when a
 * key is +inf or NaN. */
static int both_key_sums(both_job *bj, const float *x, size_t b, aft_layer_times *tm)
{
    const size_t T = bj->T, D = bj->p->d_model, C = bj->p->d_hidden, chunk = bj->chunk, nch = bj->nch;
    const size_t npt = bj->npt;
    float *kv = bj->kv, *pre = bj->pre, *suf = bj->suf;
    double t0 = aft_now_ms();
    /* the stacked weights hold Q, K, V in that order: K and V are the
     * rows from C on; a chunk at a time, so that each row comes from a
     * product of the same shape whatever the thread count (OpenBLAS
     * takes other paths for small products) */
    #pragma omp parallel for num_threads(bj->nt) schedule(dynamic, 1)
    for (size_t j = 0; j < nch; j++) {
        size_t R0 = j * chunk, len = T - R0 < chunk ? T - R0 : chunk;
        aft_linear_apply(&bj->lkv, len, x + (b * T + R0) * D, D, kv + R0 * 2 * C, 2 * C);
    }
    double t1 = aft_now_ms();
    int bad = 0;
    #pragma omp parallel for num_threads(bj->nt) schedule(dynamic, 1) reduction(|:bad)
    for (size_t i = 0; i < npt - 1; i++) {
        float *r = suf + i * 4 * C, *scr = bj->bm + (size_t)omp_get_thread_num() * C;
        bad |= aft_sums_of_rows(kv, 2 * C, kv + C, 2 * C, bj->pt[i], bj->pt[i + 1], C, r, r + C, r + 2 * C, scr);
        memcpy(r + 3 * C, r, C * sizeof(float));
    }
    if (bad) return 0;
    aft_sums_empty(pre, C);   /* no keys: [0, 0) and [T, T) */
    aft_sums_empty(suf + (npt - 1) * 4 * C, C);
    for (size_t i = 1; i < npt; i++) {
        memcpy(pre + i * 4 * C, pre + (i - 1) * 4 * C, 4 * C * sizeof(float));
        aft_sums_merge(pre + i * 4 * C, suf + (i - 1) * 4 * C, C);
    }
    for (size_t i = npt - 1; i-- > 0;) aft_sums_merge(suf + i * 4 * C, suf + (i + 1) * 4 * C, C);
    double t2 = aft_now_ms();
    tm->projections += t1 - t0;
    tm->op += t2 - t1;
    return 1;
}

/* Sequence b's chunks, each on the next free thread, start to end there:
 * its Q, the band kernel on its rows (from the sums of the keys before
 * its held rows and after its window), its output projection */
static void both_chunks(both_job *bj, float *y, const float *x, size_t b, aft_layer_times *tm)
{
    const size_t T = bj->T, D = bj->p->d_model, C = bj->p->d_hidden, chunk = bj->chunk, nch = bj->nch;
    const size_t halo = bj->halo, npt = bj->npt;
    const int nt = bj->nt;
    double tp = 0, to = 0, tw = 0;
    #pragma omp parallel num_threads(nt) reduction(+:tp, to, tw)
    {
        size_t tid = (size_t)omp_get_thread_num();
        float *qt = bj->q + tid * chunk * C, *ht = bj->h + tid * chunk * C;
        #pragma omp for schedule(dynamic, 1)
        for (size_t j = 0; j < nch; j++) {
            size_t R0 = j * chunk, len = T - R0 < chunk ? T - R0 : chunk, hl = R0 ? halo : 0;
            double u0 = aft_now_ms();
            aft_linear_apply(&bj->lq, len, x + (b * T + R0) * D, D, qt, C);
            double u1 = aft_now_ms();
            aft_opspec w = bj->ws;
            w.T = T - (R0 - hl);
            w.t_off = R0 - hl;
            w.q_row0 = hl;
            const float *kr = bj->kv + (R0 - hl) * 2 * C;
            /* the sums of the keys before R0 - halo and from R0 + len +
             * halo on (the pieces above checked every key) */
            size_t il = aft_sorted_index(bj->pt, npt, R0 - hl);
            size_t ir = aft_sorted_index(bj->pt, npt, R0 + len + halo < T ? R0 + len + halo : T);
            (void)aft_op_rows(bj->ctx[tid], ht, qt, kr, kr + C, &w, hl, hl + len, j ? bj->pre + il * 4 * C : NULL,
                                    NULL, j + 1 < nch ? bj->suf + ir * 4 * C : NULL);
            double u2 = aft_now_ms();
            aft_linear_apply_x(&bj->lw->o, len, ht, C, y + (b * T + R0) * D, D, 1);
            aft_progress_done(bj->ws.progress, len);
            tp += u1 - u0;
            to += u2 - u1;
            tw += aft_now_ms() - u2;
        }
    }
    tm->projections += tp / nt;
    tm->op += to / nt;
    tm->output += tw / nt;
}

static int layer_streamed_both(float *y, const float *x, const aft_params *p, aft_opspec ws, size_t B, size_t T,
                               size_t chunk, size_t halo, const aft_layer_prep *lw, aft_layer_times *tm,
                               aft_status *st, aft_error *err)
{
    both_job bj = {.p = p, .lw = lw, .ws = ws, .T = T, .chunk = chunk, .halo = halo,
                   .nch = (T + chunk - 1) / chunk, .nt = ws.threads};
    if ((size_t)bj.nt > bj.nch) bj.nt = (int)bj.nch;
    if (!both_alloc(&bj, st, err)) return -1;
    int ret = 1;
    for (size_t b = 0; b < B && ret == 1; b++) {
        if (!both_key_sums(&bj, x, b, tm)) {
            ret = -2;   /* a key of +inf or NaN */
            break;
        }
        both_chunks(&bj, y, x, b, tm);
    }
    both_free(&bj);
    return ret;
}

/* the output projection of the pipeline's chunk j (its operator output in
 * h, rows from the halo's end on; hl0: the first chunk's halo) */
static void pipe_output(float *y, const float *h, const aft_params *p, const aft_linear *lo, size_t j, size_t nch,
                        size_t chunk, size_t halo, size_t hl0, size_t T)
{
    size_t b = j / nch, R0 = j % nch * chunk, len = T - R0 < chunk ? T - R0 : chunk, hl = R0 ? halo : hl0;
    aft_linear_apply_x(lo, len, h + hl * p->d_hidden, p->d_hidden, y + (b * T + R0) * p->d_model, p->d_model, 1);
}

/* rows [0, n) of a continued run's halo, from lc's rows of sequence b (the
 * last n it kept), into rows dst, W apart: keys at column C, values at
 * C + KC (Q's columns are not read) */
static void carry_rows_in(float *dst, size_t W, const aft_layer_carry *lc, size_t b, size_t n, size_t C, size_t KC)
{
    const float *src = lc->kv + (b * lc->cap + lc->off + aft_carry_kept(lc) - n) * 2 * C;
    for (size_t i = 0; i < n; i++) {
        memcpy(dst + i * W + C, src + i * 2 * C, C * sizeof(float));
        memcpy(dst + i * W + C + KC, src + i * 2 * C + C, C * sizeof(float));
    }
}

/* the last rows of sequence b into lc, from row 0 of its room (the caller
 * then sets lc->off to 0): rows r[0, nr), W apart, end at row `end` of the
 * sequence; lc keeps min(end, keep) of them */
static void carry_rows_out(aft_layer_carry *lc, size_t b, const float *r, size_t W, size_t nr, size_t end, size_t C,
                           size_t KC)
{
    size_t n = end < lc->keep ? end : lc->keep;
    float *dst = lc->kv + b * lc->cap * 2 * C;
    for (size_t i = 0; i < n; i++) {
        const float *row = r + (nr - n + i) * W;
        memcpy(dst + i * 2 * C, row + C, C * sizeof(float));
        memcpy(dst + i * 2 * C + C, row + C + KC, C * sizeof(float));
    }
}

/* what the pipeline's threads share (layer_pipelined) */
typedef struct {
    const aft_params *p;
    const aft_layer_prep *lw;
    aft_opspec ws;           /* rows of q, k and v W floats apart (in qkv) */
    aft_layer_carry *lc;     /* or NULL */
    size_t T, chunk, halo, nch, total;   /* total: chunks of all sequences */
    size_t D, C, KC, W;
    size_t nslot, slot_rows; /* 2 nt slots of Q, K, V; a thread's operator output holds slot_rows rows */
    size_t pos, hl0;         /* lc's rows already run, and the first chunk's halo */
    int nt;
    float *qkv;              /* (halo + nslot chunk, W): room for a halo, then the slots */
    float *h;                /* (2 nt, slot_rows, C): two a thread, used in turn */
    float *carry;            /* (4, C): the left sums from chunk to chunk */
    aft_op_rows_ctx **ctx;   /* (nt) */
    size_t done;             /* chunks whose operator is done (atomic) */
    size_t next;             /* chunks taken by a thread (atomic) */
    int bad;                 /* a key was +inf or NaN (atomic) */
} pipe_job;

/* one pipeline thread's state: its chunk whose output projection is still
 * to do (pend, SIZE_MAX: none; its operator output pend_h), and the sums
 * of its phases' times */
typedef struct {
    size_t tid, pend;
    const float *pend_h;
    double tp, to, tw;
} pipe_thread;

/* waits for chunk j - 1's operator, meanwhile doing th's last chunk's
 * output (its time moves *t1, the end of j's projections, on); returns 1
 * when a key was +inf or NaN (stop) */
static int pipe_wait(pipe_job *pj, pipe_thread *th, float *y, size_t j, double *t1)
{
    int stop;
    for (;;) {
        size_t seen;
        #pragma omp atomic read acquire
        seen = pj->done;
        #pragma omp atomic read
        stop = pj->bad;
        if (seen == j || stop) break;
        if (th->pend != SIZE_MAX) {
            double u = aft_now_ms();
            pipe_output(y, th->pend_h, pj->p, &pj->lw->o, th->pend, pj->nch, pj->chunk, pj->halo, pj->hl0, pj->T);
            th->pend = SIZE_MAX;
            double u1 = aft_now_ms();
            th->tw += u1 - u;
            *t1 += u1 - u;
            continue;
        }
        sched_yield();
    }
    return stop;
}

/* chunk j's operator (its rows in buf, its output to ht): the halo, the
 * last rows of chunk j - 1 (a whole chunk), just before ours but when
 * chunk j - 1 is in the last slot; a sequence's first chunk takes lc's
 * rows; at the sequence's end what the next run needs goes to lc. Returns
 * 1 when a key was +inf or NaN (stop) */
static int pipe_operator(pipe_job *pj, size_t tid, size_t j, float *buf, float *ht)
{
    const size_t T = pj->T, C = pj->C, KC = pj->KC, W = pj->W, halo = pj->halo, nslot = pj->nslot;
    const size_t chunk = pj->chunk, b = j / pj->nch, R0 = j % pj->nch * chunk, len = T - R0 < chunk ? T - R0 : chunk;
    const size_t hl = R0 ? halo : pj->hl0;
    aft_layer_carry *lc = pj->lc;
    if (hl && R0 == 0) carry_rows_in(buf - hl * W, W, lc, b, hl, C, KC);
    else if (hl && j % nslot == 0)
        memcpy(buf - hl * W, pj->qkv + (halo + nslot * chunk - hl) * W, hl * W * sizeof(float));
    aft_opspec w = pj->ws;
    w.T = hl + len;
    w.t_off = pj->pos + R0 - hl;
    const float *r = buf - hl * W;
    const float *cin = R0 ? pj->carry : w.t_off ? lc->carry + b * 4 * C : NULL;
    int okk = aft_op_rows(pj->ctx[tid], ht, r, r + C, r + C + KC, &w, hl, hl + len, cin, pj->carry, NULL);
    if (!okk) {
        #pragma omp atomic write
        pj->bad = 1;
        return 1;
    }
    aft_progress_done(pj->ws.progress, len);   /* its output projection follows soon */
    if (lc && R0 + len == T) {   /* the sequence's end: what the next run needs */
        memcpy(lc->carry + b * 4 * C, pj->carry, 4 * C * sizeof(float));
        carry_rows_out(lc, b, r, W, hl + len, pj->pos + T, C, KC);
    }
    return 0;
}

/* the next chunk not taken yet, on thread th (its it-th): Q, K, V of its
 * rows, the wait for chunk j - 1's operator, its operator, and the output
 * of th's chunk before. Returns 0 when every chunk was taken. */
static int pipe_chunk(pipe_job *pj, pipe_thread *th, float *y, const float *x, size_t it)
{
    const size_t T = pj->T, D = pj->D, C = pj->C, W = pj->W, chunk = pj->chunk;
    size_t j;   /* the next chunk not taken yet */
    #pragma omp atomic capture
    j = pj->next++;
    if (j >= pj->total) return 0;
    size_t b = j / pj->nch, R0 = j % pj->nch * chunk, len = T - R0 < chunk ? T - R0 : chunk;
    float *buf = pj->qkv + (pj->halo + j % pj->nslot * chunk) * W;   /* this chunk's rows */
    float *ht = pj->h + (2 * th->tid + it % 2) * pj->slot_rows * C;
    double t0 = aft_now_ms();
    aft_linear_apply(&pj->lw->qkv, len, x + (b * T + R0) * D, D, buf, W);
    double t1 = aft_now_ms();
    int stop = pipe_wait(pj, th, y, j, &t1);
    if (!stop) stop = pipe_operator(pj, th->tid, j, buf, ht);
    #pragma omp atomic write release
    pj->done = j + 1;
    double t2 = aft_now_ms();
    if (th->pend != SIZE_MAX && !stop)
        pipe_output(y, th->pend_h, pj->p, &pj->lw->o, th->pend, pj->nch, chunk, pj->halo, pj->hl0, T);
    th->pend = stop ? SIZE_MAX : j;
    th->pend_h = ht;
    double t3 = aft_now_ms();
    th->tp += t1 - t0;
    th->to += t2 - t1;
    th->tw += t3 - t2;
    return 1;
}

static void pipe_free(pipe_job *pj)
{
    for (int i = 0; pj->ctx && i < pj->nt; i++) aft_op_rows_free(pj->ctx[i]);
    free(pj->qkv); free(pj->h); free(pj->carry); free(pj->ctx);
}

/* The causal pipeline: causal, no mask, keys of one channel per value
 * channel, and a window no wider than a chunk. The sequences go through in
 * chunks of `chunk` rows, taken in order by whichever of the n threads is
 * free (so a thread slowed by other work on its core takes fewer chunks
 * instead of holding the others up, as it would with chunk j fixed on
 * thread j % n),
 * each on its thread from start to end: Q, K, V of the chunk (one product),
 * the operator on its rows, the output projection of its rows. A chunk's
 * Q, K, V and operator output stay in its core's caches, and no step waits
 * for all threads to finish theirs. The one order kept is the operator's: chunk j starts from
 * the left running sums chunk j - 1 ended with (the carry), so it waits
 * until chunk j - 1's operator is done; while it waits, its thread does the
 * output projection of its own last chunk, which otherwise follows the
 * operator (waits then cost nothing: without this the threads fell into a
 * rhythm where one finished its product just as the other's operator
 * ended, and waited at every chunk). Every chunk is computed the same way
 * whichever thread runs it, so the bits do not depend on the thread count.
 *
 * The operator of chunk j also reads the window's halo of earlier rows,
 * chunk j - 1's last rows, from another thread's buffer. The 2 n buffers
 * of Q, K, V (slots) lie one after the other and are used in turn, so
 * those rows are just before chunk j's own, where the operator reads them;
 * only after the last slot are they copied, to room left before the first
 * (once chunk j - 1's operator is done, before chunk j's says it is). A
 * slot is written again only after the operator reading its rows last is
 * done: chunk j - 1's slot next holds chunk m = j - 1 + 2 n. A thread takes
 * a chunk only once its previous chunk's operator is done, so when chunk m
 * is taken at most n - 1 chunks taken before it (one a thread) still wait
 * for their operator; operators finish in order, so chunk m - n's is done,
 * and with it chunk j's (j = m - 2 n + 1 <= m - n).
 *
 * With lc the run continues one that ended at row lc->pos: a sequence's
 * first chunk takes its halo from lc's rows and starts from lc's sums, and
 * its last leaves its rows and sums there (before it says it is done, so
 * the next sequence's first chunk, which may write over the rows before
 * its slot, finds them saved).
 *
 * Returns as aft_layer_chunked. The phases' times are each thread's sums
 * averaged over the threads, the operator's with its waits. */
static int layer_pipelined(float *y, const float *x, const aft_params *p, aft_opspec ws, size_t B, size_t T,
                           size_t chunk, size_t halo, const aft_layer_prep *lw, aft_layer_times *tm,
                           aft_layer_carry *lc, aft_status *st, aft_error *err)
{
    pipe_job pj = {.p = p, .lw = lw, .ws = ws, .lc = lc, .T = T, .chunk = chunk, .halo = halo,
                   .nch = (T + chunk - 1) / chunk, .D = p->d_model, .C = p->d_hidden,
                   .KC = p->k_out ? p->k_out : p->d_hidden, .nt = ws.threads};
    const size_t C = pj.C;
    pj.W = 2 * C + pj.KC;
    pj.total = B * pj.nch;
    if ((size_t)pj.nt > pj.total) pj.nt = (int)pj.total;
    const int nt = pj.nt;
    /* the slots of Q, K, V follow each other after room for a halo, so a
     * chunk's halo rows are the end of the slot before it, but slot 0's */
    pj.nslot = 2 * (size_t)nt;
    pj.slot_rows = halo + chunk;
    pj.qkv = aft_alloc_array(halo + pj.nslot * chunk, pj.W * sizeof(float));
    pj.h = aft_alloc_array(2 * (size_t)nt * pj.slot_rows, C * sizeof(float));
    pj.carry = aft_alloc_array(4, C * sizeof(float));
    pj.ctx = calloc((size_t)nt, sizeof *pj.ctx);
    int ok = pj.qkv && pj.h && pj.carry && pj.ctx;
    for (int i = 0; ok && i < nt; i++) ok = (pj.ctx[i] = aft_op_rows_new(&ws, 0)) != NULL;
    if (!ok) {
        pipe_free(&pj);
        *st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for chunks of %zu rows of Q, K, V (%zu wide)", chunk,
                       pj.W);
        return -1;
    }
    pj.ws.ldq = pj.ws.ldk = pj.ws.ldv = pj.W;
    pj.pos = lc ? lc->pos : 0;
    pj.hl0 = lc ? aft_carry_kept(lc) : 0;
    double tp = 0, to = 0, tw = 0;
    #pragma omp parallel num_threads(nt) reduction(+:tp, to, tw)
    {
        pipe_thread th = {.tid = (size_t)omp_get_thread_num(), .pend = SIZE_MAX};
        for (size_t it = 0; pipe_chunk(&pj, &th, y, x, it); it++) {}
        int stop;
        #pragma omp atomic read
        stop = pj.bad;
        if (th.pend != SIZE_MAX && !stop) {
            double u = aft_now_ms();
            pipe_output(y, th.pend_h, p, &lw->o, th.pend, pj.nch, chunk, halo, pj.hl0, T);
            th.tw += aft_now_ms() - u;
        }
        tp += th.tp;
        to += th.to;
        tw += th.tw;
    }
    tm->projections += tp / nt;
    tm->op += to / nt;
    tm->output += tw / nt;
    pipe_free(&pj);
    return pj.bad ? -2 : 1;
}

int aft_layer_chunked(float *y, const float *x, const aft_layer_prep *lw, const aft_opspec *sp, size_t B,
                      size_t T, size_t chunk, aft_layer_times *tm, aft_layer_carry *lc, aft_status *st,
                      aft_error *err)
{
    const aft_params *p = lw->p;
    if (chunk == 0) return 0;
    aft_rows_kind kind = aft_op_rows_kind(sp, lw->KC);
    if (kind == AFT_ROWS_NONE || (lc && kind != AFT_ROWS_CAUSAL)) return 0;
    size_t halo = aft_spec_halo(sp);
    if (chunk == AFT_LAYER_CHUNK_AUTO) {
        size_t step = aft_layer_step(lw);
        chunk = halo <= step ? step : (halo + step - 1) / step * step;
    }
    if (T <= chunk || halo > chunk) return 0;
    if (kind == AFT_ROWS_GLOBAL) return layer_streamed_simple(y, x, p, sp, B, T, chunk, lw, tm, st, err);
    if (kind == AFT_ROWS_BAND) return layer_streamed_both(y, x, p, *sp, B, T, chunk, halo, lw, tm, st, err);
    return layer_pipelined(y, x, p, *sp, B, T, chunk, halo, lw, tm, lc, st, err);
}
