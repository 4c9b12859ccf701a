/*
 * The flight recorder's rings in the format of torch's own flight recorder,
 * so that `python -m torch.distributed.flight_recorder.fr_trace DIR` (torch's
 * cross-rank analyser) reads dshim's dumps as it reads ProcessGroupNCCL's.
 *
 * WHAT TORCH 2.11's ANALYSER NEEDS (read in the installed torch 2.11.0,
 * site-packages/torch/distributed/flight_recorder/ and the C++ writer in
 * torch/include/torch/csrc/distributed/c10d/FlightRecorder{,Detail}.hpp):
 *  - Files (components/loader.py read_dir :75, read_dump :28): every file
 *    under the directory (os.walk) whose name contains the prefix (:87); the
 *    rank is int(basename[len(prefix):]) (:31), so the name must be exactly
 *    <prefix><rank>.  Without --prefix it is inferred (_determine_prefix :53)
 *    from the names that match r"([\w\-\_]*?)(\d+)$" (:50): exactly one
 *    prefix must result, so a name
 *    with a '.' before the rank would infer "" and load every file, and any
 *    other file ending in digits breaks the inference.  Ours: "dshim_fr_rank_<R>"
 *    (torch's own default is "nccl_trace_rank_<R>"), written as a temporary
 *    ".dshim_fr_tmp_<R>_<pid>.part" (no prefix, no trailing digits) and renamed.
 *  - Pickle only: read_dump does pickle.load (:35); there is no JSON reader in 2.11
 *    (torch writes JSON only through _dump_nccl_trace_json, which fr_trace
 *    does not read).  torch writes it with torch::jit::Pickler (protocol 2);
 *    we write protocol 2 by hand: dict, list, str, int, float, None, bool,
 *    2-tuple.
 *  - Top level (loader.py read_dump :37-39): "entries", "version", "pg_config".
 *    torch also writes "pg_status" and "comm_lib_version" (we do too; extra
 *    "dshim_*" keys are ignored by the loader).
 *  - "version": a "MAJOR.MINOR" string (utils.py get_version_detail asserts
 *    two parts, :714), equal on every rank (utils.py check_version :707).
 *    torch 2.11 writes "2.10" (FlightRecorder.hpp:24 version_val); we write
 *    the same: >= 2.7 selects the current matching of coalesced groups
 *    (builder.py :226, :263), >= 2.4 checks all_to_all sizes (utils.py
 *    error_analysis).
 *  - "pg_config": {pg_name: {"name", "desc", "ranks": "[0, 1, 2]"}} with ranks
 *    as a STRING of GLOBAL ranks (builder.py build_groups_memberships runs
 *    ast.literal_eval on it, :111; a list would raise; torch's ranks_str,
 *    FlightRecorderDetail.hpp:454).  The group's id is
 *    pg_name + hash(frozenset(ranks)) (:115); desc and ranks must be equal on
 *    every rank of the group (asserted, :129, :132), and every member's dump
 *    must exist unless --allow-incomplete-ranks (builder.py :435, utils.py
 *    check_no_missing_dump_files :698).
 *  - Each entry (types.py EntryState/Op, utils.py): "record_id" (the first
 *    entry's record_id, maximised over ranks, drops older entries on every
 *    rank: utils.py align_trace_from_beginning :743), "process_group" (name, desc)
 *    whose name is a key of this rank's pg_config, "collective_seq_id",
 *    "p2p_seq_id", "is_p2p", "profiling_name", "input_sizes", "output_sizes",
 *    "input_dtypes", "output_dtypes", "state", "time_created_ns"; optional
 *    "frames" [{"name","filename","line"}] (printed as the "collective stack
 *    trace").  torch also writes pg_id, op_id, time_discovered_started_ns /
 *    _completed_ns (None until seen), retired, timeout_ms, duration_ms.
 *  - "profiling_name" is "<lib>:<type>[ meta]": types.py Op.__init__ asserts
 *    lib in ("nccl", "xccl") (:410) and type in COLLECTIVES | P2P |
 *    {"coalesced"} (:420, COLLECTIVES :206);
 *    any other name aborts the whole analysis.  So the prefix is "nccl:" even
 *    though the torch backend is registered as "dshim": "dshim:all_reduce"
 *    fails that assert.  Send/recv: "nccl:send <me>-><peer>",
 *    "nccl:recv <me><-<peer>" in group ranks.
 *  - Matching (utils.py check_current_entry_match :425, types.py Op.match
 *    :514): the
 *    entries of a group with equal collective_seq_id are compared: type, then
 *    input_sizes, output_sizes (all_reduce: input == output; all_gather:
 *    numel(out) == numel(in) * group size; reduce_scatter the reverse;
 *    all_to_all and scatter skip input, all_to_all and gather skip output),
 *    dtype sets, then state (equal strings).  A rank that has no entry with
 *    that seq is reported as "Not all ranks joining collective, sequence
 *    number: S ... missing ranks: {R}" (utils.py error_analysis :469, :487).
 *  - Consecutive entries of a group with equal ids are taken for a coalesced
 *    group (utils.py find_coalesced_group_with_non_p2p :611 compares a p2p entry's
 *    p2p_seq_id with a collective's collective_seq_id), so p2p_seq_id of
 *    p2p entries is numbered from FR_P2P_SEQ_BASE, never equal to a
 *    collective's number.
 *  - dtypes: c10::toString(ScalarType): "Float", "Double", "Half",
 *    "BFloat16", "Char" (int8), "Byte" (uint8), "Int", "Long", "UInt32",
 *    "UInt64", "Float8_e4m3fn", "Float8_e5m2".
 *  - states: torch's three, "scheduled" | "started" | "completed"
 *    (FlightRecorderDetail.hpp getCollectiveTrace :340, :420); Op.match
 *    compares them as strings across ranks (types.py :612).
 *  - `fr_trace -j` (print the entries) needs the "tabulate" package, which
 *    .venv lacks (utils.py imports it without a fallback: NameError); the
 *    analysis itself does not.
 *
 * HOW DSHIM'S RINGS MAP:
 *  - one pg per ring: name = the ring's name ("<store prefix>@<store
 *    address>:<port>", comm.c: equal on every rank of the communicator,
 *    different between groups), desc "default_pg" for a
 *    ring over the whole world and "undefined" otherwise (torch's words: our
 *    own desc may differ between ranks, e.g. a pointer, and the analyser
 *    asserts it equal; it is kept as "dshim_desc" and in the frames).
 *    A ring is written only when its members' world ranks are known: a ring
 *    of the world size (members 0..N-1 as a set; the analyser needs the set,
 *    and for p2p the sorted order) or of size 1 (this rank).  Members of a
 *    sub-group are not in the snapshot; such rings are left out, which the
 *    analyser can digest (it never sees the group).  Also left out: rings
 *    with nothing torch can name (empty; the parameter server's "ps/..."
 *    rings of push/pull).  A process with no ring left still writes its file
 *    (no entries), so that the analyser finds every member's dump.
 *  - collective_seq_id = the communicator's collective number (dshim's own
 *    "allreduce #S", 0-based: equal on every rank); a queued collective not
 *    yet numbered gets the next number after the ring's last one.  A
 *    collective that failed before it was numbered (refused by a failed
 *    communicator) never took part and is left out.
 *  - p2p ops only in rings of 2 ranks: the analyser matches an entry against
 *    every member of the group, so a send in a larger group would report the
 *    uninvolved members as missing and stop pairing that group's collectives.
 *  - sizes [[count]] per tensor, scaled as the analyser checks them, from
 *    the counts shim/comm records (engine.c dshim_engine_trace_op): allgather
 *    records the total, so in [[c / n]], out [[c]]; reduce_scatter the block,
 *    so in [[c * n]], out [[c]]; alltoall the block per peer: [[c * n]] both;
 *    gather/scatter the block: the root's side [[c * n]], the others' empty;
 *    barrier [[0]] without dtypes.
 *    The v-variants (uneven counts) are written as "all_to_all", the one type
 *    whose sizes the analyser does not compare per rank.  Data-only
 *    collectives from the torch backend carry bytes (dtype "Byte").
 *  - states: queued -> scheduled, started/waiting -> started, done ->
 *    completed, failed -> started (torch leaves a timed-out or errored work
 *    "started"; never completed).  retired = done or failed.
 *  - times: CLOCK_REALTIME ns as torch's (c10::getTime), converted from the
 *    ring's monotonic stamps with both clocks read at dump time.
 *  - record_id = the entry's number in its ring (equal across ranks for a
 *    group's collectives); entries of all rings merged by time queued.  The
 *    analyser aligns ranks with ONE number (the largest first record_id of
 *    any rank; older entries are dropped on every rank), made for torch's
 *    single buffer.  It aligns one ring here, the "primary": the world ring
 *    with the most entries recorded (then the smallest name), whose first
 *    entry is written first.  The other rings' record_ids are their numbers
 *    + FR_RECORD_SPARE, so that the primary's threshold never drops them
 *    (their own number stays in op_id): a group of one never needs aligning;
 *    a second world ring that wrapped around may show its oldest entries as
 *    not joined by every rank.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "private_fs.h"
#include "config.h"
#include "log.h"
#include "status.h"
#include "trace_impl.h"

#define FR_VERSION "2.10"
#define FR_PREFIX "dshim_fr_rank_"
#define FR_P2P_SEQ_BASE ((int64_t)1 << 32)
#define FR_RECORD_SPARE ((int64_t)1 << 40)

/* ---------------------------------------------------------------- pickle -- */

