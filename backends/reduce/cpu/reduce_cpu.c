/*
 * The "cpu" reduction backend: argument checks, a pinned floating-point
 * environment, and a call into the kernel table of the chosen ISA.
 */
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <xmmintrin.h>

#include "log.h"
#include "reduce/reduce.h"
#include "reduce_kernels.h"
#include "status.h"

enum { ISA_SCALAR = 0, ISA_AVX2, ISA_AVX512, ISA_COUNT };

static const char *const isa_names[ISA_COUNT] = {"scalar", "avx2", "avx512"};

/* What each kernel file was compiled with (see CMakeLists.txt). */
static int cpu_runs(int isa)
{
    __builtin_cpu_init();
    switch (isa) {
    case ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && cpu_runs(ISA_AVX2);
    case ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    default:
        return 1;
    }
}

/*
 * The kernels' bits are specified for round-to-nearest-even without
 * flush-to-zero or denormals-are-zero.  A framework may have changed MXCSR
 * (e.g. torch.set_flush_denormal), and ranks must not disagree because of
 * that, so the default environment is set for the call and restored after.
 * The sticky exception flags (bits 0-5) do not affect results.
 */
#define DEFAULT_MXCSR 0x1f80u

static unsigned int fpenv_enter(void)
{
    unsigned int old = _mm_getcsr();
    if ((old & ~0x3fu) != DEFAULT_MXCSR) {
        _mm_setcsr(DEFAULT_MXCSR);
    }
    return old;
}

static void fpenv_leave(unsigned int old)
{
    if ((old & ~0x3fu) != DEFAULT_MXCSR) {
        _mm_setcsr(old);
    }
}

static int cpu_supports(dshim_memtype_t mem, dshim_dtype_t dtype, dshim_redop_t op)
{
    return mem == DSHIM_MEM_HOST && (unsigned)dtype < DSHIM_DTYPE_COUNT &&
           (unsigned)op < DSHIM_REDOP_COUNT;
}

/* Checks shared by reduce and scale_div; *bytes_p gets count * element size. */
static dshim_status_t check_buffer(const char *call, const char *name, const void *buf,
                                   size_t count, dshim_dtype_t dtype, size_t *bytes_p)
{
    size_t size = dshim_dtype_size(dtype);
    if (buf == NULL) {
        return dshim_error(DSHIM_ERR_INVALID, "cpu %s: %s is null with count %zu; pass a buffer "
                           "of count elements", call, name, count);
    }
    if (count > SIZE_MAX / size) {
        return dshim_error(DSHIM_ERR_INVALID, "cpu %s: count %zu of %s overflows the address "
                           "space; pass a count in elements, not bytes", call, count,
                           dshim_dtype_name(dtype));
    }
    *bytes_p = count * size;
    return DSHIM_OK;
}

static dshim_status_t check_dtype_stream(const char *call, dshim_dtype_t dtype, void *stream)
{
    if ((unsigned)dtype >= DSHIM_DTYPE_COUNT) {
        return dshim_error(DSHIM_ERR_INVALID, "cpu %s: invalid dtype %d; use a dshim_dtype_t "
                           "value below %d", call, (int)dtype, (int)DSHIM_DTYPE_COUNT);
    }
    if (stream != NULL) {
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "cpu %s: got a stream, but the cpu backend "
                           "works synchronously on host memory; pass stream NULL", call);
    }
    return DSHIM_OK;
}

/* dst may be a or b exactly, or disjoint from it; a partial overlap would
 * make the result depend on the kernel's order of work. */
static int overlaps_partially(const void *x, const void *y, size_t bytes)
{
    uintptr_t px = (uintptr_t)x;
    uintptr_t py = (uintptr_t)y;
    return px != py && px < py + bytes && py < px + bytes;
}

static int misaligned(const void *p, dshim_dtype_t dtype)
{
    return (uintptr_t)p % dshim_dtype_size(dtype) != 0;
}

/*
 * The kernels dereference typed pointers, which must be element-aligned.  A
 * transport may hand over data at any byte offset (a ring holding an odd
 * number of int8 bytes before it), so such operands go through aligned
 * scratch, a few KiB at a time; aligned calls never come here.
 */
#define BOUNCE_BYTES 4096

static void reduce_bounced(const dshim_reduce_kernels_t *k, void *dst, const void *a,
                           const void *b, size_t count, dshim_dtype_t dtype, dshim_redop_t op)
{
    _Alignas(64) unsigned char ta[BOUNCE_BYTES];
    _Alignas(64) unsigned char tb[BOUNCE_BYTES];
    size_t size = dshim_dtype_size(dtype);
    size_t per = BOUNCE_BYTES / size;
    for (size_t i = 0; i < count; i += per) {
        size_t m = count - i < per ? count - i : per;
        memcpy(ta, (const char *)a + i * size, m * size);
        memcpy(tb, (const char *)b + i * size, m * size);
        k->reduce[dtype][op](ta, ta, tb, m);
        memcpy((char *)dst + i * size, ta, m * size);
    }
}

static void scale_bounced(const dshim_reduce_kernels_t *k, void *buf, size_t count,
                          dshim_dtype_t dtype, int divisor)
{
    _Alignas(64) unsigned char t[BOUNCE_BYTES];
    size_t size = dshim_dtype_size(dtype);
    size_t per = BOUNCE_BYTES / size;
    for (size_t i = 0; i < count; i += per) {
        size_t m = count - i < per ? count - i : per;
        memcpy(t, (char *)buf + i * size, m * size);
        k->scale_div[dtype](t, m, divisor);
        memcpy((char *)buf + i * size, t, m * size);
    }
}

