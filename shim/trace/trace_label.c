/* The framework call behind the next operation of this thread
 * (dshim_trace_label in dshim.h): a thread-local copy, taken by the next
 * dshim_trace_queued.  Thread-local because hooks label from the thread
 * that submits (torch's Python thread, DDP's autograd thread, MXNet's
 * engine threads), and a label must not leak to another thread's op. */
#include <string.h>

#include "trace_impl.h"

static __thread char next_label[DSHIM_TRACE_LABEL_LEN];

DSHIM_EXPORT void dshim_trace_label(const char *label)
{
    if (!label) {
        next_label[0] = 0;
        return;
    }
    size_t n = strnlen(label, DSHIM_TRACE_LABEL_LEN - 1);
    memcpy(next_label, label, n);
    next_label[n] = 0;
}

void dshim_trace_take_label(char out[DSHIM_TRACE_LABEL_LEN])
{
    memcpy(out, next_label, DSHIM_TRACE_LABEL_LEN);
    next_label[0] = 0;
}
