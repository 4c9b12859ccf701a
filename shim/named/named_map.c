/* Name -> pointer hash map: the names pending on this rank (duplicate check
 * at submit), the negotiation table, the timeline's tensors.  Chained
 * through nodes that live in the values, FNV-1a, doubling. */
#include <stdlib.h>
#include <string.h>

#include "named.h"
#include "status.h"

static size_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) {
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    }
    return (size_t)h;
}

void *dshim_named_map_get(const dshim_named_map_t *m, const char *key)
{
    if (m->nbuckets == 0) {
        return NULL;
    }
    for (dshim_named_map_node_t *n = m->buckets[hash_name(key) & (m->nbuckets - 1)]; n; n = n->next) {
        if (strcmp(n->key, key) == 0) {
            return n->val;
        }
    }
    return NULL;
}

static dshim_status_t grow(dshim_named_map_t *m)
{
    size_t nb = m->nbuckets ? m->nbuckets * 2 : 64;
    dshim_named_map_node_t **b = calloc(nb, sizeof(*b));
    if (!b) {
        return dshim_error(DSHIM_ERR_NOMEM, "named operations: out of memory (name table)");
    }
    for (size_t i = 0; i < m->nbuckets; i++) {
        dshim_named_map_node_t *n = m->buckets[i];
        while (n) {
            dshim_named_map_node_t *next = n->next;
            size_t at = hash_name(n->key) & (nb - 1);
            n->next = b[at];
            b[at] = n;
            n = next;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = nb;
    return DSHIM_OK;
}

dshim_status_t dshim_named_map_put(dshim_named_map_t *m, dshim_named_map_node_t *n, const char *key, void *val)
{
    if (m->count >= m->nbuckets) {
        DSHIM_CHECK(grow(m));
    }
    size_t at = hash_name(key) & (m->nbuckets - 1);
    n->key = key;
    n->val = val;
    n->next = m->buckets[at];
    m->buckets[at] = n;
    m->count++;
    return DSHIM_OK;
}

void *dshim_named_map_del(dshim_named_map_t *m, const char *key)
{
    if (m->nbuckets == 0) {
        return NULL;
    }
    dshim_named_map_node_t **p = &m->buckets[hash_name(key) & (m->nbuckets - 1)];
    for (; *p; p = &(*p)->next) {
        if (strcmp((*p)->key, key) == 0) {
            dshim_named_map_node_t *n = *p;
            void *val = n->val;
            *p = n->next;
            n->next = NULL;
            m->count--;
            return val;
        }
    }
    return NULL;
}

void dshim_named_map_free(dshim_named_map_t *m)
{
    free(m->buckets);
    memset(m, 0, sizeof(*m));
}
