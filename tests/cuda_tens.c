/*
 * cuda_tens.c - tensors on both devices of a cpu/cuda pair and the
 * cuda-vs-cpu checks (cuda_tens.h). Linked into every suite; only the
 * cuda op suites call it, and only with a GPU present.
 */
#include "cuda_tens.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "core/rng.h"

static size_t t_bytes(const tens *t) { return t->n * fsdp_dtype_size(t->dt); }

void t_upload(pair *P, tens *t)
{
    if (t->dt == FSDP_DTYPE_BF16)
        for (size_t i = 0; i < t->n; i++)
            ((fsdp_bf16 *)t->c)[i] = fsdp_f32_to_bf16(t->init[i]);
    else
        memcpy(t->c, t->init, t->n * sizeof(float));
    if (t->poison) /* all-ones bytes: NaN in fp32 and in bf16 */
        ck_assert_int_eq(fsdp_device_memset(&P->gpu, t->g, 0xFF, t_bytes(t), NULL),
                         FSDP_STATUS_OK);
    else
        ck_assert_int_eq(fsdp_device_memcpy(&P->gpu, t->g, t->c, t_bytes(t), NULL),
                         FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&P->gpu, P->gpu.compute), FSDP_STATUS_OK);
}

/* Allocates t (n, dt set) on both devices with init zeroed. */
static void t_alloc(pair *P, tens *t)
{
    t->init = calloc(t->n ? t->n : 1, sizeof(float));
    ck_assert_ptr_nonnull(t->init);
    ck_assert_int_eq(fsdp_device_alloc(&P->cpu, t_bytes(t), FSDP_MEM_OTHER, "test", &t->c),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(&P->gpu, t_bytes(t), FSDP_MEM_OTHER, "test", &t->g),
                     FSDP_STATUS_OK);
}

tens t_new(pair *P, size_t n, fsdp_dtype dt, float std, uint64_t stream)
{
    tens t = {.n = n, .dt = dt};
    t_alloc(P, &t);
    for (size_t i = 0; std != 0.0f && i < n; i++) {
        float v = std * fsdp_rng_normal(P->seed, stream, i);
        t.init[i] = dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(fsdp_f32_to_bf16(v)) : v;
    }
    t_upload(P, &t);
    return t;
}

tens t_out(pair *P, size_t n, fsdp_dtype dt)
{
    tens t = {.n = n, .dt = dt, .poison = 1};
    t_alloc(P, &t);
    memset(t.init, 0xFF, n * sizeof(float));
    t_upload(P, &t);
    return t;
}

tens t_ints(pair *P, const int *v, size_t n)
{
    tens t = {.n = n, .dt = FSDP_DTYPE_F32};
    t_alloc(P, &t);
    memcpy(t.init, v, n * sizeof(int));
    t_upload(P, &t);
    return t;
}

float *t_get(pair *P, const tens *t, int gpu)
{
    void *raw = malloc(t_bytes(t) + 4);
    float *out = malloc(t->n * sizeof(float) + 4);
    ck_assert(raw && out);
    if (gpu) {
        ck_assert_int_eq(fsdp_device_memcpy(&P->gpu, raw, t->g, t_bytes(t), NULL),
                         FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_stream_sync(&P->gpu, P->gpu.compute), FSDP_STATUS_OK);
    } else {
        memcpy(raw, t->c, t_bytes(t));
    }
    if (t->dt == FSDP_DTYPE_BF16)
        for (size_t i = 0; i < t->n; i++)
            out[i] = fsdp_bf16_to_f32(((fsdp_bf16 *)raw)[i]);
    else
        memcpy(out, raw, t_bytes(t));
    free(raw);
    return out;
}

void t_free(pair *P, tens *t)
{
    fsdp_device_free(&P->cpu, t->c);
    fsdp_device_free(&P->gpu, t->g);
    free(t->init);
    t->c = t->g = NULL;
    t->init = NULL;
}

