/*
 * registry.cu - the cuda op table and the per-rank state behind it: the
 * cuBLAS handle (bound to the rank's compute stream, with its own
 * workspace), the op scratch, the first recorded failure; plus the helpers
 * every op file shares (GEMM wrapper, deterministic column sums, fp32->bf16
 * staging).
 *
 * One state per fsdp_op_ctx, created by fsdp_ops_cuda_init on the rank's
 * thread after fsdp_device_init (which called cudaSetDevice). The cuBLAS
 * workspace and the scratch are the backend's own buffers
 * (fsdp_cuda_device_alloc_own): they come from the device's block cache
 * and show in its reserved bytes, not in the bytes in use, which stay
 * exactly what the cpu backend and the planner count.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "device/cuda_device.h"
#include "ops/cuda/common.cuh"

/* ---- kernels -------------------------------------------------------------- */

/* Column sums (common.cuh's scheme): partial sums of each chunk of rows,
 * then the chunks in order. */
__global__ void colsum_partial_kernel(float *partial, const float *x, int rows, int cols,
                                      int rows_per)
{
    __shared__ float acc[8][33];
    int r0, r1;
    const int c = fsdp_cu_colsum_span(rows, rows_per, &r0, &r1);
    float s = 0.0f;
    if (c < cols)
        for (int r = r0 + threadIdx.y; r < r1; r += 8)
            s += x[(size_t)r * cols + c];
    fsdp_cu_colsum_lanes(acc, s, partial, c, cols);
}

__global__ void colsum_finish_kernel(float *dst, const float *partial, int n_chunks, int cols)
{
    fsdp_cu_colsum_chunks(dst, partial, n_chunks, cols);
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = fsdp_cu_f2bf(src[i]);
}

/* ---- shared helpers ------------------------------------------------------- */

