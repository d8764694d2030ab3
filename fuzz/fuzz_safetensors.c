/* fuzz_safetensors.c - libFuzzer target for the .safetensors reader,
 * aft_st_open_mem, and every query on the handle it returns.
 *
 * A refusal must come with a proper one-line message and no handle. (An
 * accepted zip, a .npz, is left to fuzz_npz.) An accepted file must keep the reader's promises (lib/aft.h and the format):
 * tensors in file order tile the data buffer exactly, each inside the input
 * and borrowed from it (not copied); every name is found again by
 * aft_st_find; metadata pairs are strings; indexes past the end give NULL.
 * Every tensor's bytes are read, and small ones (up to 1 MiB) converted with
 * aft_tensor_to_f32. */
#include <stdint.h>
#include <string.h>

#include "aft.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    aft_st_file *f = (aft_st_file *)1;   /* must be set to NULL on failure */
    aft_error err;
    memset(&err, 0, sizeof err);
    if (aft_st_open_mem(data, size, &f, &err) != AFT_OK) {
        fuzz_check_error(&err);
        FUZZ_REQUIRE(f == NULL);
        return 0;
    }
    FUZZ_REQUIRE(f != NULL);
    if (strcmp(aft_st_format(f), "npz") == 0) {
        /* a zip archive, which aft_st_open_mem reads too: fuzz_npz checks
         * it in depth; here only that every tensor is sound */
        for (size_t i = 0; i < aft_st_count(f); i++) fuzz_check_tensor(aft_st_get(f, i, NULL));
        aft_st_close(f);
        return 0;
    }
    FUZZ_REQUIRE(size >= 8);

    /* the data buffer follows the 8-byte size and the header */
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
    FUZZ_REQUIRE(hlen <= size - 8);
    const uint8_t *pos = data + 8 + hlen, *end = data + size;

    size_t n = aft_st_count(f);
    for (size_t i = 0; i < n; i++) {
        const char *name = NULL;
        const aft_tensor *t = aft_st_get(f, i, &name);
        FUZZ_REQUIRE(t != NULL && name != NULL);
        FUZZ_REQUIRE(t->owned == NULL);
        /* file order: each tensor starts where the previous one ended */
        FUZZ_REQUIRE((const uint8_t *)t->data == pos);
        FUZZ_REQUIRE(t->nbytes <= (size_t)(end - pos));
        pos += t->nbytes;
        fuzz_check_tensor(t);
        FUZZ_REQUIRE(aft_st_find(f, name) == t);
    }
    FUZZ_REQUIRE(pos == end);   /* no trailing bytes */
    const char *name = "x";
    FUZZ_REQUIRE(aft_st_get(f, n, &name) == NULL && name == NULL);

    size_t m = aft_st_metadata_count(f);
    for (size_t i = 0; i < m; i++) {
        const char *key = NULL, *value = NULL;
        aft_st_metadata(f, i, &key, &value);
        FUZZ_REQUIRE(key != NULL && value != NULL);
        /* decoded from the header, so never longer than the input */
        FUZZ_REQUIRE(strlen(key) + strlen(value) < size);
    }
    const char *key = "x", *value = "x";
    aft_st_metadata(f, m, &key, &value);
    FUZZ_REQUIRE(key == NULL && value == NULL);

    aft_st_close(f);
    return 0;
}
