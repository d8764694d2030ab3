/* levels.c - every test program runs the kernels at the level AFT_KERNELS
 * names, as aft does (make test-levels runs the tests at each level this
 * CPU has); unset, at the level the library picks. */
#include "aft.h"

#include <stdio.h>
#include <stdlib.h>

__attribute__((constructor)) static void choose_level(void)
{
    const char *want = getenv("AFT_KERNELS");
    if (!want || !*want) return;
    aft_error err = {{0}};
    if (aft_level_use(want, &err) != AFT_OK) {
        fprintf(stderr, "AFT_KERNELS=%s: %s\n", want, err.msg);
        exit(1);
    }
}
