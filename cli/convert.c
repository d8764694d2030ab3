/* convert.c - `aft convert`: pack .npy files into a .safetensors or .npz,
 * extract a tensor from one, convert between the two, change the
 * floating-point dtype of tensors.
 *
 * Streaming: the output header is computed from the inputs' shapes and dtypes
 * alone (a .safetensors input is memory-mapped; of a .npy input only the
 * header is read, by aft_npy_peek), then each tensor's data is converted and written a chunk at a
 * time, one input tensor at a time. Peak memory is about one .npy input
 * tensor plus a 1 MiB buffer, never the whole output (a .npz input's
 * deflated members are held inflated; its stored ones are mapped). A .npz
 * output needs each member's CRC-32 before its data: the data is converted
 * twice, once for the CRC and once to write it, so pipes work too.
 *
 * Rounding: f32 -> f16/bf16 uses the library's round-to-nearest-even; f64 ->
 * f16/bf16 is rounded directly from the double's bits (going through float
 * would round twice and get ties wrong, e.g. 1 + 2^-11 + 2^-40 to f16). */
#include "cli.h"

#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const cmd = "convert";

/* messages about a file: "aft: FILE: msg" */
static void report_file(const char *path, const char *msg)
{
    cli_report_file(NULL, path, msg);
}

#define CHUNK_BYTES ((size_t)1 << 20)        /* converted data is written 1 MiB at a time */
#define ST_SIZE_LIMIT 9007199254740992.0     /* 2^53: offsets must be exact in JSON */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_LITTLE 1
#else
#define HOST_LITTLE 0
#endif

/* ---------------------------------------------------------------- rounding */

/* Rounds a double to a narrower IEEE binary format with ebits exponent bits
 * and mbits stored mantissa bits (f16: 5, 10; bf16: 8, 7), to nearest with
 * ties to even, straight from the double's bits so there is one rounding
 * only. Overflow gives infinity; NaN stays a quiet NaN keeping the top of its
 * payload (as the library's f32 conversions do). */
static uint16_t f64_to_narrow(double d, int ebits, int mbits)
{
    uint64_t x;
    memcpy(&x, &d, 8);
    const uint16_t sign = (uint16_t)((x >> 63) << (ebits + mbits));
    const uint64_t ax = x & 0x7fffffffffffffffull;
    const uint32_t inf = ((1u << ebits) - 1) << mbits;
    if (ax >= 0x7ff0000000000000ull) {                      /* inf or nan */
        if (ax == 0x7ff0000000000000ull) return sign | (uint16_t)inf;
        uint32_t payload = (uint32_t)((ax & 0xfffffffffffffull) >> (52 - mbits));
        return sign | (uint16_t)(inf | (1u << (mbits - 1)) | payload);
    }
    const int bias = (1 << (ebits - 1)) - 1;                 /* 15, 127 */
    const int e = (int)(ax >> 52);
    /* a double subnormal (< 2^-1022) is far below half the smallest f16 or
     * bf16 subnormal: it rounds to a signed zero */
    if (e == 0) return sign;
    const int E = e - 1023;                                  /* value = sig * 2^(E - 52) */
    if (E > bias) return sign | (uint16_t)inf;               /* >= 2^(bias+1): overflow */
    const uint64_t sig = (ax & 0xfffffffffffffull) | (1ull << 52);
    /* the result's unit in the last place is 2^q: normal numbers keep mbits
     * bits after the leading 1; below the normal range the ulp stays fixed */
    const int q = (E >= 1 - bias ? E : 1 - bias) - mbits;
    const int shift = q - (E - 52);                          /* bits dropped, > 0 */
    if (shift > 63) return sign;                             /* below a quarter ulp */
    uint64_t kept = sig >> shift;
    const uint64_t rest = sig & ((1ull << shift) - 1), half = 1ull << (shift - 1);
    if (rest > half || (rest == half && (kept & 1))) kept++;
    /* normal: exponent field E + bias; adding kept (which holds the leading
     * 1) to (E + bias - 1) << mbits sets it, and a carry out of the mantissa
     * moves to the next binade, or to infinity, by itself. Subnormal: kept is
     * the field (2^mbits when it rounds up to the smallest normal). */
    uint64_t bits = (E >= 1 - bias ? (uint64_t)(E + bias - 1) << mbits : 0) + kept;
    if (bits > inf) bits = inf;
    return sign | (uint16_t)bits;
}

/* the float dtype names --dtype takes (also the long numpy/torch names) */
static int parse_dtype(const char *s, aft_dtype *out)
{
    static const struct { const char *name; aft_dtype dt; } names[] = {
        {"f32", AFT_F32}, {"float32", AFT_F32}, {"f16", AFT_F16}, {"float16", AFT_F16},
        {"bf16", AFT_BF16}, {"bfloat16", AFT_BF16}, {"f64", AFT_F64}, {"float64", AFT_F64},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(s, names[i].name) == 0) {
            *out = names[i].dt;
            return 0;
        }
    return -1;
}

/* Converts n elements of float dtype from at src into float dtype to at dst
 * (from != to). f32, f16 and bf16 widen to float exactly, so one rounding
 * happens at the store; f64 sources round straight from the double. */
