/* Expands shim/base/params.def into parsers and the printable table.  This is the
 * only file in dshim that calls getenv(). */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "status.h"

typedef struct param_row {
    const char *env;
    const char *def;
    const char *help;
    dshim_ptype_t type;
    size_t offset;
    int foreign;
} param_row_t;

static const param_row_t rows[] = {
#define DSHIM_PARAM(field, type, env, def, help) \
    {env, def, help, DSHIM_PTYPE_##type, offsetof(dshim_config_t, field), 0},
#define DSHIM_FOREIGN(field, type, env, def, help) \
    {env, def, help, DSHIM_PTYPE_##type, offsetof(dshim_config_t, field), 1},
#include "params.def"
#undef DSHIM_PARAM
#undef DSHIM_FOREIGN
};
#define NROWS (sizeof(rows) / sizeof(rows[0]))
_Static_assert(NROWS <= sizeof(((dshim_config_t *)0)->from_env), "grow from_env");

static dshim_config_t config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t config_lock = PTHREAD_MUTEX_INITIALIZER;

dshim_status_t dshim_config_parse_size(const char *text, size_t *out)
{
    char *end;
    errno = 0;
    while (isspace((unsigned char)*text)) {
        text++;
    }
    if (*text == '-' || !isdigit((unsigned char)*text)) {
        return DSHIM_ERR_INVALID;
    }
    unsigned long long v = strtoull(text, &end, 10);
    if (errno) {
        return DSHIM_ERR_INVALID;
    }
    unsigned long long mult = 1;
    switch (tolower((unsigned char)*end)) {
    case 'k': mult = 1ULL << 10; end++; break;
    case 'm': mult = 1ULL << 20; end++; break;
    case 'g': mult = 1ULL << 30; end++; break;
    default: break;
    }
    if (tolower((unsigned char)*end) == 'i' && mult > 1) {
        end++;
    }
    if (tolower((unsigned char)*end) == 'b') {
        end++;
    }
    if (*end != '\0' || (mult > 1 && v > (~0ULL) / mult)) {
        return DSHIM_ERR_INVALID;
    }
    *out = (size_t)(v * mult);
    return DSHIM_OK;
}

dshim_status_t dshim_config_parse_bool(const char *text, int *out)
{
    if (!strcasecmp(text, "1") || !strcasecmp(text, "yes") || !strcasecmp(text, "on") ||
        !strcasecmp(text, "true")) {
        *out = 1;
    } else if (!strcasecmp(text, "0") || !strcasecmp(text, "no") || !strcasecmp(text, "off") ||
               !strcasecmp(text, "false")) {
        *out = 0;
    } else {
        return DSHIM_ERR_INVALID;
    }
    return DSHIM_OK;
}

static dshim_status_t parse_value(const param_row_t *r, const char *text, dshim_config_t *cfg)
{
    void *field = (char *)cfg + r->offset;
    char *end;
    switch (r->type) {
    case DSHIM_PTYPE_STR: {
        char *dup = strdup(text);
        if (!dup) {
            return DSHIM_ERR_NOMEM;
        }
        *(char **)field = dup;
        return DSHIM_OK;
    }
    case DSHIM_PTYPE_INT: {
        errno = 0;
        long v = strtol(text, &end, 10);
        if (errno || end == text || *end != '\0') {
            return DSHIM_ERR_INVALID;
        }
        *(long *)field = v;
        return DSHIM_OK;
    }
    case DSHIM_PTYPE_SIZE:
        return dshim_config_parse_size(text, (size_t *)field);
    case DSHIM_PTYPE_BOOL:
        return dshim_config_parse_bool(text, (int *)field);
    case DSHIM_PTYPE_DOUBLE: {
        errno = 0;
        double v = strtod(text, &end);
        if (errno || end == text || *end != '\0' || v < 0) {
            return DSHIM_ERR_INVALID;
        }
        *(double *)field = v;
        return DSHIM_OK;
    }
    }
    return DSHIM_ERR_INVALID;
}

static const char *type_hint(dshim_ptype_t t)
{
    switch (t) {
    case DSHIM_PTYPE_STR: return "a string";
    case DSHIM_PTYPE_INT: return "an integer";
    case DSHIM_PTYPE_SIZE: return "a size such as 4096, 64k, 4m or 1g";
    case DSHIM_PTYPE_BOOL: return "0 or 1";
    case DSHIM_PTYPE_DOUBLE: return "a non-negative number";
    }
    return "?";
}

/* Fills cfg; returns the first bad value's status (the others still load). */
/* quiet: the caller refuses bad values itself (dshim-run exits 2), so no
 * warning and no "using the default" in the message. */
static dshim_status_t load(dshim_config_t *cfg, int quiet)
{
    dshim_status_t first_bad = DSHIM_OK;
    char first_msg[512] = "";
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < NROWS; i++) {
        const param_row_t *r = &rows[i];
        dshim_status_t st = parse_value(r, r->def, cfg);
        if (st != DSHIM_OK) {
            abort();  /* a default that does not parse is a bug in params.def */
        }
        const char *val = getenv(r->env);
        if (val == NULL || (val[0] == '\0' && r->type != DSHIM_PTYPE_STR)) {
            continue;
        }
        if (r->type == DSHIM_PTYPE_STR) {
            free(*(char **)((char *)cfg + r->offset));
        }
        st = parse_value(r, val, cfg);
        if (st != DSHIM_OK) {
            char msg[512];
            if (quiet) {
                snprintf(msg, sizeof(msg), "invalid value '%s' for %s: expected %s; fix or unset it (defaults: "
                         "dshim-run --print-config)", val, r->env, type_hint(r->type));
            } else {
                snprintf(msg, sizeof(msg),
                         "invalid value '%s' for %s: expected %s; using the default '%s' (see dshim-run "
                         "--print-config)", val, r->env, type_hint(r->type), r->def);
            }
            if (r->type != DSHIM_PTYPE_STR) {
                parse_value(r, r->def, cfg);
            }
            if (first_bad == DSHIM_OK) {
                first_bad = st;
                snprintf(first_msg, sizeof(first_msg), "%s", msg);
            }
            if (!quiet) {
                /* logging may not be set up yet: write directly */
                fprintf(stderr, "DSHIM WARN %s\n", msg);
            }
        } else {
            cfg->from_env[i] = 1;
        }
    }
    if (first_bad != DSHIM_OK) {
        dshim_error_set_raw(first_msg);
    }
    return first_bad;
}

static dshim_status_t load_status = DSHIM_OK;

static void config_once_fn(void)
{
    load_status = load(&config, 0);
}

const dshim_config_t *dshim_config(void)
{
    pthread_once(&config_once, config_once_fn);
    return &config;
}

/* Strings of replaced configurations: other threads may still hold
 * pointers into them, so they are kept (reachable) rather than freed. */
static char **retired;
static size_t nretired;

static void retire_strings(const dshim_config_t *old)
{
    for (size_t i = 0; i < NROWS; i++) {
        if (rows[i].type != DSHIM_PTYPE_STR) {
            continue;
        }
        char **grown = realloc(retired, (nretired + 1) * sizeof(char *));
        if (!grown) {
            return;
        }
        retired = grown;
        retired[nretired++] = *(char *const *)((const char *)old + rows[i].offset);
    }
}

dshim_status_t dshim_config_reload(void)
{
    dshim_config();
    pthread_mutex_lock(&config_lock);
    dshim_config_t fresh;
    dshim_status_t st = load(&fresh, 0);
    retire_strings(&config);
    config = fresh;
    pthread_mutex_unlock(&config_lock);
    return st;
}

dshim_status_t dshim_config_check(void)
{
    dshim_config_t scratch;
    dshim_status_t st = load(&scratch, 1);
    for (size_t i = 0; i < NROWS; i++) {
        if (rows[i].type == DSHIM_PTYPE_STR) {
            free(*(char **)((char *)&scratch + rows[i].offset));
        }
    }
    return st;
}

int dshim_config_is_set(const char *env_name)
{
    const dshim_config_t *cfg = dshim_config();
    for (size_t i = 0; i < NROWS; i++) {
        if (!strcmp(rows[i].env, env_name)) {
            return cfg->from_env[i];
        }
    }
    return 0;
}

static void print_value(FILE *out, const param_row_t *r, const dshim_config_t *cfg)
{
    const void *field = (const char *)cfg + r->offset;
    switch (r->type) {
    case DSHIM_PTYPE_STR: fprintf(out, "%s", *(char *const *)field); break;
    case DSHIM_PTYPE_INT: fprintf(out, "%ld", *(const long *)field); break;
    case DSHIM_PTYPE_SIZE: fprintf(out, "%zu", *(const size_t *)field); break;
    case DSHIM_PTYPE_BOOL: fprintf(out, "%d", *(const int *)field); break;
    case DSHIM_PTYPE_DOUBLE: fprintf(out, "%g", *(const double *)field); break;
    }
}

void dshim_config_print(FILE *out, int markdown)
{
    const dshim_config_t *cfg = dshim_config();
    if (markdown) {
        fprintf(out, "| variable | default | meaning |\n|---|---|---|\n");
        for (size_t i = 0; i < NROWS; i++) {
            if (!rows[i].foreign) {
                if (rows[i].def[0]) {
                    fprintf(out, "| `%s` | `%s` | %s |\n", rows[i].env, rows[i].def, rows[i].help);
                } else {
                    fprintf(out, "| `%s` | *(empty)* | %s |\n", rows[i].env, rows[i].help);
                }
            }
        }
        fprintf(out, "\nVariables of other frameworks that dshim honours:\n\n");
        fprintf(out, "| variable | meaning |\n|---|---|\n");
        for (size_t i = 0; i < NROWS; i++) {
            if (rows[i].foreign) {
                fprintf(out, "| `%s` | %s |\n", rows[i].env, rows[i].help);
            }
        }
        return;
    }
    fprintf(out, "dshim configuration (variable, default, current value, help)\n\n");
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            fprintf(out, "\nframework variables dshim also reads:\n\n");
        }
        for (size_t i = 0; i < NROWS; i++) {
            if (rows[i].foreign != pass) {
                continue;
            }
            fprintf(out, "%-26s default=%-9s value=", rows[i].env, rows[i].def[0] ? rows[i].def : "\"\"");
            print_value(out, &rows[i], cfg);
            fprintf(out, "%s\n    %s\n", cfg->from_env[i] ? " (from environment)" : "", rows[i].help);
        }
    }
}

DSHIM_EXPORT void dshim_print_config(void *file)
{
    dshim_config_print(file ? (FILE *)file : stdout, 0);
}

DSHIM_EXPORT int dshim_config_get(const char *name, char *buf, size_t len)
{
    const dshim_config_t *cfg = dshim_config();
    for (size_t i = 0; i < NROWS; i++) {
        if (strcmp(rows[i].env, name) != 0) {
            continue;
        }
        const void *field = (const char *)cfg + rows[i].offset;
        switch (rows[i].type) {
        case DSHIM_PTYPE_STR: snprintf(buf, len, "%s", *(char *const *)field); break;
        case DSHIM_PTYPE_INT: snprintf(buf, len, "%ld", *(const long *)field); break;
        case DSHIM_PTYPE_SIZE: snprintf(buf, len, "%zu", *(const size_t *)field); break;
        case DSHIM_PTYPE_BOOL: snprintf(buf, len, "%d", *(const int *)field); break;
        case DSHIM_PTYPE_DOUBLE: snprintf(buf, len, "%g", *(const double *)field); break;
        }
        return 0;
    }
    return -1;
}
