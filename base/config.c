/* Expands base/params.def into parsers and the printable table.  This is the
 * only file in dshim that calls getenv(). */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
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
    const char *allowed;  /* params.def's rule: "", one:, list:, range:, pow2: */
    const char *help;
    dshim_ptype_t type;
    size_t offset;
    int foreign;
} param_row_t;

static const param_row_t rows[] = {
#define DSHIM_PARAM(field, type, env, def, allowed, help) \
    {env, def, allowed, help, DSHIM_PTYPE_##type, offsetof(dshim_config_t, field), 0},
#define DSHIM_FOREIGN(field, type, env, def, allowed, help) \
    {env, def, allowed, help, DSHIM_PTYPE_##type, offsetof(dshim_config_t, field), 1},
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
        if (errno || end == text || *end != '\0' || !isfinite(v) || v < 0) {
            return DSHIM_ERR_INVALID;
        }
        *(double *)field = v;
        return DSHIM_OK;
    }
    }
    return DSHIM_ERR_INVALID;
}

/* ---- params.def's "allowed" column ------------------------------------ */

static const char *rule_body(const param_row_t *r, const char *kind)
{
    size_t n = strlen(kind);
    return strncmp(r->allowed, kind, n) == 0 ? r->allowed + n : NULL;
}

/* 1 if the n bytes at word are one of the '|'-separated words (any case:
 * every reader of these rows compares so). */
static int word_in(const char *words, const char *word, size_t n)
{
    for (const char *p = words; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncasecmp(p, word, n) == 0) {
            return 1;
        }
        p += len + (bar ? 1 : 0);
    }
    return 0;
}

static int list_ok(const char *words, const char *text)
{
    for (const char *p = text; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (!word_in(words, p, len)) {
            return 0;
        }
        p += len + (comma ? 1 : 0);
    }
    return 1;
}

/* "lo..hi" of a range: or pow2: rule, as the row's type. */
typedef struct bounds {
    long double lo, hi;
    char lo_text[32], hi_text[32];
} bounds_t;

static long double bound_value(const param_row_t *r, const char *text, int upper)
{
    if (!*text) {
        /* open end: the type's own limit */
        return r->type == DSHIM_PTYPE_INT ? (upper ? INT_MAX : INT_MIN)
             : r->type == DSHIM_PTYPE_SIZE ? (upper ? (long double)SIZE_MAX : 0)
                                           : (upper ? HUGE_VALL : 0);
    }
    if (r->type == DSHIM_PTYPE_SIZE) {
        size_t v = 0;
        if (dshim_config_parse_size(text, &v) != DSHIM_OK) {
            abort();  /* a bound that does not parse is a bug in params.def */
        }
        return (long double)v;
    }
    return strtold(text, NULL);
}

static void rule_bounds(const param_row_t *r, const char *body, bounds_t *b)
{
    const char *dots = strstr(body, "..");
    if (!dots) {
        abort();  /* params.def: range:/pow2: need lo..hi */
    }
    snprintf(b->lo_text, sizeof(b->lo_text), "%.*s", (int)(dots - body), body);
    snprintf(b->hi_text, sizeof(b->hi_text), "%s", dots + 2);
    b->lo = bound_value(r, b->lo_text, 0);
    b->hi = bound_value(r, b->hi_text, 1);
    if (!b->hi_text[0] && r->type == DSHIM_PTYPE_INT) {
        snprintf(b->hi_text, sizeof(b->hi_text), "%d", INT_MAX);
    }
}

static long double field_number(const param_row_t *r, const dshim_config_t *cfg)
{
    const void *field = (const char *)cfg + r->offset;
    switch (r->type) {
    case DSHIM_PTYPE_INT: return (long double)*(const long *)field;
    case DSHIM_PTYPE_SIZE: return (long double)*(const size_t *)field;
    case DSHIM_PTYPE_DOUBLE: return (long double)*(const double *)field;
    default: return 0;
    }
}

