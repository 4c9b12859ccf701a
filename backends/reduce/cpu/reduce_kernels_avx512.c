/* The reduction kernels built for avx512 (-mavx512f -mavx512bw -mavx512vl
 * -mavx2 -mfma -mf16c; see CMakeLists.txt).
 * reduce_cpu.c picks this table at run time when the CPU supports it. */
#define DSHIM_RK_ISA avx512
#include "reduce_kernels.inc.c"