typedef struct fr_out {
    int fd;
    int err; /* errno of the first failed write, 0 if none */
    size_t len;
    unsigned char buf[16384];
} fr_out_t;

static void out_flush(fr_out_t *o)
{
    size_t off = 0;
    while (off < o->len && !o->err) {
        ssize_t w = write(o->fd, o->buf + off, o->len - off);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            o->err = errno ? errno : EIO;
            break;
        }
        off += (size_t)w;
    }
    o->len = 0;
}

static void put(fr_out_t *o, const void *p, size_t n)
{
    const unsigned char *s = p;
    while (n > 0) {
        if (o->len == sizeof(o->buf)) {
            out_flush(o);
        }
        size_t k = sizeof(o->buf) - o->len;
        if (k > n) {
            k = n;
        }
        memcpy(o->buf + o->len, s, k);
        o->len += k;
        s += k;
        n -= k;
    }
}

static void put1(fr_out_t *o, unsigned char c)
{
    put(o, &c, 1);
}

static void put_u32le(fr_out_t *o, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    put(o, b, 4);
}

/* protocol 2 opcodes */
#define P_PROTO 0x80
#define P_STOP '.'
#define P_MARK '('
#define P_EMPTY_DICT '}'
#define P_SETITEMS 'u'
#define P_EMPTY_LIST ']'
#define P_APPENDS 'e'
#define P_BINUNICODE 'X'
#define P_BININT 'J'
#define P_LONG1 0x8a
#define P_NONE 'N'
#define P_TRUE 0x88
#define P_FALSE 0x89
#define P_TUPLE2 0x86
#define P_BINFLOAT 'G'