/* 1 if the parsed value in cfg (text as given) satisfies the row's rule. */
static int allowed_ok(const param_row_t *r, const char *text, const dshim_config_t *cfg)
{
    const char *body;
    if ((body = rule_body(r, "one:")) != NULL) {
        return word_in(body, text, strlen(text));
    }
    if ((body = rule_body(r, "list:")) != NULL) {
        return list_ok(body, text);
    }
    int pow2 = 0;
    if ((body = rule_body(r, "range:")) == NULL && (body = rule_body(r, "pow2:")) != NULL) {
        pow2 = 1;
    }
    bounds_t b = {.lo = INT_MIN, .hi = INT_MAX};
    if (body) {
        rule_bounds(r, body, &b);
    } else if (r->type != DSHIM_PTYPE_INT) {
        return 1;  /* the parser already checked all there is */
    }
    long double v = field_number(r, cfg);
    if (v < b.lo || v > b.hi) {
        return 0;
    }
    if (pow2) {
        size_t s = *(const size_t *)((const char *)cfg + r->offset);
        return s != 0 && (s & (s - 1)) == 0;
    }
    return 1;
}

static void words_list(const char *words, char *out, size_t len)
{
    size_t o = 0;
    out[0] = 0;
    for (const char *p = words; *p && o < len;) {
        const char *bar = strchr(p, '|');
        int n = bar ? (int)(bar - p) : (int)strlen(p);
        o += (size_t)snprintf(out + o, len - o, "%s%.*s", o ? ", " : "", n, p);
        p += n + (bar ? 1 : 0);
    }
}

static const char *type_noun(dshim_ptype_t t)
{
    switch (t) {
    case DSHIM_PTYPE_INT: return "an integer";
    case DSHIM_PTYPE_SIZE: return "a size";
    default: return "a number";
    }
}

/* What the row accepts, in words: for error messages and docs/env-vars.md. */
static void describe_allowed(const param_row_t *r, char *out, size_t len)
{
    char words[256];
    const char *body;
    if ((body = rule_body(r, "one:")) != NULL) {
        words_list(body, words, sizeof(words));
        snprintf(out, len, "one of %s", words);
    } else if ((body = rule_body(r, "list:")) != NULL) {
        words_list(body, words, sizeof(words));
        snprintf(out, len, "a comma-separated list of %s", words);
    } else if ((body = rule_body(r, "range:")) != NULL || (body = rule_body(r, "pow2:")) != NULL) {
        bounds_t b;
        rule_bounds(r, body, &b);
        int pow2 = rule_body(r, "pow2:") != NULL;
        const char *unit = r->type == DSHIM_PTYPE_SIZE ? " (a size such as 4096, 64k, 4m or 1g)" : "";
        if (b.hi_text[0]) {
            snprintf(out, len, "%s from %s to %s%s", pow2 ? "a power of two" : type_noun(r->type), b.lo_text,
                     b.hi_text, unit);
        } else {
            snprintf(out, len, "%s of at least %s%s", pow2 ? "a power of two" : type_noun(r->type), b.lo_text, unit);
        }
    } else {
        switch (r->type) {
        case DSHIM_PTYPE_STR: snprintf(out, len, "any string"); break;
        case DSHIM_PTYPE_INT: snprintf(out, len, "an integer from %d to %d", INT_MIN, INT_MAX); break;
        case DSHIM_PTYPE_SIZE: snprintf(out, len, "a size such as 4096, 64k, 4m or 1g"); break;
        case DSHIM_PTYPE_BOOL: snprintf(out, len, "0 or 1 (also no/yes, off/on, false/true)"); break;
        case DSHIM_PTYPE_DOUBLE: snprintf(out, len, "a number >= 0"); break;
        }
    }
}

/* Parses text into cfg and checks the row's rule; on failure writes the
 * one-line reason into msg (variable, value, what is allowed). */
