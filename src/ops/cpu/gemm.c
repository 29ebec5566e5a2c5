/*
 * gemm.c - matrix products on the rank's team of threads.
 *
 * A product is split into tiles along the larger output dimension (rows M
 * or columns N of C), with tile sizes that depend on the shape only; each
 * tile is one single-threaded library call (blas.h: a oneDNN matmul
 * primitive, made once per tile shape, or OpenBLAS sgemm where oneDNN does
 * not run fp32 products). The reduction dimension K is never split, and
 * a tile computes the same call whichever thread runs it, so C's bits do not
 * depend on the thread count. Small products are one tile.
 *
 * Tiles are multiples of 64 rows or columns, at least 192 wide and at most
 * 16 to a product. Each tile re-packs the other operand (the price of
 * tiling): on a Sapphire Rapids core the Llama bench step's forward and
 * input-gradient GEMMs took 6% less time in such tiles than in tiles of
 * 128 (at most 32), its weight-gradient GEMMs 4% less (docs/figures.md);
 * 192 rather than 256 keeps 768 wide products in 4 tiles, even work for
 * teams of 2 and 4. A product whose longer side is under 384 is one tile.
 */
#include <stdatomic.h>
#include <stdio.h>

#include "ops/cpu/blas.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/cpu_state.h"

#define GEMM_MIN_FLOP (4.0 * 1024 * 1024) /* below this, one tile */
#define GEMM_TILE_ALIGN 64

void fsdp_cpu_gemm_tiles(int M, int N, int K, const fsdp_cpu_gemm_tiling *rule, bool *along_m,
                         int *tile, int *n_tiles)
{
    fsdp_cpu_gemm_tiling r = rule ? *rule : FSDP_CPU_GEMM_TILING;
    *along_m = M >= N;
    int L = *along_m ? M : N;
    *tile = L > 0 ? L : 1;
    *n_tiles = 1;
    if (2.0 * M * N * (K > 0 ? K : 1) < GEMM_MIN_FLOP || L < 2 * r.min_tile)
        return;
    int want = L / r.min_tile;
    if (want > r.max_tiles)
        want = r.max_tiles;
    int t = (L + want - 1) / want;
    t = (t + GEMM_TILE_ALIGN - 1) / GEMM_TILE_ALIGN * GEMM_TILE_ALIGN;
    *tile = t;
    *n_tiles = (L + t - 1) / t;
}

bool fsdp_cpu_gemm_ready(fsdp_op_ctx *ctx)
{
    fsdp_status st = fsdp_cpu_blas_status();
    if (st == FSDP_STATUS_OK)
        return true;
    fsdp_cpu_ops_fail(ctx, st);
    return false;
}

typedef struct gemm_job {
    bool ta, tb, along_m;
    int M, N, K, lda, ldb, ldc, tile;
    float alpha, beta;
    const void *A, *B;
    float *C;
    size_t esize; /* bytes per element of A and B */
    /* oneDNN only */
    fsdp_cpu_dnnl *dnnl;
    fsdp_cpu_dnnl_prim *prim_full, *prim_tail;
    int n_tiles;
    atomic_int failed;
    char msg[FSDP_ERROR_MSG_MAX];
} gemm_job;

/* Tile k's pointers and extent: rows [i0, i0 + m) of C, or columns. */
static void tile_of(const gemm_job *j, size_t k, const char **A, const char **B, float **C,
                    int *m, int *n)
{
    int o = (int)k * j->tile;
    int L = j->along_m ? j->M : j->N;
    int w = L - o < j->tile ? L - o : j->tile;
    *A = j->A;
    *B = j->B;
    *C = j->C;
    *m = j->M;
    *n = j->N;
    if (j->along_m) {
        *A += (size_t)o * (j->ta ? 1 : (size_t)j->lda) * j->esize;
        *C += (size_t)o * j->ldc;
        *m = w;
    } else {
        *B += (size_t)o * (j->tb ? (size_t)j->ldb : 1) * j->esize;
        *C += o;
        *n = w;
    }
}

/* ---- OpenBLAS --------------------------------------------------------------- */

static void sgemm_tile(void *arg, size_t k, int worker)
{
    const gemm_job *j = arg;
    const char *A, *B;
    float *C;
    int m, n;
    tile_of(j, k, &A, &B, &C, &m, &n);
    fsdp_cpu_blas_sgemm(j->ta, j->tb, m, n, j->K, j->alpha, (const float *)A, j->lda,
                        (const float *)B, j->ldb, j->beta, C, j->ldc);
}

/* ---- oneDNN ----------------------------------------------------------------- */

