/*
 * cuda_comm_stub.c - the `peer` collectives of a build without CUDA
 * (CUDA=0): it exists so callers link, and fails with a message saying
 * what to do. (The nccl entry is in nccl_stub.c, also used by CUDA
 * builds without NCCL.)
 */
#include "comm/cuda_comm.h"

fsdp_status fsdp_comm_peer_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                      const fsdp_comm_group *g, int rank)
{
    (void)c, (void)w, (void)dev, (void)g, (void)rank;
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                          "--comm peer needs a CUDA build: this one was built with CUDA=0 "
                          "(rebuild with CUDA=1, or use --backend cpu)");
}
