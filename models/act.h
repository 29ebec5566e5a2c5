/*
 * act.h - what every model family's step shares: the start of every
 * family's state (fsdp_act_state: micro-batch, mode, tokens, targets,
 * logits, losses) with its allocation, loss and free, the ledger of a
 * training or inference state's activation buffers, the per-layer saved
 * activations and which recompute modes keep them, the per-token losses
 * read back to the host, op failures reported per unit, and unit checks.
 *
 * Why: a family's model file (models/gpt2.c, models/llama.c) should hold
 * its architecture (which buffers, which ops in which order), not the
 * plumbing around it; adding a family then means writing only that.
 *
 * Messages name the family (its title, m->family->title: "GPT-2") and the
 * micro-batch, as the device accounting shows them ("activations 'ln1' of
 * layer 3 (B=4, T=64)").
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

/* ---- per-layer saved activations ----
 * A family keeps one struct of buffer pointers per layer and describes it
 * with a table of fields in allocation order. Each field names the
 * recompute modes (models/model.h) that keep it per layer; in the others
 * it is one buffer that every layer shares, written by each layer's
 * forward and rebuilt by unit_recompute before its backward. Forward-only
 * states keep nothing per layer. */
#define FSDP_ACT_KEEP(mode) (1u << (mode))
#define FSDP_ACT_KEEP_ALL                                                       \
    (FSDP_ACT_KEEP(FSDP_RECOMPUTE_NONE) | FSDP_ACT_KEEP(FSDP_RECOMPUTE_BLOCK) | \
     FSDP_ACT_KEEP(FSDP_RECOMPUTE_ELEMENTWISE))
#define FSDP_ACT_KEEP_NONE_ELEMENTWISE \
    (FSDP_ACT_KEEP(FSDP_RECOMPUTE_NONE) | FSDP_ACT_KEEP(FSDP_RECOMPUTE_ELEMENTWISE))
#define FSDP_ACT_KEEP_NONE_ONLY FSDP_ACT_KEEP(FSDP_RECOMPUTE_NONE)

typedef struct fsdp_act_field {
    const char *name; /* in the device accounting */
    size_t offset;    /* of the buffer pointer in the family's layer struct */
    int width;        /* the family's size code (its field_bytes reads it) */
    unsigned keep;    /* FSDP_ACT_KEEP(mode) of the modes that keep it per layer */
} fsdp_act_field;

typedef struct fsdp_act_layout {
    const fsdp_act_field *fields;
    int n_fields;
    size_t layer_bytes; /* sizeof the family's layer struct */
    /* Bytes of a field of `width` for the micro-batch of the family's
     * state, dts bytes per compute-dtype element. */
    size_t (*field_bytes)(const fsdp_model *m, const void *state, int width, size_t dts);
} fsdp_act_layout;

/* Whether a state (training, mode) keeps field f per layer. */
static inline bool fsdp_act_kept(const fsdp_act_layout *lay, int f, bool training,
                                 fsdp_recompute mode)
{
    return training && (lay->fields[f].keep & FSDP_ACT_KEEP(mode));
}

/* Every layer's saved activations into layers (m->n_layer structs),
 * layer by layer in field order: a kept field gets a buffer per layer, the
 * others one buffer, allocated with layer 0, that every layer points at. */
fsdp_status fsdp_act_layers_alloc(const fsdp_model *m, fsdp_op_ctx *ctx, fsdp_act_set *a,
                                  const fsdp_act_layout *lay, const void *state, void *layers,
                                  bool training, fsdp_recompute mode);

/* The pinned host copy of the (B*T) per-token losses, a->host_losses. */
fsdp_status fsdp_act_host_losses(fsdp_op_ctx *ctx, fsdp_act_set *a);

/* Frees every buffer (device ones in reverse order) and the ledger; safe
 * on a set that failed half-way or was zeroed. */
void fsdp_act_set_free(fsdp_op_ctx *ctx, fsdp_act_set *a);

/* The first op failure the backend recorded since the last check (cuda
 * launches can fail; cpu and meta ops cannot), prefixed with the family,
 * `what` and the unit's name, so the error says where. A family's steps
 * end with it. */
fsdp_status fsdp_act_ops_status(fsdp_op_ctx *ctx, const fsdp_model *m, const char *what,
                                int unit);

/* Copies the device's N (<= B*T of the set) per-token `losses` to the host, waits,
 * checks the ops (as "head forward") and, when `loss` is given, stores their mean
 * summed in the fixed tree order (0 on meta, which computes nothing). */
fsdp_status fsdp_act_read_loss(fsdp_op_ctx *ctx, const fsdp_act_set *a, const fsdp_model *m,
                               const float *losses, int N, float *loss);

/* The checks of a state's shape: INVALID_ARG unless B >= 1, 1 <= T <=
 * m->max_seq_len, `fits` (the family's bound for the ops' int indices
 * holds for this B and T) and mode is a recompute mode. */
fsdp_status fsdp_act_check_batch(const fsdp_model *m, int B, int T, bool fits,
                                 fsdp_recompute mode);

/* INVALID_ARG unless `state` exists and `unit` is one of the model's layer
 * units (1 .. n_units - 1); `what` names the call. */
fsdp_status fsdp_act_check_unit(const fsdp_model *m, const void *state, int unit,
                                const char *what);

/* unit_backward's checks: fsdp_act_check_unit, then INVALID_ARG unless the
 * state is a training state. */
fsdp_status fsdp_act_check_backward(const fsdp_model *m, const void *state, int unit);

/* The root and head slots' checks: INVALID_ARG unless `state` exists and,
 * when the call computes gradients (grads), it is a training state; `what`
 * names the call. */
