/*
 * engine.h - the FSDP engine: one training step on each rank, sharded.
 *
 * The engine owns, per rank, the device, the communicator, the op context,
 * the model's activations and the rank's row of the shard map (parameter,
 * gradient and optimizer shards). It never knows which model it runs: it
 * drives the model's units through models/model.h.
 *
 * Ranks are the job's (core/world.h): a job of several processes runs
 * n_ranks ranks in all, this process's at world->rank_offset..; rank
 * numbers, micro-batch dealing and loss scaling are global, only the
 * device ordinal is local. What ranks tell each other each step (losses,
 * the gradient norm's partial sums, memory and traffic figures) goes
 * through the world's communicator (fsdp_engine_exchange), so it reaches
 * every process.
 *
 * Threading: fsdp_engine_shared is built on the main thread before the
 * ranks start and is read-only afterwards, except x_stats (written by the
 * process's first rank before the barrier that ends a step). Each
 * fsdp_engine is used by its rank's thread only.
 */
#ifndef FSDP_ENGINE_ENGINE_H
#define FSDP_ENGINE_ENGINE_H

#include <stdbool.h>

#include "comm/transport.h"
#include "core/names.h"
#include "data/data.h"
#include "engine/accum.h"
#include "engine/norm_cover.h"
#include "engine/shardmap.h"

typedef struct fsdp_engine_config {
    fsdp_backend backend;
    fsdp_comm_kind comm;       /* transport (comm/transport.h); AUTO: the backend's */
    int n_ranks;               /* ranks of the whole job */
    int n_nodes;               /* nodes of n_ranks / n_nodes ranks (<= 1: one); a job of
                                  several processes has one node per process, one process
                                  may simulate several (hybrid sharding, plans) */
    int ranks_per_device;      /* cuda + peer: virtual ranks sharing one GPU */
    fsdp_shard_strategy shard;
    fsdp_dtype compute_dtype;  /* --precision: gathered params and activations */
    bool prefetch;
    size_t direct_numel;       /* parameters of at least this many elements over their shard
                                * ranks are gathered straight into place, one collective
                                * each (engine/shardmap.h fsdp_shard_group); 0: the default,
                                * FSDP_SHARD_DIRECT_NUMEL (tests set it low) */
    fsdp_recompute recompute;  /* activations kept per block (models/model.h); the
                                * others are rebuilt in backward */
    bool offload;              /* optimizer state + master + grad shards in pinned host memory */
    bool offload_params;       /* parameter shards in pinned host memory, uploaded just
                                * ahead of each gather: the frozen ones (dense and NF4);
                                * with offload too, the trainable compute-dtype shards
                                * (fsdp_offload_trainable_params) */
    bool inference;            /* forward only (eval, sample): each rank keeps its parameter
                                * shard in the compute dtype and activations without
                                * gradients; no master copy, optimizer state, gradient
                                * shards or norm sums (place_infer.c); fsdp_engine_step
                                * is refused and offload and the optimizer are ignored */
    bool deterministic;
    size_t device_mem;         /* per-device cap in bytes, 0 = none */
    int threads_per_device;    /* cpu backend: threads each device computes with; 0 = cores /
                                * devices (device/cpu.h, applied by the trainer) */
    int cpu_streams;           /* cpu backend: fsdp_cpu_streams (device/cpu.h); 0 = the
                                * environment's (FSDP_CPU_STREAMS, default inline); applied
                                * by the trainer and inference, as threads_per_device */
    uint64_t cpu_stream_jitter; /* async cpu streams: seed of random delays; 0 = the
                                 * environment's (FSDP_CPU_STREAM_JITTER, default none) */
    int batch;                 /* B: sequences per micro-batch */
    int seq;                   /* T */
    bool positions;            /* the batches carry token positions (packed example rows,
                                * data.h): the device holds a (B*T) int buffer for them. The
                                * trainer sets it from its data, so that a plan (meta, no
                                * data) counts the buffer too */
    int grad_accum;            /* A: micro-steps per rank per step */
    fsdp_accum_mode accum;     /* how the A micro-steps' gradients are summed (accum.h) */
    const struct fsdp_optim *optim; /* optim/optim.h; NULL: the default (AdamW) */
    fsdp_optim_hparams optim_hp; /* optim's hyper-parameters (those not given: its defaults)
                                  * and the weight decay; read by the optimizer only */
    float clip;                /* global grad-norm clip, 0 = off */
    uint64_t seed;
    bool skip_nonfinite;       /* updates always wait for the step's loss and norm, so a
                                * non-finite step can be dropped (fsdp_step_result.applied) */
    const char *oom_hint;      /* what a device out-of-memory message suggests, or NULL
                                * (device.h); the caller's, since it knows its options */
} fsdp_engine_config;

