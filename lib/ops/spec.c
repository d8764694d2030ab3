/* spec.c - every rule about a configuration's shape (spec.h): the window
 * a sequence or a grid sees, window 0 meaning simple, conv's window and
 * heads from its bias and the bias shapes, the positions a learned bias
 * reaches, the band, halo and kept rows of a settled operator.
 * aft_config_settle applies the rules to a configuration; aft_spec_settle
 * checks the arguments against them and fills the aft_opspec every kernel
 * reads. Nothing here calls a kernel or the dispatcher (op.c). */
#include "spec.h"

#include <limits.h>
#include <stdint.h>

/* ---- windows, the reach of a bias, conv's shapes */

size_t aft_window_in(size_t window, size_t T)
{
    return window < T ? window : T;
}

size_t aft_spec_grid_window(size_t S, size_t H, size_t W)
{
    return aft_window_in(S, H > W ? H : W);
}

size_t aft_config_window(const aft_config *cfg, size_t T)
{
    if (cfg->grid_h || cfg->grid_w) return aft_spec_grid_window(cfg->window, cfg->grid_h, cfg->grid_w);
    return aft_window_in(cfg->window, T);
}

size_t aft_bias_reach(const aft_bias *bias, aft_variant variant)
{
    int learned = bias->kind == AFT_BIAS_DENSE || bias->kind == AFT_BIAS_FACTORED;
    return learned && (variant == AFT_FULL || variant == AFT_LOCAL) ? bias->tmax : SIZE_MAX;
}

size_t aft_conv_len(size_t window)
{
    return 2 * window - 1;
}

size_t aft_conv_window(size_t len)
{
    return (len + 1) / 2;
}

/* ---- settling a configuration */

/* conv: the window and heads a bias that records its shape holds */
static aft_status settle_conv(aft_config *cfg, const aft_bias *bias, size_t C, size_t kc, aft_error *err)
{
    const char *name = bias->name ? bias->name : "the conv bias";
    int shaped = bias->kind == AFT_BIAS_CONV && bias->conv_len > 0;
    if (shaped) {
        size_t n = bias->conv_len, S = aft_conv_window(n), rows = bias->conv_rows;
        if ((n % 2 == 0 || rows == 0) && bias->conv_2d)
            return aft_fail(err, AFT_ERR_ARG, "%s is (%zu, %zu, %zu); a grid's conv bias is (heads, 2*window-1, "
                            "2*window-1)", name, rows, n, n);
        if (n % 2 == 0 || rows == 0)
            return aft_fail(err, AFT_ERR_ARG, "%s is (%zu, %zu); a conv bias is (heads, 2*window-1)", name, rows, n);
        if (cfg->window == AFT_WINDOW_FROM_BIAS) cfg->window = S;
        if (cfg->window != S)
            return aft_fail(err, AFT_ERR_ARG, "window %zu but '%s' holds a window of %zu (2S-1 = %zu)", cfg->window,
                            name, S, n);
        /* a shared row says nothing of the heads; keys of one channel a head do */
        if (cfg->heads == 0) cfg->heads = rows == 1 && kc != C && kc > 0 ? kc : rows;
        if (rows > 1 && cfg->heads != rows)
            return aft_fail(err, AFT_ERR_ARG, "%zu %s but '%s' has %zu %s (one per head)", cfg->heads,
                            aft_noun(cfg->heads, "head", "heads"), name, rows, aft_noun(rows, "row", "rows"));
        return AFT_OK;
    }
    if (cfg->window == AFT_WINDOW_FROM_BIAS)
        return aft_fail(err, AFT_ERR_ARG, "conv: the window comes from the bias, but there is no conv bias");
    if (cfg->heads == 0) cfg->heads = 1;
    if (cfg->window == 0) {   /* no band at all: simple */
        if (kc != C)
            return aft_fail(err, AFT_ERR_ARG, "conv with window 0 is simple, which needs as many key channels as "
                            "value channels (keys have %zu, values %zu)", kc, C);
        cfg->variant = AFT_SIMPLE;
    }
    return AFT_OK;
}

/* a grid has both sides or none; a 2-D conv bias and a grid go together
 * (a (heads, 2S-1) bias could not be told from a square one) */
