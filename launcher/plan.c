/*
 * The plan: from the options, decide every process of the job — name, host,
 * command line, environment — and the job-wide variables (rendezvous
 * addresses and ports, token, LD_PRELOAD).  The environment is what torchrun
 * or the dmlc tracker would give, plus dshim's own rendezvous variables.
 * All checks that can be done before starting anything happen here
 * (missing script, port in use, missing libdshim.so) and exit 2.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "child.h"
#include "config.h"
#include "log.h"
#include "net.h"
#include "collect.h"
#include "jobdir.h"
#include "node_rdzv.h"
#include "private_fs.h"
#include "run.h"

extern char **environ;

/* ---- ports and addresses ---------------------------------------------- */

static bool port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return false;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

static int pick_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(a);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        port = ntohs(a.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    if (port <= 0) {
        run_usage_error("cannot find a free TCP port on this host: %s", strerror(errno));
    }
    return port;
}

static const char *strip_user(const char *host)
{
    const char *at = strchr(host, '@');
    return at ? at + 1 : host;
}

/* This machine's address as the other hosts of the job reach it. */
static char *this_host_addr(const run_opts_t *o, bool single_host)
{
    if (single_host) {
        return run_xstrdup("127.0.0.1");
    }
    const char *toward = NULL;
    for (int i = 0; i < o->nhosts && !toward; i++) {
        if (!o->hosts[i].local) {
            toward = strip_user(o->hosts[i].name);
        }
    }
    struct in_addr a;
    char why[256] = "";
    if (toward) {
        if (dshim_net_pick_local_addr(toward, &a, why, sizeof(why)) != DSHIM_OK) {
            run_usage_error("cannot choose this host's address toward %s: %s; set DSHIM_SOCKET_IFNAME or "
                            "--master-addr", toward, dshim_last_error());
        }
        return run_xstrdup(inet_ntoa(a));
    }
    /* No peer to route toward (mpirun/srun place the processes): this host's name. */
    char name[256];
    if (gethostname(name, sizeof(name)) == 0) {
        name[sizeof(name) - 1] = '\0';
        if (dshim_net_resolve(name, &a) == DSHIM_OK && (ntohl(a.s_addr) >> 24) != 127) {
            return run_xstrdup(inet_ntoa(a));
        }
    }
    run_usage_error("cannot tell which address the other nodes reach this host at (its name resolves to "
                    "loopback); pass --master-addr or set DSHIM_SOCKET_IFNAME");
}

static bool addr_is_local(const char *host)
{
    struct in_addr a;
    /* a name that does not resolve is "not local": the caller's one line says so, no WARN line first */
    int level = dshim_log_level_current;
    dshim_log_level_current = DSHIM_LOG_NONE;
    dshim_status_t st = dshim_net_resolve(host, &a);
    dshim_log_level_current = level;
    if (st != DSHIM_OK) {
        return false;
    }
    if ((ntohl(a.s_addr) >> 24) == 127) {
        return true;
    }
    /* binding succeeds only on one of our own addresses */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = a};
    bool local = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    if (fd >= 0) {
        close(fd);
    }
    return local;
}

/* launch.py style: the scheduler runs on this host (as the dmlc tracker runs
 * it), at DMLC_PS_ROOT_URI = --master-addr (one of this host's addresses),
 * else what the other hosts reach this one at, where DSHIM_SOCKET_IFNAME (or
 * NCCL_/GLOO_SOCKET_IFNAME, DMLC_INTERFACE: the order dshim's sockets use)
 * picks the interface; on one machine that interface's address, else loopback. */
static char *scheduler_addr(const run_opts_t *o, bool single_host)
{
    struct in_addr a;
    /* failures below are reported as one usage line: no WARN line from the core first */
    int level = dshim_log_level_current;
    dshim_log_level_current = DSHIM_LOG_NONE;
    if (o->master_addr) {
        if (dshim_net_resolve(o->master_addr, &a) != DSHIM_OK) {
            run_usage_error("--master-addr %s: cannot resolve it; give one of this host's addresses (ip -4 addr)",
                            o->master_addr);
        }
        if (!addr_is_local(o->master_addr)) {
            run_usage_error("--master-addr %s is not an address of this host: in launch.py style the scheduler runs "
                            "on the launching host (as with launch.py); give one of this host's addresses (ip -4 addr)",
                            o->master_addr);
        }
        dshim_log_level_current = level;
        return run_xstrdup(o->master_addr);
    }
    const dshim_config_t *cfg = dshim_config();
    const char *lists[] = {cfg->socket_ifname, cfg->nccl_ifname, cfg->gloo_ifname, cfg->dmlc_interface};
    bool ifname_set = false;
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        ifname_set |= lists[i] != NULL && lists[i][0] != '\0';
    }
    if (!ifname_set || !single_host) {
        /* toward the other hosts, an interface list already decides (this_host_addr) */
        char *addr = this_host_addr(o, single_host);
        dshim_log_level_current = level;
        return addr;
    }
    char why[256] = "";
    /* one machine: the listed interface's address instead of loopback */
    if (dshim_net_pick_local_addr("127.0.0.1", &a, why, sizeof(why)) != DSHIM_OK) {
        run_usage_error("the scheduler's address (DMLC_PS_ROOT_URI): %s", dshim_last_error());
    }
    dshim_log_level_current = level;
    return run_xstrdup(inet_ntoa(a));
}

