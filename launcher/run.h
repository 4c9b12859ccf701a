/*
 * dshim-run: shared types of the launcher.
 *
 * The launcher has two halves.  The *controller* (the process the user
 * starts) parses options, builds a plan (which process runs where, with which
 * environment and command line), hosts the rendezvous store and supervises.
 * An *agent* runs on each host (started directly, over ssh, or once per rank
 * by mpirun/srun), starts that host's processes, relays their output as
 * frames and kills them when told to or when the controller goes away.
 * See docs/launcher.md.
 */
#ifndef DSHIM_RUN_H
#define DSHIM_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Exit code for bad input and for anything that stops the job before it starts. */
#define RUN_EXIT_USAGE 2

/* A growable array of strings (argv/env building). */
typedef struct {
    char **v;
    int n;
    int cap;
} run_strv_t;

typedef enum { RUN_STYLE_TORCH, RUN_STYLE_MXNET } run_style_t;
typedef enum { RUN_LAUNCHER_LOCAL, RUN_LAUNCHER_SSH, RUN_LAUNCHER_MPI, RUN_LAUNCHER_SLURM } run_launcher_t;

typedef struct {
    char *name;  /* as written in the hostfile */
    int port;    /* ssh port; 0 = ssh's default */
    bool local;  /* one of this machine's addresses: started without ssh */
    int slots;   /* the line's slots=N (a negative N reads 0); -1 = not given */
} run_host_t;

typedef struct {
    run_style_t style;
    run_launcher_t launcher;
    bool launcher_given;
    /* torchrun style */
    int nnodes;          /* -1 = not given */
    int nproc_per_node;  /* -1 = not given */
    int node_rank;       /* -1 = not given */
    char *master_addr;   /* NULL = not given */
    int master_port;     /* -1 = not given, 0 = pick a free one */
    bool standalone;
    int legacy_local_rank_arg;  /* 0 = no, 1 = --local-rank=N, 2 = --local_rank=N */
    bool module;         /* -m: cmd[0] is a module */
    bool no_python;      /* run cmd as is, even a .py */
    char *rdzv_id;
    /* MXNet launch.py style */
    int num_workers;     /* -1 = not given */
    int num_servers;     /* -1 = not given */
    /* both */
    char *hostfile;
    char *sync_dst_dir;
    int max_restarts;
    bool no_preload;
    bool quiet_others;
    bool dry_run;
    char *log_dir;
    char *timeline;      /* --timeline FILE (timeline.c) */
    bool horovod_env;    /* --horovod-env: HOROVOD_* for every rank, slots=N ranks per host (plan.c) */
    char **cmd;  /* the user's program and arguments (points into argv) */
    int ncmd;
    run_host_t *hosts;
    int nhosts;
    /* per-node runs: every node's process count, learnt at the nodes' rendezvous (node_rdzv.c);
     * NULL = every node runs --nproc-per-node */
    int *node_nprocs;
    /* torchrun's output and naming flags (flags.c, logspec.c) */
    char *role;               /* --role: ROLE_NAME (default "default") */
    char *tee;                /* --tee/-t spec: "3" or "0:1,1:2"; NULL = none */
    char *redirects;          /* --redirects/-r spec */
    char *local_ranks_filter; /* --local-ranks-filter "0,1": console shows these local ranks only */
    char *local_addr;         /* --local-addr: this node's address as the other nodes are told it */
    char *logs_specs;
    bool run_path;            /* --run-path: run the script with Python's runpy.run_path */
    char *rdzv_conf;          /* --rdzv-conf k=v,... as given */
    double join_timeout_s;    /* its join_timeout: the nodes' wait (node_rdzv.c); 0 = DSHIM_CONNECT_TIMEOUT */
    char *signals_to_handle;  /* --signals-to-handle: TORCHELASTIC_SIGNALS_TO_HANDLE */
    /* launch.py's --env VAR:VAL (all), --env-server, --env-worker */
    run_strv_t env_all, env_server, env_worker;
} run_opts_t;

/* One process of the job. */
typedef struct {
    char name[48];   /* terminal prefix: "rank 3", "worker 1", "server 0", "scheduler" */
    char file[48];   /* log file stem: "rank3", "worker1", ... */
    int host;        /* index into opts.hosts; -1 = this machine or placed by mpirun/srun */
    int local_rank;  /* torch style: LOCAL_RANK (--tee, --redirects, --local-ranks-filter); else -1 */
    bool shown;      /* printed on the terminal under --quiet-others */
    char **env;      /* "K=V" set on top of the common environment */
    int nenv;
    char **argv;
    int nargv;
} run_proc_t;

/* Who starts a group of processes: one agent per host (local, ssh), or one
 * mpirun/srun whose per-rank agents each take procs[first + their rank]. */
