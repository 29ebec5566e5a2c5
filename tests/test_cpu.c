/*
 * test_cpu.c - the cpu backend's speed machinery: which GEMM kernel is
 * loaded (chosen from CPU features, never from model numbers), the thread
 * team of a device, tiled GEMMs against double references, bf16 products,
 * and every op giving the same bits on 1, 2 and 3 threads per device, and
 * the softmax row kernels (vsoftmax.h: the attention's and the
 * cross-entropy's) giving the same bits compiled for the baseline and AVX2.
 *
 * Thread counts above the machine's cores are reached through the test
 * hook fsdp_device_cpu_test_cores (the real cap would lower them). The
 * loader's paths that depend on the environment (a fallback core, a pin, a
 * bad setting) run in a child: this executable with --describe-gemm.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/bf16.h"
#include "core/rng.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vsoftmax.h"
#include "ops/ops.h"
#include "ops_util.h"
#include "testutil.h"

/* ---- helpers --------------------------------------------------------------- */

/* This suite's test data: uniform in [-scale, scale), keyed by seed. */
static float *frand(size_t n, uint64_t seed, float scale)
{
    return frand_stream(n, seed, 3, scale);
}

/* Output of this executable run as `env_prefix <self> --describe-gemm`. */
static void run_capture(const char *env_prefix, char *out, size_t cap)
{
    char self[4096], cmd[4200];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(len, 0);
    self[len] = '\0';
    snprintf(cmd, sizeof cmd, "%s '%s' --describe-gemm 2>/dev/null", env_prefix, self);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    pclose(p);
}

/* ---- which kernel ------------------------------------------------------------ */

START_TEST(test_openblas_override_from_features)
{
    /* a fallback core is replaced by the core the CPU's level calls for */
    ck_assert_str_eq(fsdp_cpu_openblas_override("Prescott", FSDP_CPU_GEMM_ISA_AVX512_BF16),
                     "Cooperlake");
    ck_assert_str_eq(fsdp_cpu_openblas_override("prescott", FSDP_CPU_GEMM_ISA_AVX512),
                     "SkylakeX");
    ck_assert_str_eq(fsdp_cpu_openblas_override("Nehalem", FSDP_CPU_GEMM_ISA_AVX2), "Haswell");
    ck_assert_str_eq(fsdp_cpu_openblas_override("Sandybridge", FSDP_CPU_GEMM_ISA_AVX2),
                     "Haswell");
    ck_assert_str_eq(fsdp_cpu_openblas_override("Haswell", FSDP_CPU_GEMM_ISA_AVX512), "SkylakeX");
    ck_assert_str_eq(fsdp_cpu_openblas_override("Core2", FSDP_CPU_GEMM_ISA_AVX), "Sandybridge");
    /* OpenBLAS's own pick stays when it is as wide as the CPU allows */
    ck_assert_ptr_null(fsdp_cpu_openblas_override("Cooperlake", FSDP_CPU_GEMM_ISA_AVX512_BF16));
    ck_assert_ptr_null(fsdp_cpu_openblas_override("SkylakeX", FSDP_CPU_GEMM_ISA_AVX512));
    ck_assert_ptr_null(fsdp_cpu_openblas_override("Zen", FSDP_CPU_GEMM_ISA_AVX2));
    ck_assert_ptr_null(fsdp_cpu_openblas_override("SapphireRapids",
                                                  FSDP_CPU_GEMM_ISA_AVX512_BF16));
    /* a core this table does not know (a newer OpenBLAS's) is trusted */
    ck_assert_ptr_null(fsdp_cpu_openblas_override("Zen5", FSDP_CPU_GEMM_ISA_AVX512));
    /* an SSE-only CPU: nothing to gain */
    ck_assert_ptr_null(fsdp_cpu_openblas_override("Prescott", FSDP_CPU_GEMM_ISA_SSE));
    ck_assert_int_eq(fsdp_cpu_openblas_core_isa("COOPERLAKE"), FSDP_CPU_GEMM_ISA_AVX512_BF16);
    ck_assert_int_eq(fsdp_cpu_openblas_core_isa("Opteron_SSE3"), FSDP_CPU_GEMM_ISA_SSE);
    ck_assert_int_eq(fsdp_cpu_openblas_core_isa(NULL), FSDP_CPU_GEMM_ISA_UNKNOWN);
}
END_TEST

START_TEST(test_loaded_kernel_is_the_cpus_widest)
{
    ck_assert_int_eq(fsdp_cpu_blas_status(), FSDP_STATUS_OK);
    const char *core = fsdp_cpu_blas_core();
    fsdp_cpu_gemm_isa have = fsdp_cpu_openblas_core_isa(core);
    ck_assert_msg(have == FSDP_CPU_GEMM_ISA_UNKNOWN || have >= fsdp_cpu_gemm_isa_of_cpu() ||
                      getenv("FSDP_CPU_GEMM"),
                  "OpenBLAS runs %s on a CPU of level %d", core, (int)fsdp_cpu_gemm_isa_of_cpu());
    ck_assert_ptr_nonnull(strstr(fsdp_cpu_blas_describe(), core));
    ck_assert_ptr_nonnull(strstr(fsdp_cpu_blas_describe(), "bf16: "));
    if (fsdp_cpu_blas_bf16_dot())
        ck_assert_ptr_nonnull(strstr(fsdp_cpu_blas_describe(), "oneDNN"));
}
END_TEST

