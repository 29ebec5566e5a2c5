/*
 * engine.h - the FSDP engine: one training step on each rank, sharded.
 *
 * The engine owns, per rank, the device, the communicator, the op context,
 * the model's activations and the rank's row of the shard map (parameter,
 * gradient and optimizer shards). It never knows which model it runs: it
 * drives the model's units through models/model.h.
 *
 * Threading: fsdp_engine_shared is built on the main thread before the
 * ranks start and is read-only afterwards, except the exchange slots,
 * written by each rank into its own slot and read by the others after a
 * world barrier. Each fsdp_engine is used by its rank's thread only.
 */
#ifndef FSDP_FSDP_ENGINE_H
#define FSDP_FSDP_ENGINE_H

#include <stdbool.h>

#include "comm/comm.h"
#include "data/data.h"
#include "fsdp/shardmap.h"

typedef enum fsdp_comm_kind {
    FSDP_COMM_AUTO = 0, /* host on cpu, meta on meta, nccl on cuda */
    FSDP_COMM_HOST,
    FSDP_COMM_META,
    FSDP_COMM_NCCL,
    FSDP_COMM_PEER,
    FSDP_COMM_KIND_COUNT
} fsdp_comm_kind;

const char *fsdp_comm_kind_name(fsdp_comm_kind k);
fsdp_status fsdp_comm_kind_parse(const char *s, fsdp_comm_kind *out);

typedef struct fsdp_engine_config {
    fsdp_backend backend;
    fsdp_comm_kind comm;
    int n_ranks;
    int ranks_per_device;      /* cuda + peer: virtual ranks sharing one GPU */
    fsdp_shard_strategy shard;
    fsdp_dtype compute_dtype;  /* --precision: gathered params and activations */
    bool prefetch;
    bool offload;              /* optimizer state + master + grad shards in pinned host memory */
    bool deterministic;
    size_t device_mem;         /* per-device cap in bytes, 0 = none */
    int threads_per_device;    /* cpu backend: threads each device computes with; 0 = cores /
                                * devices (device/cpu.h, applied by the trainer) */
    int batch;                 /* B: sequences per micro-batch */
    int seq;                   /* T */
    int grad_accum;            /* A: micro-steps per rank per step */
    float beta1, beta2, eps;
    float weight_decay;
    float clip;                /* global grad-norm clip, 0 = off */
    uint64_t seed;
} fsdp_engine_config;

/* Per-rank figures of one step, published to every rank through the
 * exchange slots. */
typedef struct fsdp_rank_stats {
    size_t peak_bytes;         /* device high-water mark since init */
    size_t in_use_bytes;
    size_t host_peak_bytes;    /* pinned host memory high-water mark */
    size_t comm_recv_bytes;    /* received by collectives during the step */
    size_t comm_sent_bytes;
    fsdp_mem_stats mem;        /* full device statistics (for plan) */
    fsdp_mem_stats host;
} fsdp_rank_stats;

typedef struct fsdp_engine_shared {
    fsdp_engine_config cfg;
    const fsdp_model *model;
    const fsdp_data *data;     /* may be NULL (meta / plan) */
    fsdp_world *world;
    fsdp_shardmap sm;
    size_t n_local_blocks;     /* norm blocks per rank, all units */
    /* exchange slots, double-buffered by step parity */
    float *x_losses[2];        /* [n_ranks * grad_accum] */
    float *x_blocks[2];        /* [n_ranks * n_local_blocks] */
    fsdp_rank_stats *x_stats;  /* [n_ranks], written before the end-of-step barrier */
    /* Initial parameters: fills dst with elements [begin, end) of unit
     * `unit`'s flat fp32 buffer (zeros past the unit's numel). NULL: the
     * model's counter-based RNG (fsdp_model_init_range with cfg.seed).
     * Called from every rank thread concurrently, for its own shard only. */
    fsdp_status (*init_fn)(void *arg, const fsdp_model *m, int unit, size_t begin, size_t end,
                           float *dst);
    void *init_arg;
    /* optional trace sink (may be NULL) */
    struct fsdp_trace *trace;
} fsdp_engine_shared;

typedef struct fsdp_step_result {
    float loss;                /* mean over the global batch */
    float grad_norm;           /* before clipping */
    float lr;
} fsdp_step_result;

typedef struct fsdp_engine fsdp_engine;

/* Build the shared part (shard map, exchange slots); main thread. */
fsdp_status fsdp_engine_shared_init(fsdp_engine_shared *sh, const fsdp_engine_config *cfg,
                                    const fsdp_model *model, const fsdp_data *data, fsdp_world *w);
void fsdp_engine_shared_free(fsdp_engine_shared *sh);

/* Per-rank init on the rank's thread: device, comm, ops, shards (params
 * initialised from the model's counter-based RNG, own shard only), model
 * activations. On failure, everything allocated is released. */
fsdp_status fsdp_engine_init(fsdp_engine **out, fsdp_engine_shared *sh, int rank);
void fsdp_engine_free(fsdp_engine *e);

/* One optimizer step: grad_accum micro-steps on micro-batches
 * step * M + j * N + rank (M = N * A), reduce-scatter, clip, AdamW at
 * learning rate lr. Every rank must call it with the same step and lr.
 * Ends with a world barrier after which sh->x_stats holds every rank's
 * figures for this step. */
fsdp_status fsdp_engine_step(fsdp_engine *e, uint64_t step, float lr, fsdp_step_result *res);

/* Forward only on n_rows <= B sequences of T tokens (host int32, row-major):
 * if logits_out != NULL, writes the fp32 logits of row b at position pos[b]
 * to logits_out[b * Vp ..]; if loss != NULL, the model's mean loss with the
 * inputs themselves as targets (the next tokens are not passed in: for a
 * next-token loss on data use fsdp_engine_forward_batch; rows past n_rows
 * are zeros). All ranks call it in lockstep (it all-gathers), each with its
 * own tokens. */
fsdp_status fsdp_engine_forward(fsdp_engine *e, const int *tokens, int n_rows, const int *pos,
                                float *logits_out, float *loss);

/* Forward only on micro-batch `index` of the shared data source (the
 * numbering fsdp_engine_step uses), with the model's real next-token
 * targets: *loss is the batch's mean loss, computed as the training
 * micro-step's forward computes it. All ranks call it in lockstep, each
 * with its own index. INVALID_ARG if the engine has no data source. */
fsdp_status fsdp_engine_forward_batch(fsdp_engine *e, uint64_t index, float *loss);

/* Unpadded fp32 copy of a whole unit's current master parameters on every
 * rank (an all-gather of master shards, for export/tests; host buffer of
 * units[u].numel floats). */
fsdp_status fsdp_engine_gather_unit(fsdp_engine *e, int unit, float *host_out);

fsdp_device *fsdp_engine_device(fsdp_engine *e);
fsdp_comm *fsdp_engine_comm(fsdp_engine *e);

#endif /* FSDP_FSDP_ENGINE_H */
