/*
 * Internal to backends/transport/shm: the per-communicator half of the shm
 * transport (shm_comm.c), which shm_conn.c puts into dshim_transport_shm next
 * to its per-connection ops.  See transport.h for what each op promises.
 */
#ifndef DSHIM_SHM_COMM_H
#define DSHIM_SHM_COMM_H

#include "transport/transport.h"

dshim_status_t dshim_shm_comm_setup(const dshim_transport_comm_t *comm, void **state_p, char *addr,
                                    size_t addr_len);
int dshim_shm_comm_reaches(void *state, const dshim_transport_peer_t *peer);
int dshim_shm_comm_peer_reads(void *state, const dshim_transport_peer_t *peer);
dshim_status_t dshim_shm_comm_connect(void *state, const dshim_transport_peer_t *peer, int fd,
                                      dshim_conn_t **conn_p);
void dshim_shm_comm_prepare(void *state, const dshim_transport_peer_t *peer);
dshim_status_t dshim_shm_comm_reserve(void *state, const dshim_transport_peer_t *peer);
void dshim_shm_comm_teardown(void *state);
dshim_status_t dshim_shm_comm_host_area(void *state, const dshim_transport_peer_t *owner, void **area_p);
uint32_t dshim_shm_comm_wait_arm(void *state);
dshim_status_t dshim_shm_comm_wait(void *state, uint32_t armed, long timeout_us);
void dshim_shm_comm_wait_disarm(void *state);

#endif
