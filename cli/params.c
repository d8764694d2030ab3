/* params.c - a layer's parameters without a weights file: the one seeded
 * initialisation that `aft run` uses without --weights and `aft bench`
 * always, so a benchmark times the layer a run computes. */
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the position bias entries are uniform in [-0.5, 0.5) */
#define SEEDED_BIAS_SCALE 0.5f

/* entry (i, j) of tensor id is uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)),
 * like PyTorch's Linear default bound; NULL when out of memory
 * m: (rows, cols) */
static float *seeded_matrix(uint64_t seed, unsigned id, size_t rows, size_t cols, size_t fan_in)
{
    size_t n;
    if (__builtin_mul_overflow(rows, cols, &n) || n > SIZE_MAX / sizeof(float)) return NULL;
    float *m = malloc(n * sizeof(float) + 1);
    if (!m) return NULL;
    float bound = 1.0f / sqrtf((float)fan_in);
    uint64_t s = seed ^ (0x100000001b3ULL * (id + 1));
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) m[i * cols + j] = aft_seeded_bias(s, bound, i, j);
    return m;
}

/* wq, wk, wv: (C, D), wo: (D, C), and the biases bq, bk, bv (C), bo (D) */
static int seed_projections(cli_params *sp, uint64_t seed, size_t D, size_t C, const char *cmd)
{
    size_t dims[4][2] = {{C, D}, {C, D}, {C, D}, {D, C}};
    for (unsigned i = 0; i < 4; i++) {
        sp->owned[i] = seeded_matrix(seed, i, dims[i][0], dims[i][1], dims[i][1]);
        if (!sp->owned[i]) {
            cli_error(cmd, "out of memory for weights");
            return EXIT_DATA;
        }
    }
    size_t ld = C > D ? C : D;
    sp->owned[4] = seeded_matrix(seed, 4, 4, ld, D ? D : 1);   /* rows: bq, bk, bv, bo */
    if (!sp->owned[4]) {
        cli_error(cmd, "out of memory for weights");
        return EXIT_DATA;
    }
    aft_params *p = &sp->p;
    p->d_model = D;
    p->d_hidden = C;
    p->k_out = C;
    p->wq = sp->owned[0];
    p->wk = sp->owned[1];
    p->wv = sp->owned[2];
    p->wo = sp->owned[3];
    p->bq = sp->owned[4];
    p->bk = sp->owned[4] + ld;
    p->bv = sp->owned[4] + 2 * ld;
    p->bo = sp->owned[4] + 3 * ld;
    return 0;
}

/* conv on a grid: (heads, 2S - 1, 2S - 1), entry (h, a, b) for the offset
 * (a, b) - (S - 1) of the asked window S, so an offset's value does not
 * depend on how far the window was narrowed to the grid (cfg->window) */
static int seed_conv_2d(cli_params *sp, const aft_config *cfg, uint64_t seed, size_t S, const char *cmd)
{
    size_t H = cfg->heads, n = aft_conv_len(cfg->window), shift = S - cfg->window, cells;
    if (__builtin_mul_overflow(n, n, &cells) || __builtin_mul_overflow(cells, H, &cells) ||
        !(sp->owned[5] = malloc(cells * sizeof(float) + 1))) {
        cli_error(cmd, "out of memory for the conv bias");
        return EXIT_DATA;
    }
    uint64_t s = seed ^ (0x100000001b3ULL * 6);
    for (size_t h = 0; h < H; h++)
        for (size_t a = 0; a < n; a++)
            for (size_t b = 0; b < n; b++)
                sp->owned[5][(h * n + a) * n + b] =
                    SEEDED_BIAS_SCALE * aft_seeded_bias(s ^ (0x9e3779b97f4a7c15ULL * (a + shift + 1)), 1.0f, h, b + shift);
    aft_bias *bi = &sp->p.bias;
    bi->kind = AFT_BIAS_CONV;
    bi->conv = sp->owned[5];
    bi->conv_len = n;
    bi->conv_rows = H;
    bi->conv_2d = 1;
    return 0;
}

