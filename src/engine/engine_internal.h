/*
 * engine_internal.h - the per-rank engine object, shared by the engine's
 * files (engine.c: the step; engine_ckpt.c: checkpoints; place_*.c: where
 * optimizer state lives; trace.c: the Chrome trace). Not part of the
 * engine's API.
 *
 * Dependencies: engine.c calls the placement table (declared below,
 * implemented by place*.c), the accumulation counter (accum.h) and the
 * optimizer (optim/optim.h); the placements call accumulation, the
 * optimizer, the trace and the inline helpers below, never a function of
 * engine.c, and the engine's files never include place.h.
 */
#ifndef FSDP_ENGINE_ENGINE_INTERNAL_H
#define FSDP_ENGINE_ENGINE_INTERNAL_H

#include "engine/accum.h"
#include "engine/engine.h"
#include "engine/trace.h"
#include "ops/ops.h"

struct fsdp_engine {
    fsdp_engine_shared *sh;
    int rank;
    fsdp_device dev;
    fsdp_comm comm;              /* every rank of the job */
    fsdp_comm comm_node;         /* hybrid: the ranks of this rank's node */
    fsdp_comm comm_cross;        /* hybrid: the ranks with this local index on every node */
    fsdp_comm *shard_comm;       /* the ranks a unit is sharded over: gathers, reduce-scatters */
    fsdp_comm *replica_comm;     /* hybrid: the replicas of this rank's shard (NULL: none) */
    fsdp_trace_rank tr;          /* this rank's view of sh->trace (trace.h) */
    fsdp_op_ctx ops;             /* the model's ops: the compute stream */
    fsdp_op_ctx ops_acc;         /* gradient accumulation (accum.h): on the comm stream after
                                  * the reduce-scatters, or, with host_grads, host work on the
                                  * copy stream after the copies to pinned host memory */
    fsdp_op_ctx ops_host;        /* host-side kernels on host shards (offload), at once */
    fsdp_op_ctx ops_gather;      /* NF4 dequantization after its all-gather: the comm stream */
    bool dev_ready, comm_ready, ops_ready, node_ready, cross_ready;
    fsdp_status status;          /* first failure of init or of a call (step, forward, ...);
                                  * OK so far: fsdp_engine_free stops the rank with it */
    void *state;                 /* model activations (B, T) */
    int step_len;                /* T' <= T of the training steps (fsdp_engine_set_len);
                                  * 0: T */
    int *tokens_host;            /* (2, B*T) inputs then targets, (3, B*T) with the
                                  * positions of packed data; pinned host memory */
    int *pos_dev;                /* (B*T) token positions of packed data (the model state
                                  * reads them), or NULL */
    fsdp_event_t ev_tokens;      /* the last copy out of tokens_host (compute stream) */
    fsdp_accum acc;              /* micro-step partial gradient sums, per unit */
    const struct fsdp_place_i *place; /* where master, optimizer state and grad shards live */
    void *place_ctx;             /* the placement's own per-rank state */
    fsdp_event_t *ev_gather;     /* [n_units] gather done (comm stream) */
    fsdp_event_t ev_tmp, ev_tmp2;
    float *dev_blocks;           /* (n_local_blocks,) norm partial sums on the device */
    float *host_losses;          /* (grad_accum,) this rank's micro-step losses */
    float *loss_order;           /* (n_ranks * grad_accum,) losses by global micro-batch */
    float *norm_scratch;         /* (n_local_blocks + (n_ranks + 1) * (record_len +
                                    grad_accum),) the norm's block sums, this rank's record
                                    (cover and losses), every rank's (engine_comms.c) */
    void *x_records;             /* (n_ranks,) fsdp_rank_stats of every rank (engine_comms.c) */
    float *logits_stage;         /* (Vp,) fp32, bf16 sampling only */
    uint64_t t;                  /* optimizer step count (1-based after the first step) */
    float lr;                    /* learning rate of the step in progress */
    bool update_started;         /* a unit's update of this step has begun (in backward) */
    fsdp_status data_st;         /* first data error of a step (fsdp_engine_data_error) */
    char data_msg[FSDP_ERROR_MSG_MAX];
};

/* ---- placements: where a rank's optimizer state lives ---------------------
 * The interface the engine drives; the implementations (device, host,
 * infer) and what they share are in place.h and place*.c. */