static void convert_block(void *dst, aft_dtype to, const void *src, aft_dtype from, size_t n)
{
    const unsigned char *s = src;
    unsigned char *o = dst;
    size_t in = aft_dtype_size(from), out = aft_dtype_size(to);
    for (size_t i = 0; i < n; i++, s += in, o += out) {
        double d = 0;
        float f = 0;
        uint16_t h;
        switch (from) {
        case AFT_F64: memcpy(&d, s, 8); break;
        case AFT_F32: memcpy(&f, s, 4); break;
        case AFT_F16: memcpy(&h, s, 2); f = aft_f16_to_f32(h); break;
        case AFT_BF16: memcpy(&h, s, 2); f = aft_bf16_to_f32(h); break;
        default: break;   /* callers pass float dtypes only */
        }
        int wide = from == AFT_F64;
        switch (to) {
        case AFT_F64:
            d = wide ? d : (double)f;
            memcpy(o, &d, 8);
            break;
        case AFT_F32:
            /* double -> float rounds to nearest even and overflows to
             * infinity (IEEE 754 conversion, which GCC follows: Annex F) */
            f = wide ? (float)d : f;
            memcpy(o, &f, 4);
            break;
        case AFT_F16:
            h = wide ? f64_to_narrow(d, 5, 10) : aft_f32_to_f16(f);
            memcpy(o, &h, 2);
            break;
        case AFT_BF16:
            h = wide ? f64_to_narrow(d, 8, 7) : aft_f32_to_bf16(f);
            memcpy(o, &h, 2);
            break;
        default: break;
        }
    }
}

/* ---------------------------------------------------------------- inputs */

typedef enum { SRC_NPY, SRC_STDIN, SRC_ST_WHOLE, SRC_ST_TENSOR } src_kind;

/* an INPUT operand taken apart (strings malloc'd) */
typedef struct {
    const char *arg;    /* as given */
    char *name;         /* NAME from NAME=INPUT, else NULL */
    char *file;         /* the file ("-": standard input) */
    char *tname;        /* SRC_ST_TENSOR: the tensor's name in the file */
    src_kind kind;
} spec;

/* one tensor to write */
typedef struct {
    char *name;               /* its name in a .safetensors output (malloc'd) */
    const char *file;         /* the file it comes from, for messages */
    const char *tname;        /* its name in a .safetensors input, else NULL */
    const aft_tensor *src;    /* the data: inside a .safetensors, or &held; NULL
                               * for a .npy to be read when its turn comes */
    aft_tensor held;          /* a .npy read whole (owns its data) */
    aft_dtype dtype;          /* source dtype and shape, known before the data */
    size_t ndim, shape[AFT_MAX_DIMS], nelem, nbytes_out;
    aft_dtype out;            /* the dtype written */
} item;

typedef struct {
    spec *specs;
    size_t nspecs;
    item *items;
    size_t nitems, icap;
    aft_st_file **files;
    size_t nfiles;
    const char **meta;        /* key, value pairs: input files' then --metadata */
    size_t nmeta, mcap;
} job;

static size_t max_memory;   /* --max-memory, 0 when not given */

/* The kind of a file operand, by its first bytes (else its name); -1 after
 * reporting a file that is none of the formats. */
static int file_kind(const char *path, src_kind *kind)
{
    aft_format fmt;
    if (cli_file_format(NULL, path, &fmt) != 0) return -1;
    *kind = fmt == AFT_FORMAT_NPY ? SRC_NPY : SRC_ST_WHOLE;
    return 0;
}

/* Takes an operand apart: "-", an existing file, FILE.safetensors:NAME or
 * FILE.npz:NAME whose file exists, NAME=INPUT, then the remaining forms by
 * name. A path or a tensor name may contain '=' or ".safetensors:": existing
 * files win. */
static int parse_spec(spec *s, const char *arg)
{
    memset(s, 0, sizeof *s);
    s->arg = arg;
    const char *src = arg, *colon;
    if (strcmp(arg, "-") != 0 && !cli_path_exists(arg) && !cli_tensor_split(arg, 1)) {
        const char *eq = strchr(arg, '=');
        if (eq) {
            if (eq == arg)
                return cli_usage_error(cmd, "'%s': no tensor name before '=' (want NAME=INPUT)", arg);
            if (!eq[1])
                return cli_usage_error(cmd, "'%s': no input after '=' (want NAME=INPUT)", arg);
            if (!(s->name = strndup(arg, (size_t)(eq - arg)))) goto oom;
            src = eq + 1;
        }
    }
    if (strcmp(src, "-") == 0) {
        s->kind = SRC_STDIN;
    } else if (cli_path_exists(src)) {
        if (file_kind(src, &s->kind) != 0) return EXIT_DATA;
    } else if ((colon = cli_tensor_split(src, 0)) != NULL) {
        s->kind = SRC_ST_TENSOR;
        if (!(s->tname = strdup(colon + 1))) goto oom;
        if (!(s->file = strndup(src, (size_t)(colon - src)))) goto oom;
        return 0;
    } else {
        s->kind = cli_ends_with(src, ".safetensors") || cli_ends_with(src, ".npz") ? SRC_ST_WHOLE : SRC_NPY;
    }
    if (!(s->file = strdup(src))) goto oom;
    return 0;
oom:
    cli_error(cmd, "out of memory");
    return EXIT_DATA;
}

static void free_spec(spec *s)
{
    free(s->name);
    free(s->file);
    free(s->tname);
}

static void job_free(job *j)
{
    for (size_t i = 0; i < j->nspecs; i++) free_spec(&j->specs[i]);
    free(j->specs);
    for (size_t i = 0; i < j->nitems; i++) {
        free(j->items[i].name);
        aft_tensor_free(&j->items[i].held);
    }
    free(j->items);
    for (size_t i = 0; i < j->nfiles; i++) aft_st_close(j->files[i]);
    free(j->files);
    free(j->meta);
}

