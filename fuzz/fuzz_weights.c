/* fuzz_weights.c - libFuzzer target for weight-name resolution: a parsed
 * .safetensors handle handed to aft_weights_load_grid (the layer) and
 * aft_bias_load_grid (the bare operator), for every variant, a few prefixes,
 * on a sequence and on a grid, then aft_weights_free.
 *
 * Whatever the file holds, loading either fails with a proper one-line
 * message or gives parameters whose every array has the size the shapes
 * promise: all of them are read here, so a size mix-up shows as a sanitizer
 * report. aft_weights_free must be safe after success and after failure. */
#include <stdint.h>
#include <string.h>

#include "aft.h"
#include "fuzz_check.h"

static volatile float sink;

/* reads n floats of a; a may be NULL only when allowed */
static void touch(const float *a, size_t n, int may_be_null)
{
    if (!a) {
        FUZZ_REQUIRE(may_be_null);
        return;
    }
    for (size_t i = 0; i < n; i++) sink = a[i];
}

/* reads n weights of a in the dtype lib/aft.h says the projections are
 * held in (p.w_dtype): F16 and BF16 as 2 bytes each at any alignment,
 * anything else float32 */
static volatile uint16_t sink16;
static void touch_w(const float *a, size_t n, aft_dtype dt)
{
    FUZZ_REQUIRE(a != NULL);
    if (dt != AFT_F16 && dt != AFT_BF16) {
        touch(a, n, 0);
        return;
    }
    const unsigned char *h = (const unsigned char *)a;
    for (size_t i = 0; i < n; i++) {
        uint16_t v;
        memcpy(&v, h + 2 * i, sizeof v);
        sink16 = v;
    }
}

static size_t mul(size_t a, size_t b)
{
    size_t r;
    FUZZ_REQUIRE(!__builtin_mul_overflow(a, b, &r));
    return r;
}

/* the position bias as aft_bias_load describes it in lib/aft.h (grid: as
 * aft_bias_load_grid does) */
static void check_bias(const aft_weights *w, aft_variant v, int grid)
{
    const aft_bias *b = &w->p.bias;
    FUZZ_REQUIRE(b->mask == NULL);
    if (v == AFT_SIMPLE) {
        FUZZ_REQUIRE(b->kind == AFT_BIAS_NONE);
    } else if (v == AFT_CONV) {
        FUZZ_REQUIRE(b->kind == AFT_BIAS_CONV);
        FUZZ_REQUIRE(w->conv_window >= 1 && b->conv_len == 2 * w->conv_window - 1);
        FUZZ_REQUIRE(b->conv_rows == w->conv_heads && b->conv_rows >= 1);
        FUZZ_REQUIRE(b->conv_2d == grid);
        touch(b->conv, mul(b->conv_rows, grid ? mul(b->conv_len, b->conv_len) : b->conv_len), 0);
    } else if (b->kind == AFT_BIAS_DENSE) {
        touch(b->dense, mul(b->tmax, b->tmax), 0);
    } else {
        FUZZ_REQUIRE(b->kind == AFT_BIAS_FACTORED && b->rank >= 1);
        touch(b->u, mul(b->tmax, b->rank), 0);
        touch(b->v, mul(b->tmax, b->rank), 0);
    }
}

static void check_layer(const aft_weights *w, aft_variant v, int grid)
{
    const aft_params *p = &w->p;
    size_t D = p->d_model, C = p->d_hidden, KC = p->k_out;
    touch_w(p->wq, mul(C, D), p->w_dtype);
    touch_w(p->wk, mul(KC, D), p->w_dtype);
    touch_w(p->wv, mul(C, D), p->w_dtype);
    touch_w(p->wo, mul(D, C), p->w_dtype);
    touch(p->bq, C, 1);
    touch(p->bk, KC, 1);
    touch(p->bv, C, 1);
    touch(p->bo, D, 1);
    check_bias(w, v, grid);
}

/* the tensors none of a layer's: no more than the file has, the first
 * named as messages show names */
static void check_unexpected(const aft_weights *w, const aft_st_file *f)
{
    FUZZ_REQUIRE(w->n_unexpected <= aft_st_count(f));
    fuzz_check_shown(w->unexpected, sizeof w->unexpected);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    aft_st_file *f;
    aft_error err;
    if (aft_st_open_mem(data, size, &f, &err) != AFT_OK) return 0;

    static const char *const prefixes[] = {"", "attn.", "blocks.0.attn."};
    static const aft_variant variants[] = {AFT_FULL, AFT_LOCAL, AFT_SIMPLE, AFT_CONV};
    for (size_t ip = 0; ip < sizeof prefixes / sizeof prefixes[0]; ip++)
        for (size_t iv = 0; iv < sizeof variants / sizeof variants[0]; iv++)
            for (int grid = 0; grid <= 1; grid++) {
                aft_weights w;
                memset(&err, 0, sizeof err);
                if (aft_weights_load_grid(f, prefixes[ip], variants[iv], grid, &w, &err) == AFT_OK) {
                    check_layer(&w, variants[iv], grid);
                    check_unexpected(&w, f);
                } else {
                    fuzz_check_error(&err);
                }
                FUZZ_REQUIRE(w.nowned <= sizeof w.owned / sizeof w.owned[0]);
                aft_weights_free(&w);

                /* the bare operator's path: only the bias */
                memset(&w, 0, sizeof w);
                memset(&err, 0, sizeof err);
                if (aft_bias_load_grid(f, prefixes[ip], variants[iv], grid, &w, &err) == AFT_OK) {
                    check_bias(&w, variants[iv], grid);
                    check_unexpected(&w, f);
                } else {
                    fuzz_check_error(&err);
                }
                FUZZ_REQUIRE(w.nowned <= sizeof w.owned / sizeof w.owned[0]);
                aft_weights_free(&w);
            }
    aft_st_close(f);
    return 0;
}