int cli_params_seeded(cli_params *sp, aft_config *cfg, uint64_t seed, size_t T, size_t D, size_t C,
                      int projections, const char *cmd)
{
    size_t wbytes;
    if (projections && (__builtin_mul_overflow(C, D, &wbytes) ||
                        __builtin_mul_overflow(wbytes, 4 * sizeof(float), &wbytes))) {
        cli_error(cmd, "weights of %zu x %zu do not fit in memory", C, D);
        return EXIT_DATA;
    }
    /* a conv window past the sequence sees everything: generate only the
     * offsets that can occur (T: SIZE_MAX for a stream, which may go on) */
    size_t S = cfg->window;
    if (cfg->variant == AFT_CONV && cfg->window) cfg->window = aft_config_window(cfg, T ? T : 1);
    if (projections) {
        int rc = seed_projections(sp, seed, D, C, cmd);
        if (rc) return rc;
    }
    aft_bias *b = &sp->p.bias;
    if (cfg->variant == AFT_CONV && cfg->window && cfg->grid_h) return seed_conv_2d(sp, cfg, seed, S, cmd);
    if (cfg->variant == AFT_CONV && cfg->window) {
        /* conv: (heads, 2S - 1), entry (h, o + S - 1) for offset o drawn as a
         * matrix of the asked window S and scaled to the bias's range, so an
         * offset's value does not depend on how far the window was narrowed */
        size_t H = cfg->heads, n = aft_conv_len(cfg->window), shift = S - cfg->window;
        sp->owned[5] = seeded_matrix(seed, 5, H, n, 1);
        for (size_t h = 0; h < H && sp->owned[5] && shift; h++)
            for (size_t c = 0; c < n; c++)
                sp->owned[5][h * n + c] = aft_seeded_bias(seed ^ (0x100000001b3ULL * 6), 1.0f, h, c + shift);
        if (!sp->owned[5]) {
            cli_error(cmd, "out of memory for the conv bias");
            return EXIT_DATA;
        }
        for (size_t i = 0; i < H * n; i++) sp->owned[5][i] *= SEEDED_BIAS_SCALE;
        b->kind = AFT_BIAS_CONV;
        b->conv = sp->owned[5];
        b->conv_len = n;
        b->conv_rows = H;
    } else if (cfg->variant == AFT_CONV) {
        /* window 0: no band, simple */
    } else if (cfg->variant != AFT_SIMPLE) {
        /* full, local: w[t,t'] made from (seed, t, t') as needed, never a T x T array */
        b->kind = AFT_BIAS_SEEDED;
        b->seed = seed;
        b->scale = SEEDED_BIAS_SCALE;
    }
    return 0;
}

int cli_params_16(cli_params *sp, aft_dtype dt, const char *cmd)
{
    if (dt != AFT_F16 && dt != AFT_BF16) return 0;
    aft_params *p = &sp->p;
    size_t D = p->d_model, C = p->d_hidden, KC = p->k_out ? p->k_out : C;
    const size_t n[4] = {C * D, KC * D, C * D, D * C};
    const float **w[4] = {&p->wq, &p->wk, &p->wv, &p->wo};
    for (int i = 0; i < 4; i++) {
        if (!(sp->w16[i] = malloc(n[i] * sizeof(uint16_t) + 1))) {
            cli_error(cmd, "out of memory for weights");
            return EXIT_DATA;
        }
        for (size_t j = 0; j < n[i]; j++)
            sp->w16[i][j] = dt == AFT_F16 ? aft_f32_to_f16((*w[i])[j]) : aft_f32_to_bf16((*w[i])[j]);
        *w[i] = (const float *)sp->w16[i];
    }
    p->w_dtype = dt;
    return 0;
}

void cli_params_free(cli_params *sp)
{
    for (int i = 0; i < 6; i++) free(sp->owned[i]);
    for (int i = 0; i < 4; i++) free(sp->w16[i]);
    memset(sp, 0, sizeof *sp);
}
