/* dispatch.c - the kernels' entry points for the code compiled for the
 * baseline: each calls the same function of the level in use. The
 * declarations the headers give (table.h includes them) check each
 * definition's parameters. */
#include "table.h"

#define AFT_ENTRY(type, name, params, args) \
    type name params                        \
    {                                       \
        return aft_kernels_now()->name args; \
    }
#define AFT_ENTRY_VOID(name, params, args) \
    void name params                       \
    {                                      \
        aft_kernels_now()->name args;      \
    }
#include "entries.h"
