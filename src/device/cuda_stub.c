/*
 * cuda_stub.c - the CUDA registry entries of a build without CUDA (CUDA=0).
 * Compiled only when the .cu files are not.
 */
#include "device/cuda_device.h"
#include "device/device.h"
#include "ops/ops.h"

const struct fsdp_device_i *fsdp_device_cuda_iface(void) { return NULL; }

int fsdp_cuda_device_count(void) { return 0; }

const struct fsdp_ops_i *fsdp_ops_cuda_iface(void) { return NULL; }

fsdp_status fsdp_ops_cuda_init(fsdp_op_ctx *ctx)
{
    (void)ctx;
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "this build has no CUDA (built with CUDA=0)");
}

const fsdp_block_cache *fsdp_cuda_device_cache(const fsdp_device *d)
{
    (void)d;
    return NULL;
}
