/*
 * cuda_world.c - C wrappers over core/world.h for the CUDA C++ files, which
 * cannot include it (C11 atomics); see cuda_world.h.
 */
#include "core/world.h"
#include "device/cuda_world.h"

bool fsdp_cuda_world_aborted(fsdp_world *w) { return w && fsdp_world_aborted(w); }

int fsdp_cuda_world_n_ranks(fsdp_world *w) { return w ? w->n_ranks : 1; }

bool fsdp_cuda_world_fault_hit_collective(fsdp_world *w, int rank)
{
    return w && fsdp_world_fault_hit(w, FSDP_FAULT_COLLECTIVE, rank);
}

fsdp_status fsdp_cuda_world_barrier(fsdp_world *w) { return fsdp_world_barrier(w); }

fsdp_status fsdp_cuda_world_add_rank_stop(fsdp_world *w, int rank, void (*fn)(void *), void *arg)
{
    return w ? fsdp_world_add_rank_stop(w, rank, fn, arg) : FSDP_STATUS_OK;
}

void fsdp_cuda_world_remove_rank_stop(fsdp_world *w, int rank, void (*fn)(void *), void *arg)
{
    if (w)
        fsdp_world_remove_rank_stop(w, rank, fn, arg);
}

bool fsdp_cuda_world_rank_stop(fsdp_world *w, int rank, fsdp_status st)
{
    return fsdp_world_rank_stop(w, rank, st);
}
