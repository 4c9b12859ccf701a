/*
 * Loading the optional CUDA reduction backend (libdshim-cuda.so) at run time.
 * Compiled into the core on every machine; needs no CUDA headers.  Private to
 * shim/gpu: other modules reduce device memory through gpu_reduce.h (tests
 * may use the ops table directly).
 */
#ifndef DSHIM_CUDA_LOADER_H
#define DSHIM_CUDA_LOADER_H

#include "reduce/reduce.h"

/* The "cuda" reduce ops, or NULL (logged at INFO) when libdshim-cuda.so, the
 * CUDA runtime or a device is missing.  Loads once; thread-safe. */
const dshim_reduce_ops_t *dshim_reduce_cuda_load(void);

/* A symbol of the loaded libdshim-cuda.so (NULL when it is not loaded): how
 * tests reach its dshim_cuda_test_* helpers without linking CUDA. */
void *dshim_reduce_cuda_symbol(const char *name);

#endif
