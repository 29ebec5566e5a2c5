/*
 * cuda_check.h - one macro family turning CUDA and cuBLAS failures into
 * fsdp_status with file:line and the library's own error string (nccl.cu
 * checks its own calls: a build without NCCL has no nccl.h). Include only from
 * .cu files.
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

/* FSDP_GPU_TRY(kind, ok_value, to_string, expr): return an fsdp_status on failure. */
#define FSDP_GPU_TRY(status_code, ok, str, expr)                                        \
    do {                                                                                \
        auto fsdp_gpu_rc_ = (expr);                                                     \
        if (fsdp_gpu_rc_ != (ok))                                                       \
            return fsdp_error_set(status_code, "%s:%d: %s failed: %s", __FILE__,        \
                                  __LINE__, #expr, str(fsdp_gpu_rc_));                  \
    } while (0)

#define CUDA_TRY(expr) FSDP_GPU_TRY(FSDP_STATUS_CUDA, cudaSuccess, cudaGetErrorString, expr)
#define CUBLAS_TRY(expr) FSDP_GPU_TRY(FSDP_STATUS_CUDA, CUBLAS_STATUS_SUCCESS, fsdp_cublas_str, expr)

#endif /* FSDP_DEVICE_CUDA_CHECK_H */
