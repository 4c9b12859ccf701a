/*
 * The torchrun and launch.py flags that options.c leaves to this file:
 * output routing (--tee, --redirects, --local-ranks-filter, --logs-specs),
 * naming (--role, --local-addr), how the script runs (--run-path), the
 * rendezvous' extra configuration (--rdzv-conf), launch.py's --env*, and the
 * flags accepted without effect (docs/launcher.md says why for each).
 * Bad values are refused here in one line, before anything runs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flags.h"
#include "logspec.h"
#include "net.h"

/* "VAR:VAL" -> "VAR=VAL"; "VAR" -> this environment's value (launch.py's --env passes it on). */
static void add_env_pair(run_strv_t *sv, const char *opt, const char *val)
{
    const char *colon = strchr(val, ':');
    size_t klen = colon ? (size_t)(colon - val) : strlen(val);
    if (klen == 0 || klen > 200 || strspn(val, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") !=
        klen || (val[0] >= '0' && val[0] <= '9')) {
        run_usage_error("%s %s: expected VARIABLE:VALUE (e.g. OMP_NUM_THREADS:3), as launch.py", opt, val);
    }
    char key[256];
    snprintf(key, sizeof(key), "%.*s", (int)klen, val);
    if (colon) {
        run_strv_addf(sv, "%s=%s", key, colon + 1);
        return;
    }
    /* a bare name: every process already gets this environment; a name not set here is not passed (launch.py) */
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, key, klen) == 0 && (*e)[klen] == '=') {
            run_strv_add(sv, *e);
        }
    }
}

static double parse_seconds(const char *opt, const char *val)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(val, &end);
    if (val[0] == '\0' || *end != '\0' || errno != 0 || !(v >= 0) || v > 1e7) {
        run_usage_error("%s %s: expected a number of seconds", opt, val);
    }
    return v;
}

/* torchrun's --rdzv-conf keys (RendezvousParameters and the c10d/static handlers' configs). */
static void parse_rdzv_conf(run_opts_t *o, const char *val)
{
    static const char *const known[] = {"timeout", "join_timeout", "last_call_timeout", "close_timeout",
                                        "read_timeout", "keep_alive_interval", "keep_alive_max_attempt", "is_host",
                                        "use_libuv", "rank", NULL};
    char *copy = run_xstrdup(val);
    for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        if (eq == NULL || eq == tok) {
            run_usage_error("--rdzv-conf %s: expected key=value pairs separated by commas (torchrun's format)", val);
        }
        *eq = '\0';
        bool ok = false;
        for (int i = 0; known[i]; i++) {
            ok |= strcmp(known[i], tok) == 0;
        }
        if (!ok) {
            run_usage_error("--rdzv-conf: unknown key '%s'; torchrun's keys are timeout, join_timeout, "
                            "last_call_timeout, close_timeout, read_timeout, keep_alive_interval, "
                            "keep_alive_max_attempt, is_host, use_libuv", tok);
        }
        if (strcmp(tok, "join_timeout") == 0) {
            o->join_timeout_s = parse_seconds("--rdzv-conf join_timeout", eq + 1);
        }
    }
    free(copy);
    free(o->rdzv_conf);
    o->rdzv_conf = run_xstrdup(val);
}

bool run_apply_more(run_opts_t *o, const char *name, const char *val, bool *torch_only, bool *mxnet_only)
{
    *torch_only = *mxnet_only = false;
    if (strcmp(name, "--tee") == 0 || strcmp(name, "--redirects") == 0) {
        const char *why = run_std_spec_error(val);
        if (why) {
            run_usage_error("%s %s: %s", name, val, why);
        }
        char **dst = name[2] == 't' ? &o->tee : &o->redirects;
        free(*dst);
        *dst = strcmp(val, "0") == 0 ? NULL : run_xstrdup(val);
    } else if (strcmp(name, "--local-ranks-filter") == 0) {
        const char *why = run_ranks_filter_error(val);
        if (why) {
            run_usage_error("--local-ranks-filter %s: %s", val, why);
        }
        free(o->local_ranks_filter);
        o->local_ranks_filter = run_xstrdup(val);
    } else if (strcmp(name, "--role") == 0) {
        if (val[0] == '\0' || strchr(val, '=') || strchr(val, '\n')) {
            run_usage_error("--role '%s': give a name (it becomes ROLE_NAME)", val);
        }
        o->role = run_xstrdup(val);
    } else if (strcmp(name, "--local-addr") == 0) {
        if (!run_host_name_ok(val)) {
            run_usage_error("--local-addr '%s' is not a host name or IPv4 address", val);
        }
        o->local_addr = run_xstrdup(val);
    } else if (strcmp(name, "--run-path") == 0) {
        o->run_path = true;
    } else if (strcmp(name, "--logs-specs") == 0) {
        if (strcmp(val, "default") != 0) {
            run_usage_error("--logs-specs %s: dshim-run writes torchrun's default layout (--logs-specs default); "
                            "other LogsSpecs classes are Python entry points it cannot load", val);
        }
    } else if (strcmp(name, "--rdzv-conf") == 0) {
        parse_rdzv_conf(o, val);
    } else if (strcmp(name, "--monitor-interval") == 0) {
        (void)parse_seconds(name, val);  /* checked as torchrun would; no effect (flags.c says why) */
    } else if (strcmp(name, "--start-method") == 0) {
        if (strcmp(val, "spawn") != 0 && strcmp(val, "fork") != 0 && strcmp(val, "forkserver") != 0) {
            run_usage_error("--start-method %s: expected spawn, fork or forkserver (torchrun's choices)", val);
        }
    } else if (strcmp(name, "--event-log-handler") == 0) {
        /* accepted: dshim-run emits no torchelastic events */
    } else if (strcmp(name, "--signals-to-handle") == 0) {
        free(o->signals_to_handle);
        o->signals_to_handle = run_xstrdup(val);
    } else if (strcmp(name, "--duplicate-stdout-filters") == 0 || strcmp(name, "--duplicate-stderr-filters") == 0 ||
               strcmp(name, "--numa-binding") == 0 || strcmp(name, "--virtual-local-rank") == 0) {
        run_usage_error("%s is torchrun's but dshim-run does not implement it; leave it out (docs/launcher.md, "
                        "flags table)", name);
    } else if (strcmp(name, "--env") == 0) {
        add_env_pair(&o->env_all, name, val);
        return true;  /* both styles */
    } else if (strcmp(name, "--env-server") == 0 || strcmp(name, "--env-worker") == 0) {
        add_env_pair(name[6] == 's' ? &o->env_server : &o->env_worker, name, val);
        *mxnet_only = true;
        return true;
    } else if (strcmp(name, "--p3") == 0) {
        *mxnet_only = true;  /* accepted: dshim's parameter server has no P3 order; results are the same */
        return true;
    } else {
        return false;
    }
    *torch_only = true;
    return true;
}

void run_validate_more(const run_opts_t *o)
{
    if ((o->tee || o->redirects || o->local_ranks_filter) && o->style != RUN_STYLE_TORCH) {
        run_usage_error("--tee/--redirects/--local-ranks-filter name local ranks (torchrun style); in launch.py "
                        "style use --log-dir and --quiet-others");
    }
    if (o->local_addr) {
        struct in_addr a;
        if (dshim_net_resolve(o->local_addr, &a) != DSHIM_OK) {
            run_usage_error("--local-addr %s: cannot resolve it; give one of this host's addresses (ip -4 addr)",
                            o->local_addr);
        }
    }
}
