/*
 * Topology: which ranks share a host.  When a job spans several hosts and
 * some host runs several ranks, each rank also joins two private
 * sub-communicators, built without any extra collective because every rank
 * already knows every peer's host id:
 *   local   - the ranks of its host (shared memory)
 *   leaders - the first rank of every host (TCP), on those ranks only
 * Hierarchical allreduce reduces inside each host, allreduces across hosts
 * between leaders, then broadcasts inside each host: every byte crosses the
 * network once per host instead of once per rank.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "host_gate.h"
#include "status.h"

/* Whether the ranks of every host that has several can meet at a host gate
 * (the gate's own rule, over those ranks): then the barrier runs through the
 * hierarchy.  From the peer records: the same on every rank. */
static dshim_status_t every_host_has_a_gate(const dshim_comm_t *comm, const int *host_of, int nhosts, int *yes_p)
{
    int n = comm->size;
    int *host_size = calloc((size_t)nhosts, sizeof(int));
    unsigned char *shares = malloc((size_t)n);
    if (!host_size || !shares) {
        free(host_size);
        free(shares);
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory");
    }
    for (int r = 0; r < n; r++) {
        host_size[host_of[r]]++;
    }
    for (int r = 0; r < n; r++) {
        shares[r] = host_size[host_of[r]] > 1;
    }
    *yes_p = dshim_host_gate_transport(comm, shares) >= 0;
    free(host_size);
    free(shares);
    return DSHIM_OK;
}

dshim_status_t dshim_topo_setup(dshim_comm_t *comm)
{
    int n = comm->size;
    int *host_of = malloc(sizeof(int) * (size_t)n);
    if (!host_of) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory");
    }
    /* hosts numbered by their first rank's order */
    int nhosts = 0;
    for (int r = 0; r < n; r++) {
        host_of[r] = -1;
        for (int q = 0; q < r; q++) {
            if (comm->peers[q].host_id == comm->peers[r].host_id) {
                host_of[r] = host_of[q];
                break;
            }
        }
        if (host_of[r] < 0) {
            host_of[r] = nhosts++;
        }
    }
    comm->nhosts = nhosts;
    dshim_status_t st = DSHIM_OK;
    if (nhosts > 1 && nhosts < n) {
        st = every_host_has_a_gate(comm, host_of, nhosts, &comm->barrier_hier);
        if (st != DSHIM_OK) {
            free(host_of);
            return st;
        }
        /* the members of each: this host's ranks (members[0] its leader),
         * then the hosts' first ranks */
        int *members = malloc(sizeof(int) * (size_t)n);
        if (!members) {
            free(host_of);
            return dshim_error(DSHIM_ERR_NOMEM, "out of memory");
        }
        int me = host_of[comm->rank], local_rank = 0, local_size = 0;
        for (int r = 0; r < n; r++) {
            if (host_of[r] == me) {
                local_rank += r < comm->rank;
                members[local_size++] = r;
            }
        }
        char suffix[32];
        snprintf(suffix, sizeof(suffix), "hl%d/", me);
        st = dshim_comm_create_child(comm, suffix, local_rank, local_size, members, &comm->local);
        if (st == DSHIM_OK && members[0] == comm->rank) {
            int k = 0;
            for (int r = 0; r < n; r++) {
                if (host_of[r] == k) {
                    members[k++] = r; /* hosts are numbered by their first rank's order */
                }
            }
            st = dshim_comm_create_child(comm, "hx/", me, nhosts, members, &comm->leaders);
        }
        free(members);
        if (st != DSHIM_OK) {
            dshim_topo_destroy(comm);
            comm->barrier_hier = 0;
        } else {
            DSHIM_INFO("rank %d: %d hosts; local rank %d of %d%s", comm->rank, nhosts, local_rank, local_size,
                       comm->leaders ? "; host leader" : "");
        }
    }
    free(host_of);
    return st;
}

void dshim_topo_destroy(dshim_comm_t *comm)
{
    if (comm->leaders) {
        dshim_comm_destroy(comm->leaders);
        comm->leaders = NULL;
    }
    if (comm->local) {
        dshim_comm_destroy(comm->local);
        comm->local = NULL;
    }
}
