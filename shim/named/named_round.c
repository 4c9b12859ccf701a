/* A negotiation round on the wire.
 *
 * Every rank contributes one fixed slot of DSHIM_NAMED_SLOT bytes to one
 * allgather: a header (the length of this rank's records) and as many of
 * its records as fit.  When some rank's records do not fit, every rank sees
 * that in the headers and takes part in a second collective, an allgatherv
 * of the rest (zero bytes from the ranks that fitted).  A quiet round thus
 * costs one small allgather, a busy one two.
 *
 * Records (host byte order: the ranks of one job share an architecture):
 *   REQ      u8 type, u8 kind, u8 dtype, u8 op, u8 ndim, i32 root, i32 device,
 *            f64 prescale, f64 postscale, u32 name length, name, i64 shape[ndim],
 *            u32 data length, data (a small allreduce's input: DSHIM_NAMED_INLINE)
 *   JOIN     u8 type
 *   SHUTDOWN u8 type, u32 length, reason
 *   VERDICT  u8 type, u8 cause, u64 cutoff round (rank 0 only)
 */
#include <stdlib.h>
#include <string.h>

#include "named.h"
#include "status.h"

#define HEADER 8u
#define FIRST (DSHIM_NAMED_SLOT - HEADER)

void dshim_named_out_reset(dshim_named_t *eng)
{
    eng->out_len = 0;
}

static dshim_status_t out_put(dshim_named_t *eng, const void *p, size_t n)
{
    if (eng->out_len + n > eng->out_cap) {
        size_t cap = eng->out_cap ? eng->out_cap : 1024;
        while (cap < eng->out_len + n) {
            cap *= 2;
        }
        unsigned char *b = realloc(eng->out, cap);
        if (!b) {
            return dshim_error(DSHIM_ERR_NOMEM, "rank %d: named operations: out of memory (round)", eng->rank);
        }
        eng->out = b;
        eng->out_cap = cap;
    }
    memcpy(eng->out + eng->out_len, p, n);
    eng->out_len += n;
    return DSHIM_OK;
}

static dshim_status_t out_u8(dshim_named_t *eng, unsigned v)
{
    uint8_t b = (uint8_t)v;
    return out_put(eng, &b, 1);
}

dshim_status_t dshim_named_out_req(dshim_named_t *eng, const dshim_named_op_t *op)
{
    uint8_t head[5] = {DSHIM_NAMED_REC_REQ, (uint8_t)op->kind, (uint8_t)op->dtype, (uint8_t)op->op,
                       (uint8_t)op->ndim};
    int32_t ints[2] = {op->root, op->device};
    double scale[2] = {op->prescale, op->postscale};
    uint32_t len = (uint32_t)strlen(op->name);
    DSHIM_CHECK(out_put(eng, head, sizeof(head)));
    DSHIM_CHECK(out_put(eng, ints, sizeof(ints)));
    DSHIM_CHECK(out_put(eng, scale, sizeof(scale)));
    DSHIM_CHECK(out_put(eng, &len, sizeof(len)));
    DSHIM_CHECK(out_put(eng, op->name, len));
    DSHIM_CHECK(out_put(eng, op->shape, sizeof(int64_t) * (size_t)op->ndim));
    uint32_t dlen = 0;
    if (op->kind == DSHIM_NAMED_ALLREDUCE) {
        size_t bytes = (size_t)dshim_named_elems(op->ndim, op->shape, 0) * dshim_dtype_size(op->dtype);
        dlen = bytes <= DSHIM_NAMED_INLINE ? (uint32_t)bytes : 0;
    }
    DSHIM_CHECK(out_put(eng, &dlen, sizeof(dlen)));
    return dlen ? out_put(eng, op->sendbuf, dlen) : DSHIM_OK;
}

dshim_status_t dshim_named_out_join(dshim_named_t *eng)
{
    return out_u8(eng, DSHIM_NAMED_REC_JOIN);
}

dshim_status_t dshim_named_out_shutdown(dshim_named_t *eng, const char *reason)
{
    uint32_t len = (uint32_t)strlen(reason);
    DSHIM_CHECK(out_u8(eng, DSHIM_NAMED_REC_SHUTDOWN));
    DSHIM_CHECK(out_put(eng, &len, sizeof(len)));
    return out_put(eng, reason, len);
}

dshim_status_t dshim_named_out_verdict(dshim_named_t *eng, int cause, uint64_t cutoff_round)
{
    DSHIM_CHECK(out_u8(eng, DSHIM_NAMED_REC_VERDICT));
    DSHIM_CHECK(out_u8(eng, (unsigned)cause));
    return out_put(eng, &cutoff_round, sizeof(cutoff_round));
}

static uint32_t slot_len(const dshim_named_t *eng, int r)
{
    uint32_t len;
    memcpy(&len, eng->slots + (size_t)r * DSHIM_NAMED_SLOT, sizeof(len));
    return len;
}