/* The --offload values: none (0), optimizer (1), params (2), optimizer,params
 * (3): cfg.offload | cfg.offload_params << 1 (fsdp_offload_value). */
extern const fsdp_name_table fsdp_offload_names;

static inline int fsdp_offload_value(const fsdp_engine_config *cfg)
{
    return (cfg->offload ? 1 : 0) | (cfg->offload_params ? 2 : 0);
}

/* Whether the trainable segment's compute-dtype shards live in pinned host
 * memory (--offload optimizer,params in training): the host placement's
 * CPU step writes them there, each gather uploads them first. With
 * --offload params alone the device optimizer updates them on the device,
 * where they stay (docs/step.md). */
static inline bool fsdp_offload_trainable_params(const fsdp_engine_config *cfg)
{
    return cfg->offload_params && cfg->offload && !cfg->inference;
}

/* Whether the engine can run `model` with recompute `mode`: every model
 * runs NONE, the other modes need the model's recompute slots
 * (models/model.h). INVALID_ARG naming the --recompute value and the model
 * otherwise (and for a mode out of range). Allocates nothing; any thread. */
fsdp_status fsdp_engine_recompute_check(const fsdp_model *model, fsdp_recompute mode);

/* Per-rank figures of one step, exchanged among every rank of the job. */
typedef struct fsdp_rank_stats {
    size_t peak_bytes;         /* device high-water mark since init */
    size_t in_use_bytes;
    size_t host_peak_bytes;    /* pinned host memory high-water mark */
    size_t comm_recv_bytes;    /* received by collectives during the step */
    size_t comm_sent_bytes;
    size_t inter_recv_bytes;   /* of which between nodes (comm.h: counted on one rank per node
                                  and group; 0 in a job of one node) */
    size_t inter_sent_bytes;
    fsdp_mem_stats mem;        /* full device statistics (for plan) */
    fsdp_mem_stats host;
} fsdp_rank_stats;

typedef struct fsdp_engine_shared {
    fsdp_engine_config cfg;
    const fsdp_model *model;
    const fsdp_data *data;     /* may be NULL (meta / plan) */
    fsdp_world *world;
    const fsdp_optim *optim;   /* cfg.optim, or the default */
    fsdp_optim_hparams optim_hp; /* cfg.optim_hp resolved: every value set */
    fsdp_shardmap sm;
    size_t n_local_blocks;     /* norm blocks per rank, all units */
    fsdp_norm_cover norm;      /* the norm's partial sums (norm_cover.h) */
    fsdp_rank_stats *x_stats;  /* [n_ranks] every rank's, after each step (see above) */
    char *unit_labels;         /* each unit's buffer and collective names, formatted once
                                * (engine_internal.h fsdp_engine_label) */
    /* Initial parameters: fills dst with elements [begin, end) of unit
     * `unit`'s flat fp32 buffer (zeros past the unit's numel). NULL: the
     * model's counter-based RNG (fsdp_model_init_range with cfg.seed).
     * Called from every rank thread concurrently, for its own shard only. */
    fsdp_status (*init_fn)(void *arg, const fsdp_model *m, int unit, size_t begin, size_t end,
                           float *dst);
    void *init_arg;
    /* A rank's NF4 shard: elements [begin, end) of unit `unit`'s flat buffer,
     * inside its NF4 group (spec->nf4_begin on) or the padding past numel
     * (codes 0x77, absmax 0), as (end - begin) / 2 bytes of codes and
     * (end - begin) / 64 fp32 absmax (ops/nf4.h). Required when the model has
     * NF4 parameters; called as init_fn is, with init_arg. */
    fsdp_status (*init_nf4_fn)(void *arg, const fsdp_model *m, int unit, size_t begin,
                               size_t end, uint8_t *codes, float *absmax);
    /* optional trace sink (may be NULL) */
    struct fsdp_trace *trace;
} fsdp_engine_shared;

