/* The full store->load barrier of the two-sided handshakes between
 * processes (a waker's store of its news then load of `sleepers`, a
 * sleeper's add to `sleepers` then load of the news; a single-copy writer's
 * mark then its look at the peer's gate).  GCC's ThreadSanitizer rejects
 * atomic_thread_fence at compile time (-Werror=tsan); in that build the same
 * order comes from a seq_cst read-modify-write of `word`, a word of the
 * handshake (all RMWs of one word are totally ordered, each reads the last
 * value and releases to the next), which writes its line: the cost the
 * fence avoids, irrelevant there. */
#ifndef DSHIM_BARRIER_H
#define DSHIM_BARRIER_H

#if defined(__SANITIZE_THREAD__)
#define DSHIM_STORE_LOAD_BARRIER(word) ((void)__atomic_fetch_add((word), 0, __ATOMIC_SEQ_CST))
#else
#define DSHIM_STORE_LOAD_BARRIER(word) ((void)(word), __atomic_thread_fence(__ATOMIC_SEQ_CST))
#endif

#endif
