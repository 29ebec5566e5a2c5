/*
 * engine_internal.h - the per-rank engine object, shared by the engine's
 * files (engine.c: the step; offload.c: optimizer offload; trace.c: the
 * Chrome trace). Not part of the engine's API.
 */
#ifndef FSDP_FSDP_ENGINE_INTERNAL_H
#define FSDP_FSDP_ENGINE_INTERNAL_H

#include "fsdp/engine.h"
#include "fsdp/trace.h"
#include "ops/ops.h"

#define FSDP_ACC_MAX 32

/* Micro-step partial gradient sums of one unit: a binary counter whose
 * entries are shard buffers (stack[i] = buffer index, level[i] = how many
 * micro-steps it sums, as log2). */
struct fsdp_acc {
    float *buf[FSDP_ACC_MAX]; /* shard-sized fp32 buffers on the device */
    int stack[FSDP_ACC_MAX];
    int level[FSDP_ACC_MAX];
    int depth;
    unsigned busy;            /* bit k: buf[k] holds a live partial sum */
};

struct fsdp_unit_update;

struct fsdp_engine {
    fsdp_engine_shared *sh;
    int rank;
    fsdp_device dev;
    fsdp_comm comm;
    fsdp_op_ctx ops;
    bool dev_ready, comm_ready, ops_ready;
    void *state;                 /* model activations (B, T) */
    int *tokens_host;            /* (2, B*T) inputs then targets */
    struct fsdp_acc *acc;        /* [n_units] */
    int n_acc;                   /* accumulation buffers per unit */
    fsdp_event_t *ev_gather;     /* [n_units] gather done (comm stream) */
    fsdp_event_t *ev_update;     /* [n_units] offload: gradient copied to host */
    fsdp_event_t ev_tmp, ev_tmp2;
    float *dev_blocks;           /* (n_local_blocks,) norm partial sums on the device */
    float *host_blocks;
    float *host_losses;          /* (grad_accum,) this rank's micro-step losses */
    float *loss_order;           /* (n_ranks * grad_accum,) losses by global micro-batch */
    float *norm_scratch;
    float *logits_stage;         /* (Vp,) fp32, bf16 sampling only */
    uint64_t t;                  /* AdamW step count (1-based after the first step) */
    float lr;                    /* learning rate of the step in progress */
    struct fsdp_unit_update **jobs; /* [n_units] offload: CPU update in flight */
    void **param_host;           /* [n_units] offload: compute-dtype staging (bf16) */
    struct fsdp_pool *pool;      /* offload: the process CPU pool */
};

/* Optimizer step on every unit of the rank (device AdamW, or offload). */
fsdp_status fsdp_optim_step(fsdp_engine *e, float lr, float scale);

/* Visit the parameter ranges of unit u inside the rank's shard. */
void fsdp_engine_for_each_range(fsdp_engine *e, int u,
                                void (*fn)(fsdp_engine *, int, size_t, size_t, bool, void *),
                                void *arg);
void fsdp_engine_adam_consts(const fsdp_engine *e, float *bc1, float *bc2);

/* Offload hooks (offload.c); no-ops without --offload optimizer.
 * unit_ready: unit u's gradient for the step is reduced (last micro-step):
 *   copy it to host and, when no clipping is needed, start its CPU update.
 * params_ready: before unit u is gathered: its updated shard is on the device.
 * wait_grads: every gradient shard has reached host memory.
 * step: start the CPU updates not started yet, with the clip scale. */
fsdp_status fsdp_offload_unit_ready(fsdp_engine *e, int u);
fsdp_status fsdp_offload_params_ready(fsdp_engine *e, int u);
fsdp_status fsdp_offload_wait_grads(fsdp_engine *e);
fsdp_status fsdp_offload_step(fsdp_engine *e, float lr, float scale);
fsdp_status fsdp_offload_init(fsdp_engine *e);
void fsdp_offload_fini(fsdp_engine *e);

/* Fold unit u's micro-step partial sums into dst (device, shard-sized). */
fsdp_status fsdp_engine_grad_fold(fsdp_engine *e, int u, float **result);

#endif /* FSDP_FSDP_ENGINE_INTERNAL_H */
