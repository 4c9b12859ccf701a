/* Socket helpers for the bootstrap: interface choice, listen, connect. */
#ifndef DSHIM_NET_H
#define DSHIM_NET_H

#include <netinet/in.h>
#include "dshim.h"

/* Local IPv4 address to listen on for data connections.  Order: the
 * interface named by DSHIM_SOCKET_IFNAME / NCCL_SOCKET_IFNAME /
 * GLOO_SOCKET_IFNAME / DMLC_INTERFACE (a "^name" entry excludes); otherwise
 * the address this host uses to reach store_addr (loopback when the store is
 * local).  Never loopback when the store is remote. */
dshim_status_t dshim_net_pick_local_addr(const char *store_addr, struct in_addr *addr_p, char *why,
                                         size_t why_len);
dshim_status_t dshim_net_resolve(const char *host, struct in_addr *addr_p);
/* Where a listener that the job reaches at `reach` (MASTER_ADDR, the store or
 * scheduler address) binds, as dotted IPv4 text in out (out_len >= 16):
 * reach's own address when it is loopback or one of this host's addresses;
 * else the interface named by DSHIM_SOCKET_IFNAME & co.; else "" (all
 * interfaces).  Logs the choice at INFO under `what`.  Never fails: a
 * listener on all interfaces still works wherever the job reaches it. */
void dshim_net_listen_addr(const char *reach, const char *what, char *out, size_t out_len);
/* Listening socket on addr, ephemeral port; returns fd and port. */
dshim_status_t dshim_net_listen(struct in_addr addr, int *fd_p, int *port_p);
/* Blocking connect with deadline (monotonic seconds), retried on refusal. */
dshim_status_t dshim_net_connect(struct in_addr addr, int port, double deadline, int *fd_p);
/* Reads/writes exactly len bytes before deadline (blocking helpers used only
 * during the handshake). */
dshim_status_t dshim_net_read_full(int fd, void *buf, size_t len, double deadline);
dshim_status_t dshim_net_write_full(int fd, const void *buf, size_t len, double deadline);
void dshim_net_tune(int fd, size_t bufsize);
/* Applies DSHIM_SOCKET_CC to a connected data socket; `local` = the peer is
 * on this host (same host id, loopback or our own address). */
void dshim_net_set_cc(int fd, int local);
int dshim_net_set_nonblocking(int fd, int on);
double dshim_now(void);  /* monotonic seconds */
/* 1 when the other end of socket fd has hung up (it closed, its process
 * exited or the connection was reset), without reading or waiting: the one
 * test of a peer's death that the core, the transports and the parameter
 * server share.  0 for fd < 0. */
int dshim_net_hung_up(int fd);
/* 1 when errno `err` (of accept(2), socket(2), ...) says no descriptor is
 * left: EMFILE (this process's RLIMIT_NOFILE) or ENFILE (the system's
 * table).  For accept: every later one fails alike until something closes,
 * while the listener stays readable, so a caller that retries spins, logs a
 * line per try and leaves the peer knocking to time out as "did not join";
 * a caller told 1 fails at once instead.  Then the last error is the one
 * line "WHAT: too many open files (EMFILE): raise ulimit -n (now N)"
 * (ENFILE: "raise fs.file-max"), WHAT saying who failed to do what.  0
 * (nothing set) for any other err. */
int dshim_net_out_of_fds(int err, const char *what);

#endif
