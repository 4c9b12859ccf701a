/* Logging: lines look like "host:pid:tid [rank r] DSHIM WARN message".
 * The level check happens before any formatting. */
#ifndef DSHIM_LOG_H
#define DSHIM_LOG_H

typedef enum { DSHIM_LOG_NONE = 0, DSHIM_LOG_WARN = 1, DSHIM_LOG_INFO = 2, DSHIM_LOG_TRACE = 3 } dshim_log_level_t;

extern int dshim_log_level_current;  /* set from DSHIM_DEBUG by dshim_log_init */

void dshim_log_init(void);
/* rank shown in every line once known (-1 = unknown) */
void dshim_log_set_rank(int rank);
int dshim_log_get_rank(void);
const char *dshim_log_hostname(void);
/* A file name from a pattern: %r rank, %p pid, %h host, %% a percent sign
 * (DSHIM_DEBUG_FILE, DSHIM_TIMELINE). */
void dshim_expand_name(const char *pattern, int rank, const char *host, char *out, size_t out_len);
void dshim_log_write(dshim_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same line, written whatever DSHIM_DEBUG says: for a module that has its
 * own verbosity switch on top of DSHIM_DEBUG and has decided already (the
 * parameter server's PS_VERBOSE, ps-lite's variable). */
void dshim_log_write_anyway(dshim_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define DSHIM_LOG_(lvl, ...)                                                   \
    do {                                                                       \
        if (dshim_log_level_current >= (lvl))                                  \
            dshim_log_write((lvl), __FILE__, __LINE__, __VA_ARGS__);           \
    } while (0)
#define DSHIM_WARN(...)  DSHIM_LOG_(DSHIM_LOG_WARN, __VA_ARGS__)
#define DSHIM_INFO(...)  DSHIM_LOG_(DSHIM_LOG_INFO, __VA_ARGS__)
#define DSHIM_TRACE(...) DSHIM_LOG_(DSHIM_LOG_TRACE, __VA_ARGS__)

#endif
