/* test_detect.c - telling the formats apart (lib/io/detect.c): by their
 * first bytes, a file by its bytes first and its name when they say
 * nothing; and each reader, handed another format, says what it got. */
#include <dirent.h>
#include <math.h>
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
#include "files.h"

static const char *fixture(const char *name)
{
    return files_fixture("npz", name);
}

static int setup(void **state)
{
    return files_tmpdir_make("/tmp/aft_test_detect.XXXXXX");
}

static int teardown(void **state)
{
    return files_tmpdir_remove();
}

static void test_formats(void **state)
{
    assert_int_equal(aft_format_detect("\x93NUMPY\x01\x00", 8), AFT_FORMAT_NPY);
    assert_int_equal(aft_format_detect("PK\x03\x04", 4), AFT_FORMAT_NPZ);
    assert_int_equal(aft_format_detect("PK\x05\x06", 4), AFT_FORMAT_NPZ);
    assert_int_equal(aft_format_detect("PK\x01\x02", 4), AFT_FORMAT_UNKNOWN);
    assert_int_equal(aft_format_detect("\x02\0\0\0\0\0\0\0{}", 10), AFT_FORMAT_SAFETENSORS);
    assert_int_equal(aft_format_detect("\x10\0\0\0\0\0\0\0  \n{", 12), AFT_FORMAT_SAFETENSORS);
    assert_int_equal(aft_format_detect("\x02\0\0\0\0\0\0\0[]", 10), AFT_FORMAT_UNKNOWN);
    assert_int_equal(aft_format_detect("\xff\xff\xff\xff\xff\xff\xff\xff{", 9), AFT_FORMAT_UNKNOWN);
    assert_int_equal(aft_format_detect("hello, world", 12), AFT_FORMAT_UNKNOWN);
    assert_int_equal(aft_format_detect("", 0), AFT_FORMAT_UNKNOWN);
    assert_int_equal(aft_format_detect(NULL, 5), AFT_FORMAT_UNKNOWN);
    assert_string_equal(aft_format_name(AFT_FORMAT_NPZ), "npz");
    assert_string_equal(aft_format_name(AFT_FORMAT_UNKNOWN), "unknown");

    /* files: the bytes first, the name when they say nothing */
    aft_format fmt;
    aft_error err = {{0}};
    assert_int_equal(aft_file_format(fixture("savez.npz"), &fmt, &err), AFT_OK);
    assert_int_equal(fmt, AFT_FORMAT_NPZ);
    FILE *fp = fopen(files_tmp("looks.npy"), "wb");
    fwrite("PK\x05\x06", 1, 4, fp);
    fclose(fp);
    assert_int_equal(aft_file_format(files_tmp("looks.npy"), &fmt, &err), AFT_OK);
    assert_int_equal(fmt, AFT_FORMAT_NPZ);
    fp = fopen(files_tmp("text.npz"), "wb");
    fputs("hello", fp);
    fclose(fp);
    assert_int_equal(aft_file_format(files_tmp("text.npz"), &fmt, &err), AFT_OK);
    assert_int_equal(fmt, AFT_FORMAT_NPZ);
    fp = fopen(files_tmp("text.bin"), "wb");
    fputs("hello", fp);
    fclose(fp);
    assert_int_equal(aft_file_format(files_tmp("text.bin"), &fmt, &err), AFT_ERR_FORMAT);
    assert_string_equal(err.msg, "not a .npy, .npz or .safetensors file");
    assert_int_equal(aft_file_format(files_tmp("none.bin"), &fmt, &err), AFT_ERR_IO);
    assert_int_equal(aft_file_format("-", &fmt, &err), AFT_OK);
    assert_int_equal(fmt, AFT_FORMAT_UNKNOWN);
    assert_int_equal(aft_file_format("/dev/null", &fmt, &err), AFT_OK);   /* a device: not read */
    assert_int_equal(fmt, AFT_FORMAT_UNKNOWN);

    /* each reader, handed the other format, says what it got */
    char p[1024];
    snprintf(p, sizeof p, "%s/npy/v1_C_le_f4.npy", files_testdata());
    aft_st_file *f = (aft_st_file *)1;
    assert_int_equal(aft_st_open(p, &f, &err), AFT_ERR_FORMAT);
    assert_string_equal(err.msg, "not a .safetensors or .npz file: this is a .npy file (one array)");
    aft_tensor t;
    assert_int_equal(aft_npy_read(fixture("savez.npz"), &t, NULL, &err), AFT_ERR_FORMAT);
    assert_string_equal(err.msg, "not a .npy file: this is a .npz archive (a zip of .npy files)");
    snprintf(p, sizeof p, "%s/st/dtypes.safetensors", files_testdata());
    assert_int_equal(aft_npy_read(p, &t, NULL, &err), AFT_ERR_FORMAT);
    assert_string_equal(err.msg, "not a .npy file: this is a .safetensors file");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
