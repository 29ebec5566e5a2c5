/*
 * ops_util.h - what the cpu op suites (test_ops, test_ops_llama, test_cpu)
 * share: a standalone cpu device with an op context, host buffers of
 * seeded values, bf16 rounding, and the finite-difference gradient check.
 *
 * Linked into every suite (TEST_COMMON in the Makefile). Every helper
 * aborts the running Check test on failure: call them from the forked
 * test, never from rank threads.
 */
#ifndef FSDP_TESTS_OPS_UTIL_H
#define FSDP_TESTS_OPS_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "core/bf16.h"
#include "device/device.h"
#include "ops/ops.h"

/* A cpu device and an op context on it. */
typedef struct env {
    fsdp_device dev;
    fsdp_op_ctx ctx;
} env;

/* The device with the build's default threads and an op context in dt,
 * which must be the cpu op table: the device has inline streams also where
 * FSDP_CPU_STREAMS=async (the rest of a suite runs on async streams). */
void env_init(env *e, fsdp_dtype dt);
/* The same with `threads` threads per device, granted on any machine (the
 * core count is faked while the device opens). */
void env_init_threads(env *e, fsdp_dtype dt, int threads);
/* No op failed (sync_error is OK); the context's scratch is released, the
 * device closed. */
void env_fini(env *e);

/* n zeroed floats (malloc'd; at least one). */
float *fbuf(size_t n);
/* A malloc'd copy of x (n). */
float *fcopy(const float *x, size_t n);
/* n values uniform in [-scale, scale) from (seed, stream): reproducible
 * test data (each suite draws from its own stream). */
float *frand_stream(size_t n, uint64_t seed, uint64_t stream, float scale);
/* Rounds x (n) to bf16 in place, so bf16 and fp32 runs see the same values;
 * returns the bf16 copy (malloc'd). */
fsdp_bf16 *to_bf16(float *x, size_t n);
/* h (n) as fp32 (malloc'd). */
float *from_bf16(const fsdp_bf16 *h, size_t n);
/* sum a[i] * b[i] in double. */
double dot_d(const float *a, const float *b, size_t n);

/* Finite differences. A loss function recomputes the forward from the
 * current inputs and returns L = sum(out * R) in double. */
typedef double (*loss_fn)(void *st);

/* g = dL/dx checked by central differences with step eps at n_checks
 * coordinates of x (n): the first, the last, and (k * 2654435761 + spread)
 * % n for the rest; |num - ana| / max(|num|, |ana|, 0.02) < 1e-2. x is
 * restored. */
void fd_check_spread(const char *what, loss_fn loss, void *st, float *x, const float *g,
                     size_t n, int n_checks, float eps, uint64_t spread);

#endif /* FSDP_TESTS_OPS_UTIL_H */
