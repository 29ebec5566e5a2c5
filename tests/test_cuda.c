/*
 * test_cuda.c - the cuda backend: every op against the cpu backend on the
 * same inputs (per-op tolerance; AdamW, cast and sumsq_blocks bit for bit),
 * determinism (the same op twice gives the same bits), the op error path
 * (sync_error), the nccl and peer collectives against a host reference
 * (peer: exactly, in comm.h's tree order) for 1 and 4 virtual ranks and for
 * the GPUs present, and the abort path (a fault on one rank makes the
 * others return ABORTED, no hang).
 *
 * Tests that need a GPU look for one inside the forked test, never in
 * main() (CUDA must not be initialised in Check's parent process), and
 * without one print exactly "SKIP: <test>: no CUDA device" and pass; the
 * rendezvous, table and no-GPU error tests run everywhere. Builds with
 * CUDA=0 compile the same file: the cuda entry points are then stubs.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/cuda_comm.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "core/world.h"
#include "device/device.h"
#include "ops/ops.h"

#ifdef FSDP_CUDA
static const int built_with_cuda = 1;
#else
static const int built_with_cuda = 0;
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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- a cpu device and a cuda device side by side ------------------------- */

typedef struct pair {
    fsdp_device cpu, gpu;
    fsdp_op_ctx oc, og;
    fsdp_dtype dt;
} pair;

