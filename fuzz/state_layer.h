/* state_layer.h - the layers whose streaming states fuzz_state reads, and
 * make_state_seeds writes its seeds for: small, made from a formula, so both
 * programs build the same ones (the same fingerprints). */
#ifndef AFT_FUZZ_STATE_LAYER_H
#define AFT_FUZZ_STATE_LAYER_H

#include "aft.h"

enum { SL_D = 4, SL_C = 6, SL_B = 2, SL_N = 3 };

typedef struct {
    float w[4][SL_C * SL_C], b[4][SL_C], conv[2 * (2 * 3 - 1)];
    aft_params p;
    aft_config cfg;
} state_layer;

/* layer i of SL_N: causal local (window 3, seeded bias), conv (2 heads,
 * window 3), full (seeded bias) */
static inline void state_layer_make(state_layer *L, int i)
{
    for (int m = 0; m < 4; m++) {
        for (int j = 0; j < SL_C * SL_C; j++) L->w[m][j] = aft_seeded_bias(90 + (uint64_t)m, 0.4f, (size_t)j, 0);
        for (int j = 0; j < SL_C; j++) L->b[m][j] = aft_seeded_bias(95 + (uint64_t)m, 0.1f, (size_t)j, 0);
    }
    for (int j = 0; j < 10; j++) L->conv[j] = aft_seeded_bias(99, 0.5f, (size_t)j, 0);
    L->p = (aft_params){.d_model = SL_D, .d_hidden = SL_C, .k_out = SL_C, .wq = L->w[0], .wk = L->w[1],
                        .wv = L->w[2], .wo = L->w[3], .bq = L->b[0], .bk = L->b[1], .bv = L->b[2], .bo = L->b[3]};
    L->cfg = (aft_config){.causal = 1, .threads = 1};
    if (i == 1) {
        L->cfg.variant = AFT_CONV;
        L->cfg.window = 3;
        L->cfg.heads = 2;
        L->p.bias = (aft_bias){.kind = AFT_BIAS_CONV, .conv = L->conv, .conv_len = 5, .conv_rows = 2};
    } else {
        L->cfg.variant = i == 0 ? AFT_LOCAL : AFT_FULL;
        L->cfg.window = i == 0 ? 3 : 0;
        L->p.bias = (aft_bias){.kind = AFT_BIAS_SEEDED, .seed = 7, .scale = 0.5f};
    }
}

#endif
