/*
 * aft.h - the one public header of libaft, the Attention Free Transformer core.
 *
 * Conventions
 *  - Every function that can fail returns an aft_status and, when err is not
 *    NULL, fills err->msg with one line (no trailing newline) saying what is
 *    wrong. The library never prints and never exits.
 *  - Sizes are size_t; every size computed from file contents is checked for
 *    overflow.
 *  - Tensors handed out by the readers hold their data in native byte order
 *    (little-endian on every machine we build for) and C order.
 *  - Matrices are row-major. Shapes are written as comments: (rows, cols).
 */
#ifndef AFT_H
#define AFT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AFT_VERSION "0.1.0"

/* ---------------------------------------------------------------- errors */

typedef enum {
    AFT_OK = 0,
    AFT_ERR_IO,      /* a file could not be opened, read or written */
    AFT_ERR_FORMAT,  /* the bytes are not a valid file of the expected format */
    AFT_ERR_NOMEM,   /* an allocation failed or would exceed a limit */
    AFT_ERR_ARG,     /* the caller's arguments do not fit together (shapes, options) */
} aft_status;

typedef struct {
    char msg[512];
} aft_error;

/* printf-style helper used across the library; also handy for callers. */
aft_status aft_fail(aft_error *err, aft_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---------------------------------------------------------------- text */

/* UTF-8 as the readers demand it of names, keys and headers (Unicode's
 * Table 3-7: no overlong forms, surrogates, code points above U+10FFFF or
 * cut-off sequences). aft_utf8_prefix: how many of the n bytes at s are
 * well-formed characters before the first that is not (n when all are);
 * aft_utf8_valid: 1 when the string s is well-formed throughout. */
size_t aft_utf8_prefix(const void *s, size_t n);
int aft_utf8_valid(const char *s);

/* A growing string, for text built piece by piece: start it as {0}; once
 * anything is added p holds len bytes and a NUL (free it with free()). An
 * allocation that fails, or a size that would overflow, sets oom and drops
 * what is added after, so a caller checks oom once at the end. */
typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} aft_strbuf;
void aft_strbuf_add(aft_strbuf *b, const char *s, size_t n);
/* aft_strbuf_add(b, s, strlen(s)) */
void aft_strbuf_add_str(aft_strbuf *b, const char *s);

/* Whole numbers as aft's command line and the binding's options take them:
 * decimal digits only (no sign, no space), the whole string, in range;
 * aft_parse_grid: "H,W", two of them, each >= 1. 0, or -1 when s is not
 * one (s may be NULL). */
int aft_parse_u64(const char *s, uint64_t *out);
int aft_parse_size(const char *s, size_t *out);
int aft_parse_grid(const char *s, size_t *h, size_t *w);

/* ---------------------------------------------------------------- tensors */

typedef enum {
    AFT_F64, AFT_F32, AFT_F16, AFT_BF16,
    AFT_BOOL, AFT_U8, AFT_I8, AFT_I16, AFT_U16, AFT_I32, AFT_U32, AFT_I64, AFT_U64,
    AFT_DTYPE_COUNT
} aft_dtype;

/* safetensors spelling ("F32", "BOOL", ...) */
const char *aft_dtype_name(aft_dtype dt);
/* parse a safetensors dtype name; returns 0 on success, -1 if unknown */
int aft_dtype_from_name(const char *name, aft_dtype *out);
size_t aft_dtype_size(aft_dtype dt);
int aft_dtype_is_float(aft_dtype dt);

#define AFT_MAX_DIMS 32

typedef struct {
    aft_dtype dtype;
    size_t ndim;
    size_t shape[AFT_MAX_DIMS];
    size_t nelem;        /* product of shape (1 for a scalar) */
    size_t nbytes;       /* nelem * aft_dtype_size(dtype) */
    const void *data;    /* nbytes bytes, native byte order, C order */
    void *owned;         /* heap block behind data, or NULL if borrowed */
} aft_tensor;

/* frees t->owned (if any) and zeroes t */
void aft_tensor_free(aft_tensor *t);

/* Converts any numeric tensor to a newly allocated float32 array of
 * t->nelem values (bool and integers convert to their value). *out must be
 * freed with free(). */
aft_status aft_tensor_to_f32(const aft_tensor *t, float **out, aft_error *err);

/* IEEE half and bfloat16 conversions (round to nearest even on narrowing). */
float aft_f16_to_f32(uint16_t h);
uint16_t aft_f32_to_f16(float f);
float aft_bf16_to_f32(uint16_t h);
uint16_t aft_f32_to_bf16(float f);

/* ---------------------------------------------------------------- .npy */

typedef struct {
    int major, minor;        /* header version: 1.0, 2.0 or 3.0 */
    char byteorder;          /* '<', '>', '|' or '=' as written in descr; '='
                              * (native) also for a multi-byte type with '|'
                              * or no order, '|' for a one-byte type with none */
    int fortran_order;       /* 1 if the file stored Fortran order */
    char descr[16];          /* descr decoded from the header, e.g. "<f4" */
    size_t header_len;       /* bytes of the header dict, padding included */
    size_t data_offset;      /* where the array data starts */
} aft_npy_info;

/* Reads a .npy file ("-" reads standard input) into out, converted to native
 * byte order and C order. info may be NULL. Accepted dtypes: f2 f4 f8 b1 u1
 * i1 i2 u2 i4 u4 i8 u8, in every spelling numpy reads ("<f4", "f", "float32",
 * ...). The header is read as numpy reads it, as a Python literal: any
 * spelling of the dict that numpy loads is accepted (comments, escapes,
 * hexadecimal dimensions, Python 2's 'L' in 1.0 and 2.0 headers, ...), but
 * for \N{...} escapes, a negative dimension and bytes after the data, which
 * are refused. */
aft_status aft_npy_read(const char *path, aft_tensor *out, aft_npy_info *info,
                        aft_error *err);
/* Same as aft_npy_read, from a buffer of len bytes (copied; the buffer may
 * be freed after). */
aft_status aft_npy_read_mem(const void *buf, size_t len, aft_tensor *out,
                            aft_npy_info *info, aft_error *err);

/* What a .npy file's header says (dtype, shape, nelem, nbytes; data NULL),
 * after the checks aft_npy_read makes, the data's size included, without
 * reading the data: for writers that stream it. path must be a regular
 * file (AFT_ERR_ARG otherwise). */
aft_status aft_npy_peek(const char *path, aft_tensor *out, aft_npy_info *info, aft_error *err);

/* What aft_npy_peek says, without checking that the file holds all the
 * data the header promises: for readers of part of it (aft_npy_read_f32
 * checks the bytes it reads). */
aft_status aft_npy_peek_header(const char *path, aft_tensor *out, aft_npy_info *info, aft_error *err);
/* Elements [first, first + n) in C order of the .npy at path (a regular
 * file), converted to float32 into dst (n floats): only their bytes are
 * read, so that readers of a large file can each take a share of it. A
 * Fortran-order array of two or more dimensions is refused (AFT_ERR_ARG:
 * its rows are not contiguous), and a file that ends before the last of
 * them is AFT_ERR_FORMAT, "data truncated: ...". */
aft_status aft_npy_read_f32(const char *path, size_t first, size_t n, float *dst, aft_error *err);

/* Writes t as a version 1.0 .npy (2.0 if the header needs it), little-endian,
 * C order, data 64-byte aligned. path "-" writes standard output; any other
 * path is written atomically (temporary file beside it, renamed on success). */
aft_status aft_npy_write(const char *path, const aft_tensor *t, aft_error *err);
aft_status aft_npy_write_fp(FILE *fp, const aft_tensor *t, aft_error *err);
/* The header aft_npy_write writes for t's dtype and shape (the data is not
 * looked at), preamble and padding included, into buf (cap bytes; 4096
 * always suffice): for writers that stream the data themselves. */
aft_status aft_npy_header(const aft_tensor *t, char *buf, size_t cap, size_t *len, aft_error *err);
/* numpy's two-character type code without byte order ("f4", "b1", ...);
 * NULL for a dtype .npy cannot hold (BF16) */
const char *aft_npy_code(aft_dtype dt);

/* ---------------------------------------------------------------- telling formats apart */

typedef enum {
    AFT_FORMAT_UNKNOWN,
    AFT_FORMAT_NPY,           /* "\x93NUMPY" */
    AFT_FORMAT_NPZ,           /* a zip archive: "PK\3\4", or "PK\5\6" when empty */
    AFT_FORMAT_SAFETENSORS,   /* an 8-byte little-endian size, then a JSON object */
} aft_format;

/* "npy", "npz", "safetensors" or "unknown" */
const char *aft_format_name(aft_format f);
/* What the first len bytes of a file say it is (len may be less than the
 * file: 64 bytes suffice). A .safetensors is recognised by a header size of
 * at most 100,000,000 bytes followed by '{' (after JSON whitespace). */
aft_format aft_format_detect(const void *head, size_t len);
/* The format of the file at path: by its first bytes; when they say nothing,
 * by its name (.npy, .npz, .safetensors), so that the reader of that format
 * says what is wrong with it; otherwise AFT_ERR_FORMAT "not a .npy, .npz or
 * .safetensors file". "-", pipes and devices cannot be looked at without
 * consuming them: *out is then what the name says, or AFT_FORMAT_UNKNOWN
 * (with AFT_OK). AFT_ERR_IO when the file cannot be opened or read. */
aft_status aft_file_format(const char *path, aft_format *out, aft_error *err);

/* ---------------------------------------------------------------- .safetensors and .npz */

/* A file of named tensors: a .safetensors, or a .npz archive (numpy's
 * np.savez / np.savez_compressed: a zip of .npy files, each member a tensor
 * named by its key, the member's name without ".npy"). */
typedef struct aft_st_file aft_st_file;

/* Opens and validates a .safetensors file or a .npz archive, told apart by
 * their first bytes; the file is memory-mapped, not read. Tensors returned
 * below are valid until aft_st_close. A .safetensors's tensors, and those
 * of a .npz's stored members in little-endian C order, borrow the mapping;
 * deflated members are inflated, and other stored ones converted, into
 * memory the handle owns. max_bytes bounds that memory (the sum of those
 * members' sizes), checked before anything is inflated: SIZE_MAX for no
 * bound but the file's (a deflated member can declare no more than deflate
 * can produce from its bytes). A .npy is refused with a message saying so. */