/* ---- environment --------------------------------------------------------- */

/* Variables never copied to other hosts: they describe this login session or
 * this launcher's own place in a resource manager, and would mislead there. */
static bool not_forwarded(const char *kv)
{
    static const char *const exact[] = {"HOSTNAME", "HOST", "HOME", "USER", "LOGNAME", "SHELL", "MAIL", "PWD",
                                        "OLDPWD", "SHLVL", "_", "TERM", "TERMCAP", "DISPLAY", "COLUMNS",
                                        "LINES", "STY", "WINDOW", "LS_COLORS", "DSHIM_RUN_SPEC", NULL};
    static const char *const prefix[] = {"SSH_", "XDG_", "TMUX", "OMPI_", "PMI_", "PMIX_", "SLURM_", "SLURMD_",
                                         "SRUN_", NULL};
    const char *eq = strchr(kv, '=');
    size_t klen = eq ? (size_t)(eq - kv) : strlen(kv);
    for (int i = 0; exact[i]; i++) {
        if (strlen(exact[i]) == klen && strncmp(kv, exact[i], klen) == 0) {
            return true;
        }
    }
    for (int i = 0; prefix[i]; i++) {
        if (strncmp(kv, prefix[i], strlen(prefix[i])) == 0) {
            return true;
        }
    }
    return false;
}

static char *random_token(void)
{
    unsigned char raw[16];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, raw, sizeof(raw)) != (ssize_t)sizeof(raw)) {
        run_usage_error("cannot read /dev/urandom for the job token: %s", strerror(errno));
    }
    close(fd);
    char *hex = run_xmalloc(2 * sizeof(raw) + 1);
    for (size_t i = 0; i < sizeof(raw); i++) {
        sprintf(hex + 2 * i, "%02x", raw[i]);
    }
    return hex;
}

/* ---- the program --------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static char *find_python(void)
{
    const char *forced = dshim_config()->run_python;
    if (forced && forced[0]) {
        char *p = run_which(forced);
        if (p == NULL) {
            run_usage_error("DSHIM_RUN_PYTHON=%s is not an executable; fix or unset it", forced);
        }
        return p;
    }
    char *p = run_which("python3");
    if (p == NULL) {
        p = run_which("python");
    }
    if (p == NULL) {
        run_usage_error("no python3 on PATH to run the script; activate your environment or set DSHIM_RUN_PYTHON");
    }
    /* keep the venv's own path (not the symlink target): it selects site-packages */
    return p;
}

