/* Process spawning, reaping and descendants for controller and agents (child.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "config.h"
#include "run.h"

typedef struct {
    int step;  /* 1 = chdir, 2 = exec */
    int err;
} spawn_failure_t;

int run_child_spawn(const run_spawn_t *s, run_child_t *c, char *err, size_t errlen)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1}, er[2] = {-1, -1}, st[2] = {-1, -1};
    if ((s->stdin_pipe && pipe2(in, O_CLOEXEC) != 0) || pipe2(out, O_CLOEXEC) != 0 || pipe2(er, O_CLOEXEC) != 0 ||
        pipe2(st, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        if (s->own_pgrp) {
            setpgid(0, 0);
        }
        if (s->pdeathsig) {
            prctl(PR_SET_PDEATHSIG, s->pdeathsig);
            if (getppid() != parent) {
                _exit(1);  /* the parent died before prctl took effect */
            }
        }
        /* A clean signal state: the launcher blocks/ignores some for itself. */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int sig = 1; sig < 32; sig++) {
            if (sig != SIGKILL && sig != SIGSTOP) {
                signal(sig, SIG_DFL);
            }
        }
        int devnull = open("/dev/null", O_RDONLY);
        dup2(s->stdin_pipe ? in[0] : devnull, 0);
        dup2(out[1], 1);
        dup2(er[1], 2);
        spawn_failure_t f = {0, 0};
        if (s->cwd && chdir(s->cwd) != 0) {
            f.step = 1;
            f.err = errno;
        } else {
            if (s->envp) {
                execvpe(s->argv[0], s->argv, s->envp);
            } else {
                execvp(s->argv[0], s->argv);
            }
            f.step = 2;
            f.err = errno;
        }
        if (write(st[1], &f, sizeof(f)) < 0) {
            _exit(127);
        }
        _exit(127);
    }
    if (s->own_pgrp) {
        setpgid(pid, pid);  /* also here: no race with a kill(-pid) right after */
    }
    close(st[1]);
    if (s->stdin_pipe) {
        close(in[0]);
    }
    close(out[1]);
    close(er[1]);
    spawn_failure_t f = {0, 0};
    ssize_t r;
    do {
        r = read(st[0], &f, sizeof(f));
    } while (r < 0 && errno == EINTR);
    close(st[0]);
    c->pid = pid;
    c->in_fd = s->stdin_pipe ? in[1] : -1;
    c->out_fd = out[0];
    c->err_fd = er[0];
    if (r == (ssize_t)sizeof(f)) {
        if (f.step == 1) {
            snprintf(err, errlen, "cannot enter directory '%s': %s", s->cwd, strerror(f.err));
        } else {
            snprintf(err, errlen, "cannot run '%s': %s", s->argv[0], strerror(f.err));
        }
        return -1;  /* the child exits 127; the caller reaps it */
    }
    return 0;
}

run_exit_t run_exit_of(int status)
{
    return (run_exit_t){.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                        .sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0};
}

int run_exit_code(run_exit_t e)
{
    return e.sig ? 128 + (int)e.sig : (int)e.code;
}

void run_reap_each(void (*on_exit)(void *ctx, pid_t pid, int status), void *ctx)
{
    for (;;) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
            return;
        }
        on_exit(ctx, pid, status);
    }
}

void run_sweep_descendants(void)
{
    for (int i = 0; i < 50 && run_signal_descendants(getpid(), SIGKILL) > 0; i++) {
        usleep(20000);
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
}

typedef struct {
    pid_t pid, ppid;
} pp_t;

int run_signal_descendants(pid_t root, int sig)
{
    DIR *d = opendir("/proc");
    if (d == NULL) {
        return 0;
    }
    pp_t *all = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end = NULL;
        long pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0) {
            continue;
        }
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY);
        if (fd < 0) {
            continue;
        }
        ssize_t len = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (len <= 0) {
            continue;
        }
        buf[len] = '\0';
        /* "pid (comm) state ppid ..." where comm may contain spaces and ')' */
        char *rp = strrchr(buf, ')');
        char state = 0;
        long ppid = 0;
        if (rp == NULL || sscanf(rp + 1, " %c %ld", &state, &ppid) != 2 || state == 'Z') {
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            all = realloc(all, cap * sizeof(*all));
            if (all == NULL) {
                closedir(d);
                return 0;
            }
        }
        all[n].pid = (pid_t)pid;
        all[n].ppid = (pid_t)ppid;
        n++;
    }
    closedir(d);
    /* Breadth-first from root over the parent links. */
    pid_t *queue = malloc((n + 1) * sizeof(*queue));
    if (queue == NULL) {
        free(all);
        return 0;
    }
    size_t head = 0, tail = 0;
    queue[tail++] = root;
    int count = 0;
    while (head < tail) {
        pid_t p = queue[head++];
        for (size_t i = 0; i < n; i++) {
            if (all[i].ppid == p && all[i].pid != root) {
                queue[tail++] = all[i].pid;
                all[i].ppid = -1;  /* visit once */
                kill(all[i].pid, sig);
                count++;
            }
        }
    }
    free(queue);
    free(all);
    return count;
}

char *run_which(const char *prog)
{
    if (strchr(prog, '/')) {
        /* absolute, but symlinks kept: a venv's bin/python is a symlink whose
         * own path is what selects the venv's site-packages */
        if (access(prog, X_OK) != 0) {
            return NULL;
        }
        if (prog[0] == '/') {
            return run_xstrdup(prog);
        }
        char cwd[4096];
        char *abs = NULL;
        if (getcwd(cwd, sizeof(cwd)) == NULL || asprintf(&abs, "%s/%s", cwd, prog) < 0) {
            return NULL;
        }
        return abs;
    }
    const char *path = dshim_config()->path;
    if (path == NULL || path[0] == '\0') {
        path = "/usr/local/bin:/usr/bin:/bin";
    }
    char *copy = run_xstrdup(path);
    char *save = NULL;
    char *found = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
        char *full = NULL;
        if (asprintf(&full, "%s/%s", *dir ? dir : ".", prog) < 0) {
            break;
        }
        struct stat sb;
        if (stat(full, &sb) == 0 && S_ISREG(sb.st_mode) && access(full, X_OK) == 0) {
            found = full;
        } else {
            free(full);
        }
    }
    free(copy);
    return found;
}