static dshim_status_t cpu_reduce(const dshim_reduce_kernels_t *k, void *dst, const void *a,
                                 const void *b, size_t count, dshim_dtype_t dtype,
                                 dshim_redop_t op, void *stream)
{
    size_t bytes = 0;
    DSHIM_CHECK(check_dtype_stream("reduce", dtype, stream));
    if ((unsigned)op >= DSHIM_REDOP_COUNT) {
        return dshim_error(DSHIM_ERR_INVALID, "cpu reduce: invalid reduction op %d; use a "
                           "dshim_redop_t value below %d", (int)op, (int)DSHIM_REDOP_COUNT);
    }
    if (count == 0) {
        return DSHIM_OK;
    }
    DSHIM_CHECK(check_buffer("reduce", "dst", dst, count, dtype, &bytes));
    DSHIM_CHECK(check_buffer("reduce", "a", a, count, dtype, &bytes));
    DSHIM_CHECK(check_buffer("reduce", "b", b, count, dtype, &bytes));
    if (overlaps_partially(dst, a, bytes) || overlaps_partially(dst, b, bytes)) {
        return dshim_error(DSHIM_ERR_INVALID, "cpu reduce: dst %p partially overlaps an operand "
                           "(a %p, b %p, %zu bytes); dst must equal the operand or not overlap it",
                           dst, a, b, bytes);
    }
    unsigned int env = fpenv_enter();
    if (misaligned(dst, dtype) || misaligned(a, dtype) || misaligned(b, dtype)) {
        reduce_bounced(k, dst, a, b, count, dtype, op);
    } else {
        k->reduce[dtype][op](dst, a, b, count);
    }
    fpenv_leave(env);
    return DSHIM_OK;
}

static dshim_status_t cpu_scale_div(const dshim_reduce_kernels_t *k, void *buf, size_t count,
                                    dshim_dtype_t dtype, int divisor, void *stream)
{
    size_t bytes = 0;
    DSHIM_CHECK(check_dtype_stream("scale_div", dtype, stream));
    if (divisor < 1) {
        return dshim_error(DSHIM_ERR_INVALID, "cpu scale_div: divisor %d must be at least 1 (it "
                           "is the number of contributions averaged)", divisor);
    }
    /* x / 1 is x; skipping it also leaves signalling NaNs untouched */
    if (count == 0 || divisor == 1) {
        return DSHIM_OK;
    }
    DSHIM_CHECK(check_buffer("scale_div", "buf", buf, count, dtype, &bytes));
    unsigned int env = fpenv_enter();
    if (misaligned(buf, dtype)) {
        scale_bounced(k, buf, count, dtype, divisor);
    } else {
        k->scale_div[dtype](buf, count, divisor);
    }
    fpenv_leave(env);
    return DSHIM_OK;
}

/* One ops struct per kernel table: the interface's functions carry no
 * context, so each ISA gets its own small wrappers. */
#define CPU_BACKEND(I)                                                         \
    static const char *isa_##I(void)                                           \
    {                                                                          \
        return dshim_reduce_kernels_##I.isa;                                   \
    }                                                                          \
    static dshim_status_t reduce_##I(void *dst, const void *a, const void *b,  \
                                       size_t count, dshim_dtype_t dtype,      \
                                       dshim_redop_t op, void *stream)         \
    {                                                                          \
        return cpu_reduce(&dshim_reduce_kernels_##I, dst, a, b, count, dtype, op, stream); \
    }                                                                          \
    static dshim_status_t scale_div_##I(void *buf, size_t count, dshim_dtype_t dtype, \
                                          int divisor, void *stream)           \
    {                                                                          \
        return cpu_scale_div(&dshim_reduce_kernels_##I, buf, count, dtype, divisor, stream); \
    }                                                                          \
    static const dshim_reduce_ops_t ops_##I = {                                \
        .name = "cpu",                                                         \
        .isa = isa_##I,                                                        \
        .supports = cpu_supports,                                              \
        .reduce = reduce_##I,                                                  \
        .scale_div = scale_div_##I,                                            \
        .scale_mul = dshim_reduce_cpu_scale_mul,                               \
    };

CPU_BACKEND(scalar)
CPU_BACKEND(avx2)
CPU_BACKEND(avx512)

static const dshim_reduce_ops_t *const ops_by_isa[ISA_COUNT] = {&ops_scalar, &ops_avx2,
                                                                &ops_avx512};

const dshim_reduce_ops_t *dshim_reduce_cpu_ops(const char *isa)
{
    int best = ISA_AVX512;
    while (!cpu_runs(best)) {
        best--;
    }
    if (isa == NULL || isa[0] == '\0' || strcasecmp(isa, "auto") == 0) {
        return ops_by_isa[best];
    }
    int want = -1;
    for (int i = 0; i < ISA_COUNT; i++) {
        if (strcasecmp(isa, isa_names[i]) == 0) {
            want = i;
        }
    }
    if (want < 0) {
        DSHIM_WARN("unknown reduction isa '%s' (DSHIM_REDUCE_ISA): expected auto, avx512, avx2 "
                   "or scalar; using %s", isa, isa_names[best]);
        return ops_by_isa[best];
    }
    if (want > best) {
        DSHIM_INFO("reduction isa %s requested but this cpu cannot run it; using %s",
                   isa_names[want], isa_names[best]);
        return ops_by_isa[best];
    }
    return ops_by_isa[want];
}
