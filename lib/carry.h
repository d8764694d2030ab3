/* carry.h - the streaming state's insides (state.c): what a causal run
 * carries from one call to the next. A state keeps one; the layer's causal
 * pipeline (layer_chunks.c) continues from it and leaves its rows and sums
 * there. It sits beneath both, so that state.c, which calls the pipeline,
 * and the pipeline, which fills the carry, need not include each other's
 * header. */
#ifndef AFT_CARRY_H
#define AFT_CARRY_H

#include "internal.h"

/* What a causal run leaves for the next, per sequence: the sums (sums.h) of
 * the keys before row pos - kept, and K | V of the `kept` rows before pos,
 * kept = min(pos, keep) (keep: aft_spec_keep, the band's halo; SIZE_MAX for
 * full, which needs every past row). NULL where a run starts from nothing. */
typedef struct {
    size_t pos;      /* rows already run */
    size_t keep;
    size_t cap;      /* rows of kv room per sequence (>= off + kept) */
    size_t off;      /* the kept rows start at row off of each sequence's room
                      * (new rows go after them; they move to 0 when the
                      * room runs out, rarely, instead of at every step) */
    float *carry;    /* (B, 4C) */
    float *kv;       /* (B, cap, 2C): kept row i of sequence b at
                      * kv + (b cap + off + i) 2C, its key (C floats, one per
                      * value channel) then its value */
} aft_layer_carry;
static inline size_t aft_carry_kept(const aft_layer_carry *lc)
{
    return lc->pos < lc->keep ? lc->pos : lc->keep;
}

/* A streaming state (state.c) back at position 0, as aft_state_new left
 * it, its room and packed weights kept: for the model, which starts its
 * layers' states again when its context moves on. */
void aft_state_reset(aft_state *s);

#endif /* AFT_CARRY_H */