START_TEST(test_fallback_core_is_replaced)
{
    /* OPENBLAS_CORETYPE=Prescott makes OpenBLAS load the fallback it takes on
     * CPUs it does not know; the loader must replace it */
    fsdp_cpu_gemm_isa cpu = fsdp_cpu_gemm_isa_of_cpu();
    if (cpu <= FSDP_CPU_GEMM_ISA_SSE)
        return; /* nothing wider to choose on this CPU */
    char out[2048];
    run_capture("env -u FSDP_CPU_GEMM OPENBLAS_CORETYPE=Prescott", out, sizeof out);
    static const char *const want[] = {NULL, "Sandybridge", "Haswell", "SkylakeX", "Cooperlake"};
    char core[64];
    snprintf(core, sizeof core, "core %s\n", want[cpu]);
    ck_assert_msg(strstr(out, core), "expected %s in:\n%s", core, out);
    ck_assert_msg(strstr(out, "OPENBLAS_CORETYPE asked for Prescott"), "%s", out);
    ck_assert_msg(strstr(out, "status OK"), "%s", out);
    ck_assert_msg(strstr(out, "coretype_env Prescott\n"), "the user's value is restored: %s", out);
}
END_TEST

START_TEST(test_pin_and_bad_setting)
{
    char out[2048];
    if (fsdp_cpu_gemm_isa_of_cpu() >= FSDP_CPU_GEMM_ISA_AVX2) {
        run_capture("env -u OPENBLAS_CORETYPE FSDP_CPU_GEMM=openblas:Haswell", out, sizeof out);
        ck_assert_msg(strstr(out, "core Haswell\n"), "%s", out);
        ck_assert_msg(strstr(out, "pinned by FSDP_CPU_GEMM"), "%s", out);
        ck_assert_msg(strstr(out, "bf16: widened to fp32"), "%s", out);
        ck_assert_msg(strstr(out, "bf16_dot 0"), "%s", out);
        ck_assert_msg(strstr(out, "coretype_env -\n"), "left unset: %s", out);
    }
    run_capture("FSDP_CPU_GEMM=openblas:NoSuchCore", out, sizeof out);
    ck_assert_msg(strstr(out, "pins OpenBLAS core 'NoSuchCore'"), "%s", out);
    run_capture("FSDP_CPU_GEMM=fastest", out, sizeof out);
    ck_assert_msg(strstr(out, "status INVALID_ARG"), "%s", out);
    ck_assert_msg(strstr(out, "FSDP_CPU_GEMM='fastest' is not auto, openblas or openblas:CORE"),
                  "%s", out);
    ck_assert_msg(strstr(out, "op_status INVALID_ARG"), "ops report it: %s", out);
    /* oneDNN capped below bf16 dot products: bf16 GEMMs widen to fp32 */
    if (fsdp_cpu_blas_bf16_dot()) {
        run_capture("DNNL_MAX_CPU_ISA=AVX2", out, sizeof out);
        ck_assert_msg(strstr(out, "bf16_dot 0"), "%s", out);
        ck_assert_msg(strstr(out, "no bf16 dot-product instructions"), "%s", out);
    }
}
END_TEST

/* ---- threads ---------------------------------------------------------------- */

START_TEST(test_threads_for)
{
    bool capped;
    ck_assert_int_eq(fsdp_device_cpu_threads_for(0, 1, 16, &capped), 16);
    ck_assert(!capped);
    ck_assert_int_eq(fsdp_device_cpu_threads_for(0, 4, 16, &capped), 4);
    ck_assert_int_eq(fsdp_device_cpu_threads_for(0, 3, 16, &capped), 5);
    ck_assert_int_eq(fsdp_device_cpu_threads_for(0, 8, 2, &capped), 1); /* more devices than cores */
    ck_assert(!capped);
    ck_assert_int_eq(fsdp_device_cpu_threads_for(2, 4, 16, &capped), 2);
    ck_assert(!capped);
    ck_assert_int_eq(fsdp_device_cpu_threads_for(8, 4, 16, &capped), 4); /* 4 x 8 > 16 */
    ck_assert(capped);
    ck_assert_int_eq(fsdp_device_cpu_threads_for(3, 2, 2, &capped), 1);
    ck_assert(capped);
    ck_assert_int_eq(fsdp_device_cpu_threads_for(1, 8, 2, &capped), 1);
    ck_assert(!capped);
    ck_assert_int_ge(fsdp_device_cpu_cores(), 1);
}
END_TEST

typedef struct count_job {
    atomic_int *hits;
    atomic_int bad_worker;
    atomic_int nested;
    int n_threads;
    fsdp_device *dev;
} count_job;

static void inner_task(void *arg, size_t chunk, int worker)
{
    count_job *j = arg;
    if (worker != 0) /* nested calls run inline, as worker 0 */
        atomic_fetch_add(&j->bad_worker, 1);
    atomic_fetch_add(&j->nested, 1);
}

static void count_task(void *arg, size_t chunk, int worker)
{
    count_job *j = arg;
    atomic_fetch_add(&j->hits[chunk], 1);
    if (worker < 0 || worker >= j->n_threads)
        atomic_fetch_add(&j->bad_worker, 1);
    if (chunk % 100 == 0)
        fsdp_device_cpu_parallel(j->dev, 3, inner_task, j);
}

