/*
 * act.h - what every model family's step shares: the ledger of a training
 * or inference state's activation buffers, the per-token losses read back
 * to the host, op failures reported per unit, and unit checks.
 *
 * Why: a family's model file (models/gpt2.c, models/llama.c) should hold
 * its architecture (which buffers, which ops in which order), not the
 * plumbing around it; adding a family then means writing only that.
 *
 * Messages name the family (`family`, e.g. "GPT-2") and the micro-batch,
 * as the device accounting shows them ("activations 'ln1' of layer 3
 * (B=4, T=64)").
 */
#ifndef FSDP_MODELS_ACT_H
#define FSDP_MODELS_ACT_H

#include "models/model.h"
#include "ops/ops.h"

typedef struct fsdp_act_set {
    const char *family;  /* message prefix: "GPT-2", "Llama" */
    int B, T;            /* the micro-batch the buffers are sized for */
    void **allocs;       /* every device allocation, freed in reverse order */
    int n, cap;
    float *host_losses;  /* (B*T) pinned host copy of the per-token losses */
} fsdp_act_set;

/* Room for `cap` device buffers of a (B, T) state. OOM on host failure. */
fsdp_status fsdp_act_set_init(fsdp_act_set *a, const char *family, int B, int T, int cap);

/* One device buffer of `bytes` (accounted as activations) into *(void **)out.
 * layer >= 0: a layer's own buffer; -1: a state buffer; -2: a layer buffer
 * every layer shares. At most `cap` per set (asserted). */
fsdp_status fsdp_act_alloc(fsdp_op_ctx *ctx, fsdp_act_set *a, size_t bytes, const char *what,
                           int layer, void *out);

/* The pinned host copy of the (B*T) per-token losses, a->host_losses. */
fsdp_status fsdp_act_host_losses(fsdp_op_ctx *ctx, fsdp_act_set *a);

/* Frees every buffer (device ones in reverse order) and the ledger; safe
 * on a set that failed half-way or was zeroed. */
void fsdp_act_set_free(fsdp_op_ctx *ctx, fsdp_act_set *a);

/* The first op failure the backend recorded since the last check (cuda
 * launches can fail; cpu and meta ops cannot), prefixed with the family,
 * `what` and the unit's name, so the error says where. */
fsdp_status fsdp_act_ops_status(fsdp_op_ctx *ctx, const char *family, const fsdp_model *m,
                                const char *what, int unit);

/* Copies the device's (B*T) per-token `losses` to the host, waits, checks
 * the ops (as "head forward") and, when `loss` is given, stores their mean
 * summed in the fixed tree order (0 on meta, which computes nothing). */
fsdp_status fsdp_act_read_loss(fsdp_op_ctx *ctx, const fsdp_act_set *a, const fsdp_model *m,
                               const float *losses, float *loss);

/* INVALID_ARG unless `state` exists and `unit` is one of the model's layer
 * units (1 .. n_units - 1); `what` names the call. */
fsdp_status fsdp_act_check_unit(const char *family, const fsdp_model *m, const void *state,
                                int unit, const char *what);

/* Zeroes n floats on the compute stream (nothing on meta). */
fsdp_status fsdp_act_zero(fsdp_op_ctx *ctx, float *p, size_t n);

#endif
