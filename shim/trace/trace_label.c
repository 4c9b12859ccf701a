/* The framework call behind the next operation of this thread
 * (dshim_trace_label in dshim.h): a thread-local copy, taken by the next
 * dshim_trace_queued.  Thread-local because hooks label from the thread
 * that submits (torch's Python thread, DDP's autograd thread, MXNet's
 * engine threads), and a label must not leak to another thread's op.
 *
 * A process that never labels (C programs, the NCCL API without a
 * framework) takes no label at all: in a shared library every access to
 * the thread-local copy is a call (__tls_get_addr), and that call with the
 * 64-byte copy and clear was 2.6 % of a 2-rank barrier (docs/benchmarks.md,
 * "The flight recorder on the per-op path").  A thread that labels sees its
 * own store to `labels_set` before its next operation takes the label. */
#include <string.h>

#include "trace_impl.h"

static __thread char next_label[DSHIM_TRACE_LABEL_LEN];
static int labels_set; /* 1 once any thread labelled */

DSHIM_EXPORT void dshim_trace_label(const char *label)
{
    if (!label || !label[0]) {
        if (__atomic_load_n(&labels_set, __ATOMIC_RELAXED)) {
            next_label[0] = 0;
        }
        return;
    }
    __atomic_store_n(&labels_set, 1, __ATOMIC_RELAXED);
    size_t n = strnlen(label, DSHIM_TRACE_LABEL_LEN - 1);
    memcpy(next_label, label, n);
    next_label[n] = 0;
}

void dshim_trace_take_label(char out[DSHIM_TRACE_LABEL_LEN])
{
    if (!__atomic_load_n(&labels_set, __ATOMIC_RELAXED) || !next_label[0]) {
        out[0] = 0; /* readers stop at the first NUL: the rest may be an older label's */
        return;
    }
    memcpy(out, next_label, DSHIM_TRACE_LABEL_LEN);
    next_label[0] = 0;
}