static void p_int(fr_out_t *o, int64_t v)
{
    if (v >= INT32_MIN && v <= INT32_MAX) {
        put1(o, P_BININT);
        put_u32le(o, (uint32_t)(int32_t)v);
        return;
    }
    /* LONG1: little-endian two's complement, 8 bytes (not minimal; valid) */
    unsigned char b[10];
    uint64_t u = (uint64_t)v;
    b[0] = P_LONG1;
    b[1] = 8;
    for (int i = 0; i < 8; i++) {
        b[2 + i] = (unsigned char)(u >> (8 * i));
    }
    put(o, b, sizeof(b));
}

static void p_float(fr_out_t *o, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    unsigned char b[9];
    b[0] = P_BINFLOAT;
    for (int i = 0; i < 8; i++) {
        b[1 + i] = (unsigned char)(u >> (56 - 8 * i)); /* big-endian */
    }
    put(o, b, sizeof(b));
}

static void p_none(fr_out_t *o)
{
    put1(o, P_NONE);
}

static void p_bool(fr_out_t *o, int v)
{
    put1(o, v ? P_TRUE : P_FALSE);
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len) {
        return 0;
    }
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            return 0;
        }
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
        return 0;
    }
    return len;
}

/* A str: BINUNICODE must be valid UTF-8 or pickle.load fails, so every
 * byte that does not start a valid sequence is written as '?' (same length). */
static void p_strn(fr_out_t *o, const char *s, size_t n)
{
    put1(o, P_BINUNICODE);
    put_u32le(o, (uint32_t)n);
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t k = utf8_seq(u + i, n - i);
        if (k == 0) {
            put1(o, '?');
            i++;
        } else {
            put(o, u + i, k);
            i += k;
        }
    }
}

static void p_str(fr_out_t *o, const char *s)
{
    p_strn(o, s ? s : "", s ? strlen(s) : 0);
}

/* A dict / list: EMPTY_DICT MARK k v k v ... SETITEMS; EMPTY_LIST MARK ... APPENDS. */
static void p_dict(fr_out_t *o)
{
    put1(o, P_EMPTY_DICT);
    put1(o, P_MARK);
}

static void p_dict_end(fr_out_t *o)
{
    put1(o, P_SETITEMS);
}

static void p_list(fr_out_t *o)
{
    put1(o, P_EMPTY_LIST);
    put1(o, P_MARK);
}

static void p_list_end(fr_out_t *o)
{
    put1(o, P_APPENDS);
}

static void p_key(fr_out_t *o, const char *k)
{
    p_str(o, k);
}

/* [[a]] or [] */
static void p_sizes(fr_out_t *o, int present, uint64_t n)
{
    p_list(o);
    if (present) {
        p_list(o);
        p_int(o, (int64_t)n);
        p_list_end(o);
    }
    p_list_end(o);
}

static void p_dtypes(fr_out_t *o, int present, const char *name)
{
    p_list(o);
    if (present && name) {
        p_str(o, name);
    }
    p_list_end(o);
}

