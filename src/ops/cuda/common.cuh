/*
 * common.cuh - what the cuda op files share: the per-rank backend state
 * (cuBLAS handle, workspace, scratch, first error), bf16 load/store helpers,
 * warp reductions with a fixed order, and the launch helpers every op uses.
 *
 * Internal to src/ops/cuda/. Assumes the rank thread already called
 * cudaSetDevice (fsdp_device_init does). Nothing here is process-global:
 * every handle and buffer hangs off fsdp_op_ctx.backend.
 *
 * Ops return void (the slots of fsdp_ops_i), so a failure is recorded in the
 * state (first one wins) and reported by the table's sync_error slot; after
 * a failure, ops that need scratch or cuBLAS skip their work.
 */
#ifndef FSDP_OPS_CUDA_COMMON_CUH
#define FSDP_OPS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "device/cuda_check.h"
#include "ops/ops.h"

/* LayerNorm epsilon (GPT-2). */
#define FSDP_CUDA_LN_EPS 1e-5
/* cuBLAS workspace per rank (Hopper wants 32 MiB for its best kernels). */
#define FSDP_CUDA_BLAS_WS_BYTES ((size_t)32 << 20)
/* Most elements a low-precision staging copy of an fp32 operand may hold
 * (matmul backward casts dout to bf16 in row chunks of at most this size). */
#define FSDP_CUDA_LOWP_CHUNK_NUMEL ((size_t)32 << 20)

typedef struct fsdp_ops_cuda_state {
    cublasHandle_t blas;        /* bound to ctx->stream */
    void *blas_ws;              /* cuBLAS workspace (device, own), FSDP_CUDA_BLAS_WS_BYTES */
    void *scratch;              /* op scratch (device, own), grown on demand */
    size_t scratch_bytes;
    int n_sms;
    fsdp_status err;            /* first failure, FSDP_STATUS_OK if none */
    char err_msg[FSDP_ERROR_MSG_MAX];
} fsdp_ops_cuda_state;

static inline fsdp_ops_cuda_state *fsdp_ops_cuda_st(fsdp_op_ctx *ctx)
{
    return (fsdp_ops_cuda_state *)ctx->backend;
}

static inline cudaStream_t fsdp_ops_cuda_stream(fsdp_op_ctx *ctx)
{
    return (cudaStream_t)ctx->stream;
}