aft_status aft_st_open_limit(const char *path, size_t max_bytes, aft_st_file **out,
                             aft_error *err);
/* aft_st_open_limit(path, SIZE_MAX, out, err) */
aft_status aft_st_open(const char *path, aft_st_file **out, aft_error *err);
/* Same over a caller's buffer (borrowed: must outlive the handle). */
aft_status aft_st_open_mem_limit(const void *buf, size_t len, size_t max_bytes,
                                 aft_st_file **out, aft_error *err);
aft_status aft_st_open_mem(const void *buf, size_t len, aft_st_file **out,
                           aft_error *err);
void aft_st_close(aft_st_file *f);
/* "safetensors" or "npz" */
const char *aft_st_format(const aft_st_file *f);

size_t aft_st_count(const aft_st_file *f);
/* i-th tensor in file order (ascending data offset); name may be NULL */
const aft_tensor *aft_st_get(const aft_st_file *f, size_t i, const char **name);
/* tensor by exact name, or NULL */
const aft_tensor *aft_st_find(const aft_st_file *f, const char *name);
/* its place in file order (aft_st_get's i), or SIZE_MAX when absent */
size_t aft_st_index(const aft_st_file *f, const char *name);
/* metadata pairs (a .npz has none) */
size_t aft_st_metadata_count(const aft_st_file *f);
void aft_st_metadata(const aft_st_file *f, size_t i, const char **key,
                     const char **value);
/* the metadata value of key, or NULL */
const char *aft_st_metadata_find(const aft_st_file *f, const char *key);

/* Writes n tensors (names[i], tensors[i]) and nmeta metadata pairs
 * (meta[2*i] = key, meta[2*i+1] = value) as .safetensors, atomically as
 * aft_npy_write does ("-" writes standard output). */
aft_status aft_st_write(const char *path, const char *const *names,
                        const aft_tensor *tensors, size_t n,
                        const char *const *meta, size_t nmeta, aft_error *err);

/* The header aft_st_write would write for these tensors (their dtype, shape
 * and nbytes; data is not read and may be NULL), padded to a multiple of 8,
 * after the same checks. For writers that stream the data themselves: write
 * the 8-byte little-endian *len, the header, then each tensor's bytes in
 * order. *hdr is malloc'd; free it. */
aft_status aft_st_header(const char *const *names, const aft_tensor *tensors, size_t n,
                         const char *const *meta, size_t nmeta, char **hdr, size_t *len,
                         aft_error *err);

/* ---------------------------------------------------------------- writing .npz */

/* Writes n tensors as a .npz that np.load reads: one stored (uncompressed)
 * member "KEY.npy" per tensor, in the order given, zip64 records where a
 * size or offset needs them. Keys must be unique, non-empty, valid UTF-8,
 * and hold neither '/', '\\' nor ".." (members are keys, never paths).
 * Atomic, as aft_npy_write ("-" writes standard output). */
aft_status aft_npz_write(const char *path, const char *const *keys, const aft_tensor *tensors,
                         size_t n, aft_error *err);

/* A .npz written member by member, for writers that stream the data: begin
 * each member with its key, its size in bytes (the whole .npy image) and
 * the CRC-32 of those bytes, then hand over exactly that many bytes (in any
 * number of pieces); finish writes the central directory. The writer checks
 * the sizes and the CRC, so a member whose data changed on the way is an
 * error, not a corrupt archive. fp stays the caller's. */
typedef struct aft_npz_writer aft_npz_writer;
aft_status aft_npz_writer_new(FILE *fp, aft_npz_writer **out, aft_error *err);
aft_status aft_npz_writer_begin(aft_npz_writer *w, const char *key, uint64_t size, uint32_t crc,
                                aft_error *err);
aft_status aft_npz_writer_write(aft_npz_writer *w, const void *p, size_t n, aft_error *err);
aft_status aft_npz_writer_finish(aft_npz_writer *w, aft_error *err);
void aft_npz_writer_free(aft_npz_writer *w);
/* the checks aft_npz_writer_begin makes of a key: AFT_OK or AFT_ERR_ARG */
aft_status aft_npz_check_key(const char *key, aft_error *err);
/* zlib's CRC-32 (crc = 0 to start) */
uint32_t aft_crc32(uint32_t crc, const void *p, size_t n);

/* ---------------------------------------------------------------- atomic output */

/* An output file written to a temporary beside the target and renamed into
 * place by aft_out_commit; aft_out_abort removes the temporary. "-" is
 * standard output (commit flushes it and checks for errors). */
typedef struct {
    FILE *fp;
    char *path;
    char *tmp;     /* NULL for standard output */
    int direct;    /* 1: path is a device or pipe, written in place */
} aft_out;

aft_status aft_out_open(aft_out *o, const char *path, aft_error *err);
aft_status aft_out_commit(aft_out *o, aft_error *err);
void aft_out_abort(aft_out *o);
/* removes every temporary still open (for signal handlers; async-signal-safe) */
void aft_out_abort_all_signal_safe(void);

/* ---------------------------------------------------------------- progress
 *
 * A counter the caller owns, which a long call advances as its work
 * finishes, for the caller to show how far it has gone (the library never
 * prints). Point aft_config.progress (or aft_model_forward_progress's
 * argument) at one and read it from another thread while the call runs,
 * with atomic loads (__atomic_load_n(&p->done, __ATOMIC_RELAXED)). A call
 * adds its units of work to total when it starts and each unit to done as
 * it finishes, so at its end done has grown by exactly what total grew
 * by; a counter zeroed before the call reads the call's fraction done.
 * Units are rows of the operator: B * T for aft_op_forward,
 * aft_op_backward, aft_layer_forward and aft_layer_backward, and B * T a
 * layer for aft_model_forward_progress. They are added a block of rows or
 * a sequence at a time, never per element, so a counter costs nothing
 * measurable. A layer whose chunked path meets a key of +inf or NaN runs
 * the sequence again another way: total then grows by the rows it redoes.
 * One call at a time per counter. The streaming states (aft_state,
 * aft_model_state) and aft_layer_forward_slice do not advance it. */
typedef struct {
    size_t total;   /* units of work the calls have taken on */
    size_t done;    /* units of them finished */
} aft_progress;

/* ---------------------------------------------------------------- the AFT operator */

typedef enum { AFT_FULL, AFT_LOCAL, AFT_SIMPLE, AFT_CONV } aft_variant;
typedef enum { AFT_IMPL_FAST, AFT_IMPL_REFERENCE } aft_impl;
/* Who runs a family of matrix products: aft's own kernel where it is the
 * faster one in this build (AUTO), aft's own kernel wherever it exists
 * (OWN), or OpenBLAS (BLAS). For A/B comparisons and tests; the results
 * agree to rounding. */
typedef enum { AFT_KERNEL_AUTO, AFT_KERNEL_OWN, AFT_KERNEL_BLAS } aft_kernel;
/* The number type of the large products: the layer's projections, full's
 * T x T products (forward and backward), the backward's products, the
 * model's FFN and generator. F32 (the default): float32 throughout, exact
 * as ever. BF16: their operands rounded to bf16 (nearest, ties to even),
 * the products summed in float32, on the bf16 engine this CPU has
 * (aft_bf16_engine_in_use); the operator's exponentials, stabilisers, sums
 * and divisions stay float32. Without an engine BF16 computes float32, the
 * same bits as F32 (the caller may say so: the library only reports it).
 * The error against the float64 reference: docs/design.md. */
typedef enum { AFT_PRECISION_F32 = 0, AFT_PRECISION_BF16 } aft_precision;
/* "f32" or "bf16" */
const char *aft_precision_name(aft_precision p);
/* "f32" or "bf16" (exactly) into *out: 0, else -1 */
int aft_precision_from_name(const char *name, aft_precision *out);
/* the bf16 engine AFT_PRECISION_BF16's products run on at the kernel level
 * in use: "amx", "avx512_bf16", or "none" (they then run in float32) */
const char *aft_bf16_engine_in_use(void);
/* The machine's bf16 floor: the measured rate of bf16 products (2048^3,
 * the rows split over `threads` threads, best of three) in GFLOP/s, as
 * aft bench's sgemm ceiling is float32's; 0 without a bf16 engine. Takes
 * about a second. */
double aft_bf16_floor(int threads);

const char *aft_variant_name(aft_variant v);
int aft_variant_from_name(const char *name, aft_variant *out);

/* conv: take the window from the conv bias (aft_bias.conv_len) */
#define AFT_WINDOW_FROM_BIAS SIZE_MAX

typedef struct {
    aft_variant variant;
    size_t window;     /* local, conv: keep w[t,t'] where |t - t'| < window;
                        * 0: w = 0 everywhere; conv: AFT_WINDOW_FROM_BIAS */
    size_t heads;      /* conv: heads (channels split evenly); 0: the conv
                        * bias's rows */
    int causal;        /* sums run over t' <= t only */
    int threads;       /* 0 = the cores the process may run on */
    aft_impl impl;
    aft_kernel projections;    /* the layer's projections (AUTO: aft's kernel
                                * with AVX/AVX2/AVX-512, else OpenBLAS) */
    aft_kernel full_product;   /* full's products (AUTO: aft's fused kernel
                                * where it is faster, else OpenBLAS) */
    size_t grid_h, grid_w;     /* a grid of grid_h x grid_w tokens in raster
                                * (row-major) order, T = grid_h * grid_w;
                                * 0, 0: a 1-D sequence. On a grid local's and
                                * conv's window is 2-D: w[t, t'] is kept where
                                * |r - r'| < window and |c - c'| < window (t at
                                * row r, column c), 0 outside; causal is
                                * raster order (t' <= t). full and simple use
                                * only the grid's size. */
    aft_progress *progress;    /* advanced as the call's rows finish (see
                                * "progress" above); NULL: none */
    aft_precision precision;   /* the large products' number type (above);
                                * 0: float32 */
} aft_config;

