/*
 * dshim-run --status [PID] and --diagnose DIR (docs/launcher.md
 * "Diagnosis and live status").
 *
 * A running controller listens on a Unix socket, /tmp/dshim-run-user<uid>/<pid>.sock
 * (the directory is the user's, mode 0700: only the user can ask; not
 * /tmp/dshim-run-<uid>, which would be the per-job directory of a controller
 * whose pid equals the uid, removed when that job ends).  A
 * client connects, writes "status\n" and reads the answer until the
 * controller closes: the controller has every agent signal its live ranks
 * for a dump (reason "request": the job goes on), and answers with the
 * per-rank status made of them (analyser/trace_read.h).  SIGUSR1 to the
 * controller prints the same on its stderr.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "collect.h"
#include "net.h"
#include "private_fs.h"

/* How long a client waits for the answer: the collection's own bound plus
 * the time to ship large dumps. */
#define STATUS_CLIENT_WAIT_S 20

static void user_dir(char *out, size_t cap)
{
    snprintf(out, cap, "/tmp/dshim-run-user%u", (unsigned)getuid());
}

/* The user's directory in /tmp, made if missing; 0 when it is a directory of
 * this user and nobody else can enter it. */
static int ensure_user_dir(char *out, size_t cap)
{
    user_dir(out, cap);
    /* found again by name (the --status client), so not random: checked instead (private_fs.h) */
    return dshim_private_dir(out, 1);
}

static void sock_path(long pid, char *out, size_t cap)
{
    char dir[64];
    user_dir(dir, sizeof(dir));
    snprintf(out, cap, "%s/%ld.sock", dir, pid);
}

char *run_status_dir(void)
{
    char dir[64];
    user_dir(dir, sizeof(dir));
    char *out = NULL;
    if (asprintf(&out, "%s/status-%d", dir, (int)getpid()) < 0) {
        run_usage_error("out of memory");
    }
    return out;
}

int run_status_listen(void)
{
    char dir[64];
    if (ensure_user_dir(dir, sizeof(dir)) != 0) {
        run_say("warning: %s is not a private directory of this user (%s); dshim-run --status cannot reach this job",
                dir, dshim_private_why(errno));
        return -1;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    sock_path((long)getpid(), sa.sun_path, sizeof(sa.sun_path));
    unlink(sa.sun_path);  /* a stale one of an earlier dshim-run with our pid */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        return -1;
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 8) != 0) {
        run_say("warning: cannot listen on %s (%s); dshim-run --status cannot reach this job", sa.sun_path,
                strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

void run_status_unlisten(int fd)
{
    if (fd < 0) {
        return;
    }
    close(fd);
    char path[128];
    sock_path((long)getpid(), path, sizeof(path));
    unlink(path);
    char *d = run_status_dir();
    DIR *dp = opendir(d);
    if (dp) {
        struct dirent *de;
        while ((de = readdir(dp)) != NULL) {
            if (de->d_name[0] != '.') {
                char p[PATH_MAX];
                snprintf(p, sizeof(p), "%s/%s", d, de->d_name);
                unlink(p);
            }
        }
        closedir(dp);
        rmdir(d);
    }
    free(d);
}

/* ---- the client ------------------------------------------------------------ */

static bool pid_alive(long pid)
{
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

static void cmdline_of(long pid, char *out, size_t cap)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return;
    }
    ssize_t n = read(fd, out, cap - 1);
    close(fd);
    if (n <= 0) {
        out[0] = '\0';
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (out[i] == '\0') {
            out[i] = ' ';
        }
    }
    out[n] = '\0';
}

/* Whether a controller answers on this socket; a socket nobody listens on
 * (its dshim-run was SIGKILLed) is removed: the directory is the user's own. */
static bool socket_live(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        return false;
    }
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return false;
    }
    bool live = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    if (!live && errno == ECONNREFUSED) {
        unlink(path);
    }
    close(fd);  /* a connection that asks nothing: the controller closes it (controller.c accept_status) */
    return live;
}

