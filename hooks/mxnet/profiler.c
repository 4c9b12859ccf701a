/* MXNet's process profiler C API for dshim's kvstores, and the servers' side
 * of its commands.
 *
 * mx.profiler.set_config / set_state / pause / dump pass the last created
 * kvstore's handle to MXSetProcessProfilerConfig, MXSetProcessProfilerState,
 * MXProcessProfilePause and MXDumpProcessProfile.  With profile_process
 * 'server' libmxnet casts that handle to its own KVStore and calls
 * SetServerProfilerCommand: given dshim's handle it would crash.  So dshim
 * carries these four for its handles and sends the command as KVStoreDist
 * does (worker 0 only, kSetProfilerParams, body = parameters + the command's
 * digit); every other call (profile_process 'worker', MXNet's own handles)
 * goes to libmxnet unchanged.  A server applies the command to MXNet's
 * profiler of its own process, as KVStoreDistServer does, and answers with
 * MXNet's error when the profiler refuses (ps-lite's servers drop it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mxnet/kvstore.h"
#include "mxnet/profiler.h"
#include "status.h"

#define MX() dshim_mx_api()

/* include/mxnet/c_api.h ProfileProcess: kWorker = 0, kServer = 1 */
#define PROFILE_PROCESS_SERVER 1

/* include/mxnet/kvstore.h KVStoreServerProfilerCommand */
enum { PROFILER_SET_CONFIG = 0, PROFILER_STATE = 1, PROFILER_PAUSE = 2, PROFILER_DUMP = 3 };

/* most parameters one config may carry (MXNet's ProfileConfigParam has 10) */
#define MAX_CONFIG_PARAMS 32

/* --- worker side -------------------------------------------------------- */

/* Sends one server profiler command as KVStoreDist::SetServerProfilerCommand:
 * only worker 0 sends (the other workers' calls do nothing, as in MXNet). */
static int send_profiler_command(dshim_mxkv_t *kv, const char *call, const char *params, int type)
{
    if (kv->env.role != DSHIM_PS_WORKER || kv->node == NULL) {
        dshim_error(DSHIM_ERR_INVALID, "%s(profile_process='server') was called in a %s process: only workers command "
                    "the servers' profilers", call, dshim_ps_role_name(kv->env.role));
        return dshim_mxkv_fail();
    }
    if (kv->rank != 0) {
        return 0;
    }
    size_t n = strlen(params);
    char *body = malloc(n + 2);
    if (body == NULL) {
        dshim_error(DSHIM_ERR_NOMEM, "%s: out of memory", call);
        return dshim_mxkv_fail();
    }
    memcpy(body, params, n);
    body[n] = (char)('0' + type);
    body[n + 1] = '\0';
    /* after this worker's queued pushpulls, so that 'stop' comes after the work it measures */
    int rc = dshim_mxkv_async_drain(kv) == 0 &&
                     dshim_ps_worker_command(kv->node, DSHIM_PS_CMD_PROFILER, body) == DSHIM_OK
                 ? 0
                 : -1;
    free(body);
    return rc == 0 ? 0 : dshim_mxkv_fail();
}

/* profile_process of a config, as MXNet's ProfileConfigParam reads it (the last one wins) */
static int config_asks_server(int num, const char *const *keys, const char *const *vals)
{
    int server = 0;
    for (int i = 0; i < num; i++) {
        if (keys[i] != NULL && vals[i] != NULL && strcmp(keys[i], "profile_process") == 0) {
            server = strcmp(vals[i], "server") == 0;
        }
    }
    return server;
}

int dshim_MXSetProcessProfilerConfig(int num, const char *const *keys, const char *const *vals, KVStoreHandle h)
{
    if (!dshim_mxkv_is_ours(h) || num < 0 || keys == NULL || vals == NULL || !config_asks_server(num, keys, vals)) {
        return MX()->MXSetProcessProfilerConfig(num, keys, vals, h);
    }
    /* MXNet checks the parameters on every worker first (ProfileConfigParam); so does dshim, by
     * asking MXNet without a handle: it stops right after that check with this error */
    if (MX()->MXSetProcessProfilerConfig(num, keys, vals, NULL) != 0 &&
        strstr(MX()->MXGetLastError(), "KVStoreHandle passed to profiler is null") == NULL) {
        return -1; /* MXNet's own error about the parameters, as set */
    }
    /* MXNet's body: key:value pairs joined by ',', without profile_process (none is NULL: MXNet's
     * check above refused that) */
    size_t cap = 1;
    for (int i = 0; i < num; i++) {
        cap += strlen(keys[i]) + strlen(vals[i]) + 2;
    }
    char *params = malloc(cap);
    if (params == NULL) {
        dshim_error(DSHIM_ERR_NOMEM, "profiler.set_config: out of memory");
        return dshim_mxkv_fail();
    }
    size_t len = 0;
    for (int i = 0; i < num; i++) {
        if (strcmp(keys[i], "profile_process") == 0) {
            continue;
        }
        len += (size_t)snprintf(params + len, cap - len, "%s:%s%s", keys[i], vals[i], i != num - 1 ? "," : "");
    }
    params[len] = '\0';
    int rc = send_profiler_command(h, "MXSetProcessProfilerConfig", params, PROFILER_SET_CONFIG);
    free(params);
    return rc;
}