static void check_script(const char *script)
{
    struct stat sb;
    if (stat(script, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        char cwd[4096] = "?";
        if (getcwd(cwd, sizeof(cwd)) == NULL) {
            snprintf(cwd, sizeof(cwd), "?");
        }
        run_usage_error("script '%s' not found (looked in %s); check the path", script, cwd);
    }
}

static void check_program(const char *prog)
{
    char *p = run_which(prog);
    if (p == NULL) {
        run_usage_error("program '%s' not found%s; check the name or give a path", prog,
                        strchr(prog, '/') ? " or not executable" : " on PATH");
    }
    free(p);
}

/* The argv every process runs, with "@LOCAL_RANK@" standing for the legacy argument. */
/* --run-path: torchrun runs the script with runpy.run_path(path, run_name="__main__") in a Python
 * interpreter, whatever the script's name and even with --no-python; so does this. */
static void run_path_argv(const run_opts_t *o, run_strv_t *argv, int *legacy_at)
{
    if (o->cmd[0][0] != '/') {
        run_usage_error("--run-path %s: give the script's absolute path (torchrun's rule: it is run with "
                        "runpy.run_path)", o->cmd[0]);
    }
    check_script(o->cmd[0]);
    char *py = find_python();
    run_strv_add(argv, py);
    free(py);
    run_strv_add(argv, "-c");
    run_strv_add(argv, "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')");
    run_strv_add(argv, o->cmd[0]);
    if (o->legacy_local_rank_arg) {
        *legacy_at = argv->n;
        run_strv_add(argv, "@LOCAL_RANK@");
    }
    for (int i = 1; i < o->ncmd; i++) {
        run_strv_add(argv, o->cmd[i]);
    }
}

static void base_argv(run_opts_t *o, run_strv_t *argv, int *legacy_at)
{
    *legacy_at = -1;
    if (o->run_path && o->style == RUN_STYLE_TORCH) {
        run_path_argv(o, argv, legacy_at);
        return;
    }
    if (o->style == RUN_STYLE_MXNET || o->no_python) {
        check_program(o->cmd[0]);
        if (o->ncmd > 1 && strstr(o->cmd[0], "python") && ends_with(o->cmd[1], ".py")) {
            check_script(o->cmd[1]);
        }
        for (int i = 0; i < o->ncmd; i++) {
            run_strv_add(argv, o->cmd[i]);
        }
        return;
    }
    bool is_py = o->module || ends_with(o->cmd[0], ".py");
    if (!is_py) {
        check_program(o->cmd[0]);
        for (int i = 0; i < o->ncmd; i++) {
            run_strv_add(argv, o->cmd[i]);
        }
        return;
    }
    char *py = find_python();
    run_strv_add(argv, py);
    free(py);
    if (o->module) {
        run_strv_add(argv, "-m");
    } else {
        check_script(o->cmd[0]);
    }
    run_strv_add(argv, o->cmd[0]);
    if (o->legacy_local_rank_arg) {
        *legacy_at = argv->n;
        run_strv_add(argv, "@LOCAL_RANK@");
    }
    for (int i = 1; i < o->ncmd; i++) {
        run_strv_add(argv, o->cmd[i]);
    }
}

/* ---- building ------------------------------------------------------------ */

typedef struct {
    run_strv_t env;
} proc_env_t;

static run_proc_t *add_proc(run_plan_t *plan, int *cap, const char *name, const char *file, int host, bool shown)
{
    if (plan->nprocs == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        plan->procs = realloc(plan->procs, (size_t)*cap * sizeof(*plan->procs));
        if (plan->procs == NULL) {
            run_usage_error("out of memory");
        }
    }
    run_proc_t *p = &plan->procs[plan->nprocs++];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(p->file, sizeof(p->file), "%s", file);
    p->local_rank = -1;
    p->host = host;
    p->shown = shown;
    return p;
}

static void set_proc_vectors(run_proc_t *p, run_strv_t *env, run_strv_t *argv)
{
    p->env = run_strv_terminated(env);
    p->nenv = env->n;
    p->argv = run_strv_terminated(argv);
    p->nargv = argv->n;
}

static void add_group(run_plan_t *plan, run_agent_kind_t kind, int host, int first, int count, int nnodes,
                      int per_node)
{
    plan->groups = realloc(plan->groups, (size_t)(plan->ngroups + 1) * sizeof(*plan->groups));
    if (plan->groups == NULL) {
        run_usage_error("out of memory");
    }
    plan->groups[plan->ngroups++] = (run_group_t){kind, host, first, count, nnodes, per_node};
}

static run_agent_kind_t kind_for_host(const run_opts_t *o, int host)
{
    if (o->launcher == RUN_LAUNCHER_SSH && host >= 0 && !o->hosts[host].local) {
        return RUN_AGENT_SSH;
    }
    return RUN_AGENT_LOCAL;
}

/* launch.py's --env/--env-server/--env-worker VAR:VAL, kept as "VAR=VAL" (flags.c): on top of the rest. */
static void apply_env_pairs(run_strv_t *env, const run_strv_t *pairs)
{
    for (int i = 0; i < pairs->n; i++) {
        const char *eq = strchr(pairs->v[i], '=');
        char *key = strndup(pairs->v[i], (size_t)(eq - pairs->v[i]));
        run_strv_setenv(env, key, "%s", eq + 1);
        free(key);
    }
}

static void torch_procs(run_opts_t *o, run_plan_t *plan, run_strv_t *common, const run_strv_t *argv0,
                        int legacy_at, bool per_node_mode, int attempt)
{
    int nproc = 0;  /* the most ranks a node runs */
    int world = 0;
    bool uneven = false;  /* --horovod-env with hosts of different slots=N */
    for (int node = 0; node < o->nnodes; node++) {
        int n = run_node_procs(o, node);
        world += n;
        uneven |= n != run_node_procs(o, 0);
        nproc = n > nproc ? n : nproc;
    }
    run_strv_setenv(common, "WORLD_SIZE", "%d", world);
    run_strv_setenv(common, "GROUP_WORLD_SIZE", "%d", o->nnodes);
    run_strv_setenv(common, "ROLE_WORLD_SIZE", "%d", world);
    if (!uneven) {
        run_strv_setenv(common, "LOCAL_WORLD_SIZE", "%d", nproc);
    }
    if (o->horovod_env) {
        run_horovod_common_env(common);
    }
    run_strv_setenv(common, "ROLE_NAME", "%s", o->role ? o->role : "default");
    run_strv_setenv(common, "TORCHELASTIC_RESTART_COUNT", "%d", attempt);
    run_strv_setenv(common, "TORCHELASTIC_MAX_RESTARTS", "%d", o->max_restarts);
    run_strv_setenv(common, "TORCHELASTIC_RUN_ID", "%s", o->rdzv_id ? o->rdzv_id : "none");
    /* rank 0 hosts torch's TCPStore itself: dshim-run is not a torch store */
    run_strv_setenv(common, "TORCHELASTIC_USE_AGENT_STORE", "False");
    run_strv_setenv(common, "TORCHELASTIC_SIGNALS_TO_HANDLE", "%s",
                    o->signals_to_handle ? o->signals_to_handle : "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
    const dshim_config_t *cfg = dshim_config();
    if (!dshim_config_is_set("TORCH_NCCL_ASYNC_ERROR_HANDLING")) {
        run_strv_setenv(common, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
    }
    int omp_nproc = per_node_mode ? run_node_procs(o, o->node_rank) : nproc;
    if (!dshim_config_is_set("OMP_NUM_THREADS") && omp_nproc > 1) {
        run_strv_setenv(common, "OMP_NUM_THREADS", "1");
        if (attempt == 0 && !o->dry_run) {
            run_say("setting OMP_NUM_THREADS=1 for each process (as torchrun does); set it yourself to tune");
        }
    }
    (void)cfg;
    int node_lo = per_node_mode ? o->node_rank : 0;
    int node_hi = per_node_mode ? o->node_rank + 1 : o->nnodes;
    int cap = 0;
    int node_first_rank = 0;
    for (int node = 0; node < node_lo; node++) {
        node_first_rank += run_node_procs(o, node);
    }
    for (int node = node_lo; node < node_hi; node++) {
        int host = (o->launcher == RUN_LAUNCHER_SSH) ? node : -1;
        int first = plan->nprocs;
        int node_procs = run_node_procs(o, node);
        for (int l = 0; l < node_procs; l++) {
            int rank = node_first_rank + l;
            char name[32], file[32];
            snprintf(name, sizeof(name), "rank %d", rank);
            snprintf(file, sizeof(file), "rank%d", rank);
            run_proc_t *p = add_proc(plan, &cap, name, file, host, rank == 0);
            p->local_rank = l;
            run_strv_t env = {0}, argv = {0};
            run_strv_setenv(&env, "RANK", "%d", rank);
            run_strv_setenv(&env, "LOCAL_RANK", "%d", l);
            run_strv_setenv(&env, "GROUP_RANK", "%d", node);
            run_strv_setenv(&env, "ROLE_RANK", "%d", rank);
            if (uneven) {
                run_strv_setenv(&env, "LOCAL_WORLD_SIZE", "%d", node_procs);
            }
            if (o->horovod_env) {
                run_horovod_rank_env(o, node, l, rank, world, &env);
            }
            apply_env_pairs(&env, &o->env_all);
            /* torch's @record writes a failing rank's exception here; the agent makes the directory */
            run_strv_setenv(&env, "TORCHELASTIC_ERROR_FILE", "%s/attempt_%d/%d/error.json", plan->jobdir,
                            attempt, rank);
            for (int i = 0; i < argv0->n; i++) {
                if (i == legacy_at) {
                    run_strv_addf(&argv, "--local%srank=%d", o->legacy_local_rank_arg == 2 ? "_" : "-", l);
                } else {
                    run_strv_add(&argv, argv0->v[i]);
                }
            }
            set_proc_vectors(p, &env, &argv);
        }
        if (o->launcher == RUN_LAUNCHER_LOCAL || o->launcher == RUN_LAUNCHER_SSH) {
            add_group(plan, kind_for_host(o, host), host, first, node_procs, 1, node_procs);
        }
        node_first_rank += node_procs;
    }
    if (o->launcher == RUN_LAUNCHER_MPI || o->launcher == RUN_LAUNCHER_SLURM) {
        add_group(plan, o->launcher == RUN_LAUNCHER_MPI ? RUN_AGENT_MPI : RUN_AGENT_SLURM, -1, 0, plan->nprocs,
                  o->nnodes, nproc);
    } else if (o->launcher == RUN_LAUNCHER_LOCAL && plan->ngroups > 1) {
        /* all on this machine: one agent */
        plan->ngroups = 1;
        plan->groups[0].count = plan->nprocs;
    }
}

static void mxnet_procs(run_opts_t *o, run_plan_t *plan, run_strv_t *common, const run_strv_t *argv0,
                        const char *root_uri, int root_port)
{
    int S = o->num_servers, N = o->num_workers;
    run_strv_setenv(common, "DMLC_PS_ROOT_URI", "%s", root_uri);
    run_strv_setenv(common, "DMLC_PS_ROOT_PORT", "%d", root_port);
    run_strv_setenv(common, "DMLC_NUM_SERVER", "%d", S);
    run_strv_setenv(common, "DMLC_NUM_WORKER", "%d", N);
    int cap = 0;
    /* The scheduler runs here, as the dmlc tracker runs it. */
    run_proc_t *sch = add_proc(plan, &cap, "scheduler", "scheduler", -1, false);
    {
        run_strv_t env = {0}, argv = {0};
        run_strv_setenv(&env, "DMLC_ROLE", "scheduler");
        apply_env_pairs(&env, &o->env_all);
        for (int i = 0; i < argv0->n; i++) {
            run_strv_add(&argv, argv0->v[i]);
        }
        set_proc_vectors(sch, &env, &argv);
    }
    add_group(plan, RUN_AGENT_LOCAL, -1, 0, 1, 1, 1);
    /* Servers first, then workers; with hosts, process i goes to hosts[i % nhosts] (ssh tracker). */
    int total = S + N;
    int nh = (o->launcher == RUN_LAUNCHER_SSH) ? o->nhosts : 1;
    for (int h = 0; h < nh; h++) {
        int first = plan->nprocs;
        for (int i = 0; i < total; i++) {
            if (o->launcher == RUN_LAUNCHER_SSH && i % o->nhosts != h) {
                continue;
            }
            bool server = i < S;
            int r = server ? i : i - S;
            char name[32], file[32];
            snprintf(name, sizeof(name), "%s %d", server ? "server" : "worker", r);
            snprintf(file, sizeof(file), "%s%d", server ? "server" : "worker", r);
            int host = o->launcher == RUN_LAUNCHER_SSH ? h : -1;
            run_proc_t *p = add_proc(plan, &cap, name, file, host, !server && r == 0);
            run_strv_t env = {0}, argv = {0};
            run_strv_setenv(&env, "DMLC_ROLE", server ? "server" : "worker");
            if (o->launcher == RUN_LAUNCHER_SSH) {
                run_strv_setenv(&env, "DMLC_NODE_HOST", "%s", strip_user(o->hosts[h].name));
            } else if (o->launcher == RUN_LAUNCHER_LOCAL) {
                run_strv_setenv(&env, "DMLC_TASK_ID", "%d", i);
                run_strv_setenv(&env, "DMLC_JOB_CLUSTER", "local");
            }
            apply_env_pairs(&env, &o->env_all);
            apply_env_pairs(&env, server ? &o->env_server : &o->env_worker);
            for (int k = 0; k < argv0->n; k++) {
                run_strv_add(&argv, argv0->v[k]);
            }
            set_proc_vectors(p, &env, &argv);
        }
        int count = plan->nprocs - first;
        if (count == 0) {
            continue;
        }
        if (o->launcher == RUN_LAUNCHER_SSH || o->launcher == RUN_LAUNCHER_LOCAL) {
            add_group(plan, kind_for_host(o, o->launcher == RUN_LAUNCHER_SSH ? h : -1),
                      o->launcher == RUN_LAUNCHER_SSH ? h : -1, first, count, 1, count);
        } else {
            add_group(plan, o->launcher == RUN_LAUNCHER_MPI ? RUN_AGENT_MPI : RUN_AGENT_SLURM, -1, first, count,
                      o->nhosts > 0 ? o->nhosts : 1, 0);
        }
    }
    if (o->launcher == RUN_LAUNCHER_LOCAL) {
        /* scheduler, servers and workers: one local agent */
        plan->ngroups = 1;
        plan->groups[0].count = plan->nprocs;
    }
}

char *run_self_exe(void)
{
    char *p = realpath("/proc/self/exe", NULL);
    if (p == NULL) {
        run_usage_error("cannot find dshim-run's own path: %s", strerror(errno));
    }
    return p;
}

/* Where libdshim.so lies relative to dshim-run's bin/ once installed (cmake/install.cmake
 * computes it from the install layout); a build tree keeps bin/ and lib/ side by side. */
#ifndef DSHIM_RUN_LIB_FROM_BIN
#define DSHIM_RUN_LIB_FROM_BIN "../lib"
#endif

/* The libdshim.so this dshim-run belongs to: the one installed (or built) with it,
 * never one found elsewhere, so a job preloads the library of the launcher it runs. */
char *run_find_libdshim(const char *exe)
{
    char *dir = run_xstrdup(exe);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
    }
    static const char *const rel[] = {DSHIM_RUN_LIB_FROM_BIN, "../lib"};
    char *tried = NULL;
    char *real = NULL;
    for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]) && real == NULL; i++) {
        char *lib = NULL;
        if (asprintf(&lib, "%s/%s/libdshim.so", dir, rel[i]) < 0) {
            run_usage_error("out of memory");
        }
        real = realpath(lib, NULL);
        if (tried == NULL) {
            tried = lib;
        } else {
            free(lib);
        }
    }
    free(dir);
    if (real == NULL) {
        run_usage_error("libdshim.so not found next to dshim-run (expected %s); reinstall dshim (pip install "
                        "dshim, or cmake --install), build it (make), or pass --no-preload",
                        tried);
    }
    free(tried);
    return real;
}

