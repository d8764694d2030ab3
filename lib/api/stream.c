/* stream.c - the binding interface's streaming state (aft.h,
 * "streaming"): a causal layer's aft_state, stepped a few rows at a time,
 * saved and loaded as aft run --state-out and --state-in do. */
#include "api.h"

#include <stdlib.h>

struct aft_api_state {
    aft_state *s;
};

aft_status aft_api_state_new(aft_api_state **out, aft_api_layer *l, size_t B, aft_error *err)
{
    if (!out) return api_null(err, "out");
    *out = NULL;
    if (!l) return api_null(err, "layer");
    aft_api_state *s = calloc(1, sizeof *s);
    if (!s) return aft_fail(err, AFT_ERR_NOMEM, "out of memory");
    /* the layer's parameters and configuration, settled as for its forward pass */
    aft_status st = aft_state_new(&s->s, &l->w.p, &l->cfg, B, err);
    if (st) {
        free(s);
        return st;
    }
    *out = s;
    return AFT_OK;
}

void aft_api_state_free(aft_api_state *s)
{
    if (!s) return;
    aft_state_free(s->s);
    free(s);
}

aft_status aft_api_state_step(aft_api_state *s, float *y, const float *x, size_t n, aft_error *err)
{
    if (!s || !y || !x) return api_null(err, !s ? "state" : !y ? "y" : "x");
    return API_BLAS(aft_state_step(s->s, y, x, n, err));
}

size_t aft_api_state_position(const aft_api_state *s)
{
    return s ? aft_state_position(s->s) : 0;
}

aft_status aft_api_state_save(const aft_api_state *s, const char *path, aft_error *err)
{
    if (!s || !path) return api_null(err, !s ? "state" : "path");
    aft_status st = aft_state_save(s->s, path, err);
    return st ? api_file_error(st, path, err) : AFT_OK;
}

aft_status aft_api_state_load(aft_api_state *s, const char *path, aft_error *err)
{
    if (!s || !path) return api_null(err, !s ? "state" : "path");
    aft_st_file *f;
    aft_status st = aft_st_open_limit(path, aft_memory_limit(0), &f, err);
    if (!st) {
        st = aft_state_load(s->s, f, err);
        aft_st_close(f);
    }
    return st ? api_file_error(st, path, err) : AFT_OK;
}