void fsdp_ops_cuda_fail(fsdp_op_ctx *ctx, fsdp_status st, const char *op, const char *fmt, ...)
{
    fsdp_ops_cuda_state *s = fsdp_ops_cuda_st(ctx);
    if (s->err != FSDP_STATUS_OK)
        return;
    char detail[FSDP_ERROR_MSG_MAX / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    s->err = st;
    snprintf(s->err_msg, sizeof s->err_msg, "cuda op %s on rank %d (GPU %d): %s", op,
             ctx->dev->rank, ctx->dev->ordinal, detail);
}

bool fsdp_ops_cuda_launched(fsdp_op_ctx *ctx, const char *op)
{
    /* Reading clears it; every other failed call clears its own (cuda_check.h),
     * so an error here is this launch's (or a sticky one from an earlier kernel). */
    cudaError_t rc = cudaGetLastError();
    if (rc == cudaSuccess)
        return true;
    fsdp_ops_cuda_fail(ctx, FSDP_STATUS_CUDA, op, "kernel launch failed: %s",
                       cudaGetErrorString(rc));
    return false;
}

void *fsdp_ops_cuda_scratch(fsdp_op_ctx *ctx, size_t bytes, const char *op)
{
    fsdp_ops_cuda_state *s = fsdp_ops_cuda_st(ctx);
    if (s->err != FSDP_STATUS_OK)
        return NULL;
    if (bytes <= s->scratch_bytes)
        return s->scratch;
    /* Queued kernels may still read the old buffer: the device's cache
     * keeps it until they are done (stream-ordered free, no sync here). */
    fsdp_cuda_device_free_own(ctx->dev, s->scratch);
    s->scratch = NULL;
    s->scratch_bytes = 0;
    size_t want = bytes + bytes / 4; /* some headroom: shapes grow in steps */
    void *p = NULL;
    fsdp_status st = fsdp_cuda_device_alloc_own(ctx->dev, want, "cuda op scratch", &p);
    if (st != FSDP_STATUS_OK) {
        fsdp_ops_cuda_fail(ctx, st, op, "%s", fsdp_error_msg());
        return NULL;
    }
    s->scratch = p;
    s->scratch_bytes = want;
    return p;
}

static cudaDataType_t cuda_type(fsdp_dtype dt)
{
    return dt == FSDP_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

bool fsdp_ops_cuda_gemm(fsdp_op_ctx *ctx, const char *op, bool transa, bool transb, int m, int n,
                        int k, float alpha, const void *A, int lda, long long sA, const void *B,
                        int ldb, long long sB, float beta, void *C, fsdp_dtype ctype, int ldc,
                        long long sC, int batch, fsdp_dtype abtype)
{
    fsdp_ops_cuda_state *s = fsdp_ops_cuda_st(ctx);
    if (s->err != FSDP_STATUS_OK)
        return false;
    if (m <= 0 || n <= 0 || batch <= 0)
        return true;
    cublasOperation_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t rc;
    if (batch == 1)
        rc = cublasGemmEx(s->blas, ta, tb, m, n, k, &alpha, A, cuda_type(abtype), lda, B,
                          cuda_type(abtype), ldb, &beta, C, cuda_type(ctype), ldc,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
        rc = cublasGemmStridedBatchedEx(s->blas, ta, tb, m, n, k, &alpha, A, cuda_type(abtype),
                                        lda, sA, B, cuda_type(abtype), ldb, sB, &beta, C,
                                        cuda_type(ctype), ldc, sC, batch, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
    if (rc != CUBLAS_STATUS_SUCCESS) {
        fsdp_ops_cuda_fail(ctx, FSDP_STATUS_CUDA, op,
                           "cuBLAS GEMM (m=%d n=%d k=%d batch=%d, %s x %s -> %s) failed: %s", m,
                           n, k, batch, fsdp_dtype_name(abtype), fsdp_dtype_name(abtype),
                           fsdp_dtype_name(ctype), fsdp_cublas_str(rc));
        return false;
    }
    return true;
}

void fsdp_ops_cuda_colsum(fsdp_op_ctx *ctx, const char *op, float *dst, const float *x, int rows,
                          int cols)
{
    if (rows <= 0 || cols <= 0 || !fsdp_ops_cuda_ok(ctx))
        return;
    int rows_per; /* the chunks depend on the shape only */
    const int n_chunks = fsdp_ops_cuda_row_chunks(rows, &rows_per);
    float *partial =
        (float *)fsdp_ops_cuda_scratch(ctx, (size_t)n_chunks * cols * sizeof(float), op);
    if (!partial)
        return;
    cudaStream_t st = fsdp_ops_cuda_stream(ctx);
    dim3 grid((unsigned)((cols + 31) / 32), (unsigned)n_chunks);
    colsum_partial_kernel<<<grid, dim3(32, 8), 0, st>>>(partial, x, rows, cols, rows_per);
    if (!fsdp_ops_cuda_launched(ctx, op))
        return;
    colsum_finish_kernel<<<(cols + 255) / 256, 256, 0, st>>>(dst, partial, n_chunks, cols);
    fsdp_ops_cuda_launched(ctx, op);
}

void fsdp_ops_cuda_f32_to_bf16(fsdp_op_ctx *ctx, const char *op, __nv_bfloat16 *dst,
                               const float *src, size_t n)
{
    if (!n || !fsdp_ops_cuda_ok(ctx))
        return;
    f32_to_bf16_kernel<<<fsdp_ops_cuda_grid(ctx, n, 256), 256, 0, fsdp_ops_cuda_stream(ctx)>>>(
        dst, src, n);
    fsdp_ops_cuda_launched(ctx, op);
}

/* ---- the table ------------------------------------------------------------ */

static void cuda_ops_fini(fsdp_op_ctx *ctx)
{
    fsdp_ops_cuda_state *s = fsdp_ops_cuda_st(ctx);
    if (!s)
        return;
    /* Queued ops may still use the handle. If the stream cannot finish
     * (another rank failed; the device's wait then stopped this rank's
     * collectives and gave up), the handle is left behind rather than
     * risk cublasDestroy waiting for the device. The buffers go back to
     * the device's cache either way (stream-ordered). The error of a
     * failed sync stays on the thread; the thread's first error, the one
     * the user sees, is not replaced by it (core/error.h). */
    if (fsdp_device_stream_sync(ctx->dev, ctx->stream) == FSDP_STATUS_OK && s->blas)
        cublasDestroy(s->blas);
    fsdp_cuda_device_free_own(ctx->dev, s->blas_ws);
    fsdp_cuda_device_free_own(ctx->dev, s->scratch);
    free(s);
    ctx->backend = NULL;
}

static fsdp_status cuda_ops_sync_error(fsdp_op_ctx *ctx)
{
    fsdp_ops_cuda_state *s = fsdp_ops_cuda_st(ctx);
    if (!s || s->err == FSDP_STATUS_OK)
        return FSDP_STATUS_OK;
    fsdp_status st = s->err;
    fsdp_error_set(st, "%s", s->err_msg);
    s->err = FSDP_STATUS_OK;
    s->err_msg[0] = '\0';
    return st;
}

/* Each slot by its name (designated initialisers; C++ wants them in the
 * order of struct fsdp_ops_i, and nvcc refuses any other order: ops.h's
 * FSDP_OPS_EACH_OP keeps it). */
#define CUDA_SLOT(op) .op = fsdp_ops_cuda_##op,

static const struct fsdp_ops_i cuda_ops_i = {
    .name = "cuda",
    .fini = cuda_ops_fini,
    .sync_error = cuda_ops_sync_error,
    FSDP_OPS_EACH_OP(CUDA_SLOT)
};

extern "C" const struct fsdp_ops_i *fsdp_ops_cuda_iface(void) { return &cuda_ops_i; }

extern "C" fsdp_status fsdp_ops_cuda_init(fsdp_op_ctx *ctx)
{
    fsdp_status st = FSDP_STATUS_OK;
    cublasStatus_t brc;
    cudaError_t crc;
    fsdp_device *dev = ctx->dev;
    if (dev->backend != FSDP_BACKEND_CUDA)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cuda ops need a cuda device (rank %d has a %s device)", dev->rank,
                              fsdp_backend_name(dev->backend));
    fsdp_ops_cuda_state *s = (fsdp_ops_cuda_state *)calloc(1, sizeof *s);
    if (!s)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory creating the cuda op state");
    ctx->backend = s;
    crc = fsdp_cuda_error_take(
        cudaDeviceGetAttribute(&s->n_sms, cudaDevAttrMultiProcessorCount, dev->ordinal));
    if (crc != cudaSuccess) {
        st = fsdp_error_set(FSDP_STATUS_CUDA, "rank %d: cannot query GPU %d: %s", dev->rank,
                            dev->ordinal, cudaGetErrorString(crc));
        goto fail;
    }
    brc = cublasCreate(&s->blas);
    if (brc != CUBLAS_STATUS_SUCCESS) {
        s->blas = NULL;
        st = fsdp_error_set(FSDP_STATUS_CUDA,
                            "rank %d: cublasCreate on GPU %d failed: %s (is the GPU out of "
                            "memory or the cuBLAS library mismatched with the driver?)",
                            dev->rank, dev->ordinal, fsdp_cublas_str(brc));
        goto fail;
    }
    FSDP_CHECK(fsdp_cuda_device_alloc_own(dev, FSDP_CUDA_BLAS_WS_BYTES, "cuBLAS workspace",
                                          &s->blas_ws));
    /* cublasSetStream resets the workspace, so the stream comes first. */
    brc = cublasSetStream(s->blas, fsdp_ops_cuda_stream(ctx));
    if (brc == CUBLAS_STATUS_SUCCESS)
        brc = cublasSetWorkspace(s->blas, s->blas_ws, FSDP_CUDA_BLAS_WS_BYTES);
    /* Keep split-K reductions of bf16 GEMMs in fp32. */
    if (brc == CUBLAS_STATUS_SUCCESS)
        brc = cublasSetMathMode(s->blas, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                        CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    if (brc == CUBLAS_STATUS_SUCCESS)
        brc = cublasSetPointerMode(s->blas, CUBLAS_POINTER_MODE_HOST);
    if (brc != CUBLAS_STATUS_SUCCESS) {
        st = fsdp_error_set(FSDP_STATUS_CUDA, "rank %d: configuring cuBLAS on GPU %d failed: %s",
                            dev->rank, dev->ordinal, fsdp_cublas_str(brc));
        goto fail;
    }
    return FSDP_STATUS_OK;
fail:
    if (s->blas)
        cublasDestroy(s->blas);
    fsdp_cuda_device_free_own(dev, s->blas_ws);
    free(s);
    ctx->backend = NULL;
    return st;
}