/* What every plan has: attempt, grace period, where processes start, dshim-run's and libdshim.so's paths. */
static void plan_basics(const run_opts_t *o, run_plan_t *plan, int attempt)
{
    memset(plan, 0, sizeof(*plan));
    plan->attempt = attempt;
    const dshim_config_t *cfg = dshim_config();
    plan->grace_s = cfg->run_kill_grace_s > 0 ? cfg->run_kill_grace_s : 5.0;
    char cwd[4096];
    if (getcwd(cwd, sizeof(cwd)) == NULL) {
        run_usage_error("cannot read the current directory: %s", strerror(errno));
    }
    plan->cwd = run_xstrdup(o->sync_dst_dir ? o->sync_dst_dir : cwd);
    plan->jobdir = run_jobdir_make(o->dry_run);
    plan->self_exe = run_self_exe();
    if (!o->no_preload) {
        plan->libdshim = run_find_libdshim(plan->self_exe);
    }
    if (o->launcher == RUN_LAUNCHER_SLURM && (cfg->slurm_job_id == NULL || cfg->slurm_job_id[0] == '\0')) {
        run_usage_error("--launcher slurm runs inside a Slurm allocation (SLURM_JOB_ID is not set): use "
                        "salloc ... dshim-run ... or an sbatch script (docs/launcher.md)");
    }
}

