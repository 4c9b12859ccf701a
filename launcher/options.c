/*
 * Command-line options in both dialects users bring: torchrun's
 * (--nnodes/--nproc-per-node/..., dashes or underscores) and MXNet
 * tools/launch.py's (-n/-s/-H/--launcher/--sync-dst-dir).  The first word
 * that is not an option starts the user's command; everything after it is
 * the command's own.  Contradictions are refused here, before anything runs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collect.h"
#include "config.h"
#include "flags.h"
#include "run.h"

void run_print_usage(void)
{
    fputs(
        "usage: dshim-run [options] (train.py | -m module | program) [args...]\n"
        "\n"
        "torchrun style (one process per rank; RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR... set):\n"
        "  --nnodes N                 number of nodes (default 1, or every host of -H)\n"
        "  --nproc-per-node N|cpu|auto  processes per node (default 1)\n"
        "  --node-rank R              this node's rank when dshim-run is started on every node\n"
        "  --master-addr HOST         rank 0's host (default: loopback, or this host's address)\n"
        "  --master-port PORT         rank 0's port (default 29500; 0 = pick a free one)\n"
        "  --rdzv-endpoint HOST:PORT  same as --master-addr/--master-port\n"
        "  --rdzv-id ID               job id (TORCHELASTIC_RUN_ID)\n"
        "  --standalone               single node, free port\n"
        "  -m, --module               run the program as a Python module (python -m)\n"
        "  --no-python                run the program as is, even a .py file\n"
        "  --legacy-local-rank-arg    pass --local-rank=N to the script (torch.distributed.launch)\n"
        "  --legacy-local-rank-arg-underscore  pass --local_rank=N instead\n"
        "  --horovod-env              also Horovod's variables for every rank, as horovodrun sets them\n"
        "                             (HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*/HOSTNAME, HOROVOD_CONTROLLER=gloo);\n"
        "                             with -H, a host's slots=N is the number of ranks it runs (default\n"
        "                             --nproc-per-node), ranks filled host by host in order\n"
        "\n"
        "MXNet launch.py style (a scheduler, S servers and N workers; DMLC_* set):\n"
        "  -n, --num-workers N        number of workers\n"
        "  -s, --num-servers S        number of servers (default N)\n"
        "  --master-addr HOST         the scheduler's address (DMLC_PS_ROOT_URI), one of this host's\n"
        "                             (default: DSHIM_SOCKET_IFNAME's interface, else loopback or the\n"
        "                             address toward the other hosts)\n"
        "  --master-port PORT         the scheduler's port (DMLC_PS_ROOT_PORT; default the first free\n"
        "                             one from 9091, as launch.py; 0 = any free one)\n"
        "\n"
        "both:\n"
        "  -H, --hostfile FILE        hosts, one host[:ssh-port] per line\n"
        "  --launcher local|ssh|mpi|slurm  how processes reach hosts (default: ssh with -H, else local)\n"
        "  --sync-dst-dir DIR         rsync this directory to DIR on every host first; run there\n"
        "  --max-restarts K           restart the whole job up to K times after a failure\n"
        "  --log-dir DIR              also write each process's output to DIR/<role><rank>.log\n"
        "  --quiet-others             show only rank 0 (worker 0) on the terminal\n"
        "  --timeline FILE            write every rank's operations to FILE at the end (Chrome trace /\n"
        "                             Perfetto JSON: a track per rank, a span per collective; clocks aligned)\n"
        "  --no-preload               do not put libdshim.so in LD_PRELOAD (frameworks' own transport)\n"
        "  --dry-run                  print what would run (hosts, environment, commands) and exit\n"
        "  --print-config             print every DSHIM_* variable with its default and help\n"
        "  --status [PID]             status of a running dshim-run (the only one of yours, or PID): per rank\n"
        "                             its operation, for how long, waiting for whom, bytes; the stragglers\n"
        "  --diagnose DIR             read the flight-recorder dumps in DIR (a job's dshim-trace-* directory)\n"
        "  --print-lib                print the path of the libdshim.so this dshim-run preloads\n"
        "                             (for LD_PRELOAD=$(dshim-run --print-lib) python train.py)\n"
        "  --version                  print dshim's version\n"
        "  -h, --help                 this text\n"
        "\n"
        "torchrun's --tee/-t, --redirects/-r, --local-ranks-filter, --role, --run-path, --local-addr,\n"
        "--rdzv-conf, --logs-specs and launch.py's --env/--env-server/--env-worker VAR:VAL: as there;\n"
        "the table below (and docs/launcher.md) says what each flag does here.\n"
        "\n"
        "Environment: DSHIM_RUN_SSH, DSHIM_RUN_MPIRUN, DSHIM_RUN_SRUN, DSHIM_RUN_RSYNC, DSHIM_RUN_PYTHON,\n"
        "DSHIM_RUN_KILL_GRACE (see --print-config and docs/launcher.md).\n",
        stdout);
    fputs("\n", stdout);
    run_flags_print_table(stdout);
}

