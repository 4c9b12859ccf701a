/*
 * Flight-recorder dumps across the job: the per-job dump directory, the
 * agent's collection (signal, wait, ship) and the controller's (ask, store,
 * diagnose).  The protocol is in collect.h.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base64.h"
#include "collect.h"
#include "config.h"
#include "net.h"
#include "private_fs.h"

/* ---- small helpers ---------------------------------------------------------- */

/* mkdir -p with mode 0700 for what is missing (private_fs.h). */
static int make_dirs(const char *path)
{
    return dshim_make_dirs(path);
}

/* A file name that came in a frame: a plain name in the directory, never a path. */
static bool safe_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 200 || name[0] == '.' || strchr(name, '/') || strcmp(name, "launcher.jsonl") == 0 ||
        strcmp(name, "diagnosis.txt") == 0) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)name[i] < 0x20) {
            return false;
        }
    }
    return true;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static int signal_number(const char *word)
{
    if (word == NULL) {
        return SIGUSR2;
    }
    if (strncasecmp(word, "SIG", 3) == 0) {
        word += 3;
    }
    if (strcasecmp(word, "USR1") == 0) {
        return SIGUSR1;
    }
    if (strcasecmp(word, "NONE") == 0) {
        return 0;
    }
    return SIGUSR2;
}

/* ---- plan ---------------------------------------------------------------- */

void run_collect_plan(const run_opts_t *o, run_plan_t *plan, run_strv_t *common)
{
    const dshim_config_t *cfg = dshim_config();
    free(plan->trace_dir);
    plan->trace_dir = NULL;
    plan->trace_owned = false;
    if (plan->libdshim == NULL || cfg->trace_buffer <= 0) {
        return;  /* no recorder in the processes: nothing to set up or ask */
    }
    if (o->launcher == RUN_LAUNCHER_MPI || o->launcher == RUN_LAUNCHER_SLURM) {
        /* their agents have no lifeline to be asked on: the ranks keep the
         * recorder's own default directory, where dumps outlive the job */
        return;
    }
    if (cfg->trace_dir && cfg->trace_dir[0]) {
        plan->trace_dir = run_xstrdup(cfg->trace_dir);  /* the user's (forwarded as it is) */
        return;
    }
    /* beside TORCHELASTIC_ERROR_FILE's attempt directories: the same path on every host */
    if (asprintf(&plan->trace_dir, "%s/trace_%d", plan->jobdir, plan->attempt) < 0) {
        run_usage_error("out of memory");
    }
    plan->trace_owned = true;
    run_strv_setenv(common, "DSHIM_TRACE_DIR", "%s", plan->trace_dir);
}

/* ---- agent ---------------------------------------------------------------- */

typedef struct {
    int idx;
    pid_t pid;
    int rank;             /* RANK, -1 none */
    ino_t ino;            /* its dump file before we asked (0 = none) */
    struct timespec mtime;
    bool asked, answered, ended;
    char pstate;
} aproc_t;

static struct {
    char dir[PATH_MAX];
    bool usable, owned;
    bool collected;       /* the controller has copies of what was here */
    bool answered_failure;  /* shipped for a collection after a failure */
    run_linebuf_t lb;
    bool want;
    int want_mode, want_sig, want_no;
    bool active;
    int mode, sig, no;
    double deadline;
    aproc_t *ap;      /* this agent's processes (set at the first poll) */
    int nap;
} ag;

void run_collect_agent_init(const char *dir, bool owned)
{
    memset(&ag, 0, sizeof(ag));
    if (dir == NULL || dir[0] != '/' || strlen(dir) >= sizeof(ag.dir)) {
        return;
    }
    snprintf(ag.dir, sizeof(ag.dir), "%s", dir);
    ag.owned = owned;
    if (!owned) {
        ag.usable = true;  /* the user's: the ranks make it; we only read it */
        return;
    }
    /* <job directory>/trace_<k>: the job directory (jobdir.h) must be ours */
    char parent[PATH_MAX];
    snprintf(parent, sizeof(parent), "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        if (dshim_private_dir(parent, 1) != 0) {
            fprintf(stderr, "dshim-run: %s is not a directory of this user; flight-recorder dumps of this host "
                    "are not collected\n", parent);
            return;
        }
    }
    if (dshim_private_dir(dir, 1) != 0) {
        fprintf(stderr, "dshim-run: cannot make %s (%s); flight-recorder dumps of this host are not collected\n",
                dir, strerror(errno));
        return;
    }
    ag.usable = true;
}

