/* test_so.c - lib/libaft.so as a binding loads it (dlopen, dlsym):
 *  - it loads with every symbol bound (RTLD_NOW: its libraries found);
 *  - its soname is libaft.so.AFT_API_VERSION;
 *  - every entry point of the binding interface is there, and
 *    aft_api_version through it is AFT_API_VERSION;
 *  - the library's internal names and the kernels' per-level copies are
 *    not exported (the version script);
 *  - a layer made and run through the .so gives what the static library
 *    linked into this test gives.
 * The library is $AFT_TESTDATA/../lib/libaft.so (make test: the tree's). */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "aft.h"
#include "aftrun.h"
#include "files.h"

static void *so;
static char so_path[1024];

/* a run that built elsewhere (make test-asan builds into its own
 * directory) may not have the tree's .so: skip rather than build it */
static int setup(void **state)
{
    (void)state;
    snprintf(so_path, sizeof so_path, "%s/../lib/libaft.so", files_testdata());
    if (access(so_path, F_OK) != 0) return 0;
    so = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
    if (!so) fprintf(stderr, "dlopen %s: %s\n", so_path, dlerror());
    return so ? 0 : -1;
}

static void need_so(void)
{
    if (so) return;
    print_message("skipped: %s is not built (make all)\n", so_path);
    skip();
}

static int teardown(void **state)
{
    (void)state;
    if (so) dlclose(so);
    return aftrun_cleanup(state);
}

static void test_soname(void **state)
{
    (void)state;
    need_so();
    char cmd[1200], line[512], want[64];
    snprintf(cmd, sizeof cmd, "readelf -d '%s'", so_path);
    snprintf(want, sizeof want, "Library soname: [libaft.so.%d]", AFT_API_VERSION);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int found = 0;
    while (fgets(line, sizeof line, p)) found |= strstr(line, want) != NULL;
    assert_int_equal(pclose(p), 0);
    if (!found) fail_msg("%s: no '%s'", so_path, want);
}

static void test_exports(void **state)
{
    (void)state;
    need_so();
    static const char *const api[] = {
        "aft_api_version", "aft_api_file_read", "aft_api_file_free", "aft_api_file_count", "aft_api_file_tensor",
        "aft_api_file_copy", "aft_api_file_metadata_count", "aft_api_file_metadata", "aft_api_file_write",
        "aft_api_layer_new", "aft_api_layer_free", "aft_api_layer_dims", "aft_api_layer_forward",
        "aft_api_layer_grad_count", "aft_api_layer_grad_info", "aft_api_layer_backward", "aft_api_state_new",
        "aft_api_state_free", "aft_api_state_step", "aft_api_state_position", "aft_api_state_save",
        "aft_api_state_load", "aft_api_op_forward", "aft_api_op_backward", "aft_api_model_open",
        "aft_api_model_free", "aft_api_model_dims", "aft_api_model_logits", "aft_api_model_encode",
        "aft_api_model_token", "aft_api_model_generate",
        /* and the rest of aft.h, e.g. */
        "aft_layer_forward", "aft_op_backward", "aft_npy_read", "aft_st_open", "aft_level_use"};
    for (size_t i = 0; i < sizeof api / sizeof api[0]; i++)
        if (!dlsym(so, api[i])) fail_msg("%s does not export %s", so_path, api[i]);
    int (*version)(void) = (int (*)(void))dlsym(so, "aft_api_version");
    assert_int_equal(version(), AFT_API_VERSION);
    static const char *const hidden[] = {"aft_alloc_array", "aft_st_borrow_f32", "aft_shown", "aft_linear_apply",
                                         "aft_op_forward_base", "aft_op_forward_avx2", "aft_op_forward_avx512",
                                         "aft_op_forward_fixed", "api_options_parse"};
    for (size_t i = 0; i < sizeof hidden / sizeof hidden[0]; i++)
        if (dlsym(so, hidden[i])) fail_msg("%s exports %s", so_path, hidden[i]);
}

typedef aft_status (*layer_new_fn)(aft_api_layer **, size_t, const char *const *, const float *const *,
                                   const size_t *, const size_t *const *, const char *, aft_error *);
typedef aft_status (*layer_forward_fn)(aft_api_layer *, float *, const float *, size_t, size_t, aft_error *);
typedef void (*layer_free_fn)(aft_api_layer *);

static void test_layer(void **state)
{
    (void)state;
    need_so();
    layer_new_fn lnew = (layer_new_fn)dlsym(so, "aft_api_layer_new");
    layer_forward_fn lfwd = (layer_forward_fn)dlsym(so, "aft_api_layer_forward");
    layer_free_fn lfree = (layer_free_fn)dlsym(so, "aft_api_layer_free");
    aftrun_case c;
    aftrun_case_read(&c, "labml_local");
    aft_api_layer *a, *b;
    aft_error err;
    const char *const *names = (const char *const *)c.w.names;
    const float *const *data = (const float *const *)c.w.data;
    const size_t *const *shapes = (const size_t *const *)c.w.shapes;
    assert_int_equal(lnew(&a, c.w.n, names, data, c.w.ndims, shapes, c.options, &err), AFT_OK);
    assert_int_equal(aft_api_layer_new(&b, c.w.n, names, data, c.w.ndims, shapes, c.options, &err), AFT_OK);
    size_t n = c.B * c.T * c.D;
    float *ya = malloc(n * sizeof(float)), *yb = malloc(n * sizeof(float));
    assert_int_equal(lfwd(a, ya, c.x.data[0], c.B, c.T, &err), AFT_OK);
    assert_int_equal(aft_api_layer_forward(b, yb, c.x.data[0], c.B, c.T, &err), AFT_OK);
    assert_memory_equal(ya, yb, n * sizeof(float));
    /* an error's message comes back through the .so */
    assert_int_equal(lfwd(a, ya, NULL, c.B, c.T, &err), AFT_ERR_ARG);
    assert_string_equal(err.msg, "missing (NULL) x");
    lfree(a);
    aft_api_layer_free(b);
    free(ya), free(yb);
    aftrun_case_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_soname),
        cmocka_unit_test(test_exports),
        cmocka_unit_test(test_layer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