/* a new zeroed item at the end of j->items, or NULL when out of memory */
static item *new_item(job *j)
{
    if (j->nitems == j->icap) {
        size_t cap = j->icap ? 2 * j->icap : 16;
        item *p = realloc(j->items, cap * sizeof *p);
        if (!p) return NULL;
        j->items = p;
        j->icap = cap;
    }
    item *it = &j->items[j->nitems++];
    memset(it, 0, sizeof *it);
    return it;
}

/* sets the item's source dtype and shape from a tensor */
static void take_shape(item *it, const aft_tensor *t)
{
    it->dtype = t->dtype;
    it->ndim = t->ndim;
    memcpy(it->shape, t->shape, t->ndim * sizeof t->shape[0]);
}

/* Adds or replaces the metadata pair key = value (strings borrowed). */
static int put_meta(job *j, const char *key, const char *value)
{
    for (size_t i = 0; i < j->nmeta; i++)
        if (strcmp(j->meta[2 * i], key) == 0) {
            j->meta[2 * i + 1] = value;
            return 0;
        }
    if (j->nmeta == j->mcap) {
        size_t cap = j->mcap ? 2 * j->mcap : 16;
        const char **p = realloc(j->meta, 2 * cap * sizeof *p);
        if (!p) return -1;
        j->meta = p;
        j->mcap = cap;
    }
    j->meta[2 * j->nmeta] = key;
    j->meta[2 * j->nmeta + 1] = value;
    j->nmeta++;
    return 0;
}

/* "x" for "dir/x.npy": the name a .npy gets in a .safetensors output */
static char *stem(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 4 && strcmp(base + n - 4, ".npy") == 0) n -= 4;
    return strndup(base, n);
}

/* "out of memory", and the exit status for it */
static int oom(void)
{
    cli_error(cmd, "out of memory");
    return EXIT_DATA;
}

/* load_spec for a .npy or standard input: its one tensor, whole now, or
 * its header alone for a .safetensors output from a regular file */
static int load_npy(job *j, const spec *s, int to_st, int *stdin_used)
{
    aft_error err = {{0}};
    const char *file = s->file;
    item *it = new_item(j);
    if (!it) return oom();
    it->file = file;
    struct stat sb;
    int regular = s->kind == SRC_NPY && stat(file, &sb) == 0 && S_ISREG(sb.st_mode);
    if (s->kind == SRC_STDIN) {
        if (*stdin_used) return cli_usage_error(cmd, "standard input ('-') can be read only once");
        *stdin_used = 1;
    }
    if (to_st && regular) {
        /* the header now, the data when its turn comes */
        aft_tensor head;
        if (aft_npy_peek(file, &head, NULL, &err) != AFT_OK) {
            report_file(file, err.msg);
            return EXIT_DATA;
        }
        take_shape(it, &head);
    } else {
        if (aft_npy_read(file, &it->held, NULL, &err) != AFT_OK) {
            report_file(file, err.msg);
            return EXIT_DATA;
        }
        it->src = &it->held;
        take_shape(it, &it->held);
    }
    if (to_st && !(it->name = s->name ? strdup(s->name) : stem(file))) return oom();
    return 0;
}

/* every tensor of f, and its metadata, into a .safetensors */
static int load_whole(job *j, aft_st_file *f, const char *file)
{
    for (size_t i = 0; i < aft_st_count(f); i++) {
        item *it = new_item(j);
        if (!it) return oom();
        const char *name;
        it->file = file;
        it->src = aft_st_get(f, i, &name);
        it->tname = name;
        take_shape(it, it->src);
        if (!(it->name = strdup(name))) return oom();
    }
    for (size_t i = 0; i < aft_st_metadata_count(f); i++) {
        const char *k, *v;
        aft_st_metadata(f, i, &k, &v);
        if (put_meta(j, k, v) != 0) return oom();
    }
    return 0;
}

/* Opens what spec s names and adds its tensors to the job. For a .npy the
 * whole file is read now for a .npy output, standard input or a pipe;
 * otherwise only its header is, and the data when it is written. Returns 0,
 * or an exit status after reporting. */
static int load_spec(job *j, const spec *s, int to_st, int *stdin_used)
{
    aft_error err = {{0}};
    char msg[512];
    const char *file = s->file;
    if (s->kind == SRC_NPY || s->kind == SRC_STDIN) return load_npy(j, s, to_st, stdin_used);

    aft_st_file *f;
    if (aft_st_open_limit(file, aft_memory_limit(max_memory), &f, &err) != AFT_OK) {
        report_file(file, err.msg);
        return EXIT_DATA;
    }
    aft_st_file **files = realloc(j->files, (j->nfiles + 1) * sizeof *files);
    if (!files) {
        aft_st_close(f);
        return oom();
    }
    j->files = files;
    j->files[j->nfiles++] = f;

    size_t count = aft_st_count(f);
    const aft_tensor *t = NULL;
    if (s->kind == SRC_ST_TENSOR) {
        if (!(t = aft_st_find(f, s->tname))) {
            snprintf(msg, sizeof msg, "no tensor named '%s'", s->tname);
            report_file(file, msg);
            return EXIT_DATA;
        }
    } else if (s->name || !to_st) {
        /* one tensor is wanted: the file must hold exactly one */
        if (count != 1) {
            snprintf(msg, sizeof msg, "holds %zu tensors; name one as %s:NAME", count, file);
            report_file(file, msg);
            return EXIT_DATA;
        }
        t = aft_st_get(f, 0, NULL);
    }
    if (!t) return load_whole(j, f, file);   /* a whole file into a .safetensors */
    item *it = new_item(j);
    if (!it) return oom();
    it->file = file;
    it->tname = s->tname ? s->tname : NULL;
    it->src = t;
    take_shape(it, t);
    if (to_st && !(it->name = strdup(s->name ? s->name : s->tname))) return oom();
    if (!s->tname) aft_st_get(f, 0, &it->tname);
    return 0;
}

