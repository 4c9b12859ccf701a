/* Logging to stderr or DSHIM_DEBUG_FILE; one write() per line so lines of
 * concurrent ranks and threads never interleave mid-line. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>

#include "private_fs.h"
#include "config.h"
#include "log.h"

int dshim_log_level_current = DSHIM_LOG_WARN;
static int log_fd = 2;
static int log_rank = -1;
static char log_host[64];
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

void dshim_expand_name(const char *pattern, int rank, const char *host, char *out, size_t out_len)
{
    size_t o = 0;
    for (const char *p = pattern; *p && o + 1 < out_len; p++) {
        char tmp[80];
        const char *ins = NULL;
        if (p[0] == '%' && p[1]) {
            p++;
            if (*p == 'h') {
                ins = host;
            } else if (*p == 'p') {
                snprintf(tmp, sizeof(tmp), "%d", (int)getpid());
                ins = tmp;
            } else if (*p == 'r') {
                snprintf(tmp, sizeof(tmp), "%d", rank);
                ins = tmp;
            } else {
                tmp[0] = *p;
                tmp[1] = 0;
                ins = tmp;
            }
        }
        if (ins) {
            size_t n = strlen(ins);
            if (o + n >= out_len) {
                n = out_len - o - 1;
            }
            memcpy(out + o, ins, n);
            o += n;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = 0;
}

static void log_init_once(void)
{
    const dshim_config_t *cfg = dshim_config();
    gethostname(log_host, sizeof(log_host) - 1);
    const char *lvl = cfg->debug;
    if (!strcasecmp(lvl, "NONE")) {
        dshim_log_level_current = DSHIM_LOG_NONE;
    } else if (!strcasecmp(lvl, "INFO")) {
        dshim_log_level_current = DSHIM_LOG_INFO;
    } else if (!strcasecmp(lvl, "TRACE")) {
        dshim_log_level_current = DSHIM_LOG_TRACE;
    } else {
        dshim_log_level_current = DSHIM_LOG_WARN;
    }
    if (cfg->debug_file && cfg->debug_file[0]) {
        char path[512];
        dshim_expand_name(cfg->debug_file, log_rank, log_host, path, sizeof(path));
        int fd = dshim_private_open(path, DSHIM_OPEN_APPEND);  /* no link, no other user's file: private_fs.h */
        if (fd >= 0) {
            log_fd = fd;
        }
    }
}

void dshim_log_init(void)
{
    pthread_once(&log_once, log_init_once);
}

void dshim_log_set_rank(int rank)
{
    __atomic_store_n(&log_rank, rank, __ATOMIC_RELAXED);
}

int dshim_log_get_rank(void)
{
    return __atomic_load_n(&log_rank, __ATOMIC_RELAXED);
}

const char *dshim_log_hostname(void)
{
    dshim_log_init();
    return log_host;
}

static void log_vwrite(dshim_log_level_t level, const char *file, int line, const char *fmt, va_list ap)
{
    static const char *names[] = {"NONE", "WARN", "INFO", "TRACE"};
    char buf[2048];
    int n;
    int rank = dshim_log_get_rank();
    if (rank >= 0) {
        n = snprintf(buf, sizeof(buf), "%s:%d:%ld [rank %d] DSHIM %s ", log_host, (int)getpid(),
                     (long)syscall(SYS_gettid), rank, names[level]);
    } else {
        n = snprintf(buf, sizeof(buf), "%s:%d:%ld DSHIM %s ", log_host, (int)getpid(),
                     (long)syscall(SYS_gettid), names[level]);
    }
    n += vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    if (n >= (int)sizeof(buf) - 40) {
        n = (int)sizeof(buf) - 40;
    }
    if (level == DSHIM_LOG_TRACE) {
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, " (%s:%d)", file, line);
    }
    buf[n++] = '\n';
    ssize_t w = write(log_fd, buf, (size_t)n);
    (void)w;
}

void dshim_log_write(dshim_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    dshim_log_init();
    if (dshim_log_level_current < (int)level) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, file, line, fmt, ap);
    va_end(ap);
}

void dshim_log_write_anyway(dshim_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    dshim_log_init();
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, file, line, fmt, ap);
    va_end(ap);
}
