/*
 * cuda_comm_stub.c - the CUDA collectives of a build without CUDA (CUDA=0):
 * they exist so callers link, and fail with a message saying what to do.
 */
#include "comm/cuda_comm.h"

fsdp_status fsdp_comm_nccl_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank)
{
    (void)c, (void)w, (void)dev, (void)rank;
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                          "--comm nccl needs a CUDA build: this one was built with CUDA=0 "
                          "(rebuild with CUDA=1, or use --backend cpu)");
}

fsdp_status fsdp_comm_peer_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank)
{
    (void)c, (void)w, (void)dev, (void)rank;
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                          "--comm peer needs a CUDA build: this one was built with CUDA=0 "
                          "(rebuild with CUDA=1, or use --backend cpu)");
}