typedef struct fsdp_place_i {
    const char *name;
    /* Per-rank state (e->place_ctx), before the units are allocated. */
    fsdp_status (*init)(fsdp_engine *e);
    /* Wait for work in flight and release what init made (the device
     * releases the buffers). Safe after a failed init. */
    void (*fini)(fsdp_engine *e);
    /* Allocate unit u's master, optimizer state, gradient shard and
     * compute-dtype shard (row->param, which may be row->master). */
    fsdp_status (*unit_alloc)(fsdp_engine *e, int u);
    /* Rewrite unit u's compute-dtype shard from its master (after init or
     * a checkpoint load wrote the master). Synchronous. */
    fsdp_status (*param_refresh)(fsdp_engine *e, int u);
    /* Last micro-step: unit u's gradient is reduced into the accumulation
     * counter (comm stream); make it the step's gradient shard (row->grad)
     * without a host wait. */
    fsdp_status (*unit_ready)(fsdp_engine *e, int u);
    /* Before unit u is gathered, or its master or state read or written:
     * its last update is complete on the host, and row->param holds it in
     * the order of the comm and compute streams (they wait for it). */
    fsdp_status (*params_ready)(fsdp_engine *e, int u);
    /* Per norm block, the sum of squares of every unit's gradient shard, in
     * unit order, into host memory out (n_local_blocks floats), after the
     * comm stream's folds. */
    fsdp_status (*grad_sumsq)(fsdp_engine *e, float *out);
    /* The optimizer step of every unit at learning rate lr, gradients
     * scaled by `scale`, with step count e->t (may run asynchronously: the
     * next gathers wait through params_ready or the streams). */
    fsdp_status (*step)(fsdp_engine *e, float lr, float scale);
    /* Unit u's fp32 master shard in device memory (for collectives): the
     * master itself, or a temporary copy (FSDP_MEM_OTHER) that the caller
     * frees with fsdp_device_free when it is not row->master. Complete on
     * the comm stream. */
    fsdp_status (*master_on_device)(fsdp_engine *e, int u, float **out);
    /* The gradient shard and the accumulation counter's partial sums live
     * in pinned host memory: each micro-step's reduced shard is copied to
     * the host (copy stream) and added there, so the device keeps only the
     * unit gradients in flight. */
    bool host_grads;
} fsdp_place_i;

/* The placement a configuration asks for (--offload, inference); place.c. */
const fsdp_place_i *fsdp_place_of(const fsdp_engine_config *cfg);

/* engine_comms.c: the communicators (init on the rank's thread after the
 * device; fini is safe after a failed init), their counters, and the
 * step's exchanges (every rank of the job calls them together). */
fsdp_status fsdp_engine_comms_init(fsdp_engine *e);
void fsdp_engine_comms_fini(fsdp_engine *e);
/* The global gradient norm of the gradient shards (after the last
 * micro-step), and every rank's micro-step losses into e->loss_order by
 * the global micro-batch index. */
fsdp_status fsdp_engine_norm(fsdp_engine *e, float *norm);
/* After the update: every rank's figures into sh->x_stats. */
fsdp_status fsdp_engine_publish(fsdp_engine *e);
/* The device buffers an exchange of `bytes` per rank allocates (and frees
 * again before it returns): *send and *recv bytes. */
void fsdp_engine_exchange_bytes(const fsdp_engine *e, size_t bytes, size_t *send, size_t *recv);
/* The bytes per rank of the step's two exchanges: fsdp_engine_norm's
 * record, fsdp_engine_publish's. */
size_t fsdp_engine_norm_record_bytes(const fsdp_engine *e);
size_t fsdp_engine_publish_record_bytes(void);

/* Whether a unit's update must wait for the step's global norm: with
 * clipping (the scale depends on it) and when non-finite steps are to be
 * skipped. Otherwise a placement may start updates during backward. */
static inline bool fsdp_engine_update_needs_norm(const fsdp_engine *e)
{
    return e->sh->cfg.clip > 0.0f || e->sh->cfg.skip_nonfinite;
}

/* What the engine names a unit's buffers and collectives, "unit 'h.3' <text>", formatted once
 * per run at fsdp_engine_shared_init (the planner's searches run thousands of meta steps). */