static void pair_init(pair *P, fsdp_dtype dt)
{
    memset(P, 0, sizeof *P);
    P->dt = dt;
    ck_assert_msg(fsdp_device_init(&P->cpu, FSDP_BACKEND_CPU, NULL, 0, 0, 0) == FSDP_STATUS_OK,
                  "%s", fsdp_error_msg());
    ck_assert_msg(fsdp_device_init(&P->gpu, FSDP_BACKEND_CUDA, NULL, 0, 0, 0) == FSDP_STATUS_OK,
                  "%s", fsdp_error_msg());
    ck_assert_msg(fsdp_ops_init(&P->oc, &P->cpu, dt) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_msg(fsdp_ops_init(&P->og, &P->gpu, dt) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
}

static void pair_fini(pair *P)
{
    fsdp_ops_fini(&P->og);
    fsdp_ops_fini(&P->oc);
    fsdp_device_fini(&P->gpu);
    fsdp_device_fini(&P->cpu);
}

/* Wait for the GPU and check that no op recorded a failure. */
static void gpu_done(pair *P)
{
    ck_assert_msg(fsdp_device_stream_sync(&P->gpu, P->gpu.compute) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
    ck_assert_ptr_nonnull(P->og.iface->sync_error);
    fsdp_status st = P->og.iface->sync_error(&P->og);
    ck_assert_msg(st == FSDP_STATUS_OK, "cuda op failed: %s", fsdp_error_msg());
}

/* A tensor on both devices with the same initial contents. */
typedef struct tens {
    void *c, *g;
    size_t n;
    fsdp_dtype dt;
    float *init; /* values exactly representable in dt */
} tens;

static void to_dt(void *dst, fsdp_dtype dt, const float *src, size_t n)
{
    if (dt == FSDP_DTYPE_BF16)
        for (size_t i = 0; i < n; i++)
            ((fsdp_bf16 *)dst)[i] = fsdp_f32_to_bf16(src[i]);
    else
        memcpy(dst, src, n * sizeof(float));
}

static void t_upload(pair *P, tens *t)
{
    size_t bytes = t->n * fsdp_dtype_size(t->dt);
    to_dt(t->c, t->dt, t->init, t->n);
    ck_assert_int_eq(fsdp_device_memcpy(&P->gpu, t->g, t->c, bytes, NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&P->gpu, P->gpu.compute), FSDP_STATUS_OK);
}

/* n values std * N(0, 1) (std 0: zeros), rounded to dt. */
static tens t_new(pair *P, size_t n, fsdp_dtype dt, float std, uint64_t stream)
{
    tens t = {.n = n, .dt = dt};
    size_t bytes = n * fsdp_dtype_size(dt);
    t.init = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(t.init);
    for (size_t i = 0; i < n; i++) {
        float v = std ? std * fsdp_rng_normal(SEED, stream, i) : 0.0f;
        t.init[i] = dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(fsdp_f32_to_bf16(v)) : v;
    }
    ck_assert_int_eq(fsdp_device_alloc(&P->cpu, bytes, FSDP_MEM_OTHER, "test", &t.c), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(&P->gpu, bytes, FSDP_MEM_OTHER, "test", &t.g), FSDP_STATUS_OK);
    t_upload(P, &t);
    return t;
}

/* Integers in [0, maxv) on both devices. */
static tens t_ints(pair *P, size_t n, int maxv, uint64_t stream)
{
    tens t = {.n = n, .dt = FSDP_DTYPE_F32};
    ck_assert_int_eq(fsdp_device_alloc(&P->cpu, n * 4, FSDP_MEM_OTHER, "ints", &t.c), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_alloc(&P->gpu, n * 4, FSDP_MEM_OTHER, "ints", &t.g), FSDP_STATUS_OK);
    int *v = t.c;
    for (size_t i = 0; i < n; i++)
        v[i] = (int)(fsdp_rng_u64(SEED, stream, i) % (uint64_t)maxv);
    ck_assert_int_eq(fsdp_device_memcpy(&P->gpu, t.g, t.c, n * 4, NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&P->gpu, P->gpu.compute), FSDP_STATUS_OK);
    return t;
}

/* Contents as fp32 (malloc'd): the cpu copy, or the gpu copy. */
static float *t_get(pair *P, const tens *t, int gpu)
{
    size_t bytes = t->n * fsdp_dtype_size(t->dt);
    void *raw = malloc(bytes ? bytes : 1);
    float *out = malloc(t->n * sizeof(float) + 1);
    ck_assert(raw && out);
    if (gpu) {
        ck_assert_int_eq(fsdp_device_memcpy(&P->gpu, raw, t->g, bytes, NULL), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_stream_sync(&P->gpu, P->gpu.compute), FSDP_STATUS_OK);
    } else {
        memcpy(raw, t->c, bytes);
    }
    if (t->dt == FSDP_DTYPE_BF16)
        for (size_t i = 0; i < t->n; i++)
            out[i] = fsdp_bf16_to_f32(((fsdp_bf16 *)raw)[i]);
    else
        memcpy(out, raw, bytes);
    free(raw);
    return out;
}

static void t_free(pair *P, tens *t)
{
    fsdp_device_free(&P->cpu, t->c);
    fsdp_device_free(&P->gpu, t->g);
    free(t->init);
    t->c = t->g = NULL;
    t->init = NULL;
}

/* |got - want| <= rtol * (|want| + max|want|) everywhere. */
static void expect_close(const char *what, const float *got, const float *want, size_t n,
                         double rtol)
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

/* Compare tensor t on both sides; gpu_copy receives the gpu values. */
static void expect_pair(pair *P, const char *what, const tens *t, double rtol, float **gpu_copy)
{
    float *c = t_get(P, t, 0), *g = t_get(P, t, 1);
    expect_close(what, g, c, t->n, rtol);
    if (gpu_copy)
        *gpu_copy = g;
    else
        free(g);
    free(c);
}

/* The gpu contents of t equal `prev` bit for bit (frees prev). */
static void expect_same_bits(pair *P, const char *what, const tens *t, float *prev)
{
    float *g = t_get(P, t, 1);
    ck_assert_msg(memcmp(g, prev, t->n * sizeof(float)) == 0,
                  "%s: running the same cuda op twice gave different bits", what);
    free(g);
    free(prev);
}

static double tol_for(fsdp_dtype dt, double f32_tol) { return dt == FSDP_DTYPE_BF16 ? 1e-2 : f32_tol; }

/* ---- tests that run everywhere ------------------------------------------- */

START_TEST(test_ops_table_complete)
{
    const struct fsdp_ops_i *t = fsdp_ops_cuda_iface();
    if (!built_with_cuda) {
        ck_assert_ptr_null(t);
        return;
    }
    ck_assert_ptr_nonnull(t);
    ck_assert_str_eq(t->name, "cuda");
    /* every slot after the name is a function */
    const void *const *slots = (const void *const *)((const char *)t + sizeof(const char *));
    size_t n_slots = (sizeof *t - sizeof(const char *)) / sizeof(void *);
    ck_assert_uint_ge(n_slots, 18); /* fini, 16 ops, sync_error */
    for (size_t i = 0; i < n_slots; i++)
        ck_assert_msg(slots[i] != NULL, "cuda op table slot %zu is NULL", i);
}
END_TEST

/* Without a GPU (or without CUDA) the cuda backend fails cleanly, with a
 * message; with a GPU it initialises. */
START_TEST(test_cuda_init_or_clean_error)
{
    fsdp_device d;
    fsdp_status st = fsdp_device_init(&d, FSDP_BACKEND_CUDA, NULL, 0, 0, 0);
    if (!built_with_cuda) {
        ck_assert_int_eq(st, FSDP_STATUS_UNSUPPORTED);
        ck_assert(strlen(fsdp_error_msg()) > 0);
        fsdp_comm c;
        ck_assert_int_eq(fsdp_comm_nccl_init(&c, NULL, &d, 0), FSDP_STATUS_UNSUPPORTED);
        ck_assert(strstr(fsdp_error_msg(), "CUDA=0") != NULL);
        ck_assert_int_eq(fsdp_comm_peer_init(&c, NULL, &d, 0), FSDP_STATUS_UNSUPPORTED);
        ck_assert(strstr(fsdp_error_msg(), "CUDA=0") != NULL);
        fsdp_op_ctx ctx = {0};
        ck_assert_int_eq(fsdp_ops_cuda_init(&ctx), FSDP_STATUS_UNSUPPORTED);
        return;
    }
    if (fsdp_cuda_device_count() == 0) {
        ck_assert_int_ne(st, FSDP_STATUS_OK);
        ck_assert(strlen(fsdp_error_msg()) > 0);
        return;
    }
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    fsdp_op_ctx ctx;
    ck_assert_msg(fsdp_ops_init(&ctx, &d, FSDP_DTYPE_BF16) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
    ck_assert_ptr_nonnull(ctx.backend);
    /* the cuBLAS workspace is counted on the device */
    ck_assert_uint_ge(d.mem.in_use_bytes, (size_t)1 << 20);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&d);
}
END_TEST

/* The rendezvous: 4 rank threads, many exchanges, every record seen by
 * every rank in rank order; then an abort while ranks wait. */
struct rdv_arg {
    int rounds;
    int fail_rank, fail_round; /* -1: none */
    int bad[8];
    fsdp_status st[8];
};

static fsdp_status rdv_rank(fsdp_world *w, int rank, void *arg)
{
    struct rdv_arg *a = arg;
    fsdp_comm_rdv *r;
    FSDP_TRY(fsdp_comm_rdv_attach(w, &r));
    fsdp_status st = FSDP_STATUS_OK;
    for (int k = 0; k < a->rounds && st == FSDP_STATUS_OK; k++) {
        if (rank == a->fail_rank && k == a->fail_round) {
            st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d fails on purpose", rank);
            break;
        }
        long mine[3] = {rank, k, rank * 1000 + k}, all[8][3];
        st = fsdp_comm_rdv_exchange(r, w, rank, mine, sizeof mine, all, true);
        if (st != FSDP_STATUS_OK)
            break;
        for (int q = 0; q < w->n_ranks; q++)
            if (all[q][0] != q || all[q][1] != k || all[q][2] != q * 1000 + k)
                a->bad[rank]++;
    }
    fsdp_comm_rdv_detach(w, r);
    a->st[rank] = st;
    return st;
}

START_TEST(test_rdv_exchange_and_abort)
{
    fsdp_world *w;
    ck_assert_int_eq(fsdp_world_init(&w, 4), FSDP_STATUS_OK);
    struct rdv_arg a = {.rounds = 300, .fail_rank = -1, .fail_round = -1};
    ck_assert_msg(fsdp_world_launch(w, rdv_rank, &a) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    for (int r = 0; r < 4; r++)
        ck_assert_int_eq(a.bad[r], 0);
    ck_assert_ptr_null(w->rdv_shared); /* the last rank to leave freed it */

    struct rdv_arg b = {.rounds = 300, .fail_rank = 2, .fail_round = 57};
    double t0 = now_s();
    fsdp_status st = fsdp_world_launch(w, rdv_rank, &b);
    ck_assert_int_eq(st, FSDP_STATUS_INTERNAL);
    ck_assert(strstr(fsdp_error_msg(), "on purpose") != NULL);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(b.bad[r], 0);
        if (r != 2)
            ck_assert_int_eq(b.st[r], FSDP_STATUS_ABORTED);
    }
    ck_assert(now_s() - t0 < 5.0);
    ck_assert_ptr_null(w->rdv_shared);

    /* the world is usable again after the abort */
    struct rdv_arg c = {.rounds = 20, .fail_rank = -1, .fail_round = -1};
    ck_assert_int_eq(fsdp_world_launch(w, rdv_rank, &c), FSDP_STATUS_OK);
    fsdp_world_free(w);
}
END_TEST

/* ---- ops against the cpu backend ------------------------------------------ */

START_TEST(test_embed)
{
    NEED_GPU(_i ? "test_embed(bf16)" : "test_embed(f32)");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int B = 3, T = 17, C = 72, V = 50, maxT = 20;
    tens tok = t_ints(&P, (size_t)B * T, V, 1);
    tens wte = t_new(&P, (size_t)V * C, dt, 0.5f, 2), wpe = t_new(&P, (size_t)maxT * C, dt, 0.5f, 3);
    tens out = t_new(&P, (size_t)B * T * C, dt, 0.0f, 0);
    tens dout = t_new(&P, (size_t)B * T * C, FSDP_DTYPE_F32, 1.0f, 4);
    tens dwte = t_new(&P, (size_t)V * C, FSDP_DTYPE_F32, 0.1f, 5);
    tens dwpe = t_new(&P, (size_t)maxT * C, FSDP_DTYPE_F32, 0.1f, 6);
    FSDP_OP(&P.oc, embed_fwd, out.c, tok.c, wte.c, wpe.c, B, T, C);
    FSDP_OP(&P.og, embed_fwd, out.g, tok.g, wte.g, wpe.g, B, T, C);
    FSDP_OP(&P.oc, embed_bwd, dwte.c, dwpe.c, dout.c, tok.c, B, T, C);
    FSDP_OP(&P.og, embed_bwd, dwte.g, dwpe.g, dout.g, tok.g, B, T, C);
    gpu_done(&P);
    float *g_out, *g_dwte, *g_dwpe;
    expect_pair(&P, "embed_fwd out", &out, dt == FSDP_DTYPE_BF16 ? 4e-3 : 0.0, &g_out);
    /* same adds in the same order as the cpu: exact */
    expect_pair(&P, "embed_bwd dwte", &dwte, 0.0, &g_dwte);
    expect_pair(&P, "embed_bwd dwpe", &dwpe, 0.0, &g_dwpe);
    t_upload(&P, &dwte);
    t_upload(&P, &dwpe);
    FSDP_OP(&P.og, embed_fwd, out.g, tok.g, wte.g, wpe.g, B, T, C);
    FSDP_OP(&P.og, embed_bwd, dwte.g, dwpe.g, dout.g, tok.g, B, T, C);
    gpu_done(&P);
    expect_same_bits(&P, "embed_fwd", &out, g_out);
    expect_same_bits(&P, "embed_bwd dwte", &dwte, g_dwte);
    expect_same_bits(&P, "embed_bwd dwpe", &dwpe, g_dwpe);
    tens *all[] = {&tok, &wte, &wpe, &out, &dout, &dwte, &dwpe};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

START_TEST(test_layernorm)
{
    NEED_GPU(_i ? "test_layernorm(bf16)" : "test_layernorm(f32)");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int N = 150, C = 200; /* > 64 rows: several column-sum chunks */
    tens inp = t_new(&P, (size_t)N * C, dt, 2.0f, 10), w = t_new(&P, C, dt, 1.0f, 11);
    tens b = t_new(&P, C, dt, 1.0f, 12), out = t_new(&P, (size_t)N * C, dt, 0.0f, 0);
    tens mean = t_new(&P, N, FSDP_DTYPE_F32, 0.0f, 0), rstd = t_new(&P, N, FSDP_DTYPE_F32, 0.0f, 0);
    tens dout = t_new(&P, (size_t)N * C, FSDP_DTYPE_F32, 1.0f, 13);
    tens dinp = t_new(&P, (size_t)N * C, FSDP_DTYPE_F32, 0.5f, 14);
    tens dw = t_new(&P, C, FSDP_DTYPE_F32, 0.5f, 15), db = t_new(&P, C, FSDP_DTYPE_F32, 0.5f, 16);
    FSDP_OP(&P.oc, layernorm_fwd, out.c, mean.c, rstd.c, inp.c, w.c, b.c, N, C);
    FSDP_OP(&P.og, layernorm_fwd, out.g, mean.g, rstd.g, inp.g, w.g, b.g, N, C);
    FSDP_OP(&P.oc, layernorm_bwd, dinp.c, dw.c, db.c, dout.c, inp.c, w.c, mean.c, rstd.c, N, C);
    FSDP_OP(&P.og, layernorm_bwd, dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.g, rstd.g, N, C);
    gpu_done(&P);
    float *g[6];
    expect_pair(&P, "layernorm_fwd out", &out, tol_for(dt, 1e-5), &g[0]);
    expect_pair(&P, "layernorm_fwd mean", &mean, 1e-6, &g[1]);
    expect_pair(&P, "layernorm_fwd rstd", &rstd, 1e-6, &g[2]);
    expect_pair(&P, "layernorm_bwd dinp", &dinp, 1e-4, &g[3]);
    expect_pair(&P, "layernorm_bwd dw", &dw, 1e-4, &g[4]);
    expect_pair(&P, "layernorm_bwd db", &db, 1e-5, &g[5]);
    t_upload(&P, &dinp);
    t_upload(&P, &dw);
    t_upload(&P, &db);
    FSDP_OP(&P.og, layernorm_fwd, out.g, mean.g, rstd.g, inp.g, w.g, b.g, N, C);
    FSDP_OP(&P.og, layernorm_bwd, dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.g, rstd.g, N, C);
    gpu_done(&P);
    expect_same_bits(&P, "layernorm_fwd out", &out, g[0]);
    expect_same_bits(&P, "layernorm_fwd mean", &mean, g[1]);
    expect_same_bits(&P, "layernorm_fwd rstd", &rstd, g[2]);
    expect_same_bits(&P, "layernorm_bwd dinp", &dinp, g[3]);
    expect_same_bits(&P, "layernorm_bwd dw", &dw, g[4]);
    expect_same_bits(&P, "layernorm_bwd db", &db, g[5]);
    tens *all[] = {&inp, &w, &b, &out, &mean, &rstd, &dout, &dinp, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

START_TEST(test_matmul)
{
    NEED_GPU(_i ? "test_matmul(bf16)" : "test_matmul(f32)");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int N = 70, C = 96, OC = 136;
    tens inp = t_new(&P, (size_t)N * C, dt, 1.0f, 20), w = t_new(&P, (size_t)OC * C, dt, 0.2f, 21);
    tens bias = t_new(&P, OC, dt, 1.0f, 22);
    tens out = t_new(&P, (size_t)N * OC, dt, 0.0f, 0), out2 = t_new(&P, (size_t)N * OC, dt, 0.0f, 0);
    tens dout = t_new(&P, (size_t)N * OC, FSDP_DTYPE_F32, 1.0f, 23);
    tens dinp = t_new(&P, (size_t)N * C, FSDP_DTYPE_F32, 0.5f, 24);
    tens dw = t_new(&P, (size_t)OC * C, FSDP_DTYPE_F32, 0.5f, 25);
    tens dbias = t_new(&P, OC, FSDP_DTYPE_F32, 0.5f, 26);
    FSDP_OP(&P.oc, matmul_fwd, out.c, inp.c, w.c, bias.c, N, C, OC);
    FSDP_OP(&P.og, matmul_fwd, out.g, inp.g, w.g, bias.g, N, C, OC);
    FSDP_OP(&P.oc, matmul_fwd, out2.c, inp.c, w.c, NULL, N, C, OC);
    FSDP_OP(&P.og, matmul_fwd, out2.g, inp.g, w.g, NULL, N, C, OC);
    FSDP_OP(&P.oc, matmul_bwd, dinp.c, dw.c, dbias.c, dout.c, inp.c, w.c, N, C, OC);
    FSDP_OP(&P.og, matmul_bwd, dinp.g, dw.g, dbias.g, dout.g, inp.g, w.g, N, C, OC);
    gpu_done(&P);
    float *g[5];
    expect_pair(&P, "matmul_fwd out", &out, tol_for(dt, 1e-4), &g[0]);
    expect_pair(&P, "matmul_fwd out (no bias)", &out2, tol_for(dt, 1e-4), &g[1]);
    expect_pair(&P, "matmul_bwd dinp", &dinp, tol_for(dt, 1e-4), &g[2]);
    expect_pair(&P, "matmul_bwd dw", &dw, tol_for(dt, 1e-4), &g[3]);
    expect_pair(&P, "matmul_bwd dbias", &dbias, 1e-5, &g[4]);
    t_upload(&P, &dinp);
    t_upload(&P, &dw);
    t_upload(&P, &dbias);
    FSDP_OP(&P.og, matmul_fwd, out.g, inp.g, w.g, bias.g, N, C, OC);
    FSDP_OP(&P.og, matmul_fwd, out2.g, inp.g, w.g, NULL, N, C, OC);
    FSDP_OP(&P.og, matmul_bwd, dinp.g, dw.g, dbias.g, dout.g, inp.g, w.g, N, C, OC);
    gpu_done(&P);
    expect_same_bits(&P, "matmul_fwd", &out, g[0]);
    expect_same_bits(&P, "matmul_fwd (no bias)", &out2, g[1]);
    expect_same_bits(&P, "matmul_bwd dinp", &dinp, g[2]);
    expect_same_bits(&P, "matmul_bwd dw", &dw, g[3]);
    expect_same_bits(&P, "matmul_bwd dbias", &dbias, g[4]);
    /* NULL gradients are skipped: only dinp changes */
    t_upload(&P, &dinp);
    t_upload(&P, &dw);
    FSDP_OP(&P.og, matmul_bwd, dinp.g, NULL, NULL, dout.g, inp.g, w.g, N, C, OC);
    gpu_done(&P);
    float *gw = t_get(&P, &dw, 1);
    ck_assert(memcmp(gw, dw.init, dw.n * sizeof(float)) == 0);
    free(gw);
    tens *all[] = {&inp, &w, &bias, &out, &out2, &dout, &dinp, &dw, &dbias};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

START_TEST(test_gelu_residual_add)
{
    NEED_GPU(_i ? "test_gelu_residual_add(bf16)" : "test_gelu_residual_add(f32)");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const size_t n = 5000;
    tens x = t_new(&P, n, dt, 3.0f, 30), y = t_new(&P, n, dt, 1.0f, 31);
    tens out = t_new(&P, n, dt, 0.0f, 0), res = t_new(&P, n, dt, 0.0f, 0);
    tens dout = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 32), dinp = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 33);
    tens a32 = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 34);
    FSDP_OP(&P.oc, gelu_fwd, out.c, x.c, n);
    FSDP_OP(&P.og, gelu_fwd, out.g, x.g, n);
    FSDP_OP(&P.oc, gelu_bwd, dinp.c, x.c, dout.c, n);
    FSDP_OP(&P.og, gelu_bwd, dinp.g, x.g, dout.g, n);
    FSDP_OP(&P.oc, residual_fwd, res.c, x.c, y.c, n);
    FSDP_OP(&P.og, residual_fwd, res.g, x.g, y.g, n);
    FSDP_OP(&P.oc, add, a32.c, a32.c, dout.c, n); /* in place */
    FSDP_OP(&P.og, add, a32.g, a32.g, dout.g, n);
    gpu_done(&P);
    float *g[4];
    expect_pair(&P, "gelu_fwd", &out, tol_for(dt, 1e-5), &g[0]);
    expect_pair(&P, "gelu_bwd", &dinp, 1e-5, &g[1]);
    expect_pair(&P, "residual_fwd", &res, 0.0, &g[2]);
    expect_pair(&P, "add", &a32, 0.0, &g[3]);
    t_upload(&P, &dinp);
    t_upload(&P, &a32);
    FSDP_OP(&P.og, gelu_fwd, out.g, x.g, n);
    FSDP_OP(&P.og, gelu_bwd, dinp.g, x.g, dout.g, n);
    FSDP_OP(&P.og, residual_fwd, res.g, x.g, y.g, n);
    FSDP_OP(&P.og, add, a32.g, a32.g, dout.g, n);
    gpu_done(&P);
    expect_same_bits(&P, "gelu_fwd", &out, g[0]);
    expect_same_bits(&P, "gelu_bwd", &dinp, g[1]);
    expect_same_bits(&P, "residual_fwd", &res, g[2]);
    expect_same_bits(&P, "add", &a32, g[3]);
    tens *all[] = {&x, &y, &out, &res, &dout, &dinp, &a32};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

START_TEST(test_attention)
{
    NEED_GPU(_i ? "test_attention(bf16)" : "test_attention(f32)");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int B = 2, T = 33, C = 64, NH = 4;
    const size_t nqkv = (size_t)B * T * 3 * C, natt = (size_t)B * NH * T * T, nout = (size_t)B * T * C;
    tens qkv = t_new(&P, nqkv, dt, 1.0f, 40);
    tens att = t_new(&P, natt, dt, 0.0f, 0), out = t_new(&P, nout, dt, 0.0f, 0);
    tens dout = t_new(&P, nout, FSDP_DTYPE_F32, 1.0f, 41);
    tens dqkv = t_new(&P, nqkv, FSDP_DTYPE_F32, 0.5f, 42);
    tens datt = t_new(&P, natt, FSDP_DTYPE_F32, 0.0f, 0);
    FSDP_OP(&P.oc, attention_fwd, out.c, att.c, qkv.c, B, T, C, NH);
    FSDP_OP(&P.og, attention_fwd, out.g, att.g, qkv.g, B, T, C, NH);
    FSDP_OP(&P.oc, attention_bwd, dqkv.c, datt.c, dout.c, qkv.c, att.c, B, T, C, NH);
    FSDP_OP(&P.og, attention_bwd, dqkv.g, datt.g, dout.g, qkv.g, att.g, B, T, C, NH);
    gpu_done(&P);
    float *g[3];
    expect_pair(&P, "attention_fwd att", &att, tol_for(dt, 1e-5), &g[0]);
    expect_pair(&P, "attention_fwd out", &out, tol_for(dt, 1e-4), &g[1]);
    expect_pair(&P, "attention_bwd dqkv", &dqkv, tol_for(dt, 1e-4), &g[2]);
    /* causal: zeros above the diagonal */
    float *ga = t_get(&P, &att, 1);
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++)
            for (int j = t + 1; j < T; j++)
                ck_assert(ga[((size_t)bh * T + t) * T + j] == 0.0f);
    free(ga);
    t_upload(&P, &dqkv);
    FSDP_OP(&P.og, attention_fwd, out.g, att.g, qkv.g, B, T, C, NH);
    FSDP_OP(&P.og, attention_bwd, dqkv.g, datt.g, dout.g, qkv.g, att.g, B, T, C, NH);
    gpu_done(&P);
    expect_same_bits(&P, "attention_fwd att", &att, g[0]);
    expect_same_bits(&P, "attention_fwd out", &out, g[1]);
    expect_same_bits(&P, "attention_bwd dqkv", &dqkv, g[2]);
    /* a bad head count is reported through sync_error, then cleared */
    FSDP_OP(&P.og, attention_fwd, out.g, att.g, qkv.g, B, T, C, 5);
    ck_assert_int_eq(fsdp_device_stream_sync(&P.gpu, P.gpu.compute), FSDP_STATUS_OK);
    ck_assert_int_eq(P.og.iface->sync_error(&P.og), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "heads") != NULL);
    ck_assert_int_eq(P.og.iface->sync_error(&P.og), FSDP_STATUS_OK);
    tens *all[] = {&qkv, &att, &out, &dout, &dqkv, &datt};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

START_TEST(test_xent)
{
    NEED_GPU(_i ? "test_xent(bf16)" : "test_xent(f32)");
    pair P;
    fsdp_dtype dt = (fsdp_dtype)_i;
    pair_init(&P, dt);
    const int N = 40, V = 1000, Vp = 1024; /* also the >= 4096 path below */
    tens logits = t_new(&P, (size_t)N * Vp, dt, 3.0f, 50);
    tens tgt = t_ints(&P, N, V, 51);
    tens losses = t_new(&P, N, FSDP_DTYPE_F32, 0.0f, 0);
    tens dlogits = t_new(&P, (size_t)N * Vp, FSDP_DTYPE_F32, 1.0f, 52); /* overwritten */
    const float dloss = 1.0f / N;
    FSDP_OP(&P.oc, xent_fwd_bwd, losses.c, dlogits.c, logits.c, tgt.c, N, V, Vp, dloss);
    FSDP_OP(&P.og, xent_fwd_bwd, losses.g, dlogits.g, logits.g, tgt.g, N, V, Vp, dloss);
    gpu_done(&P);
    float *g[2];
    expect_pair(&P, "xent losses", &losses, 1e-5, &g[0]);
    expect_pair(&P, "xent dlogits", &dlogits, 1e-5, &g[1]);
    float *gd = t_get(&P, &dlogits, 1);
    for (int i = 0; i < N; i++)
        for (int j = V; j < Vp; j++)
            ck_assert(gd[(size_t)i * Vp + j] == 0.0f);
    free(gd);
    FSDP_OP(&P.og, xent_fwd_bwd, losses.g, dlogits.g, logits.g, tgt.g, N, V, Vp, dloss);
    gpu_done(&P);
    expect_same_bits(&P, "xent losses", &losses, g[0]);
    expect_same_bits(&P, "xent dlogits", &dlogits, g[1]);
    if (dt == FSDP_DTYPE_F32) {
        /* dlogits aliasing logits: same results as separate buffers */
        float *sep = t_get(&P, &dlogits, 1);
        FSDP_OP(&P.og, xent_fwd_bwd, losses.g, (float *)logits.g, logits.g, tgt.g, N, V, Vp,
                dloss);
        gpu_done(&P);
        float *inplace = t_get(&P, &logits, 1);
        ck_assert(memcmp(sep, inplace, logits.n * sizeof(float)) == 0);
        free(sep);
        free(inplace);
    }
    /* a vocabulary large enough for the wide block, forward only */
    const int N2 = 6, V2 = 50257, Vp2 = 50304;
    tens l2 = t_new(&P, (size_t)N2 * Vp2, dt, 2.0f, 53), t2 = t_ints(&P, N2, V2, 54);
    tens loss2 = t_new(&P, N2, FSDP_DTYPE_F32, 0.0f, 0);
    FSDP_OP(&P.oc, xent_fwd_bwd, loss2.c, NULL, l2.c, t2.c, N2, V2, Vp2, 1.0f);
    FSDP_OP(&P.og, xent_fwd_bwd, loss2.g, NULL, l2.g, t2.g, N2, V2, Vp2, 1.0f);
    gpu_done(&P);
    expect_pair(&P, "xent losses (V=50257)", &loss2, 1e-5, NULL);
    tens *all[] = {&logits, &tgt, &losses, &dlogits, &l2, &t2, &loss2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

/* AdamW: bit-identical to the cpu (fsdp_adamw_ref), p_out fp32 or bf16. */
START_TEST(test_adamw_bit_exact)
{
    NEED_GPU(_i ? "test_adamw_bit_exact(bf16 out)" : "test_adamw_bit_exact(f32 out)");
    pair P;
    fsdp_dtype out_dt = (fsdp_dtype)_i;
    pair_init(&P, FSDP_DTYPE_F32);
    const size_t n = 10007;
    tens p = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 60), g = t_new(&P, n, FSDP_DTYPE_F32, 0.3f, 61);
    tens m = t_new(&P, n, FSDP_DTYPE_F32, 0.01f, 62), v = t_new(&P, n, FSDP_DTYPE_F32, 0.0f, 0);
    tens po = t_new(&P, n, out_dt, 0.0f, 0);
    for (int step = 1; step <= 3; step++) {
        float b1 = 0.9f, b2 = 0.95f;
        float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
        FSDP_OP(&P.oc, adamw, p.c, g.c, m.c, v.c, n, 3e-4f, b1, b2, 1e-8f, 0.1f, bc1, bc2, 0.7f,
                po.c, out_dt);
        FSDP_OP(&P.og, adamw, p.g, g.g, m.g, v.g, n, 3e-4f, b1, b2, 1e-8f, 0.1f, bc1, bc2, 0.7f,
                po.g, out_dt);
    }
    gpu_done(&P);
    tens *chk[] = {&p, &m, &v, &po};
    const char *names[] = {"p", "m", "v", "p_out"};
    for (int k = 0; k < 4; k++) {
        float *c = t_get(&P, chk[k], 0), *gg = t_get(&P, chk[k], 1);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(memcmp(&c[i], &gg[i], 4) == 0, "adamw %s[%zu]: cuda %.9g vs cpu %.9g",
                          names[k], i, gg[i], c[i]);
        free(c);
        free(gg);
    }
    tens *all[] = {&p, &g, &m, &v, &po};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

/* SGD with momentum: bit-identical to the cpu (fsdp_sgd_ref), p_out fp32 or bf16. */
START_TEST(test_sgd_bit_exact)
{
    NEED_GPU(_i ? "test_sgd_bit_exact(bf16 out)" : "test_sgd_bit_exact(f32 out)");
    pair P;
    fsdp_dtype out_dt = (fsdp_dtype)_i;
    pair_init(&P, FSDP_DTYPE_F32);
    const size_t n = 10007;
    tens p = t_new(&P, n, FSDP_DTYPE_F32, 1.0f, 63), g = t_new(&P, n, FSDP_DTYPE_F32, 0.3f, 64);
    tens buf = t_new(&P, n, FSDP_DTYPE_F32, 0.0f, 0), po = t_new(&P, n, out_dt, 0.0f, 0);
    for (int step = 1; step <= 3; step++) {
        float wd = step == 2 ? 0.0f : 0.1f;
        FSDP_OP(&P.oc, sgd, p.c, g.c, buf.c, n, 0.05f, 0.9f, wd, 0.7f, po.c, out_dt);
        FSDP_OP(&P.og, sgd, p.g, g.g, buf.g, n, 0.05f, 0.9f, wd, 0.7f, po.g, out_dt);
    }
    gpu_done(&P);
    tens *chk[] = {&p, &buf, &po};
    const char *names[] = {"p", "buf", "p_out"};
    for (int k = 0; k < 3; k++) {
        float *c = t_get(&P, chk[k], 0), *gg = t_get(&P, chk[k], 1);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(memcmp(&c[i], &gg[i], 4) == 0, "sgd %s[%zu]: cuda %.9g vs cpu %.9g",
                          names[k], i, gg[i], c[i]);
        free(c);
        free(gg);
    }
    tens *all[] = {&p, &g, &buf, &po};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

/* cast (both directions, ties, NaN, inf) and sumsq_blocks: bit-identical. */
START_TEST(test_cast_sumsq_bit_exact)
{
    NEED_GPU("test_cast_sumsq_bit_exact");
    pair P;
    pair_init(&P, FSDP_DTYPE_F32);
    const size_t n = 3 * FSDP_NORM_BLOCK + 77; /* a short last block */
    tens x = t_new(&P, n, FSDP_DTYPE_F32, 10.0f, 70);
    /* specials: ties to even, NaN, infinities, denormals */
    uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x7fc00001u, 0xffa00000u, 0x7f800000u,
                           0xff800000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x3f80ffffu};
    for (size_t k = 0; k < sizeof specials / sizeof *specials; k++)
        memcpy(&x.init[k], &specials[k], 4);
    t_upload(&P, &x);
    tens h = t_new(&P, n, FSDP_DTYPE_BF16, 0.0f, 0), back = t_new(&P, n, FSDP_DTYPE_F32, 0.0f, 0);
    tens same = t_new(&P, n, FSDP_DTYPE_F32, 0.0f, 0);
    FSDP_OP(&P.oc, cast, h.c, FSDP_DTYPE_BF16, x.c, FSDP_DTYPE_F32, n);
    FSDP_OP(&P.og, cast, h.g, FSDP_DTYPE_BF16, x.g, FSDP_DTYPE_F32, n);
    FSDP_OP(&P.oc, cast, back.c, FSDP_DTYPE_F32, h.c, FSDP_DTYPE_BF16, n);
    FSDP_OP(&P.og, cast, back.g, FSDP_DTYPE_F32, h.g, FSDP_DTYPE_BF16, n);
    FSDP_OP(&P.oc, cast, same.c, FSDP_DTYPE_F32, x.c, FSDP_DTYPE_F32, n);
    FSDP_OP(&P.og, cast, same.g, FSDP_DTYPE_F32, x.g, FSDP_DTYPE_F32, n);
    gpu_done(&P);
    void *hb = malloc(n * 2);
    ck_assert_int_eq(fsdp_device_memcpy(&P.gpu, hb, h.g, n * 2, NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&P.gpu, P.gpu.compute), FSDP_STATUS_OK);
    ck_assert_msg(memcmp(hb, h.c, n * 2) == 0, "cast f32->bf16 differs from the cpu");
    free(hb);
    tens *cmp[] = {&back, &same};
    for (int k = 0; k < 2; k++) {
        float *c = t_get(&P, cmp[k], 0), *g = t_get(&P, cmp[k], 1);
        ck_assert_msg(memcmp(c, g, n * 4) == 0, "cast %d differs from the cpu", k);
        free(c);
        free(g);
    }
    /* sums of squares of finite values only */
    tens y = t_new(&P, n, FSDP_DTYPE_F32, 10.0f, 71);
    size_t nb = (n + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK;
    tens sq = t_new(&P, nb, FSDP_DTYPE_F32, 0.0f, 0);
    FSDP_OP(&P.oc, sumsq_blocks, sq.c, y.c, n);
    FSDP_OP(&P.og, sumsq_blocks, sq.g, y.g, n);
    gpu_done(&P);
    float *c = t_get(&P, &sq, 0), *g = t_get(&P, &sq, 1);
    ck_assert_msg(memcmp(c, g, nb * 4) == 0, "sumsq_blocks differs from the cpu (%.9g vs %.9g)",
                  g[0], c[0]);
    free(c);
    free(g);
    tens *all[] = {&x, &h, &back, &same, &y, &sq};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        t_free(&P, all[i]);
    pair_fini(&P);
}
END_TEST

/* ---- collectives ---------------------------------------------------------- */

enum { COMM_PEER = 0, COMM_NCCL = 1 };

struct coll_arg {
    int comm;                 /* COMM_PEER / COMM_NCCL */
    int spread;               /* rank r on GPU r % n_gpus (else all on GPU 0) */
    int n_gpus;
    fsdp_dtype dt;
    size_t numel;             /* per-rank chunk */
    int fault_rank;           /* -1: none */
    long fault_k;
    int big;                  /* one large all_reduce/reduce_scatter (chunked staging) */
    int issue_then_wait;      /* abort test: issue an all_reduce, then sync the stream */
    long mismatches[8];
    fsdp_status st[8];
};

/* The value rank r holds at element i. */
static float coll_val(fsdp_dtype dt, int r, size_t i)
{
    float v = fsdp_rng_normal(SEED, 100 + (uint64_t)r, i);
    return dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(fsdp_f32_to_bf16(v)) : v;
}

static float coll_round(fsdp_dtype dt, float v)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(fsdp_f32_to_bf16(v)) : v;
}

/* Reference: the tree sum over ranks of element i (AVG: times 1/N). */
static float coll_ref(fsdp_dtype dt, int n, size_t i, int avg)
{
    float v[8];
    for (int r = 0; r < n; r++)
        v[r] = coll_val(dt, r, i);
    float s = fsdp_tree_sum(v, n);
    if (avg)
        s = s * (1.0f / (float)n);
    return coll_round(dt, s);
}

static void host_to_dt(void *dst, fsdp_dtype dt, size_t i, float v)
{
    if (dt == FSDP_DTYPE_BF16)
        ((fsdp_bf16 *)dst)[i] = fsdp_f32_to_bf16(v);
    else
        ((float *)dst)[i] = v;
}

static float host_from_dt(const void *src, fsdp_dtype dt, size_t i)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(((const fsdp_bf16 *)src)[i])
                                 : ((const float *)src)[i];
}

/* Upload host values f(i) for i < n into device buffer d. */
static fsdp_status upload(fsdp_device *dev, void *d, fsdp_dtype dt, size_t n, int rank,
                          size_t base)
{
    size_t es = fsdp_dtype_size(dt);
    void *h = malloc(n * es + 1);
    if (!h)
        return fsdp_error_set(FSDP_STATUS_OOM, "test host buffer");
    for (size_t i = 0; i < n; i++)
        host_to_dt(h, dt, i, coll_val(dt, rank, base + i));
    fsdp_status st = fsdp_device_memcpy(dev, d, h, n * es, dev->comm);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_stream_sync(dev, dev->comm);
    free(h);
    return st;
}

static fsdp_status download(fsdp_device *dev, void *h, const void *d, size_t bytes)
{
    FSDP_TRY(fsdp_device_memcpy(dev, h, d, bytes, dev->comm));
    return fsdp_device_stream_sync(dev, dev->comm);
}

static fsdp_status coll_checks(struct coll_arg *a, fsdp_comm *c, fsdp_device *dev, int rank)
{
    const int N = c->n_ranks;
    const fsdp_dtype dt = a->dt;
    const size_t es = fsdp_dtype_size(dt), n = a->numel, full = n * (size_t)N;
    fsdp_status st = FSDP_STATUS_OK;
    void *send = NULL, *recv = NULL, *h = malloc(full * es + 1);
    long *bad = &a->mismatches[rank];
    const int exact = a->comm == COMM_PEER || N == 1;
    const float tol = dt == FSDP_DTYPE_BF16 ? 1e-2f : 1e-5f;
#define EXPECT(got, want)                                                                     \
    do {                                                                                      \
        float g_ = (got), w_ = (want);                                                        \
        if (exact ? memcmp(&g_, &w_, 4) != 0 : !(fabsf(g_ - w_) <= tol * (1.0f + fabsf(w_)))) \
            (*bad)++;                                                                         \
    } while (0)
    if (!h)
        return fsdp_error_set(FSDP_STATUS_OOM, "test host buffer");
    FSDP_CHECK(fsdp_device_alloc(dev, full * es, FSDP_MEM_COMM, "test send", &send));
    FSDP_CHECK(fsdp_device_alloc(dev, full * es, FSDP_MEM_COMM, "test recv", &recv));

    if (a->issue_then_wait) {
        /* abort test: queue a collective, then wait for it */
        FSDP_CHECK(upload(dev, send, dt, full, rank, 0));
        FSDP_CHECK(fsdp_comm_all_reduce(c, send, recv, full, dt, FSDP_REDUCE_SUM, NULL));
        FSDP_CHECK(fsdp_device_stream_sync(dev, dev->comm));
        FSDP_CHECK(fsdp_comm_all_reduce(c, send, recv, full, dt, FSDP_REDUCE_SUM, NULL));
        FSDP_CHECK(fsdp_device_stream_sync(dev, dev->comm));
        goto done;
    }
    if (a->big) {
        FSDP_CHECK(upload(dev, send, dt, full, rank, 0));
        FSDP_CHECK(fsdp_comm_reduce_scatter(c, send, recv, n, dt, FSDP_REDUCE_SUM, NULL));
        FSDP_CHECK(download(dev, h, recv, n * es));
        for (size_t i = 0; i < n; i += 997)
            EXPECT(host_from_dt(h, dt, i), coll_ref(dt, N, (size_t)rank * n + i, 0));
        FSDP_CHECK(fsdp_comm_all_reduce(c, send, send, full, dt, FSDP_REDUCE_SUM, NULL));
        FSDP_CHECK(download(dev, h, send, full * es));
        for (size_t i = 0; i < full; i += 997)
            EXPECT(host_from_dt(h, dt, i), coll_ref(dt, N, i, 0));
        goto done;
    }
    /* all_gather: out of place, then in place */
    FSDP_CHECK(upload(dev, send, dt, n, rank, 0));
    FSDP_CHECK(fsdp_comm_all_gather(c, send, recv, n, dt, NULL));
    FSDP_CHECK(download(dev, h, recv, full * es));
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < n; i++)
            EXPECT(host_from_dt(h, dt, (size_t)r * n + i), coll_val(dt, r, i));
    FSDP_CHECK(fsdp_device_memset(dev, recv, 0, full * es, dev->comm));
    FSDP_CHECK(upload(dev, (char *)recv + (size_t)rank * n * es, dt, n, rank, 0));
    FSDP_CHECK(fsdp_comm_all_gather(c, (char *)recv + (size_t)rank * n * es, recv, n, dt, NULL));
    FSDP_CHECK(download(dev, h, recv, full * es));
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < n; i++)
            EXPECT(host_from_dt(h, dt, (size_t)r * n + i), coll_val(dt, r, i));
    /* reduce_scatter, sum and avg */
    for (int avg = 0; avg < 2; avg++) {
        FSDP_CHECK(upload(dev, send, dt, full, rank, 0));
        FSDP_CHECK(fsdp_comm_reduce_scatter(c, send, recv, n, dt,
                                            avg ? FSDP_REDUCE_AVG : FSDP_REDUCE_SUM, NULL));
        FSDP_CHECK(download(dev, h, recv, n * es));
        for (size_t i = 0; i < n; i++)
            EXPECT(host_from_dt(h, dt, i), coll_ref(dt, N, (size_t)rank * n + i, avg));
    }
    /* all_reduce: out of place (sum), in place (avg); an odd size */
    size_t odd = full - 1 > 0 ? full - 1 : 1;
    FSDP_CHECK(upload(dev, send, dt, odd, rank, 0));
    FSDP_CHECK(fsdp_comm_all_reduce(c, send, recv, odd, dt, FSDP_REDUCE_SUM, NULL));
    FSDP_CHECK(download(dev, h, recv, odd * es));
    for (size_t i = 0; i < odd; i++)
        EXPECT(host_from_dt(h, dt, i), coll_ref(dt, N, i, 0));
    FSDP_CHECK(fsdp_comm_all_reduce(c, send, send, odd, dt, FSDP_REDUCE_AVG, NULL));
    FSDP_CHECK(download(dev, h, send, odd * es));
    for (size_t i = 0; i < odd; i++)
        EXPECT(host_from_dt(h, dt, i), coll_ref(dt, N, i, 1));
    /* broadcast from the last rank */
    FSDP_CHECK(upload(dev, send, dt, n, rank, 0));
    FSDP_CHECK(fsdp_comm_broadcast(c, send, n, dt, N - 1, NULL));
    FSDP_CHECK(download(dev, h, send, n * es));
    for (size_t i = 0; i < n; i++)
        EXPECT(host_from_dt(h, dt, i), coll_val(dt, N - 1, i));
    FSDP_CHECK(fsdp_comm_barrier(c));
#undef EXPECT
done:
fail:
    fsdp_device_free(dev, send);
    fsdp_device_free(dev, recv);
    free(h);
    return st;
}

static fsdp_status coll_rank(fsdp_world *w, int rank, void *arg)
{
    struct coll_arg *a = arg;
    fsdp_device dev;
    fsdp_comm c = {0};
    int have_comm = 0;
    int ordinal = a->spread ? rank % a->n_gpus : 0;
    fsdp_status st = fsdp_device_init(&dev, FSDP_BACKEND_CUDA, w, rank, ordinal, 0);
    if (st != FSDP_STATUS_OK) {
        a->st[rank] = st;
        return st;
    }
    st = a->comm == COMM_NCCL ? fsdp_comm_nccl_init(&c, w, &dev, rank)
                              : fsdp_comm_peer_init(&c, w, &dev, rank);
    if (st == FSDP_STATUS_OK) {
        have_comm = 1;
        st = coll_checks(a, &c, &dev, rank);
    }
    if (have_comm)
        fsdp_comm_fini(&c); /* before the device: NCCL kernels must be stopped first */
    fsdp_device_fini(&dev);
    a->st[rank] = st;
    return st;
}

static void run_coll(struct coll_arg *a, int n_ranks, fsdp_status want)
{
    fsdp_world *w;
    ck_assert_int_eq(fsdp_world_init(&w, n_ranks), FSDP_STATUS_OK);
    a->n_gpus = fsdp_cuda_device_count();
    if (a->fault_rank >= 0)
        fsdp_world_set_fault(w, FSDP_FAULT_COLLECTIVE, a->fault_rank, a->fault_k);
    double t0 = now_s();
    fsdp_status st = fsdp_world_launch(w, coll_rank, a);
    ck_assert_msg(st == want, "collectives over %d ranks: got %s, want %s: %s", n_ranks,
                  fsdp_status_name(st), fsdp_status_name(want), fsdp_error_msg());
    ck_assert_msg(now_s() - t0 < 60.0, "collectives took %.1f s", now_s() - t0);
    if (want == FSDP_STATUS_OK)
        for (int r = 0; r < n_ranks; r++)
            ck_assert_msg(a->mismatches[r] == 0, "rank %d: %ld values differ from the reference",
                          r, a->mismatches[r]);
    ck_assert_ptr_null(w->rdv_shared);
    fsdp_world_free(w);
}

/* _i: bit 0 = dtype, bit 1 = 4 ranks (else 1). */
START_TEST(test_peer_collectives)
{
    char name[64];
    snprintf(name, sizeof name, "test_peer_collectives(%d ranks, %s)", _i & 2 ? 4 : 1,
             _i & 1 ? "bf16" : "f32");
    NEED_GPU(name);
    struct coll_arg a = {.comm = COMM_PEER, .dt = (fsdp_dtype)(_i & 1), .numel = 1001,
                         .fault_rank = -1};
    run_coll(&a, _i & 2 ? 4 : 1, FSDP_STATUS_OK);
    if (fsdp_cuda_device_count() > 1) { /* the same across GPUs */
        struct coll_arg b = {.comm = COMM_PEER, .spread = 1, .dt = (fsdp_dtype)(_i & 1),
                             .numel = 1001, .fault_rank = -1};
        run_coll(&b, _i & 2 ? 4 : 1, FSDP_STATUS_OK);
    }
}
END_TEST

/* Larger than the staging buffer: the reduction goes in chunks. */
START_TEST(test_peer_collectives_chunked)
{
    NEED_GPU("test_peer_collectives_chunked");
    struct coll_arg a = {.comm = COMM_PEER, .dt = FSDP_DTYPE_F32, .numel = (size_t)9 << 20 >> 1,
                         .fault_rank = -1, .big = 1};
    run_coll(&a, 4, FSDP_STATUS_OK);
}
END_TEST

START_TEST(test_nccl_collectives)
{
    NEED_GPU(_i ? "test_nccl_collectives(bf16)" : "test_nccl_collectives(f32)");
    int n = fsdp_cuda_device_count();
    if (n > 4)
        n = 4;
    struct coll_arg a = {.comm = COMM_NCCL, .spread = 1, .dt = (fsdp_dtype)_i, .numel = 1001,
                         .fault_rank = -1};
    run_coll(&a, n, FSDP_STATUS_OK);
}
END_TEST

/* NCCL refuses two ranks on one GPU on every rank alike, without hanging. */
START_TEST(test_nccl_two_ranks_one_gpu_refused)
{
    NEED_GPU("test_nccl_two_ranks_one_gpu_refused");
    struct coll_arg a = {.comm = COMM_NCCL, .spread = 0, .dt = FSDP_DTYPE_F32, .numel = 16,
                         .fault_rank = -1};
    run_coll(&a, 2, FSDP_STATUS_UNSUPPORTED);
    ck_assert(strstr(fsdp_error_msg(), "--comm peer") != NULL);
    ck_assert_int_eq(a.st[0], FSDP_STATUS_UNSUPPORTED);
    ck_assert_int_eq(a.st[1], FSDP_STATUS_UNSUPPORTED);
}
END_TEST

START_TEST(test_peer_abort)
{
    NEED_GPU("test_peer_abort");
    struct coll_arg a = {.comm = COMM_PEER, .dt = FSDP_DTYPE_F32, .numel = 1001,
                         .fault_rank = 2, .fault_k = 3};
    run_coll(&a, 4, FSDP_STATUS_INTERNAL);
    ck_assert(strstr(fsdp_error_msg(), "injected") != NULL);
    for (int r = 0; r < 4; r++)
        if (r != 2)
            ck_assert_msg(a.st[r] == FSDP_STATUS_ABORTED, "rank %d: %s", r,
                          fsdp_status_name(a.st[r]));
}
END_TEST

/* NCCL abort: a rank fails while the others have queued their half of a
 * collective and wait for it on the GPU. Needs two GPUs. */
START_TEST(test_nccl_abort)
{
    NEED_GPU("test_nccl_abort");
    int n = fsdp_cuda_device_count();
    if (n < 2) {
        printf("SKIP: test_nccl_abort: needs 2 GPUs\n");
        fflush(stdout);
        return;
    }
    if (n > 4)
        n = 4;
    struct coll_arg a = {.comm = COMM_NCCL, .spread = 1, .dt = FSDP_DTYPE_F32, .numel = 4096,
                         .fault_rank = 1, .fault_k = 2, .issue_then_wait = 1};
    run_coll(&a, n, FSDP_STATUS_INTERNAL);
    for (int r = 0; r < n; r++)
        if (r != 1)
            ck_assert_msg(a.st[r] == FSDP_STATUS_ABORTED, "rank %d: %s", r,
                          fsdp_status_name(a.st[r]));
}
END_TEST

static Suite *cuda_suite(void)
{
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("everywhere");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_ops_table_complete);
    tcase_add_test(tc, test_cuda_init_or_clean_error);
    tcase_add_test(tc, test_rdv_exchange_and_abort);
    suite_add_tcase(s, tc);

    tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_embed, 0, 2);
    tcase_add_loop_test(tc, test_layernorm, 0, 2);
    tcase_add_loop_test(tc, test_matmul, 0, 2);
    tcase_add_loop_test(tc, test_gelu_residual_add, 0, 2);
    tcase_add_loop_test(tc, test_attention, 0, 2);
    tcase_add_loop_test(tc, test_xent, 0, 2);
    tcase_add_loop_test(tc, test_adamw_bit_exact, 0, 2);
    tcase_add_loop_test(tc, test_sgd_bit_exact, 0, 2);
    tcase_add_test(tc, test_cast_sumsq_bit_exact);
    suite_add_tcase(s, tc);

    tc = tcase_create("collectives");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_peer_collectives, 0, 4);
    tcase_add_test(tc, test_peer_collectives_chunked);
    tcase_add_loop_test(tc, test_nccl_collectives, 0, 2);
    tcase_add_test(tc, test_nccl_two_ranks_one_gpu_refused);
    tcase_add_test(tc, test_peer_abort);
    tcase_add_test(tc, test_nccl_abort);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    /* Nothing CUDA here: Check forks each test, and CUDA must not be
     * initialised in the parent. */
    SRunner *sr = srunner_create(cuda_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
