/*
 * model.h - what the engine needs from a model: its FSDP units (each a list
 * of named parameters laid out in one flat buffer) and forward/backward per
 * unit on the unit's gathered flat parameters.
 *
 * Unit 0 is the root: it holds the parameters used before the first block
 * and after the last (e.g. token and position embeddings, a tied LM head,
 * the final norm). The engine keeps it gathered for the whole
 * step. A training micro-step on one rank is:
 *
 *   root_forward(root)                         embeddings
 *   unit_forward(u)           u = 1..U-1       blocks
 *   head_forward_backward(root, root_grads)    final norm, logits, loss,
 *                                              and their backward
 *   unit_backward(u, grads)   u = U-1..1
 *   root_backward(root, root_grads)            embeddings' backward
 *
 * Parameters are in ctx->dt; gradients are fp32 and are ACCUMULATED (+=)
 * into the unit's flat gradient buffer (zeroed by the engine). All buffers
 * are device memory of the rank; activations live in the model's state,
 * allocated once per rank through the device (kind FSDP_MEM_ACT), so they
 * are accounted and capped.
 *
 * Activation recompute (--recompute, fsdp_recompute below). A training
 * state keeps, per block, the activations its backward reads. A recompute
 * mode keeps only some of them per block; the others live in ONE block's
 * work buffers shared by all blocks, and the backward rebuilds them:
 *
 *   unit_recompute(u)  then  unit_backward(u)      u = U-1..1
 *
 * so activation memory is (kept per block) x L + (dropped per block) x 1
 * instead of (all per block) x L. How a family implements it (models/gpt2.c
 * is the example):
 *   - one table of the block's saved buffers, each with the set of modes
 *     that keep it per block; state_init_recompute allocates a kept buffer
 *     per block and a dropped one once, in the same order for every mode
 *     (mode NONE gives state_init(training=true)'s state, allocation for
 *     allocation, so plans and golden figures do not move);
 *   - one function for the block's forward ops; unit_forward runs all of
 *     them, unit_recompute only those whose output the mode drops (an op
 *     whose output is dropped must read only kept or rerun outputs). The
 *     same ops on the same inputs in the same order give the same bits, so
 *     losses and parameters are bit-identical to FSDP_RECOMPUTE_NONE;
 *   - forward-only states (eval, sampling) keep nothing per block.
 * The modes are named by fsdp_recompute_names below; a family without the
 * recompute slots supports only FSDP_RECOMPUTE_NONE, and the engine refuses
 * the others by name.
 */
#ifndef FSDP_MODELS_MODEL_H
#define FSDP_MODELS_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/names.h"
#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsdp_init_kind {
    FSDP_INIT_NORMAL = 0, /* N(0, std^2) */
    FSDP_INIT_ZEROS,
    FSDP_INIT_ONES,
    FSDP_INIT_UNIFORM,    /* U(-std, std): LoRA's A, Kaiming-uniform as PEFT draws it */
} fsdp_init_kind;

typedef struct fsdp_param_spec {
    char name[64];        /* unique in the model, e.g. "h.3.attn.c_attn.weight" */
    int ndim;
    int64_t shape[4];
    size_t numel;
    size_t offset;        /* element offset in the unit's flat buffer */
    fsdp_init_kind init;
    float std;            /* for FSDP_INIT_NORMAL */
    bool decay;           /* AdamW weight decay applies (matrices only) */
    bool frozen;          /* not trained: no gradient, no optimizer state, no reduction;
                           * stored and gathered in the compute dtype only */
    bool nf4;             /* frozen and stored in NF4 (ops/nf4.h): the unit's last group,
                           * [nf4_begin, numel); numel a multiple of FSDP_NF4_BLOCK */
    bool fuse_next;       /* the family reads it and the next parameter as one tensor
                           * (q|k|v, gate|up): they must stay adjacent, so both train or
                           * both are frozen */
} fsdp_param_spec;

