/* Test-only: exports dshim's 2-bit gradient compression (hidden inside libdshim) under
 * plain names for tests/mxnet/test_twobit_exact.py, which loads it with ctypes.  The test
 * builds it twice: linked with build/lib/libdshim_core.a (the objects dshim ships), and
 * with -DTWOBIT_CODEC_ONLY from shim/ps/ps_twobit.c at -O3 -march=native (wider vectors must
 * give the same bits). */
#include <stddef.h>
#include <stdint.h>

#include "ps_twobit.h"

#define TEST_EXPORT __attribute__((visibility("default")))

TEST_EXPORT size_t twobit_words(size_t n)
{
    return dshim_twobit_words(n);
}

TEST_EXPORT void twobit_quantize(const float *grad, float *residual, size_t n, float threshold,
                                 uint32_t *out)
{
    dshim_twobit_quantize(grad, residual, n, threshold, out);
}

TEST_EXPORT void twobit_dequantize(const uint32_t *in, size_t n, float threshold, float *out)
{
    dshim_twobit_dequantize(in, n, threshold, out);
}

#ifndef TWOBIT_CODEC_ONLY
#include "dshim.h"

TEST_EXPORT int twobit_parse(uint32_t num, const char *const *keys, const char *const *vals,
                             float *threshold, int *enabled)
{
    return dshim_twobit_parse(num, keys, vals, threshold, enabled);
}

TEST_EXPORT int twobit_encode_params(int enabled, float threshold, char *buf, size_t cap)
{
    return dshim_twobit_encode_params(enabled, threshold, buf, cap);
}

TEST_EXPORT int twobit_decode_params(const char *body, float *threshold, int *enabled)
{
    return dshim_twobit_decode_params(body, threshold, enabled);
}

TEST_EXPORT float twobit_server_threshold(float t)
{
    return dshim_twobit_server_threshold(t);
}

TEST_EXPORT const char *twobit_last_error(void)
{
    return dshim_last_error();
}
#endif