static aft_status settle_grid(const aft_config *cfg, const aft_bias *bias, aft_error *err)
{
    const char *name = bias->name ? bias->name : "the conv bias";
    size_t n;
    if ((cfg->grid_h == 0) != (cfg->grid_w == 0))
        return aft_fail(err, AFT_ERR_ARG, "a grid of %zu x %zu: a grid needs both its height and its width "
                        "(0 x 0 for a 1-D sequence)", cfg->grid_h, cfg->grid_w);
    if (!aft_mul_ok(cfg->grid_h, cfg->grid_w, &n))
        return aft_fail(err, AFT_ERR_ARG, "a grid of %zu x %zu overflows", cfg->grid_h, cfg->grid_w);
    int on_grid = cfg->grid_w > 0, conv_bias = bias->kind == AFT_BIAS_CONV && cfg->variant == AFT_CONV;
    if (conv_bias && bias->conv_2d && !on_grid)
        return aft_fail(err, AFT_ERR_ARG, "'%s' is a 2-D conv bias, which needs a grid (grid_h x grid_w)", name);
    if (conv_bias && !bias->conv_2d && on_grid)
        return aft_fail(err, AFT_ERR_ARG, "conv on a grid of %zu x %zu needs a 2-D bias (heads, 2*window-1, "
                        "2*window-1) with conv_2d set; '%s' is 1-D", cfg->grid_h, cfg->grid_w, name);
    return AFT_OK;
}

aft_status aft_config_settle(aft_config *cfg, const aft_bias *bias, size_t C, size_t kc, aft_error *err)
{
    if (!bias || !cfg) return aft_fail(err, AFT_ERR_ARG, "missing bias or configuration (NULL)");
    if ((unsigned)bias->kind > AFT_BIAS_CONV)
        return aft_fail(err, AFT_ERR_ARG, "unknown position bias kind %d", (int)bias->kind);
    if ((unsigned)cfg->variant > AFT_CONV) return aft_fail(err, AFT_ERR_ARG, "unknown variant %d", (int)cfg->variant);
    if ((unsigned)cfg->precision > AFT_PRECISION_BF16)
        return aft_fail(err, AFT_ERR_ARG, "unknown precision %d", (int)cfg->precision);
    aft_status st = settle_grid(cfg, bias, err);
    if (st) return st;
    cfg->threads = aft_threads_or_all(cfg->threads);
    if (cfg->variant == AFT_CONV) return settle_conv(cfg, bias, C, kc, err);
    if (cfg->window == AFT_WINDOW_FROM_BIAS)
        return aft_fail(err, AFT_ERR_ARG, "only conv takes its window from the bias");
    return AFT_OK;
}

