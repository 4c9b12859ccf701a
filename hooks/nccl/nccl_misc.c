/* NCCL API: results, error strings, version, data types. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "nccl/nccl_internal.h"
#include "status.h"

ncclResult_t dshim_nccl_result(dshim_status_t st)
{
    switch (st) {
    case DSHIM_OK: return ncclSuccess;
    case DSHIM_INPROGRESS: return ncclInProgress;
    case DSHIM_ERR_INVALID: return ncclInvalidArgument;
    case DSHIM_ERR_NOMEM:
    case DSHIM_ERR_SYSTEM:
    case DSHIM_ERR_PROTOCOL: return ncclSystemError;
    /* a peer that died, closed, timed out or aborted: NCCL calls all of
     * these remote errors, and PyTorch's watchdog tears down on them */
    case DSHIM_ERR_TIMEOUT:
    case DSHIM_ERR_PEER:
    case DSHIM_ERR_ABORTED: return ncclRemoteError;
    case DSHIM_ERR_MISMATCH:
    case DSHIM_ERR_UNSUPPORTED: return ncclInvalidUsage;
    case DSHIM_ERR_INTERNAL: return ncclInternalError;
    }
    return ncclInternalError;
}

static dshim_status_t status_of(ncclResult_t res)
{
    switch (res) {
    case ncclInvalidArgument: return DSHIM_ERR_INVALID;
    case ncclInvalidUsage: return DSHIM_ERR_UNSUPPORTED;
    case ncclSystemError: return DSHIM_ERR_SYSTEM;
    case ncclRemoteError: return DSHIM_ERR_PEER;
    case ncclUnhandledCudaError: return DSHIM_ERR_SYSTEM;
    default: return DSHIM_ERR_INTERNAL;
    }
}

ncclResult_t dshim_nccl_fail(ncclResult_t res, const char *call, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    dshim_error(status_of(res), "%s: %s", call, msg);
    return res;
}

ncclResult_t dshim_nccl_from_dshim(dshim_status_t st, const char *call)
{
    if (st >= 0) {
        return dshim_nccl_result(st);
    }
    /* keep dshim's message (it names ranks and peers), prefixed by the call */
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s: %s", call, dshim_last_error());
    dshim_error_set_raw(msg);
    return dshim_nccl_result(st);
}

int dshim_nccl_dtype(ncclDataType_t t, dshim_dtype_t *out)
{
    /* NCCL orders bfloat16 after the IEEE types, dshim next to float16 */
    static const dshim_dtype_t map[ncclNumTypes] = {
        [ncclInt8] = DSHIM_INT8,         [ncclUint8] = DSHIM_UINT8,        [ncclInt32] = DSHIM_INT32,
        [ncclUint32] = DSHIM_UINT32,     [ncclInt64] = DSHIM_INT64,        [ncclUint64] = DSHIM_UINT64,
        [ncclFloat16] = DSHIM_FLOAT16,   [ncclFloat32] = DSHIM_FLOAT32,    [ncclFloat64] = DSHIM_FLOAT64,
        [ncclBfloat16] = DSHIM_BFLOAT16, [ncclFloat8e4m3] = DSHIM_FLOAT8_E4M3,
        [ncclFloat8e5m2] = DSHIM_FLOAT8_E5M2,
    };
    if ((unsigned)t >= (unsigned)ncclNumTypes) {
        return -1;
    }
    *out = map[t];
    return 0;
}

size_t dshim_nccl_dtype_size(ncclDataType_t t)
{
    dshim_dtype_t d;
    return dshim_nccl_dtype(t, &d) == 0 ? dshim_dtype_size(d) : 0;
}

DSHIM_NCCL_EXPORT ncclResult_t ncclGetVersion(int *version)
{
    if (!version) {
        return dshim_nccl_fail(ncclInvalidArgument, "ncclGetVersion", "version is NULL");
    }
    /* the API level implemented: that of the nccl.h these hooks are built
     * against (frameworks compare it with the header they were built with) */
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclGetVersion);

DSHIM_NCCL_EXPORT const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (dshim: see the log line above)";
    case ncclSystemError: return "unhandled system error (dshim: see the log line above)";
    case ncclInternalError: return "internal error - please report this issue to the dshim developers";
    case ncclInvalidArgument: return "invalid argument (dshim: see the log line above)";
    case ncclInvalidUsage: return "invalid usage (dshim: see the log line above)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}
DSHIM_NCCL_ALIAS(ncclGetErrorString);

DSHIM_NCCL_EXPORT const char *ncclGetLastError(ncclComm_t comm)
{
    /* NCCL keeps one last-error text per process; dshim's is per thread,
     * and a communicator's sticky error takes precedence when there is one */
    static __thread char buf[1024];
    if (comm && dshim_nccl_comm_valid(comm) && comm->dc &&
        dshim_comm_get_error(comm->dc, buf, sizeof(buf)) != DSHIM_OK) {
        return buf;
    }
    return dshim_last_error();
}
DSHIM_NCCL_ALIAS(ncclGetLastError);

/* deprecated in nccl.h, still exported by NCCL: defined here too */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
DSHIM_NCCL_EXPORT void ncclResetDebugInit(void)
{
    /* dshim's logging is configured by DSHIM_DEBUG once per process */
}
DSHIM_NCCL_ALIAS(ncclResetDebugInit);
#pragma GCC diagnostic pop
