/* Writes docs/env-vars.md from shim/base/params.def, so the documentation can
 * never drift from the table (tests/preload checks they match). */
#include <stdio.h>

#include "config.h"

int main(void)
{
    printf("# Environment variables\n\n"
           "Generated from `shim/base/params.def` by `build/bin/gen-env-doc` (do not edit by hand; run\n"
           "`make env-doc`). `dshim-bench --print-config` (and later `dshim-run --print-config`) prints the same\n"
           "table with the values in effect. Sizes accept `k`, `m`, `g` suffixes; booleans accept\n"
           "`0/1/yes/no/on/off`. A value that does not parse is reported at start-up and the communicator\n"
           "refuses to start (`dshim_comm_init_env` returns `DSHIM_ERR_INVALID`).\n\n");
    dshim_config_print(stdout, 1);
    return 0;
}