typedef struct fsdp_step_result {
    float loss;                /* mean over the global batch's unmasked targets; NaN if a
                                  * rank's data failed */
    float grad_norm;           /* before clipping */
    float lr;
    bool finite;               /* loss and grad_norm are finite */
    bool applied;              /* the optimizer update was applied: always when finite;
                                * otherwise only if it had started before the norm was
                                * known (offload, no clipping, skip_nonfinite unset) */
} fsdp_step_result;

typedef struct fsdp_engine fsdp_engine;

/* Build the shared part (shard map, norm cover, stats); main thread. w is
 * the job's world: its n_ranks must be cfg->n_ranks, and a world of
 * several processes has cfg->n_nodes = its processes (or n_nodes <= 1). */
fsdp_status fsdp_engine_shared_init(fsdp_engine_shared *sh, const fsdp_engine_config *cfg,
                                    const fsdp_model *model, const fsdp_data *data, fsdp_world *w);
void fsdp_engine_shared_free(fsdp_engine_shared *sh);

/* Per-rank init on the rank's thread: device, comm, ops, shards (params
 * initialised from the model's counter-based RNG, own shard only), model
 * activations. On failure, everything allocated is released (as by
 * fsdp_engine_free, the rank stopped first). */
fsdp_status fsdp_engine_init(fsdp_engine **out, fsdp_engine_shared *sh, int rank);
/* Teardown on the rank's thread. First, before any wait or free, the rank
 * is stopped with the first failure of a call below (fsdp_world_rank_stop:
 * its collectives end and the world learns of the failure at once), or, on
 * a clean exit, only if the world was aborted; then the streams are drained
 * and everything is released. After a failed call the engine is good only
 * for this. */
void fsdp_engine_free(fsdp_engine *e);

/* One optimizer step: grad_accum micro-steps on micro-batches
 * step * M + j * N + rank (M = N * A), reduce-scatter, clip, and the
 * configured optimizer's update (cfg.optim) at learning rate lr. Every rank
 * must call it with the same step and lr.
 * Ends with a world barrier after which sh->x_stats holds every rank's
 * figures for this step. res->loss is the global batch's mean loss and
 * res->grad_norm the global norm on every rank.
 *
 * A step whose global loss or gradient norm is not finite applies no
 * update where it can (res->applied; every rank decides the same), so the
 * parameters stay those of the previous step. A micro-batch this rank
 * cannot read (a data file truncated or rewritten while training) does
 * not fail the step: it is replaced by zeros, this rank's losses become
 * NaN so that no rank applies the update, and the error is kept for
 * fsdp_engine_data_error. */
fsdp_status fsdp_engine_step(fsdp_engine *e, uint64_t step, float lr, fsdp_step_result *res);

/* The active length T' of the training steps that follow: each micro-batch runs on its
 * rows' first T' positions (models/model.h's state_len), the activations staying
 * allocated for cfg.seq. Only for rows whose positions past T' are padding (no targets,
 * after every real position: --pack off example rows, data.h's fsdp_data_rows_len),
 * whose loss and gradients are then those of the run at cfg.seq up to float rounding
 * (sums over B*T' tokens instead of B*T). The caller passes every rank the same T' (a
 * function of the step's global batch), so results stay bit-identical across device
 * counts. 0 or out of [1, cfg.seq], or a model family without state_len: cfg.seq (the
 * default). Forwards take their own length (fsdp_engine_forward; forward_batch and
 * forward_data run at cfg.seq); a plan (meta) at the worst case, cfg.seq, as nobody
 * sets it there. */
void fsdp_engine_set_len(fsdp_engine *e, int T);

/* The first data error of this rank's steps (OK if none) and its message
 * (valid while e lives). */
fsdp_status fsdp_engine_data_error(const fsdp_engine *e, const char **msg);

