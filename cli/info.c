/* info.c - `aft info`: list the tensors (and metadata) of .npy, .npz and .safetensors files. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* messages about a file: "aft: FILE: msg" */
static void report_file(const char *path, const char *msg)
{
    cli_report_file(NULL, path, msg);
}

/* one row of the human table */
typedef struct {
    char *name;    /* escaped for the terminal */
    const char *dtype;
    char *shape;
    size_t bytes;
} row;

/* "[64, 32]", "[]" for a scalar; malloc'd (NULL when out of memory) */
static char *shape_string(const aft_tensor *t)
{
    /* 20 digits + ", " per dimension, brackets, NUL */
    size_t cap = t->ndim * 22 + 3, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[len++] = '[';
    for (size_t i = 0; i < t->ndim; i++)
        len += (size_t)snprintf(s + len, cap - len, "%s%zu", i ? ", " : "", t->shape[i]);
    s[len++] = ']';
    s[len] = '\0';
    return s;
}

/* Tensor names and metadata come from the file: escape control characters
 * and backslashes so one entry stays on one line. malloc'd. */
static char *escape(const char *s)
{
    size_t n = strlen(s);
    char *e = malloc(n * 4 + 1), *p = e;
    if (!e) return NULL;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\\') { *p++ = '\\'; *p++ = '\\'; }
        else if (c == '\n') { *p++ = '\\'; *p++ = 'n'; }
        else if (c == '\t') { *p++ = '\\'; *p++ = 't'; }
        else if (c < 0x20 || c == 0x7f) p += sprintf(p, "\\x%02x", c);
        else *p++ = (char)c;
    }
    *p = '\0';
    return e;
}

/* the .npy name: the file's base name without ".npy" */
static char *npy_tensor_name(const char *path)
{
    if (strcmp(path, "-") == 0) return strdup("(array)");
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (cli_ends_with(base, ".npy")) n -= 4;
    if (n == 0) return strdup("(array)");
    return strndup(base, n);
}

static const char *byte_order_name(char bo)
{
    switch (bo) {
    case '<': return "little";
    case '>': return "big";
    case '=': return "little";   /* "native": every machine we build for */
    default: return "none";      /* '|': single bytes, order does not apply */
    }
}

/* the same for the human report */
static const char *byte_order_text(char bo)
{
    switch (bo) {
    case '<': case '=': return "little-endian";
    case '>': return "big-endian";
    default: return "byte order n/a";
    }
}

/* Prints the table: header, then the rows with columns padded to the
 * widest entry; bytes right-aligned. */
static void print_rows(const row *rows, size_t n)
{
    int wn = 4, wd = 5, ws = 5, wb = 5;
    for (size_t i = 0; i < n; i++) {
        char num[32];
        int l;
        if ((l = (int)strlen(rows[i].name)) > wn) wn = l;
        if ((l = (int)strlen(rows[i].dtype)) > wd) wd = l;
        if ((l = (int)strlen(rows[i].shape)) > ws) ws = l;
        if ((l = snprintf(num, sizeof num, "%zu", rows[i].bytes)) > wb) wb = l;
    }
    printf("  %-*s  %-*s  %-*s  %*s\n", wn, "name", wd, "dtype", ws, "shape", wb, "bytes");
    for (size_t i = 0; i < n; i++)
        printf("  %-*s  %-*s  %-*s  %*zu\n", wn, rows[i].name, wd, rows[i].dtype, ws,
               rows[i].shape, wb, rows[i].bytes);
}

static void free_rows(row *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(rows[i].name);
        free(rows[i].shape);
    }
    free(rows);
}

