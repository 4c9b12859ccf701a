/* Streaming copy out of a shared-memory ring (see shm_copy.h). */
#include "shm_copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h> /* SSE2: part of x86-64 itself, no dispatch needed */

void dshim_copy_streaming(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (n < head + 64) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; d += 64, s += 64, n -= 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i x1 = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        __m128i x3 = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, x0);
        _mm_stream_si128((__m128i *)(void *)(d + 16), x1);
        _mm_stream_si128((__m128i *)(void *)(d + 32), x2);
        _mm_stream_si128((__m128i *)(void *)(d + 48), x3);
    }
    memcpy(d, s, n);
    _mm_sfence();
}

#else

void dshim_copy_streaming(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}

#endif