int dshim_MXSetProcessProfilerState(int state, int profile_process, KVStoreHandle h)
{
    if (!dshim_mxkv_is_ours(h) || profile_process != PROFILE_PROCESS_SERVER) {
        return MX()->MXSetProcessProfilerState(state, profile_process, h);
    }
    char params[16];
    snprintf(params, sizeof(params), "%d", state);
    return send_profiler_command(h, "MXSetProcessProfilerState", params, PROFILER_STATE);
}

int dshim_MXProcessProfilePause(int paused, int profile_process, KVStoreHandle h)
{
    if (!dshim_mxkv_is_ours(h) || profile_process != PROFILE_PROCESS_SERVER) {
        return MX()->MXProcessProfilePause(paused, profile_process, h);
    }
    char params[16];
    snprintf(params, sizeof(params), "%d", paused);
    return send_profiler_command(h, "MXProcessProfilePause", params, PROFILER_PAUSE);
}

int dshim_MXDumpProcessProfile(int finished, int profile_process, KVStoreHandle h)
{
    if (!dshim_mxkv_is_ours(h) || profile_process != PROFILE_PROCESS_SERVER) {
        return MX()->MXDumpProcessProfile(finished, profile_process, h);
    }
    char params[16];
    snprintf(params, sizeof(params), "%d", finished);
    return send_profiler_command(h, "MXDumpProcessProfile", params, PROFILER_DUMP);
}

/* --- server side -------------------------------------------------------- */

/* MXNet's last error as one line (its messages may carry a stack trace below);
 * the worker puts "server <rank> (host <h>): " in front */
static void mx_error_line(const char *what, char *err, size_t err_len)
{
    const char *e = MX()->MXGetLastError();
    if (e == NULL) {
        e = "";
    }
    if (strncmp(e, "MXNetError: ", 12) == 0) {
        e += 12;
    }
    snprintf(err, err_len, "MXNet's profiler refused %s: %.*s", what, (int)strcspn(e, "\n"), e);
}

/* KVStoreDistServer::SetProfilerConfig: "k:v,k:v[,]"; the file name gets
 * "rank<server rank>_" in front, as MXNet names each server's profile. */
static int apply_config(const dshim_mxkv_t *kv, char *params, char *err, size_t err_len)
{
    const char *keys[MAX_CONFIG_PARAMS], *vals[MAX_CONFIG_PARAMS];
    char *renamed = NULL;
    int n = 0, rc = 0;
    for (char *p = params; *p != '\0' && rc == 0;) {
        char *end = strchr(p, ',');
        if (end != NULL) {
            *end = '\0';
        }
        char *colon = strchr(p, ':');
        if (colon == NULL || colon == p || colon[1] == '\0' || strchr(colon + 1, ':') != NULL) {
            snprintf(err, err_len, "improper profiler config '%s' from a worker: each parameter is name:value "
                     "(MXNet's command has no room for ':' or ',' inside values)", p);
            rc = -1;
        } else if (n == MAX_CONFIG_PARAMS) {
            snprintf(err, err_len, "more than %d profiler parameters from a worker", MAX_CONFIG_PARAMS);
            rc = -1;
        } else {
            *colon = '\0';
            keys[n] = p;
            vals[n] = colon + 1;
            if (strcmp(p, "filename") == 0 && renamed == NULL &&
                asprintf(&renamed, "rank%d_%s", kv->rank, colon + 1) > 0) {
                vals[n] = renamed;
            }
            n++;
        }
        p = end != NULL ? end + 1 : p + strlen(p);
    }
    if (rc == 0 && MX()->MXSetProfilerConfig(n, keys, vals) != 0) {
        mx_error_line("the config", err, err_len);
        rc = -1;
    }
    free(renamed);
    return rc;
}

int dshim_mxkv_server_profiler(void *ctx, const char *body, char *err, size_t err_len)
{
    const dshim_mxkv_t *kv = ctx;
    size_t n = strlen(body);
    if (n == 0) {
        snprintf(err, err_len, "an empty profiler command from a worker");
        return -1;
    }
    int type = body[n - 1] - '0';
    int arg = body[0] - '0'; /* MXNet reads the first digit for state/pause/dump */
    int rc = 0;
    switch (type) {
    case PROFILER_SET_CONFIG: {
        char *params = strndup(body, n - 1);
        if (params == NULL) {
            snprintf(err, err_len, "out of memory");
            return -1;
        }
        rc = apply_config(kv, params, err, err_len);
        free(params);
        return rc;
    }
    case PROFILER_STATE:
        rc = MX()->MXSetProfilerState(arg);
        break;
    case PROFILER_PAUSE:
        rc = MX()->MXProfilePause(arg);
        break;
    case PROFILER_DUMP:
        rc = MX()->MXDumpProfile(arg);
        break;
    default:
        snprintf(err, err_len, "unknown profiler command %d from a worker (MXNet's are 0-3)", type);
        return -1;
    }
    if (rc != 0) {
        static const char *const what[] = {"the config", "the state change", "the pause", "the dump"};
        mx_error_line(what[type], err, err_len);
        return -1;
    }
    return 0;
}