static void on_lifeline_line(void *ctx, const char *line, size_t len)
{
    (void)ctx;
    int mode, sig, no;
    char buf[64];
    if (len < 2 || len >= sizeof(buf) || line[0] != 'C' || line[1] != ' ') {
        return;  /* "K", the timeline's pings, ... */
    }
    memcpy(buf, line, len);
    buf[len] = '\0';
    if (sscanf(buf, "C %d %d %d", &mode, &sig, &no) == 3 && sig >= 0 && sig < 65) {
        ag.want = true;
        ag.want_mode = mode;
        ag.want_sig = sig;
        ag.want_no = no;
        char ack[16];
        int k = snprintf(ack, sizeof(ack), "%d", no);
        run_frame_write(1, RUN_FRAME_COLLECT_ACK, -1, 0, 0, ack, (size_t)k);
    }
}

void run_collect_agent_input(const char *buf, size_t n)
{
    run_linebuf_feed(&ag.lb, buf, n, on_lifeline_line, NULL);
}

/* /proc/<pid>/stat's state letter; 0 when gone. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        return 0;
    }
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] ? rp[2] : 0;
}

/* Whether the process has a handler for sig (SigCgt): sending it to one
 * that has not would kill it, as the default action of SIGUSR1/2 does. */
static bool catches(pid_t pid, int sig)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        return false;
    }
    bool yes = false;
    while (fgets(line, sizeof(line), f)) {
        unsigned long long mask;
        if (sscanf(line, "SigCgt: %llx", &mask) == 1) {
            yes = (mask >> (sig - 1)) & 1;
            break;
        }
    }
    fclose(f);
    return yes;
}

/* The dump file of pid in the directory ("dshim-trace.<rank>.<pid>.jsonl"). */
static bool dump_of(pid_t pid, struct stat *st)
{
    DIR *d = opendir(ag.dir);
    if (d == NULL) {
        return false;
    }
    char suffix[32];
    snprintf(suffix, sizeof(suffix), ".%d.jsonl", (int)pid);
    size_t sl = strlen(suffix);
    bool found = false;
    struct dirent *de;
    while (!found && (de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (strncmp(de->d_name, "dshim-trace.", 12) == 0 && n > sl && strcmp(de->d_name + n - sl, suffix) == 0) {
            char path[PATH_MAX + 256];
            snprintf(path, sizeof(path), "%s/%s", ag.dir, de->d_name);
            found = stat(path, st) == 0 && S_ISREG(st->st_mode);
        }
    }
    closedir(d);
    return found;
}

static void start_collection(const run_collect_proc_t *procs, int n)
{
    ag.want = false;
    ag.active = true;
    ag.mode = ag.want_mode;
    ag.sig = ag.want_sig;
    ag.no = ag.want_no;
    ag.deadline = dshim_now() + RUN_COLLECT_AGENT_WAIT_S;
    free(ag.ap);
    ag.ap = run_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(*ag.ap));
    ag.nap = n;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < n; i++) {
        aproc_t *a = &ag.ap[i];
        a->idx = procs[i].idx;
        a->pid = procs[i].pid;
        a->rank = procs[i].rank;
        a->ended = !procs[i].running;
        if (a->ended || !ag.usable) {
            continue;
        }
        a->pstate = proc_state(a->pid);
        struct stat st;
        if (dump_of(a->pid, &st)) {
            a->ino = st.st_ino;
            a->mtime = st.st_mtim;
            /* after a failure, a dump the process wrote moments ago is its own
             * account of the failure: asking again would replace it with a
             * plain "request" */
            if (ag.mode == RUN_COLLECT_FAILURE && now.tv_sec - st.st_mtim.tv_sec < 3) {
                a->answered = true;
                continue;
            }
        }
        if (a->pstate == 'T' || a->pstate == 't' || a->pstate == 'Z' || a->pstate == 0 || ag.sig == 0 ||
            !catches(a->pid, ag.sig)) {
            continue;  /* stopped, dying, or it would not survive the signal */
        }
        if (kill(a->pid, ag.sig) == 0) {
            a->asked = true;
        }
    }
}

