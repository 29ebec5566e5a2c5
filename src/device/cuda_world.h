/*
 * cuda_world.h - the parts of the world (core/world.h) that CUDA C++ code
 * needs, as plain C functions: world.h uses C11 <stdatomic.h>, which C++17
 * (nvcc's host compiler) cannot include. Implemented in cuda_world.c, which
 * is ordinary C and is built in every configuration.
 */
#ifndef FSDP_DEVICE_CUDA_WORLD_H
#define FSDP_DEVICE_CUDA_WORLD_H

#include <stdbool.h>

#include "fsdp/fsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_world fsdp_world;

/* fsdp_world_aborted(w); false for w == NULL. */
bool fsdp_cuda_world_aborted(fsdp_world *w);
int fsdp_cuda_world_n_ranks(fsdp_world *w);
/* fsdp_world_fault_hit(w, FSDP_FAULT_COLLECTIVE, rank); false for NULL. */
bool fsdp_cuda_world_fault_hit_collective(fsdp_world *w, int rank);
/* fsdp_world_barrier(w). */
fsdp_status fsdp_cuda_world_barrier(fsdp_world *w);
/* fsdp_world_add_rank_stop / fsdp_world_remove_rank_stop; nothing for
 * w == NULL. */
fsdp_status fsdp_cuda_world_add_rank_stop(fsdp_world *w, int rank, void (*fn)(void *), void *arg);
void fsdp_cuda_world_remove_rank_stop(fsdp_world *w, int rank, void (*fn)(void *), void *arg);
/* fsdp_world_rank_stop(w, rank, st); false for w == NULL. */
bool fsdp_cuda_world_rank_stop(fsdp_world *w, int rank, fsdp_status st);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_DEVICE_CUDA_WORLD_H */
