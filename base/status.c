/* Thread-local last-error message and status names. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "status.h"

static __thread char last_error[1024];

static dshim_status_t record(int log, dshim_status_t status, const char *fmt, va_list ap)
{
    /* format into a temporary first: callers often wrap the previous
     * message, passing dshim_last_error() itself as an argument */
    char tmp[sizeof(last_error)];
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    memcpy(last_error, tmp, sizeof(tmp));
    if (log) {
        DSHIM_WARN("%s", last_error);
    }
    if (status < 0 && dshim_config()->abort_on_error) {
        DSHIM_WARN("DSHIM_ABORT_ON_ERROR=1: aborting at the first error");
        abort();
    }
    return status;
}

dshim_status_t dshim_error(dshim_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(1, status, fmt, ap);
    va_end(ap);
    return status;
}

dshim_status_t dshim_error_quiet(dshim_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(0, status, fmt, ap);
    va_end(ap);
    return status;
}

void dshim_error_set_raw(const char *msg)
{
    if (msg == last_error) {
        return;
    }
    snprintf(last_error, sizeof(last_error), "%s", msg);
}

DSHIM_EXPORT const char *dshim_last_error(void)
{
    return last_error;
}

DSHIM_EXPORT const char *dshim_status_string(dshim_status_t status)
{
    switch (status) {
    case DSHIM_OK: return "success";
    case DSHIM_INPROGRESS: return "in progress";
    case DSHIM_ERR_INVALID: return "invalid argument or configuration";
    case DSHIM_ERR_NOMEM: return "out of memory";
    case DSHIM_ERR_SYSTEM: return "system call failed";
    case DSHIM_ERR_TIMEOUT: return "timed out";
    case DSHIM_ERR_PEER: return "peer failed";
    case DSHIM_ERR_MISMATCH: return "mismatched collectives across ranks";
    case DSHIM_ERR_PROTOCOL: return "protocol error (garbage or wrong token)";
    case DSHIM_ERR_ABORTED: return "communicator aborted";
    case DSHIM_ERR_UNSUPPORTED: return "unsupported";
    case DSHIM_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}