/* The part of p inside elements [lo, hi) of its unit's flat buffer:
 * [*a, *b) in the same unit coordinates; false when they do not overlap. */
static inline bool fsdp_param_overlap(const fsdp_param_spec *p, size_t lo, size_t hi, size_t *a,
                                      size_t *b)
{
    *a = p->offset > lo ? p->offset : lo;
    *b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
    return *a < *b;
}

typedef struct fsdp_unit_spec {
    char name[32];        /* "root", "h.0", ... */
    int n_params;
    fsdp_param_spec *params;
    size_t numel;         /* sum of the parameters' numel (unpadded) */
    size_t train_numel;   /* the trainable parameters' numel: they come first in the flat
                           * buffer, [0, train_numel); frozen ones fill [train_numel, numel)
                           * (fsdp_model_relayout keeps it so) */
    size_t nf4_begin;     /* the frozen NF4 parameters fill [nf4_begin, numel), after the
                           * frozen dense ones (= numel when there are none) */
} fsdp_unit_spec;

/* What a training state keeps per block between forward and backward;
 * the rest is rebuilt by unit_recompute (see the top of this file). */
typedef enum fsdp_recompute {
    FSDP_RECOMPUTE_NONE = 0,     /* every block's activations kept */
    FSDP_RECOMPUTE_BLOCK,        /* only each block's input (the previous block's output);
                                  * the block's forward reruns in its backward */
    FSDP_RECOMPUTE_ELEMENTWISE,  /* matmul and attention outputs kept; norms and the
                                  * activation function (GELU/SwiGLU) rerun in backward */
    FSDP_RECOMPUTE_COUNT
} fsdp_recompute;

/* The modes by name (--recompute): none, block, elementwise. */
extern const fsdp_name_table fsdp_recompute_names;

typedef struct fsdp_model fsdp_model;
typedef struct fsdp_model_family fsdp_model_family; /* models/family.h */

#define FSDP_MODEL_CONFIG_MAX 256 /* a canonical config string, NUL included */
#define FSDP_MODEL_NAME_MAX 320   /* "<family>:<config>" fits */

struct fsdp_model_i {
    /* Per-rank activations for micro-batches of (B, T); training=false
     * allocates no gradient buffers (eval, sampling). */
    fsdp_status (*state_init)(const fsdp_model *m, fsdp_op_ctx *ctx, int B, int T, bool training,
                              void **state);
    void (*state_free)(const fsdp_model *m, fsdp_op_ctx *ctx, void *state);
    /* Device buffers (B*T int32) the engine fills before root_forward. */
    int *(*state_tokens)(void *state);
    int *(*state_targets)(void *state);
    /* Logits (B*T, Vp) in ctx->dt after head_forward_backward (forward
     * part); only valid when root_grads was NULL (training overwrites them).
     * Attention is causal: the logits at position t depend on tokens 0..t
     * only, so a forward-only state of (1, T) serves any prompt of length
     * <= T, the positions after it filled with any token (sampling reads
     * row t). */
    const void *(*state_logits)(void *state);

    fsdp_status (*root_forward)(const fsdp_model *m, fsdp_op_ctx *ctx, void *state,
                                const void *root_params);
    fsdp_status (*unit_forward)(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, int unit,
                                const void *params);
    /* Loss of the micro-batch: *loss = tree sum over the B*T tokens of
     * their losses, divided by B*T, a token whose target is < 0 (masked)
     * adding 0 (host float; 0 on meta); T is the active length (state_len).
     * If root_grads is NULL only the forward runs. The gradient is that of
     * dloss * *loss (the engine passes B*T / unmasked targets of the global
     * batch: engine.c). */
    fsdp_status (*head_forward_backward)(const fsdp_model *m, fsdp_op_ctx *ctx, void *state,
                                         const void *root_params, float *root_grads, float dloss,
                                         float *loss);
    fsdp_status (*unit_backward)(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, int unit,
                                 const void *params, float *grads);
    fsdp_status (*root_backward)(const fsdp_model *m, fsdp_op_ctx *ctx, void *state,
                                 const void *root_params, float *root_grads);