static long parse_int(const char *opt, const char *val, long lo, long hi)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (val[0] == '\0' || *end != '\0' || errno != 0 || v < lo || v > hi) {
        if (strchr(val, ':') && strcmp(opt, "--nnodes") == 0) {
            run_usage_error("--nnodes %s: elastic node ranges are not supported; give a fixed number of nodes", val);
        }
        run_usage_error("%s %s: expected a whole number from %ld to %ld", opt, val, lo, hi);
    }
    return v;
}

static int count_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int count_gpus(void)
{
    int n = 0;
    char path[32];
    for (int i = 0; i < 64; i++) {
        snprintf(path, sizeof(path), "/dev/nvidia%d", i);
        if (access(path, F_OK) == 0) {
            n++;
        }
    }
    return n;
}

static int parse_nproc(const char *val)
{
    if (strcmp(val, "cpu") == 0) {
        return count_cpus();
    }
    if (strcmp(val, "gpu") == 0 || strcmp(val, "auto") == 0) {
        int g = count_gpus();
        if (g == 0 && strcmp(val, "gpu") == 0) {
            run_usage_error("--nproc-per-node gpu: no GPU found on this machine; give a number");
        }
        return g > 0 ? g : count_cpus();
    }
    return (int)parse_int("--nproc-per-node", val, 1, 4096);
}

static bool takes_value(const char *name)
{
    return run_flag_takes_value(name);
}

typedef struct {
    bool torch_only;  /* some torchrun-only option seen (name kept for messages) */
    const char *torch_name;
    const char *mxnet_name;  /* a launch.py-only flag besides -n/-s (--env-server...) */
} seen_t;

/* One line naming the nearest known flag, exit 2. */
static void unknown_option(const char *given, const char *name)
{
    const char *near = run_flag_closest(name);
    if (near) {
        run_usage_error("unknown option %s; did you mean %s? (dshim-run --help lists every flag)", given, near);
    }
    run_usage_error("unknown option %s; dshim-run --help lists every flag", given);
}

