/*
 * cuda_check.h - one macro family turning CUDA and cuBLAS failures into
 * fsdp_status with file:line and the library's own error string (nccl.cu
 * checks its own calls: a build without NCCL has no nccl.h). Include only from
 * .cu files.
 *
 * The CUDA runtime keeps a per-thread "last error": a failed call sets it,
 * and it stays set until cudaGetLastError() reads it. Kernel launches are
 * checked by reading it (fsdp_ops_cuda_launched, the peer reduction), so an
 * error that was already turned into a status and left set would be blamed
 * on the next launch. Every place that reads a failed cudaError_t clears it:
 * the TRY macros here, and fsdp_cuda_error_take() for hand-written checks.
 * Sticky errors (a kernel's illegal address) survive the clear: every later
 * call returns them again, which is what they mean.
 */
#ifndef FSDP_DEVICE_CUDA_CHECK_H
#define FSDP_DEVICE_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

static inline const char *fsdp_cublas_str(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "alloc failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "arch mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
    }
}

/* rc, after clearing the calling thread's last-error state when rc is not
 * cudaSuccess (cudaErrorNotReady included: it is no error, and older
 * runtimes record it). Wrap every CUDA call whose failure is handled by
 * hand: `cudaError_t rc = fsdp_cuda_error_take(cudaEventQuery(e));`. */
static inline cudaError_t fsdp_cuda_error_take(cudaError_t rc)
{
    if (rc != cudaSuccess)
        (void)cudaGetLastError();
    return rc;
}

/* FSDP_GPU_TRY(kind, ok_value, to_string, expr): return an fsdp_status on
 * failure, with the CUDA last error cleared (after a cuBLAS failure too: it
 * costs nothing there, and the library may have left one). */
#define FSDP_GPU_TRY(status_code, ok, str, expr)                                        \
    do {                                                                                \
        auto fsdp_gpu_rc_ = (expr);                                                     \
        if (fsdp_gpu_rc_ != (ok)) {                                                     \
            (void)cudaGetLastError();                                                   \
            return fsdp_error_set(status_code, "%s:%d: %s failed: %s", __FILE__,        \
                                  __LINE__, #expr, str(fsdp_gpu_rc_));                  \
        }                                                                               \
    } while (0)

#define CUDA_TRY(expr) FSDP_GPU_TRY(FSDP_STATUS_CUDA, cudaSuccess, cudaGetErrorString, expr)
#define CUBLAS_TRY(expr) FSDP_GPU_TRY(FSDP_STATUS_CUDA, CUBLAS_STATUS_SUCCESS, fsdp_cublas_str, expr)

#endif /* FSDP_DEVICE_CUDA_CHECK_H */
