/* layers.h - random layers of every variant and bias kind, for the tests
 * of the streaming state and of slices (one set of cases, the same draws
 * from the same seed) */
#ifndef AFT_TEST_LAYERS_H
#define AFT_TEST_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "aft.h"

/* d_model, d_hidden, the bias's Tmax (the longest sequence), conv's heads */
enum { LAYER_D = 16, LAYER_C = 24, LAYER_TMAX = 260, LAYER_H = 2 };

typedef struct {
    aft_variant variant;
    aft_bias_kind kind;
    size_t window;
    int shared_keys;   /* conv: one key channel per head */
    const char *name;
} lcase;

extern const lcase layer_cases[];
extern const size_t layer_ncases;

typedef struct {
    aft_params p;
    aft_config cfg;
    float *w[4], *b[4], *dense, *u, *v, *conv;
} layer;

/* lc's layer, weights drawn from seed; extreme: key biases of +-500 and
 * position biases of +-250 */
void make_layer(layer *L, const lcase *lc, int extreme, int causal, uint64_t seed);
void free_layer(layer *L);

#endif
