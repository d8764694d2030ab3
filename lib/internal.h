/* internal.h - helpers shared inside lib/; not part of the public API. */
#ifndef AFT_INTERNAL_H
#define AFT_INTERNAL_H

#include "aft.h"
#include <stdbool.h>

/* checked size arithmetic: return false on overflow */
static inline bool aft_mul_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool aft_add_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}
/* a * b * c, false on overflow */
static inline bool aft_mul3_ok(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab;
    return aft_mul_ok(a, b, &ab) && aft_mul_ok(ab, c, out);
}

/* malloc of n * size bytes with overflow check; NULL on overflow or failure.
 * n == 0 still returns a unique pointer. */
void *aft_alloc_array(size_t n, size_t size);
/* same, zero-filled */
void *aft_calloc_array(size_t n, size_t size);

/* ------------------------------------------------------------ formats */

/* .npy images in memory, beyond aft_npy_read_mem (npy.c):
 * view: as aft_npy_read_mem, but when the data is already native C order
 * the tensor borrows buf (owned NULL) instead of copying it;
 * owned: buf is a malloc'd block of len bytes that the call consumes,
 * reused for the data where it can (no second copy);
 * view_size: checks the image as the readers do and sets *copy_bytes to
 * what aft_npy_view_mem would allocate (0 when it borrows). */
aft_status aft_npy_view_mem(const void *buf, size_t len, aft_tensor *out, aft_npy_info *info, aft_error *err);
aft_status aft_npy_read_owned(void *buf, size_t len, aft_tensor *out, aft_npy_info *info, aft_error *err);
aft_status aft_npy_view_size(const void *buf, size_t len, size_t *copy_bytes, aft_error *err);

/* The handle behind aft_st_open: filled by the .safetensors parser
 * (safetensors.c) or the .npz reader (npz.c). */
struct aft_st_file {
    aft_format format;           /* AFT_FORMAT_SAFETENSORS or AFT_FORMAT_NPZ */
    const unsigned char *bytes;  /* the whole file: size bytes */
    size_t size;
    void *map;                   /* mmap of the file, or NULL */
    size_t map_size;
    unsigned char *owned;        /* file read from a pipe or stdin, or NULL */
    size_t n;
    aft_tensor *tensors;         /* (n) in file order: ascending data offset;
                                  * a .npz member's owned block is freed with f */
    const char **names;          /* (n) in file order, into strings */
    size_t *by_name;             /* (n) file positions sorted by name, for find */
    size_t nmeta;
    const char **meta;           /* (2 * nmeta) key, value pairs in header order */
    char *strings;               /* one block holding every name, key and value */
};

/* Reads f->bytes[0..f->size) as a .npz archive into f's tables; tensors
 * allocated for members count against max_bytes (npz.c). On failure the
 * caller frees f with aft_st_close. */
aft_status aft_npz_parse(aft_st_file *f, size_t max_bytes, aft_error *err);

/* aft_npz_writer_new with every size and offset in zip64 records, as an
 * archive over 4 GiB has them (tests write such archives without 4 GiB) */
aft_status aft_npz_writer_new_zip64(FILE *fp, int force_zip64, aft_npz_writer **out, aft_error *err);

/* ------------------------------------------------------------ numerics */

#include <math.h>
#include <string.h>

/* exp(x) for float, written so a loop of it vectorizes without -ffast-math:
 * n = round(x / ln 2), r = x - n ln 2 (|r| <= ln2 / 2, two-part ln 2 so the
 * reduction is exact), exp(r) by its Taylor series to r^7 (relative error
 * below 1e-8 on that range), then scaled by 2^n by adding n to the exponent
 * field of exp(r) (in [0.70, 1.42], so for -125 <= n <= 128 the sum stays a
 * normal float, or reaches the largest finite one at most). n comes from
 * the 1.5 * 2^23 rounding trick, whose sum's low bits are n itself. Results
 * below exp(-86.98), about 1.7e-38, flush to 0 (callers only ever drop such
 * terms); x above ln(FLT_MAX) gives +inf, NaN stays NaN. Vectorised, this
 * is about 28 instructions per 16 lanes (splitting 2^n in two, as before,
 * took 45: 1.6x slower), with identical results wherever they are normal. */