    /* ---- activation recompute: optional, all three slots or none ---- */
    /* A training state (as state_init with training=true) that keeps per
     * block only what `mode` keeps; mode NONE must allocate exactly what
     * state_init(training=true) allocates, in the same order. */
    fsdp_status (*state_init_recompute)(const fsdp_model *m, fsdp_op_ctx *ctx, int B, int T,
                                        fsdp_recompute mode, void **state);
    /* Rebuild block `unit`'s dropped activations from what its forward
     * kept, on ctx's stream, with the gathered parameters its forward used;
     * called between head_forward_backward and unit_backward(unit), for
     * blocks in backward order. Allocates nothing; a no-op for mode NONE.
     * FLOPs it adds per token: recompute_flops_per_token. */
    fsdp_status (*unit_recompute)(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, int unit,
                                  const void *params);
    /* Training FLOPs per token that `mode`'s unit_recompute adds at
     * sequence length T (matmuls and attention; 0 for NONE). For cost
     * models: MFU keeps counting model FLOPs only. */
    double (*recompute_flops_per_token)(const fsdp_model *m, int T, fsdp_recompute mode);

    /* ---- positions: optional (NULL: the family's attention cannot take them) ---- */
    /* Give the state a device buffer pos (B*T int32, owned by the caller, alive as long
     * as the state) holding each token's position in its document, which the caller
     * fills before root_forward: attention and position embeddings read it instead of
     * t, so packed documents (data.h) do not see each other. NULL: plain positions
     * (the default). */
    void (*state_positions)(void *state, const int *pos);

    /* ---- active length: optional (NULL: every micro-batch runs at the state's T) ---- */
    /* The calls that follow, up to the next state_len, run on micro-batches of (B, T'),
     * 1 <= T' <= the T of state_init: tokens, targets and positions hold B*T' entries
     * (row b at b*T'), logits are (B*T', Vp), every op is called with T', and the loss is
     * over the B*T' tokens. The buffers stay allocated for T. One micro-step's forward,
     * recompute and backward run at one T' (what the backward reads was laid out by the
     * forward). For rows whose positions past T' are all padding (no targets, after every
     * real position; causal attention), the real positions' outputs are those of a run
     * at T: --pack off runs each step at its longest example (engine.c). */
    void (*state_len)(void *state, int T);
};

/* LoRA adapters on a model's linear layers (models/lora.h): r = 0 means none. */
typedef struct fsdp_lora_config {
    int r;                 /* rank */
    double alpha;          /* lora_alpha: the branch is scaled by alpha / r (rslora:
                            * alpha / sqrt(r)) */
    bool rslora;
    char targets[256];     /* PEFT target_modules: a comma list of module names
                            * ("q_proj,v_proj"), or "all-linear" */
} fsdp_lora_config;

struct fsdp_model {
    const struct fsdp_model_i *iface;
    const fsdp_model_family *family;   /* what built it (models/registry.h) */
    char config[FSDP_MODEL_CONFIG_MAX]; /* canonical config: the family rebuilds
                                         * this model from it */
    char name[FSDP_MODEL_NAME_MAX];     /* for messages: a named shape ("tiny"), or
                                         * "<family>:<config>" */
    int n_units;
    fsdp_unit_spec *units;  /* units[0] is the root */
    size_t numel;           /* all parameters */
    int vocab_size;         /* V: real vocabulary (256 for byte-level) */
    int padded_vocab_size;  /* Vp: V rounded up to a multiple of 128 */
    int max_seq_len;
    /* The transformer's shape, for estimates outside the family (the
     * planner's cost model, MFU): decoder layers, attention heads, hidden
     * size. Every family sets them. */
    int n_layer, n_head, n_embd;
    void *impl;             /* the family's own config (malloc'd, freed with the model) */
    fsdp_lora_config lora;  /* the adapters fsdp_model_add_lora gave it (r = 0: none) */
    char freeze[256];       /* the --freeze patterns applied to it ("" : none) */
    bool nf4;               /* some frozen parameters are stored in NF4 (--quantize nf4, a
                             * bnb-4bit file): their values are the NF4 round trip */
    size_t train_numel;     /* trainable parameters, all units */
    void *lora_impl;        /* models/lora.c's lookup tables (freed with the model) */
};

