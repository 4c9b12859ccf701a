/*
 * A CUDA runtime (libcudart.so.12) and driver (libcuda.so.1, built with
 * FAKE_CUDA_DRIVER) for machines without a GPU, just enough for the NCCL
 * hook's CUDA executor (hooks/nccl/nccl_exec_cuda.c) to run its staged path
 * in nccl_stream_order.c: "device" memory is host memory from cudaMalloc,
 * each stream is a thread that runs its queue in order (copies, event
 * records, waits for events and for 32-bit values, writes of values, host
 * functions).
 *
 * Two rules of the real driver that the executor must live with are
 * modelled, because breaking them hung DDP on an H200 (docs/nccl.md):
 *  - cudaStreamSynchronize holds the driver's lock while it waits for the
 *    stream (as a synchronous copy into pageable memory did there), and every
 *    other call takes that lock: a CUDA call on a thread the stream waits for
 *    deadlocks;
 *  - calls are counted per thread: fake_cuda_foreign_calls() says how many
 *    came from a thread that neither the test (fake_cuda_allow_thread) nor a
 *    stream owns -- the executor's proxy thread must make none.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

/* the build hides symbols by default (-fvisibility=hidden); this library is an API */
#pragma GCC visibility push(default)

#ifndef FAKE_CUDA_DRIVER

enum { OP_COPY, OP_RECORD, OP_WAIT_EVENT, OP_WAIT_VALUE, OP_WRITE_VALUE, OP_HOST_FN };

typedef struct fake_event {
    uint64_t recorded;   /* records queued (caller) */
    uint64_t completed;  /* records a stream ran */
    struct fake_event *next;  /* every event ever made: kept, never freed (see cudaEventDestroy) */
} fake_event_t;

typedef struct op {
    struct op *next;
    int kind;
    void *dst;
    const void *src;
    size_t n;
    fake_event_t *ev;
    uint64_t ev_seq;
    volatile uint32_t *addr;
    uint32_t value;
    void (*fn)(void *);
} op_t;

typedef struct fake_stream {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    op_t *head, *tail;
    int running;  /* an op is being run */
    int stop;
    pthread_t thread;
} fake_stream_t;

#define MAX_RANGES 4096

static pthread_mutex_t driver_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char *base;
    size_t len;
    int type;  /* 2 device, 1 pinned host */
} ranges[MAX_RANGES];
static int nranges;
static fake_event_t *events;  /* under driver_lock */
static fake_stream_t *legacy_stream;
static __thread int allowed;  /* the test's threads and the streams' */
static int foreign;
static pthread_once_t legacy_once = PTHREAD_ONCE_INIT;

