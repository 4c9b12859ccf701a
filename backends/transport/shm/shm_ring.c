/*
 * Shared-memory segments (create/attach/unlink/detach), the SPSC ring ends
 * and the doorbell futex.  Layout: see shm_layout.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "barrier.h"
#include "status.h"
#include "transport/shm/shm_layout.h"

/* Line 0 of the segment.  Fixed-width fields only: two processes built by
 * different compilers must agree on it. */
typedef struct shm_header {
    uint64_t magic;     /* written last by the creator (release) */
    uint32_t version;
    uint32_t nrings;
    uint64_t ring_size;
    uint64_t total_bytes;
} shm_header_t;

/* Line 1: the only words that several processes write to (every peer rings
 * the bell), so they get a line of their own, away from the read-mostly
 * header and from every ring position. */
typedef struct shm_bell {
    uint32_t doorbell;
    uint32_t sleepers;
} shm_bell_t;

_Static_assert(sizeof(shm_header_t) <= DSHIM_SHM_LINE, "header must fit one line");
_Static_assert(sizeof(shm_bell_t) <= DSHIM_SHM_LINE, "doorbell must fit one line");

struct dshim_shm_seg {
    unsigned char *base;
    size_t map_bytes;
    int nrings;
    size_t ring_size;
    size_t area_bytes; /* the host area's (0: none) */
    char *path;
    int owner;     /* created it: detach removes the file if nobody did */
    int unlinked;
    int fd;        /* owner: kept open, so that peers can still open the unlinked file (dshim_shm_seg_fd) */
};

static shm_header_t *seg_header(dshim_shm_seg_t *seg)
{
    return (shm_header_t *)seg->base;
}

static shm_bell_t *seg_bell(dshim_shm_seg_t *seg)
{
    return (shm_bell_t *)(seg->base + DSHIM_SHM_LINE);
}

static size_t ring_stride(size_t ring_size)
{
    return 2 * DSHIM_SHM_LINE + ring_size;
}

/* Where the rings begin: after the header, the doorbell and the host area. */
static size_t rings_offset(size_t area_bytes)
{
    return 2 * DSHIM_SHM_LINE + (area_bytes + DSHIM_SHM_LINE - 1) / DSHIM_SHM_LINE * DSHIM_SHM_LINE;
}

_Static_assert(DSHIM_HOST_AREA_LINE <= DSHIM_SHM_LINE && DSHIM_SHM_LINE % DSHIM_HOST_AREA_LINE == 0,
               "the host area's lines must stay aligned in the segment");

static dshim_status_t check_geometry(const char *dir, const char *name, int nrings, size_t ring_size)
{
    if (dir == NULL || dir[0] == '\0') {
        return dshim_error(DSHIM_ERR_INVALID, "shm: empty segment directory: set DSHIM_SHM_DIR to a tmpfs "
                                              "directory such as /dev/shm");
    }
    if (name == NULL || name[0] == '\0' || strchr(name, '/') != NULL || strcmp(name, ".") == 0 ||
        strcmp(name, "..") == 0) {
        return dshim_error(DSHIM_ERR_INVALID, "shm: segment name '%s' is not a plain file name",
                           name ? name : "(null)");
    }
    if (nrings < 1 || nrings > DSHIM_SHM_MAX_RINGS) {
        return dshim_error(DSHIM_ERR_INVALID, "shm: %d rings per segment is out of range (1..%d)", nrings,
                           DSHIM_SHM_MAX_RINGS);
    }
    if (ring_size < DSHIM_SHM_MIN_RING || ring_size > DSHIM_SHM_MAX_RING || (ring_size & (ring_size - 1)) != 0) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "shm: ring size %zu is not a power of two between %u and %zu: fix DSHIM_SHM_RING_SIZE",
                           ring_size, DSHIM_SHM_MIN_RING, DSHIM_SHM_MAX_RING);
    }
    return DSHIM_OK;
}

static dshim_status_t seg_alloc(const char *dir, const char *name, int nrings, size_t ring_size, int host_area,
                                dshim_shm_seg_t **seg_p)
{
    dshim_shm_seg_t *seg = calloc(1, sizeof(*seg));
    size_t path_len = strlen(dir) + 1 + strlen(name) + 1;
    char *path = malloc(path_len);
    if (seg == NULL || path == NULL) {
        free(seg);
        free(path);
        return dshim_error(DSHIM_ERR_NOMEM, "shm: out of memory for a segment descriptor");
    }
    snprintf(path, path_len, "%s/%s", dir, name);
    seg->path = path;
    seg->fd = -1;
    seg->nrings = nrings;
    seg->ring_size = ring_size;
    seg->area_bytes = host_area ? dshim_host_area_bytes(nrings) : 0;
    seg->map_bytes = rings_offset(seg->area_bytes) + (size_t)nrings * ring_stride(ring_size);
    *seg_p = seg;
    return DSHIM_OK;
}