static void apply(run_opts_t *o, seen_t *seen, const char *name, const char *val)
{
    /* --master-addr/--master-port are both styles': rank 0's, or the scheduler's address and
     * port (plan.c) */
    static const char *const torch_opts[] = {"--nnodes", "--nproc-per-node", "--node-rank",
                                             "--rdzv-endpoint", "--rdzv-id", "--rdzv-backend",
                                             "--standalone", "--module", "--no-python",
                                             "--legacy-local-rank-arg", "--legacy-local-rank-arg-underscore",
                                             "--horovod-env", NULL};
    for (int i = 0; torch_opts[i]; i++) {
        if (strcmp(name, torch_opts[i]) == 0) {
            seen->torch_only = true;
            seen->torch_name = torch_opts[i];
        }
    }
    if (strcmp(name, "--nnodes") == 0) {
        o->nnodes = (int)parse_int(name, val, 1, 65536);
    } else if (strcmp(name, "--nproc-per-node") == 0) {
        o->nproc_per_node = parse_nproc(val);
    } else if (strcmp(name, "--node-rank") == 0) {
        o->node_rank = (int)parse_int(name, val, 0, 65535);
    } else if (strcmp(name, "--master-addr") == 0) {
        if (!run_host_name_ok(val) || strchr(val, '@')) {
            run_usage_error("--master-addr '%s' is not a host name or IPv4 address", val);
        }
        o->master_addr = run_xstrdup(val);
    } else if (strcmp(name, "--master-port") == 0) {
        o->master_port = (int)parse_int(name, val, 0, 65535);
    } else if (strcmp(name, "--rdzv-endpoint") == 0) {
        const char *colon = strrchr(val, ':');
        char *host = colon ? strndup(val, (size_t)(colon - val)) : strdup(val);
        apply(o, seen, "--master-addr", host);
        free(host);
        if (colon) {
            o->master_port = (int)parse_int(name, colon + 1, 0, 65535);
        }
    } else if (strcmp(name, "--rdzv-id") == 0) {
        o->rdzv_id = run_xstrdup(val);
    } else if (strcmp(name, "--rdzv-backend") == 0) {
        if (strcmp(val, "static") != 0 && strcmp(val, "c10d") != 0) {
            run_usage_error("--rdzv-backend %s: dshim-run does its own rendezvous; use static or c10d (both mean "
                            "the same here)", val);
        }
    } else if (strcmp(name, "--standalone") == 0) {
        o->standalone = true;
    } else if (strcmp(name, "--module") == 0) {
        o->module = true;
    } else if (strcmp(name, "--no-python") == 0) {
        o->no_python = true;
    } else if (strcmp(name, "--legacy-local-rank-arg") == 0) {
        o->legacy_local_rank_arg = 1;
    } else if (strcmp(name, "--legacy-local-rank-arg-underscore") == 0) {
        o->legacy_local_rank_arg = 2;
    } else if (strcmp(name, "--horovod-env") == 0) {
        o->horovod_env = true;
    } else if (strcmp(name, "--num-workers") == 0) {
        o->num_workers = (int)parse_int("-n/--num-workers", val, 1, 65536);
    } else if (strcmp(name, "--num-servers") == 0) {
        o->num_servers = (int)parse_int("-s/--num-servers", val, 0, 65536);
    } else if (strcmp(name, "--hostfile") == 0) {
        o->hostfile = run_xstrdup(val);
    } else if (strcmp(name, "--launcher") == 0) {
        o->launcher_given = true;
        if (strcmp(val, "local") == 0) {
            o->launcher = RUN_LAUNCHER_LOCAL;
        } else if (strcmp(val, "ssh") == 0) {
            o->launcher = RUN_LAUNCHER_SSH;
        } else if (strcmp(val, "mpi") == 0) {
            o->launcher = RUN_LAUNCHER_MPI;
        } else if (strcmp(val, "slurm") == 0) {
            o->launcher = RUN_LAUNCHER_SLURM;
        } else if (strcmp(val, "sge") == 0 || strcmp(val, "yarn") == 0) {
            run_usage_error("--launcher %s is not supported: inside an SGE job use --launcher mpi (Open MPI reads "
                            "the SGE allocation); on YARN run dshim-run per container (docs/launcher.md)", val);
        } else {
            run_usage_error("--launcher %s: expected local, ssh, mpi or slurm", val);
        }
    } else if (strcmp(name, "--sync-dst-dir") == 0) {
        o->sync_dst_dir = run_xstrdup(val);
    } else if (strcmp(name, "--max-restarts") == 0) {
        o->max_restarts = (int)parse_int(name, val, 0, 1000);
    } else if (strcmp(name, "--log-dir") == 0) {
        o->log_dir = run_xstrdup(val);
    } else if (strcmp(name, "--timeline") == 0) {
        o->timeline = run_xstrdup(val);
    } else if (strcmp(name, "--no-preload") == 0) {
        o->no_preload = true;
    } else if (strcmp(name, "--quiet-others") == 0) {
        o->quiet_others = true;
    } else if (strcmp(name, "--dry-run") == 0) {
        o->dry_run = true;
    } else if (strcmp(name, "--help") == 0) {
        run_print_usage();
        exit(0);
    } else if (strcmp(name, "--print-config") == 0) {
        dshim_config_print(stdout, 0);
        exit(0);
    } else if (strcmp(name, "--diagnose") == 0) {
        exit(run_diagnose_main(val));
    } else if (strcmp(name, "--status") == 0) {
        exit(run_status_main(val));  /* val: an optional pid (run_parse_options) */
    } else if (strcmp(name, "--print-lib") == 0) {
        char *exe = run_self_exe();
        char *lib = run_find_libdshim(exe);
        printf("%s\n", lib);
        free(lib);
        free(exe);
        exit(0);
    } else if (strcmp(name, "--version") == 0) {
        printf("dshim-run (dshim) %d.%d.%d\n", DSHIM_VERSION_MAJOR, DSHIM_VERSION_MINOR, DSHIM_VERSION_PATCH);
        exit(0);
    } else {
        bool torch_only = false, mxnet_only = false;
        if (!run_apply_more(o, name, val, &torch_only, &mxnet_only)) {
            unknown_option(name, name);
        }
        if (torch_only) {
            seen->torch_only = true;
            seen->torch_name = name;
        }
        if (mxnet_only) {
            seen->mxnet_name = name;
        }
    }
}