/* Where the position bias w[t,t'] comes from. */
typedef enum {
    AFT_BIAS_NONE,       /* w = 0 (simple; or a zero bias) */
    AFT_BIAS_DENSE,      /* w[t,t'] = dense[t * ld + t'], ld = Tmax >= T */
    AFT_BIAS_FACTORED,   /* w[t,t'] = sum_r u[t*rank + r] * v[t'*rank + r] */
    AFT_BIAS_SEEDED,     /* w[t,t'] generated from (seed, t, t'): see aft_seeded_bias */
    AFT_BIAS_CONV,       /* w[t,t'] = conv[head][t' - t + window - 1] inside the window;
                          * on a grid (conv_2d) conv[head][r' - r + window - 1][c' - c + window - 1] */
} aft_bias_kind;

typedef struct {
    aft_bias_kind kind;
    const float *dense;   /* (tmax, tmax) */
    size_t tmax;          /* dense/factored: the largest T the bias covers */
    const float *u, *v;   /* factored: (tmax, rank) each */
    size_t rank;
    uint64_t seed;        /* seeded */
    float scale;          /* seeded: entries uniform in [-scale, scale) */
    const float *conv;    /* conv: (conv_rows, conv_len), offset t' - t at
                           * column t' - t + (conv_len - 1) / 2 */
    size_t conv_len;      /* 2S - 1 for a window S; 0: (heads, 2*window - 1)
                           * as the configuration says */
    size_t conv_rows;     /* one per head, or 1: shared by every head */
    const char *name;     /* the bias's name in messages, or NULL */
    /* optional explicit mask, 1 = visible: (T, T), or (B, T, T) when
     * mask_batched; combined with causal */
    const uint8_t *mask;
    int mask_batched;
    /* conv on a grid: each of the conv_rows rows is a (conv_len, conv_len)
     * square, offset (r' - r, c' - c) at [r' - r + (conv_len - 1) / 2]
     * [c' - c + (conv_len - 1) / 2]; conv_len 0: (heads, 2*window-1,
     * 2*window-1) as the configuration says. Only with a grid, and a grid's
     * conv bias must be one. */
    int conv_2d;
} aft_bias;

/* The rules every entry point applies to a configuration before it runs;
 * callers use this for the settled values (to report them, or to size what
 * they allocate). cfg is changed in place:
 *  - threads 0 becomes the number of cores;
 *  - conv with a bias that records its shape (conv_len) takes the bias's
 *    window when cfg->window is AFT_WINDOW_FROM_BIAS, and its rows as heads
 *    when cfg->heads is 0 (a bias of one row: as many heads as key channels
 *    when the keys have fewer channels than the values); any other window or number of heads must agree
 *    with the bias (a bias of one row serves every head);
 *  - conv with window 0 and no such bias is simple (w = 0 everywhere), which
 *    needs keys of one channel per value channel;
 *  - simple reads no position bias;
 *  - a grid needs both grid_h and grid_w (or neither); a 2-D conv bias
 *    (conv_2d) needs a grid, and conv on a grid needs a 2-D one; T must be
 *    grid_h * grid_w (checked where T is known: aft_op_forward and the
 *    layer).
 * C: value channels; kc: key channels (C, or conv's heads). A window wider
 * than the sequence sees all of it (aft_window_in); on a grid, one at least
 * as wide as max(grid_h, grid_w) sees the whole grid. */
aft_status aft_config_settle(aft_config *cfg, const aft_bias *bias, size_t C, size_t kc, aft_error *err);
/* the window a sequence of T rows sees: min(window, T) */
size_t aft_window_in(size_t window, size_t T);
/* the window cfg's run of T rows sees: aft_window_in(window, T) on a
 * sequence; on a grid (grid_h, grid_w) aft_window_in(window, max(grid_h,
 * grid_w)), as a wider window sees no more of the grid */
size_t aft_config_window(const aft_config *cfg, size_t T);
/* The positions a position bias covers for a variant: a learned bias
 * (dense (Tmax, Tmax), or factored u, v (Tmax, r)) read by full or local
 * covers rows [0, Tmax), so neither a sequence's T nor a stream's position
 * may pass Tmax; SIZE_MAX for every other bias and variant (seeded, conv,
 * none; simple reads no bias). */
size_t aft_bias_reach(const aft_bias *bias, aft_variant variant);
/* conv's bias shape: a window S holds the offsets -(S - 1) .. S - 1, rows of
 * 2S - 1 (on a grid, (2S - 1) x (2S - 1) squares); and the window a row of
 * n (odd) entries holds, (n + 1) / 2 */
size_t aft_conv_len(size_t window);
size_t aft_conv_window(size_t len);

/* The seeded bias entry for (t, t2): a pure function, so bands can be made
 * without a T x T array. */
float aft_seeded_bias(uint64_t seed, float scale, size_t t, size_t t2);

/* The bare operator.
 * out: (B, T, C)   q, v: (B, T, C)   k: (B, T, kc) with kc == C, or, for
 * conv, kc == heads (one key channel shared by each head's channels).
 * Y[b,t,c] = sigmoid(q) * sum_t' exp(k[t'] + w[t,t']) v[t'] / sum_t' exp(k[t'] + w[t,t'])
 * with w given by cfg and bias. A row with nothing visible gives 0. */
aft_status aft_op_forward(float *out, const float *q, const float *k, const float *v,
                          const aft_bias *bias, const aft_config *cfg,
                          size_t B, size_t T, size_t C, size_t kc, aft_error *err);

/* ---------------------------------------------------------------- the layer */

typedef struct {
    size_t d_model;   /* D */
    size_t d_hidden;  /* C */
    size_t k_out;     /* output channels of the key projection: C, or heads (conv) */
    const float *wq;  /* (C, D) */
    const float *bq;  /* (C) or NULL */
    const float *wk;  /* (k_out, D) */
    const float *bk;  /* (k_out) or NULL */
    const float *wv;  /* (C, D) */
    const float *bv;  /* (C) or NULL */
    const float *wo;  /* (D, C) */
    const float *bo;  /* (D) or NULL */
    aft_bias bias;
    /* AFT_F16 or AFT_BF16: wq, wk, wv and wo point at that dtype's 16-bit
     * values (2 bytes each, any alignment; cast to const float *), kept so
     * in the packed products, which widen them exactly; any other value (0
     * in a zeroed struct): float32. The biases are float32 either way. */
    aft_dtype w_dtype;
} aft_params;

/* y, x: (B, T, D), row-major, batch-major ("btd").
 * Q = x Wq^T + bq, K = x Wk^T + bk, V = x Wv^T + bv, y = AFT(Q,K,V) Wo^T + bo. */
aft_status aft_layer_forward(float *y, const float *x, const aft_params *p,
                             const aft_config *cfg, size_t B, size_t T,
                             aft_error *err);

/* labml's seq-first layout and back: dst (B, T, X) from src (T, B, X)
 * (to_tbd 0), or dst (T, B, X) from src (B, T, X) (to_tbd 1); dst may not
 * alias src */
void aft_swap_tb(float *dst, const float *src, size_t B, size_t T, size_t X, int to_tbd);

/* Where one call spent its time, in milliseconds. */
typedef struct {
    double projections;   /* Q, K and V from x */
    double op;            /* the AFT operator */
    double output;        /* the output projection */
} aft_layer_times;

/* aft_layer_forward, also filling *times (when not NULL) */
aft_status aft_layer_forward_timed(float *y, const float *x, const aft_params *p,
                                   const aft_config *cfg, size_t B, size_t T,
                                   aft_layer_times *times, aft_error *err);

/* ---------------------------------------------------------------- gradients
 *
 * The backward pass: from dL/dY, the gradient of every input of the bare
 * operator or of the layer, exact to float rounding for every variant, bias
 * kind and mask (cfg.impl AFT_IMPL_REFERENCE: the same in float64, O(T^2 C)).
 * Each call runs the forward pass itself and keeps, per entry, the log of
 * the denominator and the normalised sum (as FlashAttention keeps its
 * log-sum-exp) instead of any T x T weights; the variant's sums then run
 * backwards in time. Time as the forward's: O(T S C) for local and conv,
 * O(T C) for simple, O(T^2 C) for full and masked runs; memory O(T C)
 * beyond the arguments. Every gradient asked for is written whole (not
 * added to); a NULL pointer means that gradient is not wanted. */

/* The position bias's gradient in the bias's own shapes. Only the field of
 * the bias's kind is written: dense (tmax, tmax); u and v (tmax, rank)
 * each; conv (conv_rows, conv_len), or (heads, 2*window-1) when the bias
 * does not record its shape. Entries the run did not use (rows or columns
 * from T on, outside a local or conv window, masked out, or every entry
 * when the variant reads no bias) are 0. Seeded and absent biases have no
 * gradient. */
typedef struct {
    float *dense;
    float *u, *v;
    float *conv;
    /* nonzero: dense is already 0 wherever this run does not write (a
     * zeroed buffer, or one a run of the same T, variant and window wrote
     * before), so only the entries the run uses are cleared: a band of a
     * [tmax, tmax] gradient rather than all of it, and a fresh buffer's
     * other pages are never touched */
    int zero_outside;
} aft_bias_grad;

/* The bare operator's backward pass.
 * dq, dv: (B, T, C)   dk: (B, T, kc) (conv with one key channel per head:
 * the sum over the head's channels)   dbias: NULL, or the bias's gradient as
 * above   out: NULL, or (B, T, C) the forward output (aft_op_forward's
 * values to rounding: one call serves a training step)   dout: (B, T, C)
 * dL/dout; q, k, v, bias, cfg and the sizes as aft_op_forward. dq, dk and
 * dv are required. */
aft_status aft_op_backward(float *dq, float *dk, float *dv, const aft_bias_grad *dbias, float *out,
                           const float *dout, const float *q, const float *k, const float *v,
                           const aft_bias *bias, const aft_config *cfg,
                           size_t B, size_t T, size_t C, size_t kc, aft_error *err);

