/* nn.h - the pieces of the model around its AFT layers, inside lib/:
 * LayerNorm (norm.c), the feed-forward network (ffn.c), the token embedding
 * (embed.c), the vocabulary (vocab.c). Each fast kernel has a float64
 * reference beside it, which the tests hold it to. */
#ifndef AFT_NN_H
#define AFT_NN_H

#include "linear.h"

/* PyTorch's nn.LayerNorm default, which labml's layers use */
#define AFT_LAYERNORM_EPS 1e-5f

/* ---- LayerNorm (norm.c) */

// y, x: (N, D)   w: (D)   b: (D) or NULL. Each row: (x - mean) / sqrt(var + eps) * w + b,
// var the biased variance (as torch.nn.LayerNorm). y may be x.
void aft_layernorm(float *y, const float *x, const float *w, const float *b, size_t N, size_t D, float eps);
void aft_layernorm_ref(float *y, const float *x, const float *w, const float *b, size_t N, size_t D, float eps);
/* LayerNorm's backward pass over N rows x (D) given dz = d/d(its output),
 * its weight w: dx = d/dx (add: dx += it); d/dw and d/db, dz xhat and dz,
 * added into sw and sb (D each). The reference runs in double. */
void aft_layernorm_back(float *dx, int add, float *sw, float *sb, const float *dz, const float *x, const float *w,
                        size_t N, size_t D, float eps);
void aft_layernorm_back_ref(float *dx, int add, float *sw, float *sb, const float *dz, const float *x,
                            const float *w, size_t N, size_t D, float eps);

/* ---- the cross-entropy (loss.c) */

/* The cross-entropy of each row of logits lg (N, V) against its target,
 * summed (a negative target: the row is ignored, 0); with grad, lg becomes
 * d/d(logits) of that sum times inv: (softmax - one-hot) inv, 0 on ignored
 * rows. The reference runs in double. */
double aft_xent_rows(float *lg, const int32_t *targets, size_t N, size_t V, int grad, float inv);
double aft_xent_rows_ref(float *lg, const int32_t *targets, size_t N, size_t V, int grad, float inv);

/* ---- passes over rows (elem.c), for the training step */

/* out = x + y (n floats, not overlapping) */
void aft_vadd(float *out, const float *x, const float *y, size_t n);
/* h = max(h, 0) in place, a NaN kept (torch.relu) */
void aft_relu(float *h, size_t n);
/* dh = 0 where h <= 0 (ReLU's backward, h its output) */
void aft_relu_back(float *dh, const float *h, size_t n);
/* s (n) += the sum of a's rows (rows x n), in float */
void aft_col_sums(float *s, const float *a, size_t rows, size_t n);

/* ---- the feed-forward network (ffn.c) */

typedef struct {
    size_t d_model;     /* D */
    size_t d_ff;        /* F */
    const void *w1;     /* (F, D), wdt's values */
    const float *b1;    /* (F) or NULL */
    const void *w2;     /* (D, F), wdt's values */
    const float *b2;    /* (D) or NULL */
    aft_dtype wdt;      /* w1 and w2: AFT_F16 or AFT_BF16 (kept so, packed
                         * 16-bit); anything else: float32 */
} aft_ffn_params;

/* both products packed once (linear.c); p and its arrays must outlive it */
typedef struct {
    aft_ffn_params p;
    aft_linear l1, l2;
} aft_ffn;

/* precision BF16 (with an engine): both products in bf16 (aft_config.precision) */
aft_status aft_ffn_init(aft_ffn *f, const aft_ffn_params *p, aft_kernel kernel, aft_precision precision, int threads,
                        aft_error *err);
void aft_ffn_free(aft_ffn *f);
// y, x: (N, D)   h: (N, F) scratch. y = relu(x W1^T + b1) W2^T + b2; y may not alias x.
// relu keeps NaN (as torch.relu).
void aft_ffn_apply(const aft_ffn *f, float *y, const float *x, size_t N, float *h);
void aft_ffn_ref(float *y, const float *x, const aft_ffn_params *p, size_t N);

/* ---- the token embedding (embed.c) */

typedef struct {
    const void *table;    /* (V, D), tdt's values */
    size_t V, D;
    float scale;          /* each row times this (labml: sqrt(D)) */
    const float *pe;      /* (P, D): added at each row's position, or NULL */
    size_t P;
    aft_dtype tdt;        /* AFT_F16 or AFT_BF16: the table kept so, each
                           * row widened as it is looked up; else float32 */
} aft_embed_params;

/* The first token of tokens (B, n, rows ldt apart) that is negative or not
 * below V: 0 when all are valid, else 1 and its place in *b, *t. */
int aft_embed_bad_token(const aft_embed_params *e, const int32_t *tokens, size_t ldt, size_t B, size_t n,
                        size_t *b, size_t *t);
// x: (B, n, D)   tokens: (B, n), rows ldt apart, each in [0, V) (checked by the caller).
// x[b, j] = table[tokens[b, j]] * scale + pe[pos0 + j]; pos0 + n <= P when pe is set.
void aft_embed(float *x, const aft_embed_params *e, const int32_t *tokens, size_t ldt, size_t B, size_t n,
               size_t pos0);
void aft_embed_ref(float *x, const aft_embed_params *e, const int32_t *tokens, size_t ldt, size_t B, size_t n,
                   size_t pos0);

/* ---- the vocabulary (vocab.c) */

typedef struct {
    size_t n;
    char **text;    /* token i's text (UTF-8, NUL-terminated), malloc'd */
    size_t *len;    /* its length in bytes */
    char *key;      /* where it came from, for messages ("metadata 'vocab'") */
} aft_vocab;

/* json: a JSON array of n_expected non-empty, distinct strings; what says
 * where it came from in messages ("metadata 'vocab'") */
aft_status aft_vocab_parse(aft_vocab *v, const char *json, const char *what, size_t n_expected, aft_error *err);
void aft_vocab_free(aft_vocab *v);
/* the longest entry that matches at each point; *ids malloc'd */
aft_status aft_vocab_encode(const aft_vocab *v, int32_t **ids, size_t *n, const char *text, size_t len,
                            aft_error *err);

#endif /* AFT_NN_H */
