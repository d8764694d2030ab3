/* bench_generate.c - aft bench --generate: labml's model generating tokens
 * greedily, as aft generate does (the prompt in one pass, then one step of
 * every layer's state a token), timed. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

/* the time to the first token and to the last, in ms */
typedef struct {
    double t0, first, last;
    size_t made;
} clock_ctx;

static int on_token(void *ctx, int32_t token, const float *logits)
{
    (void)token;
    (void)logits;
    clock_ctx *c = ctx;
    double now = aft_now_ms();
    if (c->made++ == 0) c->first = now - c->t0;
    c->last = now - c->t0;
    cli_progress_add(1);   /* after the clock: an atomic add, on a terminal only */
    return 0;
}

int cli_bench_generate(const aft_model *m, size_t n, size_t repeat, cli_generate_times *out)
{
    const size_t V = aft_model_get_info(m)->n_vocab;
    int32_t prompt[CLI_BENCH_PROMPT];
    for (size_t i = 0; i < CLI_BENCH_PROMPT; i++) prompt[i] = (int32_t)(i % V);
    double *ms = malloc(2 * repeat * sizeof(double));
    if (!ms) {
        cli_error("bench", "out of memory");
        return EXIT_DATA;
    }
    double *first = ms + repeat;
    aft_error err;
    /* one untimed run: the first touch of the scratch belongs to start-up */
    cli_progress_steps(repeat + 1);
    for (size_t r = 0; r <= repeat; r++) {
        cli_progress_step(r);
        cli_progress_total(n);   /* the tokens, which on_token counts */
        clock_ctx c = {.t0 = aft_now_ms()};
        if (aft_model_generate(m, NULL, NULL, prompt, CLI_BENCH_PROMPT, n, NULL, on_token, &c, &err) != AFT_OK) {
            cli_error("bench", "%s", err.msg);
            free(ms);
            return EXIT_DATA;
        }
        if (r == 0) continue;
        ms[r - 1] = c.last;
        first[r - 1] = c.first;
    }
    out->prompt = CLI_BENCH_PROMPT;
    out->ttft_ms = cli_median(first, repeat);
    out->ms = cli_median(ms, repeat);
    out->ms_min = ms[0];
    free(ms);
    return 0;
}
