/*
 * cuda_device_stub.c - the CUDA device backend of a build without CUDA (CUDA=0):
 * no function table, no devices and no memory to report, so the backend
 * table (device.c) reports cuda as not built in. Compiled only when the .cu files are not; the ops
 * and comm layers have their own stubs (ops/cuda_ops_stub.c,
 * comm/cuda_comm_stub.c).
 */
#include "device/cuda_device.h"
#include "device/device.h"

const struct fsdp_device_i *fsdp_device_cuda_iface(void) { return NULL; }

int fsdp_cuda_device_count(void) { return 0; }

fsdp_status fsdp_cuda_device_memory(int ordinal, size_t *total_bytes, size_t *free_bytes)
{
    *total_bytes = *free_bytes = 0;
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                          "the memory of GPU %d: this build has no CUDA (built with CUDA=0)",
                          ordinal);
}

const fsdp_block_cache *fsdp_cuda_device_cache(const fsdp_device *d)
{
    (void)d;
    return NULL;
}
