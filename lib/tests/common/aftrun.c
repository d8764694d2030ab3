/* aftrun.c - aft as a child of a lib test, and files for it (aftrun.h) */
#include "aftrun.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "aft.h"
#include "files.h"

static int to_file(const char *path, int fd)
{
    int f = open(path ? path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (f < 0 || dup2(f, fd) < 0) return -1;
    close(f);
    return 0;
}

int aftrun(const char *out_path, const char *err_path, const char *const *args)
{
    const char *bin = getenv("AFT_BIN");
    if (!bin || !*bin) bin = "./aft";
    size_t n = 0;
    while (args[n]) n++;
    const char **argv = calloc(n + 2, sizeof *argv);
    assert_non_null(argv);
    argv[0] = bin;
    memcpy(argv + 1, args, n * sizeof *argv);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (to_file(out_path, 1) || to_file(err_path, 2)) _exit(126);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    free(argv);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char dir[64];

const char *aftrun_dir(void)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/aft_test_api_XXXXXX");
        assert_non_null(mkdtemp(dir));
    }
    return dir;
}

const char *aftrun_tmp(const char *name)
{
    static char bufs[8][256];
    static int k;
    char *b = bufs[k++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", aftrun_dir(), name);
    return b;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int aftrun_cleanup(void **state)
{
    (void)state;
    if (dir[0]) nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
    dir[0] = 0;
    return 0;
}

/* ---------------------------------------------------------------- arrays */

static void add_array(aftrun_arrays *a, size_t i, const char *name, const aft_tensor *t)
{
    aft_error err;
    a->names[i] = strdup(name);
    if (aft_tensor_to_f32(t, &a->data[i], &err) != AFT_OK) fail_msg("%s: %s", name, err.msg);
    a->ndims[i] = t->ndim;
    a->shapes[i] = calloc(t->ndim + 1, sizeof(size_t));
    assert_non_null(a->shapes[i]);
    memcpy(a->shapes[i], t->shape, t->ndim * sizeof(size_t));
}

static void alloc_arrays(aftrun_arrays *a, size_t n)
{
    a->n = n;
    a->names = calloc(n + 1, sizeof *a->names);
    a->data = calloc(n + 1, sizeof *a->data);
    a->ndims = calloc(n + 1, sizeof *a->ndims);
    a->shapes = calloc(n + 1, sizeof *a->shapes);
    assert_true(a->names && a->data && a->ndims && a->shapes);
}

void aftrun_arrays_read(aftrun_arrays *a, const char *path)
{
    aft_error err;
    size_t len = strlen(path);
    if (len > 4 && strcmp(path + len - 4, ".npy") == 0) {
        aft_tensor t;
        if (aft_npy_read(path, &t, NULL, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
        alloc_arrays(a, 1);
        add_array(a, 0, "x", &t);
        aft_tensor_free(&t);
        return;
    }
    aft_st_file *f;
    if (aft_st_open(path, &f, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
    alloc_arrays(a, aft_st_count(f));
    for (size_t i = 0; i < a->n; i++) {
        const char *name;
        const aft_tensor *t = aft_st_get(f, i, &name);
        add_array(a, i, name, t);
    }
    aft_st_close(f);
}

void aftrun_arrays_free(aftrun_arrays *a)
{
    for (size_t i = 0; i < a->n; i++) {
        free(a->names[i]);
        free(a->data[i]);
        free(a->shapes[i]);
    }
    free(a->names);
    free(a->data);
    free(a->ndims);
    free(a->shapes);
    memset(a, 0, sizeof *a);
}

const float *aftrun_array(const aftrun_arrays *a, const char *name)
{
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->names[i], name) == 0) return a->data[i];
    return NULL;
}

/* ---------------------------------------------------------------- comparing */

void aftrun_same_files(const char *a, const char *b)
{
    size_t na, nb;
    unsigned char *x = files_slurp(a, &na), *y = files_slurp(b, &nb);
    if (na != nb || memcmp(x, y, na) != 0) fail_msg("%s (%zu bytes) differs from %s (%zu bytes)", a, na, b, nb);
    free(x);
    free(y);
}

void aftrun_same_npy(const float *x, size_t n, const char *path)
{
    aft_error err;
    aft_tensor t;
    if (aft_npy_read(path, &t, NULL, &err) != AFT_OK) fail_msg("%s: %s", path, err.msg);
    if (t.dtype != AFT_F32 || t.nelem != n) fail_msg("%s: %zu elements of %s, not %zu F32", path, t.nelem,
                                                     aft_dtype_name(t.dtype), n);
    if (memcmp(t.data, x, n * sizeof(float)) != 0) {
        const float *y = t.data;
        size_t i = 0;
        while (i < n && memcmp(&x[i], &y[i], sizeof(float)) == 0) i++;
        fail_msg("%s: element %zu is %.9g, the library's %.9g", path, i, (double)y[i], (double)x[i]);
    }
    aft_tensor_free(&t);
}

/* ---------------------------------------------------------------- a case of testdata/torch/ */

const char *aftrun_case_file(const aftrun_case *c, const char *file)
{
    static char bufs[8][600];
    static int k;
    char *b = bufs[k++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", c->dir, file);
    return b;
}

/* args.txt's words, and the same as key=value pairs: "--window 4" as
 * "window=4", "--causal" as "causal=1" */
static void case_args(aftrun_case *c)
{
    size_t len, used = 0;
    char *text = (char *)files_slurp(aftrun_case_file(c, "args.txt"), &len);
    for (char *w = strtok(text, " \n"); w; w = strtok(NULL, " \n")) {
        assert_true(c->argc < 16 && strlen(w) < sizeof c->words[0]);
        snprintf(c->words[c->argc], sizeof c->words[0], "%s", w);
        c->argv[c->argc] = c->words[c->argc];
        c->argc++;
        const char *sep = used ? " " : "";
        int n = strcmp(w, "--causal") == 0 ? snprintf(c->options + used, sizeof c->options - used, "%scausal=1", sep)
                : strncmp(w, "--", 2) == 0 ? snprintf(c->options + used, sizeof c->options - used, "%s%s=", sep, w + 2)
                                           : snprintf(c->options + used, sizeof c->options - used, "%s", w);
        used += (size_t)n;
        assert_true(used < sizeof c->options);
    }
    free(text);
}

void aftrun_case_read(aftrun_case *c, const char *name)
{
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s", files_fixture("torch", name));
    case_args(c);
    aftrun_arrays_read(&c->w, aftrun_case_file(c, "weights.safetensors"));
    aftrun_arrays_read(&c->x, aftrun_case_file(c, "x.npy"));
    const size_t *s = c->x.shapes[0];
    int tbd = strstr(c->options, "layout=tbd") != NULL;
    switch (c->x.ndims[0]) {
    case 2: c->B = 1, c->T = s[0], c->D = s[1]; break;
    case 3: c->B = tbd ? s[1] : s[0], c->T = tbd ? s[0] : s[1], c->D = s[2]; break;
    default: c->B = s[0], c->T = s[1] * s[2], c->D = s[3]; break;
    }
}

void aftrun_case_free(aftrun_case *c)
{
    aftrun_arrays_free(&c->w);
    aftrun_arrays_free(&c->x);
}