void t_free_n(pair *P, tens *const *all, size_t n)
{
    for (size_t i = 0; i < n; i++)
        t_free(P, all[i]);
}

void expect_close(const char *what, const float *got, const float *want, size_t n, double rtol)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs((double)want[i]));
    size_t bad = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        double tol = rtol * (fabs((double)want[i]) + mx) + 1e-30;
        if (!(err <= tol)) {
            if (!bad++)
                first = i;
        }
        if (err / (fabs((double)want[i]) + mx + 1e-30) > worst)
            worst = err / (fabs((double)want[i]) + mx + 1e-30);
    }
    ck_assert_msg(bad == 0,
                  "%s: %zu of %zu elements differ beyond rtol %g (first [%zu]: cuda %.9g vs cpu "
                  "%.9g; worst relative %.3g)",
                  what, bad, n, rtol, first, got[first], want[first], worst);
}

void expect_pair(pair *P, const char *what, const tens *t, double rtol, float **gpu_copy)
{
    char label[160];
    snprintf(label, sizeof label, "%s (%s)", what, fsdp_dtype_name(P->dt));
    float *c = t_get(P, t, 0), *g = t_get(P, t, 1);
    expect_close(label, g, c, t->n, rtol);
    if (gpu_copy)
        *gpu_copy = g;
    else
        free(g);
    free(c);
}

void expect_same_bits(pair *P, const char *what, const tens *t, float *prev)
{
    float *g = t_get(P, t, 1);
    ck_assert_msg(memcmp(g, prev, t->n * sizeof(float)) == 0,
                  "%s: running the same cuda op twice gave different bits", what);
    free(g);
    free(prev);
}

void expect_bits_equal(pair *P, const char *what, const tens *t)
{
    float *c = t_get(P, t, 0), *g = t_get(P, t, 1);
    for (size_t i = 0; i < t->n; i++)
        ck_assert_msg(memcmp(&c[i], &g[i], 4) == 0, "%s[%zu]: cuda %.9g vs cpu %.9g", what, i,
                      g[i], c[i]);
    free(c);
    free(g);
}

void expect_sync_error(pair *P, const char *needle, const char *needle2)
{
    ck_assert_int_eq(fsdp_device_stream_sync(&P->gpu, P->gpu.compute), FSDP_STATUS_OK);
    ck_assert_int_eq(P->og.iface->sync_error(&P->og), FSDP_STATUS_INVALID_ARG);
    ck_assert_msg(strstr(fsdp_error_msg(), needle) != NULL, "sync_error said: %s",
                  fsdp_error_msg());
    ck_assert_msg(!needle2 || strstr(fsdp_error_msg(), needle2) != NULL, "sync_error said: %s",
                  fsdp_error_msg());
    ck_assert_int_eq(P->og.iface->sync_error(&P->og), FSDP_STATUS_OK);
}

void t_compare(pair *P, t_run_fn run, const void *arg, const t_check *chk, size_t n,
               float **keep)
{
    run(&P->oc, 0, arg);
    run(&P->og, 1, arg);
    gpu_done(P);
    for (size_t k = 0; k < n; k++)
        expect_pair(P, chk[k].what, chk[k].t, chk[k].rtol, keep ? &keep[k] : NULL);
}

void t_rerun_same_bits(pair *P, t_run_fn run, const void *arg, const t_check *chk, size_t n,
                       float **keep)
{
    for (size_t k = 0; k < n; k++)
        t_upload(P, chk[k].t);
    run(&P->og, 1, arg);
    gpu_done(P);
    for (size_t k = 0; k < n; k++)
        expect_same_bits(P, chk[k].what, chk[k].t, keep[k]);
}

void t_check_op(pair *P, t_run_fn run, const void *arg, const t_check *chk, size_t n)
{
    float **keep = malloc(n * sizeof *keep);
    ck_assert_ptr_nonnull(keep);
    t_compare(P, run, arg, chk, n, keep);
    t_rerun_same_bits(P, run, arg, chk, n, keep);
    free(keep);
}