/* "'w' in a.safetensors" or "a.npy", for messages about one tensor */
static const char *item_desc(const item *it, char *buf, size_t cap)
{
    if (it->tname) snprintf(buf, cap, "tensor '%s'", it->tname);
    else snprintf(buf, cap, "the tensor");
    return buf;
}

static int cmp_names(const void *a, const void *b)
{
    const item *x = *(const item *const *)a, *y = *(const item *const *)b;
    return strcmp(x->name, y->name);
}

/* Output names must be unique, valid UTF-8 and not "__metadata__"; in a
 * .npz they are keys, with no '/', '\\' or "..". */
static int check_names(const job *j, int npz)
{
    for (size_t i = 0; i < j->nitems; i++) {
        const char *n = j->items[i].name;
        if (!aft_utf8_valid(n)) return cli_usage_error(cmd, "tensor name '%s' is not valid UTF-8", n);
        aft_error err;
        if (npz && aft_npz_check_key(n, &err) != AFT_OK)
            return cli_usage_error(cmd, "%s: cannot name a .npz member; rename it with NAME=INPUT", err.msg);
        if (!npz && strcmp(n, "__metadata__") == 0)
            return cli_usage_error(cmd, "'__metadata__' is reserved and cannot name a tensor");
    }
    const item **sorted = malloc((j->nitems ? j->nitems : 1) * sizeof *sorted);
    if (!sorted) {
        cli_error(cmd, "out of memory");
        return EXIT_DATA;
    }
    for (size_t i = 0; i < j->nitems; i++) sorted[i] = &j->items[i];
    qsort(sorted, j->nitems, sizeof *sorted, cmp_names);
    for (size_t i = 1; i < j->nitems; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            /* report the two in command-line order */
            const item *a = sorted[i - 1] < sorted[i] ? sorted[i - 1] : sorted[i];
            const item *b = a == sorted[i] ? sorted[i - 1] : sorted[i];
            int rc = cli_usage_error(cmd, "tensor name '%s' is given twice (from %s and %s); rename one with NAME=INPUT",
                                     a->name, cli_display_name(a->file), cli_display_name(b->file));
            free(sorted);
            return rc;
        }
    free(sorted);
    return 0;
}

/* ---------------------------------------------------------------- writing */

/* writes len bytes; 0, or -1 with errno set */
static int write_all(FILE *fp, const void *p, size_t len)
{
    if (len && fwrite(p, 1, len, fp) != len) {
        if (!errno) errno = EIO;
        return -1;
    }
    return 0;
}

/* Where converted bytes go: a file, a .npz member, or only into a CRC-32
 * (a .npz member's CRC comes before its data) */
typedef struct {
    FILE *fp;
    aft_npz_writer *npz;
    uint32_t *crc;
    aft_error *err;    /* the .npz writer's message */
} sink;

/* 0, or -1 with errno set (a file) or the message in k->err (a .npz) */
static int sink_put(const sink *k, const void *p, size_t n)
{
    if (k->crc) {
        *k->crc = aft_crc32(*k->crc, p, n);
        return 0;
    }
    if (k->npz) return aft_npz_writer_write(k->npz, p, n, k->err) == AFT_OK ? 0 : -1;
    return write_all(k->fp, p, n);
}

/* Writes n elements of src (dtype from) as dtype to: bytes as they are when
 * the dtypes agree, else converted through buf; CHUNK_BYTES at a time
 * either way, each counted on the progress line. 0, or -1 as sink_put. */
static int write_data(const sink *k, const void *src, aft_dtype from, aft_dtype to, size_t n,
                      unsigned char *buf)
{
    size_t in = aft_dtype_size(from), out = aft_dtype_size(to);
    const unsigned char *s = src;
    if (from == to) {
        for (size_t done = 0, nb = n * in; done < nb;) {
            size_t m = nb - done < CHUNK_BYTES ? nb - done : CHUNK_BYTES;
            if (sink_put(k, s + done, m) != 0) return -1;
            cli_progress_add(m);
            done += m;
        }
        return 0;
    }
    size_t per = CHUNK_BYTES / (in > out ? in : out);
    for (size_t done = 0; done < n;) {
        size_t m = n - done < per ? n - done : per;
        convert_block(buf, to, s + done * in, from, m);
        if (sink_put(k, buf, m * out) != 0) return -1;
        cli_progress_add(m * out);
        done += m;
    }
    return 0;
}

/* the bytes the job's tensors come to (the progress line's total) */
static size_t job_bytes(const job *j)
{
    size_t n = 0;
    for (size_t i = 0; i < j->nitems; i++)
        if (__builtin_add_overflow(n, j->items[i].nbytes_out, &n)) return SIZE_MAX;
    return n;
}

/* The data of item it: already there, or its .npy read now and checked
 * against the header read before. 0, or EXIT_DATA after reporting. */
static int item_data(item *it)
{
    if (it->src) return 0;
    aft_error err = {{0}};
    if (aft_npy_read(it->file, &it->held, NULL, &err) != AFT_OK) {
        report_file(it->file, err.msg);
        return EXIT_DATA;
    }
    int same = it->held.dtype == it->dtype && it->held.ndim == it->ndim &&
               memcmp(it->held.shape, it->shape, it->ndim * sizeof it->shape[0]) == 0;
    if (!same) {
        report_file(it->file, "changed while being converted (its header no longer matches)");
        aft_tensor_free(&it->held);
        return EXIT_DATA;
    }
    it->src = &it->held;
    return 0;
}

