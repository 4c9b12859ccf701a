/*
 * shim/gpu, the GPU module: the pinned staging pool, what the module does in
 * a process without CUDA, and (argument "device", on a GPU machine) the
 * exported staging calls the torch backend uses (dshim_gpu_stage_get/put,
 * dshim_gpu_copy_async, dshim_gpu_stream_sync) plus device reductions
 * through gpu_reduce.h, in stream order.
 *
 *     check_gpu_module           pool + no-CUDA behaviour: runs everywhere
 *     check_gpu_module device    on a device; 77 (skipped) without one
 *
 * Like the other GPU tests it builds without CUDA headers: the pool is tried
 * on a fake runtime table (malloc for pinned memory), device memory comes
 * from libdshim-cuda.so's dshim_cuda_test_* helpers.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dshim.h"
#include "gpu_reduce.h"
#include "gpu_runtime.h"
#include "gpu_staging.h"
#include "reduce/cuda/reduce_cuda.h"

#define SKIP_CODE 77
#define KIB ((size_t)1 << 10)

/* --- a fake runtime: pinned memory is malloc'ed and counted ---------------- */
static int pinned, unpinned, fail_pinning;

static dshim_gpu_err_t fake_host_alloc(void **ptr, size_t size, unsigned int flags)
{
    (void)flags;
    if (fail_pinning) {
        return 2; /* cudaErrorMemoryAllocation */
    }
    *ptr = malloc(size);
    pinned++;
    return *ptr ? DSHIM_GPU_SUCCESS : 2;
}

static dshim_gpu_err_t fake_free_host(void *ptr)
{
    free(ptr);
    unpinned++;
    return DSHIM_GPU_SUCCESS;
}

static dshim_gpu_err_t fake_last_error(void)
{
    return DSHIM_GPU_SUCCESS;
}

/* Each test counts from zero, also when Check runs them in one process
 * (CK_FORK=no, as make test's valgrind stage does). */
static void reset_fake(void)
{
    pinned = unpinned = fail_pinning = 0;
}

static const dshim_gpu_runtime_t fake = {
    .HostAlloc = fake_host_alloc,
    .FreeHost = fake_free_host,
    .GetLastError = fake_last_error,
};

START_TEST(test_pool_reuses_smallest_fit)
{
    dshim_gpu_pool_t *pool = dshim_gpu_pool_create(&fake, 1 << 30, 0);
    ck_assert_ptr_nonnull(pool);
    dshim_gpu_block_t *small = dshim_gpu_pool_get(pool, 1);
    ck_assert_ptr_nonnull(small);
    ck_assert_uint_eq(small->size, 64 * KIB); /* the smallest block */
    dshim_gpu_block_t *large = dshim_gpu_pool_get(pool, 100 * KIB);
    ck_assert_uint_eq(large->size, 128 * KIB); /* a power of two */
    memset(large->ptr, 7, large->size);        /* all of it is usable */
    ck_assert_int_eq(pinned, 2);
    dshim_gpu_pool_put(pool, large);
    dshim_gpu_pool_put(pool, small);
    /* the smallest free block that fits, whatever the order of the list */
    dshim_gpu_block_t *again = dshim_gpu_pool_get(pool, 10);
    ck_assert_ptr_eq(again, small);
    dshim_gpu_block_t *big_again = dshim_gpu_pool_get(pool, 65 * KIB);
    ck_assert_ptr_eq(big_again, large);
    ck_assert_int_eq(pinned, 2); /* nothing pinned twice */
    dshim_gpu_pool_put(pool, again);
    dshim_gpu_pool_put(pool, big_again);
    ck_assert_int_eq(unpinned, 0); /* put never frees */
    dshim_gpu_pool_destroy(pool);
    ck_assert_int_eq(unpinned, 2);
}
END_TEST

