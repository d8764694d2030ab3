/* api.h - what the files of the binding interface (aft.h, "the binding
 * interface") share inside lib/api/: its options string, parsed; the
 * checks of sizes and NULLs every entry point makes; file names in
 * messages. */
#ifndef AFT_API_H
#define AFT_API_H

#include "internal.h"

/* the options' keys, a bit each: an entry point takes a set of them */
enum {
    API_VARIANT = 1 << 0,
    API_WINDOW = 1 << 1,
    API_HEADS = 1 << 2,
    API_CAUSAL = 1 << 3,
    API_LAYOUT = 1 << 4,
    API_THREADS = 1 << 5,
    API_IMPL = 1 << 6,
    API_PREFIX = 1 << 7,
    API_GRID = 1 << 8,
    API_PRECISION = 1 << 9,
};
#define API_LAYER_KEYS                                                                                          \
    (API_VARIANT | API_WINDOW | API_HEADS | API_CAUSAL | API_LAYOUT | API_THREADS | API_IMPL | API_PREFIX |   \
     API_GRID | API_PRECISION)
#define API_OP_KEYS \
    (API_VARIANT | API_WINDOW | API_HEADS | API_CAUSAL | API_THREADS | API_IMPL | API_GRID | API_PRECISION)
#define API_MODEL_KEYS (API_WINDOW | API_THREADS | API_PRECISION)

typedef struct {
    unsigned given;     /* the keys the string set */
    aft_config cfg;     /* variant, window, heads, causal, threads, impl,
                         * grid_h and grid_w as given; defaults: full,
                         * heads 1, every core, fast, no grid */
    int tbd;            /* layout=tbd: (T, B, D) */
    char prefix[160];   /* prefix=P ("" by default) */
} api_options;

/* a layer over the caller's arrays (layer.c) */
struct aft_api_layer {
    api_options opt;
    aft_weights w;        /* the arrays, found and checked as aft run
                           * --weights finds them; w.p borrows them */
    aft_config cfg;       /* the options' configuration, settled */
    size_t n_grads;       /* the parameters' gradients, as aft grad names */
    aft_grad_slot grads[AFT_GRAD_SLOTS];   /* and shapes them */
};

/* The options string s (NULL or "": the defaults) into o, taking the keys
 * in `keys` only; `what` names the entry point in the message about a key
 * it does not take ("the layer"). AFT_ERR_ARG for a key unknown or given
 * twice, a pair without '=', or a bad value, naming it. */
aft_status api_options_parse(api_options *o, const char *s, unsigned keys, const char *what, aft_error *err);
/* The keys of the variant, as aft run checks its options: window only for
 * local and conv, heads only for conv, local needs a window, conv a window
 * or a conv bias (have_bias: a bias is given to read it from). */
aft_status api_options_check(const api_options *o, int have_bias, aft_error *err);

/* OpenBLAS's thread count is the process's, shared with the caller (in a
 * binding, PyTorch's products run on the same OpenBLAS): aft runs each
 * product on one OpenBLAS thread, its own threads around them, so every
 * entry point that computes sets the count to 1 and puts the caller's back
 * when done. API_BLAS(call) runs call so, its status the result; calls
 * from several threads at once restore the count when the last is done. */
void api_blas_enter(void);
aft_status api_blas_leave(aft_status st);
#define API_BLAS(call) (api_blas_enter(), api_blas_leave(call))

/* The saved forwards' buffers (saved.c) open with API_SAVED_HEAD floats
 * saying a forward of `rows` rows filled them (done), or none did (a
 * forward says so when it starts); api_saved_check refuses a buffer not
 * marked done for these rows. */
enum { API_SAVED_HEAD = 4 };
void api_saved_mark(float *saved, size_t rows, int done);
aft_status api_saved_check(const float *saved, size_t rows, size_t B, size_t T, aft_error *err);

/* "missing (NULL) WHAT" */
aft_status api_null(aft_error *err, const char *what);
/* n = B * T * X floats, AFT_ERR_ARG naming what when it overflows */
aft_status api_floats(size_t B, size_t T, size_t X, size_t *n, const char *what, aft_error *err);
/* a file's error as the command line shows it, "PATH: what is wrong" (the
 * message left as it is when it starts with the path already); st passed
 * through */
aft_status api_file_error(aft_status st, const char *path, aft_error *err);

#endif
