/*
 * cpu_ops.h - internal header shared by the cpu op files (src/ops/cpu/).
 *
 * The cpu backend computes every op in fp32 on the rank's team of threads
 * (device/cpu.h: --threads-per-device), with the GEMM libraries of blas.h
 * for the matrix products. Storage may be bf16 (ctx->dt); such inputs are
 * widened to fp32, computed in fp32, and outputs are rounded back to bf16 to
 * nearest even; where the CPU has bf16 dot-product instructions the linear
 * layers' products take the bf16 operands directly (fp32 accumulation).
 *
 * Threads never change results: an op splits its work into chunks fixed by
 * the shapes alone (rows, columns, heads, GEMM tiles along M or N, never
 * along a reduction), every chunk computes its outputs in a fixed order, and
 * the team only decides which thread runs which chunk. So the same inputs
 * give the same bits whatever the thread count, the call history or the
 * number of ranks.
 *
 * Scratch: widened bf16 operands and fp32 results waiting to be rounded live
 * in per-context host buffers held in ctx->backend, created lazily on first
 * use, grown as needed and freed by the table's fini slot. They are a
 * simulation artifact, not device memory: the device accounting (caps, peak
 * bytes) does not count them. Scratch is requested on the rank's thread,
 * before a parallel region; chunks that need their own share index it by
 * their worker number.
 */
#ifndef FSDP_OPS_CPU_CPU_OPS_H
#define FSDP_OPS_CPU_CPU_OPS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/bf16.h"
#include "device/cpu.h"
#include "ops/isa.h"
#include "ops/ops.h"

/* Scratch slots; an op uses distinct slots for buffers alive at once. */
typedef enum fsdp_cpu_slot {
    FSDP_CPU_SLOT_0 = 0,
    FSDP_CPU_SLOT_1,
    FSDP_CPU_SLOT_2,
    FSDP_CPU_SLOT_3,
    FSDP_CPU_SLOT_4,
    FSDP_CPU_SLOT_COUNT
} fsdp_cpu_slot;

/* An fp32 buffer of at least numel elements in slot `slot` of ctx's scratch,
 * creating the scratch state on first use. Contents are unspecified. Valid
 * until the next request for the same slot or fsdp_ops_fini. Op slots return
 * void, so when host memory runs out this records OOM for
 * fsdp_cpu_ops_sync_error and returns NULL; the op then returns at once,
 * leaving its outputs unspecified. */
float *fsdp_cpu_scratch(fsdp_op_ctx *ctx, fsdp_cpu_slot slot, size_t numel);

/* The first op failure since the last call (message set on the calling
 * thread), cleared; OK if none (the table's sync_error slot). */
fsdp_status fsdp_cpu_ops_sync_error(fsdp_op_ctx *ctx);

/* Free the scratch state (the table's fini slot). */
void fsdp_cpu_ops_fini(fsdp_op_ctx *ctx);

/* Record an op failure for sync_error (the first one since the last
 * sync_error wins), with the calling thread's error message. Rank thread
 * only. */
void fsdp_cpu_ops_fail(fsdp_op_ctx *ctx, fsdp_status st);

/* Threads of ctx's device team (1 outside the cpu backend). */
static inline int fsdp_cpu_threads(const fsdp_op_ctx *ctx)
{
    return ctx->dev ? fsdp_device_cpu_threads(ctx->dev) : 1;
}

/* Run task over n_chunks chunks on ctx's team (device/cpu.h); in order on
 * the calling thread when ctx has no device. */
void fsdp_cpu_parallel(fsdp_op_ctx *ctx, size_t n_chunks, fsdp_device_cpu_task task, void *arg);

/* A loop body over [begin, end) of an index range, run by `worker`. */
typedef void (*fsdp_cpu_range_fn)(void *arg, size_t begin, size_t end, int worker);

/* fn over [0, n) in chunks of `grain` indices (the last may be short) on
 * ctx's team; n <= grain runs inline. Chunk bounds depend on n and grain
 * only. */