static void seg_free(dshim_shm_seg_t *seg)
{
    if (seg->base != NULL) {
        munmap(seg->base, seg->map_bytes);
    }
    if (seg->fd >= 0) {
        close(seg->fd);
    }
    free(seg->path);
    free(seg);
}

/* Bytes free in dir, or -1 when it cannot be stat'ed (the message only). */
static long long free_bytes(const char *dir)
{
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) {
        return -1;
    }
    return (long long)vfs.f_bavail * (long long)vfs.f_frsize;
}

/* The one-line error for pages that could not be reserved: what, how much,
 * where, and the three ways out. */
static dshim_status_t no_space(const char *what, size_t bytes, const char *dir, int err)
{
    long long avail = free_bytes(dir);
    char freebuf[64] = "unknown";
    if (avail >= 0) {
        snprintf(freebuf, sizeof(freebuf), "%.1f MiB", (double)avail / 1048576.0);
    }
    /* quiet: the caller's line (a fallback's warning, or the failure) carries
     * it, so it is printed once */
    return dshim_error_quiet(DSHIM_ERR_SYSTEM,
                             "shm: cannot reserve %.1f MiB (%s) in %s (%s free): %s: enlarge it (docker run "
                             "--shm-size), point DSHIM_SHM_DIR at a larger tmpfs, or lower DSHIM_SHM_RING_SIZE",
                             (double)bytes / 1048576.0, what, dir, freebuf, strerror(err));
}

/* posix_fallocate of [off, off + bytes); 0 or its error number.  tmpfs
 * takes the pages one by one and gives them back when it runs out, so ranks
 * reserving at once see each other's attempts: one that cannot fit would,
 * while it fails, hold pages that another needed.  Hence: no attempt while
 * the free space is short (the others keep it), and after ENOSPC another
 * try, a few times, while the space is there again (what a failed attempt
 * held came back). */
static int reserve(int fd, const char *dir, off_t off, size_t bytes)
{
    int rc = ENOSPC;
    for (int attempt = 0; attempt < 5; attempt++) {
        long long avail = free_bytes(dir);
        if (avail >= 0 && (unsigned long long)avail < bytes) {
            return ENOSPC;
        }
        do {
            rc = posix_fallocate(fd, off, (off_t)bytes);
        } while (rc == EINTR);
        if (rc != ENOSPC) {
            return rc;
        }
        struct timespec ts = {0, 1000000L * (attempt + 1) + (long)(getpid() % 1000) * 1000};
        nanosleep(&ts, NULL);
    }
    return rc;
}

