/* The reduction kernels built for avx2 (-mavx2 -mfma -mf16c; see CMakeLists.txt).
 * reduce_cpu.c picks this table at run time when the CPU supports it. */
#define DSHIM_RK_ISA avx2
#include "reduce_kernels.inc.c"