void fsdp_cpu_parallel_range(fsdp_op_ctx *ctx, size_t n, size_t grain, fsdp_cpu_range_fn fn,
                             void *arg);

/* Elements per chunk for element-wise loops: big enough that waking a
 * thread (microseconds) is small against the work. */
#define FSDP_CPU_GRAIN ((size_t)1 << 15)

/* Whether the GEMM libraries loaded (blas.h); if not, records the error for
 * sync_error and returns false: the op must return at once. */
bool fsdp_cpu_gemm_ready(fsdp_op_ctx *ctx);

/* GEMMs on ctx's team (gemm.c). Row-major C (M, N) = alpha op(A) op(B) +
 * beta C, op(A) (M, K) (A stored (K, M) when ta), op(B) (K, N) (B stored
 * (N, K) when tb). The larger of M and N is split into tiles fixed by the
 * shape, each a single-threaded library call; K is never split. The
 * library: oneDNN when fsdp_cpu_blas_f32_dnnl() and alpha is 1, beta 0 or
 * 1 and K > 0, else OpenBLAS; a oneDNN failure is recorded for sync_error
 * (C unspecified). */
void fsdp_cpu_gemm(fsdp_op_ctx *ctx, bool ta, bool tb, int M, int N, int K, float alpha,
                   const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* How a product is tiled: tiles at least min_tile rows or columns wide (a
 * product under two of them is one tile), at most max_tiles of them. */
typedef struct fsdp_cpu_gemm_tiling {
    int min_tile, max_tiles;
} fsdp_cpu_gemm_tiling;

/* The backend's rule (gemm.c says why these sizes). */
#define FSDP_CPU_GEMM_TILING ((fsdp_cpu_gemm_tiling){.min_tile = 192, .max_tiles = 16})

/* The same with the library named: AUTO is the choice above; OPENBLAS and
 * ONEDNN (alpha 1, beta 0 or 1, K > 0; a build or CPU without it records
 * the failure) run every tile there, for tools that compare the two
 * (tools/bench_gemm.c). kernel (may be NULL): on oneDNN, its name for the
 * first tile's kernel, valid until the next GEMM on ctx. tiling: NULL for
 * the backend's, else another rule to compare it with. */
typedef enum fsdp_cpu_gemm_library {
    FSDP_CPU_GEMM_LIB_AUTO = 0,
    FSDP_CPU_GEMM_LIB_OPENBLAS,
    FSDP_CPU_GEMM_LIB_ONEDNN,
} fsdp_cpu_gemm_library;
void fsdp_cpu_gemm_lib(fsdp_op_ctx *ctx, fsdp_cpu_gemm_library lib, const char **kernel,
                       const fsdp_cpu_gemm_tiling *tiling, bool ta, bool tb, int M, int N,
                       int K, float alpha, const float *A, int lda, const float *B, int ldb,
                       float beta, float *C, int ldc);

/* The same with bf16 A and B and fp32 C, alpha = 1, beta 0 or 1, through
 * bf16 dot products (only when fsdp_cpu_blas_bf16_dot()). A failure is
 * recorded for sync_error (C unspecified). */
void fsdp_cpu_gemm_bf16(fsdp_op_ctx *ctx, bool ta, bool tb, int M, int N, int K,
                        const fsdp_bf16 *A, int lda, const fsdp_bf16 *B, int ldb, float beta,
                        float *C, int ldc);

/* How fsdp_cpu_gemm tiles an (M, N, K) product under rule (NULL: the
 * backend's): along M (*along_m) or N, *n_tiles tiles of *tile rows or
 * columns (the last may be short). */
void fsdp_cpu_gemm_tiles(int M, int N, int K, const fsdp_cpu_gemm_tiling *rule, bool *along_m,
                         int *tile, int *n_tiles);

/* Element i of a ctx->dt buffer, as fp32. */
static inline float fsdp_cpu_ld(const void *p, fsdp_dtype dt, size_t i)
{
    if (dt == FSDP_DTYPE_BF16)
        return fsdp_bf16_to_f32(((const fsdp_bf16 *)p)[i]);
    return ((const float *)p)[i];
}

/* Store x as element i of a buffer of dtype dt (bf16: round to nearest even). */
static inline void fsdp_cpu_st(void *p, fsdp_dtype dt, size_t i, float x)
{
    if (dt == FSDP_DTYPE_BF16)
        ((fsdp_bf16 *)p)[i] = fsdp_f32_to_bf16(x);
    else
        ((float *)p)[i] = x;
}

/* An optimizer's store of updated parameter i: p[i] = x and, when the step
 * writes a compute copy (p_out not NULL), element i of p_out in out_dt. */
static inline void fsdp_cpu_param_st(float *p, void *p_out, fsdp_dtype out_dt, size_t i, float x)
{
    p[i] = x;
    if (p_out)
        fsdp_cpu_st(p_out, out_dt, i, x);
}

/* The address of element i of a buffer of dtype dt; NULL for p NULL. */
static inline void *fsdp_cpu_at(void *p, fsdp_dtype dt, size_t i)
{
    return p ? (char *)p + i * fsdp_dtype_size(dt) : NULL;
}

/* dst = src widened (bf16 -> fp32) / rounded to nearest even (fp32 ->
 * bf16), n elements, on ctx's team. */
void fsdp_cpu_widen(fsdp_op_ctx *ctx, float *dst, const fsdp_bf16 *src, size_t n);
void fsdp_cpu_round(fsdp_op_ctx *ctx, fsdp_bf16 *dst, const float *src, size_t n);

/* An input of n elements in ctx->dt as fp32: src itself when fp32, else
 * its widened copy in scratch slot `slot` (NULL if scratch failed). */
const float *fsdp_cpu_in(fsdp_op_ctx *ctx, fsdp_cpu_slot slot, const void *src, size_t n);

/* Where to compute an output of n elements in fp32: dst itself when ctx->dt
 * is fp32, else scratch slot `slot` (NULL if scratch failed). Hand the
 * result to fsdp_cpu_out_done. */
float *fsdp_cpu_out(fsdp_op_ctx *ctx, fsdp_cpu_slot slot, void *dst, size_t n);

/* Finish an output from fsdp_cpu_out: round buf into dst when ctx->dt is
 * bf16 (nothing to do when fp32, buf == dst). */
void fsdp_cpu_out_done(fsdp_op_ctx *ctx, void *dst, const float *buf, size_t n);

/* The ops, one family per file; contracts in ops/ops.h. */
void fsdp_cpu_embed_fwd(fsdp_op_ctx *ctx, void *out, const int *tokens, const int *pos,
                        const void *wte, const void *wpe, int B, int T, int C);
void fsdp_cpu_embed_bwd(fsdp_op_ctx *ctx, float *dwte, float *dwpe, const float *dout,
                        const int *tokens, const int *pos, int B, int T, int C);
void fsdp_cpu_layernorm_fwd(fsdp_op_ctx *ctx, void *out, float *mean, float *rstd,
                            const void *inp, const void *w, const void *b, int N, int C);
void fsdp_cpu_layernorm_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, float *db,
                            const float *dout, const void *inp, const void *w, const float *mean,
                            const float *rstd, int N, int C);