dshim_status_t dshim_named_exchange(dshim_named_t *eng)
{
    unsigned char slot[DSHIM_NAMED_SLOT];
    uint32_t len = (uint32_t)eng->out_len;
    memset(slot, 0, sizeof(slot));
    memcpy(slot, &len, sizeof(len));
    size_t first = eng->out_len < FIRST ? eng->out_len : FIRST;
    if (first) {
        memcpy(slot + HEADER, eng->out, first);
    }
    /* only the bytes in use matter; the rest of the slot goes as it is */
    DSHIM_CHECK(dshim_allgather(eng->comm, slot, eng->slots, DSHIM_NAMED_SLOT, DSHIM_UINT8));
    size_t total = 0;
    for (int r = 0; r < eng->size; r++) {
        uint32_t l = slot_len(eng, r);
        total += l > FIRST ? l - FIRST : 0;
    }
    if (total == 0) {
        return DSHIM_OK;
    }
    if (!eng->extra_counts) {
        eng->extra_counts = calloc((size_t)eng->size * 2, sizeof(size_t));
        if (!eng->extra_counts) {
            return dshim_error(DSHIM_ERR_NOMEM, "rank %d: named operations: out of memory (round)", eng->rank);
        }
        eng->extra_displs = eng->extra_counts + eng->size;
    }
    if (total > eng->extra_cap) {
        unsigned char *b = realloc(eng->extra, total);
        if (!b) {
            return dshim_error(DSHIM_ERR_NOMEM, "rank %d: named operations: out of memory (round)", eng->rank);
        }
        eng->extra = b;
        eng->extra_cap = total;
    }
    size_t at = 0;
    for (int r = 0; r < eng->size; r++) {
        uint32_t l = slot_len(eng, r);
        eng->extra_counts[r] = l > FIRST ? l - FIRST : 0;
        eng->extra_displs[r] = at;
        at += eng->extra_counts[r];
    }
    return dshim_allgatherv(eng->comm, eng->out_len > first ? eng->out + first : NULL, eng->extra, eng->extra_counts, eng->extra_displs,
                            DSHIM_UINT8);
}

void dshim_named_reader_init(dshim_named_t *eng, int rank, dshim_named_reader_t *rd)
{
    uint32_t l = slot_len(eng, rank);
    rd->eng = eng;
    rd->a = eng->slots + (size_t)rank * DSHIM_NAMED_SLOT + HEADER;
    rd->alen = l < FIRST ? l : FIRST;
    rd->b = l > FIRST ? eng->extra + eng->extra_displs[rank] : NULL;
    rd->blen = l > FIRST ? l - FIRST : 0;
    rd->pos = 0;
}

static int get(dshim_named_reader_t *rd, void *dst, size_t n)
{
    if (rd->pos + n > rd->alen + rd->blen) {
        return -1;
    }
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++, rd->pos++) {
        d[i] = rd->pos < rd->alen ? rd->a[rd->pos] : rd->b[rd->pos - rd->alen];
    }
    return 0;
}

static int get_text(dshim_named_reader_t *rd, dshim_named_rec_t *rec)
{
    uint32_t len;
    if (get(rd, &len, sizeof(len)) < 0 || rd->pos + len > rd->alen + rd->blen) {
        return -1;
    }
    dshim_named_t *eng = rd->eng;
    if ((size_t)len + 1 > eng->text_cap) {
        char *t = realloc(eng->text, (size_t)len + 1);
        if (!t) {
            return -1;
        }
        eng->text = t;
        eng->text_cap = (size_t)len + 1;
    }
    rec->text = eng->text;
    rec->text_len = len;
    eng->text[len] = 0;
    return len ? get(rd, eng->text, len) : 0;
}

int dshim_named_reader_next(dshim_named_reader_t *rd, dshim_named_rec_t *rec)
{
    uint8_t type;
    if (rd->pos == rd->alen + rd->blen) {
        return 0;
    }
    if (get(rd, &type, 1) < 0) {
        return -1;
    }
    memset(rec, 0, sizeof(*rec));
    rec->type = type;
    switch (type) {
    case DSHIM_NAMED_REC_REQ: {
        uint8_t head[4];
        int32_t ints[2];
        double scale[2];
        if (get(rd, head, sizeof(head)) < 0 || get(rd, ints, sizeof(ints)) < 0 || get(rd, scale, sizeof(scale)) < 0) {
            return -1;
        }
        if (head[0] >= DSHIM_NAMED_KIND_COUNT || head[3] > DSHIM_NAMED_MAX_DIMS) {
            return -1;
        }
        rec->req.kind = head[0];
        rec->req.dtype = head[1];
        rec->req.op = head[2];
        rec->req.ndim = head[3];
        rec->req.root = ints[0];
        rec->req.device = ints[1];
        rec->req.prescale = scale[0];
        rec->req.postscale = scale[1];
        uint32_t dlen;
        if (get_text(rd, rec) < 0 || get(rd, rec->req.shape, sizeof(int64_t) * head[3]) < 0 ||
            get(rd, &dlen, sizeof(dlen)) < 0 || dlen > DSHIM_NAMED_INLINE) {
            return -1;
        }
        rec->req.data_len = dlen;
        if (dlen) {
            dshim_named_t *eng = rd->eng;
            if (dlen > eng->data_cap) {
                unsigned char *b = realloc(eng->data, DSHIM_NAMED_INLINE);
                if (!b) {
                    return -1;
                }
                eng->data = b;
                eng->data_cap = DSHIM_NAMED_INLINE;
            }
            if (get(rd, eng->data, dlen) < 0) {
                return -1;
            }
            rec->req.data = eng->data;
        }
        return 1;
    }
    case DSHIM_NAMED_REC_JOIN:
        return 1;
    case DSHIM_NAMED_REC_SHUTDOWN:
        return get_text(rd, rec) < 0 ? -1 : 1;
    case DSHIM_NAMED_REC_VERDICT: {
        uint8_t cause;
        if (get(rd, &cause, 1) < 0 || get(rd, &rec->cutoff, sizeof(rec->cutoff)) < 0) {
            return -1;
        }
        rec->cause = cause;
        return 1;
    }
    default:
        return -1;
    }
}
