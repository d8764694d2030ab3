/* layer.h - the layer's chunked paths, for lib/ and its tests. */
#ifndef AFT_LAYER_H
#define AFT_LAYER_H

#include "internal.h"

/* rows per chunk of the layer's chunked paths with aft's own projection
 * kernel (4 times as many with OpenBLAS's) */
#ifndef AFT_LAYER_PIPE_ROWS
#define AFT_LAYER_PIPE_ROWS 96
#endif
#define AFT_LAYER_CHUNK_AUTO SIZE_MAX
/* aft_layer_forward_timed with chunks of `chunk` rows for the chunked
 * paths (0: never chunked; AFT_LAYER_CHUNK_AUTO: the sizes above);
 * *streamed_out (when not NULL) = 1 when such a path produced y. Tests
 * pass small chunks. */
aft_status aft_layer_forward_chunked(float *y, const float *x, const aft_params *p,
                                     const aft_config *cfg, size_t B, size_t T, size_t chunk,
                                     aft_layer_times *times, int *streamed_out, aft_error *err);

#endif /* AFT_LAYER_H */