/* the bits of exp(xc) for -86.98 <= xc <= 88.72283, as above */
static inline uint32_t aft_exp_bits(float xc)
{
    /* 1.5 * 2^23 + n, exactly: the float's unit in the last place is 1 */
    float big = fmaf(xc, 1.44269504088896341f, 12582912.0f);
    float n = big - 12582912.0f;
    float r = fmaf(n, -0.693145751953125f, xc);
    r = fmaf(n, -1.428606765330187e-06f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    uint32_t bb, pb;
    memcpy(&bb, &big, sizeof bb);
    memcpy(&pb, &p, sizeof pb);
    return pb + ((bb - 0x4b400000u) << 23);   /* 0x4b400000: 1.5 * 2^23 */
}

static inline float aft_expf(float x)
{
    const float hi = 88.72283f, lo = -86.98f;   /* round(lo / ln 2) = -125 */
    float xc = x < lo ? lo : x;
    xc = xc > hi ? hi : xc;
    uint32_t yb = aft_exp_bits(xc), xb;
    memcpy(&xb, &x, sizeof xb);
    /* the edges, from x's bits with integer masks: a float comparison or a
     * select here makes GCC move the arithmetic above into branches, which
     * it then cannot vectorise without AVX-512's masks. A negative float's
     * unsigned bits grow with its magnitude; a positive one's are below
     * 0x80000000, and as signed integers positive floats keep their order */
    uint32_t under = 0u - (uint32_t)(xb > 0xc2adf5c3u);                  /* x < lo (-86.98f) */
    uint32_t over = 0u - (uint32_t)((int32_t)xb > (int32_t)0x42b17217);   /* x > hi (88.72283f) */
    uint32_t nan = 0u - (uint32_t)((xb & 0x7fffffffu) > 0x7f800000u);
    yb = (yb & ~(under | over)) | (over & 0x7f800000u);   /* 0 below, +inf above */
    yb = (yb & ~nan) | (xb & nan);                          /* NaN stays NaN */
    float y;
    memcpy(&y, &yb, sizeof y);
    return y;
}

/* aft_expf for x <= 0 (-inf included) that is never NaN: a key less a
 * maximum over checked keys. The same value, without the edges such x
 * cannot reach (about 17 instructions a vector instead of 28). */
static inline float aft_expf_nonpos(float x)
{
    float xc = x < -86.98f ? -86.98f : x;
    uint32_t yb = aft_exp_bits(xc), xb;
    memcpy(&xb, &x, sizeof xb);
    yb &= ~(0u - (uint32_t)(xb > 0xc2adf5c3u));   /* 0 below -86.98 */
    float y;
    memcpy(&y, &yb, sizeof y);
    return y;
}

/* The widest vector whose operations are single instructions here: 16
 * floats with AVX-512, 8 with AVX/AVX2, 4 otherwise (GCC/Clang vector
 * extensions). Kernels written with wider vectors than the machine has get
 * them split into pieces, spilled and reassembled lane by lane: a 64-byte
 * vector on an AVX2 CPU made the band kernel's inner loop four times slower. */
#if defined(__AVX512F__)
#define AFT_VEC_BYTES 64
#elif defined(__AVX__)
#define AFT_VEC_BYTES 32
#else
#define AFT_VEC_BYTES 16
#endif
enum { AFT_VL = AFT_VEC_BYTES / 4 };   /* floats a vector */
typedef float aft_vf __attribute__((vector_size(AFT_VEC_BYTES)));
typedef int32_t aft_vi __attribute__((vector_size(AFT_VEC_BYTES)));
/* loads and stores through memcpy: rows are not vector-aligned */
static inline aft_vf aft_vld(const float *p) { aft_vf x; memcpy(&x, p, sizeof x); return x; }
static inline void aft_vst(float *p, aft_vf x) { memcpy(p, &x, sizeof x); }

/* Hold a loaded vector in a register. Without this GCC folds the load into
 * every FMA that uses it as a memory operand: the band kernel then issued 20
 * loads for 16 FMAs (AVX-512), which on a core with one 512-bit load a
 * cycle (AMD Zen 4) bound the loop by its loads instead of its FMAs, and
 * the fused full tile 13 loads for 12 FMAs (AVX2). */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define AFT_IN_REG(x) __asm__("" : "+v"(x))
#else
#define AFT_IN_REG(x) ((void)0)
#endif

/* max of x[0..n), -inf when n == 0; NaNs are skipped. AFT_VL running
 * maxima side by side, because a plain loop's float max reduction does not
 * vectorise without -ffast-math. */
static inline float aft_max_f32(const float *x, size_t n)
{
    size_t i = 0;
    float r = -INFINITY;
    if (n >= AFT_VL) {
        aft_vf m = aft_vld(x);
        for (i = AFT_VL; i + AFT_VL <= n; i += AFT_VL) {
            aft_vf v = aft_vld(x + i);
            aft_vi gt = v > m;   /* all ones where v is larger */
            m = (aft_vf)(((aft_vi)v & gt) | ((aft_vi)m & ~gt));
        }
        for (int l = 0; l < AFT_VL; l++) r = m[l] > r ? m[l] : r;
    }
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* 1 / (1 + exp(-x)): exp(-x) overflowing to inf gives exactly 0 */
static inline float aft_sigmoidf(float x)
{
    return 1.0f / (1.0f + aft_expf(-x));
}

/* a den below this (in units of the row's stabiliser) means the fast path's
 * factorised exponentials may have lost the terms that matter: such entries
 * are recomputed exactly. Each lost term is below FLT_MIN (1.2e-38), so with
 * den >= 1e-20 what is lost is below T * 1e-18 relative. */
#define AFT_DEN_EXACT_BELOW 1e-20f

/* ------------------------------------------------------------ the operator */

/* What one batch's kernels need to know about w, for rows of the effective
 * bias of the variant (band entries and zeros outside for local and conv). */
typedef struct {
    const aft_bias *bias;
    aft_variant variant;
    size_t T, C, heads, window;
    int causal;
    size_t ldq, ldk, ldv;   /* row strides of q, k, v (C when contiguous) */
    size_t t_off;           /* row t of q, k, v is row t_off + t of the sequence
                             * (the layer's streamed path; 0 otherwise) */
    size_t q_row0;          /* the band kernel's q and out hold rows from this
                             * row on (the streamed path without causality
                             * holds one chunk of them; 0 otherwise) */
} aft_wspec;

/* raw bias entry b(t, t2) of a full/local bias (dense, factored, seeded, none) */
float aft_bias_at(const aft_bias *b, size_t t, size_t t2);
/* w_eff[t, j] for j in [j0, j1) for head h (conv) into out[0 .. j1-j0) */
void aft_w_row(const aft_wspec *ws, size_t h, size_t t, size_t j0, size_t j1, float *out);

/* aft_op_forward with row strides: q row t at q + t * ldq (per batch
 * T * ldq), likewise k and v; out is contiguous (B, T, C) */
aft_status aft_op_forward_ld(float *out, const float *q, size_t ldq, const float *k, size_t ldk,
                             const float *v, size_t ldv, const aft_bias *bias, const aft_config *cfg,
                             size_t B, size_t T, size_t C, size_t kc, aft_error *err);

/* rows per chunk of the layer's chunked paths with aft's own projection
 * kernel (4 times as many with OpenBLAS's) (layer.c) */
#ifndef AFT_LAYER_PIPE_ROWS
#define AFT_LAYER_PIPE_ROWS 96
#endif
#define AFT_LAYER_CHUNK_AUTO SIZE_MAX
/* aft_layer_forward_timed with chunks of `chunk` rows for the streamed
 * paths (0: never streamed; AFT_LAYER_CHUNK_AUTO: the sizes above);
 * *streamed_out (when not NULL) = 1 when such a path produced y. Tests
 * pass small chunks. */
aft_status aft_layer_forward_chunked(float *y, const float *x, const aft_params *p,
                                     const aft_config *cfg, size_t B, size_t T, size_t chunk,
                                     aft_layer_times *times, int *streamed_out, aft_error *err);

/* C (M x N) = A (M x K) op(B) (+ bias, one value per column, when not NULL);
 * op(B) = B (K x N, rows ldb apart) or, trans_b, B^T with B (N x K). Row-major.
 * Split over aft's threads (one single-threaded cblas_sgemm each); one call
 * when already inside a parallel region. */
void aft_gemm(int trans_b, size_t M, size_t N, size_t K, const float *A, size_t lda,
              const float *B, size_t ldb, const float *bias, float *C, size_t ldc);

/* y (M x n, rows ldy apart) = x (M x k, rows ldx apart) W^T + bias, W
 * (n x k) like PyTorch's Linear, bias (n) or NULL (linear.c). init packs W
 * once when aft's own kernel is used (mode AFT_LINEAR_AUTO: where
 * aft_linear_kernel() names it; AFT_LINEAR_OWN: always, for the tests);
 * otherwise apply is aft_gemm. W and bias must outlive l. apply splits the
 * rows over aft's threads; a row's result does not depend on the split. */
enum { AFT_LINEAR_AUTO, AFT_LINEAR_OWN, AFT_LINEAR_BLAS };
typedef struct {
    size_t n, k, npad;
    const float *w, *bias;
    float *pk, *bpad;   /* packed W and the bias padded to npad features (the
                         * packing's, a view's too); NULL: OpenBLAS */
    size_t f0;          /* a view (aft_linear_view): features from f0 of pk */
    int view;           /* pk, bpad belong to another aft_linear */
} aft_linear;
aft_status aft_linear_init(aft_linear *l, const float *w, const float *bias, size_t n, size_t k, int mode,
                           aft_error *err);
void aft_linear_apply(const aft_linear *l, size_t M, const float *x, size_t ldx, float *y, size_t ldy);
/* the same, the same bits; with x_cached (x's rows were just written and
 * are in this core's caches) aft's kernel reads them in place instead of
 * packing them first: the packing was 6% of the layer's output projection
 * of a chunk (96 x 256 x 256) */
void aft_linear_apply_x(const aft_linear *l, size_t M, const float *x, size_t ldx, float *y, size_t ldy,
                        int x_cached);
void aft_linear_free(aft_linear *l);
/* v = features [f0, f0 + n) of parent (rows f0.. of its W and bias), using
 * parent's packing where it can (f0 on a panel's edge; else v packs its
 * own): free v with aft_linear_free before parent. */
aft_status aft_linear_view(aft_linear *v, const aft_linear *parent, size_t f0, size_t n, aft_error *err);
/* the same product as loops accumulating in double */
void aft_linear_ref(float *y, size_t ldy, const float *x, size_t ldx, const float *w, const float *b,
                    size_t M, size_t K, size_t N);
/* the name of aft's projection kernel when the layer uses it here ("aft
 * 6x16", "aft 12x32"), NULL when OpenBLAS runs the projections
 * (AFT_LINEAR_BLAS=1, or a build with 4-float vectors) */
const char *aft_linear_kernel(void);

/* kernels: q, k, v, out: (T, C) of one batch, rows ws->ldq/ldk/ldv apart;
 * mask (T, T) or NULL */
aft_status aft_op_reference(float *out, const float *q, const float *k, const float *v,
                            const uint8_t *mask, const aft_wspec *ws, aft_error *err);
/* rows of exp(w) each thread of the dense kernel holds at once for a
 * sequence of T with the given number of threads */
size_t aft_dense_rows(size_t T, size_t threads);
aft_status aft_op_dense(float *out, const float *q, const float *k, const float *v,
                        const uint8_t *mask, const aft_wspec *ws, aft_error *err);
/* band kernel: local, conv, simple without mask; all batches at once
 * (B, T, C) so threads can split batches and channel blocks */
aft_status aft_op_band(float *out, const float *q, const float *k, const float *v,
                       size_t B, const aft_wspec *ws, aft_error *err);

/* the rows a chunk of the band kernel needs before its own: the window */
size_t aft_op_band_halo(const aft_wspec *ws);
/* The layer's chunked paths (no mask, a band): rows [r0, r1) of one
 * sequence on the calling thread. k and v hold the sequence's rows from
 * ws->t_off on, ws->T of them (row t: row ws->t_off + t of the sequence);
 * rows before r0 must be at least aft_op_band_halo(ws) of them unless t_off
 * is 0. q and out hold rows from ws->q_row0 on. carry_in (NULL when t_off is
 * 0) and carry_out (NULL: not wanted; it may equal carry_in) are 4 ws->C
 * floats (stabiliser, s0, s1, key maximum): the left running sum of the
 * keys before local row 0, and after this call before row r1 - halo.
 * Without causality k and v must hold every row before r1 + halo (or to the
 * end), and right_in (NULL: none) holds the same four arrays for the keys
 * from r1 + halo on. Returns 0 when a key of rows [r0, r1) is +inf or NaN
 * (found as the kernel reads them: what it wrote, carry_out included, is
 * then unusable, and the caller must run the whole sequence through
 * aft_op_forward_ld), 1 when done. The context holds one
 * thread's scratch for chunks of up to `rows` rows (NULL: out of memory). */
typedef struct aft_band_ctx aft_band_ctx;
aft_band_ctx *aft_band_ctx_new(const aft_wspec *ws, size_t rows);
void aft_band_ctx_free(aft_band_ctx *ctx);
int aft_op_band_chunk(aft_band_ctx *ctx, float *out, const float *q, const float *k, const float *v,
                      const aft_wspec *ws, size_t r0, size_t r1, const float *carry_in, float *carry_out,
                      const float *right_in);
/* The softmax sums of keys [r0, r1) (n channels, rows ldk and ldv apart):
 * m = their maximum per channel (-inf: none), s0 = sum exp(k - m), s1 =
 * sum exp(k - m) v; scratch n floats. Returns 1 when a key is +inf or NaN. */
int aft_running_sums(const float *k, size_t ldk, const float *v, size_t ldv, size_t r0, size_t r1, size_t n,
                     float *m, float *s0, float *s1, float *scratch);
/* a += b for running sums of keys kept as (m, s0, s1, kmax), n floats
 * each: the sums of both sets of keys at the larger stabiliser m, and the
 * larger key maximum */
void aft_sums_merge(float *a, const float *b, size_t n);
/* 1 when w is zero everywhere for the band kernel (simple, window 0, no bias) */
int aft_op_band_zero_bias(const aft_wspec *ws);
/* 1 when aft_op_forward_ld would take the fast causal band kernel
 * for this configuration and every argument check passes, 2 when it would
 * take the global softmax of simple without causality, 3 for the band
 * kernel without causality (local, conv), all with as many key channels as
 * value channels and no mask, else 0; *ws is then
 * the kernel's description of it (ldq, ldk, ldv still to set) */
int aft_op_band_rows_ok(const aft_bias *bias, const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc,
                        aft_wspec *ws);

#endif /* AFT_INTERNAL_H */
