/*
 * cuda_test.h - what the CUDA suites (test_cuda, test_cuda_ops,
 * test_cuda_llama, test_cuda_comm) share: whether CUDA was built, the GPU
 * check that skips a test cleanly, a clock, and a cpu and a cuda device
 * side by side for comparing ops.
 *
 * Tests that need a GPU look for one inside the forked test, never in
 * main() (CUDA must not be initialised in Check's parent process), and
 * without one print exactly "SKIP: <test>: no CUDA device" and pass
 * (tools/run_tests.sh counts those lines). Builds with CUDA=0 compile the
 * same files: the cuda entry points are then stubs.
 */
#ifndef FSDP_TESTS_CUDA_TEST_H
#define FSDP_TESTS_CUDA_TEST_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "device/device.h"
#include "ops/ops.h"

#ifdef FSDP_CUDA
static const int built_with_cuda = 1;
#else
static const int built_with_cuda = 0;
#endif

#ifdef FSDP_NCCL
static const int built_with_nccl = 1;
#else
static const int built_with_nccl = 0;
#endif

#define SEED 1234u

/* Inside a test: pass with a SKIP line when no GPU is visible. */
#define NEED_GPU(name)                                               \
    do {                                                             \
        if (fsdp_cuda_device_count() == 0) {                         \
            printf("SKIP: %s: no CUDA device\n", name);              \
            fflush(stdout);                                          \
            return;                                                  \
        }                                                            \
    } while (0)

/* Inside an NCCL test, after NEED_GPU: pass with a SKIP line when the build
 * has no NCCL (CUDA=1 NCCL=0: the peer collectives only). */
#define NEED_NCCL(name)                                                       \
    do {                                                                      \
        if (!built_with_nccl) {                                               \
            printf("SKIP: %s: built without NCCL (NCCL=0)\n", name);          \
            fflush(stdout);                                                   \
            return;                                                           \
        }                                                                     \
    } while (0)

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A standalone device of backend be (rank 0, no world); fails the test
 * with the reason when it cannot start. */
static inline void device_init_ok(fsdp_device *d, fsdp_backend be)
{
    ck_assert_msg(fsdp_device_init(d, be, NULL, 0, 0, 0) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
}

/* ---- a cpu device and a cuda device side by side ---------------------------- */

/* The same ops run on both, for comparison in dtype dt. */
typedef struct pair {
    fsdp_device cpu, gpu;
    fsdp_op_ctx oc, og;
    fsdp_dtype dt;
    uint64_t seed; /* of the values cuda_tens.h's t_new draws; SEED */
} pair;

static inline void pair_init(pair *P, fsdp_dtype dt)
{
    memset(P, 0, sizeof *P);
    P->dt = dt;
    P->seed = SEED;
    device_init_ok(&P->cpu, FSDP_BACKEND_CPU);
    device_init_ok(&P->gpu, FSDP_BACKEND_CUDA);
    ck_assert_msg(fsdp_ops_init(&P->oc, &P->cpu, dt) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_msg(fsdp_ops_init(&P->og, &P->gpu, dt) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
}

static inline void pair_fini(pair *P)
{
    fsdp_ops_fini(&P->og);
    fsdp_ops_fini(&P->oc);
    fsdp_device_fini(&P->gpu);
    fsdp_device_fini(&P->cpu);
}

/* Wait for the GPU and check that no op recorded a failure. */
static inline void gpu_done(pair *P)
{
    ck_assert_msg(fsdp_device_stream_sync(&P->gpu, P->gpu.compute) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
    ck_assert_ptr_nonnull(P->og.iface->sync_error);
    fsdp_status st = P->og.iface->sync_error(&P->og);
    ck_assert_msg(st == FSDP_STATUS_OK, "cuda op failed: %s", fsdp_error_msg());
}

#endif /* FSDP_TESTS_CUDA_TEST_H */
