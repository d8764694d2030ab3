/* entries.h - the kernels' entry points: every function the code compiled
 * for the baseline (the layer, state, slices, model, memory estimates, the
 * reference, the tests) calls in the code compiled once per level. One line
 * each, as an X-macro:
 *
 *   AFT_ENTRY(type, name, (parameters), (arguments))
 *   AFT_ENTRY_VOID(name, (parameters), (arguments))
 *
 * dispatch.c makes each a function of that name that calls the chosen
 * level's, and table.c fills each level's table with them. A new kernel
 * called from outside the kernels goes here: without it the call links to
 * no definition (the levels' copies are renamed, see the Makefile). The
 * declarations (op.h, kernels.h, sums.h, spec.h, nn/, aft.h) stay the
 * prototypes: dispatch.c checks each line against them. */

/* the operator (aft.h, op.h) */
AFT_ENTRY(aft_status, aft_op_forward,
          (float *out, const float *q, const float *k, const float *v, const aft_bias *bias, const aft_config *cfg,
           size_t B, size_t T, size_t C, size_t kc, aft_error *err),
          (out, q, k, v, bias, cfg, B, T, C, kc, err))
AFT_ENTRY(aft_status, aft_op_backward,
          (float *dq, float *dk, float *dv, const aft_bias_grad *dbias, float *out, const float *dout,
           const float *q, const float *k, const float *v, const aft_bias *bias, const aft_config *cfg, size_t B,
           size_t T, size_t C, size_t kc, aft_error *err),
          (dq, dk, dv, dbias, out, dout, q, k, v, bias, cfg, B, T, C, kc, err))
AFT_ENTRY(aft_status, aft_op_run,
          (float *out, const float *q, const float *k, const float *v, const aft_opspec *sp, size_t B, size_t kc,
           aft_error *err),
          (out, q, k, v, sp, B, kc, err))
AFT_ENTRY(aft_status, aft_op_forward_counted,
          (float *out, const float *q, const float *k, const float *v, const aft_bias *bias, const aft_config *cfg,
           size_t B, size_t T, size_t C, size_t kc, aft_error *err),
          (out, q, k, v, bias, cfg, B, T, C, kc, err))
AFT_ENTRY(aft_rows_kind, aft_op_rows_kind, (const aft_opspec *sp, size_t kc), (sp, kc))
AFT_ENTRY(size_t, aft_batch_groups, (int threads, size_t B, size_t T), (threads, B, T))
AFT_ENTRY(aft_op_rows_ctx *, aft_op_rows_new, (const aft_opspec *sp, size_t rows), (sp, rows))
AFT_ENTRY_VOID(aft_op_rows_free, (aft_op_rows_ctx *ctx), (ctx))
AFT_ENTRY(int, aft_op_rows,
          (aft_op_rows_ctx *ctx, float *out, const float *q, const float *k, const float *v, const aft_opspec *sp,
           size_t r0, size_t r1, const float *carry_in, float *carry_out, const float *right_in),
          (ctx, out, q, k, v, sp, r0, r1, carry_in, carry_out, right_in))
AFT_ENTRY(aft_status, aft_op_grad_run,
          (const aft_grad_io *io, const float *q, const float *k, const float *v, const aft_opspec *sp, size_t B,
           size_t kc, int reference, aft_error *err),
          (io, q, k, v, sp, B, kc, reference, err))
AFT_ENTRY(aft_status, aft_op_saved_floats,
          (const aft_bias *bias, const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc, size_t *n,
           aft_error *err),
          (bias, cfg, B, T, C, kc, n, err))
AFT_ENTRY(aft_status, aft_op_forward_saved,
          (float *out, float *saved, const float *q, const float *k, const float *v, const aft_bias *bias,
           const aft_config *cfg, size_t B, size_t T, size_t C, size_t kc, aft_error *err),
          (out, saved, q, k, v, bias, cfg, B, T, C, kc, err))
