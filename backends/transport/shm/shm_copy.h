/*
 * Copying a received message out of a shared-memory ring into the user's
 * buffer when that buffer is too large to stay in cache.
 */
#ifndef DSHIM_SHM_COPY_H
#define DSHIM_SHM_COPY_H

#include <stddef.h>

/* memcpy(dst, src, n) with non-temporal stores where the CPU has them.  An
 * ordinary store to a line that is not cached first reads the line from
 * memory (read-for-ownership), so copying a message of tens of MB costs two
 * memory transfers per byte written; a streaming store writes the line
 * without reading it.  Worth it only when dst will not be read again soon
 * from cache anyway: the caller decides by message size.  Ends with a store
 * fence, so the bytes are ordered before whatever the caller publishes next. */
void dshim_copy_streaming(void *dst, const void *src, size_t n);

#endif