/* Initial value of elements [begin, end) of unit `unit`'s flat buffer
 * (fp32), from the counter-based RNG keyed by (seed, parameter name,
 * element index within the parameter): any slice can be initialised alone
 * and gives the same values as initialising the whole unit. Elements past
 * the unit's numel (padding) are 0. */
void fsdp_model_init_range(const fsdp_model *m, int unit, size_t begin, size_t end, uint64_t seed,
                           float *dst);

/* Find a parameter by name; returns its unit and spec, or NULL. */
const fsdp_param_spec *fsdp_model_find_param(const fsdp_model *m, const char *name, int *unit);

/* Parameter i of unit `unit` inside the unit's flat buffer: in `params`
 * of dtype dt, or in the fp32 gradient buffer `grads` (which covers the
 * trainable parameters, [0, train_numel)); NULL when the unit has no
 * parameter i (the biases of a model without them), and fsdp_unit_grad's
 * NULL also when parameter i is frozen: the family's backward then skips
 * that weight gradient (no weight-gradient GEMM). */
const void *fsdp_unit_param(const fsdp_model *m, int unit, const void *params, int i,
                            fsdp_dtype dt);
float *fsdp_unit_grad(const fsdp_model *m, int unit, float *grads, int i);

void fsdp_model_free(fsdp_model *m);

/* ---- for the families' builders ---- */

/* The start of a family's init: m zeroed, given a malloc'd copy of the
 * family's config (cfg_bytes) as m->impl and n_layer + 1 units: the root
 * ("root", room for n_root parameter specs), then layer l as unit 1 + l
 * ("<layer_prefix>.<l>", room for n_layer_params). The caller adds the
 * parameters (fsdp_unit_add_param) and fills the other fields. OOM naming
 * `title` ("GPT-2"), m freed, on failure. */
fsdp_status fsdp_model_alloc_units(fsdp_model *m, const char *title, const void *cfg,
                                   size_t cfg_bytes, int n_layer, int n_root,
                                   int n_layer_params, const char *layer_prefix);

/* Set the shape every family records alike (fsdp_model's vocab_size,
 * padded_vocab_size, max_seq_len, n_layer, n_head, n_embd), from its config. */
void fsdp_model_set_shape(fsdp_model *m, int vocab_size, int padded_vocab_size, int max_seq_len,
                          int n_layer, int n_head, int n_embd);

/* Append a parameter of shape (d0) (d1 == 0) or (d0, d1) to u, at the end
 * of its flat buffer (u->numel grows); u has room for it. */
void fsdp_unit_add_param(fsdp_unit_spec *u, const char *name, int64_t d0, int64_t d1,
                         fsdp_init_kind init, float std, bool decay);

/* Lay every unit out again after parameters' `frozen` or `nf4` changed:
 * trainable parameters first, then the frozen dense ones, then the frozen
 * NF4 ones, each group in index order (indices do not change, so families
 * keep finding them); sets the units' train_numel and nf4_begin and the
 * model's train_numel. INVALID_ARG naming both when a fuse_next pair would
 * be split, naming the parameter when an NF4 one trains or is not a whole
 * number of NF4 blocks. */
fsdp_status fsdp_model_relayout(fsdp_model *m);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_MODELS_MODEL_H */
