/*
 * cuda_comm_stub.c - the CUDA communicators in a build without CUDA (CUDA=0).
 */
#include "comm/comm.h"

fsdp_status fsdp_comm_nccl_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank)
{
    (void)c; (void)w; (void)dev; (void)rank;
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                          "NCCL collectives need a CUDA build (this one was built with CUDA=0)");
}

fsdp_status fsdp_comm_peer_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank)
{
    (void)c; (void)w; (void)dev; (void)rank;
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                          "peer collectives need a CUDA build (this one was built with CUDA=0)");
}