static void send_file(const char *name, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        return;
    }
    run_frame_write(1, RUN_FRAME_DUMP, -1, 0, 0, name, strlen(name));
    unsigned char raw[8190];  /* a multiple of 3: no padding inside a file */
    char enc[8190 / 3 * 4 + 4];
    size_t total = 0;
    for (;;) {
        ssize_t got = read(fd, raw, sizeof(raw));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            break;
        }
        /* fill the block so that only the file's last frame may carry '=' */
        size_t have = (size_t)got;
        while (have < sizeof(raw)) {
            ssize_t more = read(fd, raw + have, sizeof(raw) - have);
            if (more < 0 && errno == EINTR) {
                continue;
            }
            if (more <= 0) {
                break;
            }
            have += (size_t)more;
        }
        size_t m = run_b64_encode(raw, have, enc);
        run_frame_write(1, RUN_FRAME_BYTES, -1, 0, 0, enc, m);
        total += have;
        if (total > ((size_t)256 << 20)) {
            break;  /* not a dump the recorder writes: stop feeding it */
        }
    }
    close(fd);
}

/* Is this file one of ours to ship?  Only the dumps of this agent's own
 * processes ("dshim-trace.<rank>.<pid>.jsonl" by pid, torch's
 * "dshim_fr_rank_<rank>" by rank): the directory may be shared with other
 * hosts' agents (a /tmp or DSHIM_TRACE_DIR on a shared filesystem) or hold
 * other jobs' dumps (the user's DSHIM_TRACE_DIR). */
static bool ours(const char *name)
{
    if (name[0] == '.' || strstr(name, ".tmp")) {
        return false;  /* half-written (the recorder renames when done) */
    }
    size_t n = strlen(name);
    for (int i = 0; i < ag.nap; i++) {
        char suffix[32];
        snprintf(suffix, sizeof(suffix), ".%d.jsonl", (int)ag.ap[i].pid);
        size_t sl = strlen(suffix);
        if (strncmp(name, "dshim-trace.", 12) == 0 && n > sl && strcmp(name + n - sl, suffix) == 0) {
            return true;
        }
        char fr[48];
        snprintf(fr, sizeof(fr), "dshim_fr_rank_%d", ag.ap[i].rank);
        if (ag.ap[i].rank >= 0 && strcmp(name, fr) == 0) {
            return true;
        }
    }
    return false;
}

static void ship(void)
{
    int files = 0;
    DIR *d = ag.usable ? opendir(ag.dir) : NULL;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        if (!ours(de->d_name) || !safe_name(de->d_name)) {
            continue;
        }
        char path[PATH_MAX + 256];
        snprintf(path, sizeof(path), "%s/%s", ag.dir, de->d_name);
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            continue;
        }
        send_file(de->d_name, path);
        files++;
        if (ag.owned) {
            /* the controller has it now; a stale copy must not pass for a
             * fresh answer at the next collection */
            unlink(path);
        }
    }
    if (d) {
        closedir(d);
    }
    for (int i = 0; i < ag.nap; i++) {
        aproc_t *a = &ag.ap[i];
        char text[32];
        int n = snprintf(text, sizeof(text), "%c %d %d", a->pstate ? a->pstate : '?', a->asked, a->answered);
        run_frame_write(1, RUN_FRAME_PSTATE, a->idx, 0, 0, text, (size_t)n);
    }
    char text[32];
    int n = snprintf(text, sizeof(text), "%d %d", ag.no, files);
    run_frame_write(1, RUN_FRAME_COLLECTED, -1, 0, 0, text, (size_t)n);
    ag.collected = true;
    ag.answered_failure |= ag.mode == RUN_COLLECT_FAILURE;
}