/* {"name", "dtype", "shape", "bytes"}; NULL when out of memory */
static cJSON *tensor_json(const char *name, const aft_tensor *t)
{
    cJSON *o = cJSON_CreateObject(), *shape = cJSON_CreateArray();
    int ok = o && shape;
    for (size_t i = 0; i < t->ndim && ok; i++) {
        /* a double holds every size up to 2^53, far beyond any real file */
        cJSON *d = cJSON_CreateNumber((double)t->shape[i]);
        ok = d && cJSON_AddItemToArray(shape, d);
    }
    ok = ok && cJSON_AddStringToObject(o, "name", name) &&
         cJSON_AddStringToObject(o, "dtype", aft_dtype_name(t->dtype)) &&
         cJSON_AddItemToObject(o, "shape", shape);
    if (!ok) {
        cJSON_Delete(shape);   /* not attached to o yet */
        cJSON_Delete(o);
        return NULL;
    }
    if (!cJSON_AddNumberToObject(o, "bytes", (double)t->nbytes)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* prints the object as one line; 0, or -1 when out of memory */
static int print_json_line(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    if (!s) return -1;
    puts(s);
    cJSON_free(s);
    return 0;
}

static int info_npy(const char *path, int json)
{
    aft_tensor t = {0};
    aft_npy_info ni;
    aft_error err = {{0}};
    if (aft_npy_read(path, &t, &ni, &err) != AFT_OK) {
        report_file(path, err.msg);
        return EXIT_DATA;
    }
    char *name = npy_tensor_name(path);
    char *shape = shape_string(&t);
    char version[32];
    snprintf(version, sizeof version, "%d.%d", ni.major, ni.minor);
    int rc = 0;
    if (!name || !shape) {
        rc = -1;
    } else if (json) {
        cJSON *o = cJSON_CreateObject(), *tensors = NULL, *npy = NULL;
        cJSON *tj = tensor_json(name, &t);
        int ok = o && tj && cJSON_AddStringToObject(o, "file", path) &&
                 cJSON_AddStringToObject(o, "format", "npy") &&
                 (tensors = cJSON_AddArrayToObject(o, "tensors")) &&
                 cJSON_AddItemToArray(tensors, tj);
        if (!ok) cJSON_Delete(tj);   /* not attached to o */
        ok = ok && cJSON_AddObjectToObject(o, "metadata") &&
             (npy = cJSON_AddObjectToObject(o, "npy")) &&
             cJSON_AddStringToObject(npy, "version", version) &&
             cJSON_AddStringToObject(npy, "byte_order", byte_order_name(ni.byteorder)) &&
             cJSON_AddBoolToObject(npy, "fortran_order", ni.fortran_order);
        rc = ok ? print_json_line(o) : -1;
        cJSON_Delete(o);
    } else {
        printf("%s: npy %s, %s, %s order\n", cli_display_name(path), version,
               byte_order_text(ni.byteorder),
               ni.fortran_order ? "Fortran" : "C");
        char *ename = escape(name);
        if (!ename) {
            rc = -1;
        } else {
            row r = {ename, aft_dtype_name(t.dtype), shape, t.nbytes};
            print_rows(&r, 1);
            free(ename);
        }
    }
    free(name);
    free(shape);
    aft_tensor_free(&t);
    if (rc != 0) {
        report_file(path, "out of memory");
        return EXIT_DATA;
    }
    return 0;
}

/* The dtype f's matrices (its 2-D float tensors: the projections', the
 * FFN's, the embedding) share when it is f16 or bf16, else AFT_F32: what
 * aft keeps 16-bit. */
static aft_dtype matrices_16(const aft_st_file *f)
{
    aft_dtype dt = AFT_F32;
    for (size_t i = 0; i < aft_st_count(f); i++) {
        const aft_tensor *t = aft_st_get(f, i, NULL);
        if (t->ndim != 2 || !aft_dtype_is_float(t->dtype)) continue;
        if (t->dtype != AFT_F16 && t->dtype != AFT_BF16) return AFT_F32;
        if (dt != AFT_F32 && dt != t->dtype) return AFT_F32;
        dt = t->dtype;
    }
    return dt;
}

/* "in memory: f16 (packed panels)": what aft's products hold a 16-bit
 * file's matrices in at this kernel level; "" for any other file */
static void in_memory(char *buf, size_t cap, const aft_st_file *f)
{
    aft_dtype dt = matrices_16(f), held = aft_weights_held(dt, AFT_KERNEL_AUTO);
    buf[0] = 0;
    if (dt == AFT_F32) return;
    if (held == dt)
        snprintf(buf, cap, "%s (packed panels; norms, biases and position biases widened to f32)",
                 cli_dtype_lower(held));
    else
        snprintf(buf, cap, "f32 (%s widened: the %s kernel level's products hold float32)", cli_dtype_lower(dt),
                 cli_level_name());
}

static int info_st_json(const char *path, const aft_st_file *f)
{
    size_t n = aft_st_count(f), nm = aft_st_metadata_count(f);
    cJSON *o = cJSON_CreateObject(), *tensors = NULL, *meta = NULL;
    int ok = o && cJSON_AddStringToObject(o, "file", path) &&
             cJSON_AddStringToObject(o, "format", aft_st_format(f)) &&
             (tensors = cJSON_AddArrayToObject(o, "tensors")) &&
             (meta = cJSON_AddObjectToObject(o, "metadata"));
    char mem[160];
    in_memory(mem, sizeof mem, f);
    if (ok && mem[0]) {
        aft_dtype held = aft_weights_held(matrices_16(f), AFT_KERNEL_AUTO);
        ok = cJSON_AddStringToObject(o, "in_memory", cli_dtype_lower(held)) != NULL;
    }
    for (size_t i = 0; i < n && ok; i++) {
        const char *name;
        const aft_tensor *t = aft_st_get(f, i, &name);
        cJSON *tj = tensor_json(name, t);
        ok = tj && cJSON_AddItemToArray(tensors, tj);
        if (!ok) cJSON_Delete(tj);
    }
    for (size_t i = 0; i < nm && ok; i++) {
        const char *k, *v;
        aft_st_metadata(f, i, &k, &v);
        ok = cJSON_AddStringToObject(meta, k, v) != NULL;
    }
    int rc = ok ? print_json_line(o) : -1;
    cJSON_Delete(o);
    return rc;
}

static int info_st_text(const char *path, const aft_st_file *f)
{
    size_t n = aft_st_count(f), nm = aft_st_metadata_count(f);
    if (strcmp(aft_st_format(f), "npz") == 0)
        printf("%s: npz, %zu tensor%s\n", path, n, n == 1 ? "" : "s");
    else
        printf("%s: safetensors, %zu tensor%s, %zu metadata entr%s\n", path, n, n == 1 ? "" : "s", nm,
               nm == 1 ? "y" : "ies");
    char mem[160];
    in_memory(mem, sizeof mem, f);
    if (mem[0]) printf("  in memory: %s\n", mem);
    row *rows = calloc(n ? n : 1, sizeof *rows);
    if (!rows) return -1;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name;
        const aft_tensor *t = aft_st_get(f, i, &name);
        rows[i] = (row){escape(name ? name : ""), aft_dtype_name(t->dtype), shape_string(t),
                        t->nbytes};
        if (!rows[i].name || !rows[i].shape) rc = -1;
    }
    if (rc == 0 && n > 0) print_rows(rows, n);
    free_rows(rows, n);
    if (rc == 0 && nm > 0) {
        printf("  metadata:\n");
        for (size_t i = 0; i < nm && rc == 0; i++) {
            const char *k, *v;
            aft_st_metadata(f, i, &k, &v);
            char *ek = escape(k), *ev = escape(v);
            if (ek && ev) printf("    %s = %s\n", ek, ev);
            else rc = -1;
            free(ek);
            free(ev);
        }
    }
    return rc;
}

static int info_st(const char *path, int json, size_t max_memory)
{
    aft_st_file *f = NULL;
    aft_error err = {{0}};
    if (aft_st_open_limit(path, aft_memory_limit(max_memory), &f, &err) != AFT_OK) {
        report_file(path, err.msg);
        return EXIT_DATA;
    }
    int rc = json ? info_st_json(path, f) : info_st_text(path, f);
    aft_st_close(f);
    if (rc != 0) {
        report_file(path, "out of memory");
        return EXIT_DATA;
    }
    return 0;
}

struct info_opts {
    int json;
    size_t max_memory;
    char **files;   /* the operands, gathered over argv (argv + 1 on) */
    int nfiles;
};

static int set_max_memory(const cli_option *opt, void *opts, const char *v)
{
    (void)opt;
    return cli_set_memory("info", &((struct info_opts *)opts)->max_memory, v);
}

static int add_file(void *opts, const char *arg)
{
    struct info_opts *o = opts;
    o->files[o->nfiles++] = (char *)arg;   /* never past the argument it came from */
    return 0;
}

static const cli_option options[] = {
    {"--json", NULL, NULL,
     "one JSON object per file, one per line:\n"
     "{\"file\", \"format\": \"npy\"|\"npz\"|\"safetensors\",\n"
     " \"tensors\": [{\"name\", \"dtype\", \"shape\", \"bytes\"}],\n"
     " \"metadata\": {...}, and for .npy \"npy\": {\"version\",\n"
     " \"byte_order\": \"little\"|\"big\"|\"none\", \"fortran_order\"}}\n"
     "(its keys: JSON OUTPUT in man aft)",
     cli_set_flag, offsetof(struct info_opts, json), NULL, 0},
    {"--max-memory", NULL, "SIZE", "memory for inflating .npz members (bytes, or with K, M, G; default: the memory available)",
     set_max_memory, 0, "--max-memory takes a size like 4G, 512M or 1000000", 0},
    {NULL, NULL, NULL, NULL, NULL, 0, NULL, 0},
};

const cli_command cli_info_command = {
    .name = "info",
    .usage = "usage: aft info [--json] [--max-memory SIZE] FILE...\n"
             "\n"
             "Print each tensor's name, dtype, shape and size in bytes, for .npy, .npz\n"
             "and .safetensors files; .safetensors metadata is printed as key = value.\n"
             "For .npy also the header version, the byte order and the memory order.\n"
             "Formats are told apart by their first bytes (a file they say nothing\n"
             "about goes by its extension). '-' reads a .npy from standard input.\n"
             "A .npy holds one tensor, named after the file without '.npy' ('(array)'\n"
             "for standard input); a .npz (numpy's np.savez) one tensor a member,\n"
             "named by its key (the member's name without '.npy').\n",
    .options = options,
    .more = "Files are read in order; the first one that cannot be read stops the\n"
            "command with a message on stderr.\n"
            "exit status: 0 all files read, 1 a file could not be read, 2 usage error\n",
    .operand = add_file,
};

int cmd_info(int argc, char **argv)
{
    const char *cmd = "info";
    /* options may come anywhere; "--" ends them; "-" is an operand */
    struct info_opts o = {.files = argv + 1};
    int rc = cli_parse_options(&cli_info_command, argc, argv, &o);
    if (rc) return rc < 0 ? cli_finish_stdout(cmd) : rc;
    if (o.nfiles == 0) return cli_usage_error(cmd, "no file given");
    for (int i = 0; i < o.nfiles && rc == 0; i++) {
        const char *path = o.files[i];
        aft_format fmt;
        if (cli_file_format(NULL, path, &fmt) != 0) {
            rc = EXIT_DATA;
            break;
        }
        /* a blank line between the reports of several files */
        if (!o.json && i > 0) putchar('\n');
        rc = fmt == AFT_FORMAT_NPY ? info_npy(path, o.json) : info_st(path, o.json, o.max_memory);
    }
    /* report a failed write even when a file failed too */
    int out = cli_finish_stdout(cmd);
    return rc ? rc : out;
}
