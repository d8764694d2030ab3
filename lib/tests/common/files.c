/* files.c - what the lib tests share about files (files.h) */
#include "files.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <unistd.h>

const char *files_testdata(void)
{
    const char *d = getenv("AFT_TESTDATA");
    return d && *d ? d : "testdata";
}

const char *files_fixture(const char *room, const char *name)
{
    static char bufs[4][1024];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, sizeof bufs[0], "%s/%s/%s", files_testdata(), room, name);
    return b;
}

unsigned char *files_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

static char tmp_dir[64];

int files_tmpdir_make(const char *template)
{
    snprintf(tmp_dir, sizeof tmp_dir, "%s", template);
    return mkdtemp(tmp_dir) ? 0 : -1;
}

const char *files_tmpdir(void)
{
    return tmp_dir;
}

const char *files_tmp(const char *name)
{
    static char bufs[4][512];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, sizeof bufs[0], "%s/%s", tmp_dir, name);
    return b;
}

int files_tmpdir_remove(void)
{
    DIR *d = opendir(tmp_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(files_tmp(e->d_name));
        closedir(d);
    }
    return rmdir(tmp_dir);
}
