/*
 * The transports dshim knows, in order of preference: for each peer,
 * DSHIM_TRANSPORT=auto takes the first one that reaches it.  A new transport
 * is its folder under backends/transport/ plus its two lines here.
 */
#include <stdio.h>
#include <strings.h>

#include "transport/transport.h"

extern const dshim_transport_t dshim_transport_shm; /* shm/: ranks of one host */
extern const dshim_transport_t dshim_transport_tcp; /* tcp/: any peer; the fallback */

static const dshim_transport_t *const registry[] = {
    &dshim_transport_shm,
    &dshim_transport_tcp,
};

#define REGISTRY_SIZE ((int)(sizeof(registry) / sizeof(registry[0])))
_Static_assert(sizeof(registry) / sizeof(registry[0]) <= DSHIM_TRANSPORT_MAX,
               "raise DSHIM_TRANSPORT_MAX (it sizes the peer record and the waiter)");

int dshim_transport_count(void)
{
    return REGISTRY_SIZE;
}

const dshim_transport_t *dshim_transport_at(int index)
{
    return index >= 0 && index < REGISTRY_SIZE ? registry[index] : NULL;
}

int dshim_transport_index(const char *name)
{
    for (int i = 0; i < REGISTRY_SIZE; i++) {
        if (!strcasecmp(registry[i]->name, name)) {
            return i;
        }
    }
    return -1;
}

int dshim_transport_fallback(void)
{
    return dshim_transport_index(dshim_transport_tcp.name);
}

void dshim_transport_choices(char *out, size_t len)
{
    size_t o = (size_t)snprintf(out, len, "auto");
    for (int i = 0; i < REGISTRY_SIZE && o < len; i++) {
        o += (size_t)snprintf(out + o, len - o, ", %s", registry[i]->name);
    }
}
