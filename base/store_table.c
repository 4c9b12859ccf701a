/* The rendezvous store server's key/value table: chained hash, doubled when
 * the load reaches 1. */
#include <stdlib.h>
#include <string.h>

#include "store_server_impl.h"

uint64_t dshim_store_key_hash(const uint8_t *key, size_t len)
{
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h = (h ^ key[i]) * 1099511628211ull;
    }
    return h;
}

kv_entry_t **dshim_store_kv_slot(dshim_store_server_t *srv, const uint8_t *key, uint32_t klen, uint64_t hash)
{
    kv_entry_t **pp = &srv->buckets[hash & (srv->nbuckets - 1)];
    while (*pp) {
        kv_entry_t *e = *pp;
        if (e->hash == hash && e->klen == klen && memcmp(e->key, key, klen) == 0) {
            return pp;
        }
        pp = &e->next;
    }
    return pp;
}

void dshim_store_kv_grow(dshim_store_server_t *srv)
{
    size_t n = srv->nbuckets * 2;
    kv_entry_t **b = calloc(n, sizeof(*b));
    if (!b) {
        return;  /* longer chains, still correct */
    }
    for (size_t i = 0; i < srv->nbuckets; i++) {
        kv_entry_t *e = srv->buckets[i];
        while (e) {
            kv_entry_t *next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
            e = next;
        }
    }
    free(srv->buckets);
    srv->buckets = b;
    srv->nbuckets = n;
}

/* Stores val (ownership passes to the table); returns the entry or NULL when
 * out of memory (val is then freed). */
kv_entry_t *dshim_store_kv_put(dshim_store_server_t *srv, const uint8_t *key, uint32_t klen, uint64_t hash,
                          uint8_t *val, size_t vlen)
{
    kv_entry_t **pp = dshim_store_kv_slot(srv, key, klen, hash);
    kv_entry_t *e = *pp;
    if (e) {
        free(e->val);
    } else {
        e = malloc(sizeof(*e) + klen);
        if (!e) {
            free(val);
            return NULL;
        }
        e->next = NULL;
        e->hash = hash;
        e->klen = klen;
        memcpy(e->key, key, klen);
        *pp = e;
        if (++srv->nkeys > srv->nbuckets) {
            dshim_store_kv_grow(srv);
        }
    }
    e->val = val;
    e->vlen = vlen;
    return e;
}

void dshim_store_kv_free_all(dshim_store_server_t *srv)
{
    for (size_t i = 0; i < srv->nbuckets; i++) {
        kv_entry_t *e = srv->buckets[i];
        while (e) {
            kv_entry_t *next = e->next;
            free(e->val);
            free(e);
            e = next;
        }
    }
    free(srv->buckets);
}
