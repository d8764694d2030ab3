/* make_state_seeds.c - writes the seeds of fuzz_state: states of each layer
 * of state_layer.h at a few positions (`make fuzz-state-seeds`). */
#include <stdio.h>

#include "aft.h"
#include "state_layer.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_state_seeds DIR\n");
        return 2;
    }
    const size_t steps[] = {1, 2, 5};
    for (int i = 0; i < SL_N; i++) {
        state_layer L;
        state_layer_make(&L, i);
        aft_state *s;
        aft_error err;
        if (aft_state_new(&s, &L.p, &L.cfg, SL_B, &err) != AFT_OK) return fprintf(stderr, "%s\n", err.msg), 1;
        float x[SL_B * 5 * SL_D], y[SL_B * 5 * SL_D];
        for (size_t j = 0; j < sizeof x / sizeof x[0]; j++) x[j] = aft_seeded_bias(3, 1.0f, j, 0);
        for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
            if (aft_state_step(s, y, x, steps[k], &err) != AFT_OK) return fprintf(stderr, "%s\n", err.msg), 1;
            char path[4096];
            snprintf(path, sizeof path, "%s/layer%d_pos%zu.safetensors", argv[1], i, aft_state_position(s));
            if (aft_state_save(s, path, &err) != AFT_OK) return fprintf(stderr, "%s\n", err.msg), 1;
        }
        aft_state_free(s);
    }
    return 0;
}