AFT_ENTRY(aft_status, aft_op_backward_saved,
          (float *dq, float *dk, float *dv, const aft_bias_grad *dbias, const float *dout, const float *q,
           const float *k, const float *v, const float *saved, const aft_bias *bias, const aft_config *cfg, size_t B,
           size_t T, size_t C, size_t kc, aft_error *err),
          (dq, dk, dv, dbias, dout, q, k, v, saved, bias, cfg, B, T, C, kc, err))
AFT_ENTRY(int, aft_op_grad_saves, (const aft_opspec *sp, size_t B, int reference), (sp, B, reference))
AFT_ENTRY(aft_status, aft_op_grad_reference_d,
          (double *dq, double *dk, double *dv, double *out, const aft_bias_grad *db, const double *dout,
           const double *q, const double *k, const double *v, const aft_opspec *sp, size_t B, size_t kc,
           aft_error *err),
          (dq, dk, dv, out, db, dout, q, k, v, sp, B, kc, err))

/* the layer a chunk of rows at a time (layer_chunks.h): its projections,
 * gates and running sums are the chunked and streaming paths' time */
AFT_ENTRY(int, aft_layer_chunked,
          (float *y, const float *x, const aft_layer_prep *lp, const aft_opspec *sp, size_t B, size_t T, size_t chunk,
           aft_layer_times *tm, aft_layer_carry *lc, aft_status *st, aft_error *err),
          (y, x, lp, sp, B, T, chunk, tm, lc, st, err))

/* a sequence in slices (aft.h; slice.c): the slice's projections, gates and
 * sums, as the chunked paths' */
AFT_ENTRY(aft_status, aft_layer_kv,
          (float *kv, const float *x, const aft_params *p, const aft_config *cfg, size_t B, size_t n, aft_error *err),
          (kv, x, p, cfg, B, n, err))
AFT_ENTRY(aft_status, aft_layer_key_sums,
          (float *sums, int *nonfinite, const float *x, const aft_params *p, const aft_config *cfg, size_t B, size_t n,
           size_t r0, size_t r1, aft_error *err),
          (sums, nonfinite, x, p, cfg, B, n, r0, r1, err))
AFT_ENTRY(aft_status, aft_kv_sums,
          (float *sums, int *nonfinite, const float *kv, size_t B, size_t n, size_t C, size_t r0, size_t r1,
           aft_error *err),
          (sums, nonfinite, kv, B, n, C, r0, r1, err))
AFT_ENTRY(aft_status, aft_layer_slice_halo,
          (const aft_params *p, const aft_config *cfg, size_t T, size_t *halo, aft_error *err), (p, cfg, T, halo, err))
AFT_ENTRY(aft_status, aft_layer_forward_slice,
          (float *y, const float *x, const float *kv, const float *left, const float *right, const aft_params *p,
           const aft_config *cfg, size_t B, size_t T, size_t t0, size_t t1, size_t a0, size_t a1, aft_error *err),
          (y, x, kv, left, right, p, cfg, B, T, t0, t1, a0, a1, err))
AFT_ENTRY_VOID(aft_key_sums_empty, (float *sums, size_t C), (sums, C))
AFT_ENTRY_VOID(aft_key_sums_merge, (float *a, const float *b, size_t C), (a, b, C))
AFT_ENTRY(int, aft_key_sums_ok, (const float *sums, size_t C), (sums, C))

/* the bias (aft.h, kernels.h): the float64 reference reads w through them */
AFT_ENTRY(float, aft_seeded_bias, (uint64_t seed, float scale, size_t t, size_t t2), (seed, scale, t, t2))
AFT_ENTRY_VOID(aft_w_row, (const aft_opspec *sp, size_t h, size_t t, size_t j0, size_t j1, float *out),
               (sp, h, t, j0, j1, out))
AFT_ENTRY(int, aft_bias_grad_wanted, (const aft_opspec *sp, const aft_bias_grad *db), (sp, db))
AFT_ENTRY_VOID(aft_bias_grad_zero, (const aft_opspec *sp, const aft_bias_grad *db), (sp, db))