typedef enum fsdp_unit_label {
    FSDP_LABEL_GATHER = 0,    /* "gather": the gathered buffer */
    FSDP_LABEL_ALL_GATHER,    /* "all-gather": the collective, a packed group's buffer */
    FSDP_LABEL_FROZEN_GATHER, /* "frozen all-gather" */
    FSDP_LABEL_REDUCTION,     /* "gradient reduction": the collectives */
    FSDP_LABEL_REDUCE_PACK,   /* "gradient reduce-scatter": a packed group's buffer */
    FSDP_LABEL_GRADIENT,      /* "gradient": the full gradient */
    FSDP_LABEL_REDUCED,       /* "reduced gradient": offload's device copy of the shard */
    FSDP_LABEL_UPLOAD,        /* "parameter shard upload": offloaded trainable shards */
    FSDP_LABEL_FROZEN_UPLOAD, /* "frozen shard upload": offloaded frozen shards */
    FSDP_LABEL_COUNT
} fsdp_unit_label;

#define FSDP_LABEL_MAX 80 /* bytes of one, NUL included ("unit '" + a 31-byte name + text) */

static inline const char *fsdp_engine_label(const fsdp_engine *e, int u, fsdp_unit_label l)
{
    return e->sh->unit_labels + ((size_t)u * FSDP_LABEL_COUNT + (size_t)l) * FSDP_LABEL_MAX;
}

/* This rank's row of unit u in the shard map. */
static inline fsdp_shard_row *fsdp_engine_row(fsdp_engine *e, int u)
{
    return &e->sh->sm.units[u].rows[e->rank];
}

/* engine_gather.c: unit u's gathered parameters (shardmap.h's row->gathered).
 * Issue the all-gather on the comm stream (no-op if issued or resident);
 * wait: issue if needed, then make the buffer usable on the compute
 * stream; release: free it, stream-ordered (device.h), so the next gather
 * overlaps this unit's compute. The shard ranks call them together. */
fsdp_status fsdp_engine_gather_issue(fsdp_engine *e, int u);
fsdp_status fsdp_engine_gather_wait(fsdp_engine *e, int u);
fsdp_status fsdp_engine_gather_release(fsdp_engine *e, int u);
/* Wait for all work on every stream of the rank's device (end of a phase). */
fsdp_status fsdp_engine_sync_all(fsdp_engine *e);

/* engine_gather.c: unit u's parameters [first, end) between the shard
 * ranks' shards of them side by side (`rm`, rank-major: shard_ranks slots
 * of `stride` elements, each holding those parameters' spans from the one
 * at shard offset `base`; elements of es bytes) and the model's flat
 * layout (`flat`: the unit's element 0). to_flat copies every slot's real
 * rows out; else copies them in and zeroes every slot's padding. On the
 * device's stream s, or with `host` at once with memcpy (both buffers in
 * host memory). */
fsdp_status fsdp_engine_permute(fsdp_engine *e, int u, int first, int end, size_t stride,
                                size_t base, void *flat, void *rm, size_t es, bool to_flat,
                                fsdp_stream_t s, bool host);

/* Whether units are sharded over the ranks (any strategy but none). */
static inline bool fsdp_engine_sharded(const fsdp_engine *e)
{
    return e->sh->cfg.shard != FSDP_SHARD_NONE;
}

/* Whether the ranks' shards side by side differ from the model's layout:
 * more than one shard rank (shardmap.h); gathers copy out, reductions in. */
static inline bool fsdp_engine_permuted(const fsdp_engine *e)
{
    return e->sh->sm.shard_ranks > 1;
}

/* Reserve, before the first step, the device buffers the step allocates
 * and frees again, as many of each size as it holds at once (warm.c). */
fsdp_status fsdp_engine_warm_up(fsdp_engine *e);

/* Keep st as the engine's failure if it is the first one, and return it:
 * fsdp_engine_free stops the rank's collectives with it before anything
 * waits or frees (core/world.h). Every public call of the engine that can
 * fail passes its status through here. */
static inline fsdp_status fsdp_engine_note(fsdp_engine *e, fsdp_status st)
{
    if (st != FSDP_STATUS_OK && e->status == FSDP_STATUS_OK)
        e->status = st;
    return st;
}

/* Stream `dst` waits for everything issued so far on `src` (through ev). */
static inline fsdp_status fsdp_engine_order(fsdp_engine *e, fsdp_stream_t src, fsdp_stream_t dst,
                                            fsdp_event_t ev)
{
    FSDP_TRY(fsdp_device_event_record(&e->dev, ev, src));
    return fsdp_device_stream_wait_event(&e->dev, dst, ev);
}

#endif /* FSDP_ENGINE_ENGINE_INTERNAL_H */