/* Record a failure of op `op` (first one wins; later ones are dropped). */
void fsdp_ops_cuda_fail(fsdp_op_ctx *ctx, fsdp_status st, const char *op, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* True if ops may run (no failure recorded yet). */
static inline bool fsdp_ops_cuda_ok(fsdp_op_ctx *ctx)
{
    return fsdp_ops_cuda_st(ctx)->err == FSDP_STATUS_OK;
}

/* After a kernel launch: record cudaGetLastError() if it is an error.
 * Returns true when the launch succeeded. */
bool fsdp_ops_cuda_launched(fsdp_op_ctx *ctx, const char *op);

/* Device scratch of at least `bytes` for the op running now, valid until
 * the next op on ctx->stream. Growing (first steps only) hands the old
 * buffer back to the device's cache, stream-ordered, without a sync.
 * Returns NULL (and records OOM) on failure. */
void *fsdp_ops_cuda_scratch(fsdp_op_ctx *ctx, size_t bytes, const char *op);

/* C (m x n, column-major, ldc, type ctype) = alpha op(A) op(B) + beta C for
 * `batch` matrices at strides sA/sB/sC (elements), A and B of type abtype,
 * accumulated in fp32 (CUBLAS_COMPUTE_32F: no TF32, so fp32 GEMMs stay
 * precise). Returns false (recorded) on failure. */
bool fsdp_ops_cuda_gemm(fsdp_op_ctx *ctx, const char *op, bool transa, bool transb, int m, int n,
                        int k, float alpha, const void *A, int lda, long long sA, const void *B,
                        int ldb, long long sB, float beta, void *C, fsdp_dtype ctype, int ldc,
                        long long sC, int batch, fsdp_dtype abtype);

/* Column sums of an fp32 matrix x (rows, cols), row-major, added into
 * dst[cols] (dst += sum over rows) in a fixed order: partial sums over
 * fixed row chunks (rows in order within a thread, threads combined in
 * order), then the chunks in order. Deterministic. */
void fsdp_ops_cuda_colsum(fsdp_op_ctx *ctx, const char *op, float *dst, const float *x, int rows,
                          int cols);

/* Convert n fp32 values to bf16 (round to nearest even) on ctx->stream. */
void fsdp_ops_cuda_f32_to_bf16(fsdp_op_ctx *ctx, const char *op, __nv_bfloat16 *dst,
                               const float *src, size_t n);

/* Grid for a grid-stride loop over n elements with `threads` per block. */
static inline unsigned fsdp_ops_cuda_grid(fsdp_op_ctx *ctx, size_t n, unsigned threads)
{
    size_t want = (n + threads - 1) / threads;
    size_t cap = (size_t)fsdp_ops_cuda_st(ctx)->n_sms * 32;
    if (want > cap)
        want = cap;
    return want ? (unsigned)want : 1u;
}

/* Grid of 256-thread blocks for kernels that run one warp per row
 * (fsdp_cu_warp_row): rows warps. */
static inline unsigned fsdp_ops_cuda_warp_grid(size_t rows)
{
    return (unsigned)((rows * 32 + 255) / 256);
}

/* The launcher of an elementwise op over n elements: nothing when n is 0
 * or an op on ctx failed before; else launch(grid, stream) with a
 * grid-stride grid of 256-thread blocks on ctx's stream, then the launch's
 * error recorded under `op` (the kernels take blockDim 256). */
template <typename Launch>
static inline void fsdp_ops_cuda_elementwise(fsdp_op_ctx *ctx, const char *op, size_t n,
                                             Launch launch)
{
    if (!n || !fsdp_ops_cuda_ok(ctx))
        return;
    launch(fsdp_ops_cuda_grid(ctx, n, 256), fsdp_ops_cuda_stream(ctx));
    fsdp_ops_cuda_launched(ctx, op);
}

/* The launcher of a one-warp-per-row op over an (N, C) matrix: nothing when
 * N or C is not positive or an op on ctx failed before; else launch(grid,
 * stream) with fsdp_ops_cuda_warp_grid(N) on ctx's stream, then the
 * launch's error recorded under `op`. Returns whether it launched. */
template <typename Launch>
static inline bool fsdp_ops_cuda_rows(fsdp_op_ctx *ctx, const char *op, int N, int C,
                                      Launch launch)
{
    if (N <= 0 || C <= 0 || !fsdp_ops_cuda_ok(ctx))
        return false;
    launch(fsdp_ops_cuda_warp_grid((size_t)N), fsdp_ops_cuda_stream(ctx));
    return fsdp_ops_cuda_launched(ctx, op);
}

/* How a column reduction over `rows` rows is cut into chunks (the weight
 * gradients of the norms, fsdp_ops_cuda_colsum): returns the chunk count,
 * rows per chunk in *rows_per. It depends on the shape only, so the sums do
 * not depend on the GPU model (docs/determinism.md). rows > 0. */
static inline int fsdp_ops_cuda_row_chunks(int rows, int *rows_per)
{
    int n_chunks = (rows + 63) / 64;
    if (n_chunks > 256)
        n_chunks = 256;
    *rows_per = (rows + n_chunks - 1) / n_chunks;
    return (rows + *rows_per - 1) / *rows_per;
}

/* ---- device helpers ------------------------------------------------------ */

/* The row of a kernel that runs one warp per row: this thread's warp
 * across the grid (its lane is threadIdx.x % 32). */
__device__ __forceinline__ int fsdp_cu_warp_row()
{
    return (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32);
}

/* The prologue of a kernel that runs one warp per row of an (N, C) matrix:
 * this warp's row, this thread's lane and the row's first element; false
 * (the thread has nothing to do) past the last row. */
__device__ __forceinline__ bool fsdp_cu_warp_row_of(int N, int C, int *row, int *lane,
                                                    size_t *off)
{
    *row = fsdp_cu_warp_row();
    *lane = threadIdx.x % 32;
    *off = (size_t)*row * C;
    return *row < N;
}

/* fp32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN with the
 * same bit pattern core/bf16.h produces, so cpu and cuda casts agree bit for
 * bit. */
__device__ __forceinline__ __nv_bfloat16 fsdp_cu_f2bf(float f)
{
    uint32_t u = __float_as_uint(f);
    uint16_t h;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        h = (uint16_t)((u >> 16) | 0x40u);
    else
        h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return __ushort_as_bfloat16(h);
}

__device__ __forceinline__ float fsdp_cu_bf2f(__nv_bfloat16 h)
{
    return __uint_as_float((uint32_t)__bfloat16_as_ushort(h) << 16);
}

/* Load element i as fp32 / store fp32 into element i of a T buffer. */
__device__ __forceinline__ float fsdp_cu_ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float fsdp_cu_ld(const __nv_bfloat16 *p, size_t i)
{
    return fsdp_cu_bf2f(p[i]);
}
__device__ __forceinline__ void fsdp_cu_st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void fsdp_cu_st(__nv_bfloat16 *p, size_t i, float v)
{
    p[i] = fsdp_cu_f2bf(v);
}

/* Warp reductions: xor butterfly, the same order on every run. */
__device__ __forceinline__ float fsdp_cu_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The same in double (the norms' and xent's statistics). */
__device__ __forceinline__ double fsdp_cu_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float fsdp_cu_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Column sums in a fixed order (fsdp_ops_cuda_colsum; the norms' weight
 * gradients), in two kernels. A partial kernel runs blocks of (32, 8)
 * threads, one per chunk of rows (fsdp_ops_cuda_row_chunks): block (bx, by)
 * sums columns [32 bx, 32 bx + 32) over rows [by rows_per, (by + 1)
 * rows_per), thread (tx, ty) taking rows ty, ty + 8, ... in order; the 8
 * lanes of a column are then added in ty order. A finish kernel adds the
 * chunks' sums in chunk order, one thread a column. */

/* A partial kernel's column for this thread, and its chunk's rows [*r0, *r1). */
__device__ __forceinline__ int fsdp_cu_colsum_span(int rows, int rows_per, int *r0, int *r1)
{
    *r0 = blockIdx.y * rows_per;
    *r1 = min(rows, *r0 + rows_per);
    return blockIdx.x * 32 + threadIdx.x;
}

/* A partial kernel's end, reached by every thread of the block: s is this
 * lane's sum for column c; the 8 lanes' sum goes to partial[by][c]. acc is
 * the block's __shared__ float[8][33]. */
__device__ __forceinline__ void fsdp_cu_colsum_lanes(float (*acc)[33], float s, float *partial,
                                                     int c, int cols)
{
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = acc[0][threadIdx.x];
        for (int k = 1; k < 8; k++)
            t += acc[k][threadIdx.x];
        partial[(size_t)blockIdx.y * cols + c] = t;
    }
}