/* a row's maximum and exponentials (kernels.h): test_numerics checks the
 * levels' vector code through them */
AFT_ENTRY(float, aft_full_visible_max, (const float *w, size_t nv, const uint8_t *mrow), (w, nv, mrow))
AFT_ENTRY_VOID(aft_full_exp_row, (float *wr, size_t nv, size_t tv, float r, const uint8_t *mrow),
               (wr, nv, tv, r, mrow))

/* the running sums of a chunk's keys (sums.h) */
AFT_ENTRY(int, aft_sums_of_rows,
          (const float *k, size_t ldk, const float *v, size_t ldv, size_t r0, size_t r1, size_t n, float *m,
           float *s0, float *s1, float *scratch),
          (k, ldk, v, ldv, r0, r1, n, m, s0, s1, scratch))
AFT_ENTRY_VOID(aft_sums_merge, (float *a, const float *b, size_t n), (a, b, n))
AFT_ENTRY_VOID(aft_sums_empty, (float *a, size_t n), (a, n))

/* the kernels' scratch, for memory.c's estimates (spec.h) */
AFT_ENTRY(size_t, aft_full_rows, (size_t T, size_t threads), (T, threads))
AFT_ENTRY(size_t, aft_grid_workspace,
          (aft_variant variant, int causal, size_t B, size_t H, size_t W, size_t S, size_t C, size_t threads),
          (variant, causal, B, H, W, S, C, threads))
AFT_ENTRY(size_t, aft_band_grad_slices, (size_t T, size_t s, size_t nt, size_t priv, size_t C),
          (T, s, nt, priv, C))

/* products (nn/linear.h) */
AFT_ENTRY_VOID(aft_blas_one_thread, (void), ())
AFT_ENTRY_VOID(aft_gemm,
               (int threads, int trans_b, size_t M, size_t N, size_t K, const float *A, size_t lda, const float *B,
                size_t ldb, const float *bias, float *C, size_t ldc),
               (threads, trans_b, M, N, K, A, lda, B, ldb, bias, C, ldc))
AFT_ENTRY_VOID(aft_gemm_tn,
               (int threads, size_t M, size_t N, size_t K, const float *A, size_t lda, const float *B, size_t ldb,
                float *C, size_t ldc),
               (threads, M, N, K, A, lda, B, ldb, C, ldc))
AFT_ENTRY(aft_status, aft_linear_init,
          (aft_linear *l, const float *w, const float *bias, size_t n, size_t k, aft_kernel kernel, int threads,
           aft_error *err),
          (l, w, bias, n, k, kernel, threads, err))
AFT_ENTRY(aft_status, aft_linear_init_dt,
          (aft_linear *l, const void *w, aft_dtype wdt, const float *bias, size_t n, size_t k, aft_kernel kernel,
           int threads, aft_error *err),
          (l, w, wdt, bias, n, k, kernel, threads, err))
AFT_ENTRY(aft_dtype, aft_linear_dtype, (const aft_linear *l), (l))
AFT_ENTRY(aft_status, aft_linear_init_t,
          (aft_linear *l, const float *wt, size_t ldwt, size_t n, size_t k, aft_kernel kernel, int threads,
           aft_error *err),
          (l, wt, ldwt, n, k, kernel, threads, err))
AFT_ENTRY_VOID(aft_linear_apply, (const aft_linear *l, size_t M, const float *x, size_t ldx, float *y, size_t ldy),
               (l, M, x, ldx, y, ldy))
AFT_ENTRY_VOID(aft_linear_apply_x,
               (const aft_linear *l, size_t M, const float *x, size_t ldx, float *y, size_t ldy, int x_cached),
               (l, M, x, ldx, y, ldy, x_cached))
AFT_ENTRY_VOID(aft_linear_free, (aft_linear *l), (l))
AFT_ENTRY(aft_status, aft_linear_view, (aft_linear *v, const aft_linear *parent, size_t f0, size_t n, aft_error *err),
          (v, parent, f0, n, err))