fsdp_status fsdp_act_check_state(const fsdp_model *m, const void *state, bool grads,
                                 const char *what);

/* ---- the state of a step ----
 * What every family's state holds whatever its architecture. A family's
 * state struct starts with one (so the engine's void *state is also an
 * fsdp_act_state *) and adds its own buffers after it. */
typedef struct fsdp_act_state {
    int B, T;            /* the micro-batch the ops run on: T is the active length
                            (model.h's state_len), at most act.T, what the buffers hold */
    bool training;
    fsdp_recompute mode; /* training states: what each layer keeps (the family's fields) */
    void *layers;        /* (L,) the family's layer structs; fields a layer does not keep
                            point at layers[0]'s */
    int *tokens;         /* (B*T) int32 */
    int *targets;        /* (B*T) int32, < 0: no loss */
    void *logits;        /* (B*T,Vp) dt */
    float *losses;       /* (B*T) per-token losses, device */
    float *dlogits;      /* training only: (B*T,Vp) fp32; aliases logits when dt is fp32 */
    const int *pos;      /* (B*T) int32 token positions (model.h's state_positions), or
                            NULL: t */
    fsdp_act_set act;    /* every device allocation, the host copy of the losses */
} fsdp_act_state;

/* A zeroed state of state_bytes (the family's struct) for (B, T) in *out,
 * with the fields above set (mode NONE unless training), room for `cap`
 * device buffers and m->n_layer zeroed layer structs of layer_bytes. OOM
 * "host allocation of a <family> state failed", once the state exists
 * prefixed as fsdp_act_state_fail does; nothing is left allocated. */
fsdp_status fsdp_act_state_new(const fsdp_model *m, size_t state_bytes, size_t layer_bytes,
                               int B, int T, bool training, fsdp_recompute mode, int cap,
                               void **out);

/* The state's first device buffers: tokens, then targets. */
fsdp_status fsdp_act_state_alloc_io(fsdp_op_ctx *ctx, fsdp_act_state *s);

/* The head's buffers: logits (Vp wide, dt), losses, their host copy and,
 * in a training state, dlogits (fp32: the logits themselves when dt is
 * fp32, which xent overwrites in place). */
fsdp_status fsdp_act_state_alloc_head(fsdp_op_ctx *ctx, fsdp_act_state *s, int Vp);

/* A failed state_init's end: prefixes the message ("<family> '<model>'
 * activations"), frees s and returns st. */
fsdp_status fsdp_act_state_fail(const fsdp_model *m, fsdp_op_ctx *ctx, void *s, fsdp_status st);

/* The model interface's state_free, state_tokens, state_targets and
 * state_logits for every family (models/model.h). */
void fsdp_act_state_free(const fsdp_model *m, fsdp_op_ctx *ctx, void *state);
int *fsdp_act_state_tokens(void *state);
int *fsdp_act_state_targets(void *state);
const void *fsdp_act_state_logits(void *state);
/* The interface's state_positions, for a family whose ops read s->pos. */
void fsdp_act_state_positions(void *state, const int *pos);
/* The interface's state_len: s->T = T, which must be in [1, the allocated T] (asserted),
 * for a family whose ops all read s->T (and its buffers hold (B, T) densely). */
void fsdp_act_state_len(void *state, int T);

/* The head's loss: per-token cross-entropy of the logits against the
 * targets over V of the Vp columns (and, when grads, dlogits scaled by
 * dloss / (B*T): the loss is the sum of the token losses, masked targets
 * adding 0), then the mean read back as fsdp_act_read_loss does. */
fsdp_status fsdp_act_state_loss(fsdp_op_ctx *ctx, const fsdp_model *m, fsdp_act_state *s, int V,
                                int Vp, float dloss, bool grads, float *loss);

/* Zeroes n floats on the compute stream (nothing on meta). */
fsdp_status fsdp_act_zero(fsdp_op_ctx *ctx, float *p, size_t n);

/* ---- a family's model table ----
 * A family built on this file fills an fsdp_act_model_i: its model
 * interface (models/model.h), whose state_init, state_init_recompute,
 * unit_forward and unit_recompute slots are the shared ones below, and
 * the two steps of its own they call. m->iface points at .iface. */
typedef struct fsdp_act_model_i {
    struct fsdp_model_i iface;
    /* A state for micro-batches of (B, T) (a training one, or forward-only
     * without gradient buffers), keeping per layer what `mode` keeps
     * (NONE unless training). */
    fsdp_status (*state_alloc)(const fsdp_model *m, fsdp_op_ctx *ctx, int B, int T,
                               bool training, fsdp_recompute mode, void **state);
    /* Layer `unit`'s forward ops on a checked state: every one (redo
     * false: unit_forward), or only those whose outputs the state does not
     * keep per layer (redo true: unit_recompute), with the same calls on
     * the same inputs, so recomputed activations are bit-identical. */
    fsdp_status (*layer_forward)(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, int unit,
                                 const void *params, bool redo);
} fsdp_act_model_i;

/* The shared slots of fsdp_model_i (models/model.h): state_alloc with
 * mode NONE, or a training state of `mode`; the unit's checks, then
 * layer_forward (unit_recompute: on training states only). */
fsdp_status fsdp_act_state_init(const fsdp_model *m, fsdp_op_ctx *ctx, int B, int T,
                                bool training, void **state);
fsdp_status fsdp_act_state_init_recompute(const fsdp_model *m, fsdp_op_ctx *ctx, int B, int T,
                                          fsdp_recompute mode, void **state);
fsdp_status fsdp_act_unit_forward(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, int unit,
                                  const void *params);
fsdp_status fsdp_act_unit_recompute(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, int unit,
                                    const void *params);

#endif
