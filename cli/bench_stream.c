/* bench_stream.c - aft bench --stream: the causal layer as a stream. For one
 * configuration: decoding a token at a time (a step of one row, the state
 * in memory, no files), the same sequence in chunks, and the floor a token
 * cannot go below, reading the layer's weights once. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

/* tokens decoded a row at a time (the first of the sequence) */
enum { STREAM_TOKENS = 4096 };

/* the time to read n floats once, as they sit in the caches after a few
 * reads: the best of many sums, in microseconds. 64 sums side by side, so
 * that four vectors' additions are in flight and the reads, not one chain
 * of additions, set the pace */
enum { FLOOR_LANES = 64 };
static double read_floor_us(const float *w, size_t n)
{
    float acc[FLOOR_LANES] = {0};
    double best = 1e30;
    for (int r = 0; r < 200; r++) {
        double t0 = aft_now_ms();
        for (size_t i = 0; i + FLOOR_LANES <= n; i += FLOOR_LANES)
            for (int l = 0; l < FLOOR_LANES; l++) acc[l] += w[i + l];
        double dt = (aft_now_ms() - t0) * 1e3;
        best = dt < best ? dt : best;
    }
    float all = 0.0f;   /* every sum is used: none of the reads is dropped */
    for (int l = 0; l < FLOOR_LANES; l++) all += acc[l];
    volatile float sink = all;
    (void)sink;
    return best;
}

/* steps of `step` rows over rows [0, n) of x (B, T, D), a fresh state; y
 * gets those rows; the time in ms */
static int run_steps(const aft_params *p, const aft_config *cfg, size_t B, size_t T, size_t D, size_t n, size_t step,
                     const float *x, float *y, double *ms)
{
    aft_error err;
    aft_state *s;
    if (aft_state_new(&s, p, cfg, B, &err) != AFT_OK) {
        cli_error("bench", "%s", err.msg);
        return EXIT_DATA;
    }
    float *xc = malloc(B * step * D * sizeof *xc + 1), *yc = malloc(B * step * D * sizeof *yc + 1);
    int rc = xc && yc ? 0 : EXIT_DATA;
    double t0 = aft_now_ms();
    for (size_t t0r = 0; t0r < n && !rc; t0r += step) {
        size_t m = n - t0r < step ? n - t0r : step;
        const float *xs = x + t0r * D;
        if (B > 1)
            for (size_t b = 0; b < B; b++) memcpy(xc + b * m * D, x + (b * T + t0r) * D, m * D * sizeof *xc);
        if (aft_state_step(s, B > 1 ? yc : y + t0r * D, B > 1 ? xc : xs, m, &err) != AFT_OK) {
            cli_error("bench", "%s", err.msg);
            rc = EXIT_DATA;
        }
    }
    *ms = aft_now_ms() - t0;
    free(xc);
    free(yc);
    aft_state_free(s);
    return rc;
}

int cli_bench_stream(const aft_params *p, const aft_config *cfg, size_t B, size_t T, size_t D, size_t C,
                     size_t chunk, size_t repeat, cli_stream_times *out)
{
    if (!cfg->causal) return cli_usage_error("bench", "--stream times a causal layer: add --causal");
    size_t nx = B * T * D, ntok = T < STREAM_TOKENS ? T : STREAM_TOKENS;
    float *y = malloc(nx * sizeof *y + 1), *x = malloc(nx * sizeof *x + 1);
    if (!x || !y) {
        free(x); free(y);
        cli_error("bench", "out of memory for T = %zu", T);
        return EXIT_DATA;
    }
    for (size_t i = 0; i < nx; i++) x[i] = aft_seeded_bias(11, 1.0f, i / D, i % D);
    double best_tok = 1e30, best_chunk = 1e30, ms;
    int rc = 0;
    /* one of each untimed first: thread pools and page faults belong to start-up */
    cli_progress_steps(repeat + 1);
    for (size_t r = 0; r <= repeat && !rc; r++) {
        cli_progress_step(r);
        if ((rc = run_steps(p, cfg, B, T, D, ntok, 1, x, y, &ms))) break;
        if (r) best_tok = ms < best_tok ? ms : best_tok;
        if ((rc = run_steps(p, cfg, B, T, D, T, chunk, x, y, &ms))) break;
        if (r) best_chunk = ms < best_chunk ? ms : best_chunk;
    }
    out->token_us = best_tok * 1e3 / (double)(B * ntok);
    out->chunked_ms = best_chunk;
    out->chunk = chunk;
    /* the floor: the four weight matrices read once, in the bytes they are
     * held in (16-bit weights: half as many) */
    size_t es = p->w_dtype == AFT_F16 || p->w_dtype == AFT_BF16 ? 2 : 4;
    size_t nw = (3 * C + C) * D * es / sizeof(float);
    /* on a cache line, as aft's packed weights are: loads that straddle
     * two lines would read at half the rate */
    void *wm = NULL;
    float *w = posix_memalign(&wm, 64, nw * sizeof *w) == 0 ? wm : NULL;
    out->floor_us = 0.0;
    if (w) {
        char *wb = (char *)w;
        memcpy(wb, p->wq, C * D * es);
        memcpy(wb + C * D * es, p->wk, C * D * es);
        memcpy(wb + 2 * C * D * es, p->wv, C * D * es);
        memcpy(wb + 3 * C * D * es, p->wo, D * C * es);
        out->floor_us = read_floor_us(w, nw);
    }
    free(w);
    free(x);
    free(y);
    return rc;
}
