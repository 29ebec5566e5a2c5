/*
 * cuda_ops_stub.c - the CUDA op table of a build without CUDA (CUDA=0):
 * there is none, and binding an op context to cuda fails with a message.
 * Compiled only when the .cu files are not (ops/cuda/registry.cu is the
 * real one).
 */
#include "ops/ops.h"

const struct fsdp_ops_i *fsdp_ops_cuda_iface(void) { return NULL; }

fsdp_status fsdp_ops_cuda_init(fsdp_op_ctx *ctx)
{
    (void)ctx;
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "this build has no CUDA (built with CUDA=0)");
}
