/* table.h - one level's kernels, as a table of its entry points
 * (entries.h). Each level's table.c fills one; dispatch.c calls through
 * the table of the level in use. */
#ifndef AFT_CPU_TABLE_H
#define AFT_CPU_TABLE_H

#include "layer_chunks.h"
#include "nn/bf16.h"
#include "nn/nn.h"
#include "ops/kernels.h"
#include "ops/op.h"

typedef struct {
#define AFT_ENTRY(type, name, params, args) type(*name) params;
#define AFT_ENTRY_VOID(name, params, args) void(*name) params;
#include "entries.h"
#undef AFT_ENTRY
#undef AFT_ENTRY_VOID
} aft_kernel_table;

/* the table of the level in use, chosen now if none is (levels.c) */
const aft_kernel_table *aft_kernels_now(void);

#endif /* AFT_CPU_TABLE_H */
