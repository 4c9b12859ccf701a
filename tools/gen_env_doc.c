/* Writes docs/env-vars.md from base/params.def, so the documentation can
 * never drift from the table (tests/preload checks they match). */
#include <stdio.h>

#include "config.h"

int main(void)
{
    printf("# Environment variables\n\n"
           "Generated from `base/params.def` by `build/bin/gen-env-doc` (do not edit by hand; run\n"
           "`make env-doc`). `dshim-bench --print-config` (and later `dshim-run --print-config`) prints the same\n"
           "table with the values in effect. Sizes accept `k`, `m`, `g` suffixes; booleans accept\n"
           "`0/1/yes/no/on/off`. The \"allowed\" column (params.def's rule) says what else a value must be. A\n"
           "value that does not parse or is not allowed is refused before anything starts: `dshim-run` exits 2\n"
           "with one line naming the variable, the value and what is allowed, and `dshim_comm_init_env`\n"
           "returns `DSHIM_ERR_INVALID` with the same line. An empty value means the default.\n\n");
    dshim_config_print(stdout, 1);
    return 0;
}
