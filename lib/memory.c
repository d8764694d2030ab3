/* memory.c - what a run will allocate, what the machine has, and checks of
 * values that would poison a run. */
#include "layer.h"      /* AFT_GRAD_PIECES_PER_THREAD */
#include "ops/op.h"     /* aft_batch_groups */
#include "ops/spec.h"   /* the windows, and each kernel's workspace */

#include <stdio.h>
#include <stdlib.h>

/* a + b and a * b saturating at SIZE_MAX, so an estimate never wraps */
static size_t sat_add(size_t a, size_t b) { size_t r; return aft_add_ok(a, b, &r) ? r : SIZE_MAX; }
static size_t sat_mul(size_t a, size_t b) { size_t r; return aft_mul_ok(a, b, &r) ? r : SIZE_MAX; }

size_t aft_workspace_bytes(const aft_config *cfg, size_t B, size_t T, size_t D, size_t C, size_t kc)
{
    size_t N = sat_mul(B, T), f = sizeof(float);
    size_t threads = (size_t)aft_threads_or_all(cfg->threads);
    size_t bytes = 0;
    if (kc == 0) {
        /* the layer: Q, K, V and the operator's output, (N, C) each */
        bytes = sat_mul(sat_mul(N, sat_mul(C, 4)), f);
        (void)D;
    } else if (kc != C) {
        bytes = sat_mul(sat_mul(N, C), f);   /* keys widened to one per channel */
    }
    size_t op;
    if (cfg->impl == AFT_IMPL_REFERENCE) {
        op = sat_mul(T, 3 * f);
    } else if (cfg->variant == AFT_FULL) {
        /* (T, 2C) right-hand sides, a block of exp(w) rows per thread,
         * chunk maxima (the OpenBLAS path; the fused product holds one
         * panel of exp(w) instead of a block, so this bounds both) */
        size_t blk = sat_mul(sat_mul(aft_full_rows(T, threads), T), f);
        op = sat_add(sat_mul(sat_mul(T, 2 * C), f), sat_mul(blk, threads));
        op = sat_add(op, sat_mul(sat_mul(T, C), f));
    } else if (cfg->grid_w && cfg->grid_h && cfg->window > 0 &&
               (cfg->variant == AFT_LOCAL || cfg->variant == AFT_CONV)) {
        /* the grid kernel's scratch (grid.c sizes it) */
        op = aft_grid_workspace(cfg->variant, cfg->causal, B, cfg->grid_h, cfg->grid_w, aft_config_window(cfg, T), C,
                                threads);
    } else {
        /* per thread: right-part states (T rows of a block of EKB channels)
         * x 3 and a band block (BAND_ROWS + 2 s rows of EKB channels, ek and
         * ekv): local_conv.c's blocks */
        size_t s = aft_window_in(cfg->window, T);
        size_t per = sat_add(sat_mul(T, 3 * AFT_BAND_EKB),
                             sat_mul(sat_add(AFT_BAND_ROWS, 2 * s), 2 * AFT_BAND_EKB));
        op = sat_mul(sat_mul(per, threads), f);
    }
    return sat_add(bytes, op);
}