/* Whether the whole job runs on this machine (then loopback addresses do). */
static bool job_on_one_host(const run_opts_t *o, bool per_node_mode)
{
    if (o->launcher == RUN_LAUNCHER_SLURM) {
        return o->style == RUN_STYLE_TORCH ? o->nnodes == 1 : dshim_config()->slurm_nnodes <= 1;
    }
    bool all_hosts_local = true;
    for (int i = 0; i < o->nhosts; i++) {
        all_hosts_local &= o->hosts[i].local;
    }
    return !per_node_mode && all_hosts_local;
}

/* This host's address for the job: where the store (and MXNet's scheduler) is reached. */
static char *launcher_addr(const run_opts_t *o, bool per_node_mode, bool single_host)
{
    if (o->style != RUN_STYLE_TORCH) {
        return scheduler_addr(o, single_host);
    }
    if (o->local_addr && !addr_is_local(o->local_addr)) {
        run_usage_error("--local-addr %s is not an address of this host; give one of its addresses (ip -4 addr)",
                        o->local_addr);
    }
    /* a --master-addr naming this host is also how the others reach our store */
    if (o->master_addr && (per_node_mode || addr_is_local(o->master_addr))) {
        return run_xstrdup(o->master_addr);
    }
    if (o->local_addr) {
        return run_xstrdup(o->local_addr);  /* torchrun's --local-addr: how the others reach this node */
    }
    return this_host_addr(o, single_host);
}

