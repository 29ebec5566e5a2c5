/*
 * nccl_stub.c - the `nccl` collectives of a build without NCCL: CUDA=0, or
 * CUDA=1 NCCL=0 (no nccl.h was found; the peer collectives still work).
 * It exists so callers link, and fails with a message saying what to do.
 */
#include "comm/cuda_comm.h"

fsdp_status fsdp_comm_nccl_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                      const fsdp_comm_group *g, int rank)
{
    (void)c, (void)w, (void)dev, (void)g, (void)rank;
#ifdef FSDP_CUDA
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                          "--comm nccl needs NCCL: this CUDA build has none (built with NCCL=0; "
                          "rebuild with NCCL_HOME or NCCL_LIB pointing at NCCL, or use --comm "
                          "peer)");
#else
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                          "--comm nccl needs a CUDA build with NCCL: this one was built with "
                          "CUDA=0 (rebuild with CUDA=1, or use --backend cpu)");
#endif
}
