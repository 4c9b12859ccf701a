/* The parameter server's log lines (ps_log.h): the role and rank in front of
 * the message, then dshim's log writes the line. */
#include <stdarg.h>
#include <stdio.h>

#include "ps_log.h"

void dshim_ps_log_write(const dshim_ps_env_t *env, int rank, dshim_log_level_t level, const char *file, int line,
                        const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    const char *role = dshim_ps_role_name(env->role);
    if (rank < 0) {
        dshim_log_write_anyway(level, file, line, "[dshim-ps %s] %s", role, text);
    } else {
        dshim_log_write_anyway(level, file, line, "[dshim-ps %s %d] %s", role, rank, text);
    }
}