START_TEST(test_team_runs_every_chunk_once)
{
    env e;
    env_init_threads(&e, FSDP_DTYPE_F32, 3);
    enum { N = 1000 };
    atomic_int *hits = calloc(N, sizeof *hits);
    ck_assert_ptr_nonnull(hits);
    for (int rep = 0; rep < 20; rep++) {
        count_job j = {.hits = hits, .n_threads = 3, .dev = &e.dev};
        fsdp_device_cpu_parallel(&e.dev, N, count_task, &j);
        int c = 0;
        while (c < N && atomic_load(&hits[c]) == rep + 1)
            c++;
        ck_assert_msg(c == N, "chunk %d ran %d times in round %d", c, c < N ? hits[c] : 0, rep);
        ck_assert_int_eq(atomic_load(&j.bad_worker), 0);
        ck_assert_int_eq(atomic_load(&j.nested), 3 * (N / 100));
    }
    free(hits);
    env_fini(&e);
}
END_TEST

/* ---- GEMMs ------------------------------------------------------------------ */

START_TEST(test_gemm_tiles)
{
    bool along_m;
    int tile, n;
    /* small products: one tile */
    fsdp_cpu_gemm_tiles(64, 64, 64, NULL, &along_m, &tile, &n);
    ck_assert_int_eq(n, 1);
    fsdp_cpu_gemm_tiles(200, 4000, 2, NULL, &along_m, &tile, &n);
    ck_assert_int_eq(n, 1);
    /* under two tiles' width: one */
    int floor = 2 * FSDP_CPU_GEMM_TILING.min_tile;
    fsdp_cpu_gemm_tiles(floor - 1, 300, 4096, NULL, &along_m, &tile, &n);
    ck_assert_int_eq(n, 1);
    fsdp_cpu_gemm_tiles(floor, 300, 4096, NULL, &along_m, &tile, &n);
    ck_assert_int_eq(n, 2);
    /* another rule (bench_gemm --tiles): the old 128 / 32 splits a 768 wide product in 6 */
    const fsdp_cpu_gemm_tiling old = {.min_tile = 128, .max_tiles = 32};
    fsdp_cpu_gemm_tiles(512, 768, 768, &old, &along_m, &tile, &n);
    ck_assert(!along_m);
    ck_assert_int_eq(tile, 128);
    ck_assert_int_eq(n, 6);
    static const int shapes[][3] = {{512, 768, 768},  {512, 2304, 768}, {3072, 768, 512},
                                    {50304, 768, 256}, {1024, 300, 100}, {600, 520, 70}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        fsdp_cpu_gemm_tiles(M, N, K, NULL, &along_m, &tile, &n);
        int L = along_m ? M : N;
        ck_assert(along_m == (M >= N)); /* the larger output dimension, never K */
        ck_assert_int_eq(tile % 64, 0);
        ck_assert_int_ge(tile, FSDP_CPU_GEMM_TILING.min_tile);
        ck_assert_int_le(n, FSDP_CPU_GEMM_TILING.max_tiles);
        ck_assert_int_ge((long)n * tile, L);     /* covers */
        ck_assert_int_lt((long)(n - 1) * tile, L); /* no empty tile */
        ck_assert_int_ge(n, 2);
    }
}
END_TEST

/* C = alpha op(A) op(B) + beta C0 in double. */
static void gemm_ref(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, const float *C0, int ldc, double *out)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                s += a * b;
            }
            out[(size_t)i * N + j] = alpha * s + beta * (double)C0[(size_t)i * ldc + j];
        }
}

/* Tiled along M (600 x 520) and along N (520 x 600), padded leading dims;
 * alpha 1 runs in oneDNN where blas.h sends fp32 products there, 0.5 in
 * OpenBLAS everywhere. */
START_TEST(test_gemm_tiled_matches_double)
{
    env e;
    env_init_threads(&e, FSDP_DTYPE_F32, 3);
    static const int shapes[][3] = {{600, 520, 24}, {520, 600, 24}, {20, 30, 7}};
    for (size_t s = 0; s < 3; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int t = 0; t < 16; t++) {
            bool ta = t & 1, tb = t & 2;
            float beta = (t & 4) ? 1.0f : 0.0f, alpha = (t & 8) ? 1.0f : 0.5f;
            int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
            float *A = frand((size_t)(ta ? K : M) * lda, 10 + t, 1.0f);
            float *B = frand((size_t)(tb ? N : K) * ldb, 20 + t, 1.0f);
            float *C = frand((size_t)M * ldc, 30 + t, 1.0f);
            double *want = malloc((size_t)M * N * sizeof *want);
            gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, want);
            fsdp_cpu_gemm(&e.ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            ck_assert_int_eq(e.ctx.iface->sync_error(&e.ctx), FSDP_STATUS_OK);
            int bad = -1;
            for (int i = 0; i < M * N && bad < 0; i++) {
                double w = want[i], g = C[(size_t)(i / N) * ldc + i % N];
                if (!(fabs(g - w) <= 1e-5 * (fabs(w) + K)))
                    bad = i;
            }
            ck_assert_msg(bad < 0, "shape %zu ta %d tb %d alpha %g beta %g: C[%d,%d] %g want %g",
                          s, ta, tb, alpha, beta, bad / N, bad % N,
                          C[(size_t)(bad / N) * ldc + bad % N], want[bad < 0 ? 0 : bad]);
            free(A), free(B), free(C), free(want);
        }
    }
    env_fini(&e);
}
END_TEST