/* This environment as every process gets it: without what describes this
 * session only, and with libdshim.so preloaded. */
static void forwarded_env(const run_plan_t *plan, run_strv_t *common)
{
    for (char **e = environ; *e; e++) {
        if (!not_forwarded(*e)) {
            run_strv_add(common, *e);
        }
    }
    if (plan->libdshim) {
        const char *pre = dshim_config()->ld_preload;
        if (pre && pre[0]) {
            run_strv_setenv(common, "LD_PRELOAD", "%s:%s", pre, plan->libdshim);
        } else {
            run_strv_setenv(common, "LD_PRELOAD", "%s", plan->libdshim);
        }
    }
}

/* dshim's rendezvous store: hosted by this controller (node 0's when every node runs its own). */
static void plan_store(const run_opts_t *o, run_plan_t *plan, bool per_node_mode, const char *here,
                       run_strv_t *common)
{
    const dshim_config_t *cfg = dshim_config();
    plan->host_store = !per_node_mode || o->node_rank == 0;
    if (cfg->job_token && cfg->job_token[0]) {
        plan->token = run_xstrdup(cfg->job_token);
    } else if (cfg->job_token_file && cfg->job_token_file[0]) {
        /* a secret that no command line shows (ps): every node reads the same file */
        char secret[1024], why[4400];
        if (dshim_read_secret_file(cfg->job_token_file, secret, sizeof(secret), why, sizeof(why)) != 0) {
            run_usage_error("DSHIM_JOB_TOKEN_FILE: %s", why);
        }
        plan->token = run_xstrdup(secret);
    } else if (per_node_mode) {
        /* nothing shared between the nodes' launchers but the command line,
         * which any local user reads with ps: DSHIM_JOB_TOKEN(_FILE) is the secret one */
        if (asprintf(&plan->token, "dshim-run:%s:%s:%d", o->rdzv_id ? o->rdzv_id : "none", o->master_addr,
                     o->master_port) < 0) {
            run_usage_error("out of memory");
        }
    } else {
        plan->token = random_token();
    }
    const char *store_addr;
    if (per_node_mode) {
        int mp = o->master_port > 0 ? o->master_port : 29500;
        plan->store_port = cfg->store_port > 0 ? (int)cfg->store_port : mp + 1;
        store_addr = o->master_addr;
    } else {
        plan->store_port = cfg->store_port > 0 ? (int)cfg->store_port : pick_free_port();
        store_addr = here;
    }
    if (plan->host_store && !port_free(plan->store_port)) {
        run_usage_error("port %d for dshim's rendezvous store is in use on this host; set DSHIM_STORE_PORT to a "
                        "free port", plan->store_port);
    }
    /* only where the job reaches it: store_addr is loopback on one host,
     * else this host's address toward the others (or --master-addr) */
    char bind_addr[INET_ADDRSTRLEN] = "";
    if (plan->host_store) {
        dshim_net_listen_addr(store_addr, "dshim-run's rendezvous store", bind_addr, sizeof(bind_addr));
    }
    plan->store_bind = run_xstrdup(bind_addr);
    plan->store_addr = run_xstrdup(store_addr);
    plan->per_node = per_node_mode;
    plan->node_rank = o->node_rank;
    run_strv_setenv(common, "DSHIM_STORE_ADDR", "%s", store_addr);
    run_strv_setenv(common, "DSHIM_STORE_PORT", "%d", plan->store_port);
    run_strv_setenv(common, "DSHIM_STORE_EXTERNAL", "1");
    run_strv_setenv(common, "DSHIM_JOB_TOKEN", "%s", plan->token);
}