void fsdp_cpu_matmul_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, const void *w,
                         const void *bias, int N, int C, int OC);
void fsdp_cpu_matmul_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, float *dbias,
                         const float *dout, const void *inp, const void *w, int N, int C, int OC);
void fsdp_cpu_lora_fwd(fsdp_op_ctx *ctx, void *out, int ld_out, void *u, int ld_u,
                       const void *inp, const void *A, const void *B, float scale, int N, int C,
                       int r, int OC);
void fsdp_cpu_lora_bwd(fsdp_op_ctx *ctx, float *dinp, float *dA, float *dB, float *dv, int ld_u,
                       const float *dout, int ld_dout, const void *inp, const void *u,
                       const void *A, const void *B, float scale, int N, int C, int r, int OC);
void fsdp_cpu_gelu_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, size_t n);
void fsdp_cpu_gelu_bwd(fsdp_op_ctx *ctx, float *dinp, const void *inp, const float *dout,
                       size_t n);
void fsdp_cpu_attention_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv, int B,
                            int T, int C, int NH);
void fsdp_cpu_attention_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                            const void *qkv, const void *att, int B, int T, int C, int NH);
void fsdp_cpu_residual_fwd(fsdp_op_ctx *ctx, void *out, const void *a, const void *b, size_t n);
void fsdp_cpu_xent_fwd_bwd(fsdp_op_ctx *ctx, float *losses, float *dlogits, const void *logits,
                           const int *targets, int N, int V, int Vp, float dloss);
