/*
 * The scalar conversions declared in reduce.h.  They wrap the inline
 * converters the kernels use (reduce_kernels.h), so a value converted here
 * has exactly the bits a kernel would produce.
 */
#include "reduce/reduce.h"
#include "reduce_kernels.h"

float dshim_half_to_float(unsigned short h)
{
    return dshim_rk_half_to_float((uint16_t)h);
}

unsigned short dshim_float_to_half(float f)
{
    return dshim_rk_float_to_half(f);
}

float dshim_bf16_to_float(unsigned short b)
{
    return dshim_rk_bf16_to_float((uint16_t)b);
}

unsigned short dshim_float_to_bf16(float f)
{
    return dshim_rk_float_to_bf16(f);
}

float dshim_fp8e4m3_to_float(unsigned char v)
{
    return dshim_rk_e4m3_to_float((uint8_t)v);
}

unsigned char dshim_float_to_fp8e4m3(float f)
{
    return dshim_rk_float_to_e4m3(f);
}

float dshim_fp8e5m2_to_float(unsigned char v)
{
    return dshim_rk_e5m2_to_float((uint8_t)v);
}

unsigned char dshim_float_to_fp8e5m2(float f)
{
    return dshim_rk_float_to_e5m2(f);
}
