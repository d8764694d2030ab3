/* files.h - what the lib tests share about files: the fixtures' folder
 * (testdata, or $AFT_TESTDATA), a fixture's path in it, and a whole file
 * read into memory. */
#ifndef AFT_TEST_FILES_H
#define AFT_TEST_FILES_H

#include <stddef.h>

/* $AFT_TESTDATA when set, else "testdata" (make test runs from the top) */
const char *files_testdata(void);
/* testdata/ROOM/NAME, in a rotating set of buffers so four can be live */
const char *files_fixture(const char *room, const char *name);
/* the whole file at path and a NUL after it, malloc'd; fails the test
 * when it cannot be read */
unsigned char *files_slurp(const char *path, size_t *len);

/* A temporary directory for the test program, made from template (mkdtemp's
 * "/tmp/NAME.XXXXXX", at most 63 characters): 0, or -1 when it cannot be
 * made. files_tmpdir() is its path; files_tmp(NAME) is NAME inside it, in a
 * rotating set of buffers so four can be live; files_tmpdir_remove()
 * removes the files in it and then it: 0, or -1 when rmdir fails. */
int files_tmpdir_make(const char *template);
const char *files_tmpdir(void);
const char *files_tmp(const char *name);
int files_tmpdir_remove(void);

#endif