void fsdp_cpu_adamw(fsdp_op_ctx *ctx, float *p, const float *grad, float *m, float *v, size_t n,
                    float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                    float grad_scale, void *p_out, fsdp_dtype out_dt);
void fsdp_cpu_sgd(fsdp_op_ctx *ctx, float *p, const float *grad, float *buf, size_t n, float lr,
                  float mu, float wd, float grad_scale, void *p_out, fsdp_dtype out_dt);
void fsdp_cpu_cast(fsdp_op_ctx *ctx, void *dst, fsdp_dtype ddt, const void *src, fsdp_dtype sdt,
                   size_t n);
void fsdp_cpu_nf4_dequant(fsdp_op_ctx *ctx, void *out, const uint8_t *codes, const float *absmax,
                          size_t n);
void fsdp_cpu_add(fsdp_op_ctx *ctx, float *dst, const float *a, const float *b, size_t n);
void fsdp_cpu_sumsq_blocks(fsdp_op_ctx *ctx, float *out, const float *x, size_t n);
void fsdp_cpu_rmsnorm_fwd(fsdp_op_ctx *ctx, void *out, float *rstd, const void *inp,
                          const void *w, float eps, int N, int C);
void fsdp_cpu_rmsnorm_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, const float *dout,
                          const void *inp, const void *w, const float *rstd, int N, int C);
void fsdp_cpu_rope_fwd(fsdp_op_ctx *ctx, void *x, const float *inv_freq, const int *pos, int B,
                       int T, int n_heads, int hd, int stride);
void fsdp_cpu_rope_bwd(fsdp_op_ctx *ctx, float *dx, const float *inv_freq, const int *pos, int B,
                       int T, int n_heads, int hd, int stride);
void fsdp_cpu_swiglu_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, int N, int IC);
void fsdp_cpu_swiglu_bwd(fsdp_op_ctx *ctx, float *dinp, const void *inp, const float *dout, int N,
                         int IC);
void fsdp_cpu_attention_gqa_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv,
                                const int *pos, int B, int T, int NH, int NKV, int hd);
void fsdp_cpu_attention_gqa_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                                const void *qkv, const void *att, int B, int T, int NH, int NKV,
                                int hd);

/* The FLOPs of attention_gqa_fwd's products (QK^T and att V over the
 * causal blocks it runs, 2 per multiply-add) for B x NH query heads of hd
 * channels at T positions without a position array; its backward's four
 * products run twice as many. For tools/bench_ops and tools/bench_gemm. */
double fsdp_cpu_attention_flops(int B, int T, int NH, int hd);

/* nf4_dequant's kernel for one instruction set (FSDP_CPU_ISA_COUNT: the
 * best supported; a level without its own kernel runs the next lower one),
 * on the calling thread: out (dt) from n elements' codes and absmax, n a
 * multiple of FSDP_NF4_BLOCK. For tests and tools/bench_ops, which compare
 * the levels; the op itself always runs the best one. */
void fsdp_cpu_nf4_dequant_isa(fsdp_cpu_isa isa, void *out, fsdp_dtype dt, const uint8_t *codes,
                              const float *absmax, size_t n);

#endif /* FSDP_OPS_CPU_CPU_OPS_H */
