/*
 * THE table of dshim-run's command-line flags: every torchrun 2.11 flag
 * (torch/distributed/run.py), every MXNet tools/launch.py flag and dshim's
 * own, each with whether it takes a value and what dshim-run does with it.
 * options.c asks it which flags take values and what a short flag means;
 * --help prints its status column (docs/launcher.md has the same table); an
 * unknown flag's error names the closest one here.  The flags torchrun and
 * launch.py have and options.c did not are applied here (run_apply_more).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"

typedef struct {
    const char *name;   /* normalised: dashes */
    char short_name;    /* 0 = none */
    bool value;
    const char *from;   /* "torchrun", "launch.py", "both", "dshim" */
    const char *status;
} flag_t;

static const flag_t flags[] = {
    {"--nnodes", 0, true, "torchrun", "yes: N; MIN:MAX (elastic) is refused"},
    {"--nproc-per-node", 0, true, "torchrun", "yes: N, cpu, gpu, auto; may differ per node"},
    {"--rdzv-backend", 0, true, "torchrun", "yes: static and c10d (dshim-run's own rendezvous)"},
    {"--rdzv-endpoint", 0, true, "torchrun", "yes: as --master-addr/--master-port"},
    {"--rdzv-id", 0, true, "torchrun", "yes: TORCHELASTIC_RUN_ID, part of the nodes' store token"},
    {"--rdzv-conf", 0, true, "torchrun", "yes: k=v,...; join_timeout bounds the nodes' wait, other keys accepted"},
    {"--standalone", 0, false, "torchrun", "yes"},
    {"--max-restarts", 0, true, "both", "yes: whole-job restarts"},
    {"--monitor-interval", 0, true, "torchrun", "accepted, no effect: the controller is woken by exits, not polled"},
    {"--start-method", 0, true, "torchrun", "accepted, no effect: every rank is a new process (fork+exec)"},
    {"--event-log-handler", 0, true, "torchrun", "accepted, no effect: dshim-run emits no torchelastic events"},
    {"--role", 0, true, "torchrun", "yes: ROLE_NAME"},
    {"--module", 'm', false, "torchrun", "yes"},
    {"--no-python", 0, false, "torchrun", "yes"},
    {"--run-path", 0, false, "torchrun", "yes: runpy.run_path(script) in Python (absolute path)"},
    {"--log-dir", 0, true, "both", "yes: DIR/<role><rank>.log; with --tee/--redirects torchrun's layout"},
    {"--redirects", 'r', true, "torchrun", "yes: streams to files only (3 or 0:1,1:2)"},
    {"--tee", 't', true, "torchrun", "yes: streams to files and the console"},
    {"--local-ranks-filter", 0, true, "torchrun", "yes: console shows these local ranks only"},
    {"--duplicate-stdout-filters", 0, true, "torchrun", "refused: not implemented"},
    {"--duplicate-stderr-filters", 0, true, "torchrun", "refused: not implemented"},
    {"--node-rank", 0, true, "torchrun", "yes"},
    {"--master-addr", 0, true, "both", "yes: must be this host where rank 0 (scheduler) runs here"},
    {"--master-port", 0, true, "both", "yes"},
    {"--local-addr", 0, true, "torchrun", "yes: this node's address (checked local; named at the rendezvous)"},
    {"--logs-specs", 0, true, "torchrun", "yes for the default; other entry points refused"},
    {"--numa-binding", 0, true, "torchrun", "refused: not implemented"},
    {"--signals-to-handle", 0, true, "torchrun", "accepted: TORCHELASTIC_SIGNALS_TO_HANDLE; dshim-run stops the "
                                                 "job on SIGINT/SIGTERM/SIGHUP"},
    {"--virtual-local-rank", 0, false, "torchrun", "refused: not implemented"},
    {"--num-workers", 'n', true, "launch.py", "yes"},
    {"--num-servers", 's', true, "launch.py", "yes"},
    {"--hostfile", 'H', true, "both", "yes"},
    {"--sync-dst-dir", 0, true, "launch.py", "yes"},
    {"--launcher", 0, true, "both", "yes: local, ssh, mpi, slurm (sge, yarn refused)"},
    {"--env-server", 0, true, "launch.py", "yes: VAR:VAL for servers"},
    {"--env-worker", 0, true, "launch.py", "yes: VAR:VAL for workers"},
    {"--env", 0, true, "launch.py", "yes: VAR:VAL for every process (VAR alone: this one's value)"},
    {"--p3", 0, false, "launch.py", "accepted, no effect: dshim's server has no P3 order; same results"},
    {"--legacy-local-rank-arg", 0, false, "dshim", "yes"},
    {"--legacy-local-rank-arg-underscore", 0, false, "dshim", "yes"},
    {"--horovod-env", 0, false, "dshim", "yes"},
    {"--quiet-others", 0, false, "dshim", "yes"},
    {"--timeline", 0, true, "dshim", "yes"},
    {"--no-preload", 0, false, "dshim", "yes"},
    {"--dry-run", 0, false, "dshim", "yes"},
    {"--print-config", 0, false, "dshim", "yes"},
    {"--status", 0, false, "dshim", "yes"},
    {"--diagnose", 0, true, "dshim", "yes"},
    {"--print-lib", 0, false, "dshim", "yes"},
    {"--version", 0, false, "dshim", "yes"},
    {"--help", 'h', false, "dshim", "yes"},
};

#define NFLAGS (sizeof(flags) / sizeof(flags[0]))

bool run_flag_takes_value(const char *name)
{
    for (size_t i = 0; i < NFLAGS; i++) {
        if (strcmp(flags[i].name, name) == 0) {
            return flags[i].value;
        }
    }
    return false;
}

const char *run_flag_short(char c)
{
    for (size_t i = 0; i < NFLAGS; i++) {
        if (flags[i].short_name == c && c != 0) {
            return flags[i].name;
        }
    }
    return NULL;
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t *row = calloc(lb + 1, sizeof(size_t));
    for (size_t j = 0; j <= lb; j++) {
        row[j] = j;
    }
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            best = up + 1 < best ? up + 1 : best;
            best = row[j - 1] + 1 < best ? row[j - 1] + 1 : best;
            row[j] = best;
            diag = up;
        }
    }
    size_t d = row[lb];
    free(row);
    return d;
}

const char *run_flag_closest(const char *name)
{
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < NFLAGS; i++) {
        size_t d = edit_distance(name, flags[i].name);
        if (d < best_d) {
            best_d = d;
            best = flags[i].name;
        }
    }
    /* a guess worth showing: a few letters off, not a different word */
    size_t len = strlen(name);
    return best_d <= (len > 12 ? len / 3 : 3) ? best : NULL;
}

void run_flags_print_table(FILE *f)
{
    fputs("every torchrun 2.11 and launch.py flag (and dshim's own), and what dshim-run does with it:\n", f);
    for (size_t i = 0; i < NFLAGS; i++) {
        char shown[48];
        if (flags[i].short_name) {
            snprintf(shown, sizeof(shown), "-%c, %s", flags[i].short_name, flags[i].name);
        } else {
            snprintf(shown, sizeof(shown), "%s", flags[i].name);
        }
        fprintf(f, "  %-36s %-9s %s\n", shown, flags[i].from, flags[i].status);
    }
}