static void dnnl_tile(void *arg, size_t k, int worker)
{
    gemm_job *j = arg;
    const char *A, *B;
    float *C;
    int m, n;
    tile_of(j, k, &A, &B, &C, &m, &n);
    const fsdp_cpu_dnnl_prim *p = (int)k == j->n_tiles - 1 ? j->prim_tail : j->prim_full;
    fsdp_status st = fsdp_cpu_dnnl_run(j->dnnl, p, worker, A, B, C);
    int expect = 0;
    if (st != FSDP_STATUS_OK && atomic_compare_exchange_strong(&j->failed, &expect, (int)st))
        snprintf(j->msg, sizeof j->msg, "%s", fsdp_error_msg());
}

/* Job j (tiled, alpha 1, K > 0) through oneDNN: the primitives for a full
 * tile and for the last (maybe short) one, prepared on this thread, then
 * the tiles on the team; f32: A and B are fp32, else bf16. kernel (may be
 * NULL): oneDNN's name for the first tile's kernel. */
static void dnnl_gemm(fsdp_op_ctx *ctx, gemm_job *j, bool f32, const char **kernel)
{
    struct fsdp_cpu_ops_state *s = fsdp_cpu_state(ctx);
    int L = j->along_m ? j->M : j->N, last = L - (j->n_tiles - 1) * j->tile;
    fsdp_cpu_dnnl_shape sh = {.f32 = f32, .ta = j->ta, .tb = j->tb, .M = j->M, .N = j->N,
                              .K = j->K, .lda = j->lda, .ldb = j->ldb, .ldc = j->ldc,
                              .beta = j->beta};
    int workers = fsdp_cpu_threads(ctx);
    fsdp_status st = FSDP_STATUS_OK;
    if (j->n_tiles > 1) {
        *(j->along_m ? &sh.M : &sh.N) = j->tile;
        st = fsdp_cpu_dnnl_prepare(&s->dnnl, &sh, workers, &j->prim_full);
    }
    *(j->along_m ? &sh.M : &sh.N) = last;
    if (st == FSDP_STATUS_OK)
        st = fsdp_cpu_dnnl_prepare(&s->dnnl, &sh, workers, &j->prim_tail);
    if (st != FSDP_STATUS_OK) {
        fsdp_cpu_ops_fail(ctx, st);
        return;
    }
    j->dnnl = s->dnnl;
    if (kernel)
        *kernel = fsdp_cpu_dnnl_impl(j->prim_full ? j->prim_full : j->prim_tail);
    fsdp_cpu_parallel(ctx, (size_t)j->n_tiles, dnnl_tile, j);
    if (atomic_load(&j->failed)) {
        fsdp_error_set((fsdp_status)atomic_load(&j->failed), "%s", j->msg);
        fsdp_cpu_ops_fail(ctx, (fsdp_status)atomic_load(&j->failed));
    }
}

/* ---- entry points ----------------------------------------------------------- */

void fsdp_cpu_gemm_lib(fsdp_op_ctx *ctx, fsdp_cpu_gemm_library lib, const char **kernel,
                       const fsdp_cpu_gemm_tiling *tiling, bool ta, bool tb, int M, int N,
                       int K, float alpha, const float *A, int lda, const float *B, int ldb,
                       float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0 || !fsdp_cpu_gemm_ready(ctx))
        return;
    gemm_job j = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb,
                  .ldc = ldc, .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C,
                  .esize = sizeof(float)};
    fsdp_cpu_gemm_tiles(M, N, K, tiling, &j.along_m, &j.tile, &j.n_tiles);
    if (lib == FSDP_CPU_GEMM_LIB_AUTO)
        lib = alpha == 1.0f && K > 0 && (beta == 0.0f || beta == 1.0f) &&
                      fsdp_cpu_blas_f32_dnnl()
                  ? FSDP_CPU_GEMM_LIB_ONEDNN
                  : FSDP_CPU_GEMM_LIB_OPENBLAS;
    if (lib == FSDP_CPU_GEMM_LIB_ONEDNN)
        dnnl_gemm(ctx, &j, true, kernel);
    else
        fsdp_cpu_parallel(ctx, (size_t)j.n_tiles, sgemm_tile, &j);
}

void fsdp_cpu_gemm(fsdp_op_ctx *ctx, bool ta, bool tb, int M, int N, int K, float alpha,
                   const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    fsdp_cpu_gemm_lib(ctx, FSDP_CPU_GEMM_LIB_AUTO, NULL, NULL, ta, tb, M, N, K, alpha, A, lda, B,
                      ldb, beta, C, ldc);
}

void fsdp_cpu_gemm_bf16(fsdp_op_ctx *ctx, bool ta, bool tb, int M, int N, int K,
                        const fsdp_bf16 *A, int lda, const fsdp_bf16 *B, int ldb, float beta,
                        float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    gemm_job j = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb,
                  .ldc = ldc, .alpha = 1.0f, .beta = beta, .A = A, .B = B, .C = C,
                  .esize = sizeof(fsdp_bf16)};
    fsdp_cpu_gemm_tiles(M, N, K, NULL, &j.along_m, &j.tile, &j.n_tiles);
    dnnl_gemm(ctx, &j, false, NULL);
}
