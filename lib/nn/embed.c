/* embed.c - token embeddings: a row of the table per token, scaled, plus
 * the positional encoding of the token's position (labml's
 * EmbeddingsWithPositionalEncoding: linear(x) * sqrt(d_model) + pe[:T]). */
#include "nn.h"

int aft_embed_bad_token(const aft_embed_params *e, const int32_t *tokens, size_t ldt, size_t B, size_t n,
                        size_t *b, size_t *t)
{
    for (size_t q = 0; q < B; q++)
        for (size_t j = 0; j < n; j++) {
            int32_t id = tokens[q * ldt + j];
            if (id < 0 || (uint64_t)id >= (uint64_t)e->V) {
                *b = q;
                *t = j;
                return 1;
            }
        }
    return 0;
}

void aft_embed(float *x, const aft_embed_params *e, const int32_t *tokens, size_t ldt, size_t B, size_t n,
               size_t pos0)
{
    const size_t D = e->D;
    const float s = e->scale;
    if (aft_dtype_is16(e->tdt)) {   /* 16 bits: each value widened (exactly) as it is read */
        const unsigned char *t = e->table;
        for (size_t q = 0; q < B; q++)
            for (size_t j = 0; j < n; j++) {
                const void *row = t + (size_t)tokens[q * ldt + j] * D * 2;
                float *xr = x + (q * n + j) * D;
                if (e->pe) {
                    const float *pr = e->pe + (pos0 + j) * D;
                    for (size_t i = 0; i < D; i++) xr[i] = aft_w_at(row, e->tdt, i) * s + pr[i];
                } else {
                    for (size_t i = 0; i < D; i++) xr[i] = aft_w_at(row, e->tdt, i) * s;
                }
            }
        return;
    }
    for (size_t q = 0; q < B; q++)
        for (size_t j = 0; j < n; j++) {
            const float *row = (const float *)e->table + (size_t)tokens[q * ldt + j] * D;
            float *xr = x + (q * n + j) * D;
            if (e->pe) {
                const float *pr = e->pe + (pos0 + j) * D;
                for (size_t i = 0; i < D; i++) xr[i] = row[i] * s + pr[i];
            } else {
                for (size_t i = 0; i < D; i++) xr[i] = row[i] * s;
            }
        }
}

void aft_embed_ref(float *x, const aft_embed_params *e, const int32_t *tokens, size_t ldt, size_t B, size_t n,
                   size_t pos0)
{
    const size_t D = e->D;
    for (size_t q = 0; q < B; q++)
        for (size_t j = 0; j < n; j++) {
            size_t row = (size_t)tokens[q * ldt + j] * D;
            for (size_t i = 0; i < D; i++) {
                double v = (double)aft_w_at(e->table, e->tdt, row + i) * (double)e->scale;
                if (e->pe) v += (double)e->pe[(pos0 + j) * D + i];
                x[(q * n + j) * D + i] = (float)v;
            }
        }
}
