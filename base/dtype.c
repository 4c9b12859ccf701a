/* Names and sizes of the public data types and reduction ops. */
#include "dshim.h"

DSHIM_EXPORT size_t dshim_dtype_size(dshim_dtype_t dtype)
{
    switch (dtype) {
    case DSHIM_INT8: case DSHIM_UINT8: case DSHIM_FLOAT8_E4M3: case DSHIM_FLOAT8_E5M2: return 1;
    case DSHIM_FLOAT16: case DSHIM_BFLOAT16: return 2;
    case DSHIM_INT32: case DSHIM_UINT32: case DSHIM_FLOAT32: return 4;
    case DSHIM_INT64: case DSHIM_UINT64: case DSHIM_FLOAT64: return 8;
    default: return 0;
    }
}

DSHIM_EXPORT const char *dshim_dtype_name(dshim_dtype_t dtype)
{
    static const char *names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
                                  "bfloat16", "float32", "float64", "float8_e4m3", "float8_e5m2"};
    if ((unsigned)dtype >= DSHIM_DTYPE_COUNT) {
        return "invalid-dtype";
    }
    return names[dtype];
}

DSHIM_EXPORT const char *dshim_redop_name(dshim_redop_t op)
{
    static const char *names[] = {"sum", "prod", "min", "max", "avg"};
    if ((unsigned)op >= DSHIM_REDOP_COUNT) {
        return "invalid-op";
    }
    return names[op];
}
