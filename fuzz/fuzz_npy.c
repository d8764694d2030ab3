/* fuzz_npy.c - libFuzzer target for the .npy reader, aft_npy_read_mem.
 *
 * Every input is parsed as a .npy image. A refusal must come with a proper
 * one-line message; an accepted array must agree with its own shape, end
 * exactly at the end of the input (the reader refuses trailing bytes), and
 * survive a round trip: written back with aft_npy_write_fp and read again,
 * it must give the same dtype, shape and bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aft.h"
#include "fuzz_check.h"

static void check_round_trip(const aft_tensor *t)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    FUZZ_REQUIRE(fp != NULL);
    aft_error err;
    aft_status st = aft_npy_write_fp(fp, t, &err);
    FUZZ_REQUIRE(fclose(fp) == 0);
    /* everything the reader accepts, the writer can write */
    FUZZ_REQUIRE(st == AFT_OK);

    aft_tensor back;
    st = aft_npy_read_mem(buf, len, &back, NULL, &err);
    FUZZ_REQUIRE(st == AFT_OK);
    FUZZ_REQUIRE(back.dtype == t->dtype && back.ndim == t->ndim);
    FUZZ_REQUIRE(memcmp(back.shape, t->shape, t->ndim * sizeof t->shape[0]) == 0);
    FUZZ_REQUIRE(back.nbytes == t->nbytes);
    FUZZ_REQUIRE(t->nbytes == 0 || memcmp(back.data, t->data, t->nbytes) == 0);
    aft_tensor_free(&back);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    aft_tensor t;
    aft_npy_info info;
    aft_error err;
    memset(&err, 0, sizeof err);
    if (aft_npy_read_mem(data, size, &t, &info, &err) != AFT_OK) {
        fuzz_check_error(&err);
        return 0;
    }
    fuzz_check_tensor(&t);
    FUZZ_REQUIRE(t.nbytes == 0 || t.owned != NULL);   /* the buffer was copied */
    FUZZ_REQUIRE(info.major >= 1 && info.major <= 3 && info.minor == 0);
    FUZZ_REQUIRE(info.data_offset <= size && size - info.data_offset == t.nbytes);
    FUZZ_REQUIRE(info.data_offset == (info.major == 1 ? 10u : 12u) + info.header_len);
    /* descr as decoded ("<f4", "f", "float32", ...); the byte order is the
     * one written, or '=' (native) / '|' (one byte) when none applies */
    FUZZ_REQUIRE(strlen(info.descr) >= 1 && strchr("<>|=", info.byteorder) && info.byteorder);
    FUZZ_REQUIRE(!(info.descr[0] == '<' || info.descr[0] == '>') || info.descr[0] == info.byteorder);
    check_round_trip(&t);
    aft_tensor_free(&t);
    return 0;
}
