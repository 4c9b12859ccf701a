/* The HOROVOD_* settings of an engine (fusion, cycle time, stall inspector),
 * read when the engine is created, that is at hvd.init(), as Horovod reads
 * them: a script that sets os.environ["HOROVOD_..."] after importing
 * horovod.torch has dshim's table loaded already, so the loaded table
 * (dshim_config()) would not see them.  Each is its row of base/params.def
 * parsed by the table's rules from the environment as it is now
 * (dshim_config_get_current); the variables' names come from the rows, which
 * stay the only place they are written. */
#include <stdlib.h>

#include "config.h"
#include "named.h"

/* every row's index and variable name, expanded from the table */
enum {
#define DSHIM_PARAM(field, type, env, def, allowed, help) ROW_##field,
#define DSHIM_FOREIGN(field, type, env, def, allowed, help) ROW_##field,
#include "params.def"
#undef DSHIM_PARAM
#undef DSHIM_FOREIGN
    ROW_COUNT
};

static const char *const ROW_ENV[ROW_COUNT] = {
#define DSHIM_PARAM(field, type, env, def, allowed, help) env,
#define DSHIM_FOREIGN(field, type, env, def, allowed, help) env,
#include "params.def"
#undef DSHIM_PARAM
#undef DSHIM_FOREIGN
};

/* the row's current value as text (a DOUBLE as %g: six significant digits,
 * plenty for seconds and milliseconds), or NULL when it cannot be had (out
 * of memory: the caller keeps the value the table loaded) */
static const char *current(int row, char *buf, size_t len)
{
    return dshim_config_get_current(ROW_ENV[row], buf, len) == 0 ? buf : NULL;
}

void dshim_named_read_settings(dshim_named_t *eng)
{
    const dshim_config_t *cfg = dshim_config();
    char buf[64];
    const char *v;
    eng->fusion_bytes = (v = current(ROW_hvd_fusion, buf, sizeof(buf))) ? (size_t)strtoull(v, NULL, 10)
                                                                          : cfg->hvd_fusion;
    double cycle_ms = (v = current(ROW_hvd_cycle_ms, buf, sizeof(buf))) ? strtod(v, NULL) : cfg->hvd_cycle_ms;
    /* an idle engine runs one round per cycle: 0.1 ms at least, so that
     * HOROVOD_CYCLE_TIME=0 does not become a loop of rounds without end */
    eng->cycle_s = (cycle_ms > 0.1 ? cycle_ms : 0.1) / 1000.0;
    eng->stall_on = !((v = current(ROW_hvd_stall_off, buf, sizeof(buf))) ? atoi(v) : cfg->hvd_stall_off);
    eng->stall_s = (v = current(ROW_hvd_stall_s, buf, sizeof(buf))) ? strtod(v, NULL) : cfg->hvd_stall_s;
    eng->stall_stop_s = (v = current(ROW_hvd_stall_stop_s, buf, sizeof(buf))) ? strtod(v, NULL)
                                                                               : cfg->hvd_stall_stop_s;
}
