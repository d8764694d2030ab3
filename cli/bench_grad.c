/* bench_grad.c - aft bench --grad: the layer's backward pass (every
 * gradient: the input's, the weights' and biases', the position bias's),
 * which runs the forward pass inside, timed on the configuration's seeded
 * inputs with a seeded dY. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

/* the gradients' buffers, as aft grad writes them (one block, *blk), and
 * the seeded dY (*dy, in the same block); a conv bias's gradient apart
 * (*dconv; NULL for the seeded full and local biases, which have none).
 * 0, or an exit status after reporting. */
static int grad_buffers(const aft_params *p, size_t B, size_t T, aft_layer_grads *g, float **blk, float **dy,
                        float **dconv)
{
    const size_t D = p->d_model, C = p->d_hidden, KC = p->k_out ? p->k_out : C, N = B * T;
    const size_t sizes[] = {N * D, N * D, C * D, C, KC * D, KC, C * D, C, D * C, D};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    *dconv = NULL;
    if (!(*blk = calloc(total + 1, sizeof(float)))) {
        cli_error("bench", "out of memory for the gradients (T = %zu)", T);
        return EXIT_DATA;
    }
    float *at[10], *q = *blk;
    for (size_t i = 0; i < 10; i++, q += sizes[i - 1]) at[i] = q;
    *dy = at[0];
    for (size_t i = 0; i < N * D; i++) (*dy)[i] = aft_seeded_bias(13, 1.0f, i / D, i % D);
    *g = (aft_layer_grads){.dx = at[1], .wq = at[2], .bq = at[3], .wk = at[4], .bk = at[5],
                           .wv = at[6], .bv = at[7], .wo = at[8], .bo = at[9]};
    const aft_bias *b = &p->bias;
    if (b->kind == AFT_BIAS_CONV) {
        size_t n = b->conv_rows * b->conv_len * (b->conv_2d ? b->conv_len : 1);
        if (!(*dconv = calloc(n + 1, sizeof(float)))) {
            free(*blk);
            cli_error("bench", "out of memory for the bias gradient");
            return EXIT_DATA;
        }
        g->bias.conv = *dconv;
    }
    return 0;
}

/* the gradient calls' times, and their ratios to a forward pass (into a
 * y of its own) run right after each: a machine whose speed drifts moves
 * both halves of a pair alike. 0, or an exit status after reporting. */
static int time_pairs(const aft_layer_grads *g, const float *dy, const aft_params *p, const aft_config *cfg,
                      size_t B, size_t T, const float *x, size_t repeat, cli_grad_times *out)
{
    const size_t N = B * T, D = p->d_model;
    aft_error err;
    double best = 1e300, *times = malloc(2 * (repeat + 1) * sizeof(double)), *ratio = times ? times + repeat + 1 : NULL;
    float *y = malloc(N * D * sizeof(float) + 1);
    int rc = times && y ? 0 : EXIT_DATA;
    if (rc) cli_error("bench", "out of memory for the timings");
    /* the progress line (when one is shown) counts the backward passes' rows */
    aft_config cfg_p = *cfg;
    cfg_p.progress = cli_progress_counter();
    cli_progress_steps(repeat + 1);
    /* one untimed first: thread pools and page faults belong to start-up */
    for (size_t r = 0; r <= repeat && !rc; r++) {
        cli_progress_step(r);
        double t0 = aft_now_ms();
        if (aft_layer_backward(g, NULL, dy, x, p, &cfg_p, B, T, &err) != AFT_OK) {
            cli_error("bench", "%s", err.msg);
            rc = EXIT_DATA;
            break;
        }
        double dt = aft_now_ms() - t0, f0 = aft_now_ms();
        if (aft_layer_forward(y, x, p, cfg, B, T, &err) != AFT_OK) {
            cli_error("bench", "%s", err.msg);
            rc = EXIT_DATA;
            break;
        }
        double df = aft_now_ms() - f0;
        if (r) {
            times[r - 1] = dt;
            ratio[r - 1] = df > 0.0 ? dt / df : 0.0;
        }
        best = r && dt < best ? dt : best;
    }
    if (!rc) {
        out->med = cli_median(times, repeat);
        out->ratio = cli_median(ratio, repeat);
        out->min = best;
    }
    free(times);
    free(y);
    return rc;
}

int cli_bench_grad(const aft_params *p, const aft_config *cfg, size_t B, size_t T, const float *x, size_t repeat,
                   cli_grad_times *out)
{
    aft_layer_grads g;
    float *blk, *dy, *dconv;
    int rc = grad_buffers(p, B, T, &g, &blk, &dy, &dconv);
    if (rc) return rc;
    rc = time_pairs(&g, dy, p, cfg, B, T, x, repeat, out);
    free(dconv);
    free(blk);
    return rc;
}