static int digits(uint64_t v)
{
    int d = 1;
    while (v >= 10) {
        v /= 10;
        d++;
    }
    return d;
}

static void put_dec(fr_out_t *o, uint64_t v)
{
    char b[24];
    int i = (int)sizeof(b);
    do {
        b[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put(o, b + i, sizeof(b) - (size_t)i);
}

/* torch's ranks_str: "[0, 1, 2]", streamed (a world of a million ranks is ~8 MB). */
static void p_ranks_str(fr_out_t *o, int first, int n)
{
    uint64_t len = 2;
    for (int i = 0; i < n; i++) {
        len += (uint64_t)digits((uint64_t)(first + i)) + (i ? 2 : 0);
    }
    put1(o, P_BINUNICODE);
    put_u32le(o, (uint32_t)len);
    put1(o, '[');
    for (int i = 0; i < n; i++) {
        if (i) {
            put(o, ", ", 2);
        }
        put_dec(o, (uint64_t)(first + i));
    }
    put1(o, ']');
}

/* ------------------------------------------------------------- mapping -- */

typedef enum fr_shape {
    FR_SAME,        /* in [[c]], out [[c]] */
    FR_GATHER_ALL,  /* in [[c/n]], out [[c]]: dshim's allgather count is the total */
    FR_SCATTER_ALL, /* in [[c*n]], out [[c]] */
    FR_ALLTOALL,    /* in [[c*n]], out [[c*n]] */
    FR_GATHER_ROOT, /* in [[c]], out [[c*n]] on the root, [] elsewhere */
    FR_SCATTER_ROOT,/* in [[c*n]] on the root, [] elsewhere, out [[c]] */
    FR_SEND,
    FR_RECV,
} fr_shape_t;

typedef struct fr_map {
    const char *op;    /* dshim's name (dshim_coll_name, trace.h) */
    const char *type;  /* torch's (types.py COLLECTIVES) */
    fr_shape_t shape;
} fr_map_t;

static const fr_map_t FR_MAP[] = {
    {"allreduce", "all_reduce", FR_SAME},
    {"broadcast", "broadcast", FR_SAME},
    {"reduce", "reduce", FR_SAME},
    {"allgather", "all_gather", FR_GATHER_ALL},
    {"reduce_scatter", "reduce_scatter", FR_SCATTER_ALL},
    {"alltoall", "all_to_all", FR_ALLTOALL},
    {"gather", "gather", FR_GATHER_ROOT},
    {"scatter", "scatter", FR_SCATTER_ROOT},
    {"barrier", "all_reduce_barrier", FR_SAME},
    {"allgatherv", "all_to_all", FR_SAME},
    {"reduce_scatterv", "all_to_all", FR_SAME},
    {"alltoallv", "all_to_all", FR_SAME},
    {"send", "send", FR_SEND},
    {"recv", "recv", FR_RECV},
};

static const fr_map_t *fr_lookup(const char *op)
{
    if (!op) {
        return NULL;
    }
    for (size_t i = 0; i < sizeof(FR_MAP) / sizeof(FR_MAP[0]); i++) {
        if (strcmp(FR_MAP[i].op, op) == 0) {
            return &FR_MAP[i];
        }
    }
    return NULL;
}

/* c10::toString(ScalarType) of a dshim_dtype_t; NULL for none (-1). */
static const char *fr_dtype(int dtype)
{
    static const char *names[DSHIM_DTYPE_COUNT] = {
        [DSHIM_INT8] = "Char",       [DSHIM_UINT8] = "Byte",          [DSHIM_INT32] = "Int",
        [DSHIM_UINT32] = "UInt32",   [DSHIM_INT64] = "Long",          [DSHIM_UINT64] = "UInt64",
        [DSHIM_FLOAT16] = "Half",    [DSHIM_BFLOAT16] = "BFloat16",   [DSHIM_FLOAT32] = "Float",
        [DSHIM_FLOAT64] = "Double",  [DSHIM_FLOAT8_E4M3] = "Float8_e4m3fn", [DSHIM_FLOAT8_E5M2] = "Float8_e5m2",
    };
    if (dtype < 0 || dtype >= DSHIM_DTYPE_COUNT) {
        return NULL;
    }
    return names[dtype];
}

/* Members of a ring as world ranks: 1 = 0..size-1, 2 = {world_rank}, 0 = unknown. */
static int fr_members(const dshim_trace_snapshot_t *s, int world_size)
{
    if (s->size == 1) {
        return 2;
    }
    if (world_size > 0 && s->size == world_size) {
        return 1;
    }
    return 0;
}

static int fr_entry_wanted(const dshim_trace_snapshot_t *s, const dshim_trace_entry_t *e)
{
    const fr_map_t *m = fr_lookup(e->op.op);
    if (!m) {
        return 0;
    }
    if ((m->shape == FR_SEND || m->shape == FR_RECV) && s->size != 2) {
        return 0;
    }
    /* refused by a failed communicator before it was numbered: never took part */
    if (e->state == DSHIM_TRACE_FAILED && e->seq == UINT64_MAX && e->t_started_ns == 0) {
        return 0;
    }
    return 1;
}

static int fr_ring_wanted(const dshim_trace_snapshot_t *s, int world_size)
{
    /* the parameter server's rings (shim/ps: push, pull, per node) are no
     * torch group; rings that ran nothing tell the analyser nothing */
    if (!fr_members(s, world_size) || !s->name[0] || strncmp(s->name, "ps/", 3) == 0) {
        return 0;
    }
    for (size_t i = 0; i < s->n; i++) {
        if (fr_entry_wanted(s, &s->entries[i])) {
            return 1;
        }
    }
    return 0;
}

/* The world size as dshim's env.c reads it; else the largest ring in which
 * this process has its world rank. */
static int fr_world_size(int world_rank, const dshim_trace_snapshot_t *snaps, size_t n)
{
    const dshim_config_t *cfg = dshim_config();
    const long sizes[] = {cfg->world_size, cfg->env_world_size, cfg->ompi_size, cfg->pmi_size, cfg->slurm_ntasks};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        if (sizes[i] > 0 && sizes[i] > world_rank) {
            return (int)sizes[i];
        }
    }
    int best = 0;
    for (size_t i = 0; i < n; i++) {
        if (snaps[i].rank == world_rank && snaps[i].size > best) {
            best = snaps[i].size;
        }
    }
    return best;
}

/* -------------------------------------------------------------- writing -- */

typedef struct fr_ring {
    const dshim_trace_snapshot_t *s;
    size_t next;        /* next entry to write */
    int pg_id;
    int world;          /* 1: over the whole world */
    int64_t record_add; /* 0 for the primary ring, FR_RECORD_SPARE for the others */
    int64_t last_coll;  /* last collective number written, -1 none */
    int64_t p2p;        /* p2p entries written */
    int64_t enq, started, done; /* pg_status: last collective queued/started/completed */
} fr_ring_t;

static const char *fr_state(const dshim_trace_entry_t *e)
{
    switch (e->state) {
    case DSHIM_TRACE_QUEUED:
        return "scheduled";
    case DSHIM_TRACE_STARTED:
    case DSHIM_TRACE_WAITING:
        return "started";
    case DSHIM_TRACE_DONE:
        return "completed";
    case DSHIM_TRACE_FAILED:
    default:
        return e->t_started_ns || e->seq != UINT64_MAX ? "started" : "scheduled";
    }
}

static void p_time(fr_out_t *o, uint64_t mono_ns, int64_t offset)
{
    if (mono_ns == 0) {
        p_none(o);
    } else {
        p_int(o, (int64_t)mono_ns + offset);
    }
}

/* The entry's collective and p2p numbers in torch's sense, and the ring's
 * counters (last enqueued, started, completed) they advance. */
static void fr_seqs(fr_ring_t *r, const dshim_trace_entry_t *e, int p2p, int64_t *coll_seq_p, int64_t *p2p_seq_p)
{
    int64_t coll_seq, p2p_seq;
    if (p2p) {
        r->p2p++;
        coll_seq = r->last_coll < 0 ? 0 : r->last_coll;
        p2p_seq = FR_P2P_SEQ_BASE + r->p2p;
    } else {
        coll_seq = e->seq != UINT64_MAX ? (int64_t)e->seq : r->last_coll + 1;
        r->last_coll = coll_seq;
        p2p_seq = r->p2p;
        r->enq = coll_seq;
        if (e->state != DSHIM_TRACE_QUEUED) {
            r->started = coll_seq;
        }
        if (e->state == DSHIM_TRACE_DONE) {
            r->done = coll_seq;
        }
    }
    *coll_seq_p = coll_seq;
    *p2p_seq_p = p2p_seq;
}

/* torch's profiling name: "nccl:allreduce", "nccl:send 0->1" */
static void fr_name(const fr_map_t *m, const dshim_trace_snapshot_t *s, const dshim_trace_entry_t *e, char *name,
                    size_t cap)
{
    if (m->shape == FR_SEND) {
        snprintf(name, cap, "nccl:send %d->%d", s->rank, e->op.peer);
    } else if (m->shape == FR_RECV) {
        /* from any source (-1): in a group of two, the other rank */
        snprintf(name, cap, "nccl:recv %d<-%d", s->rank, e->op.peer >= 0 ? e->op.peer : 1 - s->rank);
    } else {
        snprintf(name, cap, "nccl:%s", m->type);
    }
}

/* Element counts of the input and output tensors as torch records them for
 * this kind of collective (a side the rank does not have: not present). */
static void fr_sizes(const fr_map_t *m, const dshim_trace_snapshot_t *s, const dshim_trace_entry_t *e, uint64_t *in_p,
                     uint64_t *out_p, int *in_present_p, int *out_present_p)
{
    uint64_t c = e->op.count, cn = e->op.count * (uint64_t)(s->size > 0 ? s->size : 1);
    int root = e->op.root == s->rank;
    int in_present = 1, out_present = 1;
    uint64_t in = c, out = c;
    switch (m->shape) {
    case FR_GATHER_ALL:
        in = c / (uint64_t)(s->size > 0 ? s->size : 1);
        break;
    case FR_SCATTER_ALL:
        in = cn;
        break;
    case FR_ALLTOALL:
        in = out = cn;
        break;
    case FR_GATHER_ROOT:
        out = cn;
        out_present = root;
        break;
    case FR_SCATTER_ROOT:
        in = cn;
        in_present = root;
        break;
    case FR_SEND:
        out_present = 0;
        break;
    case FR_RECV:
        in_present = 0;
        break;
    case FR_SAME:
        break;
    }
    *in_p = in;
    *out_p = out;
    *in_present_p = in_present;
    *out_present_p = out_present;
}

/* The framework call, shown by fr_trace as the "collective stack trace". */
static void fr_write_frames(fr_out_t *o, const dshim_trace_snapshot_t *s, const dshim_trace_entry_t *e)
{
    p_key(o, "frames");
    p_list(o);
    if (e->label[0]) {
        p_dict(o);
        p_key(o, "name");
        p_strn(o, e->label, strnlen(e->label, sizeof(e->label)));
        p_key(o, "filename"); /* "NAME at FILENAME:LINE": the group, as dshim describes it */
        if (s->desc[0]) {
            p_strn(o, s->desc, strnlen(s->desc, sizeof(s->desc)));
        } else {
            p_strn(o, s->name, strnlen(s->name, sizeof(s->name)));
        }
        p_key(o, "line");
        p_int(o, 0);
        p_dict_end(o);
    }
    p_list_end(o);
}

/* dshim's own view (ignored by torch's loader). */
static void fr_write_dshim(fr_out_t *o, const dshim_trace_entry_t *e)
{
    p_key(o, "dshim_op");
    p_str(o, e->op.op);
    p_key(o, "dshim_state");
    const char *state = dshim_trace_state_name((int)e->state);
    p_str(o, state ? state : "failed");
    p_key(o, "dshim_waiting_for");
    p_list(o);
    for (int i = 0; i < e->nwaiting && i < DSHIM_TRACE_WAIT_MAX; i++) {
        p_int(o, e->waiting_for[i]);
    }
    p_list_end(o);
    p_key(o, "dshim_bytes");
    p_int(o, (int64_t)e->op.bytes);
}

static void fr_write_entry(fr_out_t *o, fr_ring_t *r, const dshim_trace_entry_t *e, int64_t offset,
                           int64_t timeout_ms)
{
    const dshim_trace_snapshot_t *s = r->s;
    const fr_map_t *m = fr_lookup(e->op.op);
    int p2p = m->shape == FR_SEND || m->shape == FR_RECV;
    int64_t coll_seq, p2p_seq;
    fr_seqs(r, e, p2p, &coll_seq, &p2p_seq);
    char name[96];
    fr_name(m, s, e, name, sizeof(name));
    uint64_t in, out;
    int in_present, out_present;
    fr_sizes(m, s, e, &in, &out, &in_present, &out_present);
    const char *dt = fr_dtype(e->op.dtype);
    const char *desc = r->world ? "default_pg" : "undefined";

    p_dict(o);
    p_key(o, "record_id");
    p_int(o, (int64_t)e->id + r->record_add);
    p_key(o, "pg_id");
    p_int(o, r->pg_id);
    p_key(o, "process_group");
    p_str(o, s->name);
    p_str(o, desc);
    put1(o, P_TUPLE2);
    p_key(o, "collective_seq_id");
    p_int(o, coll_seq);
    p_key(o, "p2p_seq_id");
    p_int(o, p2p_seq);
    p_key(o, "op_id");
    p_int(o, (int64_t)e->id);
    p_key(o, "profiling_name");
    p_str(o, name);
    p_key(o, "time_created_ns");
    p_int(o, (int64_t)e->t_queued_ns + offset);
    if (e->state == DSHIM_TRACE_DONE && e->t_started_ns && e->t_done_ns >= e->t_started_ns) {
        p_key(o, "duration_ms");
        p_float(o, (double)(e->t_done_ns - e->t_started_ns) / 1e6);
    }
    p_key(o, "input_sizes");
    p_sizes(o, in_present, in);
    p_key(o, "input_dtypes");
    p_dtypes(o, in_present, dt);
    p_key(o, "output_sizes");
    p_sizes(o, out_present, out);
    p_key(o, "output_dtypes");
    p_dtypes(o, out_present, dt);
    p_key(o, "state");
    p_str(o, fr_state(e));
    p_key(o, "time_discovered_started_ns");
    p_time(o, e->t_started_ns, offset);
    p_key(o, "time_discovered_completed_ns");
    p_time(o, e->state == DSHIM_TRACE_DONE ? e->t_done_ns : 0, offset);
    p_key(o, "retired");
    p_bool(o, e->state == DSHIM_TRACE_DONE || e->state == DSHIM_TRACE_FAILED);
    p_key(o, "timeout_ms");
    p_int(o, timeout_ms);
    p_key(o, "is_p2p");
    p_bool(o, p2p);
    fr_write_frames(o, s, e);
    fr_write_dshim(o, e);
    p_dict_end(o);
}

static void fr_write_all(fr_out_t *o, int world_rank, int world_size, fr_ring_t *rings, size_t nr,
                         const char *reason, const char *why)
{
    struct timespec rt, mt;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mt);
    int64_t offset = ((int64_t)rt.tv_sec - (int64_t)mt.tv_sec) * 1000000000 + ((int64_t)rt.tv_nsec - mt.tv_nsec);
    const dshim_config_t *cfg = dshim_config();
    int64_t timeout_ms = dshim_config_is_set("DSHIM_TIMEOUT") ? (int64_t)(cfg->timeout_s * 1000.0) : 0;

    put1(o, P_PROTO);
    put1(o, 2);
    p_dict(o);
    p_key(o, "version");
    p_str(o, FR_VERSION);
    p_key(o, "comm_lib_version");
    {
        char v[32];
        snprintf(v, sizeof(v), "dshim %d.%d.%d", DSHIM_VERSION_MAJOR, DSHIM_VERSION_MINOR, DSHIM_VERSION_PATCH);
        p_str(o, v);
    }
    p_key(o, "pg_config");
    p_dict(o);
    for (size_t i = 0; i < nr; i++) {
        const dshim_trace_snapshot_t *s = rings[i].s;
        size_t nl = strnlen(s->name, sizeof(s->name));
        p_strn(o, s->name, nl);
        p_dict(o);
        p_key(o, "name");
        p_strn(o, s->name, nl);
        p_key(o, "desc");
        p_str(o, rings[i].world ? "default_pg" : "undefined");
        p_key(o, "ranks");
        if (rings[i].world) {
            p_ranks_str(o, 0, s->size);
        } else {
            p_ranks_str(o, world_rank, 1);
        }
        p_key(o, "dshim_desc");
        p_strn(o, s->desc, strnlen(s->desc, sizeof(s->desc)));
        p_dict_end(o);
    }
    p_dict_end(o);

    p_key(o, "entries");
    p_list(o);
    /* the primary's first entry first: its record_id is the one the analyser aligns with */
    fr_ring_t *primary = NULL;
    for (size_t i = 0; i < nr; i++) {
        fr_ring_t *r = &rings[i];
        r->record_add = FR_RECORD_SPARE;
        if (r->world && (!primary || r->s->recorded > primary->s->recorded ||
                         (r->s->recorded == primary->s->recorded && strcmp(r->s->name, primary->s->name) < 0))) {
            primary = r;
        }
    }
    if (primary) {
        primary->record_add = 0;
        while (primary->next < primary->s->n && !fr_entry_wanted(primary->s, &primary->s->entries[primary->next])) {
            primary->next++;
        }
        if (primary->next < primary->s->n) {
            fr_write_entry(o, primary, &primary->s->entries[primary->next], offset, timeout_ms);
            primary->next++;
        }
    }
    for (;;) {
        /* merge the rings by time queued (each is oldest first) */
        fr_ring_t *best = NULL;
        for (size_t i = 0; i < nr; i++) {
            fr_ring_t *r = &rings[i];
            while (r->next < r->s->n && !fr_entry_wanted(r->s, &r->s->entries[r->next])) {
                r->next++;
            }
            if (r->next < r->s->n &&
                (!best || r->s->entries[r->next].t_queued_ns < best->s->entries[best->next].t_queued_ns)) {
                best = r;
            }
        }
        if (!best) {
            break;
        }
        fr_write_entry(o, best, &best->s->entries[best->next], offset, timeout_ms);
        best->next++;
    }
    p_list_end(o);

    p_key(o, "pg_status");
    p_dict(o);
    for (size_t i = 0; i < nr; i++) {
        char id[16];
        snprintf(id, sizeof(id), "%d", rings[i].pg_id);
        p_str(o, id);
        p_dict(o);
        p_key(o, "last_enqueued_collective");
        p_int(o, rings[i].enq);
        p_key(o, "last_started_collective");
        p_int(o, rings[i].started);
        p_key(o, "last_completed_collective");
        p_int(o, rings[i].done);
        p_dict_end(o);
    }
    p_dict_end(o);

    /* dshim's own keys (ignored by torch's loader) */
    p_key(o, "dshim_world_rank");
    p_int(o, world_rank);
    p_key(o, "dshim_world_size");
    p_int(o, world_size);
    p_key(o, "dshim_reason");
    p_str(o, reason ? reason : "");
    p_key(o, "dshim_why");
    p_str(o, why ? why : "");
    p_key(o, "dshim_pid");
    p_int(o, (int64_t)getpid());
    p_dict_end(o);
    put1(o, P_STOP);
}

