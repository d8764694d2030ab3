/* cases.c - the operator's tests' shared description of a case (cases.h) */
#include "cases.h"

#include "ref_aft.h"

const char *const mask_names[] = {"none", "TxT", "BxTxT", "TxT-causal"};
const char *const vals_names[] = {"normal", "wide", "one-huge-key", "adversarial", "rising",
                                  "one-key-beyond-tame", "one-bias-beyond-tame"};
const char *const kind_names[] = {"none", "dense", "factored", "seeded", "conv"};

const size_t small_T[4] = {1, 7, 33, 130};
const size_t grid_BC[4][2] = {{1, 5}, {3, 12}, {1, 12}, {3, 5}};

const char *impl_name(aft_impl impl)
{
    return impl == AFT_IMPL_FAST ? "fast" : "reference";
}

uint8_t *make_mask(rng *r, size_t nb, size_t T)
{
    uint8_t *m = xmalloc(nb * T * T);
    for (size_t b = 0; b < nb; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t t2 = 0; t2 < T; t2++)
                m[(b * T + t) * T + t2] =
                    (t + b) % 5 == 2 ? 0 : (uint8_t)(rng_unif(r) < 0.7);
    return m;
}

size_t make_factored(rng *r, aft_bias *b, float **u, float **v, size_t T, int extreme)
{
    size_t tmax = T + 2, rank = extreme ? 2 : 3;
    double s = extreme ? 11.0 : 0.6;
    *u = xmalloc(tmax * rank * sizeof **u);
    *v = xmalloc(tmax * rank * sizeof **v);
    for (size_t i = 0; i < tmax * rank; i++) {
        (*u)[i] = extreme ? on_grid(s * rng_sym(r), 0x1p-4) : (float)(s * rng_sym(r));
        (*v)[i] = extreme ? on_grid(s * rng_sym(r), 0x1p-4) : (float)(s * rng_sym(r));
    }
    b->u = *u;
    b->v = *v;
    b->rank = rank;
    b->tmax = tmax;
    return tmax * rank;
}

void make_qkv(rng *r, float **q, float **k, float **v, vals_mode vals, const aft_bias *bias, const aft_config *cfg,
              size_t B, size_t T, size_t C, size_t kc)
{
    size_t nq = B * T * C, nk = B * T * kc;
    *q = xmalloc(nq * sizeof **q);
    *v = xmalloc(nq * sizeof **v);
    *k = xmalloc(nk * sizeof **k);
    for (size_t i = 0; i < nq; i++) {
        (*q)[i] = vals == VALS_WIDE ? (float)(100.0 * rng_sym(r)) : (float)rng_normal(r);
        (*v)[i] = (float)rng_sym(r);
    }
    size_t H = cfg->variant == AFT_CONV ? cfg->heads : 1;
    for (size_t b = 0; b < B; b++)
        for (size_t t2 = 0; t2 < T; t2++)
            for (size_t j = 0; j < kc; j++) {
                float *kk = &(*k)[(b * T + t2) * kc + j];
                switch (vals) {
                case VALS_NORMAL:
                case VALS_RISING:
                case VALS_BEYOND_KEY:    /* the other tests' modes: normal keys here */
                case VALS_BEYOND_BIAS:
                    *kk = (float)rng_normal(r);
                    break;
                case VALS_WIDE:
                    *kk = on_grid(500.0 * rng_sym(r), 0x1p-8);
                    break;
                case VALS_ONE_HUGE:
                    *kk = t2 == 2 * T / 3 ? 500.0f : -500.0f;
                    break;
                case VALS_ADVERSE: {
                    /* row t* differs per key channel; w from the same bias the
                     * operator uses (head of channel j) */
                    size_t head = kc == C ? j / (C / H) : j, ts = (j * 7 + 3) % T;
                    *kk = (float)(375.0 - 0.5 * ref_aft_bias_entry(bias, cfg, head, ts, t2));
                    break;
                }
                }
            }
}

int grid_threads(int n)
{
    return n % 4 == 0 ? 0 : 1;
}