/* The layer's gradients, shaped as aft_params's fields (PyTorch Linear's
 * (out, in) weights); NULL: not wanted. A bias gradient (bq, ...) is the
 * gradient of a bias of zeros where the layer has none. */
typedef struct {
    float *dx;             /* (B, T, D) */
    float *wq, *bq;        /* (C, D), (C) */
    float *wk, *bk;        /* (k_out, D), (k_out) */
    float *wv, *bv;        /* (C, D), (C) */
    float *wo, *bo;        /* (D, C), (D) */
    aft_bias_grad bias;    /* the position bias, as for the operator */
} aft_layer_grads;

/* The layer's backward pass: dy, x: (B, T, D) batch-major; y: NULL, or
 * (B, T, D) the forward output (aft_layer_forward's values to rounding),
 * which may not alias x or dy. p and cfg as aft_layer_forward. */
aft_status aft_layer_backward(const aft_layer_grads *g, float *y, const float *dy, const float *x,
                              const aft_params *p, const aft_config *cfg, size_t B, size_t T,
                              aft_error *err);

/* ---------------------------------------------------------------- streaming state
 *
 * (1-D sequences only: a grid configuration is refused.)
 * A causal layer, or the causal bare operator, run a chunk of rows at a
 * time, as the RNN it is: row t needs only the stabilised running sums of
 * the keys before its window, per channel, and the rows of its window
 * (full: every earlier row, since w[t, t'] is learned for each pair). The
 * state holds those and the absolute position reached. Feeding a sequence
 * in chunks of any sizes gives the one-shot causal run's output to
 * rounding. Memory: O(B S C) for local and conv (S the window), O(B C) for
 * simple, O(B t C) for full at position t.
 *
 * A NaN key (only non-finite inputs or weights make one) makes its
 * channel's output NaN from its row on, in its sequence (the layer's: every
 * output of those rows); the state keeps that per (sequence, channel), and
 * a file written then holds it as the tensor nan_keys (B, C). A key of +inf
 * poisons the state: that chunk's and every later output is NaN. */
typedef struct aft_state aft_state;

/* A state at position 0 for the layer p (borrowed: it and what it points to
 * must outlive the state) under cfg (causal, no mask, impl fast), for B
 * sequences. */
aft_status aft_state_new(aft_state **out, const aft_params *p, const aft_config *cfg, size_t B, aft_error *err);
/* The same for the bare operator: C value channels, kc key channels (C,
 * or conv's heads); bias borrowed as above. */
aft_status aft_state_new_op(aft_state **out, const aft_bias *bias, const aft_config *cfg, size_t B, size_t C,
                            size_t kc, aft_error *err);
void aft_state_free(aft_state *s);

/* y, x: (B, n, D) batch-major, the rows from the state's position on;
 * advances the position by n. y may not alias x. */
aft_status aft_state_step(aft_state *s, float *y, const float *x, size_t n, aft_error *err);
/* the bare operator: out, q, v (B, n, C), k (B, n, kc) */
aft_status aft_state_step_op(aft_state *s, float *out, const float *q, const float *k, const float *v, size_t n,
                             aft_error *err);
size_t aft_state_position(const aft_state *s);

/* Writes the state as a .safetensors (atomically, as aft_st_write), and
 * reads one back into a state made for the same layer or operator,
 * configuration and batch (anything else is refused, naming what differs).
 * Tensors: sums_max, sums_den, sums_num, keys_max (B, C) each: the running
 * sums of the keys before the kept rows; keys, values (B, kept, C): the
 * kept rows, oldest first. Metadata: aft_state (the format, "1"), kind
 * ("layer" or "operator"), variant, window, heads, d_model, d_hidden,
 * key_channels, batch, position, poisoned, fingerprint (of the weights and
 * bias, as aft_state_fingerprint). With a NaN key gone in, also nan_keys
 * (B, C): 1 for each channel it reached, else 0. */
aft_status aft_state_save(const aft_state *s, const char *path, aft_error *err);
aft_status aft_state_load(aft_state *s, const aft_st_file *f, aft_error *err);
/* 16 hex digits naming the weights, bias and sizes the state runs */
const char *aft_state_fingerprint(const aft_state *s);

/* What a state keeps of the rows before its position: the window (local,
 * conv), 1 (simple) or SIZE_MAX (full: every row). */
size_t aft_state_keep(const aft_state *s);
/* Puts the state at position pos as if the rows before it had been run
 * through it, from what they leave (a process that runs rows [pos, ...) of
 * a sequence, the rows before run elsewhere): with kept = min(pos,
 * aft_state_keep(s)),
 *   sums: (B, 4C) the key sums (aft_layer_key_sums) of rows [0, pos - kept),
 *         or NULL when pos = kept;
 *   kv:   (B, kept, 2C) K | V (aft_layer_kv) of rows [pos - kept, pos).
 * Both are copied. poisoned: a key before pos was +inf or NaN (every output
 * from pos on is then NaN, as after such a key in a step). */
aft_status aft_state_seed(aft_state *s, size_t pos, const float *sums, const float *kv, int poisoned,
                          aft_error *err);

/* ---------------------------------------------------------------- a sequence in slices
 *
 * (1-D sequences only.) For callers that hold only a slice of each
 * sequence, rows [t0, t1) of T, and run the layer on it: one process of
 * several, each with its own rows. What a slice needs of the rest of the
 * sequence is K | V of the rows near it (its band's halo: the window
 * either side, none after it with causality; every row for full and
 * under a mask) and, for the rows farther away, their key sums.
 *
 * Key sums: per sequence 4C floats, four arrays of C: m, the stabiliser;
 * s0 = sum exp(k - m); s1 = sum exp(k - m) v; the largest key. Every factor
 * is exp of something <= 0, and the merge of two sums is associative up to
 * rounding, so the sums of a range of rows can be put together from its
 * pieces in any grouping (a scan or a reduction over processes).
 * K | V: per row 2C floats, the layer's keys (widened to one per value
 * channel when the key projection has one per head) then its values. */

/* sums of no rows (4C floats) */
void aft_key_sums_empty(float *sums, size_t C);
/* a = the sums of a's rows and then b's (4C floats each) */
void aft_key_sums_merge(float *a, const float *b, size_t C);
/* 0 when sums of C channels hold a stabiliser of +inf or NaN, or sums that
 * are negative or not finite: a key of +inf or NaN went into them */
int aft_key_sums_ok(const float *sums, size_t C);

/* kv: (B, n, 2C) K | V of the rows x: (B, n, D) (p, cfg as for the layer) */
aft_status aft_layer_kv(float *kv, const float *x, const aft_params *p, const aft_config *cfg, size_t B, size_t n,
                        aft_error *err);
/* sums: (B, 4C) the key sums of rows [r0, r1) of x: (B, n, D), K, V made a
 * chunk at a time (never held for all rows); *nonfinite (when not NULL) = 1
 * when one of those keys is +inf or NaN */
aft_status aft_layer_key_sums(float *sums, int *nonfinite, const float *x, const aft_params *p,
                              const aft_config *cfg, size_t B, size_t n, size_t r0, size_t r1, aft_error *err);
/* the same from K | V already made: rows [r0, r1) of kv: (B, n, 2C) */
aft_status aft_kv_sums(float *sums, int *nonfinite, const float *kv, size_t B, size_t n, size_t C, size_t r0,
                       size_t r1, aft_error *err);
/* The rows of K | V either side of a slice that aft_layer_forward_slice
 * needs for a sequence of T rows: the band's window (local, conv; 1 for
 * simple with causality), 0 for simple without causality (its sums
 * suffice), SIZE_MAX for full and under a mask (every row). */
aft_status aft_layer_slice_halo(const aft_params *p, const aft_config *cfg, size_t T, size_t *halo, aft_error *err);

/* The layer's output rows [t0, t1) of B sequences of T rows, as
 * aft_layer_forward gives them for the whole sequences, from the slice's
 * rows and what is held of the others:
 *   y: (B, t1 - t0, D)   x: (B, t1 - t0, D) rows [t0, t1)
 *   kv: (B, a1 - a0, 2C) K | V of rows [a0, a1), which hold [t0 - halo,
 *       t1 + halo) clamped to [0, T) (causal: [t0 - halo, t1)), halo as
 *       aft_layer_slice_halo says; simple without causality: any rows
 *   left: (B, 4C) key sums of rows [0, a0) (NULL when a0 = 0);
 *   right: (B, 4C) key sums of rows [a1, T) (NULL when a1 = T, and with
 *       causality); full and masked runs use neither.
 * A mask (p->bias.mask) holds the slice's rows only: (t1 - t0, T), or
 * (B, t1 - t0, T) when mask_batched. Without causality a sequence with a
 * key of +inf or NaN held or in its sums comes out NaN (every row sees
 * every key). */
aft_status aft_layer_forward_slice(float *y, const float *x, const float *kv, const float *left, const float *right,
                                   const aft_params *p, const aft_config *cfg, size_t B, size_t T, size_t t0,
                                   size_t t1, size_t a0, size_t a1, aft_error *err);

/* ---------------------------------------------------------------- weights from a file */

/* A layer's parameters found in a .safetensors file, converted to float32.
 * Names (after the prefix): query|to_q, key|to_k, value|to_v, output|project,
 * each ".weight" (out, in) with optional ".bias"; position bias "pos_bias" or
 * "wbias" ((Tmax, Tmax) for full and local; (H, 2S-1) or (2S-1) for conv, and
 * on a grid (H, 2S-1, 2S-1) or (2S-1, 2S-1): aft_weights_load_grid), or
 * "pos_bias_u" and "pos_bias_v" ((Tmax, r) each, w = u v^T). Two candidates
 * for one role is an error. The biases are optional as a layer's modules
 * leave them out: one for every projection, none, or the output's alone
 * (labml's AFTLocal with bias=False); any other set is refused, naming the
 * first one missing, and so is a layer without a bias that one of its peers
 * in the file has (the prefix with another number as its last numeric
 * component: "enc.layers.0.attn." for "enc.layers.1.attn."). Tensors under
 * the prefix with none of these names (nor labml's local_mask, a buffer the
 * window stands for) are not read: they are counted in n_unexpected, for
 * the caller to warn about or refuse. */