dshim_status_t dshim_shm_seg_create(const char *dir, const char *name, int nrings, size_t ring_size, int host_area,
                                    dshim_shm_seg_t **seg_p)
{
    dshim_shm_seg_t *seg;
    dshim_status_t st;

    *seg_p = NULL;
    DSHIM_CHECK(check_geometry(dir, name, nrings, ring_size));
    DSHIM_CHECK(seg_alloc(dir, name, nrings, ring_size, host_area, &seg));
    /* O_EXCL: never adopt a file someone else made (a stale segment of a
     * crashed job, or a file planted in the world-writable /dev/shm). */
    int fd = open(seg->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        int err = errno;
        /* quiet, as every failure of create: the caller's one line carries it */
        st = dshim_error_quiet(DSHIM_ERR_SYSTEM, "shm: cannot create segment %s: %s%s", seg->path, strerror(err),
                               err == EEXIST ? " (left by a crashed job? remove it or change DSHIM_SHM_DIR)" : "");
        seg_free(seg);
        return st;
    }
    seg->owner = 1;
    /* tmpfs hands out pages at first touch and raises SIGBUS when it has
     * none left, so every page dshim touches is reserved first
     * (posix_fallocate: on tmpfs it really allocates, and undoes a partial
     * allocation; it returns the error number, errno is untouched).  Here
     * the header and the host area, which every peer of the host touches;
     * the rings are reserved pair by pair when a connection is made
     * (dshim_shm_seg_reserve_ring): a rank holds one ring per rank of the
     * communicator, most of which a job never uses (peers on other hosts,
     * peers an algorithm never talks to), and reserving them all would cost
     * a host N^2 rings of /dev/shm at start-up. */
    if (ftruncate(fd, (off_t)seg->map_bytes) != 0) {
        st = dshim_error_quiet(DSHIM_ERR_SYSTEM, "shm: cannot size segment %s to %zu bytes: %s", seg->path,
                               seg->map_bytes, strerror(errno));
        goto fail;
    }
    int rc = reserve(fd, dir, 0, rings_offset(seg->area_bytes));
    if (rc != 0) {
        st = no_space(seg->area_bytes ? "its header and the host gate's area" : "its header",
                      rings_offset(seg->area_bytes), dir, rc);
        goto fail;
    }
    /* No MAP_POPULATE: each process maps (page-table entries) only the pages
     * it touches. */
    void *base = mmap(NULL, seg->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        st = dshim_error_quiet(DSHIM_ERR_SYSTEM, "shm: cannot map segment %s (%zu bytes): %s", seg->path,
                               seg->map_bytes, strerror(errno));
        goto fail;
    }
    seg->base = base;
    seg->fd = fd; /* closed by seg_free: peers may open the file through it after the unlink */
    fd = -1;

    /* A new file reads as zeros: positions, doorbell and sleepers start at 0.  The magic goes last so that a header that shows it is
     * complete. */
    shm_header_t *hdr = seg_header(seg);
    hdr->version = DSHIM_SHM_VERSION;
    hdr->nrings = (uint32_t)nrings;
    hdr->ring_size = ring_size;
    hdr->total_bytes = seg->map_bytes;
    __atomic_store_n(&hdr->magic, DSHIM_SHM_MAGIC, __ATOMIC_RELEASE);
    DSHIM_TRACE("shm: created %s: %d rings of %zu bytes", seg->path, nrings, ring_size);
    *seg_p = seg;
    return DSHIM_OK;

fail:
    if (fd >= 0) {
        close(fd);
    }
    unlink(seg->path);
    seg_free(seg);
    return st;
}

/* Maps the segment opened as seg->path; `follow`: the path is a /proc magic
 * link to the owner's descriptor, which must be followed. */
