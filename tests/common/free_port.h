/*
 * A TCP port for a test's listener (a rendezvous store, a scheduler) that is
 * free now and unlikely to be taken before the listener binds it.
 */
#ifndef DSHIM_TEST_FREE_PORT_H
#define DSHIM_TEST_FREE_PORT_H

/* A port in 20000-31999 that binds on 0.0.0.0 right now, or -1 after 200
 * tries.  Below the kernel's ephemeral range (32768 up) on purpose: a port the
 * kernel handed out for bind(0) can be handed again -- as the source port of
 * another test's outgoing connection, or to its data listener -- between this
 * check and the test's bind, and then the job's first rank fails with
 * "Address already in use" while the others wait out their connect timeout
 * (CI saw exactly that under TSan with ctest -j).  Random, seeded per process,
 * so tests running side by side do not walk the range in step. */
int test_free_port(void);

/* The IPv4 address ("127.0.0.1", "0.0.0.0", ...) that a socket listening on
 * TCP port `port` in this network namespace is bound to, from /proc/net/tcp,
 * into buf; 0 when found, -1 when nothing listens there. */
int test_listen_addr(int port, char *buf, unsigned len);

#endif
