/* table.c - this level's table of entry points. Compiled once per level
 * with the kernels; the build renames this table, as it renames every
 * global name the level's code defines, to aft_kernels_LEVEL (levels.c
 * finds them under those names), and the names it refers to to the same
 * level's copies. */
#include "table.h"

const aft_kernel_table aft_kernels = {
#define AFT_ENTRY(type, name, params, args) .name = name,
#define AFT_ENTRY_VOID(name, params, args) .name = name,
#include "entries.h"
};