static void enter(void)
{
    if (!allowed) {
        __atomic_add_fetch(&foreign, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_lock(&driver_lock);
}

static void leave(void)
{
    pthread_mutex_unlock(&driver_lock);
}

static void run_op(op_t *o)
{
    switch (o->kind) {
    case OP_COPY:
        memmove(o->dst, o->src, o->n);
        break;
    case OP_RECORD:
        __atomic_store_n(&o->ev->completed, o->ev_seq, __ATOMIC_RELEASE);
        break;
    case OP_WAIT_EVENT:
        while (__atomic_load_n(&o->ev->completed, __ATOMIC_ACQUIRE) < o->ev_seq) {
            sched_yield();
        }
        break;
    case OP_WAIT_VALUE: /* CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - value) >= 0 */
        while ((int32_t)(__atomic_load_n(o->addr, __ATOMIC_ACQUIRE) - o->value) < 0) {
            sched_yield();
        }
        break;
    case OP_WRITE_VALUE:
        /* CU_STREAM_WRITE_VALUE_DEFAULT: the stream's earlier writes first */
        __atomic_store_n(o->addr, o->value, __ATOMIC_SEQ_CST);
        break;
    case OP_HOST_FN:
        o->fn(o->dst);
        break;
    }
}

static void *stream_main(void *arg)
{
    fake_stream_t *s = arg;
    allowed = 1;
    pthread_mutex_lock(&s->lock);
    while (1) {
        while (!s->head && !s->stop) {
            pthread_cond_wait(&s->cond, &s->lock);
        }
        if (!s->head) {
            break;
        }
        op_t *o = s->head;
        s->head = o->next;
        if (!s->head) {
            s->tail = NULL;
        }
        s->running = 1;
        pthread_mutex_unlock(&s->lock);
        run_op(o);
        free(o);
        pthread_mutex_lock(&s->lock);
        s->running = 0;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static fake_stream_t *stream_new(void)
{
    fake_stream_t *s = calloc(1, sizeof(*s));
    if (!s) {
        abort();
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        abort();
    }
    return s;
}

static void make_legacy(void)
{
    legacy_stream = stream_new();
}

static fake_stream_t *stream_of(void *stream)
{
    if (!stream || stream == (void *)1 || stream == (void *)2) { /* NULL, legacy, per-thread */
        pthread_once(&legacy_once, make_legacy);
        return legacy_stream;
    }
    return stream;
}

static int push(void *stream, op_t proto)
{
    op_t *o = malloc(sizeof(*o));
    if (!o) {
        return 2; /* cudaErrorMemoryAllocation */
    }
    *o = proto;
    o->next = NULL;
    fake_stream_t *s = stream_of(stream);
    pthread_mutex_lock(&s->lock);
    if (s->tail) {
        s->tail->next = o;
    } else {
        s->head = o;
    }
    s->tail = o;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

static int add_range(void *p, size_t len, int type)
{
    pthread_mutex_lock(&table_lock);
    if (nranges == MAX_RANGES) {
        pthread_mutex_unlock(&table_lock);
        return -1;
    }
    ranges[nranges].base = p;
    ranges[nranges].len = len;
    ranges[nranges].type = type;
    nranges++;
    pthread_mutex_unlock(&table_lock);
    return 0;
}

static void drop_range(void *p)
{
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < nranges; i++) {
        if (ranges[i].base == p) {
            ranges[i] = ranges[--nranges];
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
}

/* --- what the test calls ---------------------------------------------- */

void fake_cuda_allow_thread(void)
{
    allowed = 1;
}

int fake_cuda_foreign_calls(void)
{
    return __atomic_load_n(&foreign, __ATOMIC_RELAXED);
}

/* for the driver library */
int fake_cuda_push_value(void *stream, volatile uint32_t *addr, uint32_t value, int write)
{
    op_t o = {.kind = write ? OP_WRITE_VALUE : OP_WAIT_VALUE, .addr = addr, .value = value};
    enter();
    int r = push(stream, o);
    leave();
    return r;
}

/* --- the runtime API (the part gpu_runtime.c loads, plus stream creation) */

typedef struct {
    int type, device;
    void *device_pointer, *host_pointer;
} fake_attr_t;

int cudaPointerGetAttributes(fake_attr_t *attr, const void *ptr)
{
    enter();
    memset(attr, 0, sizeof(*attr));
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < nranges; i++) {
        if ((const char *)ptr >= ranges[i].base && (const char *)ptr < ranges[i].base + ranges[i].len) {
            attr->type = ranges[i].type;
            attr->device_pointer = (void *)ptr;
            attr->host_pointer = ranges[i].type == 1 ? (void *)ptr : NULL;
        }
    }
    pthread_mutex_unlock(&table_lock);
    leave();
    return 0;
}

int cudaGetLastError(void)
{
    return 0;
}

const char *cudaGetErrorString(int err)
{
    return err ? "fake CUDA error" : "no error";
}

int cudaGetDevice(int *dev)
{
    enter();
    *dev = 0;
    leave();
    return 0;
}

int cudaSetDevice(int dev)
{
    enter();
    leave();
    return dev == 0 ? 0 : 101; /* cudaErrorInvalidDevice */
}

int cudaMalloc(void **p, size_t n)
{
    enter();
    *p = malloc(n ? n : 1);
    int r = *p && add_range(*p, n ? n : 1, 2) == 0 ? 0 : 2;
    leave();
    return r;
}

int cudaFree(void *p)
{
    enter();
    drop_range(p);
    free(p);
    leave();
    return 0;
}

int cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    enter();
    *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    int r = *p && add_range(*p, n, 1) == 0 ? 0 : 2;
    if (r == 0) {
        memset(*p, 0, n);
    }
    leave();
    return r;
}

int cudaFreeHost(void *p)
{
    enter();
    drop_range(p);
    free(p);
    leave();
    return 0;
}

int cudaHostGetDevicePointer(void **dptr, void *hptr, unsigned flags)
{
    (void)flags;
    enter();
    *dptr = hptr; /* one address space */
    leave();
    return 0;
}

int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream)
{
    (void)kind;
    op_t o = {.kind = OP_COPY, .dst = dst, .src = src, .n = n};
    enter();
    int r = push(stream, o);
    leave();
    return r;
}

int cudaEventCreateWithFlags(void **ev, unsigned flags)
{
    (void)flags;
    enter();
    fake_event_t *e = calloc(1, sizeof(fake_event_t));
    if (e) {
        e->next = events;
        events = e;
    }
    *ev = e;
    leave();
    return e ? 0 : 2;
}

int cudaEventRecord(void *ev, void *stream)
{
    fake_event_t *e = ev;
    enter();
    op_t o = {.kind = OP_RECORD, .ev = e, .ev_seq = ++e->recorded};
    int r = push(stream, o);
    leave();
    return r;
}

int cudaEventQuery(void *ev)
{
    fake_event_t *e = ev;
    enter();
    int r = __atomic_load_n(&e->completed, __ATOMIC_ACQUIRE) >= e->recorded ? 0 : 600;
    leave();
    return r;
}

int cudaEventDestroy(void *ev)
{
    (void)ev; /* a queued record may still point to it: kept (a test's few bytes) */
    enter();
    leave();
    return 0;
}

int cudaStreamWaitEvent(void *stream, void *ev, unsigned flags)
{
    (void)flags;
    fake_event_t *e = ev;
    enter();
    op_t o = {.kind = OP_WAIT_EVENT, .ev = e, .ev_seq = e->recorded};
    int r = push(stream, o);
    leave();
    return r;
}

int cudaLaunchHostFunc(void *stream, void (*fn)(void *), void *data)
{
    op_t o = {.kind = OP_HOST_FN, .fn = fn, .dst = data};
    enter();
    int r = push(stream, o);
    leave();
    return r;
}

/* Holds the driver's lock until the stream is idle (see the top). */
int cudaStreamSynchronize(void *stream)
{
    fake_stream_t *s = stream_of(stream);
    enter();
    pthread_mutex_lock(&s->lock);
    while (s->head || s->running) {
        pthread_cond_wait(&s->cond, &s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    leave();
    return 0;
}

int cudaStreamCreate(void **stream)
{
    enter();
    *stream = stream_new();
    leave();
    return 0;
}

int cudaIpcGetMemHandle(void *handle, void *ptr)
{
    (void)handle, (void)ptr;
    return 801; /* cudaErrorNotSupported: the executor stages */
}

int cudaIpcOpenMemHandle(void **ptr, char handle[64], unsigned flags)
{
    (void)ptr, (void)handle, (void)flags;
    return 801;
}

int cudaIpcCloseMemHandle(void *ptr)
{
    (void)ptr;
    return 801;
}

#else /* FAKE_CUDA_DRIVER: the stream memory operations of libcuda.so.1 */

int cuStreamWaitValue32_v2(void *stream, unsigned long long addr, uint32_t value, unsigned flags)
{
    (void)flags;
    return fake_cuda_push_value(stream, (volatile uint32_t *)(uintptr_t)addr, value, 0);
}

int cuStreamWriteValue32_v2(void *stream, unsigned long long addr, uint32_t value, unsigned flags)
{
    (void)flags;
    return fake_cuda_push_value(stream, (volatile uint32_t *)(uintptr_t)addr, value, 1);
}

#endif
