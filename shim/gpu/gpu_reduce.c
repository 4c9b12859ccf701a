/* Device reductions through the CUDA reduce backend (see gpu_reduce.h). */
#include "cuda_loader.h"
#include "gpu_reduce.h"
#include "status.h"

static const dshim_reduce_ops_t *kernels(void)
{
    return dshim_reduce_cuda_load();
}

int dshim_gpu_kernels_loaded(void)
{
    return kernels() != NULL;
}

int dshim_gpu_supports(dshim_dtype_t dtype, dshim_redop_t op)
{
    const dshim_reduce_ops_t *k = kernels();
    return k && k->supports(DSHIM_MEM_CUDA, dtype, op == DSHIM_AVG ? DSHIM_SUM : op);
}

dshim_status_t dshim_gpu_reduce(void *dst, const void *a, const void *b, size_t count, dshim_dtype_t dtype,
                                dshim_redop_t op, void *stream)
{
    const dshim_reduce_ops_t *k = kernels();
    if (!k) {
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "no CUDA reduction kernels (%s not loaded)", "libdshim-cuda.so");
    }
    return k->reduce(dst, a, b, count, dtype, op, stream);
}

dshim_status_t dshim_gpu_scale_div(void *buf, size_t count, dshim_dtype_t dtype, int divisor, void *stream)
{
    const dshim_reduce_ops_t *k = kernels();
    if (!k) {
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "no CUDA reduction kernels (%s not loaded)", "libdshim-cuda.so");
    }
    return k->scale_div(buf, count, dtype, divisor, stream);
}

void *dshim_gpu_kernels_symbol(const char *name)
{
    return dshim_reduce_cuda_symbol(name);
}