/* The .safetensors header for the job's tensors as they will be written
 * (output dtypes and sizes), built and checked by the library: __metadata__
 * first, then the tensors back to back in order, padded with spaces so the
 * data starts at a multiple of 8. Into *hp (malloc'd) and *hlen; 0, or an
 * exit status after reporting. */
static int st_header(const job *j, char **hp, size_t *hlen)
{
    const char **names = malloc((j->nitems + 1) * sizeof *names);
    aft_tensor *desc = calloc(j->nitems + 1, sizeof *desc);
    if (!names || !desc) {
        free(names);
        free(desc);
        cli_error(cmd, "out of memory building the header");
        return EXIT_DATA;
    }
    for (size_t i = 0; i < j->nitems; i++) {
        const item *it = &j->items[i];
        /* said here rather than by the library, so the message names the
         * input file the dimension came from */
        for (size_t k = 0; k < it->ndim; k++)
            if ((double)it->shape[k] >= ST_SIZE_LIMIT) {
                char msg[200];
                snprintf(msg, sizeof msg, "dimension %zu of '%s' is %zu, 2^53 or more, which .safetensors cannot hold",
                         k, it->name, it->shape[k]);
                report_file(it->file, msg);
                free(names);
                free(desc);
                return EXIT_DATA;
            }
        names[i] = it->name;
        desc[i].dtype = it->out;
        desc[i].ndim = it->ndim;
        memcpy(desc[i].shape, it->shape, it->ndim * sizeof(size_t));
        desc[i].nelem = it->nelem;
        desc[i].nbytes = it->nbytes_out;
    }
    aft_error err;
    aft_status st = aft_st_header(names, desc, j->nitems, (const char *const *)j->meta, j->nmeta, hp, hlen, &err);
    free(names);
    free(desc);
    if (st != AFT_OK) {
        cli_error(cmd, "%s", err.msg);
        return EXIT_DATA;
    }
    return 0;
}

/* "aft: OUT: write failed: ..." for an error while writing the output */
static void write_failed(const char *out_path, int e)
{
    cli_error(NULL, "%s: write failed: %s", cli_output_name(out_path), strerror(e));
}

/* it's input, once written, freed when the item read it (one .npy in
 * memory at a time); malloc_trim hands its pages back (glibc keeps a freed
 * block this large in the heap otherwise, and the next tensor need not
 * land on the same pages) */
static void item_release(item *it)
{
    if (it->src == &it->held) {
        aft_tensor_free(&it->held);
        it->src = NULL;
        malloc_trim(0);
    }
}

/* the copy buffer and out_path opened to be written atomically: 0, or
 * EXIT_DATA after saying why (nothing left to free) */
static int open_output(const char *out_path, aft_out *o, unsigned char **buf)
{
    aft_error err = {{0}};
    *buf = malloc(CHUNK_BYTES);
    if (!*buf) {
        cli_error(cmd, "out of memory");
        return EXIT_DATA;
    }
    if (aft_out_open(o, out_path, &err) != AFT_OK) {
        cli_error(NULL, "%s", err.msg);
        free(*buf);
        *buf = NULL;
        return EXIT_DATA;
    }
    return 0;
}