/* --horovod-env with -H: each host runs its slots=N ranks (horovodrun writes the counts it
 * assigned), else --nproc-per-node.  mpirun and srun place the same number on every node. */
static void validate_horovod_slots(run_opts_t *o)
{
    if (!o->hostfile) {
        return;
    }
    int first = -1;
    bool uneven = false;
    for (int i = 0; i < o->nnodes && i < o->nhosts; i++) {
        int slots = o->hosts[i].slots;
        if (slots == 0 || slots > 4096) {
            run_usage_error("hostfile '%s': host %s has slots=%d; with --horovod-env a host runs slots=N ranks, "
                            "N from 1 to 4096 (leave out a host that runs none)", o->hostfile, o->hosts[i].name,
                            slots);
        }
        int n = slots > 0 ? slots : o->nproc_per_node;
        uneven |= first >= 0 && n != first;
        if (first < 0) {
            first = n;
        }
    }
    if (uneven && (o->launcher == RUN_LAUNCHER_MPI || o->launcher == RUN_LAUNCHER_SLURM)) {
        run_usage_error("hostfile '%s' gives the hosts different slots=N: --launcher %s places the same number "
                        "of ranks on every node; use the ssh launcher (the default with -H)", o->hostfile,
                        o->launcher == RUN_LAUNCHER_MPI ? "mpi" : "slurm");
    }
    if (!uneven && first > 0) {
        o->nproc_per_node = first;
    }
}

static void validate(run_opts_t *o, const seen_t *seen)
{
    if (o->ncmd == 0) {
        run_usage_error("no program given; usage: dshim-run [options] train.py [args...] (see --help)");
    }
    if (o->num_servers >= 0 && o->num_workers < 0) {
        run_usage_error("-s/--num-servers needs -n/--num-workers (MXNet launch.py style)");
    }
    if (o->num_workers >= 0) {
        if (seen->torch_only) {
            run_usage_error("%s is a torchrun-style option and -n/--num-workers a launch.py-style one; use one style",
                            seen->torch_name);
        }
        o->style = RUN_STYLE_MXNET;
        if (o->num_servers < 0) {
            o->num_servers = o->num_workers;  /* launch.py's default */
        }
    }
    if (o->hostfile) {
        run_read_hostfile(o->hostfile, &o->hosts, &o->nhosts);
    }
    if (!o->launcher_given) {
        o->launcher = o->hostfile ? RUN_LAUNCHER_SSH : RUN_LAUNCHER_LOCAL;
    }
    if (o->launcher == RUN_LAUNCHER_LOCAL && o->hostfile) {
        run_usage_error("--launcher local runs everything on this machine but -H %s names hosts; drop one of them",
                        o->hostfile);
    }
    if (o->launcher == RUN_LAUNCHER_SSH && !o->hostfile) {
        run_usage_error("--launcher ssh needs a hostfile: -H FILE with one host[:port] per line");
    }
    if (o->launcher == RUN_LAUNCHER_SLURM && o->hostfile) {
        run_usage_error("--launcher slurm takes its hosts from the Slurm allocation; drop -H %s", o->hostfile);
    }
    if (o->sync_dst_dir) {
        if (o->launcher != RUN_LAUNCHER_SSH) {
            run_usage_error("--sync-dst-dir copies to the hosts of --launcher ssh; it has no meaning with this "
                            "launcher");
        }
        if (o->sync_dst_dir[0] != '/') {
            run_usage_error("--sync-dst-dir %s: give an absolute path (it is used on every host)", o->sync_dst_dir);
        }
    }
    if (o->style == RUN_STYLE_MXNET) {
        run_validate_more(o);
        return;
    }
    if (seen->mxnet_name) {
        run_usage_error("%s is a launch.py-style option (with -n/--num-workers); torchrun style has no servers "
                        "or workers: use --env VAR:VAL", seen->mxnet_name);
    }
    run_validate_more(o);
    /* torchrun style */
    if (o->launcher == RUN_LAUNCHER_SLURM) {
        /* the allocation's shape, unless given: what an sbatch script asked for */
        const dshim_config_t *cfg = dshim_config();
        if (o->nnodes < 0 && cfg->slurm_nnodes > 0) {
            o->nnodes = (int)cfg->slurm_nnodes;
        }
        if (o->nproc_per_node < 0 && cfg->slurm_ntasks_per_node && atoi(cfg->slurm_ntasks_per_node) > 0) {
            o->nproc_per_node = atoi(cfg->slurm_ntasks_per_node);
        }
    }
    if (o->module && o->no_python) {
        run_usage_error("-m/--module and --no-python contradict each other; use one");
    }
    if (o->nproc_per_node < 0) {
        o->nproc_per_node = 1;
    }
    if (o->standalone) {
        if (o->nnodes > 1 || o->hostfile || o->master_addr || o->node_rank > 0) {
            run_usage_error("--standalone is a single-node job on this machine; drop --nnodes/--node-rank/"
                            "--master-addr/-H or drop --standalone");
        }
        o->nnodes = 1;
        if (o->master_port < 0) {
            o->master_port = 0;
        }
    }
    if (o->hostfile) {
        if (o->node_rank >= 0) {
            run_usage_error("with -H dshim-run starts every node itself; drop --node-rank (it is for starting "
                            "dshim-run on each node by hand)");
        }
        if (o->nnodes < 0) {
            o->nnodes = o->nhosts;
        }
        if (o->nnodes > o->nhosts && o->launcher != RUN_LAUNCHER_MPI) {
            run_usage_error("--nnodes %d but hostfile '%s' lists %d host(s); list more hosts or lower --nnodes",
                            o->nnodes, o->hostfile, o->nhosts);
        }
    }
    if (o->nnodes < 0) {
        o->nnodes = 1;
    }
    if (o->horovod_env) {
        validate_horovod_slots(o);
    }
    if (o->node_rank >= 0 && o->node_rank >= o->nnodes) {
        run_usage_error("--node-rank %d must be below --nnodes %d (node ranks count from 0)", o->node_rank,
                        o->nnodes);
    }
    bool per_node = o->nnodes > 1 && !o->hostfile && o->launcher == RUN_LAUNCHER_LOCAL;
    if (per_node && (o->master_addr == NULL || o->node_rank < 0)) {
        run_usage_error("--nnodes %d without a hostfile means dshim-run runs on every node: give each the same "
                        "--master-addr (node 0's address) and its own --node-rank; or pass -H hostfile and start it "
                        "once", o->nnodes);
    }
    if (o->node_rank < 0) {
        o->node_rank = 0;
    }
    if (o->launcher == RUN_LAUNCHER_MPI && o->nnodes > 1 && !o->hostfile) {
        run_usage_error("--launcher mpi with --nnodes %d needs -H hostfile to place the nodes", o->nnodes);
    }
}