typedef struct {
    aft_params p;          /* ready for aft_layer_forward (bias.mask unset);
                            * p.bias.name points into names: use the struct
                            * where it was loaded */
    size_t conv_window;    /* conv: S read from the bias shape, else 0 */
    size_t conv_heads;     /* conv: rows of the bias (1 if it was 1-D, or a
                            * single square on a grid: shared by every head) */
    char names[10][160];   /* the tensor names used: q, k, v, o, bias, bias_v,
                            * then the q, k, v, o biases; "" where none */
    size_t n_unexpected;   /* tensors under the prefix that no layer has */
    char unexpected[160];  /* the first of them in file order, as messages
                            * show names (control characters as '?', cut
                            * short with "..."); "" when there is none */
    float *owned[12];
    size_t nowned;
} aft_weights;

/* The dtype a product's weights stored as `stored` are held in for the
 * products (packed), under this choice of kernel at the kernel level in
 * use: AFT_F16 and AFT_BF16 stay 16-bit with aft's kernel (f16 from the
 * avx2 level up; base packs it widened to float32); OpenBLAS, and every
 * other dtype, hold float32. What --timing's weights_dtype reports. */
aft_dtype aft_weights_held(aft_dtype stored, aft_kernel projections);

/* variant decides how the position bias is read. The four projections'
 * weights stored in one 16-bit dtype (F16, BF16) stay so (p.w_dtype;
 * aft_weights_held); any other mix is widened to float32. */
aft_status aft_weights_load(const aft_st_file *f, const char *prefix, aft_variant variant,
                            aft_weights *w, aft_error *err);
/* The same for a configuration on a grid (grid != 0): conv's bias is then
 * (heads, 2S-1, 2S-1), or (2S-1, 2S-1) shared by every head, and is read
 * with bias.conv_2d set; a 1-D conv bias is refused. local and full read
 * (Tmax, Tmax) or pos_bias_u/pos_bias_v as on a sequence (Tmax >= H * W,
 * raster order). grid 0 is aft_weights_load. */
aft_status aft_weights_load_grid(const aft_st_file *f, const char *prefix, aft_variant variant, int grid,
                                 aft_weights *w, aft_error *err);
void aft_weights_free(aft_weights *w);
/* Only the position bias (into w->p.bias, conv_window, conv_heads, and
 * n_unexpected, unexpected as above), for the bare operator; on failure w
 * keeps what it owned: free it with aft_weights_free. */
aft_status aft_bias_load(const aft_st_file *f, const char *prefix, aft_variant variant,
                         aft_weights *w, aft_error *err);
/* the same for a grid (grid != 0), as aft_weights_load_grid */
aft_status aft_bias_load_grid(const aft_st_file *f, const char *prefix, aft_variant variant, int grid,
                              aft_weights *w, aft_error *err);

/* The configuration a layer (or the bare operator's bias) from a file runs
 * under, before aft_config_settle: conv with a conv bias takes the window
 * the bias holds unless window_set, and its rows as heads unless heads_set
 * (cfg->window AFT_WINDOW_FROM_BIAS, cfg->heads 0), as aft run --weights */
void aft_weights_config(aft_config *cfg, const aft_weights *w, int window_set, int heads_set);
/* T rows against the reach of w's position bias for the variant
 * (aft_bias_reach): AFT_OK, or AFT_ERR_ARG "sequence length T = 20 exceeds
 * the position bias 'pos_bias' size Tmax = 12" */
aft_status aft_weights_check_length(const aft_weights *w, aft_variant variant, size_t T, aft_error *err);

/* The gradients aft grad writes for a layer, after the input's ("input";
 * the bare operator's "q", "k", "v"), in this order: each projection's
 * weight, then its bias, under the weight's name in the file (the bias's:
 * the weight's with ".bias" for ".weight"; none where the layer has no
 * bias), then the position bias's under its name and in its shape in the
 * file (factored: u, then v). Without a file (aft run's seeded layer) the
 * names are query.weight, query.bias, ..., output.bias, and conv's bias is
 * "pos_bias" (heads, 2S - 1), or (heads, 2S - 1, 2S - 1) on a grid; a
 * seeded full or local bias has no gradient. */
typedef enum {
    AFT_GRAD_WQ, AFT_GRAD_BQ, AFT_GRAD_WK, AFT_GRAD_BK, AFT_GRAD_WV, AFT_GRAD_BV, AFT_GRAD_WO, AFT_GRAD_BO,
    AFT_GRAD_DENSE, AFT_GRAD_U, AFT_GRAD_V, AFT_GRAD_CONV,
} aft_grad_role;
/* the most a layer has: 8 of the projections, 2 of a factored bias */
#define AFT_GRAD_SLOTS 10
typedef struct {
    aft_grad_role role;   /* the field of aft_layer_grads it fills */
    char name[176];
    size_t ndim;
    size_t shape[4];
} aft_grad_slot;
/* p's gradients into slots (room for AFT_GRAD_SLOTS): how many. The
 * projections' only when projections is nonzero (not for the bare
 * operator). w and f: what p was loaded from (aft_weights_load_grid, or
 * aft_bias_load_grid for the bare operator), or NULL and NULL for a seeded
 * layer. */
size_t aft_grad_slots(aft_grad_slot *slots, const aft_params *p, int projections, const aft_weights *w,
                      const aft_st_file *f);
/* the field of g that a slot of that role fills */
float **aft_layer_grads_field(aft_layer_grads *g, aft_grad_role role);

/* ---------------------------------------------------------------- memory */

/* Bytes aft_layer_forward (kc = 0) or aft_op_forward (kc = key channels)
 * allocates for these sizes beyond its inputs and outputs; SIZE_MAX when the
 * sizes overflow. Callers compare it with what the machine has before they
 * start. */
size_t aft_workspace_bytes(const aft_config *cfg, size_t B, size_t T, size_t D, size_t C, size_t kc);
/* The same for aft_layer_backward (kc = 0) or aft_op_backward: about what
 * it allocates beyond its arguments (bias: the position bias, or NULL). */
size_t aft_backward_workspace_bytes(const aft_config *cfg, const aft_bias *bias, size_t B, size_t T, size_t D,
                                    size_t C, size_t kc);
/* Memory this process may still use: MemAvailable, capped by the cgroup
 * limit when there is one; 0 if unknown. */
size_t aft_available_memory(void);
/* The bound for what reading a file may allocate (an archive's inflated
 * members): max_memory when nonzero, else the memory available, else no
 * bound (SIZE_MAX) */
size_t aft_memory_limit(size_t max_memory);
/* number of NaN and infinite values among n floats */
size_t aft_count_nonfinite(const float *x, size_t n);

/* ---------------------------------------------------------------- kernel levels
 *
 * The kernels (the products, the operators, their backward pass and step,
 * the exponentials, the norms) are compiled once per instruction-set
 * level, everything else once for the baseline, and one level runs them
 * all: on x86-64 "base" (SSE2), "avx2" (x86-64-v3) and "avx512"
 * (x86-64-v4). The first call that needs a kernel picks the highest level
 * that this CPU and its OS run, unless aft_level_use chose one before. A
 * build of one level (make ARCH=...) has the level "fixed" alone. */
typedef struct {
    const char *name;    /* "base", "avx2", "avx512" or "fixed" */
    const char *needs;   /* what it needs, e.g. "x86-64-v3 (AVX2, FMA, ...)" */
    int runs;            /* 1 if this CPU and its OS run it */
    char why[80];        /* runs 0: why not ("the CPU lacks AVX512BW") */
} aft_level;

/* the levels built in, lowest first, *n of them */
const aft_level *aft_levels(size_t *n);
/* the index of the level in use, chosen now if none is yet */
size_t aft_level_in_use(void);
/* Run the kernels at the level named from now on. AFT_ERR_ARG for a name
 * this build lacks, a level this CPU or OS does not run, or when kernels
 * have already run at another level (choose before the first). */
aft_status aft_level_use(const char *name, aft_error *err);

/* ---------------------------------------------------------------- BLAS and threads */

typedef struct {
    char library[64];   /* e.g. "OpenBLAS 0.3.21" */
    char core[64];      /* the kernel in use, e.g. "SkylakeX" */
    char projections[32];   /* what runs the layer's projections under
                             * this kernel choice: aft's own kernel ("aft
                             * 6x16" with AVX2, "aft 12x32" with AVX-512)
                             * or "OpenBLAS" */
} aft_blas_info;

/* libaft calls OpenBLAS from its own threads, one thread a call: the first
 * product it runs sets openblas_set_num_threads(1) (and, with OpenBLAS's
 * OpenMP build, puts OpenMP's default thread count back as it was). */
void aft_blas_get_info(aft_blas_info *info, aft_kernel projections);
/* the cores this process may run on (its affinity: taskset, a cpuset,
 * srun's binding), else the machine's online cores: what threads 0 means */
int aft_cores(void);

/* monotonic clock in milliseconds */
double aft_now_ms(void);
/* peak resident set size of this process in bytes (0 if unknown) */
size_t aft_peak_rss(void);