/* torch's MASTER_ADDR and MASTER_PORT (rank 0's TCPStore), checked free when rank 0 runs here. */
static void torch_master(const run_opts_t *o, bool per_node_mode, const char *here, run_strv_t *common)
{
    const char *maddr = o->master_addr;
    bool master_local;
    if (maddr) {
        master_local = addr_is_local(maddr);
    } else if (o->hostfile && !o->hosts[0].local) {
        maddr = strip_user(o->hosts[0].name);
        master_local = false;
    } else {
        maddr = here;
        master_local = true;
    }
    int mport = o->master_port < 0 ? 29500 : o->master_port;
    if (o->master_port < 0 && o->horovod_env && master_local) {
        mport = 0;  /* Horovod's ranks do not use torch's store address: any free port, no clash between jobs */
    }
    /* rank 0 runs here (one node on this machine, or node 0 of a per-node run): a master address of
     * another host would leave torch's ranks retrying for 30 minutes; say so now */
    bool rank0_here = !o->hostfile && o->launcher == RUN_LAUNCHER_LOCAL && (!per_node_mode || o->node_rank == 0);
    if (o->master_addr && rank0_here && !master_local) {
        struct in_addr a;
        int level = dshim_log_level_current;
        dshim_log_level_current = DSHIM_LOG_NONE;
        bool resolves = dshim_net_resolve(o->master_addr, &a) == DSHIM_OK;
        dshim_log_level_current = level;
        run_usage_error("--master-addr %s %s, but rank 0 runs here (%s): give this host's address (ip -4 addr) or "
                        "127.0.0.1%s", o->master_addr, resolves ? "is not an address of this host" : "does not resolve",
                        per_node_mode ? "--node-rank 0" : "a one-node job",
                        per_node_mode ? ", and the same to every node" : "");
    }
    bool checks_here = master_local && (!per_node_mode || o->node_rank == 0);
    if (mport == 0) {
        if (!master_local) {
            run_usage_error("--master-port 0 (pick a free port) only works when rank 0 runs on this host; "
                            "give a port");
        }
        mport = pick_free_port();
    } else if (checks_here && !port_free(mport)) {
        run_usage_error("master port %d is in use on this host (another job?); pass --master-port with a free "
                        "port, or 0 to pick one", mport);
    }
    run_strv_setenv(common, "MASTER_ADDR", "%s", maddr);
    run_strv_setenv(common, "MASTER_PORT", "%d", mport);
}

