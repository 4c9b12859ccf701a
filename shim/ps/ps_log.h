/* The parameter server's log lines: dshim's log (base/log.h: host, pid,
 * thread, rank, level; DSHIM_DEBUG_FILE) with "[dshim-ps <role> <rank>]" in
 * front of the message.  A line is shown when DSHIM_DEBUG asks for its level
 * or when ps-lite's own PS_VERBOSE does, whichever shows more, so a ps-lite
 * user's PS_VERBOSE keeps its meaning: 1 shows the INFO lines (connections,
 * barriers), 2 also the TRACE lines (every message). */
#ifndef DSHIM_PS_LOG_H
#define DSHIM_PS_LOG_H

#include "log.h"
#include "ps.h"

/* The dshim log level that PS_VERBOSE asks for. */
static inline int dshim_ps_verbose_level(int verbose)
{
    return verbose <= 0 ? DSHIM_LOG_NONE : verbose == 1 ? DSHIM_LOG_INFO : DSHIM_LOG_TRACE;
}

/* Checked before any formatting (the TRACE lines sit on the message path).
 * dshim_log_level_current is known once dshim_log_init ran: the roles' entry
 * points (dshim_ps_node_start, dshim_ps_scheduler_run) call it. */
static inline int dshim_ps_log_on(const dshim_ps_env_t *env, dshim_log_level_t level)
{
    return dshim_log_level_current >= (int)level || dshim_ps_verbose_level(env->verbose) >= (int)level;
}

/* rank < 0: not assigned yet (or the scheduler, which has none) */
void dshim_ps_log_write(const dshim_ps_env_t *env, int rank, dshim_log_level_t level, const char *file, int line,
                        const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#define DSHIM_PS_LOG_(lvl, env, rank, ...)                                     \
    do {                                                                       \
        if (dshim_ps_log_on((env), (lvl))) {                                   \
            dshim_ps_log_write((env), (rank), (lvl), __FILE__, __LINE__, __VA_ARGS__); \
        }                                                                      \
    } while (0)
/* shown by default (DSHIM_DEBUG=WARN): stalls */
#define DSHIM_PS_WARN(env, rank, ...) DSHIM_PS_LOG_(DSHIM_LOG_WARN, env, rank, __VA_ARGS__)
/* PS_VERBOSE=1: connections, registration, barriers, commands */
#define DSHIM_PS_INFO(env, rank, ...) DSHIM_PS_LOG_(DSHIM_LOG_INFO, env, rank, __VA_ARGS__)
/* PS_VERBOSE=2: every message */
#define DSHIM_PS_TRACE(env, rank, ...) DSHIM_PS_LOG_(DSHIM_LOG_TRACE, env, rank, __VA_ARGS__)

#endif
