/* fuzz_npz.c - libFuzzer target for the .npz reader: aft_st_open_mem_limit
 * on a zip archive, every query on the handle, and the archive written back
 * by the .npz writer and read again.
 *
 * A refusal must come with a proper one-line message and no handle. An
 * accepted archive must keep the reader's promises (lib/aft.h, lib/io/npz.c):
 * format "npz", no metadata; every tensor consistent with its shape and
 * fully readable; keys unique, found again by aft_st_find, never holding
 * '/', '\\' or ".."; a tensor that borrows (owned NULL) lies inside the
 * input; what the handle allocated stays within the bound. Written back with
 * aft_npz_writer (stored members), it must read back as the same tensors. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aft.h"
#include "fuzz_check.h"

#define LIMIT ((size_t)64 << 20)   /* the memory bound: a bigger member is refused */

/* writes f's tensors as a .npz into memory; returns the bytes (malloc'd) */
static char *write_back(const aft_st_file *f, size_t *len)
{
    char *buf = NULL;
    FILE *fp = open_memstream(&buf, len);
    FUZZ_REQUIRE(fp != NULL);
    aft_npz_writer *w = NULL;
    aft_error err;
    FUZZ_REQUIRE(aft_npz_writer_new(fp, &w, &err) == AFT_OK);
    for (size_t i = 0; i < aft_st_count(f); i++) {
        const char *name;
        const aft_tensor *t = aft_st_get(f, i, &name);
        char head[4096];
        size_t hn;
        FUZZ_REQUIRE(aft_npy_header(t, head, sizeof head, &hn, &err) == AFT_OK);
        uint32_t crc = aft_crc32(aft_crc32(0, head, hn), t->data, t->nbytes);
        FUZZ_REQUIRE(aft_npz_writer_begin(w, name, (uint64_t)hn + t->nbytes, crc, &err) == AFT_OK);
        FUZZ_REQUIRE(aft_npz_writer_write(w, head, hn, &err) == AFT_OK);
        FUZZ_REQUIRE(aft_npz_writer_write(w, t->data, t->nbytes, &err) == AFT_OK);
    }
    FUZZ_REQUIRE(aft_npz_writer_finish(w, &err) == AFT_OK);
    aft_npz_writer_free(w);
    FUZZ_REQUIRE(fclose(fp) == 0);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    aft_st_file *f = (aft_st_file *)1;   /* must be set to NULL on failure */
    aft_error err;
    memset(&err, 0, sizeof err);
    if (aft_st_open_mem_limit(data, size, LIMIT, &f, &err) != AFT_OK) {
        fuzz_check_error(&err);
        FUZZ_REQUIRE(f == NULL);
        return 0;
    }
    FUZZ_REQUIRE(f != NULL);
    if (strcmp(aft_st_format(f), "npz") != 0) {   /* a .safetensors: fuzz_safetensors's business */
        aft_st_close(f);
        return 0;
    }
    FUZZ_REQUIRE(aft_st_metadata_count(f) == 0);

    size_t n = aft_st_count(f), owned = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = NULL;
        const aft_tensor *t = aft_st_get(f, i, &name);
        FUZZ_REQUIRE(t != NULL && name != NULL && *name);
        FUZZ_REQUIRE(!strchr(name, '/') && !strchr(name, '\\') && !strstr(name, ".."));
        FUZZ_REQUIRE(strlen(name) < size);
        fuzz_check_tensor(t);
        FUZZ_REQUIRE(aft_st_find(f, name) == t);
        if (t->owned) {
            owned += t->nbytes;
        } else if (t->nbytes) {
            const uint8_t *p = t->data;
            FUZZ_REQUIRE(p >= data && p + t->nbytes <= data + size);
        }
    }
    FUZZ_REQUIRE(owned <= LIMIT);
    const char *name = "x";
    FUZZ_REQUIRE(aft_st_get(f, n, &name) == NULL && name == NULL);

    /* written back and read again: the same tensors */
    size_t len = 0;
    char *copy = write_back(f, &len);
    aft_st_file *g = NULL;
    FUZZ_REQUIRE(aft_st_open_mem(copy, len, &g, &err) == AFT_OK);
    FUZZ_REQUIRE(aft_st_count(g) == n);
    for (size_t i = 0; i < n; i++) {
        const char *na, *nb;
        const aft_tensor *a = aft_st_get(f, i, &na), *b = aft_st_get(g, i, &nb);
        FUZZ_REQUIRE(strcmp(na, nb) == 0);
        FUZZ_REQUIRE(a->dtype == b->dtype && a->ndim == b->ndim && a->nbytes == b->nbytes);
        FUZZ_REQUIRE(memcmp(a->shape, b->shape, a->ndim * sizeof a->shape[0]) == 0);
        FUZZ_REQUIRE(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
    }
    aft_st_close(g);
    free(copy);
    aft_st_close(f);
    return 0;
}
