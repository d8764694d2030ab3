/* model_priv.h - the model's struct, shared by model.c (loading, forward,
 * the state) and model_grad.c (the parameters, loss and backward pass for
 * training). Private to lib/. */
#ifndef AFT_MODEL_PRIV_H
#define AFT_MODEL_PRIV_H

#include "internal.h"
#include "nn/nn.h"

/* more layers than any model has; a hostile name cannot make aft allocate
 * for millions */
enum { MAX_LAYERS = 4096 };
#define LAYERS_PREFIX "encoder.layers."

struct aft_train;   /* model_grad.c: float32 master copies and scratch */

typedef struct {
    char prefix[48];          /* "encoder.layers.N." */
    aft_weights attn;         /* self_attn: its projections and bias (owned) */
    aft_config cfg;           /* causal, the variant and window found */
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;   /* norm_self_attn, norm_ff: (D) */
    aft_ffn_params ffp;
    aft_ffn ffn;              /* packed */
    int ffn_ready;
} mlayer;

struct aft_model {
    aft_model_info info;
    aft_impl impl;
    int threads;
    aft_precision precision;   /* the products' (aft_model_options.precision) */
    mlayer *layers;
    aft_embed_params emb;
    const float *norm_w, *norm_b;   /* encoder.norm: (D) */
    const void *gen_w;              /* generator.projection: (V, D), gen_dt's values */
    const float *gen_b;             /* (V) */
    aft_dtype gen_dt;
    aft_linear gen;
    int gen_ready;
    aft_vocab vocab;
    float **owned;
    size_t nowned, capowned;
    char context_from[160];
    uint8_t *used;            /* while loading: 1 for each tensor of the file
                               * read (by file position) */
    char unused[160];         /* the first tensor not read, as shown */
    struct aft_train *train;  /* model_grad.c, made at the first parameter call */
};

/* model_grad.c: the parameters' names and shapes (made once the model is
 * loaded; a model training does not take records why), and freeing them */
aft_status aft_model_train_prepare(aft_model *m, aft_error *err);
void aft_model_train_free(aft_model *m);
/* the dropout mask's factor for element i of site (layer l's self_attn
 * output: 3 l, its FFN's hidden units: 3 l + 1, its FFN's output: 3 l + 2):
 * 0 (dropped) or 1 / (1 - p); 1 when p is 0 */
double aft_train_dropout_scale(uint64_t seed, uint64_t site, uint64_t i, float p);

#endif /* AFT_MODEL_PRIV_H */
