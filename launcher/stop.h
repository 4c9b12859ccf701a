/*
 * The stop deadline of a job (controller) or of one host's processes
 * (agent): asked to stop (SIGTERM, "K") once, killed (SIGKILL) once the grace
 * period has passed, and how long a poll() may sleep meanwhile.
 */
#ifndef DSHIM_RUN_STOP_H
#define DSHIM_RUN_STOP_H

#include <stdbool.h>

typedef struct {
    bool stopping;   /* asked to stop */
    bool killed;     /* the kill deadline passed and the kill was sent */
    double kill_at;  /* dshim_now() time */
} run_stop_t;

/* true the first time only: the caller then asks everything to stop, and kills grace_s later. */
bool run_stop_begin(run_stop_t *s, double grace_s);
/* Moves the kill deadline to now (the user insisted). */
void run_stop_hurry(run_stop_t *s);
/* true once, when the deadline has passed: the caller then kills. */
bool run_stop_kill_due(run_stop_t *s);
/* poll() timeout: idle_ms before stopping; while stopping, until the
 * deadline but at most stopping_ms (the caller also looks around then). */
int run_stop_wait_ms(const run_stop_t *s, int idle_ms, int stopping_ms);

#endif
