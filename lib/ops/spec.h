/* spec.h - one configuration of the operator, settled (spec.c). Every rule
 * about a configuration's shape lives in spec.c: the window clamped to the
 * sequence, window 0 meaning simple, conv's window and heads from its bias,
 * the bias shapes, the positions a learned bias reaches, halos and 2-D
 * windows. The kernels read a settled aft_opspec and decide none of these
 * themselves; they include this header (through kernels.h) and nothing
 * above it. The dispatcher (op.h) and the layer, the state, the slices, the
 * model and the memory estimates ask it too. */
#ifndef AFT_SPEC_H
#define AFT_SPEC_H

#include "internal.h"

/* The operator as settled by aft_spec_settle: the rules applied once, the
 * kernels only read it. */
typedef struct {
    const aft_bias *bias;
    aft_variant variant;    /* settled: conv with window 0 is simple */
    size_t T, C;
    size_t heads;           /* conv's heads, 1 otherwise */
    size_t window;          /* local's window, or the conv bias's own S */
    size_t conv_len;        /* conv: a bias row's length, 2S - 1 */
    size_t conv_rows;       /* conv: the bias's rows; 1 is shared by every head */
    int zero_bias;          /* w = 0 everywhere: simple, window 0, or no bias */
    int causal;
    int threads;            /* >= 1 */
    int full_blas;          /* full: OpenBLAS's products instead of the fused kernel */
    int bf16;               /* full: its products in bf16 (aft_config.precision, with an engine) */
    size_t ldq, ldk, ldv;   /* row strides of q, k, v */
    size_t t_off;           /* row t of q, k, v is row t_off + t of the sequence
                             * (chunked callers; 0 otherwise) */
    size_t q_row0;          /* q and out hold rows from this row on (chunked
                             * callers without causality; 0 otherwise) */
    size_t q_row1;          /* full and masked runs: rows [q_row0, q_row1) only
                             * (0: to T); a mask then holds those rows only,
                             * and is taken as it is (not checked for being
                             * all visible or exactly causal) */
    size_t mask_ld;         /* a mask's row length (0: T; more when T is cut
                             * short, as causal rows before T need) */
    size_t grid_h, grid_w;  /* a grid of grid_h x grid_w rows in raster order
                             * (T = grid_h * grid_w); 0, 0: a 1-D sequence.
                             * Only local's and conv's w depend on it. */
    int keys_tame;          /* set by op.c's scan of the keys: every key is at
                             * most AFT_TAME_BOUND in size (so finite), and a
                             * kernel need not look again; 0: not known */
    aft_progress *progress; /* the caller's counter, advanced by rows as they
                             * finish: set by the entry point that took the
                             * rows on (aft_progress_plan), NULL from
                             * aft_spec_settle; the reference and full
                             * kernels advance it themselves, op.c after the
                             * others, the layer's chunked paths a chunk at a
                             * time */
} aft_opspec;

/* Keys and bias entries at most this in size are tame for the band
 * backward (local_conv_grad.c): sums of a few such stay far from overflow */
#define AFT_TAME_BOUND 1e30f

/* Checks the arguments and settles cfg against bias and the sizes (the rules
 * of aft_config_settle; a learned bias must reach T: aft_bias_reach), into
 * *sp with q, k, v contiguous (ldq = ldv = C, ldk = kc). */
aft_status aft_spec_settle(aft_opspec *sp, const aft_bias *bias, const aft_config *cfg, size_t B, size_t T,
                           size_t C, size_t kc, aft_error *err);

/* ---- windows and halos */

/* The band the kernels use for a sequence of T rows: a window wider than the
 * sequence is the whole sequence (aft_window_in); w = 0 everywhere is a band
 * of one row (T = SIZE_MAX: the band of an unbounded sequence). */
size_t aft_spec_band(const aft_opspec *sp, size_t T);
/* rows before a chunk's first whose keys its band needs: the band of an
 * unbounded sequence */
size_t aft_spec_halo(const aft_opspec *sp);
/* rows a causal run keeps for the next (a streaming state): full needs every
 * past row (SIZE_MAX), the others their halo */
size_t aft_spec_keep(const aft_opspec *sp);
/* Does w depend on the grid (local or conv on a grid with a bias)? Such an
 * operator runs whole sequences only (grid.c, or full.c under a mask). */
int aft_spec_on_grid(const aft_opspec *sp);
/* the window S on a grid of H x W: one at least max(H, W) wide sees the
 * whole grid, so no wider one is needed */
size_t aft_spec_grid_window(size_t S, size_t H, size_t W);
/* the grid rows and columns a 2-D window of sp (window >= 1) reaches on
 * each side of its centre: window - 1, no more than T (so that a row or
 * column plus the reach cannot wrap) */
size_t aft_spec_grid_reach(const aft_opspec *sp);

/* ---- the backward pass's arrays (aft_op_backward)
 *
 * What a backward run writes and reads beyond q, k and v: dq, dk, dv rows
 * lddq, lddk, lddv apart (dk: kc channels); dout and out (NULL: not
 * wanted) (B, T, C) contiguous; db the bias gradient (its fields NULL: not
 * wanted). */
typedef struct {
    float *dq, *dk, *dv;
    size_t lddq, lddk, lddv;
    const float *dout;
    float *out;
    aft_bias_grad db;
    int db_set;   /* the kernel sets db's entries (aft_bias_grad_sets): its first sequence only */
    /* the dense kernel and the causal band kernel (aft_op_grad_saves) can
     * keep what their forward half makes, (B, T, 2C): the dense kernel's
     * sums [num | den] per row and head, the band kernel's [1 / den | Y']
     * per row (kept only when every entry took its fast path; else it
     * clears the tag), so that a backward later skips their product:
     * AFT_SUMS_WRITE runs that half only (out and sums written; dq, dk,
     * dv, dout and db unused), AFT_SUMS_READ takes
     * them. *sums_tag records the thread count they were made with (the
     * blocks of rows, hence their bits, follow it): a READ made with another
     * recomputes them, so its results never depend on the saved sums'
     * history. */
    int sums_mode;
    float *sums, *sums_tag;
} aft_grad_io;

enum { AFT_SUMS_NONE = 0, AFT_SUMS_WRITE = 1, AFT_SUMS_READ = 2 };

/* ---- each kernel's workspace, for the kernels and memory.c's estimates
 *
 * local_conv.c's blocks: rows a block of the band (BAND_ROWS), and the
 * channels of a block of its band arrays ek and ekv (EKB). */
enum { AFT_BAND_ROWS = 128 };
#ifndef AFT_BAND_EKB
#define AFT_BAND_EKB 64
#endif
/* full.c: rows of exp(w) each thread of aft_op_full holds at once, for a
 * sequence of T on `threads` threads */
size_t aft_full_rows(size_t T, size_t threads);
/* grid.c: bytes of scratch aft_op_grid allocates on `threads` threads for
 * these sizes (window: local's, or conv's S); SIZE_MAX when they overflow */
size_t aft_grid_workspace(aft_variant variant, int causal, size_t B, size_t H, size_t W, size_t S, size_t C,
                          size_t threads);
/* local_conv_grad.c: the slices of rows the band's backward pass deals to
 * nt threads, window s, with priv floats of private bias gradient a slice
 * (each slice has its own copy) */
size_t aft_band_grad_slices(size_t T, size_t s, size_t nt, size_t priv, size_t C);

#endif /* AFT_SPEC_H */