/* A finish kernel's work: dst[c] += the sum over chunks k = 0 .. n_chunks - 1
 * (in order) of partial[k][c], c this thread's column. */
__device__ __forceinline__ void fsdp_cu_colsum_chunks(float *dst, const float *partial,
                                                      int n_chunks, int cols)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols)
        return;
    float t = 0.0f;
    for (int k = 0; k < n_chunks; k++)
        t += partial[(size_t)k * cols + c];
    dst[c] += t;
}

/* Call f.template operator()<T>() with T = float or __nv_bfloat16 for dt. */
#define FSDP_CUDA_DISPATCH(dt, T, ...)                                  \
    do {                                                                \
        if ((dt) == FSDP_DTYPE_BF16) {                                  \
            typedef __nv_bfloat16 T;                                    \
            __VA_ARGS__;                                                \
        } else {                                                        \
            typedef float T;                                            \
            __VA_ARGS__;                                                \
        }                                                               \
    } while (0)

/* ---- the op launchers (one file per family) ---------------------------- */

void fsdp_ops_cuda_embed_fwd(fsdp_op_ctx *ctx, void *out, const int *tokens, const int *pos,
                             const void *wte, const void *wpe, int B, int T, int C);
void fsdp_ops_cuda_embed_bwd(fsdp_op_ctx *ctx, float *dwte, float *dwpe, const float *dout,
                             const int *tokens, const int *pos, int B, int T, int C);
void fsdp_ops_cuda_layernorm_fwd(fsdp_op_ctx *ctx, void *out, float *mean, float *rstd,
                                 const void *inp, const void *w, const void *b, int N, int C);
void fsdp_ops_cuda_layernorm_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, float *db,
                                 const float *dout, const void *inp, const void *w,
                                 const float *mean, const float *rstd, int N, int C);
