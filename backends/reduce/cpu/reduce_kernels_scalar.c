/* The reduction kernels built for scalar (no -m flags: baseline x86-64, SSE2; see CMakeLists.txt).
 * reduce_cpu.c picks this table at run time when the CPU supports it. */
#define DSHIM_RK_ISA scalar
#include "reduce_kernels.inc.c"