typedef enum { RUN_AGENT_LOCAL, RUN_AGENT_SSH, RUN_AGENT_MPI, RUN_AGENT_SLURM } run_agent_kind_t;

typedef struct {
    run_agent_kind_t kind;
    int host;        /* RUN_AGENT_SSH/LOCAL: index into hosts, -1 = this machine */
    int first;       /* procs [first, first + count) */
    int count;
    int nnodes;      /* MPI/SLURM: nodes to spread over (block placement) */
    int per_node;    /* MPI/SLURM: processes per node */
} run_group_t;

typedef struct {
    run_proc_t *procs;
    int nprocs;
    run_group_t *groups;
    int ngroups;
    char **env;      /* common "K=V": forwarded from here + job-wide variables */
    int nenv;
    char *cwd;       /* where processes start (the --sync-dst-dir on every host) */
    double grace_s;  /* SIGTERM -> SIGKILL */
    int attempt;     /* 0, then 1.. for --max-restarts */
    /* what the controller hosts */
    bool host_store;        /* dshim rendezvous store in the controller */
    /* per-node runs: node 0's store, started by the nodes' rendezvous before the plan (node_rdzv.c);
     * the controller uses it and stops it.  NULL: the controller starts it */
    struct dshim_store_server *store_server;
    bool per_node;          /* torchrun multi-node: one dshim-run per node, node 0's hosts the store */
    int node_rank;
    char *store_addr;       /* as the ranks reach it */
    char *store_bind;       /* address the store binds ("" = all) */
    int store_port;         /* 0 = any */
    char *token;
    char *libdshim;         /* absolute path, NULL with --no-preload */
    char *self_exe;         /* absolute path of dshim-run (agents run it) */
    /* flight-recorder dumps (collect.h): the ranks' DSHIM_TRACE_DIR on every
     * host, NULL when the recorder is off; owned: made by dshim-run per job */
    char *trace_dir;
    bool trace_owned;
    /* the private per-job directory of this attempt (jobdir.h): torch's error
     * files, --timeline part files, dumps, the mpirun host file */
    char *jobdir;
} run_plan_t;


void run_strv_add(run_strv_t *sv, const char *s);
void run_strv_addf(run_strv_t *sv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Adds or replaces "K=V" by key. */
void run_strv_setenv(run_strv_t *sv, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *run_strv_getenv(const run_strv_t *sv, const char *key);
void run_strv_free(run_strv_t *sv);
/* NULL-terminated copy of the vector's array (the vector keeps ownership of strings). */
char **run_strv_terminated(run_strv_t *sv);

/* Prints "dshim-run: error: ..." and exits RUN_EXIT_USAGE. Only before anything was started. */
void run_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Prints "dshim-run: ..." to stderr. */
void run_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *run_xmalloc(size_t n);
char *run_xstrdup(const char *s);

/* options.c */
void run_parse_options(int argc, char **argv, run_opts_t *opts);
void run_print_usage(void);
/* hostfile.c: reads "host[:port]" lines; exits 2 with a line naming file:line on error. */
void run_read_hostfile(const char *path, run_host_t **hosts_p, int *nhosts_p);
bool run_host_name_ok(const char *name);
/* plan.c */
void run_build_plan(run_opts_t *opts, run_plan_t *plan, int attempt);
void run_print_plan(const run_opts_t *opts, const run_plan_t *plan);
void run_free_plan(run_plan_t *plan);
/* horovod_env.c: the ranks a node runs (its own count in per-node runs, a host's slots=N under --horovod-env, else
 * --nproc-per-node), and Horovod's variables (as horovodrun's gloo launcher sets them) */
int run_node_procs(const run_opts_t *opts, int node);
void run_horovod_common_env(run_strv_t *common);
void run_horovod_rank_env(const run_opts_t *opts, int node, int local_rank, int rank, int world, run_strv_t *env);
/* dshim-run's own absolute path, and the libdshim.so installed (or built) with it; both exit 2 when missing. */
char *run_self_exe(void);
char *run_find_libdshim(const char *exe);
/* controller.c: runs one attempt; returns the job's exit code.  *failed is set
 * when a process failed (a restart may help), not when the user interrupted. */
int run_controller(const run_opts_t *opts, run_plan_t *plan, bool *failed);
/* agent.c: `dshim-run --agent` (spec on stdin) and `--agent-rank` (spec in DSHIM_RUN_SPEC). */
int run_agent_main(bool rank_mode);
/* sync.c */
int run_sync_dirs(const run_opts_t *opts, const char *src, const char *dst);
/* quote.c: POSIX-shell single-quoted copy of s (malloc'ed). */
char *run_shell_quote(const char *s);
/* write() until done (blocking fd); 0 or -1. */
int run_write_all(int fd, const void *buf, size_t len);
/* Splits a command string ("ssh -F cfg") into words (no shell: whitespace only). */
void run_split_words(const char *s, run_strv_t *out);

#endif
