/*
 * cuda_test.h - what the CUDA suites (test_cuda, test_cuda_ops,
 * test_cuda_comm) share: whether CUDA was built, the GPU check that skips
 * a test cleanly, a clock.
 *
 * Tests that need a GPU look for one inside the forked test, never in
 * main() (CUDA must not be initialised in Check's parent process), and
 * without one print exactly "SKIP: <test>: no CUDA device" and pass
 * (tools/run_tests.sh counts those lines). Builds with CUDA=0 compile the
 * same files: the cuda entry points are then stubs.
 */
#ifndef FSDP_TESTS_CUDA_TEST_H
#define FSDP_TESTS_CUDA_TEST_H

#include <stdio.h>
#include <time.h>

#include "device/device.h"

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

#endif /* FSDP_TESTS_CUDA_TEST_H */