START_TEST(test_pool_cap_frees_before_pinning)
{
    dshim_gpu_pool_t *pool = dshim_gpu_pool_create(&fake, 256 * KIB, 0);
    dshim_gpu_block_t *a = dshim_gpu_pool_get(pool, 64 * KIB);
    dshim_gpu_block_t *b = dshim_gpu_pool_get(pool, 128 * KIB);
    dshim_gpu_pool_put(pool, a);
    dshim_gpu_pool_put(pool, b);
    /* 192 KiB free; a new 256 KiB block leaves room for none of them */
    dshim_gpu_block_t *c = dshim_gpu_pool_get(pool, 200 * KIB);
    ck_assert_uint_eq(c->size, 256 * KIB);
    ck_assert_int_eq(unpinned, 2);
    ck_assert_int_eq(pinned, 3);
    dshim_gpu_pool_put(pool, c);
    dshim_gpu_pool_destroy(pool);
    ck_assert_int_eq(unpinned, 3);
}
END_TEST

START_TEST(test_pool_pinning_fails)
{
    dshim_gpu_pool_t *pool = dshim_gpu_pool_create(&fake, 1 << 30, 0);
    fail_pinning = 1;
    ck_assert_ptr_null(dshim_gpu_pool_get(pool, 1));
    fail_pinning = 0;
    dshim_gpu_pool_destroy(pool);
}
END_TEST

/* A test program loads no CUDA runtime: every GPU call says so. */
START_TEST(test_without_cuda)
{
    if (dshim_gpu_present()) {
        return; /* preloaded into a CUDA process: nothing to check here */
    }
    int x = 0;
    ck_assert_int_eq(dshim_gpu_available(), 0);
    ck_assert_int_eq(dshim_gpu_memtype(&x), DSHIM_GPU_MEM_UNREGISTERED);
    ck_assert_int_eq(dshim_gpu_is_cuda_ptr(&x), 0);
    ck_assert_int_eq(dshim_gpu_current_device(), 0);
    void *p = &x;
    ck_assert_int_eq(dshim_gpu_malloc(&p, 16), DSHIM_ERR_UNSUPPORTED);
    ck_assert_int_eq(dshim_gpu_free(&x), DSHIM_ERR_UNSUPPORTED);
    void *host = &x;
    ck_assert_ptr_null(dshim_gpu_stage_get(16, &host));
    ck_assert_ptr_null(host);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "no CUDA runtime"));
    dshim_gpu_stage_put(NULL);
    ck_assert_int_eq(dshim_gpu_copy_async(&x, &x, 4, 0, NULL), DSHIM_ERR_UNSUPPORTED);
    ck_assert_int_eq(dshim_gpu_stream_sync(0, NULL), DSHIM_ERR_UNSUPPORTED);
    if (!dshim_gpu_kernels_loaded()) {
        ck_assert_int_eq(dshim_gpu_supports(DSHIM_FLOAT32, DSHIM_SUM), 0);
        ck_assert_int_eq(dshim_gpu_reduce(&x, &x, &x, 1, DSHIM_INT32, DSHIM_SUM, NULL), DSHIM_ERR_UNSUPPORTED);
        ck_assert_int_eq(dshim_gpu_scale_div(&x, 1, DSHIM_INT32, 2, NULL), DSHIM_ERR_UNSUPPORTED);
        ck_assert_ptr_null(dshim_gpu_kernels_symbol("dshim_cuda_test_alloc"));
    }
}
END_TEST

/* --- on a device --------------------------------------------------------- */
#define N 100003 /* floats: more than one 64 KiB block, not a round size */

static dshim_cuda_test_alloc_fn dev_alloc;
static dshim_cuda_test_free_fn dev_free;

/* Host -> device -> (reduce on the device) -> host through staging blocks,
 * every step queued on the default stream, one wait at the end: the copies
 * and the kernel run in stream order. */
