/* layers.c - random layers for the tests (layers.h) */
#include "layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

const lcase layer_cases[] = {
    {AFT_LOCAL, AFT_BIAS_DENSE, 5, 0, "local dense"},
    {AFT_LOCAL, AFT_BIAS_SEEDED, 7, 0, "local seeded"},
    {AFT_LOCAL, AFT_BIAS_FACTORED, 4, 0, "local factored"},
    {AFT_CONV, AFT_BIAS_CONV, 6, 0, "conv"},
    {AFT_CONV, AFT_BIAS_CONV, 3, 1, "conv shared keys"},
    {AFT_SIMPLE, AFT_BIAS_NONE, 0, 0, "simple"},
    {AFT_FULL, AFT_BIAS_DENSE, 0, 0, "full dense"},
    {AFT_FULL, AFT_BIAS_FACTORED, 0, 0, "full factored"},
    {AFT_FULL, AFT_BIAS_SEEDED, 0, 0, "full seeded"},
};
const size_t layer_ncases = sizeof layer_cases / sizeof layer_cases[0];

void make_layer(layer *L, const lcase *lc, int extreme, int causal, uint64_t seed)
{
    enum { D = LAYER_D, C = LAYER_C, TMAX = LAYER_TMAX, H = LAYER_H };
    memset(L, 0, sizeof *L);
    rng r = {seed};
    size_t KC = lc->shared_keys ? H : C;
    size_t rows[4] = {C, KC, C, D}, cols[4] = {D, D, D, C};
    for (int i = 0; i < 4; i++) {
        L->w[i] = randf(&r, rows[i] * cols[i], 0.5);
        L->b[i] = randf(&r, rows[i], i == 1 && extreme ? 500.0 : 0.3);
    }
    double bs = extreme ? 250.0 : 1.0;
    L->p = (aft_params){.d_model = D, .d_hidden = C, .k_out = KC, .wq = L->w[0], .wk = L->w[1], .wv = L->w[2],
                        .wo = L->w[3], .bq = L->b[0], .bk = L->b[1], .bv = L->b[2], .bo = L->b[3]};
    aft_bias *b = &L->p.bias;
    b->kind = lc->kind;
    switch (lc->kind) {
    case AFT_BIAS_DENSE:
        b->dense = L->dense = randf(&r, TMAX * TMAX, bs);
        b->tmax = TMAX;
        break;
    case AFT_BIAS_FACTORED:
        b->u = L->u = randf(&r, TMAX * 2, sqrt(bs));
        b->v = L->v = randf(&r, TMAX * 2, sqrt(bs));
        b->tmax = TMAX;
        b->rank = 2;
        break;
    case AFT_BIAS_SEEDED:
        b->seed = seed;
        b->scale = (float)bs;
        break;
    case AFT_BIAS_CONV:
        b->conv = L->conv = randf(&r, H * (2 * lc->window - 1), bs);
        break;
    default:
        break;
    }
    L->cfg = (aft_config){.variant = lc->variant, .window = lc->window, .heads = lc->variant == AFT_CONV ? H : 1,
                          .causal = causal};
}

void free_layer(layer *L)
{
    for (int i = 0; i < 4; i++) { free(L->w[i]); free(L->b[i]); }
    free(L->dense); free(L->u); free(L->v); free(L->conv);
}
