/*
 * plan.h - `fsdp plan` as a library: run the real step schedule of a
 * training configuration on the meta backend (nothing allocated, nothing
 * computed; the device counts bytes by kind, the communicator counts bytes
 * by collective) and report, per device, the peak memory with its
 * breakdown, the pinned host memory and the traffic of one step.
 *
 * Because the meta run issues the same allocations, frees and collectives
 * in the same order as a cpu or cuda run, its figures are the real run's to
 * the byte (tests/test_plan.c checks this against the cpu backend).
 *
 * A job of several nodes (eng.n_nodes, --devices ranks each) is planned in
 * one process: the meta communicators count, beside every collective's
 * bytes, those that cross between nodes, as a job of one process per node
 * moves them with the `mpi` transport (comm.h; tests/test_mpi_train.c
 * checks them against such a job under mpirun).
 */
#ifndef FSDP_TRAIN_PLAN_H
#define FSDP_TRAIN_PLAN_H

#include <stdio.h>

#include "train/train.h"

typedef struct fsdp_plan_rank {
    fsdp_mem_stats mem;   /* device memory; peak_kind_bytes = breakdown at the peak */
    fsdp_mem_stats host;  /* pinned host memory (offload) */
    /* the last step's collectives (every step issues the same ones) */
    size_t sent_bytes[FSDP_COLL_KIND_COUNT];
    size_t recv_bytes[FSDP_COLL_KIND_COUNT];
    size_t n_calls[FSDP_COLL_KIND_COUNT];
    /* of those, the bytes between nodes (comm.h: counted on one rank of each
     * node per communicator, so a node's figure is the sum over its ranks) */
    size_t inter_sent_bytes[FSDP_COLL_KIND_COUNT];
    size_t inter_recv_bytes[FSDP_COLL_KIND_COUNT];
} fsdp_plan_rank;

typedef struct fsdp_plan {
    fsdp_engine_config eng;   /* as run (backend meta, no cap) */
    size_t device_mem;        /* the cap the caller asked about (0: none) */
    char model[160];
    size_t numel;             /* model parameters */
    size_t train_numel;       /* of which train (P of the formula) */
    size_t frozen_numel;      /* frozen in the compute dtype (F) */
    size_t nf4_numel;         /* frozen in NF4 (Q) */
    size_t frozen_shard_bytes; /* one rank's frozen shards, all units (dense and NF4) */
    size_t padded_numel;      /* all units' segments padded for the shard map */
    int n_units;
    int steps;                /* steps run */
    double wall_s;            /* time the meta run took */
    int n_ranks;
    int n_nodes;              /* nodes of n_ranks / n_nodes ranks (1: one) */
    fsdp_plan_rank *ranks;    /* [n_ranks] */
    double node_gbs;          /* for the reports: each node's network bandwidth to the
                                 others, GB/s, to turn bytes between nodes into time (0:
                                 not shown); set by the caller */
} fsdp_plan;

/* Run `steps` (>= 1) steps of cfg on the meta backend with cfg's model,
 * devices, batch, precision, sharding and offload. The backend, the
 * communicator and the memory cap of cfg->eng are ignored (meta, no cap:
 * a capped run would stop at the first allocation over it; compare with
 * fsdp_plan_fits afterwards). Writes a Chrome trace if cfg->trace_path is
 * set. cfg->out, log_path, eval and data are ignored. With
 * cfg->eng.inference, each step is a forward of a full micro-batch on an
 * inference engine (what fsdp eval runs). */
fsdp_status fsdp_plan_run(const fsdp_train_config *cfg, int steps, fsdp_plan *out);
void fsdp_plan_free(fsdp_plan *p);

/* Sum over collective kinds of one of fsdp_plan_rank's per-kind arrays. */
static inline size_t fsdp_plan_coll_total(const size_t *v)
{
    size_t s = 0;
    for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++)
        s += v[k];
    return s;
}

/* The bytes node `node` sends to and receives from the other nodes in one
 * step, per collective kind (arrays of FSDP_COLL_KIND_COUNT): the sum of
 * its ranks' inter-node counts. */
void fsdp_plan_node_bytes(const fsdp_plan *p, int node, size_t *sent, size_t *recv);

/* Largest peak over devices and the device that has it. */
size_t fsdp_plan_max_peak(const fsdp_plan *p, int *rank);

/* The ZeRO paper's model-state estimate for this configuration, per
 * device: bytes per parameter for parameters, gradients and the optimizer's
 * state (as the optimizer declares it: AdamW 8, SGD 4), sharded as the
 * strategy shards them. *dev_bytes on the device, *host_bytes in pinned
 * host memory (offload). Writes the formula ("16 P/N") to text. */
void fsdp_plan_formula(const fsdp_plan *p, size_t *dev_bytes, size_t *host_bytes, char *text,
                       size_t n);

#endif /* FSDP_TRAIN_PLAN_H */
