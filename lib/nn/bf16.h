/* bf16.h - products with bf16 operands and float32 sums (bf16.c): a general
 * product and the layer's projections with W packed once as bf16.
 *
 * bf16 is float32's upper half: the same exponent range, 8 significant
 * bits instead of 24. An operand rounded to it (nearest, ties to even)
 * carries a relative error of at most 2^-9; the products of two such
 * operands are exact in float32 and summed there. The engine is the CPU's
 * bf16 arithmetic, chosen at run time and used only by the avx512 kernel
 * level's code: AVX512_BF16's vdpbf16ps (two multiply-adds per float32
 * lane). AMX is detected (lib/cpu/arch.h) but has no kernel here: an AMX
 * CPU runs the AVX512_BF16 one (docs/design.md, bf16 products). */
#ifndef AFT_BF16_H
#define AFT_BF16_H

#include "linear.h"

#include <stdint.h>

/* the bf16 engine this CPU and OS run, at the kernel level in use */
typedef enum { AFT_BF16_NONE, AFT_BF16_AVX512, AFT_BF16_AMX } aft_bf16_engine;
aft_bf16_engine aft_bf16_engine_now(void);
const char *aft_bf16_engine_name(aft_bf16_engine e);   /* "none", "avx512_bf16", "amx" */

/* C (M x N, rows ldc apart) = beta C + op(A) op(B): trans_a: A is K x M (else M x K); trans_b: B is N x K (else
 * K x N); rows lda, ldb apart. Operands rounded to bf16 (nearest, ties to even; NaN stays NaN), products summed
 * in float32; beta == 0 does not read C. Without an engine: float32 (cblas_sgemm), split as aft_gemm splits
 * (trans_a = 0, beta = 0: the same bits as aft_gemm). Split over threads as aft_gemm does; one call when
 * inside a parallel region (the operator calls it per block from its own threads). */
void aft_gemm_bf16(int threads, int trans_a, int trans_b, size_t M, size_t N, size_t K, const float *A, size_t lda,
                   const float *B, size_t ldb, float beta, float *C, size_t ldc);

/* a projection with W (n x k, stored as wdt: AFT_F32, AFT_F16 or AFT_BF16) packed once as bf16 (a bf16 W is
 * copied, not rounded); aft_linear_apply / aft_linear_apply_x / aft_linear_view / aft_linear_free then use it:
 * x rounded to bf16 as it is packed, the sums and the bias (float32) in float32. Without an engine it is
 * aft_linear_init_dt. w and bias must outlive l. */
aft_status aft_linear_init_bf16(aft_linear *l, const void *w, aft_dtype wdt, const float *bias, size_t n, size_t k,
                                int threads, aft_error *err);

/* The machine's bf16 product rate in GFLOP/s on `threads` threads (0 where there is no engine), for aft bench's
 * table beside the sgemm ceiling: peak, vdpbf16ps on registers alone (2 x 32 flops an instruction, no memory);
 * rate, aft_gemm_bf16 on 2048^3, the rows split over the threads, best of three (as bench's sgemm ceiling). */
double aft_bf16_peak(int threads);
double aft_bf16_rate(int threads);

/* x rounded to bf16, nearest with ties to even, a NaN kept a (quiet) NaN; the tests' reference rounds with it
 * (the engine's vcvtne2ps2bf16 rounds the same, but takes a denormal float32 as zero, as vdpbf16ps does) */
static inline uint16_t aft_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* bf16.c's side of linear.c: the apply and view of an aft_linear that l->bf16 marks */
void aft_linear_bf16_apply(const aft_linear *l, size_t M, const float *x, size_t ldx, float *y, size_t ldy);
aft_status aft_linear_bf16_view(aft_linear *v, const aft_linear *parent, size_t f0, size_t n, aft_error *err);

/* W16's (iface46 item 1, lib/nn/linear.h), declared here until it lands: bf16.c's weak stand-in runs the
 * float32 case only */
aft_status aft_linear_init_dt(aft_linear *l, const void *w, aft_dtype wdt, const float *bias, size_t n, size_t k,
                              aft_kernel kernel, int threads, aft_error *err);

#endif /* AFT_BF16_H */
