/* aftrun.h - for the lib tests that check the library against the aft
 * command (lib/tests/api/): aft run as a child ($AFT_BIN, default ./aft,
 * as the CLI tests run it), a temporary directory, and the arrays of a
 * file as float32, the way a binding hands them over. */
#ifndef AFT_TEST_AFTRUN_H
#define AFT_TEST_AFTRUN_H

#include <stddef.h>

/* Runs aft with args (args[0] the first argument after the program name,
 * NULL-terminated), stdout into out_path (NULL: /dev/null), stderr into
 * err_path (NULL: /dev/null): its exit status, or -1 when it did not exit. */
int aftrun(const char *out_path, const char *err_path, const char *const *args);
#define AFTRUN(out, ...) aftrun((out), NULL, (const char *const[]){__VA_ARGS__, NULL})

/* a new empty directory under /tmp for this program (made once), and a
 * path in it (a rotating set of buffers, so eight can be live) */
const char *aftrun_dir(void);
const char *aftrun_tmp(const char *name);
/* removes the directory and what is in it (for a group teardown): 0 */
int aftrun_cleanup(void **state);

/* a file's tensors as float32 arrays, with the names, ndims and shapes
 * aft_api_layer_new takes */
typedef struct {
    size_t n;
    char **names;
    float **data;
    size_t *ndims;
    size_t **shapes;
} aftrun_arrays;

/* the tensors of a .safetensors or .npz (every dtype converted), and of a
 * .npy (one, named "x"); fails the test when the file cannot be read */
void aftrun_arrays_read(aftrun_arrays *a, const char *path);
void aftrun_arrays_free(aftrun_arrays *a);
/* tensor `name` of a (NULL when absent) */
const float *aftrun_array(const aftrun_arrays *a, const char *name);

/* A case of testdata/torch/: its weights (weights.safetensors) and input
 * (x.npy) as arrays, x's B, T (a grid's H * W) and D, and its arguments
 * (args.txt) as aft's words and as the binding's options string
 * ("--variant local --window 4 --causal" as "variant=local window=4
 * causal=1") */
typedef struct {
    char dir[512];
    aftrun_arrays w, x;
    size_t B, T, D;
    size_t argc;
    char words[16][64];
    const char *argv[17];   /* words, NULL-terminated */
    char options[512];
} aftrun_case;
void aftrun_case_read(aftrun_case *c, const char *name);
void aftrun_case_free(aftrun_case *c);
/* the case's file name (in a rotating set of buffers) */
const char *aftrun_case_file(const aftrun_case *c, const char *file);

/* the bytes of two files are the same (fails the test naming them if not) */
void aftrun_same_files(const char *a, const char *b);
/* n floats, bit for bit, against the data of the .npy at path (float32,
 * nelem n) */
void aftrun_same_npy(const float *x, size_t n, const char *path);

#endif
