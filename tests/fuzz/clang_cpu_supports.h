/*
 * Force-included (-include) into backends/reduce/cpu/reduce_cpu.c in the fuzz
 * build only (CMakeLists.txt, DSHIM_FUZZ): clang 14, Debian 12's clang, rejects
 * __builtin_cpu_supports("f16c"), which gcc accepts.  Each feature the file asks
 * about is answered here; f16c by avx2, since every x86 CPU with AVX2 has F16C.
 * The normal (gcc) build does not see this file.
 */
#ifndef DSHIM_FUZZ_CLANG_CPU_SUPPORTS_H
#define DSHIM_FUZZ_CLANG_CPU_SUPPORTS_H

#include <string.h>

static inline int dshim_fuzz_cpu_supports(const char *feature)
{
    if (strcmp(feature, "avx512f") == 0) {
        return __builtin_cpu_supports("avx512f");
    }
    if (strcmp(feature, "avx512bw") == 0) {
        return __builtin_cpu_supports("avx512bw");
    }
    if (strcmp(feature, "avx512vl") == 0) {
        return __builtin_cpu_supports("avx512vl");
    }
    if (strcmp(feature, "avx2") == 0 || strcmp(feature, "f16c") == 0) {
        return __builtin_cpu_supports("avx2");
    }
    if (strcmp(feature, "fma") == 0) {
        return __builtin_cpu_supports("fma");
    }
    return 0;  /* a feature not listed here: take the portable kernels */
}
#define __builtin_cpu_supports(feature) dshim_fuzz_cpu_supports(feature)

#endif
