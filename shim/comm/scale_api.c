/* dshim_scale_mul: the local half of a pre-multiplied sum (torch's
 * PREMUL_SUM, NCCL's ncclRedOpCreatePreMulSum), for the NCCL hook and the
 * torch plugin alike: the multiplication is the communicator's reduce ops'
 * scale_mul, so a factor is applied one way everywhere. */
#include "comm.h"
#include "dshim.h"
#include "status.h"

DSHIM_EXPORT dshim_status_t dshim_scale_mul(dshim_comm_t *comm, void *dst, const void *src, size_t count,
                                            dshim_dtype_t dtype, const void *scalar)
{
    if (comm == NULL || scalar == NULL) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_scale_mul: %s is NULL", comm == NULL ? "comm" : "scalar");
    }
    if ((unsigned)dtype >= DSHIM_DTYPE_COUNT) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_scale_mul: dtype %d is not a dshim_dtype_t", (int)dtype);
    }
    if (count > 0 && (dst == NULL || src == NULL)) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_scale_mul: %zu elements but %s is NULL", count,
                           dst == NULL ? "dst" : "src");
    }
    comm->reduce->scale_mul(dst, src, count, dtype, scalar);
    return DSHIM_OK;
}