bool run_collect_agent_awaits_request(void)
{
    return ag.usable && !ag.answered_failure;
}

int run_collect_agent_poll(const run_collect_proc_t *procs, int n)
{
    if (ag.want) {
        start_collection(procs, n);  /* also a newer request in the middle of one: start over */
    }
    if (!ag.active) {
        return -1;
    }
    bool waiting = false;
    for (int i = 0; i < ag.nap; i++) {
        aproc_t *a = &ag.ap[i];
        if (!a->asked || a->answered || a->ended) {
            continue;
        }
        for (int k = 0; k < n; k++) {
            if (procs[k].idx == a->idx && !procs[k].running) {
                a->ended = true;
            }
        }
        struct stat st;
        if (!a->ended && dump_of(a->pid, &st) &&
            (st.st_ino != a->ino || st.st_mtim.tv_sec != a->mtime.tv_sec || st.st_mtim.tv_nsec != a->mtime.tv_nsec)) {
            a->answered = true;
        }
        waiting |= !a->answered && !a->ended;
    }
    if (waiting && dshim_now() < ag.deadline) {
        return 20;
    }
    ag.active = false;
    ship();
    return -1;
}

void run_collect_agent_end(void)
{
    if (ag.active) {
        ag.active = false;
        ship();  /* what is there still goes (the caller polled once more after its processes ended) */
    }
    if (ag.usable && ag.owned) {
        if (ag.collected) {
            /* the controller has copies of our processes' dumps (also of what
             * they wrote since: a shared directory's other files are not ours) */
            DIR *d = opendir(ag.dir);
            struct dirent *de;
            while (d && (de = readdir(d)) != NULL) {
                if (ours(de->d_name) || (strstr(de->d_name, ".tmp") && de->d_name[0] != '.')) {
                    char path[PATH_MAX + 256];
                    snprintf(path, sizeof(path), "%s/%s", ag.dir, de->d_name);
                    unlink(path);
                }
            }
            if (d) {
                closedir(d);
            }
        }
        rmdir(ag.dir);  /* when nothing else is left; dumps nobody collected (no lifeline) stay */
        char parent[PATH_MAX];
        snprintf(parent, sizeof(parent), "%s", ag.dir);
        char *slash = strrchr(parent, '/');
        if (slash && slash != parent) {
            *slash = '\0';
            rmdir(parent);  /* /tmp/dshim-run-<pid>, when nothing else is in it */
        }
    }
    run_linebuf_free(&ag.lb);
    free(ag.ap);
    ag.ap = NULL;
}

/* ---- controller --------------------------------------------------------------- */

typedef struct {
    char pstate;
    int asked, answered;
    bool seen;
} ystate_t;

struct run_collect {
    const run_opts_t *o;
    const run_plan_t *plan;
    bool enabled;
    int sig;
    int nagents;
    bool active;
    int mode;
    int no;
    double started, deadline;
    bool *asked;          /* per agent: sent C this round */
    bool *done;           /* per agent: Z (or gone) */
    bool *acked;          /* per agent: A (it heard the request) */
    FILE **cur;           /* per agent: the file being received */
    ystate_t *y;          /* per process */
    char dir[PATH_MAX];
    bool dir_made;
    int nfiles;
};

run_collect_t *run_collect_new(const run_opts_t *o, const run_plan_t *plan, int nagents)
{
    run_collect_t *c = run_xmalloc(sizeof(*c));
    c->o = o;
    c->plan = plan;
    c->enabled = plan->trace_dir != NULL;
    c->sig = signal_number(dshim_config()->trace_signal);
    c->nagents = nagents;
    c->asked = run_xmalloc((size_t)(nagents + 1) * sizeof(bool));
    c->done = run_xmalloc((size_t)(nagents + 1) * sizeof(bool));
    c->acked = run_xmalloc((size_t)(nagents + 1) * sizeof(bool));
    c->cur = run_xmalloc((size_t)(nagents + 1) * sizeof(FILE *));
    c->y = run_xmalloc((size_t)(plan->nprocs + 1) * sizeof(ystate_t));
    return c;
}

