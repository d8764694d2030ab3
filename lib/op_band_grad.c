#include "kernels.h"
aft_status aft_op_band_grad(const aft_grad_io *io, const float *q, const float *k, const float *v, size_t B,
                            const aft_opspec *sp, aft_error *err)
{
    (void)io; (void)q; (void)k; (void)v; (void)B; (void)sp;
    return aft_fail(err, AFT_ERR_ARG, "band backward: not yet");
}