static int write_safetensors(job *j, const char *out_path)
{
    struct { char *p; size_t len; } h = {NULL, 0};
    int rc = st_header(j, &h.p, &h.len);
    if (rc) {
        free(h.p);
        return rc;
    }
    unsigned char *buf;
    aft_out o;
    if (open_output(out_path, &o, &buf)) {
        free(h.p);
        return EXIT_DATA;
    }
    unsigned char size_le[8];
    for (int i = 0; i < 8; i++) size_le[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    errno = 0;
    if (write_all(o.fp, size_le, 8) != 0 || write_all(o.fp, h.p, h.len) != 0) {
        write_failed(out_path, errno);
        rc = EXIT_DATA;
    }
    free(h.p);
    cli_progress_start("aft convert: %s", out_path);
    cli_progress_total(job_bytes(j));
    for (size_t i = 0; i < j->nitems && !rc; i++) {
        item *it = &j->items[i];
        cli_progress_label("aft convert: %s: tensor %zu of %zu", out_path, i + 1, j->nitems);
        if ((rc = item_data(it)) != 0) break;
        errno = 0;
        sink k = {.fp = o.fp};
        if (write_data(&k, it->src->data, it->dtype, it->out, it->nelem, buf) != 0) {
            write_failed(out_path, errno);
            rc = EXIT_DATA;
        }
        item_release(it);
    }
    free(buf);
    cli_progress_stop();
    return cli_out_close(&o, rc);
}

static int write_npy(job *j, const char *out_path)
{
    item *it = &j->items[0];
    char msg[600], desc[200];
    if (it->out == AFT_BF16) {
        snprintf(msg, sizeof msg, "%s is BF16, which .npy cannot hold; add --dtype f32 (exact) or write a .safetensors",
                 item_desc(it, desc, sizeof desc));
        report_file(it->file, msg);
        return EXIT_DATA;
    }
    char head[4096];
    size_t hn;
    aft_tensor shape_of = {.dtype = it->out, .ndim = it->ndim};
    memcpy(shape_of.shape, it->shape, it->ndim * sizeof(size_t));
    aft_error err;
    if (aft_npy_header(&shape_of, head, sizeof head, &hn, &err) != AFT_OK) {
        cli_error(cmd, "%s", err.msg);
        return EXIT_DATA;
    }
    unsigned char *buf;
    aft_out o;
    if (open_output(out_path, &o, &buf)) return EXIT_DATA;
    errno = 0;
    int rc = 0;
    sink k = {.fp = o.fp};
    cli_progress_start("aft convert: %s", out_path);
    cli_progress_total(it->nbytes_out);
    if (write_all(o.fp, head, hn) != 0 ||
        write_data(&k, it->src->data, it->dtype, it->out, it->nelem, buf) != 0) {
        write_failed(out_path, errno);
        rc = EXIT_DATA;
    }
    cli_progress_stop();
    free(buf);
    return cli_out_close(&o, rc);
}

/* A .npz of stored members, one a tensor: for each, its .npy header, then
 * its data converted twice, once into the CRC-32 the member's local header
 * needs first and once into the archive. One .npy input in memory at a
 * time, as for a .safetensors. */
static int write_npz(job *j, const char *out_path)
{
    char desc[200], msg[600];
    for (size_t i = 0; i < j->nitems; i++)
        if (j->items[i].out == AFT_BF16) {
            snprintf(msg, sizeof msg, "%s is BF16, which .npz cannot hold; add --dtype f32 (exact) or write a .safetensors",
                     item_desc(&j->items[i], desc, sizeof desc));
            report_file(j->items[i].file, msg);
            return EXIT_DATA;
        }
    unsigned char *buf;
    aft_error err = {{0}};
    aft_out o;
    if (open_output(out_path, &o, &buf)) return EXIT_DATA;
    aft_npz_writer *w = NULL;
    int rc = 0;
    if (aft_npz_writer_new(o.fp, &w, &err) != AFT_OK) {
        cli_error(cmd, "%s", err.msg);
        rc = EXIT_DATA;
    }
    cli_progress_start("aft convert: %s", out_path);
    cli_progress_total(2 * job_bytes(j));   /* each tensor's data twice: its CRC, then the archive */
    for (size_t i = 0; i < j->nitems && !rc; i++) {
        item *it = &j->items[i];
        cli_progress_label("aft convert: %s: tensor %zu of %zu", out_path, i + 1, j->nitems);
        if ((rc = item_data(it)) != 0) break;
        char head[4096];
        size_t hn;
        aft_tensor shape_of = {.dtype = it->out, .ndim = it->ndim, .nelem = it->nelem, .nbytes = it->nbytes_out};
        memcpy(shape_of.shape, it->shape, it->ndim * sizeof(size_t));
        uint32_t crc = 0;
        sink crc_sink = {.crc = &crc}, out_sink = {.npz = w, .err = &err};
        errno = 0;
        if (aft_npy_header(&shape_of, head, sizeof head, &hn, &err) != AFT_OK ||
            (crc = aft_crc32(0, head, hn), write_data(&crc_sink, it->src->data, it->dtype, it->out, it->nelem, buf)) != 0 ||
            aft_npz_writer_begin(w, it->name, (uint64_t)hn + it->nbytes_out, crc, &err) != AFT_OK ||
            aft_npz_writer_write(w, head, hn, &err) != AFT_OK ||
            write_data(&out_sink, it->src->data, it->dtype, it->out, it->nelem, buf) != 0) {
            cli_error(NULL, "%s: %s", cli_output_name(out_path), err.msg);
            rc = EXIT_DATA;
        }
        item_release(it);
    }
    if (!rc && aft_npz_writer_finish(w, &err) != AFT_OK) {
        cli_error(NULL, "%s: %s", cli_output_name(out_path), err.msg);
        rc = EXIT_DATA;
    }
    aft_npz_writer_free(w);
    free(buf);
    cli_progress_stop();
    return cli_out_close(&o, rc);
}


/* ---------------------------------------------------------------- options */

struct convert_opts {
    const char *out_path, *format;
    int have_dtype;
    aft_dtype target;
    char **meta;              /* --metadata pairs: key (a malloc'd copy), value (in argv) */
    size_t nmeta;
    const char **operands;    /* the INPUTs, in order */
    size_t nops;
};

static int set_dtype(const cli_option *opt, void *opts, const char *val)
{
    struct convert_opts *o = opts;
    if (parse_dtype(val, &o->target) != 0)
        return cli_usage_error(cmd, "unknown --dtype '%s': want f32, f16, bf16 or f64", val);
    o->have_dtype = 1;
    return 0;
}

static int set_format(const cli_option *opt, void *opts, const char *val)
{
    if (!val || (strcmp(val, "npy") != 0 && strcmp(val, "safetensors") != 0 && strcmp(val, "npz") != 0))
        return cli_usage_error(cmd, "--format takes npy, npz or safetensors");
    ((struct convert_opts *)opts)->format = val;
    return 0;
}

static int add_metadata(const cli_option *opt, void *opts, const char *val)
{
    struct convert_opts *o = opts;
    const char *eq = val ? strchr(val, '=') : NULL;
    if (!eq || eq == val) return cli_usage_error(cmd, "--metadata takes KEY=VALUE, not '%s'", val ? val : "");
    char *key = strndup(val, (size_t)(eq - val));
    if (!key) {
        cli_error(cmd, "out of memory");
        return EXIT_DATA;
    }
    o->meta[2 * o->nmeta] = key;
    o->meta[2 * o->nmeta + 1] = (char *)eq + 1;   /* borrowed from argv */
    o->nmeta++;
    if (!aft_utf8_valid(key) || !aft_utf8_valid(eq + 1)) return cli_usage_error(cmd, "--metadata '%s' is not valid UTF-8", val);
    for (size_t k = 0; k + 1 < o->nmeta; k++)
        if (strcmp(o->meta[2 * k], key) == 0) return cli_usage_error(cmd, "--metadata key '%s' is given twice", key);
    return 0;
}

static int set_max_memory(const cli_option *opt, void *opts, const char *v)
{
    (void)opt;
    (void)opts;
    return cli_set_memory(cmd, &max_memory, v);
}

static int add_operand(void *opts, const char *arg)
{
    struct convert_opts *o = opts;
    o->operands[o->nops++] = arg;
    return 0;
}

static const cli_option options[] = {
    {"-o", "--output", "OUT",
     "the output file, written atomically (a temporary renamed into place); '-' or no -o: standard output, unless "
     "it is a terminal",
     cli_set_string, offsetof(struct convert_opts, out_path), "%s needs a file", 0},
    {"--dtype", NULL, "D",
     "convert every floating-point tensor to D: f32, f16, bf16 or f64, rounding to nearest, ties to even (too "
     "large values become infinity, NaN stays NaN). Bool and integer tensors are copied unchanged. Default: keep "
     "every dtype (the data is copied bit for bit)",
     set_dtype, 0, "--dtype needs a value", 0},
    {"--metadata", NULL, "KEY=VALUE",
     "a .safetensors __metadata__ entry (repeatable); it replaces a key of the same name from an input file",
     add_metadata, 0, NULL, 0},
    {"--format", NULL, "F", "npy, npz or safetensors, whatever OUT is called", set_format, 0, NULL, 0},
    {"--max-memory", NULL, "SIZE", "memory for inflating .npz members (bytes, or with K, M, G; default: the memory available)",
     set_max_memory, 0, "--max-memory takes a size like 4G, 512M or 1000000", 0},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_convert_command = {
    .name = "convert",
    .usage = "usage: aft convert [-o OUT] [--dtype f32|f16|bf16|f64] [--metadata KEY=VALUE]...\n"
             "                   [--format npy|npz|safetensors] [--max-memory SIZE] INPUT...\n"
             "\n"
             "Pack .npy files into one .safetensors or .npz, extract a tensor from a\n"
             ".safetensors or .npz, convert between the two, or change the\n"
             "floating-point dtype of tensors. Tensors are converted and written a chunk\n"
             "at a time: memory holds at most one input tensor (but a .npz input's\n"
             "deflated members, which are inflated when it is opened).\n"
             "\n"
             "  aft convert -o model.safetensors wq=wq.npy wk=wk.npy --metadata format=pt\n"
             "  aft convert -o wq.npy model.safetensors:blocks.0.wq\n"
             "  aft convert -o out.npz a=a.npy b=b.npy\n"
             "  aft convert -o w.npy model.npz:query.weight\n"
             "  aft convert -o model.safetensors model.npz\n"
             "  aft convert --dtype f16 -o x16.npy x.npy\n"
             "  aft convert --dtype bf16 -o small.safetensors model.safetensors\n"
             "\n"
             "INPUT is one of:\n"
             "  FILE.npy               a .npy file (in a .safetensors or .npz output it is\n"
             "                         named after the file, without directory and '.npy')\n"
             "  -                      a .npy on standard input (NAME=- in a .safetensors)\n"
             "  FILE.safetensors       every tensor of the file, with its names and metadata\n"
             "  FILE.safetensors:NAME  the tensor NAME in the file\n"
             "  FILE.npz               every member of a .npz (np.savez), named by its key\n"
             "  FILE.npz:KEY           the member KEY of the archive\n"
             "  NAME=INPUT             the one tensor of INPUT, called NAME in the output\n"
             "Formats are told apart by their first bytes, not only by the extension.\n"
             "\n"
             "The output is a .safetensors or a .npz holding the inputs' tensors in the\n"
             "order given, or a .npy holding the one input tensor. Which one: --format,\n"
             "else the name of OUT (.npy, .npz or .safetensors), else .npy for a single\n"
             "INPUT that is one tensor without NAME=, .safetensors otherwise. A .npz is\n"
             "written with stored (uncompressed) members, zip64 where sizes need it; it\n"
             "has no metadata (a .safetensors input's is not kept), and its keys may not\n"
             "hold '/', '\\' or '..'.\n",
    .options = options,
    .more = ".npy and .npz cannot hold bfloat16: convert BF16 tensors with --dtype f32\n"
            "(exact).\n"
            "\n"
            "exit status: 0 done, 1 a file could not be read or written, 2 usage error\n",
    .operand = add_operand,
};

/* ---------------------------------------------------------------- the command */

/* The output format (*to_st: named tensors, a .safetensors or, *out_npz, a
 * .npz; else .npy): asked for, else by the name of OUT, else by the inputs;
 * and the usage errors of that choice. 0, or an exit status after
 * reporting. */
static int choose_output(const struct convert_opts *o, const job *j, int *to_st, int *out_npz)
{
    const spec *first = &j->specs[0];
    *out_npz = 0;
    if (o->format) *to_st = strcmp(o->format, "npy") != 0, *out_npz = strcmp(o->format, "npz") == 0;
    else if (o->out_path && cli_ends_with(o->out_path, ".safetensors")) *to_st = 1;
    else if (o->out_path && cli_ends_with(o->out_path, ".npz")) *to_st = 1, *out_npz = 1;
    else if (o->out_path && cli_ends_with(o->out_path, ".npy")) *to_st = 0;
    else *to_st = o->nops > 1 || first->name || first->kind == SRC_ST_WHOLE;

    if (*out_npz && o->nmeta)
        return cli_usage_error(cmd, "--metadata applies to a .safetensors output; a .npz has no metadata");
    if (*out_npz && o->have_dtype && o->target == AFT_BF16)
        return cli_usage_error(cmd, ".npz cannot hold bfloat16; write a .safetensors or choose another --dtype");
    if (!*to_st) {
        if (o->nops > 1)
            return cli_usage_error(cmd, "a .npy output holds one tensor, but %zu inputs are given", o->nops);
        if (first->name)
            return cli_usage_error(cmd, "'%s': NAME= names a tensor in a .safetensors output; a .npy has no names",
                                   first->arg);
        if (o->nmeta) return cli_usage_error(cmd, "--metadata applies to a .safetensors output, not .npy");
        if (o->have_dtype && o->target == AFT_BF16)
            return cli_usage_error(cmd, ".npy cannot hold bfloat16; write a .safetensors or choose another --dtype");
    } else {
        for (size_t i = 0; i < o->nops; i++)
            if (j->specs[i].kind == SRC_STDIN && !j->specs[i].name)
                return cli_usage_error(cmd, "name the tensor read from standard input: NAME=-");
    }
    if ((!o->out_path || strcmp(o->out_path, "-") == 0) && isatty(STDOUT_FILENO))
        return cli_usage_error(cmd, "refusing to write binary %s to a terminal; use -o FILE or a pipe",
                               *out_npz ? ".npz" : *to_st ? ".safetensors" : ".npy");
    if (!HOST_LITTLE) {
        /* both formats are written here as little-endian from native data */
        cli_error(cmd, "converting on a big-endian machine is not supported");
        return EXIT_DATA;
    }
    return 0;
}

/* Every INPUT's tensors (and metadata) into the job, then --metadata.
 * 0, or an exit status after reporting. */
static int load_inputs(const struct convert_opts *o, job *j, int to_st, int out_npz)
{
    int rc, stdin_used = 0;
    for (size_t i = 0; i < o->nops; i++)
        if ((rc = load_spec(j, &j->specs[i], to_st, &stdin_used)) != 0) return rc;
    for (size_t i = 0; i < o->nmeta; i++)
        if (put_meta(j, o->meta[2 * i], o->meta[2 * i + 1]) != 0) {
            cli_error(cmd, "out of memory");
            return EXIT_DATA;
        }
    return to_st ? check_names(j, out_npz) : 0;
}

/* Each item's output dtype and size: --dtype changes floating-point tensors
 * only. 0, or EXIT_DATA after reporting. */
static int plan_outputs(const struct convert_opts *o, job *j)
{
    for (size_t i = 0; i < j->nitems; i++) {
        item *it = &j->items[i];
        it->out = o->have_dtype && aft_dtype_is_float(it->dtype) ? o->target : it->dtype;
        /* a zero dimension makes the tensor empty whatever the others say */
        size_t n = 1;
        int over = 0;
        for (size_t k = 0; k < it->ndim; k++) over |= __builtin_mul_overflow(n, it->shape[k], &n);
        for (size_t k = 0; k < it->ndim; k++)
            if (it->shape[k] == 0) n = 0, over = 0;
        it->nelem = n;
        if (over || __builtin_mul_overflow(n, aft_dtype_size(it->out), &it->nbytes_out)) {
            report_file(it->file, "shape too large");
            return EXIT_DATA;
        }
    }
    return 0;
}

/* the INPUTs taken apart into j->specs; 0, or an exit status after reporting */
static int parse_inputs(const struct convert_opts *o, job *j)
{
    if (!(j->specs = calloc(o->nops, sizeof *j->specs))) {
        cli_error(cmd, "out of memory");
        return EXIT_DATA;
    }
    for (size_t i = 0; i < o->nops; i++) {
        j->nspecs++;
        int rc = parse_spec(&j->specs[i], o->operands[i]);
        if (rc) return rc;
    }
    return 0;
}

/* the options and INPUTs into o (o->meta and o->operands allocated here);
 * 0, -1 after the help, or an exit status after reporting */
static int parse_args(int argc, char **argv, struct convert_opts *o)
{
    o->meta = calloc((size_t)argc + 1, 2 * sizeof *o->meta);
    o->operands = calloc((size_t)argc + 1, sizeof *o->operands);
    if (!o->meta || !o->operands) {
        cli_error(cmd, "out of memory");
        return EXIT_DATA;
    }
    int rc = cli_parse_options(&cli_convert_command, argc, argv, o);
    if (rc) return rc;
    if (o->nops == 0) return cli_usage_error(cmd, "no INPUT given");
    return 0;
}

int cmd_convert(int argc, char **argv)
{
    struct convert_opts o = {.target = AFT_F32};
    job j;
    memset(&j, 0, sizeof j);
    int to_st = 0, out_npz = 0, rc = parse_args(argc, argv, &o);
    if (rc < 0) {
        rc = cli_finish_stdout(cmd);
    } else if (rc == 0) {
        const char *out_path = o.out_path ? o.out_path : "-";
        rc = parse_inputs(&o, &j);
        if (!rc) rc = choose_output(&o, &j, &to_st, &out_npz);
        if (!rc) rc = load_inputs(&o, &j, to_st, out_npz);
        if (!rc) rc = plan_outputs(&o, &j);
        if (!rc) rc = out_npz ? write_npz(&j, out_path) : to_st ? write_safetensors(&j, out_path) : write_npy(&j, out_path);
        if (!rc) rc = cli_finish_stdout(cmd);
    }
    job_free(&j);
    for (size_t i = 0; o.meta && i < o.nmeta; i++) free(o.meta[2 * i]);
    free(o.meta);
    free(o.operands);
    return rc;
}