/* the sizes, the keys' channels and the bias against a settled cfg */
static aft_status check_args(const aft_bias *bias, const aft_config *cfg, size_t B, size_t T, size_t C,
                             size_t kc, aft_error *err)
{
    size_t H = cfg->variant == AFT_CONV ? cfg->heads : 1;
    if (T > INT_MAX || C > INT_MAX / 2 || B > INT_MAX)
        return aft_fail(err, AFT_ERR_ARG, "sizes B = %zu, T = %zu, C = %zu exceed the supported range", B, T, C);
    size_t n;
    if (!aft_mul3_ok(B, T, C, &n) || !aft_mul_ok(n, 2 * sizeof(float), &n))
        return aft_fail(err, AFT_ERR_ARG, "sizes B = %zu, T = %zu, C = %zu overflow", B, T, C);
    if (cfg->grid_w && T != cfg->grid_h * cfg->grid_w)
        return aft_fail(err, AFT_ERR_ARG, "a grid of %zu x %zu holds %zu %s, but T = %zu", cfg->grid_h,
                        cfg->grid_w, cfg->grid_h * cfg->grid_w, aft_noun(cfg->grid_h * cfg->grid_w, "token", "tokens"),
                        T);
    if (cfg->variant == AFT_CONV) {
        if (C % H != 0)
            return aft_fail(err, AFT_ERR_ARG, "conv: %zu heads do not divide the %zu hidden channels", H, C);
        if (kc != C && kc != H)
            return aft_fail(err, AFT_ERR_ARG,
                            "conv: keys have %zu %s; expected %zu (one per value channel) or %zu (one per head)",
                            kc, aft_noun(kc, "channel", "channels"), C, H);
        if ((bias->kind != AFT_BIAS_CONV || !bias->conv) && cfg->grid_w)
            return aft_fail(err, AFT_ERR_ARG,
                            "conv: needs a per-head position bias of shape (heads, 2*window-1, 2*window-1)");
        if (bias->kind != AFT_BIAS_CONV || !bias->conv)
            return aft_fail(err, AFT_ERR_ARG, "conv: needs a per-head position bias of shape (heads, 2*window-1)");
    } else {
        if (kc != C)
            return aft_fail(err, AFT_ERR_ARG, "keys have %zu %s but values have %zu", kc,
                            aft_noun(kc, "channel", "channels"), C);
        if (bias->kind == AFT_BIAS_CONV && cfg->variant != AFT_SIMPLE)
            return aft_fail(err, AFT_ERR_ARG, "a per-head (conv) bias needs the conv variant");
    }
    if (aft_bias_reach(bias, cfg->variant) < T)
        return aft_fail(err, AFT_ERR_ARG, "sequence length T = %zu exceeds the position bias size Tmax = %zu", T,
                        bias->tmax);
    if (cfg->variant == AFT_FULL || cfg->variant == AFT_LOCAL) {
        if (bias->kind == AFT_BIAS_DENSE && !bias->dense)
            return aft_fail(err, AFT_ERR_ARG, "dense position bias without data");
        if (bias->kind == AFT_BIAS_FACTORED && (!bias->u || !bias->v || bias->rank == 0))
            return aft_fail(err, AFT_ERR_ARG, "factored position bias needs u, v and a rank >= 1");
    }
    return AFT_OK;
}

aft_status aft_spec_settle(aft_opspec *sp, const aft_bias *bias, const aft_config *cfg_in, size_t B, size_t T,
                           size_t C, size_t kc, aft_error *err)
{
    if (!bias || !cfg_in) return aft_fail(err, AFT_ERR_ARG, "missing bias or configuration (NULL)");
    aft_config cfg = *cfg_in;
    aft_status st = aft_config_settle(&cfg, bias, C, kc, err);
    if (st) return st;
    if ((st = check_args(bias, &cfg, B, T, C, kc, err))) return st;
    int conv = cfg.variant == AFT_CONV;
    size_t len = conv ? (bias->conv_len ? bias->conv_len : aft_conv_len(cfg.window)) : 0;
    *sp = (aft_opspec){
        .bias = bias, .variant = cfg.variant, .T = T, .C = C, .heads = conv ? cfg.heads : 1,
        .window = cfg.window, .conv_len = len,
        .conv_rows = conv ? (bias->conv_len ? bias->conv_rows : cfg.heads) : 0,
        .zero_bias = cfg.variant == AFT_SIMPLE || cfg.window == 0 ||
                     (conv ? bias->kind != AFT_BIAS_CONV : bias->kind == AFT_BIAS_NONE),
        .causal = cfg.causal != 0, .threads = cfg.threads, .full_blas = cfg.full_product == AFT_KERNEL_BLAS,
        .bf16 = aft_bf16_wanted(cfg.precision),
        .ldq = C, .ldk = kc, .ldv = C, .grid_h = cfg.grid_h, .grid_w = cfg.grid_w};
    return AFT_OK;
}

/* ---- a settled operator's band, halo and grid */

size_t aft_spec_band(const aft_opspec *sp, size_t T)
{
    if (sp->zero_bias) return 1;
    return aft_window_in(sp->window, T);
}

size_t aft_spec_halo(const aft_opspec *sp)
{
    return aft_spec_band(sp, SIZE_MAX);
}

size_t aft_spec_keep(const aft_opspec *sp)
{
    return sp->variant == AFT_FULL ? SIZE_MAX : aft_spec_halo(sp);
}

size_t aft_spec_grid_reach(const aft_opspec *sp)
{
    return aft_window_in(sp->window - 1, sp->T);
}

int aft_spec_on_grid(const aft_opspec *sp)
{
    return sp->grid_w > 0 && !sp->zero_bias && (sp->variant == AFT_LOCAL || sp->variant == AFT_CONV);
}