/* ---------------------------------------------------------------- the model
 *
 * labml's autoregressive transformer (labml_nn AutoregressiveTransformer, the
 * model of its AFT experiment) from a .safetensors export of its
 * state_dict(), under the state dict's own names:
 *
 *   x = src_embed.linear.weight[token] * sqrt(d_model)
 *       + src_embed.positional_encodings[position]       (V, D); (P, 1, D) or (P, D)
 *     (fixed sinusoidal or learned: the same name and shape; or
 *     x = src_embed.weight[token]: labml's embedding without positions)
 *   each layer N, prefix encoder.layers.N.:
 *     x = x + self_attn(norm_self_attn(x))      causal AFT layer (below)
 *     x = x + feed_forward(norm_ff(x))          layer2(relu(layer1(z)))
 *   logits = generator.projection(encoder.norm(x))           (V, D), (V)
 *
 * norm_* and encoder.norm are LayerNorms (weight (D), bias (D) or absent;
 * eps 1e-5, PyTorch's default, which labml keeps). feed_forward.layer1
 * (F, D) and layer2 (D, F) take optional biases. The number of layers,
 * D, F and the vocabulary size V come from the shapes. Every layer has the
 * same tensors in the same shapes: an optional one (a bias, local_mask) is
 * absent from every layer or from none, and a layer without a tensor that
 * another layer has is refused, naming it. Other tensors (a gated FFN's
 * linear_v, for example) are not read: the model counts them (info's
 * n_unused) for the caller to warn about or refuse. Metadata entries other
 * than those below are free text and never read.
 *
 * The variant of each layer's self_attn (prefix encoder.layers.N.self_attn.;
 * its query, key, value and output as aft_weights_load reads them) follows
 * from the tensors it has, the same for every layer:
 *  - pos_bias (or wbias) square (Tmax, Tmax), or pos_bias_u with pos_bias_v
 *    ((Tmax, r) each, w = u v^T): local when the layer has a local_mask or a
 *    window is known (the options' window, else the metadata "window"), else
 *    full;
 *  - pos_bias of odd length (2S-1), or (heads, 2S-1) and not square: conv,
 *    window S;
 *  - no position bias: simple.
 * labml's AFTLocal multiplies pos_bias by its local_mask, True where
 * |t - t'| < S: aft's local variant with window S. The window is the
 * options', else the metadata "window", else the band local_mask holds; a
 * local_mask that is not such a band below its diagonal (the part a causal
 * model reads), or disagrees with the window, is refused. Every layer is
 * causal: row t sees tokens 0..t.
 *
 * Positions. labml's pos_bias is learned for each pair of absolute
 * positions below Tmax (its seq_len), and the positional encodings have P
 * rows, so the model reads at most L = min(Tmax, P) tokens at once (conv
 * and simple: L = P; no positional encodings either: unbounded), as
 * PyTorch's model does. aft_model_forward refuses T > L. A model state
 * streams on past L: when it holds L tokens and another comes, it keeps the
 * most recent L/2 (rounded down), encodes them again from position 0 and
 * carries on; the context it reads then grows back to L. That costs one
 * more token encoded per token streamed, on average, and every logit is the
 * one the model gives for the context held at that point.
 *
 * A loaded model is only read: threads may share it, each with its own
 * states.
 */
typedef struct aft_model aft_model;

typedef struct {
    size_t window;     /* local: the window S (conv: must agree with the
                        * bias); 0: from the checkpoint (see above) */
    int threads;       /* 0: every core */
    aft_impl impl;     /* AFT_IMPL_REFERENCE: aft_model_forward in float64 (the
                        * model state always runs the fast kernels) */
    const char *vocab; /* a JSON array of V strings (token id = index) to use
                        * instead of the metadata "vocab"; NULL: the metadata's */
    aft_precision precision;   /* the layers', FFN's and generator's products
                                * (aft_config.precision); 0: float32 */
} aft_model_options;

typedef struct {
    size_t n_layers;
    size_t d_model;        /* D */
    size_t d_hidden;       /* C: the AFT layers' hidden size */
    size_t key_channels;   /* C, or conv's heads */
    size_t d_ff;           /* F */
    size_t n_vocab;        /* V */
    aft_variant variant;
    size_t window;         /* local and conv: S; otherwise 0 */
    size_t bias_rows;      /* local and full: Tmax; otherwise 0 */
    size_t positions;      /* P: rows of the positional encodings; 0: none */
    size_t context;        /* L: the most tokens the model reads at once
                            * (SIZE_MAX: unbounded) */
    size_t keep;           /* tokens a state keeps when it reaches L: L / 2 */
    int has_vocab;         /* the metadata "vocab" was read */
    const char *context_from;   /* the tensor that sets L, or NULL */
    size_t n_unused;       /* tensors of the file the model does not read */
    const char *unused;    /* the first of them in file order, as messages
                            * show names (control characters as '?', cut
                            * short with "..."); NULL when there is none */
    aft_dtype weights_dtype;   /* what the products' packed weights are held
                                * in: AFT_F16 or AFT_BF16 when a checkpoint
                                * stored so keeps them all 16-bit (f16 at the
                                * base kernel level, and products OpenBLAS
                                * runs, are widened), AFT_BF16 for bf16
                                * products (precision), else AFT_F32 */
} aft_model_info;

/* Reads the model from f (f may be closed after): float32, except that
 * the projections', the FFN's, the generator's and the embedding's weights
 * stored in f16 or bf16 stay 16-bit (info.weights_dtype; the LayerNorms,
 * biases and position biases are widened to float32). Widening is exact:
 * the outputs are those of a float32 checkpoint of the same values.
 * opt may be NULL (defaults: window from the checkpoint, every core, the
 * fast kernels). Metadata read: "vocab", a JSON array of V strings (token
 * id = index), optional (opt->vocab replaces it); "window", optional. Missing tensors, shapes that do
 * not fit together (or differ from layer 0's) and bad metadata are refused
 * with a message naming the tensor or entry. */
aft_status aft_model_load(aft_model **out, const aft_st_file *f, const aft_model_options *opt, aft_error *err);
aft_status aft_model_open(aft_model **out, const char *path, const aft_model_options *opt, aft_error *err);
void aft_model_free(aft_model *m);
const aft_model_info *aft_model_get_info(const aft_model *m);

/* token id's text (NUL-terminated), or NULL without a vocabulary or for an
 * id out of range */
const char *aft_model_token(const aft_model *m, size_t id);
/* text (len bytes) into token ids, the longest vocabulary entry at each
 * point; *ids is malloc'd (free it). A character no entry matches is an
 * error naming it and its byte offset. */
aft_status aft_model_tokenize(const aft_model *m, int32_t **ids, size_t *n, const char *text, size_t len,
                              aft_error *err);

/* logits: (B, T, V)   tokens: (B, T) batch-major (for labml's seq-first
 * (T, B), transpose first). Every sequence from position 0, T <= L. A token
 * outside [0, V) is an error naming it and its place. */
aft_status aft_model_forward(const aft_model *m, float *logits, const int32_t *tokens, size_t B, size_t T,
                             aft_error *err);
/* aft_model_forward, advancing *progress (NULL: none) by B * T rows as
 * each layer finishes */
aft_status aft_model_forward_progress(const aft_model *m, float *logits, const int32_t *tokens, size_t B, size_t T,
                                      aft_progress *progress, aft_error *err);

/* The model as an RNN: one aft_state per layer, B sequences fed a few
 * tokens at a time, O(S D) a token a layer for local (S the window). The
 * logits of a step equal the one-pass forward's over the same context, to
 * rounding. m must outlive it. After a failed step (other than a bad token,
 * which changes nothing) the state only frees. */
typedef struct aft_model_state aft_model_state;
aft_status aft_model_state_new(aft_model_state **out, const aft_model *m, size_t B, aft_error *err);
void aft_model_state_free(aft_model_state *s);
/* tokens: (B, n), the next n tokens of each sequence; logits: (B, n, V),
 * or (B, V) for each sequence's last token when last_only, or NULL. */
aft_status aft_model_step(aft_model_state *s, float *logits, const int32_t *tokens, size_t n, int last_only,
                          aft_error *err);
size_t aft_model_state_fed(const aft_model_state *s);      /* tokens fed per sequence */
size_t aft_model_state_context(const aft_model_state *s);  /* tokens in the context now (<= L) */

/* ---- sampling */

typedef struct {
    float temperature;   /* 0: greedy, the most likely token (the lowest id among equals) */
    size_t top_k;        /* draw among the k most likely only; 0: all */
    uint64_t seed;       /* aft_model_generate's generator starts here */
} aft_sampling;

/* aft's generator (splitmix64): the next 64 bits, and a double in [0, 1) */
uint64_t aft_rng_next(uint64_t *state);
double aft_rng_uniform(uint64_t *state);
/* The next token from logits (V): greedy, or drawn with probability
 * proportional to exp(logit / temperature) among the top_k; one draw of
 * *rng. NaN logits are an error. */
aft_status aft_sample(int32_t *token, const float *logits, size_t V, const aft_sampling *smp, uint64_t *rng,
                      aft_error *err);

/* called with each new token and the logits it was drawn from; nonzero
 * stops the generation (not an error) */
typedef int (*aft_token_fn)(void *ctx, int32_t token, const float *logits);
/* Feeds the prompt (n_prompt >= 1 tokens) in one step, then draws n_new
 * tokens one at a time, feeding each back. out (n_new, or NULL) gets the
 * tokens, *n_out (when not NULL) how many were made. */
aft_status aft_model_generate(const aft_model *m, int32_t *out, size_t *n_out, const int32_t *prompt,
                              size_t n_prompt, size_t n_new, const aft_sampling *smp, aft_token_fn fn,
                              void *fn_ctx, aft_error *err);

/* ---------------------------------------------------------------- training (model_grad.c)
 *
 * A model's parameters as training sees them: every entry of labml's
 * state dict, under its names and in its order (train_labml_aft.py's model,
 * so that load_state_dict(strict=True) takes them back): the embedding, the
 * positional encodings (a buffer), then each layer's self_attn (query, key,
 * value weight and bias, pos_bias, local_mask, output weight and bias),
 * feed_forward (layer1, layer2), norm_self_attn, norm_ff, then encoder.norm
 * and generator.projection. The positional encodings and local_mask are not
 * trained (aft_model_param_trainable 0; their gradient is always 0, and
 * local_mask holds 1 inside the band, 0 outside). Only labml's AFTLocal
 * model with every bias (and its positional encodings) is taken: other
 * models are refused with AFT_ERR_ARG at the first call that needs the
 * values.
 *
 * The model keeps a float32 master copy of every parameter (a 16-bit
 * checkpoint is widened at the first call of aft_model_param_data or
 * aft_model_loss_grad), and the forward pass, the state and generation read
 * those copies: after writing them, call aft_model_params_changed before the
 * next forward, step or generation. */
size_t aft_model_param_count(const aft_model *m);
/* name (valid while m lives), ndim (<= 4) and shape of parameter i */
aft_status aft_model_param_info(const aft_model *m, size_t i, const char **name, size_t *ndim, size_t shape[4],
                                aft_error *err);