AFT_ENTRY_VOID(aft_linear_ref,
               (float *y, size_t ldy, const float *x, size_t ldx, const float *w, const float *b, size_t M, size_t K,
                size_t N),
               (y, ldy, x, ldx, w, b, M, K, N))
AFT_ENTRY(const char *, aft_linear_kernel, (void), ())

/* bf16 products (nn/bf16.h): an engine only at the avx512 level */
AFT_ENTRY(aft_bf16_engine, aft_bf16_engine_now, (void), ())
AFT_ENTRY(const char *, aft_bf16_engine_name, (aft_bf16_engine e), (e))
AFT_ENTRY_VOID(aft_gemm_bf16,
               (int threads, int trans_a, int trans_b, size_t M, size_t N, size_t K, const float *A, size_t lda,
                const float *B, size_t ldb, float beta, float *C, size_t ldc),
               (threads, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc))
AFT_ENTRY(aft_status, aft_linear_init_bf16,
          (aft_linear *l, const void *w, aft_dtype wdt, const float *bias, size_t n, size_t k, int threads,
           aft_error *err),
          (l, w, wdt, bias, n, k, threads, err))
AFT_ENTRY(double, aft_bf16_peak, (int threads), (threads))
AFT_ENTRY(double, aft_bf16_rate, (int threads), (threads))

/* the model's layers (nn/nn.h) */
AFT_ENTRY_VOID(aft_layernorm, (float *y, const float *x, const float *w, const float *b, size_t N, size_t D, float eps),
               (y, x, w, b, N, D, eps))
AFT_ENTRY_VOID(aft_layernorm_ref,
               (float *y, const float *x, const float *w, const float *b, size_t N, size_t D, float eps),
               (y, x, w, b, N, D, eps))
AFT_ENTRY_VOID(aft_layernorm_back,
               (float *dx, int add, float *sw, float *sb, const float *dz, const float *x, const float *w, size_t N,
                size_t D, float eps),
               (dx, add, sw, sb, dz, x, w, N, D, eps))
AFT_ENTRY_VOID(aft_layernorm_back_ref,
               (float *dx, int add, float *sw, float *sb, const float *dz, const float *x, const float *w, size_t N,
                size_t D, float eps),
               (dx, add, sw, sb, dz, x, w, N, D, eps))
AFT_ENTRY(double, aft_xent_rows,
          (float *lg, const int32_t *targets, size_t N, size_t V, int grad, float inv),
          (lg, targets, N, V, grad, inv))
AFT_ENTRY(double, aft_xent_rows_ref,
          (float *lg, const int32_t *targets, size_t N, size_t V, int grad, float inv),
          (lg, targets, N, V, grad, inv))
AFT_ENTRY_VOID(aft_vadd, (float *out, const float *x, const float *y, size_t n), (out, x, y, n))
AFT_ENTRY_VOID(aft_relu, (float *h, size_t n), (h, n))
AFT_ENTRY_VOID(aft_relu_back, (float *dh, const float *h, size_t n), (dh, h, n))
AFT_ENTRY_VOID(aft_col_sums, (float *s, const float *a, size_t rows, size_t n), (s, a, rows, n))
AFT_ENTRY(aft_status, aft_ffn_init,
          (aft_ffn *f, const aft_ffn_params *p, aft_kernel kernel, aft_precision precision, int threads,
           aft_error *err),
          (f, p, kernel, precision, threads, err))
AFT_ENTRY_VOID(aft_ffn_free, (aft_ffn *f), (f))
AFT_ENTRY_VOID(aft_ffn_apply, (const aft_ffn *f, float *y, const float *x, size_t N, float *h), (f, y, x, N, h))
AFT_ENTRY_VOID(aft_ffn_ref, (float *y, const float *x, const aft_ffn_params *p, size_t N), (y, x, p, N))
