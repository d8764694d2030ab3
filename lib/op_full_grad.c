#include "kernels.h"
aft_status aft_op_full_grad(const aft_grad_io *io, const float *q, const float *k, const float *v,
                            const uint8_t *mask, const aft_opspec *sp, aft_error *err)
{
    (void)io; (void)q; (void)k; (void)v; (void)mask; (void)sp;
    return aft_fail(err, AFT_ERR_ARG, "full backward: not yet");
}