static dshim_status_t parse_checked(const param_row_t *r, const char *text, dshim_config_t *cfg, char *msg,
                                    size_t len)
{
    dshim_status_t st = parse_value(r, text, cfg);
    if (st == DSHIM_ERR_NOMEM) {
        snprintf(msg, len, "%s: out of memory", r->env);
        return st;
    }
    if (st == DSHIM_OK && allowed_ok(r, text, cfg)) {
        return DSHIM_OK;
    }
    char allowed[384];
    describe_allowed(r, allowed, sizeof(allowed));
    snprintf(msg, len, "%s=%s: must be %s", r->env, text, allowed);
    return DSHIM_ERR_INVALID;
}

/* A STR row with choices treats an empty value as unset (as every non-STR
 * row does): "DSHIM_TRANSPORT=" means the default, not an unknown word. */
static int empty_means_unset(const param_row_t *r)
{
    return r->type != DSHIM_PTYPE_STR || rule_body(r, "one:") != NULL;
}

/* Fills cfg; returns the first bad value's status (the others still load). */
/* quiet: the caller refuses bad values itself (dshim-run exits 2), so no
 * warning and no "using the default" in the message. */
static dshim_status_t load(dshim_config_t *cfg, int quiet)
{
    dshim_status_t first_bad = DSHIM_OK;
    char first_msg[640] = "";
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < NROWS; i++) {
        const param_row_t *r = &rows[i];
        dshim_status_t st = parse_value(r, r->def, cfg);
        if (st != DSHIM_OK) {
            abort();  /* a default that does not parse is a bug in params.def */
        }
        const char *val = getenv(r->env);
        if (val == NULL || (val[0] == '\0' && empty_means_unset(r))) {
            continue;
        }
        if (r->type == DSHIM_PTYPE_STR) {
            free(*(char **)((char *)cfg + r->offset));
            *(char **)((char *)cfg + r->offset) = NULL;
        }
        char msg[512];
        st = parse_checked(r, val, cfg, msg, sizeof(msg));
        if (st != DSHIM_OK) {
            if (r->type == DSHIM_PTYPE_STR) {
                free(*(char **)((char *)cfg + r->offset));
            }
            parse_value(r, r->def, cfg);
            if (first_bad == DSHIM_OK) {
                /* for callers that refuse to start (dshim-run, init_env, NCCL) */
                first_bad = st;
                snprintf(first_msg, sizeof(first_msg), "%.512s; fix or unset it (defaults: dshim-run --print-config)",
                         msg);
            }
            if (!quiet) {
                /* logging may not be set up yet: write directly */
                fprintf(stderr, "DSHIM WARN %s; using the default '%s' (see dshim-run --print-config)\n", msg,
                        r->def);
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
    char allowed[384];
    if (markdown) {
        fprintf(out, "| variable | default | allowed | meaning |\n|---|---|---|---|\n");
        for (size_t i = 0; i < NROWS; i++) {
            if (!rows[i].foreign) {
                describe_allowed(&rows[i], allowed, sizeof(allowed));
                if (rows[i].def[0]) {
                    fprintf(out, "| `%s` | `%s` | %s | %s |\n", rows[i].env, rows[i].def, allowed, rows[i].help);
                } else {
                    fprintf(out, "| `%s` | *(empty)* | %s | %s |\n", rows[i].env, allowed, rows[i].help);
                }
            }
        }
        fprintf(out, "\nVariables of other frameworks that dshim honours:\n\n");
        fprintf(out, "| variable | allowed | meaning |\n|---|---|---|\n");
        for (size_t i = 0; i < NROWS; i++) {
            if (rows[i].foreign) {
                describe_allowed(&rows[i], allowed, sizeof(allowed));
                fprintf(out, "| `%s` | %s | %s |\n", rows[i].env, allowed, rows[i].help);
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
            describe_allowed(&rows[i], allowed, sizeof(allowed));
            fprintf(out, "%s\n    %s\n    allowed: %s\n", cfg->from_env[i] ? " (from environment)" : "",
                    rows[i].help, allowed);
        }
    }
}

DSHIM_EXPORT void dshim_print_config(void *file)
{
    dshim_config_print(file ? (FILE *)file : stdout, 0);
}

static void format_field(const param_row_t *r, const dshim_config_t *cfg, char *buf, size_t len)
{
    const void *field = (const char *)cfg + r->offset;
    switch (r->type) {
    case DSHIM_PTYPE_STR: snprintf(buf, len, "%s", *(char *const *)field); break;
    case DSHIM_PTYPE_INT: snprintf(buf, len, "%ld", *(const long *)field); break;
    case DSHIM_PTYPE_SIZE: snprintf(buf, len, "%zu", *(const size_t *)field); break;
    case DSHIM_PTYPE_BOOL: snprintf(buf, len, "%d", *(const int *)field); break;
    case DSHIM_PTYPE_DOUBLE: snprintf(buf, len, "%g", *(const double *)field); break;
    }
}

static const param_row_t *find_row(const char *name)
{
    for (size_t i = 0; i < NROWS; i++) {
        if (strcmp(rows[i].env, name) == 0) {
            return &rows[i];
        }
    }
    return NULL;
}

DSHIM_EXPORT int dshim_config_get(const char *name, char *buf, size_t len)
{
    if (name == NULL || buf == NULL) {
        /* the header's error value, not a crash in strcmp or snprintf */
        dshim_error_quiet(DSHIM_ERR_INVALID, "dshim_config_get: %s is NULL", name == NULL ? "name" : "buf");
        return -1;
    }
    const param_row_t *r = find_row(name);
    if (r == NULL) {
        return -1;
    }
    format_field(r, dshim_config(), buf, len);
    return 0;
}

/* One row parsed from the environment as it is now, by the table's rules (a
 * bad value: a warning and the default, as the table loads it), into a scratch
 * copy: the process's table stays as it was loaded. */
DSHIM_EXPORT int dshim_config_get_current(const char *name, char *buf, size_t len)
{
    if (name == NULL || buf == NULL) {
        dshim_error_quiet(DSHIM_ERR_INVALID, "dshim_config_get_current: %s is NULL", name == NULL ? "name" : "buf");
        return -1;
    }
    const param_row_t *r = find_row(name);
    if (r == NULL) {
        return -1;
    }
    static dshim_config_t zero;
    dshim_config_t *scratch = malloc(sizeof(*scratch));
    if (scratch == NULL) {
        dshim_error_quiet(DSHIM_ERR_NOMEM, "dshim_config_get_current: out of memory");
        return -1;
    }
    *scratch = zero;
    char **str = r->type == DSHIM_PTYPE_STR ? (char **)((char *)scratch + r->offset) : NULL;
    const char *val = getenv(r->env);
    char msg[512];
    int from_env = val != NULL && !(val[0] == '\0' && empty_means_unset(r));
    int bad = from_env && parse_checked(r, val, scratch, msg, sizeof(msg)) != DSHIM_OK;
    if (bad) {
        /* the table's own words at load (a value set after the load was never checked there) */
        fprintf(stderr, "DSHIM WARN %s; using the default '%s' (see dshim-run --print-config)\n", msg, r->def);
    }
    if (!from_env || bad) {
        if (str) {
            free(*str);
            *str = NULL;
        }
        if (parse_value(r, r->def, scratch) != DSHIM_OK) {
            free(scratch);
            dshim_error_quiet(DSHIM_ERR_NOMEM, "dshim_config_get_current: out of memory");
            return -1;
        }
    }
    format_field(r, scratch, buf, len);
    if (str) {
        free(*str);
    }
    free(scratch);
    return 0;
}
