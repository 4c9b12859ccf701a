/*
 * Private to analyser/: what the files of the diagnosis and the live status
 * share (trace_read.h says what they make).  The model is built once per
 * call from the set of dumps: communicators with their members (ring rank
 * -> the member's dump, ring, world rank, pending and last entries), and for
 * MXNet jobs the parameter server's nodes (servers, workers, the
 * scheduler), each from its own "ps/" ring.
 */
#ifndef DSHIM_DIAGNOSE_IMPL_H
#define DSHIM_DIAGNOSE_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "trace_read.h"

/* ---- text: a growing buffer of lines (diagnose_text.c) -------------------- */

typedef struct {
    char *buf;
    size_t len, cap;
    int lines;
} text_t;

void dshim_text_add(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The text (never NULL: "" when nothing was added); the caller frees it. */
char *dshim_text_take(text_t *t);

/* ---- formatting (diagnose_text.c) ----------------------------------------- */

/* 25165824 -> "24.0 MiB" */
void dshim_diag_fmt_bytes(uint64_t b, char *out, size_t cap);
/* "350 ms", "2.5 s", "120 s" */
void dshim_diag_fmt_secs(double s, char *out, size_t cap);
/* "allreduce #1043" */
void dshim_diag_fmt_opseq(const dshim_trace_rec_t *e, char *out, size_t cap);
/* " (float32 × 25,165,824, root 0, from DDP bucket 2)" or "" */
void dshim_diag_fmt_args(const dshim_trace_rec_t *e, int with_label, char *out, size_t cap);

/* Point-to-point operations and the parameter server's requests: no
 * collective that every member of a communicator calls. */
static inline int is_p2p(const char *op)
{
    return strcmp(op, "send") == 0 || strcmp(op, "recv") == 0 || strcmp(op, "isend") == 0 ||
           strcmp(op, "irecv") == 0 || strcmp(op, "sendrecv") == 0 || strcmp(op, "push") == 0 ||
           strcmp(op, "pull") == 0 || strcmp(op, "pushpull") == 0;
}

/* ---- the model (diagnose_model.c) ----------------------------------------- */

typedef struct {
    const dshim_trace_dump_t *dump;  /* NULL: no dump has this member */
    const dshim_trace_dring_t *ring;
    int world;                       /* world rank; -1 unknown */
    const dshim_trace_rec_t *pending;   /* oldest entry not done */
    const dshim_trace_rec_t *last_done; /* newest done */
    const dshim_trace_rec_t *last;      /* newest entry */
    int group;                       /* index of its pending group; -1 none */
} member_t;

typedef struct {
    const char *name, *desc;
    int size;         /* members[] entries (ring size, bounded) */
    member_t *members;
    int ndumped;
    int world_sized;
} comm_t;

typedef struct {
    const dshim_trace_set_t *set;
    comm_t *comms;
    int ncomms;
    int world_size;
    uint64_t now;     /* wall clock, ns */
} model_t;

static inline uint64_t to_wall(const dshim_trace_dump_t *d, uint64_t mono)
{
    if (mono == 0) {
        return 0;
    }
    return mono - d->monotonic_ns + d->realtime_ns;  /* wraps back for mono < monotonic_ns: fine in uint64 */
}

static inline double age_s(const model_t *m, const dshim_trace_dump_t *d, uint64_t mono)
{
    uint64_t w = to_wall(d, mono);
    if (w == 0 || m->now < w) {
        return 0;
    }
    return (double)(m->now - w) / 1e9;
}

static inline const char *comm_label(const comm_t *c)
{
    return c->desc && c->desc[0] ? c->desc : c->name;
}

/* dshim's parameter server (MXNet) names its rings "ps/server.S",
 * "ps/worker.W" and "ps/scheduler" (shim/ps/ps_trace.h): one per process,
 * each ring its own; they are read apart from the communicators. */
static inline int is_ps_ring(const char *name)
{
    return strncmp(name, "ps/", 3) == 0;
}

/* Builds communicators from the dumps' rings; now: wall clock for ages (0 =
 * the newest dump's). */
void dshim_diag_model_build(model_t *m, const dshim_trace_set_t *set, uint64_t now);
void dshim_diag_model_free(model_t *m);
const dshim_trace_proc_t *dshim_diag_proc_of_rank(const dshim_trace_set_t *s, int world);
/* "rank 2 (host b, pid 812)", host and pid from the dump or the launcher */
void dshim_diag_who(const model_t *m, const comm_t *c, int ring_rank, char *out, size_t cap);
/* "rank 3" / "ranks 0-2,5" for a list of ring ranks, by world rank */
void dshim_diag_name_ranks(const comm_t *c, const int *ring_ranks, int n, char *out, size_t cap);
/* A process without a dump, from what the launcher knows of it (p may be
 * NULL); `seen` is appended ("" or " — the others wait ..."). */
void dshim_diag_describe_missing(const model_t *m, const dshim_trace_proc_t *p, const char *seen, char *out,
                                 size_t cap);

/* ---- a communicator's lines (diagnose_comm.c) ----------------------------- */

/* A dump's reason that says its process failed (not a request or an exit). */
int dshim_diag_is_failure_reason(const char *r);
/* One communicator's lines, each begun with prefix.  1 when it said something. */
int dshim_diag_comm(const model_t *m, comm_t *c, const char *prefix, text_t *t);
/* Most important first: the communicators where someone waits, larger first. */
int dshim_diag_comm_weight(const comm_t *c);

/* ---- MXNet: dshim's parameter server (diagnose_ps_model.c, diagnose_ps.c) -- */

/* A scheduler, server or worker of an MXNet job: its dump and ring (NULL when
 * no dump has it) and what the launcher knows of it ("server 1", "worker 0",
 * "scheduler" in launcher.jsonl; NULL when unknown). */
typedef struct {
    const dshim_trace_dump_t *dump;
    const dshim_trace_dring_t *ring;
    const dshim_trace_proc_t *proc;
    int said;  /* already named on a line */
} ps_node_t;

typedef struct {
    ps_node_t *servers, *workers, sched;
    int ns, nw;
    int any;   /* some dump has a "ps/" ring */
} ps_model_t;

static inline int ps_push_entry(const dshim_trace_rec_t *e)
{
    return strcmp(e->op, "push") == 0 && strstr(e->label, "MXNet init ") == NULL;
}

/* "ps/server.12" with prefix "ps/server." -> 12; -1 unless a number below bound follows */
int dshim_diag_ps_index(const char *name, const char *prefix, int bound);
/* The key of a label "MXNet pushpull key -3 (rows)"; 0 when it names none. */
int dshim_diag_label_key(const char *label, int *key);
const dshim_trace_proc_t *dshim_diag_ps_proc_of_dump(const dshim_trace_set_t *s, const dshim_trace_dump_t *d);
/* The nodes, from the rings and the launcher's processes (p->any: some dump
 * has a "ps/" ring). */
void dshim_diag_ps_build(const model_t *m, ps_model_t *p);
void dshim_diag_ps_free(ps_model_t *p);
/* "server 1 (host b, pid 812)"; idx -1 for the scheduler */
void dshim_diag_ps_who(const ps_node_t *n, const char *role, int idx, char *out, size_t cap);
/* "worker 1" / "workers 0,2-5" */
void dshim_diag_ps_list(const char *role, const int *v, int n, char *out, size_t cap);
/* A worker's request: "pushpull key 2 round 4 to server 0" */
void dshim_diag_ps_req(const dshim_trace_rec_t *e, int with_peer, char *out, size_t cap);
/* The MXNet lines; returns their number. */
int dshim_diag_ps(const model_t *m, ps_model_t *p, text_t *t);
/* When nobody waits: the newest completed round of any server. */
void dshim_diag_ps_idle(const model_t *m, const ps_model_t *p, text_t *t);

#endif
