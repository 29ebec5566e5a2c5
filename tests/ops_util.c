/*
 * ops_util.c - the cpu op suites' shared helpers (ops_util.h).
 */
#include "ops_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "device/cpu.h"

void env_init(env *e, fsdp_dtype dt)
{
    /* inline streams whatever FSDP_CPU_STREAMS says: callers run the cpu
     * table itself on malloc'd buffers and read results at once, which
     * async streams (ops queued on a worker) do not allow; then back to
     * the environment's mode */
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_INLINE, 0);
    fsdp_status st = fsdp_device_init(&e->dev, FSDP_BACKEND_CPU, NULL, 0, 0, 0);
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_DEFAULT, 0);
    ck_assert_int_eq(st, FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ops_init(&e->ctx, &e->dev, dt), FSDP_STATUS_OK);
    ck_assert_ptr_eq(e->ctx.iface, &fsdp_ops_cpu_i);
}

void env_init_threads(env *e, fsdp_dtype dt, int threads)
{
    fsdp_device_cpu_test_cores(64);
    fsdp_device_cpu_set_threads(threads);
    env_init(e, dt);
    ck_assert_int_eq(fsdp_device_cpu_threads(&e->dev), threads);
    fsdp_device_cpu_set_threads(0);
    fsdp_device_cpu_test_cores(0);
}

void env_fini(env *e)
{
    ck_assert_int_eq(e->ctx.iface->sync_error(&e->ctx), FSDP_STATUS_OK);
    fsdp_ops_fini(&e->ctx);
    ck_assert_ptr_null(e->ctx.backend); /* scratch released */
    fsdp_device_fini(&e->dev);
}

float *fbuf(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    ck_assert_ptr_nonnull(p);
    return p;
}

float *fcopy(const float *x, size_t n)
{
    float *p = fbuf(n);
    memcpy(p, x, n * sizeof *p);
    return p;
}

float *frand_stream(size_t n, uint64_t seed, uint64_t stream, float scale)
{
    float *p = fbuf(n);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * (2.0f * fsdp_rng_uniform(seed, stream, i) - 1.0f);
    return p;
}

fsdp_bf16 *to_bf16(float *x, size_t n)
{
    fsdp_bf16 *h = calloc(n ? n : 1, sizeof *h);
    ck_assert_ptr_nonnull(h);
    for (size_t i = 0; i < n; i++) {
        h[i] = fsdp_f32_to_bf16(x[i]);
        x[i] = fsdp_bf16_to_f32(h[i]);
    }
    return h;
}

float *from_bf16(const fsdp_bf16 *h, size_t n)
{
    float *x = fbuf(n);
    for (size_t i = 0; i < n; i++)
        x[i] = fsdp_bf16_to_f32(h[i]);
    return x;
}

double dot_d(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

void fd_check_spread(const char *what, loss_fn loss, void *st, float *x, const float *g,
                     size_t n, int n_checks, float eps, uint64_t spread)
{
    for (int k = 0; k < n_checks; k++) {
        size_t i = k == 0 ? 0 : k == 1 ? n - 1 : (size_t)(((uint64_t)k * 2654435761u + spread) % n);
        float x0 = x[i], xp = x0 + eps, xm = x0 - eps;
        x[i] = xp;
        double lp = loss(st);
        x[i] = xm;
        double lm = loss(st);
        x[i] = x0;
        double num = (lp - lm) / ((double)xp - (double)xm), ana = g[i];
        double err = fabs(num - ana) / fmax(fmax(fabs(num), fabs(ana)), 0.02);
        ck_assert_msg(err < 1e-2, "%s[%zu]: analytic %.7g, finite difference %.7g (rel err %.3g)",
                      what, i, ana, num, err);
    }
}
