/* The parsed configuration: one immutable struct filled from base/params.def. */
#ifndef DSHIM_CONFIG_H
#define DSHIM_CONFIG_H

#include <stdio.h>
#include "dshim.h"

typedef enum { DSHIM_PTYPE_STR, DSHIM_PTYPE_INT, DSHIM_PTYPE_SIZE, DSHIM_PTYPE_BOOL, DSHIM_PTYPE_DOUBLE } dshim_ptype_t;

#define DSHIM_PT_STR    char *
#define DSHIM_PT_INT    long
#define DSHIM_PT_SIZE   size_t
#define DSHIM_PT_BOOL   int
#define DSHIM_PT_DOUBLE double

/* The most ranks a job may have; params.def's rank and size rows allow the
 * same (see its header for why), dshim_comm_init checks it for callers that
 * pass sizes directly. */
#define DSHIM_MAX_WORLD_SIZE (1 << 20)

typedef struct dshim_config {
#define DSHIM_PARAM(field, type, env, def, allowed, help) DSHIM_PT_##type field;
#define DSHIM_FOREIGN(field, type, env, def, allowed, help) DSHIM_PT_##type field;
#include "params.def"
#undef DSHIM_PARAM
#undef DSHIM_FOREIGN
    /* which fields were set from the environment (index = table row) */
    unsigned char from_env[128];
} dshim_config_t;

/* Parses the environment once (thread-safe); later calls return the same
 * struct.  A bad value is reported and replaced by its default. */
const dshim_config_t *dshim_config(void);
/* Reparse (tests only). Returns DSHIM_ERR_INVALID if any value was bad,
 * with the message in dshim_last_error(). */
dshim_status_t dshim_config_reload(void);
/* Parses the environment without logging or keeping anything: DSHIM_OK, or
 * DSHIM_ERR_INVALID with the first bad value in dshim_last_error() (for
 * callers that refuse to start, such as dshim-run). */
dshim_status_t dshim_config_check(void);
/* Parse one value with the table's parser for that variable (tests, CLI). */
dshim_status_t dshim_config_parse_size(const char *text, size_t *out);
dshim_status_t dshim_config_parse_bool(const char *text, int *out);
/* 1 if the variable (e.g. "DSHIM_SPIN_US") was set in the environment. */
int dshim_config_is_set(const char *env_name);
/* Writes the table as markdown (docs/env-vars.md) or as text. */
void dshim_config_print(FILE *out, int markdown);

#endif