START_TEST(test_stage_copy_reduce_in_stream_order)
{
    ck_assert_int_eq(dshim_gpu_available(), 1);
    void *in_host = NULL, *out_host = NULL;
    void *in_blk = dshim_gpu_stage_get(N * sizeof(float), &in_host);
    void *out_blk = dshim_gpu_stage_get(N * sizeof(float), &out_host);
    ck_assert_msg(in_blk && out_blk, "%s", dshim_last_error());
    ck_assert_int_eq(dshim_gpu_memtype(in_host), DSHIM_GPU_MEM_HOST); /* pinned */
    float *in = in_host, *out = out_host;
    for (int i = 0; i < N; i++) {
        in[i] = (float)(i % 1000) * 0.5f;
        out[i] = -1.0f;
    }
    void *d_a = NULL, *d_b = NULL;
    ck_assert_int_eq(dev_alloc(&d_a, N * sizeof(float)), DSHIM_OK);
    ck_assert_int_eq(dev_alloc(&d_b, N * sizeof(float)), DSHIM_OK);
    ck_assert_int_eq(dshim_gpu_memtype(d_a), DSHIM_GPU_MEM_DEVICE);
    ck_assert_int_eq(dshim_gpu_is_cuda_ptr(d_a), 1);
    const int dev = dshim_gpu_current_device();
    ck_assert_int_eq(dshim_gpu_copy_async(d_a, in, N * sizeof(float), dev, NULL), DSHIM_OK);
    ck_assert_int_eq(dshim_gpu_copy_async(d_b, in, N * sizeof(float), dev, NULL), DSHIM_OK);
    ck_assert(dshim_gpu_supports(DSHIM_FLOAT32, DSHIM_AVG));
    ck_assert_int_eq(dshim_gpu_reduce(d_a, d_a, d_b, N, DSHIM_FLOAT32, DSHIM_SUM, NULL), DSHIM_OK);
    ck_assert_int_eq(dshim_gpu_scale_div(d_a, N, DSHIM_FLOAT32, 2, NULL), DSHIM_OK);
    ck_assert_int_eq(dshim_gpu_copy_async(out, d_a, N * sizeof(float), dev, NULL), DSHIM_OK);
    ck_assert_int_eq(dshim_gpu_stream_sync(dev, NULL), DSHIM_OK);
    for (int i = 0; i < N; i++) {
        if (out[i] != in[i]) { /* (x + x) / 2 is exact */
            ck_abort_msg("element %d: %g, want %g", i, (double)out[i], (double)in[i]);
        }
    }
    dshim_gpu_stage_put(in_blk);
    dshim_gpu_stage_put(out_blk);
    /* a block given back is handed out again */
    void *again_host = NULL;
    void *again = dshim_gpu_stage_get(16, &again_host);
    ck_assert(again == in_blk || again == out_blk);
    dshim_gpu_stage_put(again);
    dev_free(d_a);
    dev_free(d_b);
}
END_TEST

static Suite *module_suite(int device)
{
    Suite *s = suite_create("gpu_module");
    TCase *tc = tcase_create(device ? "device" : "host");
    if (device) {
        tcase_add_test(tc, test_stage_copy_reduce_in_stream_order);
    } else {
        tcase_add_checked_fixture(tc, reset_fake, NULL);
        tcase_add_test(tc, test_pool_reuses_smallest_fit);
        tcase_add_test(tc, test_pool_cap_frees_before_pinning);
        tcase_add_test(tc, test_pool_pinning_fails);
        tcase_add_test(tc, test_without_cuda);
    }
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    int device = argc > 1 && strcmp(argv[1], "device") == 0;
    if (device) {
        /* loads libdshim-cuda.so, and with it the CUDA runtime the module finds */
        if (!dshim_gpu_kernels_loaded()) {
            printf("SKIP: no CUDA device\n");
            return SKIP_CODE;
        }
        dev_alloc = (dshim_cuda_test_alloc_fn)dshim_gpu_kernels_symbol("dshim_cuda_test_alloc");
        dev_free = (dshim_cuda_test_free_fn)dshim_gpu_kernels_symbol("dshim_cuda_test_free");
        if (!dev_alloc || !dev_free) {
            fprintf(stderr, "libdshim-cuda.so lacks the dshim_cuda_test_* helpers\n");
            return 1;
        }
    }
    SRunner *sr = srunner_create(module_suite(device));
    if (device) {
        srunner_set_fork_status(sr, CK_NOFORK); /* a CUDA context does not survive fork() */
    }
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