static dshim_status_t attach_seg(dshim_shm_seg_t *seg, int follow, int nrings, size_t ring_size,
                                 dshim_shm_seg_t **seg_p)
{
    dshim_status_t st;
    struct stat sb;

    int fd = open(seg->path, O_RDWR | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
    if (fd < 0) {
        st = dshim_error(DSHIM_ERR_SYSTEM, "shm: cannot open segment %s: %s (%s)", seg->path, strerror(errno),
                         follow ? "did its owner exit, or may this process not open its descriptors: another "
                                  "user or pid namespace? DSHIM_TRANSPORT=tcp avoids shared memory"
                                : "was it created and not yet removed by its owner?");
        seg_free(seg);
        return st;
    }
    if (fstat(fd, &sb) != 0) {
        st = dshim_error(DSHIM_ERR_SYSTEM, "shm: cannot stat segment %s: %s", seg->path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != seg->map_bytes) {
        st = dshim_error(DSHIM_ERR_PROTOCOL,
                         "shm: segment %s is %lld bytes, expected %zu for %d rings of %zu bytes: ranks disagree "
                         "on DSHIM_SHM_RING_SIZE or the job size, or it is not a dshim segment",
                         seg->path, (long long)sb.st_size, seg->map_bytes, nrings, ring_size);
        goto out;
    }
    void *base = mmap(NULL, seg->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        st = dshim_error(DSHIM_ERR_SYSTEM, "shm: cannot map segment %s (%zu bytes): %s", seg->path,
                         seg->map_bytes, strerror(errno));
        goto out;
    }
    seg->base = base;
    /* acquire pairs with the creator's release of the magic: once we see
     * it, the rest of the header is there too. */
    shm_header_t *hdr = seg_header(seg);
    uint64_t magic = __atomic_load_n(&hdr->magic, __ATOMIC_ACQUIRE);
    if (magic != DSHIM_SHM_MAGIC || hdr->version != DSHIM_SHM_VERSION || hdr->nrings != (uint32_t)nrings ||
        hdr->ring_size != ring_size || hdr->total_bytes != seg->map_bytes) {
        st = dshim_error(DSHIM_ERR_PROTOCOL,
                         "shm: segment %s has header magic %#llx version %u, %u rings of %llu bytes; expected "
                         "%#llx version %u, %d rings of %zu bytes: mixed dshim versions or settings, or a "
                         "foreign file",
                         seg->path, (unsigned long long)magic, hdr->version, hdr->nrings,
                         (unsigned long long)hdr->ring_size, (unsigned long long)DSHIM_SHM_MAGIC,
                         DSHIM_SHM_VERSION, nrings, ring_size);
        goto out;
    }
    st = DSHIM_OK;
    DSHIM_TRACE("shm: attached %s", seg->path);

out:
    close(fd);
    if (st != DSHIM_OK) {
        seg_free(seg);
        return st;
    }
    *seg_p = seg;
    return DSHIM_OK;
}

dshim_status_t dshim_shm_seg_attach(const char *dir, const char *name, int nrings, size_t ring_size, int host_area,
                                    dshim_shm_seg_t **seg_p)
{
    dshim_shm_seg_t *seg;
    *seg_p = NULL;
    DSHIM_CHECK(check_geometry(dir, name, nrings, ring_size));
    DSHIM_CHECK(seg_alloc(dir, name, nrings, ring_size, host_area, &seg));
    return attach_seg(seg, 0, nrings, ring_size, seg_p);
}

dshim_status_t dshim_shm_seg_attach_fd(int pid, int fd, int nrings, size_t ring_size, int host_area,
                                       dshim_shm_seg_t **seg_p)
{
    dshim_shm_seg_t *seg;
    char dir[32], name[16];
    *seg_p = NULL;
    snprintf(dir, sizeof(dir), "/proc/%d/fd", pid);
    snprintf(name, sizeof(name), "%d", fd);
    DSHIM_CHECK(check_geometry(dir, name, nrings, ring_size));
    DSHIM_CHECK(seg_alloc(dir, name, nrings, ring_size, host_area, &seg));
    return attach_seg(seg, 1, nrings, ring_size, seg_p);
}

int dshim_shm_seg_fd(const dshim_shm_seg_t *seg)
{
    return seg ? seg->fd : -1;
}

void dshim_shm_seg_unlink(dshim_shm_seg_t *seg)
{
    if (seg == NULL || seg->unlinked) {
        return;
    }
    seg->unlinked = 1;
    if (unlink(seg->path) != 0 && errno != ENOENT) {
        DSHIM_WARN("shm: cannot remove segment %s: %s (remove it by hand)", seg->path, strerror(errno));
    }
}

void dshim_shm_seg_detach(dshim_shm_seg_t *seg)
{
    if (seg == NULL) {
        return;
    }
    /* An owner that leaves without having unlinked (an error path before
     * every peer attached) must not leave the file behind in /dev/shm. */
    if (seg->owner) {
        dshim_shm_seg_unlink(seg);
    }
    seg_free(seg);
}

void *dshim_shm_seg_host_area(dshim_shm_seg_t *seg)
{
    return seg->area_bytes ? seg->base + 2 * DSHIM_SHM_LINE : NULL;
}

dshim_status_t dshim_shm_seg_ring(dshim_shm_seg_t *seg, int index, dshim_shm_ring_t *ring_p)
{
    if (seg == NULL || index < 0 || index >= seg->nrings) {
        return dshim_error(DSHIM_ERR_INVALID, "shm: ring %d does not exist in segment %s (%d rings)", index,
                           seg ? seg->path : "(null)", seg ? seg->nrings : 0);
    }
    unsigned char *r = seg->base + rings_offset(seg->area_bytes) + (size_t)index * ring_stride(seg->ring_size);
    ring_p->head = (uint64_t *)r;
    ring_p->tail = (uint64_t *)(r + DSHIM_SHM_LINE);
    ring_p->data = r + 2 * DSHIM_SHM_LINE;
    ring_p->size = seg->ring_size;
    ring_p->mask = seg->ring_size - 1;
    return DSHIM_OK;
}

dshim_status_t dshim_shm_seg_reserve_ring(dshim_shm_seg_t *seg, int index, const char *dir, const char *what)
{
    if (seg == NULL || index < 0 || index >= seg->nrings) {
        return dshim_error(DSHIM_ERR_INVALID, "shm: ring %d does not exist in segment %s", index,
                           seg ? seg->path : "(null)");
    }
    /* a peer's segment: opened again through its owner's descriptor (the
     * mapping's was closed after mmap) */
    int fd = seg->fd >= 0 ? seg->fd : open(seg->path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        return dshim_error_quiet(DSHIM_ERR_SYSTEM, "shm: cannot open segment %s to reserve %s: %s", seg->path,
                                 what, strerror(errno));
    }
    size_t stride = ring_stride(seg->ring_size);
    int rc = reserve(fd, dir, (off_t)(rings_offset(seg->area_bytes) + (size_t)index * stride), stride);
    if (fd != seg->fd) {
        close(fd);
    }
    return rc == 0 ? DSHIM_OK : no_space(what, stride, dir, rc);
}

size_t dshim_shm_seg_ring_size(const dshim_shm_seg_t *seg)
{
    return seg->ring_size;
}

/* --- ring ends -----------------------------------------------------------
 *
 * Ordering: the producer copies the bytes, then publishes head with a
 * release store; the consumer loads head with acquire, so the bytes below
 * head are visible to it.  Symmetrically, the consumer publishes tail with
 * release after it finished reading (or copying out of) the bytes, and the
 * producer loads tail with acquire before overwriting them.  Each side keeps
 * its own position in private memory and only caches the other's: the
 * shared lines are read when the cache cannot satisfy the request and
 * written once per call. */

void dshim_shm_producer_init(dshim_shm_producer_t *p, const dshim_shm_ring_t *ring)
{
    p->ring = *ring;
    p->head = __atomic_load_n(ring->head, __ATOMIC_RELAXED);
    p->cached_tail = __atomic_load_n(ring->tail, __ATOMIC_ACQUIRE);
}

size_t dshim_shm_producer_write(dshim_shm_producer_t *p, const void *buf, size_t len)
{
    size_t size = p->ring.size;
    size_t room = size - (size_t)(p->head - p->cached_tail);
    if (room < len) {
        p->cached_tail = __atomic_load_n(p->ring.tail, __ATOMIC_ACQUIRE);
        room = size - (size_t)(p->head - p->cached_tail);
    }
    size_t n = len < room ? len : room;
    if (n == 0) {
        return 0;
    }
    size_t off = (size_t)p->head & p->ring.mask;
    size_t first = size - off;
    if (first > n) {
        first = n;
    }
    memcpy(p->ring.data + off, buf, first);
    if (n > first) {
        memcpy(p->ring.data, (const unsigned char *)buf + first, n - first);
    }
    p->head += n;
    __atomic_store_n(p->ring.head, p->head, __ATOMIC_RELEASE);
    return n;
}

void dshim_shm_consumer_init(dshim_shm_consumer_t *c, const dshim_shm_ring_t *ring)
{
    c->ring = *ring;
    c->tail = __atomic_load_n(ring->tail, __ATOMIC_RELAXED);
    c->cached_head = __atomic_load_n(ring->head, __ATOMIC_ACQUIRE);
}

size_t dshim_shm_consumer_peek(dshim_shm_consumer_t *c, const void **ptr_p)
{
    size_t off = (size_t)c->tail & c->ring.mask;
    size_t to_wrap = c->ring.size - off;
    size_t avail = (size_t)(c->cached_head - c->tail);
    /* Only when the cached bytes stop short of the wrap could a fresh look
     * give the caller a longer piece. */
    if (avail < to_wrap) {
        c->cached_head = __atomic_load_n(c->ring.head, __ATOMIC_ACQUIRE);
        avail = (size_t)(c->cached_head - c->tail);
    }
    *ptr_p = c->ring.data + off;
    return avail < to_wrap ? avail : to_wrap;
}

void dshim_shm_consumer_release(dshim_shm_consumer_t *c, size_t n)
{
    if (n == 0) {
        return;
    }
    c->tail += n;
    __atomic_store_n(c->ring.tail, c->tail, __ATOMIC_RELEASE);
}

size_t dshim_shm_consumer_read(dshim_shm_consumer_t *c, void *buf, size_t len)
{
    size_t size = c->ring.size;
    size_t avail = (size_t)(c->cached_head - c->tail);
    if (avail < len) {
        c->cached_head = __atomic_load_n(c->ring.head, __ATOMIC_ACQUIRE);
        avail = (size_t)(c->cached_head - c->tail);
    }
    size_t n = len < avail ? len : avail;
    if (n == 0) {
        return 0;
    }
    size_t off = (size_t)c->tail & c->ring.mask;
    size_t first = size - off;
    if (first > n) {
        first = n;
    }
    memcpy(buf, c->ring.data + off, first);
    if (n > first) {
        memcpy((unsigned char *)buf + first, c->ring.data, n - first);
    }
    dshim_shm_consumer_release(c, n);
    return n;
}

/* --- doorbell -------------------------------------------------------------
 *
 * The waiter W and a waker K race like this:
 *
 *   W: sleepers += 1   (seq_cst RMW)   K: publish head/tail (release)
 *   W: seq_cst fence                   K: seq_cst fence
 *   W: seen = doorbell (seq_cst load)  K: s = sleepers      (seq_cst load)
 *   W: re-check rings, find nothing    K: if s > 0: doorbell += 1, FUTEX_WAKE
 *   W: FUTEX_WAIT(seen); sleepers -= 1
 *
 * Both sides "write one word, then read the other": store->load orders,
 * which only seq_cst fences give.  The two fences are in one total order S.
 * If W's fence comes first, K's load sees W's increment (or a later value),
 * so K rings; FUTEX_WAIT compares the word with `seen` under the futex lock,
 * so a ring after W read `seen` makes the wait return at once or wakes it,
 * and a ring before that carried K's publication to W's re-check (the
 * increment releases, W's load of it acquires).  If K's fence comes first,
 * W's re-check, after W's fence, sees K's publication and W does not sleep.
 * Either way no wake-up is lost.
 *
 * The point of announcing first and re-checking after: a rank that rings a
 * peer nobody sleeps on writes nothing the peer's line holds (a fence and a
 * load of a word that stays in its cache), where an unconditional increment
 * pulled the line over on every message and every consumed byte (the
 * barrier of 2 ranks: 0.43 -> 0.37 us).  A waiter announces itself only when
 * it is about to sleep (the engine's spin ran out), so the hot path never
 * writes the bell at all.
 *
 * The futex is not FUTEX_PRIVATE: the word lives in a MAP_SHARED file
 * mapping used by several processes, and the kernel must key it by inode and
 * offset rather than by this process's address space. */

static long futex_call(uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, word, op, val, ts, NULL, 0);
}

void dshim_shm_doorbell_ring(dshim_shm_seg_t *seg)
{
    shm_bell_t *bell = seg_bell(seg);
    DSHIM_STORE_LOAD_BARRIER(&bell->sleepers);
    if (__atomic_load_n(&bell->sleepers, __ATOMIC_SEQ_CST) > 0) {
        __atomic_fetch_add(&bell->doorbell, 1, __ATOMIC_SEQ_CST);
        futex_call(&bell->doorbell, FUTEX_WAKE, INT_MAX, NULL);
    }
}

uint32_t dshim_shm_doorbell_arm(dshim_shm_seg_t *seg)
{
    shm_bell_t *bell = seg_bell(seg);
    __atomic_fetch_add(&bell->sleepers, 1, __ATOMIC_SEQ_CST);
    DSHIM_STORE_LOAD_BARRIER(&bell->sleepers);
    return __atomic_load_n(&bell->doorbell, __ATOMIC_SEQ_CST);
}

void dshim_shm_doorbell_disarm(dshim_shm_seg_t *seg)
{
    __atomic_fetch_sub(&seg_bell(seg)->sleepers, 1, __ATOMIC_SEQ_CST);
}

/* Between arm and disarm.  timeout_us < 0 sleeps until woken; 0 returns at once. */
dshim_status_t dshim_shm_doorbell_wait(dshim_shm_seg_t *seg, uint32_t seen, long timeout_us)
{
    shm_bell_t *bell = seg_bell(seg);
    dshim_status_t st = DSHIM_OK;
    struct timespec ts;
    const struct timespec *tsp = NULL;

    if (timeout_us == 0) {
        return DSHIM_OK;
    }
    if (timeout_us > 0) {
        ts.tv_sec = timeout_us / 1000000;
        ts.tv_nsec = (timeout_us % 1000000) * 1000;
        tsp = &ts;
    }
    if (__atomic_load_n(&bell->doorbell, __ATOMIC_SEQ_CST) == seen) {
        /* Relative timeout (FUTEX_WAIT); EAGAIN = the bell rang in between,
         * ETIMEDOUT and EINTR are ordinary returns: the caller re-checks. */
        if (futex_call(&bell->doorbell, FUTEX_WAIT, seen, tsp) != 0 && errno != EAGAIN && errno != ETIMEDOUT &&
            errno != EINTR) {
            st = dshim_error(DSHIM_ERR_SYSTEM, "shm: futex wait on the doorbell of %s failed: %s", seg->path,
                             strerror(errno));
        }
    }
    return st;
}