/* One device's first GEMMs, started with another device's at once. */
typedef struct {
    env e;
    pthread_barrier_t *start;
    const float *A, *B;
    float *C;
} first_gemm;

static void *first_gemm_main(void *arg)
{
    first_gemm *g = arg;
    pthread_barrier_wait(g->start);
    for (int rep = 0; rep < 2; rep++)
        fsdp_cpu_gemm(&g->e.ctx, false, true, 96, 80, 64, 1.0f, g->A, 64, g->B, 64, 0.0f, g->C,
                      80);
    return NULL;
}

/* Two devices' threads run the process's first GEMMs side by side, with no
 * synchronisation between them after the start; each product is checked
 * against double. The state oneDNN sets up on its first execution (its ITT
 * task hooks: a mutex published through an atomic and a static guard's
 * inline check, which ThreadSanitizer cannot see) must be made by the
 * probe, under its mutex: else make tsan can report a race here when one
 * thread's first hook call lands between the other's two (narrow: CI hit
 * it once, in test_faults). */
START_TEST(test_first_gemms_of_two_devices_at_once)
{
    enum { M = 96, N = 80, K = 64 };
    float *A = frand((size_t)M * K, 41, 1.0f), *B = frand((size_t)N * K, 42, 1.0f);
    float *C0 = fbuf((size_t)M * N);
    double *want = malloc((size_t)M * N * sizeof *want);
    ck_assert_ptr_nonnull(want);
    gemm_ref(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C0, N, want);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    first_gemm g[2];
    pthread_t th[2];
    for (int d = 0; d < 2; d++) {
        g[d] = (first_gemm){.start = &start, .A = A, .B = B, .C = fbuf((size_t)M * N)};
        env_init_threads(&g[d].e, FSDP_DTYPE_F32, 1);
    }
    for (int d = 0; d < 2; d++)
        ck_assert_int_eq(pthread_create(&th[d], NULL, first_gemm_main, &g[d]), 0);
    for (int d = 0; d < 2; d++)
        pthread_join(th[d], NULL);
    for (int d = 0; d < 2; d++) {
        ck_assert_int_eq(g[d].e.ctx.iface->sync_error(&g[d].e.ctx), FSDP_STATUS_OK);
        for (int i = 0; i < M * N; i++)
            ck_assert_msg(fabs(g[d].C[i] - want[i]) <= 1e-5 * (fabs(want[i]) + K),
                          "device %d: C[%d] %g want %g", d, i, g[d].C[i], want[i]);
        env_fini(&g[d].e);
        free(g[d].C);
    }
    pthread_barrier_destroy(&start);
    free(A), free(B), free(C0), free(want);
}
END_TEST

/* bf16 matmul with bf16-representable inputs and output gradient: every
 * product is exact in fp32, so fwd (before rounding to bf16) and bwd match
 * the double reference to fp32 accumulation error, on either path (bf16 dot
 * products or widening). Tiled shapes, so tiles and tails are covered. */
START_TEST(test_matmul_bf16_products_match_double)
{
    env e;
    env_init_threads(&e, FSDP_DTYPE_BF16, 2);
    const int N = 600, C = 70, OC = 520;
    float *x = frand((size_t)N * C, 40, 1.0f), *w = frand((size_t)OC * C, 41, 0.5f);
    float *dout = frand((size_t)N * OC, 42, 1.0f);
    fsdp_bf16 *x16 = to_bf16(x, (size_t)N * C), *w16 = to_bf16(w, (size_t)OC * C);
    fsdp_bf16 *d16 = to_bf16(dout, (size_t)N * OC);
    fsdp_bf16 *out16 = calloc((size_t)N * OC, sizeof *out16);
    float *dinp = frand((size_t)N * C, 43, 1.0f), *dw = frand((size_t)OC * C, 44, 1.0f);
    double *want = malloc((size_t)N * OC * sizeof *want);
    double *want_dinp = malloc((size_t)N * C * sizeof *want_dinp);
    double *want_dw = malloc((size_t)OC * C * sizeof *want_dw);
    gemm_ref(false, true, N, OC, C, 1.0f, x, C, w, C, 0.0f, dinp, 0, want);
    gemm_ref(false, false, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C, want_dinp);
    gemm_ref(true, false, OC, C, N, 1.0f, dout, OC, x, C, 1.0f, dw, C, want_dw);

    FSDP_OP(&e.ctx, matmul_fwd, out16, x16, w16, NULL, N, C, OC);
    FSDP_OP(&e.ctx, matmul_bwd, dinp, dw, NULL, dout, x16, w16, N, C, OC);
    /* (one assertion per array: Check logs every passing one) */
    size_t i = 0;
    /* the fp32 result is rounded to bf16 once: within half a bf16 ulp */
    while (i < (size_t)N * OC && fabs(fsdp_bf16_to_f32(out16[i]) - want[i]) <=
                                     fabs(want[i]) * (1.0 / 256) + 1e-5 * C)
        i++;
    ck_assert_msg(i == (size_t)N * OC, "out[%zu] %g want %g", i,
                  fsdp_bf16_to_f32(out16[i % ((size_t)N * OC)]), want[i % ((size_t)N * OC)]);
    for (i = 0; i < (size_t)N * C && fabs(dinp[i] - want_dinp[i]) <=
                                         1e-5 * (fabs(want_dinp[i]) + OC); i++)
        ;
    ck_assert_msg(i == (size_t)N * C, "dinp[%zu] %g want %g", i, dinp[i % ((size_t)N * C)],
                  want_dinp[i % ((size_t)N * C)]);
    for (i = 0; i < (size_t)OC * C && fabs(dw[i] - want_dw[i]) <= 1e-5 * (fabs(want_dw[i]) + N);
         i++)
        ;
    ck_assert_msg(i == (size_t)OC * C, "dw[%zu] %g want %g", i, dw[i % ((size_t)OC * C)],
                  want_dw[i % ((size_t)OC * C)]);
    free(x), free(w), free(dout), free(x16), free(w16), free(d16), free(out16);
    free(dinp), free(dw), free(want), free(want_dinp), free(want_dw);
    env_fini(&e);
}
END_TEST