/* MXNet's DMLC_PS_ROOT_PORT (the scheduler's). */
static int mxnet_root_port(const run_opts_t *o)
{
    int root_port = o->master_port > 0 ? o->master_port : -1;
    if (root_port > 0 && !port_free(root_port)) {
        run_usage_error("--master-port %d is in use on this host (another job?); give a free port, or 0 to "
                        "pick one", root_port);
    }
    /* without --master-port: the first free port of the dmlc tracker's range, as launch.py
     * (two jobs started at once may pick the same one: give each its own --master-port) */
    for (int p = 9091; p <= 9999 && root_port < 0 && o->master_port < 0; p++) {
        if (port_free(p)) {
            root_port = p;
        }
    }
    if (root_port < 0) {
        root_port = pick_free_port();
    }
    return root_port;
}

void run_build_plan(run_opts_t *o, run_plan_t *plan, int attempt)
{
    plan_basics(o, plan, attempt);
    bool torch = o->style == RUN_STYLE_TORCH;
    bool per_node_mode = torch && o->nnodes > 1 && !o->hostfile && o->launcher == RUN_LAUNCHER_LOCAL;
    char *here = launcher_addr(o, per_node_mode, job_on_one_host(o, per_node_mode));
    run_strv_t common = {0};
    forwarded_env(plan, &common);
    plan_store(o, plan, per_node_mode, here, &common);
    if (torch) {
        torch_master(o, per_node_mode, here, &common);
    }
    if (per_node_mode && !o->dry_run) {
        char name[256] = "?";
        if (o->local_addr) {
            snprintf(name, sizeof(name), "%s", o->local_addr);
        } else if (gethostname(name, sizeof(name)) != 0) {
            snprintf(name, sizeof(name), "?");
        }
        name[sizeof(name) - 1] = '\0';
        run_node_rendezvous(o, plan, attempt, name);
    }

    run_strv_t argv0 = {0};
    int legacy_at = -1;
    base_argv(o, &argv0, &legacy_at);
    if (torch) {
        torch_procs(o, plan, &common, &argv0, legacy_at, per_node_mode, attempt);
    } else {
        mxnet_procs(o, plan, &common, &argv0, here, mxnet_root_port(o));
    }
    run_collect_plan(o, plan, &common);
    plan->env = run_strv_terminated(&common);
    plan->nenv = common.n;
    run_strv_free(&argv0);
    free(here);
}

static const char *kind_name(run_agent_kind_t k)
{
    switch (k) {
    case RUN_AGENT_LOCAL: return "local";
    case RUN_AGENT_SSH: return "ssh";
    case RUN_AGENT_MPI: return "mpirun";
    default: return "srun";
    }
}

void run_print_plan(const run_opts_t *o, const run_plan_t *plan)
{
    printf("cwd: %s\n", plan->cwd);
    printf("job environment:\n");
    static const char *const shown_prefixes[] = {"DSHIM_", "MASTER_", "WORLD_SIZE", "GROUP_", "ROLE_", "LOCAL_",
                                                 "TORCH", "OMP_NUM_THREADS", "DMLC_", "LD_PRELOAD", "HOROVOD_",
                                                 NULL};
    for (int i = 0; i < plan->nenv; i++) {
        for (int k = 0; shown_prefixes[k]; k++) {
            if (strncmp(plan->env[i], shown_prefixes[k], strlen(shown_prefixes[k])) == 0) {
                printf("  %s\n", plan->env[i]);
                break;
            }
        }
    }
    for (int g = 0; g < plan->ngroups; g++) {
        const run_group_t *gr = &plan->groups[g];
        const char *host = gr->host >= 0 ? o->hosts[gr->host].name : "this host";
        printf("agent %d (%s, %s):\n", g, kind_name(gr->kind), gr->kind >= RUN_AGENT_MPI ? "placed" : host);
        for (int p = gr->first; p < gr->first + gr->count; p++) {
            const run_proc_t *pr = &plan->procs[p];
            printf("  [%s]", pr->name);
            for (int i = 0; i < pr->nenv; i++) {
                printf(" %s", pr->env[i]);
            }
            printf(" --");
            for (int i = 0; i < pr->nargv; i++) {
                char *q = run_shell_quote(pr->argv[i]);
                printf(" %s", q);
                free(q);
            }
            printf("\n");
        }
    }
}

static void free_vec(char **v, int n)
{
    for (int i = 0; i < n; i++) {
        free(v[i]);
    }
    free(v);
}

void run_free_plan(run_plan_t *plan)
{
    for (int i = 0; i < plan->nprocs; i++) {
        free_vec(plan->procs[i].env, plan->procs[i].nenv);
        free_vec(plan->procs[i].argv, plan->procs[i].nargv);
    }
    free(plan->procs);
    free(plan->groups);
    free_vec(plan->env, plan->nenv);
    free(plan->cwd);
    free(plan->store_bind);
    free(plan->store_addr);
    free(plan->token);
    free(plan->libdshim);
    free(plan->self_exe);
    free(plan->trace_dir);
    free(plan->jobdir);
    memset(plan, 0, sizeof(*plan));
}