/* 1 when parameter i is trained, 0 for a buffer (positional_encodings,
 * local_mask) */
int aft_model_param_trainable(const aft_model *m, size_t i);
/* parameter i's float32 values (C order, param_info's shape), to read and
 * write; NULL when i is out of range, or the model cannot be trained, or out
 * of memory (aft_model_loss_grad says which) */
float *aft_model_param_data(aft_model *m, size_t i);
/* repacks what the forward pass uses from the master copies */
aft_status aft_model_params_changed(aft_model *m, aft_error *err);

typedef struct {
    float dropout;   /* labml's dropout probability, in [0, 1); 0: none */
    uint64_t seed;   /* the dropout masks: a pure function of (seed, site, element) */
    int threads;     /* 0: the model's */
} aft_train_options;

/* The mean cross-entropy over the B x T positions of tokens[b*T + t]
 * predicting targets[b*T + t] (a target < 0 is ignored; none counted: loss
 * 0 and zero gradients), batch-major, every sequence from position 0, T <=
 * the model's context. When grads is not NULL, d(loss)/d(parameter i) is
 * written (whole) into grads[i], caller-allocated in param_info's shape
 * (grads[i] NULL: not wanted). o NULL: no dropout. Dropout as labml's
 * model applies it, scaled by 1 / (1 - p): after each layer's self_attn,
 * after its FFN's ReLU and after its FFN. Memory: the activations of one
 * step, (2 D + 3 C + F) B T floats a layer, and for a batch cut into
 * groups (whole sequences a thread takes at a time) their copies of the
 * gradients, at most as many floats again. The results are the same bits
 * for any thread count up to the groups (min(B, 8), fewer when rows are
 * few); with more threads the groups run one after another on all. */
aft_status aft_model_loss_grad(aft_model *m, const int32_t *tokens, const int32_t *targets, size_t B, size_t T,
                               const aft_train_options *o, float *loss, float *const *grads, aft_error *err);

/* ---------------------------------------------------------------- training (lib/train.c)
 *
 * What aft train needs around the model's gradients: a fresh model as
 * PyTorch initialises labml's, the learning-rate schedule, gradient
 * clipping, Adam, and the checkpoint. No I/O but aft_train_save's file.
 *
 * The gradients themselves (aft_model_param_*, aft_model_loss_grad) are
 * the model's (below, the seam with lib/model_grad.c). */

/* the configuration of a fresh labml model */
typedef struct {
    size_t n_layers;    /* 6 */
    size_t d_model;     /* D: 128 */
    size_t d_ff;        /* F: 256 */
    size_t window;      /* S: AFTLocal's local_window_size, 32 */
    size_t seq_len;     /* Tmax: pos_bias and local_mask are (Tmax, Tmax), 256 */
    size_t positions;   /* rows of the sinusoidal encodings; 0: labml's 5000 */
    size_t n_vocab;     /* V */
    const char *vocab;  /* JSON array of the V token strings (metadata "vocab") */
} aft_model_config;

/* The state dict of labml's AutoregressiveTransformer as PyTorch's default
 * initialisation makes it, from a generator seeded with seed (aft_rng_next;
 * not torch's generator: the distributions, not the values, are PyTorch's):
 * Linear weights and biases uniform in +-1/sqrt(fan_in) (kaiming_uniform
 * with a = sqrt(5)), Embedding N(0, 1), LayerNorms ones and zeros, pos_bias
 * zeros, local_mask the band |t - t'| < S, the sinusoidal positional
 * encodings as labml computes them. Every layer starts equal, as labml's
 * Encoder deep-copies one layer. State-dict names and order, F32 (local_mask
 * BOOL), metadata "format" pt, "vocab", "window": a .safetensors in memory
 * (*buf malloc'd, *len bytes) for aft_st_open_mem and aft_model_load. */
aft_status aft_train_fresh(void **buf, size_t *len, const aft_model_config *cfg, uint64_t seed, aft_error *err);

/* The vocabulary of a text as train_labml_aft.py builds it: its distinct
 * characters sorted by code point, as a JSON array (*json malloc'd) of *n
 * strings. Text that is empty or not UTF-8 (a binary file) is an error
 * naming the byte offset. */
aft_status aft_train_vocab(char **json, size_t *n, const char *text, size_t len, aft_error *err);

/* train_labml_aft.py's schedule: linear warm-up over warmup steps
 * (lr (step + 1) / warmup), then a cosine decay to a tenth at the last
 * step: lr (0.1 + 0.45 (1 + cos(pi f))), f = (step - warmup) / max(1,
 * steps - warmup). step counts from 0. */
typedef struct {
    double lr;              /* 2e-3 */
    size_t warmup;          /* 100 */
    size_t steps;           /* 1000 */
    double pos_bias_mult;   /* pos_bias's learning rate, a multiple of lr: 100 */
} aft_schedule;
double aft_schedule_lr(const aft_schedule *s, size_t step);

/* torch.nn.utils.clip_grad_norm_: the 2-norm of all n tensors together (g[i]
 * of len[i] floats); every gradient is multiplied by min(1, max_norm /
 * (norm + 1e-6)). Returns the norm before clipping (NaN or Inf as it is:
 * the caller stops then). */
double aft_clip_grad_norm(float *const *g, const size_t *len, size_t n, double max_norm);

/* Adam as torch.optim.Adam (no weight decay, no amsgrad): per tensor i of
 * len[i] floats, moments m and v (zero at the start), a step counter t:
 *   t += 1;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= lr[i] / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)  */
typedef struct aft_adam aft_adam;
aft_status aft_adam_new(aft_adam **out, const size_t *len, size_t n, double beta1, double beta2, double eps,
                        aft_error *err);
void aft_adam_free(aft_adam *a);
/* one step over every tensor: p[i] updated in place from g[i], at lr[i] */
void aft_adam_step(aft_adam *a, float *const *p, const float *const *g, const double *lr);
/* the state, for checkpoints: tensor i's moments (which 0: m, 1: v; len[i]
 * floats, writable, for restoring) and the steps taken */
float *aft_adam_moment(aft_adam *a, size_t i, int which);
uint64_t aft_adam_steps(const aft_adam *a);
void aft_adam_set_steps(aft_adam *a, uint64_t t);

/* Writes m's checkpoint to path atomically (as aft_st_write): labml's state
 * dict in its order (aft_model_param_*), the trained parameters' current
 * float32 values, the buffers (positional encodings, local_mask) as src
 * (the checkpoint the model came from; NULL: the model's float32 copies)
 * holds them; then the n_extra tensors extra (names extra_names), and the
 * metadata meta (nmeta key/value pairs). */
aft_status aft_train_save(const char *path, const aft_st_file *src, aft_model *m, const char *const *extra_names,
                          const aft_tensor *extra, size_t n_extra, const char *const *meta, size_t nmeta,
                          aft_error *err);

/* ---------------------------------------------------------------- the binding interface (lib/api/)
 *
 * A small interface for bindings (python/aft calls it through ctypes):
 * opaque handles, plain C types only (no aft struct crosses it), float32
 * arrays in C order, contiguous, allocated by the caller with the sizes
 * given, options as one string. Every call that can fail returns an
 * aft_status (AFT_OK = 0) and leaves aft's one-line message in *err (which
 * may be NULL); a NULL where an array or handle is needed is AFT_ERR_ARG
 * "missing (NULL) NAME", and sizes whose product overflows are refused.
 * Distinct handles may be used from distinct threads at once; one handle,
 * from one thread at a time. Runs at the level of aft_level_use / the CPU
 * probe, as everything else. libaft.so exports these with the rest of
 * this header (and nothing else); its soname is libaft.so.AFT_API_VERSION.
 *
 * Options: space-separated key=value pairs named as the CLI's options
 * without "--": variant=full|local|simple|conv window=S heads=H causal=0|1
 * layout=btd|tbd threads=N (0: the cores it may run on, the default) impl=fast|reference
 * prefix=P grid=H,W precision=f32|bf16 (aft_config.precision). The layer
 * takes them all; the operator all but layout and prefix; the model
 * window, threads and precision. As aft run: window applies to
 * local and conv only, heads to conv only, local needs a window, conv a
 * window or a conv bias to take it from (and its heads, unless given). An
 * unknown key (or one the call does not take), a repeated one, a pair
 * without '=' or a bad value is AFT_ERR_ARG naming it ("option
 * window=-1: window takes a whole number >= 0"). NULL or "" is the
 * defaults (variant full). */

#define AFT_API_VERSION 1
/* AFT_API_VERSION as this library was built: a binding checks it at import */
int aft_api_version(void);

/* ---- tensors from and to files: .npy (one tensor, named "arr_0"), .npz,
 * .safetensors; the readers' checks and refusals are the CLI's (the format
 * from the first bytes, else the name; "-" is standard input, a .npy; an
 * archive's inflated members bounded by the memory available), messages
 * "PATH: what is wrong" as aft info shows them. A tensor of more than 8
 * dimensions is refused (AFT_ERR_FORMAT). */
typedef struct aft_api_file aft_api_file;
aft_status aft_api_file_read(aft_api_file **out, const char *path, aft_error *err);
void aft_api_file_free(aft_api_file *f);
size_t aft_api_file_count(const aft_api_file *f);
/* tensor i: its name, dtype ("F32", "F16", "BF16", "F64", "I8".."I64",
 * "U8".."U64", "BOOL": aft_dtype_name's), ndim (<= 8), shape (8 slots,
 * 0 past ndim) and bytes; the pointers live as long as f; any of the
 * outputs may be NULL */
aft_status aft_api_file_tensor(const aft_api_file *f, size_t i, const char **name, const char **dtype, size_t *ndim,
                               size_t *shape, size_t *nbytes, aft_error *err);