void fsdp_ops_cuda_matmul_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, const void *w,
                              const void *bias, int N, int C, int OC);
void fsdp_ops_cuda_matmul_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, float *dbias,
                              const float *dout, const void *inp, const void *w, int N, int C,
                              int OC);
void fsdp_ops_cuda_lora_fwd(fsdp_op_ctx *ctx, void *out, int ld_out, void *u, int ld_u,
                            const void *inp, const void *A, const void *B, float scale, int N,
                            int C, int r, int OC);
void fsdp_ops_cuda_lora_bwd(fsdp_op_ctx *ctx, float *dinp, float *dA, float *dB, float *dv,
                            int ld_u, const float *dout, int ld_dout, const void *inp,
                            const void *u, const void *A, const void *B, float scale, int N,
                            int C, int r, int OC);
void fsdp_ops_cuda_gelu_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, size_t n);
void fsdp_ops_cuda_gelu_bwd(fsdp_op_ctx *ctx, float *dinp, const void *inp, const float *dout,
                            size_t n);
void fsdp_ops_cuda_attention_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv, int B,
                                 int T, int C, int NH);
void fsdp_ops_cuda_attention_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                                 const void *qkv, const void *att, int B, int T, int C, int NH);
void fsdp_ops_cuda_residual_fwd(fsdp_op_ctx *ctx, void *out, const void *a, const void *b,
                                size_t n);
void fsdp_ops_cuda_add(fsdp_op_ctx *ctx, float *dst, const float *a, const float *b, size_t n);
void fsdp_ops_cuda_xent_fwd_bwd(fsdp_op_ctx *ctx, float *losses, float *dlogits,
                                const void *logits, const int *targets, int N, int V, int Vp,
                                float dloss);
void fsdp_ops_cuda_adamw(fsdp_op_ctx *ctx, float *p, const float *grad, float *m, float *v,
                         size_t n, float lr, float b1, float b2, float eps, float wd, float bc1,
                         float bc2, float grad_scale, void *p_out, fsdp_dtype out_dt);
void fsdp_ops_cuda_sgd(fsdp_op_ctx *ctx, float *p, const float *grad, float *buf, size_t n,
                       float lr, float mu, float wd, float grad_scale, void *p_out,
                       fsdp_dtype out_dt);
void fsdp_ops_cuda_cast(fsdp_op_ctx *ctx, void *dst, fsdp_dtype ddt, const void *src,
                        fsdp_dtype sdt, size_t n);
void fsdp_ops_cuda_nf4_dequant(fsdp_op_ctx *ctx, void *out, const uint8_t *codes,
                               const float *absmax, size_t n);
void fsdp_ops_cuda_sumsq_blocks(fsdp_op_ctx *ctx, float *out, const float *x, size_t n);
void fsdp_ops_cuda_rmsnorm_fwd(fsdp_op_ctx *ctx, void *out, float *rstd, const void *inp,
                               const void *w, float eps, int N, int C);
void fsdp_ops_cuda_rmsnorm_bwd(fsdp_op_ctx *ctx, float *dinp, float *dw, const float *dout,
                               const void *inp, const void *w, const float *rstd, int N, int C);
void fsdp_ops_cuda_rope_fwd(fsdp_op_ctx *ctx, void *x, const float *inv_freq, const int *pos,
                            int B, int T, int n_heads, int hd, int stride);
void fsdp_ops_cuda_rope_bwd(fsdp_op_ctx *ctx, float *dx, const float *inv_freq, const int *pos,
                            int B, int T, int n_heads, int hd, int stride);
void fsdp_ops_cuda_swiglu_fwd(fsdp_op_ctx *ctx, void *out, const void *inp, int N, int IC);
void fsdp_ops_cuda_swiglu_bwd(fsdp_op_ctx *ctx, float *dinp, const void *inp, const float *dout,
                              int N, int IC);
void fsdp_ops_cuda_attention_gqa_fwd(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv,
                                     const int *pos, int B, int T, int NH, int NKV, int hd);
void fsdp_ops_cuda_attention_gqa_bwd(fsdp_op_ctx *ctx, float *dqkv, float *datt,
                                     const float *dout, const void *qkv, const void *att, int B,
                                     int T, int NH, int NKV, int hd);

#endif /* FSDP_OPS_CUDA_COMMON_CUH */