dshim_status_t dshim_trace_write_fr(const char *dir, int world_rank, const dshim_trace_snapshot_t *snaps, size_t n,
                                    const char *reason, const char *why)
{
    if (!dshim_config()->trace_fr || (n == 0 && world_rank < 0)) {
        return DSHIM_OK;
    }
    /* a parameter-server process (MXNet: scheduler, servers, workers) has
     * nothing torch can name, and its "rank" is per role (server 0 and
     * worker 0 alike): no file, rather than files that overwrite each other */
    size_t ps_rings = 0;
    for (size_t i = 0; i < n; i++) {
        ps_rings += strncmp(snaps[i].name, "ps/", 3) == 0;
    }
    if (n > 0 && ps_rings == n) {
        return DSHIM_OK;
    }
    if (!dir || !dir[0]) {
        return dshim_error_quiet(DSHIM_ERR_INVALID, "flight recorder: no directory for torch's format");
    }
    if (world_rank < 0) {
        return dshim_error_quiet(DSHIM_ERR_INVALID, "flight recorder: torch's format needs this process's world "
                                 "rank (its file name), which is unknown: set RANK or DSHIM_RANK");
    }
    int world_size = fr_world_size(world_rank, snaps, n);
    fr_ring_t *rings = calloc(n ? n : 1, sizeof(*rings));
    fr_out_t *o = malloc(sizeof(*o));
    if (!rings || !o) {
        free(rings);
        free(o);
        return dshim_error_quiet(DSHIM_ERR_NOMEM, "flight recorder: out of memory for torch's format");
    }
    size_t nr = 0;
    for (size_t i = 0; i < n; i++) {
        if (!fr_ring_wanted(&snaps[i], world_size)) {
            continue;
        }
        fr_ring_t *r = &rings[nr];
        r->s = &snaps[i];
        r->pg_id = (int)nr;
        r->world = fr_members(&snaps[i], world_size) == 1;
        r->last_coll = r->enq = r->started = r->done = -1;
        nr++;
    }

    dshim_status_t st = DSHIM_OK;
    char path[4096], tmp[4096];
    int pn = snprintf(path, sizeof(path), "%s/%s%d", dir, FR_PREFIX, world_rank);
    int tn = snprintf(tmp, sizeof(tmp), "%s/.dshim_fr_tmp_%d_%ld.part", dir, world_rank, (long)getpid());
    if (pn < 0 || (size_t)pn >= sizeof(path) || tn < 0 || (size_t)tn >= sizeof(tmp)) {
        st = dshim_error_quiet(DSHIM_ERR_INVALID, "flight recorder: directory name too long: %s", dir);
        goto out;
    }
    o->fd = dshim_private_open(tmp, DSHIM_OPEN_TRUNC);  /* 0600, no link, no file of another user's */
    if (o->fd < 0) {
        st = dshim_error_quiet(DSHIM_ERR_SYSTEM, "cannot create %s: %s", tmp, dshim_private_why(errno));
        goto out;
    }
    o->err = 0;
    o->len = 0;
    fr_write_all(o, world_rank, world_size, rings, nr, reason, why);
    out_flush(o);
    if (close(o->fd) != 0 && !o->err) {
        o->err = errno;
    }
    if (o->err) {
        unlink(tmp);
        st = dshim_error_quiet(DSHIM_ERR_SYSTEM, "cannot write %s: %s", tmp, strerror(o->err));
        goto out;
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        st = dshim_error_quiet(DSHIM_ERR_SYSTEM, "cannot rename %s to %s: %s", tmp, path, strerror(e));
        goto out;
    }
    DSHIM_TRACE("flight recorder: torch's format in %s (%zu of %zu rings)", path, nr, n);
out:
    free(o);
    free(rings);
    return st;
}