/* ---- every op, any thread count ---------------------------------------------- */

/* Shapes big enough that every op splits into several chunks: rows x C
 * above FSDP_CPU_GRAIN, columns above 64, GEMMs above the tiling floor. */
enum { TB = 4, TT = 160, TC = 132, TNH = 4, TV = 300, TVP = 320 };
#define TN (TB * TT)

typedef struct all_inputs {
    float *x, *w_qkv, *b_qkv, *ln_w, *ln_b, *wte, *wpe, *dy_c, *dy_3c, *logits, *big;
    int *tok, *tgt;
} all_inputs;

static void inputs_make(all_inputs *in)
{
    in->x = frand((size_t)TN * TC, 50, 1.0f);
    in->w_qkv = frand((size_t)3 * TC * TC, 51, 0.2f);
    in->b_qkv = frand((size_t)3 * TC, 52, 0.2f);
    in->ln_w = frand(TC, 53, 1.0f);
    in->ln_b = frand(TC, 54, 1.0f);
    in->wte = frand((size_t)TVP * TC, 55, 0.5f);
    in->wpe = frand((size_t)TT * TC, 56, 0.5f);
    in->dy_c = frand((size_t)TN * TC, 57, 1.0f);
    in->dy_3c = frand((size_t)TN * 3 * TC, 58, 1.0f);
    in->logits = frand((size_t)TN * TVP, 59, 3.0f);
    in->big = frand((size_t)TN * 3 * TC, 60, 2.0f);
    in->tok = malloc(TN * sizeof(int));
    in->tgt = malloc(TN * sizeof(int));
    for (int i = 0; i < TN; i++) {
        in->tok[i] = (i * 7 + i / 3) % TV; /* repeats, for the embedding backward */
        in->tgt[i] = i % 11 == 3 ? -1 : (i * 13 + 5) % TV; /* some rows masked */
    }
}

static void inputs_free(all_inputs *in)
{
    free(in->x), free(in->w_qkv), free(in->b_qkv), free(in->ln_w), free(in->ln_b);
    free(in->wte), free(in->wpe), free(in->dy_c), free(in->dy_3c), free(in->logits);
    free(in->big), free(in->tok), free(in->tgt);
}

/* The inputs in dtype dt (a copy; bf16: rounded). */
static void *as_dt(const float *x, size_t n, fsdp_dtype dt)
{
    void *p = malloc(n * fsdp_dtype_size(dt) + 4);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        fsdp_cpu_st(p, dt, i, x[i]);
    return p;
}

/* Bytes appended to a growing blob. */
typedef struct blob {
    unsigned char *p;
    size_t n, cap;
} blob;