void run_collect_free(run_collect_t *c)
{
    if (c == NULL) {
        return;
    }
    for (int i = 0; i < c->nagents; i++) {
        if (c->cur[i]) {
            fclose(c->cur[i]);
        }
    }
    free(c->asked);
    free(c->done);
    free(c->acked);
    free(c->cur);
    free(c->y);
    free(c);
}

bool run_collect_enabled(const run_collect_t *c)
{
    return c && c->enabled;
}

bool run_collect_active(const run_collect_t *c)
{
    return c && c->active;
}

int run_collect_mode(const run_collect_t *c)
{
    return c->mode;
}

/* Where this collection's files go.  After a failure: a directory named
 * after the job beside the user's work (or under --log-dir), else under
 * /tmp; for --status one per controller, emptied each time. */
static void choose_dir(run_collect_t *c)
{
    c->dir_made = false;
    if (c->mode == RUN_COLLECT_REQUEST) {
        char *d = run_status_dir();
        snprintf(c->dir, sizeof(c->dir), "%s", d);
        free(d);
        nftw(c->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        return;
    }
    char name[64];
    if (c->plan->attempt > 0) {
        snprintf(name, sizeof(name), "dshim-trace-%d.%d", (int)getpid(), c->plan->attempt);
    } else {
        snprintf(name, sizeof(name), "dshim-trace-%d", (int)getpid());
    }
    char cwd[PATH_MAX];
    const char *base = c->o->log_dir;
    if (base == NULL) {
        base = getcwd(cwd, sizeof(cwd)) ? cwd : ".";
    }
    if ((size_t)snprintf(c->dir, sizeof(c->dir), "%.3900s/%s", base, name) >= sizeof(c->dir)) {
        c->dir[0] = '\0';
    }
}

static bool make_collect_dir(run_collect_t *c)
{
    if (c->dir_made) {
        return true;
    }
    if (c->mode == RUN_COLLECT_REQUEST) {
        /* /tmp/dshim-run-user<uid>/status-<pid>: inside the user's own private directory only */
        char parent[PATH_MAX];
        snprintf(parent, sizeof(parent), "%s", c->dir);
        char *slash = strrchr(parent, '/');
        if (slash == NULL || slash == parent) {
            return false;
        }
        *slash = '\0';
        if (dshim_private_dir(parent, 1) != 0 || dshim_private_dir(c->dir, 1) != 0) {
            return false;
        }
        c->dir_made = true;
        return true;
    }
    if (make_dirs(c->dir) == 0) {
        c->dir_made = true;
        return true;
    }
    /* a read-only working directory: /tmp/dshim-run-<uid>/ then */
    char fallback[PATH_MAX];
    const char *slash = strrchr(c->dir, '/');
    snprintf(fallback, sizeof(fallback), "/tmp/dshim-run-user%u%s", (unsigned)getuid(), slash ? slash : "/dumps");
    char parent[64];
    snprintf(parent, sizeof(parent), "/tmp/dshim-run-user%u", (unsigned)getuid());
    if (dshim_private_dir(parent, 1) == 0 && dshim_private_dir(fallback, 1) == 0) {
        snprintf(c->dir, sizeof(c->dir), "%s", fallback);
        c->dir_made = true;
        return true;
    }
    return false;
}

bool run_collect_start(run_collect_t *c, int mode, const int *fds)
{
    if (!run_collect_enabled(c)) {
        return false;
    }
    for (int i = 0; i < c->nagents; i++) {
        if (c->cur[i]) {
            fclose(c->cur[i]);
            c->cur[i] = NULL;
        }
    }
    c->mode = mode;
    c->no++;
    c->nfiles = 0;
    memset(c->y, 0, (size_t)c->plan->nprocs * sizeof(*c->y));
    choose_dir(c);
    char cmd[64];
    int n = snprintf(cmd, sizeof(cmd), "C %d %d %d\n", mode, c->sig, c->no);
    int asked = 0;
    for (int i = 0; i < c->nagents; i++) {
        c->asked[i] = false;
        c->acked[i] = false;
        c->done[i] = true;
        if (fds[i] >= 0 && write(fds[i], cmd, (size_t)n) == n) {
            c->asked[i] = true;
            c->done[i] = false;
            asked++;
        }
    }
    if (asked == 0) {
        return false;
    }
    c->active = true;
    c->started = dshim_now();
    c->deadline = c->started + RUN_COLLECT_WAIT_S;
    return true;
}

bool run_collect_frame(run_collect_t *c, int agent, const run_frame_t *f)
{
    if (f->kind != RUN_FRAME_DUMP && f->kind != RUN_FRAME_BYTES && f->kind != RUN_FRAME_PSTATE &&
        f->kind != RUN_FRAME_COLLECTED && f->kind != RUN_FRAME_COLLECT_ACK) {
        return false;
    }
    if (c == NULL || !c->active || agent < 0 || agent >= c->nagents || !c->asked[agent]) {
        return true;  /* late: the collection is over */
    }
    char text[256];
    size_t tl = f->textlen < sizeof(text) - 1 ? f->textlen : sizeof(text) - 1;
    switch (f->kind) {
    case RUN_FRAME_COLLECT_ACK:
        c->acked[agent] = true;
        break;
    case RUN_FRAME_DUMP:
        if (c->cur[agent]) {
            fclose(c->cur[agent]);
            c->cur[agent] = NULL;
        }
        memcpy(text, f->text, tl);
        text[tl] = '\0';
        if (f->textlen < sizeof(text) && safe_name(text) && make_collect_dir(c)) {
            char path[PATH_MAX + 256];
            snprintf(path, sizeof(path), "%s/%s", c->dir, text);
            int fd = dshim_private_open(path, DSHIM_OPEN_TRUNC);
            c->cur[agent] = fd >= 0 ? fdopen(fd, "w") : NULL;
            if (fd >= 0 && c->cur[agent] == NULL) {
                close(fd);
            }
            c->nfiles += c->cur[agent] != NULL;
        }
        break;
    case RUN_FRAME_BYTES:
        if (c->cur[agent]) {
            unsigned char *raw = malloc(f->textlen / 4 * 3 + 3);
            long got = raw ? run_b64_decode(f->text, f->textlen, raw) : -1;
            if (got > 0) {
                fwrite(raw, 1, (size_t)got, c->cur[agent]);
            }
            free(raw);
        }
        break;
    case RUN_FRAME_PSTATE:
        if (f->idx >= 0 && f->idx < c->plan->nprocs && tl >= 5) {
            memcpy(text, f->text, tl);
            text[tl] = '\0';
            ystate_t *y = &c->y[f->idx];
            char ps = 0;
            if (sscanf(text, "%c %d %d", &ps, &y->asked, &y->answered) == 3) {
                y->pstate = ps == '?' ? 0 : ps;
                y->seen = true;
            }
        }
        break;
    case RUN_FRAME_COLLECTED: {
        memcpy(text, f->text, tl);
        text[tl] = '\0';
        int no = -1;
        if (sscanf(text, "%d", &no) == 1 && no == c->no) {
            if (c->cur[agent]) {
                fclose(c->cur[agent]);
                c->cur[agent] = NULL;
            }
            c->done[agent] = true;
        }
        break;
    }
    default:
        break;
    }
    return true;
}

void run_collect_agent_gone(run_collect_t *c, int agent)
{
    if (c && agent >= 0 && agent < c->nagents) {
        c->done[agent] = true;
    }
}

bool run_collect_complete(const run_collect_t *c)
{
    if (!run_collect_active(c)) {
        return false;
    }
    bool ack_due = dshim_now() >= c->started + RUN_COLLECT_ACK_S;
    for (int i = 0; i < c->nagents; i++) {
        if (!c->done[i] && (c->acked[i] || !ack_due)) {
            return false;  /* an agent that never acknowledged is not waited for past RUN_COLLECT_ACK_S */
        }
    }
    return true;
}

bool run_collect_overdue(const run_collect_t *c)
{
    return run_collect_active(c) && dshim_now() >= c->deadline;
}

int run_collect_wait_ms(const run_collect_t *c, int idle_ms)
{
    if (!run_collect_active(c) || dshim_now() >= c->deadline) {
        return idle_ms;
    }
    double now = dshim_now(), next = c->deadline;
    if (now < c->started + RUN_COLLECT_ACK_S) {
        next = c->started + RUN_COLLECT_ACK_S;  /* to give up on agents that did not acknowledge */
    }
    double left = next - now;
    int ms = left <= 0 ? 0 : (int)(left * 1000) + 1;
    return ms < idle_ms ? ms : idle_ms;
}

char *run_collect_finish(run_collect_t *c, dshim_trace_proc_t *procs, int nprocs, const char **dir)
{
    *dir = c->dir;
    c->active = false;
    for (int i = 0; i < c->nagents; i++) {
        if (c->cur[i]) {
            fclose(c->cur[i]);
            c->cur[i] = NULL;
        }
    }
    double waited = dshim_now() - c->started;
    for (int i = 0; i < nprocs && i < c->plan->nprocs; i++) {
        if (c->y[i].seen) {
            procs[i].pstate = c->y[i].pstate;
            procs[i].asked = c->y[i].asked;
            procs[i].answered = c->y[i].answered;
        }
    }
    if (c->nfiles == 0 && c->mode == RUN_COLLECT_FAILURE) {
        return NULL;  /* nothing uses the recorder here (no dshim in the processes): say nothing */
    }
    dshim_trace_set_t set;
    memset(&set, 0, sizeof(set));
    char err[256] = "";
    if (c->nfiles > 0 && make_collect_dir(c)) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof(path), "%s/launcher.jsonl", c->dir);
        dshim_trace_write_procs(path, procs, (size_t)nprocs, RUN_COLLECT_AGENT_WAIT_S);
        if (dshim_trace_load_dir(c->dir, &set, err, sizeof(err)) != 0) {
            memset(&set, 0, sizeof(set));
        }
    }
    if (set.procs == NULL && nprocs > 0) {
        set.procs = run_xmalloc((size_t)nprocs * sizeof(*set.procs));
        memcpy(set.procs, procs, (size_t)nprocs * sizeof(*set.procs));
        set.nprocs = (size_t)nprocs;
    }
    set.wait_s = RUN_COLLECT_AGENT_WAIT_S;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t now_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    char *text;
    if (c->mode == RUN_COLLECT_FAILURE) {
        char *full = dshim_trace_diagnose(&set, 0, now_ns);
        if (c->dir_made) {
            char path[PATH_MAX + 32];
            snprintf(path, sizeof(path), "%s/diagnosis.txt", c->dir);
            int fd = dshim_private_open(path, DSHIM_OPEN_TRUNC);
            FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
            if (f) {
                fputs(full, f);
                fclose(f);
            } else if (fd >= 0) {
                close(fd);
            }
        }
        free(full);
        text = dshim_trace_diagnose(&set, 10, now_ns);
    } else {
        /* the table, then who waits for whom at this moment, as the diagnosis says it */
        char *table = dshim_trace_status(&set, 20, now_ns);
        char *diag = set.n ? dshim_trace_diagnose(&set, 6, now_ns) : NULL;
        size_t cap = strlen(table) + (diag ? 2 * strlen(diag) : 0) + 64;
        text = run_xmalloc(cap);
        size_t len = (size_t)snprintf(text, cap, "%s", table);
        for (char *line = diag, *nl; line && *line && len < cap; line = nl + 1) {
            nl = strchr(line, '\n');
            int n = nl ? (int)(nl - line) : (int)strlen(line);
            len += (size_t)snprintf(text + len, cap - len, "now: %.*s\n", n, line);
            if (nl == NULL) {
                break;
            }
        }
        free(table);
        free(diag);
    }
    (void)waited;
    dshim_trace_set_free(&set);
    return text;
}