void run_parse_options(int argc, char **argv, run_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->nnodes = o->nproc_per_node = o->node_rank = -1;
    o->master_port = -1;
    o->num_workers = o->num_servers = -1;
    seen_t seen = {0};
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0') {
            break;
        }
        char name[64];
        const char *val = NULL;
        if (a[1] != '-') {
            const char *l = run_flag_short(a[1]);
            if (l == NULL) {
                unknown_option(a, a);
            }
            snprintf(name, sizeof(name), "%s", l);
            if (a[2] != '\0') {
                if (!takes_value(name)) {
                    unknown_option(a, a);
                }
                val = a + 2;
            }
        } else {
            const char *eq = strchr(a, '=');
            size_t len = eq ? (size_t)(eq - a) : strlen(a);
            if (len >= sizeof(name)) {
                run_usage_error("unknown option %.40s...; dshim-run --help lists every flag", a);
            }
            memcpy(name, a, len);
            name[len] = '\0';
            for (char *p = name + 2; *p; p++) {
                if (*p == '_') {
                    *p = '-';
                }
            }
            if (eq) {
                if (!takes_value(name) && strcmp(name, "--status") != 0) {
                    run_usage_error("option %s takes no value (got '%s')", name, eq + 1);
                }
                val = eq + 1;
            }
        }
        if (strcmp(name, "--status") == 0 && val == NULL && i + 1 < argc && argv[i + 1][0] >= '0' &&
            argv[i + 1][0] <= '9') {
            val = argv[++i];  /* --status takes an optional pid */
        }
        if (takes_value(name) && val == NULL) {
            if (i + 1 >= argc) {
                run_usage_error("option %s needs a value", a);
            }
            val = argv[++i];
        }
        apply(o, &seen, name, val);
    }
    o->cmd = argv + i;
    o->ncmd = argc - i;
    validate(o, &seen);
}