/* its bytes, little-endian, C order, into dst (exactly nbytes) */
aft_status aft_api_file_copy(const aft_api_file *f, size_t i, void *dst, size_t nbytes, aft_error *err);
/* metadata pair i (.safetensors only), or NULL, NULL past the count */
size_t aft_api_file_metadata_count(const aft_api_file *f);
void aft_api_file_metadata(const aft_api_file *f, size_t i, const char **key, const char **value);
/* n tensors written atomically to path, the format from its extension
 * (.npy: n == 1, no metadata, names may be NULL; .npz: no metadata;
 * .safetensors), by aft_npy_write, aft_npz_write and aft_st_write, whose
 * checks apply (unique names; no bfloat16 in .npy); dtypes[i] as above;
 * data[i] little-endian C order; shapes[i] has ndims[i] <= 8 entries */
aft_status aft_api_file_write(const char *path, size_t n, const char *const *names, const char *const *dtypes,
                              const size_t *ndims, const size_t *const *shapes, const void *const *data,
                              size_t n_meta, const char *const *keys, const char *const *values, aft_error *err);

/* ---- the layer, from named float32 arrays (the names a weights file has:
 * query|to_q, key|to_k, value|to_v, output|project .weight/.bias, pos_bias
 * or wbias, pos_bias_u/_v, local_mask; under options' prefix=P), found and
 * checked as aft run --weights finds them (aft_weights_load_grid, the same
 * messages), its configuration settled as aft run settles it; other arrays
 * are not read (aft run warns of those under the prefix). The arrays are
 * borrowed, not copied: they must outlive the layer and its states (a
 * training loop makes a layer a step from its parameters' current memory:
 * cheap); the names, ndims and shapes need not outlive the call. */
typedef struct aft_api_layer aft_api_layer;
aft_status aft_api_layer_new(aft_api_layer **out, size_t n, const char *const *names, const float *const *data,
                             const size_t *ndims, const size_t *const *shapes, const char *options, aft_error *err);
void aft_api_layer_free(aft_api_layer *l);
/* D (the input's and output's features) and C (hidden channels) */
void aft_api_layer_dims(const aft_api_layer *l, size_t *d_model, size_t *d_hidden);
/* x, y: (B, T, D), or (T, B, D) with layout=tbd; as aft run computes it
 * (T past a learned bias's Tmax is refused; on a grid, T = H * W) */
aft_status aft_api_layer_forward(aft_api_layer *l, float *y, const float *x, size_t B, size_t T, aft_error *err);
/* the gradients aft grad writes for this layer, in its order, after dL/dX
 * (its "input", here the backward's dx): count, and each one's name (the
 * array's name, as aft grad names it: aft_grad_slots) and shape (<= 4) */
size_t aft_api_layer_grad_count(const aft_api_layer *l);
aft_status aft_api_layer_grad_info(const aft_api_layer *l, size_t i, const char **name, size_t *ndim, size_t *shape,
                                   aft_error *err);
/* dx: like x (NULL: not wanted); grads: NULL, or grad_count pointers,
 * grads[i] of grad_info's shape (NULL: not wanted); y: the forward's
 * output, aft_api_layer_forward's values to rounding (NULL: not wanted);
 * dy: like y. As aft grad. Each gradient wanted is written whole. */
aft_status aft_api_layer_backward(aft_api_layer *l, float *dx, float *const *grads, float *y, const float *dy,
                                  const float *x, size_t B, size_t T, aft_error *err);
/* A training step without work done twice: aft_api_layer_forward_saved
 * gives y and keeps in saved (a caller's float32 buffer of exactly
 * *n = aft_api_layer_saved_size floats for these B and T) what the
 * backward would compute again: Q, K, V, and with the dense kernel (full,
 * or local and conv on a grid) the operator's sums, a third of its
 * backward's products, or with causality (labml's local) each entry's
 * normaliser and average, the band sums its backward would make again.
 * aft_api_layer_backward_saved takes them: dx and grads as
 * aft_api_layer_backward's, and bit for bit its results for the
 * same layer (or one made alike: the same arrays, options and threads), x
 * and dy. y is the backward's y (aft_api_layer_forward's to rounding).
 * saved is refused unless a forward_saved of this B and T filled it; the
 * buffer may be used again for the next step. */
aft_status aft_api_layer_saved_size(const aft_api_layer *l, size_t B, size_t T, size_t *n, aft_error *err);
aft_status aft_api_layer_forward_saved(aft_api_layer *l, float *y, float *saved, size_t n_saved, const float *x,
                                       size_t B, size_t T, aft_error *err);
aft_status aft_api_layer_backward_saved(aft_api_layer *l, float *dx, float *const *grads, const float *dy,
                                        const float *x, const float *saved, size_t n_saved, size_t B, size_t T,
                                        aft_error *err);

/* ---- streaming: a causal layer fed a few rows at a time (aft run
 * --state-in/--state-out; the file is the CLI's state file). The state
 * borrows the layer (and its arrays): free it first. */
typedef struct aft_api_state aft_api_state;
aft_status aft_api_state_new(aft_api_state **out, aft_api_layer *l, size_t B, aft_error *err);
void aft_api_state_free(aft_api_state *s);
/* x, y: (B, n, D) batch-major whatever the layout */
aft_status aft_api_state_step(aft_api_state *s, float *y, const float *x, size_t n, aft_error *err);
size_t aft_api_state_position(const aft_api_state *s);
aft_status aft_api_state_save(const aft_api_state *s, const char *path, aft_error *err);
/* a state saved for the same layer, configuration and B (else refused,
 * naming what differs) */
aft_status aft_api_state_load(aft_api_state *s, const char *path, aft_error *err);

/* ---- the bare operator: q, v, out (B, T, C); k (B, T, kc), kc = C or conv's
 * heads; bias NULL (w = 0; simple takes none) or (bias_rows, bias_cols):
 * full and local (Tmax, Tmax), Tmax >= T; conv (heads or 1, 2S - 1), and
 * on a grid (heads or 1, (2S - 1)^2), each row a square in row-major
 * order; checked as aft run checks --weights' pos_bias; mask NULL or (T,
 * T), or (B, T, T) when mask_batched, nonzero = visible. Options: variant,
 * window, heads, causal, threads, impl, grid, precision. */
aft_status aft_api_op_forward(float *out, const float *q, const float *k, const float *v, size_t B, size_t T,
                              size_t C, size_t kc, const float *bias, size_t bias_rows, size_t bias_cols,
                              const uint8_t *mask, int mask_batched, const char *options, aft_error *err);
/* dq, dv like q; dk like k; dbias like bias (NULL: not wanted; must be NULL
 * without a bias); out (NULL: not wanted); dout like out. As aft grad. */
aft_status aft_api_op_backward(float *dq, float *dk, float *dv, float *dbias, float *out, const float *dout,
                               const float *q, const float *k, const float *v, size_t B, size_t T, size_t C,
                               size_t kc, const float *bias, size_t bias_rows, size_t bias_cols, const uint8_t *mask,
                               int mask_batched, const char *options, aft_error *err);

/* A training step without the product done twice: with the dense kernel
 * (full, masked runs, local and conv on a grid) and with causality the
 * backward computes the forward's sums again; aft_api_op_forward_saved
 * keeps them in saved (a caller's float32 buffer of exactly
 * *n = aft_api_op_saved_size floats for these arguments: a few floats
 * where another kernel runs, which keeps nothing) and
 * aft_api_op_backward_saved takes them: aft_api_op_backward's
 * results bit for bit for the same arguments. out is the backward's out
 * (aft_api_op_forward's to rounding). saved is refused unless a
 * forward_saved of this B and T filled it. */
aft_status aft_api_op_saved_size(size_t B, size_t T, size_t C, size_t kc, const float *bias, size_t bias_rows,
                                 size_t bias_cols, const uint8_t *mask, int mask_batched, const char *options,
                                 size_t *n, aft_error *err);
aft_status aft_api_op_forward_saved(float *out, float *saved, size_t n_saved, const float *q, const float *k,
                                    const float *v, size_t B, size_t T, size_t C, size_t kc, const float *bias,
                                    size_t bias_rows, size_t bias_cols, const uint8_t *mask, int mask_batched,
                                    const char *options, aft_error *err);
aft_status aft_api_op_backward_saved(float *dq, float *dk, float *dv, float *dbias, const float *dout, const float *q,
                                     const float *k, const float *v, const float *saved, size_t n_saved, size_t B,
                                     size_t T, size_t C, size_t kc, const float *bias, size_t bias_rows,
                                     size_t bias_cols, const uint8_t *mask, int mask_batched, const char *options,
                                     aft_error *err);

/* ---- labml's language model (aft model, aft generate). Options: window=S
 * (>= 1) threads=N (default 1 for stepping, as aft generate; the logits'
 * last bits follow the thread count, as aft model --threads's do)
 * precision=f32|bf16 */
typedef struct aft_api_model aft_api_model;
aft_status aft_api_model_open(aft_api_model **out, const char *path, const char *options, aft_error *err);
void aft_api_model_free(aft_api_model *m);
/* V, D, and L, the most tokens one pass reads (SIZE_MAX: unbounded) */
void aft_api_model_dims(const aft_api_model *m, size_t *n_vocab, size_t *d_model, size_t *context);
/* logits (B, T, V) of tokens (B, T), as aft model */
aft_status aft_api_model_logits(aft_api_model *m, float *logits, const int32_t *tokens, size_t B, size_t T,
                                aft_error *err);
/* text into ids (at most cap; *n: how many the text makes, even past cap),
 * as aft encode; token id's text (NULL: none) as aft decode. A model
 * without a vocabulary refuses to encode and generate. */
aft_status aft_api_model_encode(const aft_api_model *m, int32_t *ids, size_t cap, size_t *n, const char *text,
                                size_t len, aft_error *err);
const char *aft_api_model_token(const aft_api_model *m, size_t id);
/* n new tokens after prompt, as aft generate with the same arguments
 * (temperature 0 or greedy: greedy); their text, NUL-terminated, into out
 * (cap bytes, cut short to fit; *len: the bytes the whole text needs with
 * its NUL, even past cap, so the text is whole when *len <= cap) */
aft_status aft_api_model_generate(aft_api_model *m, char *out, size_t cap, size_t *len, const char *prompt,
                                  size_t n, double temperature, size_t top_k, uint64_t seed, aft_error *err);

#ifdef __cplusplus
}
#endif
#endif /* AFT_H */
