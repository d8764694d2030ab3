/* cpu-level LEVEL: exit 0 when this CPU runs code built with -march=LEVEL
 * (x86-64-v2, x86-64-v3, x86-64-v4), 1 when it does not, 2 for an unknown
 * LEVEL. Built without -march, so it runs anywhere it is asked. Used by
 * mk/widths.mk. */
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    __builtin_cpu_init();
    /* __builtin_cpu_supports takes a string literal only */
    if (strcmp(argv[1], "x86-64-v2") == 0) return !__builtin_cpu_supports("x86-64-v2");
    if (strcmp(argv[1], "x86-64-v3") == 0) return !__builtin_cpu_supports("x86-64-v3");
    if (strcmp(argv[1], "x86-64-v4") == 0) return !__builtin_cpu_supports("x86-64-v4");
    return 2;
}