static void blob_add(blob *b, const void *src, size_t bytes)
{
    if (b->n + bytes > b->cap) {
        b->cap = (b->n + bytes) * 2;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
    memcpy(b->p + b->n, src, bytes);
    b->n += bytes;
}

/* Run every op once on `threads` threads and return all outputs, in order. */
static blob run_all_ops(const all_inputs *in, fsdp_dtype dt, int threads)
{
    env e;
    env_init_threads(&e, dt, threads);
    fsdp_op_ctx *c = &e.ctx;
    const size_t es = fsdp_dtype_size(dt), nc = (size_t)TN * TC, n3 = nc * 3;
    const size_t natt = (size_t)TB * TNH * TT * TT;
    void *x = as_dt(in->x, nc, dt), *wq = as_dt(in->w_qkv, (size_t)3 * TC * TC, dt);
    void *bq = as_dt(in->b_qkv, (size_t)3 * TC, dt), *lw = as_dt(in->ln_w, TC, dt);
    void *lb = as_dt(in->ln_b, TC, dt), *wte = as_dt(in->wte, (size_t)TVP * TC, dt);
    void *wpe = as_dt(in->wpe, (size_t)TT * TC, dt), *logits = as_dt(in->logits, (size_t)TN * TVP, dt);
    void *big = as_dt(in->big, n3, dt);
    void *o_c = calloc(nc, es), *o_3c = calloc(n3, es), *att = calloc(natt, es);
    float *mean = calloc(TN, 4), *rstd = calloc(TN, 4), *g_c = calloc(nc, 4);
    float *g_3c = calloc(n3, 4), *g_w = calloc((size_t)3 * TC * TC, 4), *g_b = calloc(3 * TC, 4);
    float *g_lw = calloc(TC, 4), *g_lb = calloc(TC, 4), *g_wte = calloc((size_t)TVP * TC, 4);
    float *g_wpe = calloc((size_t)TT * TC, 4), *datt = calloc(natt, 4);
    float *losses = calloc(TN, 4), *dlogits = calloc((size_t)TN * TVP, 4);
    float *sums = calloc(n3 / FSDP_NORM_BLOCK + 1, 4), *f32 = calloc(n3, 4);
    blob b = {0};

    FSDP_OP(c, embed_fwd, o_c, in->tok, NULL, wte, wpe, TB, TT, TC);
    blob_add(&b, o_c, nc * es);
    FSDP_OP(c, embed_bwd, g_wte, g_wpe, in->dy_c, in->tok, NULL, TB, TT, TC);
    blob_add(&b, g_wte, (size_t)TVP * TC * 4);
    blob_add(&b, g_wpe, (size_t)TT * TC * 4);
    FSDP_OP(c, layernorm_fwd, o_c, mean, rstd, x, lw, lb, TN, TC);
    blob_add(&b, o_c, nc * es);
    blob_add(&b, mean, TN * 4);
    blob_add(&b, rstd, TN * 4);
    FSDP_OP(c, layernorm_bwd, g_c, g_lw, g_lb, in->dy_c, x, lw, mean, rstd, TN, TC);
    blob_add(&b, g_c, nc * 4);
    blob_add(&b, g_lw, TC * 4);
    blob_add(&b, g_lb, TC * 4);
    FSDP_OP(c, matmul_fwd, o_3c, x, wq, bq, TN, TC, 3 * TC);
    blob_add(&b, o_3c, n3 * es);
    FSDP_OP(c, matmul_bwd, g_c, g_w, g_b, in->dy_3c, x, wq, TN, TC, 3 * TC);
    blob_add(&b, g_c, nc * 4);
    blob_add(&b, g_w, (size_t)3 * TC * TC * 4);
    blob_add(&b, g_b, 3 * TC * 4);
    FSDP_OP(c, gelu_fwd, o_3c, big, n3);
    blob_add(&b, o_3c, n3 * es);
    FSDP_OP(c, gelu_bwd, g_3c, big, in->dy_3c, n3);
    blob_add(&b, g_3c, n3 * 4);
    FSDP_OP(c, attention_fwd, o_c, att, big, TB, TT, TC, TNH);
    blob_add(&b, o_c, nc * es);
    blob_add(&b, att, natt * es);
    FSDP_OP(c, attention_bwd, g_3c, datt, in->dy_c, big, att, TB, TT, TC, TNH);
    blob_add(&b, g_3c, n3 * 4);
    FSDP_OP(c, residual_fwd, o_3c, big, o_3c, n3);
    blob_add(&b, o_3c, n3 * es);
    FSDP_OP(c, xent_fwd_bwd, losses, dlogits, logits, in->tgt, TN, TV, TVP, 0.25f);
    blob_add(&b, losses, TN * 4);
    blob_add(&b, dlogits, (size_t)TN * TVP * 4);
    /* the Llama ops: rmsnorm, rope (plain and with positions), swiglu and
     * grouped-query attention (4 query heads on 2 kv heads of 33, windowed) */
    FSDP_OP(c, rmsnorm_fwd, o_c, rstd, x, lw, 1e-5f, TN, TC);
    blob_add(&b, o_c, nc * es);
    blob_add(&b, rstd, TN * 4);
    memset(g_c, 0, nc * 4);
    memset(g_lw, 0, TC * 4);
    FSDP_OP(c, rmsnorm_bwd, g_c, g_lw, in->dy_c, x, lw, rstd, TN, TC);
    blob_add(&b, g_c, nc * 4);
    blob_add(&b, g_lw, TC * 4);
    float inv_freq[16];
    for (int i = 0; i < 16; i++)
        inv_freq[i] = powf(10000.0f, -(float)i / 16.0f);
    int *pos = malloc(TN * sizeof(int));
    for (int i = 0; i < TN; i++)
        pos[i] = (i % TT) % 37;
    for (int k = 0; k < 2; k++) {
        FSDP_OP(c, rope_fwd, x, inv_freq, k ? pos : NULL, TB, TT, 4, 32, TC);
        blob_add(&b, x, nc * es);
        memcpy(g_c, in->dy_c, nc * 4);
        FSDP_OP(c, rope_bwd, g_c, inv_freq, k ? pos : NULL, TB, TT, 4, 32, TC);
        blob_add(&b, g_c, nc * 4);
    }
    const int IC = 3 * TC / 2;
    FSDP_OP(c, swiglu_fwd, o_3c, big, TN, IC);
    blob_add(&b, o_3c, (size_t)TN * IC * es);
    memset(g_3c, 0, n3 * 4);
    FSDP_OP(c, swiglu_bwd, g_3c, big, in->dy_3c, TN, IC);
    blob_add(&b, g_3c, n3 * 4);
    const int hd = TC / TNH, qs = (TNH + 2 * 2) * hd;
    for (int k = 0; k < 2; k++) {
        FSDP_OP(c, attention_gqa_fwd, o_c, att, big, k ? pos : NULL, TB, TT, TNH, 2, hd);
        blob_add(&b, o_c, nc * es);
        blob_add(&b, att, natt * es);
        memset(g_3c, 0, n3 * 4);
        FSDP_OP(c, attention_gqa_bwd, g_3c, datt, in->dy_c, big, att, TB, TT, TNH, 2, hd);
        blob_add(&b, g_3c, (size_t)TN * qs * 4);
    }
    free(pos);
    FSDP_OP(c, cast, f32, FSDP_DTYPE_F32, o_3c, dt, n3);
    FSDP_OP(c, cast, o_3c, dt, g_3c, FSDP_DTYPE_F32, n3);
    blob_add(&b, f32, n3 * 4);
    blob_add(&b, o_3c, n3 * es);
    FSDP_OP(c, add, f32, f32, g_3c, n3);
    FSDP_OP(c, sumsq_blocks, sums, f32, n3);
    blob_add(&b, sums, (n3 + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK * 4);

    free(x), free(wq), free(bq), free(lw), free(lb), free(wte), free(wpe), free(logits);
    free(big), free(o_c), free(o_3c), free(att), free(mean), free(rstd), free(g_c);
    free(g_3c), free(g_w), free(g_b), free(g_lw), free(g_lb), free(g_wte), free(g_wpe);
    free(datt), free(losses), free(dlogits), free(sums), free(f32);
    env_fini(&e);
    return b;
}

static void check_threads(fsdp_dtype dt)
{
    bool along_m;
    int tile, n_tiles; /* the products split (the tiling floor is not above these shapes) */
    fsdp_cpu_gemm_tiles(TN, 3 * TC, TC, NULL, &along_m, &tile, &n_tiles);
    ck_assert_int_ge(n_tiles, 2);
    all_inputs in;
    inputs_make(&in);
    blob one = run_all_ops(&in, dt, 1);
    for (int t = 2; t <= 3; t++) {
        blob more = run_all_ops(&in, dt, t);
        ck_assert_uint_eq(more.n, one.n);
        size_t i = 0; /* (one assertion, not one per byte: Check logs every one) */
        while (i < one.n && one.p[i] == more.p[i])
            i++;
        ck_assert_msg(i == one.n, "%s: byte %zu of the outputs differs between 1 and %d threads",
                      fsdp_dtype_name(dt), i, t);
        free(more.p);
    }
    free(one.p);
    inputs_free(&in);
}

START_TEST(test_ops_bit_identical_across_threads_fp32) { check_threads(FSDP_DTYPE_F32); }
END_TEST

START_TEST(test_ops_bit_identical_across_threads_bf16) { check_threads(FSDP_DTYPE_BF16); }
END_TEST

/* What the attention's causal blocks multiply (fsdp_cpu_attention_flops, bench_gemm --lora's
 * floor): at T = 256 they skip 3/8 of the full products, at T = 1024 15/32, within one block
 * nothing; never fewer pairs than the causal triangle, never more than the square; linear in
 * B, NH and hd. */
START_TEST(test_attention_flops)
{
    const double full256 = 4.0 * 2 * 12 * 64 * 256.0 * 256.0;
    ck_assert_double_eq_tol(fsdp_cpu_attention_flops(2, 256, 12, 64), full256 * 5 / 8, 1e-6);
    ck_assert_double_eq_tol(fsdp_cpu_attention_flops(1, 1024, 1, 1), 4.0 * 1024 * 1024 * 17 / 32,
                            1e-6);
    ck_assert_double_eq_tol(fsdp_cpu_attention_flops(1, 64, 1, 1), 4.0 * 64 * 64, 1e-6);
    ck_assert_double_eq_tol(fsdp_cpu_attention_flops(3, 100, 5, 7),
                            105.0 * fsdp_cpu_attention_flops(1, 100, 1, 1), 1e-6);
    for (int T = 1; T <= 300; T++) {
        double pairs = fsdp_cpu_attention_flops(1, T, 1, 1) / 4.0;
        if (pairs < T * (T + 1) / 2.0 || pairs > (double)T * T)
            ck_abort_msg("T %d: %.0f pairs", T, pairs);
    }
}
END_TEST

/* ---- softmax row kernels (vsoftmax.h) ---------------------------------------- */

FSDP_SOFTMAX_KERNELS(base, )
#if defined(__x86_64__) || defined(__i386__)
FSDP_SOFTMAX_KERNELS(avx2, __attribute__((target("avx2"))))
#endif

/* Row lengths around the 16 lanes and the attention's block, values in [-20, 20) with one
 * far below the clamp (-200: e^-87 stands for it) and, in the last case, a NaN: the maximum,
 * the exps, their sum and the dot product agree to the bit across the two compilations, and
 * with double references (the sum and dot to 1e-6 relative, each e^x of the fp32
 * difference x - max to 4e-7). */
START_TEST(test_softmax_kernels_same_bits_every_isa)
{
    const int lens[] = {1, 2, 15, 16, 17, 31, 64, 100, 257};
    const int n_lens = (int)(sizeof lens / sizeof lens[0]);
    for (int li = 0; li <= n_lens; li++) {
        const bool nan_case = li == n_lens;
        const int n = nan_case ? 40 : lens[li];
        float *x = frand((size_t)n, 500 + (uint64_t)li, 20.0f), *b = frand((size_t)n, 600, 1.0f);
        if (n > 3)
            x[n / 3] = -200.0f;
        if (nan_case)
            x[7] = NAN;
        float *e0 = malloc((size_t)n * sizeof *e0), *e1 = malloc((size_t)n * sizeof *e1);
        ck_assert_ptr_nonnull(e0);
        ck_assert_ptr_nonnull(e1);
        const float m0 = fsdp_softmax_max_base(x, n);
        const double s0 = fsdp_softmax_exp_sum_base(x, e0, n, m0);
        const double d0 = fsdp_softmax_dot_base(x, b, n);
        if (nan_case) {
            ck_assert_msg(isnan(s0), "a NaN in the row gives a NaN sum, got %g", s0);
        } else {
            double ref_max = x[0], ref_sum = 0, ref_dot = 0;
            for (int j = 0; j < n; j++)
                ref_max = x[j] > ref_max ? x[j] : ref_max;
            ck_assert_float_eq(m0, (float)ref_max);
            for (int j = 0; j < n; j++) {
                double ej = exp((double)(x[j] - m0)); /* the kernel's fp32 argument */
                double want = ej < exp(-87.0) ? exp(-87.0) : ej;
                ck_assert_msg(fabs(e0[j] - want) <= 4e-7 * want, "n %d e[%d] = %.9g want %.9g",
                              n, j, e0[j], want);
                ref_sum += ej;
                ref_dot += (double)x[j] * b[j];
            }
            ck_assert_msg(fabs(s0 - ref_sum) <= 1e-6 * ref_sum, "n %d sum %.9g want %.9g", n, s0,
                          ref_sum);
            ck_assert_msg(fabs(d0 - ref_dot) <= 1e-6 * (1.0 + fabs(ref_dot)) * n,
                          "n %d dot %.9g want %.9g", n, d0, ref_dot);
        }
#if defined(__x86_64__) || defined(__i386__)
        if (__builtin_cpu_supports("avx2")) {
            const float m1 = fsdp_softmax_max_avx2(x, n);
            const double s1 = fsdp_softmax_exp_sum_avx2(x, e1, n, m1);
            const double d1 = fsdp_softmax_dot_avx2(x, b, n);
            ck_assert_msg(!memcmp(&m0, &m1, sizeof m0) && !memcmp(&d0, &d1, sizeof d0) &&
                              !memcmp(e0, e1, (size_t)n * sizeof *e0),
                          "n %d: the AVX2 kernels differ from the baseline's", n);
            ck_assert_msg(!memcmp(&s0, &s1, sizeof s0) || (isnan(s0) && isnan(s1)),
                          "n %d: AVX2 sum %.17g, baseline %.17g", n, s1, s0);
        }
#endif
        free(x), free(b), free(e0), free(e1);
    }
}
END_TEST

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--describe-gemm")) {
        /* for the tests above: what the loader did in this environment */
        fsdp_status st = fsdp_cpu_blas_status();
        printf("status %s\n", fsdp_status_name(st));
        if (st != FSDP_STATUS_OK) {
            printf("error %s\n", fsdp_error_msg());
            /* an op then fails cleanly, through sync_error */
            fsdp_device d;
            fsdp_op_ctx ctx;
            float a[4] = {1, 2, 3, 4}, y[4];
            if (fsdp_device_init(&d, FSDP_BACKEND_CPU, NULL, 0, 0, 0) == FSDP_STATUS_OK &&
                fsdp_ops_init(&ctx, &d, FSDP_DTYPE_F32) == FSDP_STATUS_OK) {
                FSDP_OP(&ctx, matmul_fwd, y, a, a, NULL, 2, 2, 2);
                fsdp_status op = ctx.iface->sync_error(&ctx);
                if (op == FSDP_STATUS_OK) /* async cpu streams: known at the sync */
                    op = fsdp_device_stream_sync(&d, ctx.stream);
                printf("op_status %s\n", fsdp_status_name(op));
                fsdp_ops_fini(&ctx);
                fsdp_device_fini(&d);
            }
            return 0;
        }
        const char *warn = fsdp_cpu_blas_warning();
        printf("core %s\ndescribe %s\nwarning %s\nbf16_dot %d\n", fsdp_cpu_blas_core(),
               fsdp_cpu_blas_describe(), warn ? warn : "-", (int)fsdp_cpu_blas_bf16_dot());
        const char *ct = getenv("OPENBLAS_CORETYPE");
        printf("coretype_env %s\n", ct ? ct : "-");
        return 0;
    }
    const fsdp_test_tcase tcases[] = {
        {"cpu", 120,
         FSDP_TESTS(test_openblas_override_from_features, test_loaded_kernel_is_the_cpus_widest,
                    test_fallback_core_is_replaced, test_pin_and_bad_setting, test_threads_for,
                    test_team_runs_every_chunk_once, test_gemm_tiles,
                    test_gemm_tiled_matches_double, test_first_gemms_of_two_devices_at_once,
                    test_matmul_bf16_products_match_double,
                    test_ops_bit_identical_across_threads_fp32,
                    test_ops_bit_identical_across_threads_bf16,
                    test_softmax_kernels_same_bits_every_isa, test_attention_flops)},
    };
    return fsdp_test_main("cpu", tcases, FSDP_TEST_LEN(tcases));
}
