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

#endif