size_t aft_backward_workspace_bytes(const aft_config *cfg, const aft_bias *bias, size_t B, size_t T, size_t D,
                                    size_t C, size_t kc)
{
    size_t N = sat_mul(B, T), f = sizeof(float), d = sizeof(double);
    size_t threads = (size_t)aft_threads_or_all(cfg->threads);
    /* the forward pass's own scratch, which the backward pass repeats */
    size_t bytes = aft_workspace_bytes(cfg, B, T, D, C, kc);
    if (kc == 0) {
        /* Q, K, V and their gradients (N, 3C) each, H and dH (N, C) each;
         * dWcat and dbcat (3C, D + 1); the row sums of the products'
         * pieces (3C + D doubles each) */
        bytes = sat_add(bytes, sat_mul(sat_mul(N, 8 * C), f));
        bytes = sat_add(bytes, sat_mul(sat_mul(3 * C, sat_add(D, 1)), f));
        bytes = sat_add(bytes, sat_mul(sat_mul(sat_mul(AFT_GRAD_PIECES_PER_THREAD, threads), sat_add(3 * C, D)), d));
        /* Wo^T (C features of D inputs) and Wcat^T (D features of 3C)
         * packed for aft's kernel (dy Wo, dQKV Wcat), the features padded
         * to a panel (32) */
        size_t packed = sat_add(sat_mul(sat_add(C, 31), D), sat_mul(sat_add(D, 31), sat_mul(3, C)));
        bytes = sat_add(bytes, sat_mul(packed, f));
    } else if (kc != C) {
        bytes = sat_add(bytes, sat_mul(sat_mul(N, 2 * C), f));   /* keys and their gradient widened */
    }
    if (cfg->impl == AFT_IMPL_REFERENCE) {
        /* every activation and gradient in double */
        bytes = sat_add(bytes, sat_mul(sat_mul(N, sat_add(sat_mul(3, D), 10 * C)), d));
    } else {
        /* per sequence (T, 3C) of running sums, and per thread a (T, 2C)
         * block of the rows redone exactly (dense kernels) */
        bytes = sat_add(bytes, sat_mul(sat_mul(T, 3 * C), f));
        bytes = sat_add(bytes, sat_mul(threads, sat_mul(sat_mul(T, 2 * C), f)));
    }
    /* the band kernel deals its rows in slices, several a thread: each
     * slice has a halo, 2 (s - 1) rows of 2C floats, and its own copy of
     * the private part of the bias gradient (factored v, conv) */
    size_t priv = 0;
    if (bias) {
        size_t conv = sat_mul(bias->conv_rows, bias->conv_len);
        if (bias->conv_2d) conv = sat_mul(conv, bias->conv_len);
        priv = bias->kind == AFT_BIAS_FACTORED ? sat_mul(T, bias->rank)
               : bias->kind == AFT_BIAS_CONV   ? conv
                                               : 0;
    }
    size_t s = aft_window_in(cfg->window, T), slices = aft_band_grad_slices(T, s, threads, priv, C);
    bytes = sat_add(bytes, sat_mul(sat_mul(slices, sat_add(priv, sat_mul(sat_mul(4, s), C))), f));
    /* short sequences in groups (op.c): each group's running sums, and the
     * groups' copies of the bias gradient, which are kept to B T C floats */
    size_t ng = aft_batch_groups((int)threads, B, T);
    if (ng > 1 && cfg->impl != AFT_IMPL_REFERENCE) {
        bytes = sat_add(bytes, sat_mul(sat_mul(ng - 1, sat_mul(T, 3 * C)), f));
        bytes = sat_add(bytes, sat_mul(sat_mul(N, C), f));
    }
    return bytes;
}

size_t aft_available_memory(void)
{
    size_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                avail = (size_t)kb * 1024;
                break;
            }
        fclose(f);
    }
    /* a container's limit (cgroup v2) may be tighter than the machine */
    f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f) {
        unsigned long long lim, cur = 0;
        if (fscanf(f, "%llu", &lim) == 1) {
            FILE *g = fopen("/sys/fs/cgroup/memory.current", "r");
            if (g) {
                if (fscanf(g, "%llu", &cur) != 1) cur = 0;
                fclose(g);
            }
            size_t room = lim > cur ? (size_t)(lim - cur) : 0;
            if (avail == 0 || room < avail) avail = room;
        }
        fclose(f);
    }
    return avail;
}

size_t aft_memory_limit(size_t max_memory)
{
    if (max_memory) return max_memory;
    size_t avail = aft_available_memory();
    return avail ? avail : SIZE_MAX;
}

size_t aft_count_nonfinite(const float *x, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    return bad;
}
