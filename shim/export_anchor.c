/* libdshim.so is built from the dshim_core archive (--whole-archive); CMake
 * needs at least one source file for a shared library target. */
#include "dshim.h"
DSHIM_EXPORT int dshim_abi_version(void) { return DSHIM_VERSION_MAJOR * 10000 + DSHIM_VERSION_MINOR * 100 + DSHIM_VERSION_PATCH; }
