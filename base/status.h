/* Error reporting: a thread-local last-error message plus the status code. */
#ifndef DSHIM_STATUS_H
#define DSHIM_STATUS_H

#include <stdarg.h>
#include "dshim.h"

/* Records a formatted one-line message as this thread's last error, logs it
 * at WARN, and returns `status` (so: `return dshim_error(ST, "...")`). */
dshim_status_t dshim_error(dshim_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Same, but without logging (the caller logs or the message is expected). */
dshim_status_t dshim_error_quiet(dshim_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void dshim_error_set_raw(const char *msg);

#define DSHIM_CHECK(call)                                                      \
    do {                                                                       \
        dshim_status_t dshim_check_st_ = (call);                               \
        if (dshim_check_st_ < 0) {                                             \
            DSHIM_TRACE("-> %d at %s:%d", (int)dshim_check_st_, __FILE__, __LINE__); \
            return dshim_check_st_;                                            \
        }                                                                      \
    } while (0)

#define DSHIM_CHECK_GOTO(call, st, label)                                      \
    do {                                                                       \
        (st) = (call);                                                         \
        if ((st) < 0) {                                                        \
            DSHIM_TRACE("-> %d at %s:%d", (int)(st), __FILE__, __LINE__);      \
            goto label;                                                        \
        }                                                                      \
    } while (0)

#include "log.h"
#endif