/* Forward only on n_rows <= B sequences of T <= cfg.seq tokens (host int32,
 * row-major): if logits_out != NULL, writes the fp32 logits of row b at
 * position pos[b] < T to logits_out[b * Vp ..]; if loss != NULL, the
 * model's mean loss with the inputs themselves as targets (the next tokens
 * are not passed in: for a next-token loss on data use
 * fsdp_engine_forward_batch; rows past n_rows are zeros). The ops run at
 * length T (the model's state_len; a family without one runs at cfg.seq,
 * the rows padded with zeros after position T): a causal model's logits at
 * a position are those of the same tokens at any longer T up to float
 * rounding (the products' shapes change), and bit-identical for the same T.
 * All ranks call it in lockstep (it all-gathers), each with its own tokens;
 * INVALID_ARG for T outside [1, cfg.seq]. */
fsdp_status fsdp_engine_forward(fsdp_engine *e, const int *tokens, int n_rows, int T,
                                const int *pos, float *logits_out, float *loss);

/* Forward only on micro-batch `index` of the shared data source (the
 * numbering fsdp_engine_step uses), with the model's real next-token
 * targets: *loss is the model's loss of the batch as the training
 * micro-step's forward computes it (the sum of the token losses over B*T,
 * masked targets adding 0: the mean when nothing is masked), *n_targets
 * (may be NULL) the batch's unmasked targets (B*T for stream data).
 * fsdp_engine_mean_loss turns these into means. All ranks call it in
 * lockstep, each with its own index. INVALID_ARG if the engine has no data
 * source. */
fsdp_status fsdp_engine_forward_batch(fsdp_engine *e, uint64_t index, float *loss,
                                      uint64_t *n_targets);

/* The same on micro-batch `index` of another source of the same B and T
 * (a held-out set during training: train/heldout.h); the engine's own
 * source is not read. */
fsdp_status fsdp_engine_forward_data(fsdp_engine *e, const fsdp_data *data, uint64_t index,
                                     float *loss, uint64_t *n_targets);

/* The mean loss over `count` unmasked targets of n micro-batches of `rows`
 * (B*T) tokens, from the model's micro-batch losses (sums over B*T, see
 * fsdp_engine_forward_batch), in the step's order: the balanced tree sum
 * over n divided by n, times n * rows / count (exactly the plain mean when
 * count = n * rows); 0 when count is 0. fsdp_engine_step reports this. */
float fsdp_engine_mean_loss(const float *losses, int n, uint64_t rows, uint64_t count);

/* Unpadded fp32 copy of a whole unit's current master parameters on every
 * rank (an all-gather of master shards, for export/tests; host buffer of
 * units[u].numel floats). */
fsdp_status fsdp_engine_gather_unit(fsdp_engine *e, int unit, float *host_out);

/* An all-gather of one small host record per rank among every rank of the
 * job: all[r * bytes ..] = rank r's `mine`. Every rank calls it with the
 * same bytes; it goes through the world's communicator (staged in device
 * memory, freed before returning), and is not counted in the step's
 * traffic. On the meta backend nothing moves and `all` is zeroed. */
fsdp_status fsdp_engine_exchange(fsdp_engine *e, const void *mine, size_t bytes, void *all);

/* The OR of every rank's `mine` into *all, on every rank of the job (a
 * decision all ranks take together, e.g. to stop). */
fsdp_status fsdp_engine_or(fsdp_engine *e, unsigned mine, unsigned *all);

/* Zero the byte and call counters of every communicator of e (a step does
 * it as it starts). */
void fsdp_engine_comms_reset(fsdp_engine *e);

/* Collective bytes and calls of this rank since the step began, over every
 * communicator the engine uses (hybrid sharding has three), per kind:
 * logical bytes (comm.h) and bytes between nodes. Arrays of
 * FSDP_COLL_KIND_COUNT. */
void fsdp_engine_comm_counts(const fsdp_engine *e, size_t *sent, size_t *recv, size_t *calls,
                             size_t *inter_sent, size_t *inter_recv);

fsdp_device *fsdp_engine_device(fsdp_engine *e);
/* The communicator over every rank of the job. */
fsdp_comm *fsdp_engine_comm(fsdp_engine *e);

#endif /* FSDP_ENGINE_ENGINE_H */
