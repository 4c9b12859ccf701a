/* The stop deadline (stop.h). */
#include "stop.h"

#include "net.h"

bool run_stop_begin(run_stop_t *s, double grace_s)
{
    if (s->stopping) {
        return false;
    }
    s->stopping = true;
    s->kill_at = dshim_now() + grace_s;
    return true;
}

void run_stop_hurry(run_stop_t *s)
{
    s->kill_at = 0;
}

bool run_stop_kill_due(run_stop_t *s)
{
    if (!s->stopping || s->killed || dshim_now() < s->kill_at) {
        return false;
    }
    s->killed = true;
    return true;
}

int run_stop_wait_ms(const run_stop_t *s, int idle_ms, int stopping_ms)
{
    if (!s->stopping) {
        return idle_ms;
    }
    if (s->killed) {
        return stopping_ms;  /* the deadline is behind us: only the children's ends are awaited */
    }
    double left = s->kill_at - dshim_now();
    int ms = left <= 0 ? 0 : (int)(left * 1000) + 1;
    return ms < stopping_ms ? ms : stopping_ms;
}