/* The running controllers of this user: pids with a live socket. */
static int find_controllers(long *pids, int cap)
{
    char dir[64];
    user_dir(dir, sizeof(dir));
    DIR *dp = opendir(dir);
    int n = 0;
    if (dp == NULL) {
        return 0;
    }
    struct dirent *de;
    while ((de = readdir(dp)) != NULL && n < cap) {
        char *end = NULL;
        long pid = strtol(de->d_name, &end, 10);
        if (end == de->d_name || strcmp(end, ".sock") != 0) {
            continue;
        }
        char path[sizeof(dir) + 64];
        snprintf(path, sizeof(path), "%s/%.60s", dir, de->d_name);
        if (pid_alive(pid) && socket_live(path)) {
            pids[n++] = pid;
        } else if (!pid_alive(pid)) {
            unlink(path);  /* its dshim-run is gone (SIGKILLed) */
        }
    }
    closedir(dp);
    return n;
}

int run_status_main(const char *pid_arg)
{
    long pid = 0;
    if (pid_arg) {
        char *end = NULL;
        pid = strtol(pid_arg, &end, 10);
        if (pid <= 0 || *end != '\0') {
            run_usage_error("--status %s: expected the pid of a running dshim-run", pid_arg);
        }
    } else {
        long pids[64];
        int n = find_controllers(pids, 64);
        if (n == 0) {
            run_usage_error("--status: no running dshim-run of this user (none listens in /tmp/dshim-run-user%u/)",
                            (unsigned)getuid());
        }
        if (n > 1) {
            fprintf(stderr, "dshim-run: error: --status: %d dshim-run jobs are running; name one by its pid:\n", n);
            for (int i = 0; i < n; i++) {
                char cmd[200];
                cmdline_of(pids[i], cmd, sizeof(cmd));
                fprintf(stderr, "  dshim-run --status %ld    # %s\n", pids[i], cmd);
            }
            return RUN_EXIT_USAGE;
        }
        pid = pids[0];
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    sock_path(pid, sa.sun_path, sizeof(sa.sun_path));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        run_usage_error("--status: cannot reach dshim-run %ld at %s (%s); is it running, and yours?", pid, sa.sun_path,
                        strerror(errno));
    }
    (void)run_write_all(fd, "status\n", 7);
    double deadline = dshim_now() + STATUS_CLIENT_WAIT_S;
    char buf[8192];
    bool any = false;
    for (;;) {
        double left = deadline - dshim_now();
        if (left <= 0) {
            fprintf(stderr, "dshim-run: error: --status: dshim-run %ld did not answer within %d s\n", pid,
                    STATUS_CLIENT_WAIT_S);
            close(fd);
            return 1;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            continue;
        }
        ssize_t got = read(fd, buf, sizeof(buf));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            break;
        }
        fwrite(buf, 1, (size_t)got, stdout);
        any = true;
    }
    close(fd);
    fflush(stdout);
    return any ? 0 : 1;
}

/* ---- --diagnose DIR ------------------------------------------------------------ */

int run_diagnose_main(const char *dir)
{
    dshim_trace_set_t set;
    char err[512];
    if (dshim_trace_load_dir(dir, &set, err, sizeof(err)) != 0) {
        run_usage_error("--diagnose: %s", err);
    }
    if (set.n == 0) {
        dshim_trace_set_free(&set);
        run_usage_error("--diagnose %s: no flight-recorder dump (dshim-trace.*.jsonl) in it", dir);
    }
    /* "now" is when the dumps were taken: ages read as they were then */
    char *diag = dshim_trace_diagnose(&set, 0, 0);
    char *status = dshim_trace_status(&set, 20, 0);
    printf("%s\n%s", diag, status);
    free(diag);
    free(status);
    dshim_trace_set_free(&set);
    return 0;
}
