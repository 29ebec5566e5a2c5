/*
 * gpt2.c - GPT-2 on the op interface: the unit and parameter layout
 * (models/gpt2.h) and forward/backward per unit. Configs are in
 * gpt2_config.c, named shapes and the family entry in gpt2_family.c, the
 * weight-file names in gpt2_weights.c.
 *
 * The math is llm.c's GPT-2 (pre-LayerNorm blocks, tanh GELU, causal
 * attention, LM head tied to wte, padded vocabulary), expressed only through
 * src/ops calls, so the same code runs on cpu, cuda and meta. The model never
 * reads or writes buffer contents itself: on meta the pointers are fake.
 *
 * Activations. A state holds, per layer, what backward needs (llm.c's saved
 * activations less the projection outputs, which only feed the residual
 * adds): ln1 + stats, qkv, atty, att, residual2, ln2 + stats, fch, fch_gelu,
 * residual3. A recompute mode (models/model.h) keeps some of them per layer
 * and one shared copy of the rest, which unit_recompute rebuilds before
 * each block's backward: block keeps residual3 (the next block's input),
 * elementwise keeps qkv, atty, att, residual2, fch and residual3 and reruns
 * the LayerNorms and the GELU. Forward-only states (eval, sampling) keep
 * one layer's set and reuse it for every layer. Training states add fp32
 * gradient scratch that is reused across layers (llm.c's grads_acts idea):
 * the residual-stream gradient and a few per-layer temporaries.
 *
 * Packed documents (models/model.h's state_positions): the position
 * embedding reads wpe at each token's position in its document, and the
 * attention is the grouped-query op with one kv head per query head
 * (hd = C / NH: GPT-2's layout) and the positions' document mask, so a
 * document sees only itself. Without positions both are by column, the
 * same ops bit for bit as before (attention_fwd is that op with pos NULL).
 *
 * Sampling: a forward-only state of (1, T) works for any prompt of length
 * <= T: fill the rest of the tokens with anything; logits at position t
 * depend only on tokens 0..t (causal attention).
 */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/act.h"
#include "models/gpt2.h"
#include "models/registry.h"

/* ---- parameter layout ---------------------------------------------------- */

/* Parameter indices within a unit (the order of gpt2.h). */
enum { ROOT_WTE = 0, ROOT_WPE, ROOT_LNFW, ROOT_LNFB, ROOT_N_PARAMS };
enum {
    BLK_LN1W = 0,
    BLK_LN1B,
    BLK_QKVW,
    BLK_QKVB,
    BLK_ATTPROJW,
    BLK_ATTPROJB,
    BLK_LN2W,
    BLK_LN2B,
    BLK_FCW,
    BLK_FCB,
    BLK_FCPROJW,
    BLK_FCPROJB,
    BLK_N_PARAMS
};

static const fsdp_act_model_i gpt2_model_i;

fsdp_status fsdp_gpt2_init(fsdp_model *m, const fsdp_gpt2_config *cfg)
{
    if (!m)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "fsdp_gpt2_init: model is NULL");
    memset(m, 0, sizeof *m);
    FSDP_TRY(fsdp_gpt2_config_validate(cfg));
    const int L = cfg->n_layer, C = cfg->n_embd;
    const float std = 0.02f;
    const float std_proj = 0.02f / sqrtf(2.0f * (float)L); /* GPT-2's scaled residual init */
    FSDP_TRY(fsdp_model_alloc_units(m, "GPT-2", cfg, sizeof *cfg, L, ROOT_N_PARAMS, BLK_N_PARAMS,
                                    "h"));
    m->iface = &gpt2_model_i.iface;
    m->family = &fsdp_gpt2_family;
    fsdp_gpt2_config_format(cfg, m->config, sizeof m->config);
    fsdp_model_spec_of(m, m->name, sizeof m->name);
    fsdp_model_set_shape(m, cfg->vocab_size, cfg->padded_vocab_size, cfg->max_seq_len,
                         cfg->n_layer, cfg->n_head, cfg->n_embd);

    fsdp_unit_spec *root = &m->units[0];
    fsdp_unit_add_param(root, "wte.weight", cfg->padded_vocab_size, C, FSDP_INIT_NORMAL, std,
                        true);
    fsdp_unit_add_param(root, "wpe.weight", cfg->max_seq_len, C, FSDP_INIT_NORMAL, std, false);
    fsdp_unit_add_param(root, "ln_f.weight", C, 0, FSDP_INIT_ONES, 0, false);
    fsdp_unit_add_param(root, "ln_f.bias", C, 0, FSDP_INIT_ZEROS, 0, false);
    m->numel = root->numel;

    for (int l = 0; l < L; l++) {
        fsdp_unit_spec *u = &m->units[1 + l];
        char name[64];
#define BLK_PARAM(suffix, d0, d1, init, sd, decay)                                       \
    do {                                                                                 \
        snprintf(name, sizeof name, "h.%d.%s", l, suffix);                               \
        fsdp_unit_add_param(u, name, d0, d1, init, sd, decay);                           \
    } while (0)
        BLK_PARAM("ln_1.weight", C, 0, FSDP_INIT_ONES, 0, false);
        BLK_PARAM("ln_1.bias", C, 0, FSDP_INIT_ZEROS, 0, false);
        BLK_PARAM("attn.c_attn.weight", 3 * C, C, FSDP_INIT_NORMAL, std, true);
        BLK_PARAM("attn.c_attn.bias", 3 * C, 0, FSDP_INIT_ZEROS, 0, false);
        BLK_PARAM("attn.c_proj.weight", C, C, FSDP_INIT_NORMAL, std_proj, true);
        BLK_PARAM("attn.c_proj.bias", C, 0, FSDP_INIT_ZEROS, 0, false);
        BLK_PARAM("ln_2.weight", C, 0, FSDP_INIT_ONES, 0, false);
        BLK_PARAM("ln_2.bias", C, 0, FSDP_INIT_ZEROS, 0, false);
        BLK_PARAM("mlp.c_fc.weight", 4 * C, C, FSDP_INIT_NORMAL, std, true);
        BLK_PARAM("mlp.c_fc.bias", 4 * C, 0, FSDP_INIT_ZEROS, 0, false);
        BLK_PARAM("mlp.c_proj.weight", C, 4 * C, FSDP_INIT_NORMAL, std_proj, true);
        BLK_PARAM("mlp.c_proj.bias", C, 0, FSDP_INIT_ZEROS, 0, false);
#undef BLK_PARAM
        m->numel += u->numel;
    }
    return FSDP_STATUS_OK;
}

const fsdp_gpt2_config *fsdp_gpt2_config_of(const fsdp_model *m)
{
    return m && m->iface == &gpt2_model_i.iface ? (const fsdp_gpt2_config *)m->impl : NULL;
}

/* ---- activations --------------------------------------------------------- */

/* Saved activations of one block; shapes per micro-batch (B, T). Which of
 * them a block owns and which are one copy shared by every block depends
 * on the state's mode (act_fields). */
typedef struct gpt2_layer_acts {
    void *ln1;             /* (B,T,C) dt */
    float *ln1_mean;       /* (B,T) */
    float *ln1_rstd;       /* (B,T) */
    void *qkv;             /* (B,T,3C) dt */
    void *atty;            /* (B,T,C) dt */
    void *att;             /* (B,NH,T,T) dt, softmax */
    void *residual2;       /* (B,T,C) dt */
    void *ln2;             /* (B,T,C) dt */
    float *ln2_mean;       /* (B,T) */
    float *ln2_rstd;       /* (B,T) */
    void *fch;             /* (B,T,4C) dt */
    void *fch_gelu;        /* (B,T,4C) dt */
    void *residual3;       /* (B,T,C) dt: the block's output */
} gpt2_layer_acts;

/* The fields of gpt2_layer_acts in allocation order, with their size per
 * token and the recompute modes that keep them per block. A field a mode
 * does not keep is one buffer shared by every block, written by each
 * block's forward and rebuilt by unit_recompute before its backward.
 * Outputs of one op (a norm and its statistics, attention's output and
 * softmax) share a keep set. Forward-only states keep nothing per block. */
enum {
    ACT_LN1 = 0, ACT_LN1_MEAN, ACT_LN1_RSTD, ACT_QKV, ACT_ATTY, ACT_ATT, ACT_RESIDUAL2, ACT_LN2,
    ACT_LN2_MEAN, ACT_LN2_RSTD, ACT_FCH, ACT_FCH_GELU, ACT_RESIDUAL3, ACT_N_FIELDS
};

/* width: per token, width * C elements in dt; 0: NH * T in dt (the
 * softmax); -1: one fp32 (norm statistics) */
#define ACT_FIELD(f, width, keep) {#f, offsetof(gpt2_layer_acts, f), width, keep}
static const fsdp_act_field act_fields[ACT_N_FIELDS] = {
    ACT_FIELD(ln1, 1, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(ln1_mean, -1, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(ln1_rstd, -1, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(qkv, 3, FSDP_ACT_KEEP_NONE_ELEMENTWISE),
    ACT_FIELD(atty, 1, FSDP_ACT_KEEP_NONE_ELEMENTWISE),
    ACT_FIELD(att, 0, FSDP_ACT_KEEP_NONE_ELEMENTWISE),
    ACT_FIELD(residual2, 1, FSDP_ACT_KEEP_NONE_ELEMENTWISE),
    ACT_FIELD(ln2, 1, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(ln2_mean, -1, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(ln2_rstd, -1, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(fch, 4, FSDP_ACT_KEEP_NONE_ELEMENTWISE),
    ACT_FIELD(fch_gelu, 4, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(residual3, 1, FSDP_ACT_KEEP_ALL),
};
#undef ACT_FIELD

typedef struct gpt2_state {
    fsdp_act_state base;      /* B, T, mode, layers, tokens, targets, logits, losses, dlogits */

    int *targets;             /* (B*T) int32 */
    void *encoded;            /* (B,T,C) dt: embeddings, input of block 0 */
    void *proj;               /* (B,T,C) dt scratch: projection output before a residual add */
    void *lnf;                /* (B,T,C) dt */
    float *lnf_mean;          /* (B,T) */
    float *lnf_rstd;          /* (B,T) */

    /* training only (fp32) */
    float *dres;              /* (B,T,C) gradient of the residual stream */
    float *dC;                /* (B,T,C) scratch: dln1, datty, dln2, dlnf */
    float *d4C_a;             /* (B,T,4C) scratch: dfch_gelu, then dqkv (3C) */
    float *d4C_b;             /* (B,T,4C) scratch: dfch */
    float *datt;              /* (B,NH,T,T) scratch for attention backward */
} gpt2_state;

static const fsdp_gpt2_config *cfg_of(const fsdp_model *m)
{
    return (const fsdp_gpt2_config *)m->impl;
}

static size_t field_bytes(const fsdp_model *m, const void *state, int width, size_t dts);

static const fsdp_act_layout act_layout = {act_fields, ACT_N_FIELDS, sizeof(gpt2_layer_acts),
                                           field_bytes};

/* Whether each block has its own copy of field f (else one shared copy). */
static bool kept(const gpt2_state *s, int f)
{
    return fsdp_act_kept(&act_layout, f, s->base.training, s->base.mode);
}


/* Bytes of a saved activation of `width` (act_fields) for s's micro-batch. */
static size_t field_bytes(const fsdp_model *m, const void *state, int width, size_t dts)
{
    const fsdp_gpt2_config *cfg = cfg_of(m);
    const gpt2_state *s = state;
    const size_t N = (size_t)s->base.B * s->base.T;
    return width > 0   ? N * (size_t)width * cfg->n_embd * dts
           : width == 0 ? N * (size_t)cfg->n_head * s->base.T * dts
                        : N * sizeof(float);
}

static fsdp_status state_alloc(const fsdp_model *m, fsdp_op_ctx *ctx, int B, int T,
                               bool training, fsdp_recompute mode, void **state)
{
    const fsdp_gpt2_config *cfg = cfg_of(m);
    const int L = cfg->n_layer, C = cfg->n_embd, NH = cfg->n_head, Vp = cfg->padded_vocab_size;
    *state = NULL;
    FSDP_TRY(fsdp_act_check_batch(m, B, T, (double)B * T * NH * T <= (double)INT_MAX, mode));

    const size_t N = (size_t)B * T, dts = fsdp_dtype_size(ctx->dt), f4 = sizeof(float);
    const size_t natt = (size_t)B * NH * T * T;
    void *p;
    FSDP_TRY(fsdp_act_state_new(m, sizeof(gpt2_state), sizeof(gpt2_layer_acts), B, T,
                                training, mode, ACT_N_FIELDS * L + 16, &p));
    gpt2_state *s = p;
    fsdp_act_set *a = &s->base.act;
    fsdp_status st = FSDP_STATUS_OK;
    FSDP_CHECK(fsdp_act_state_alloc_io(ctx, &s->base));
    FSDP_CHECK(fsdp_act_alloc(ctx, a, N * C * dts, "encoded", -1, &s->encoded));
    FSDP_CHECK(fsdp_act_alloc(ctx, a, N * C * dts, "proj", -1, &s->proj));
    FSDP_CHECK(fsdp_act_layers_alloc(m, ctx, a, &act_layout, s, s->base.layers, training,
                                     s->base.mode));
    FSDP_CHECK(fsdp_act_alloc(ctx, a, N * C * dts, "lnf", -1, &s->lnf));
    FSDP_CHECK(fsdp_act_alloc(ctx, a, N * f4, "lnf_mean", -1, &s->lnf_mean));
    FSDP_CHECK(fsdp_act_alloc(ctx, a, N * f4, "lnf_rstd", -1, &s->lnf_rstd));
    FSDP_CHECK(fsdp_act_state_alloc_head(ctx, &s->base, Vp));
    if (training) {
        FSDP_CHECK(fsdp_act_alloc(ctx, a, N * C * f4, "dresidual", -1, &s->dres));
        FSDP_CHECK(fsdp_act_alloc(ctx, a, N * C * f4, "dC scratch", -1, &s->dC));
        FSDP_CHECK(fsdp_act_alloc(ctx, a, N * 4 * C * f4, "d4C scratch a", -1, &s->d4C_a));
        FSDP_CHECK(fsdp_act_alloc(ctx, a, N * 4 * C * f4, "d4C scratch b", -1, &s->d4C_b));
        FSDP_CHECK(fsdp_act_alloc(ctx, a, natt * f4, "datt scratch", -1, &s->datt));
    }
    *state = s;
    return FSDP_STATUS_OK;

fail:
    return fsdp_act_state_fail(m, ctx, s, st);
}

/* ---- forward / backward -------------------------------------------------- */

static gpt2_layer_acts *layer_acts(gpt2_state *s, int l)
{
    return (gpt2_layer_acts *)s->base.layers + l;
}

/* Input of block l: the embeddings or the previous block's output. */
static void *block_input(gpt2_state *s, int l)
{
    return l == 0 ? s->encoded : layer_acts(s, l - 1)->residual3;
}

static fsdp_status gpt2_root_forward(const fsdp_model *m, fsdp_op_ctx *ctx, void *state,
                                     const void *root_params)
{
    FSDP_TRY(fsdp_act_check_state(m, state, false, "root_forward"));
    gpt2_state *s = state;
    const int C = cfg_of(m)->n_embd;
    FSDP_OP(ctx, embed_fwd, s->encoded, s->base.tokens, s->base.pos,
            fsdp_unit_param(m, 0, root_params, ROOT_WTE, ctx->dt),
            fsdp_unit_param(m, 0, root_params, ROOT_WPE, ctx->dt), s->base.B, s->base.T, C);
    return fsdp_act_ops_status(ctx, m, "forward", 0);
}

/* Block `unit`'s forward ops. redo=false: all of them (unit_forward);
 * redo=true: only those whose outputs the state does not keep per block
 * (unit_recompute). The calls are the same on the same inputs either way,
 * so recomputed activations are bit-identical to the forward's. An op
 * reruns only if its output is dropped, so every mode's act_fields must
 * let a rerun op read only kept or rerun outputs (the block input is kept
 * by every mode: it is the previous block's residual3 or the embeddings). */
static fsdp_status block_forward(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, int unit,
                                 const void *params, bool redo)
{
    gpt2_state *s = state;
    const fsdp_gpt2_config *cfg = cfg_of(m);
    const int C = cfg->n_embd, NH = cfg->n_head, B = s->base.B, T = s->base.T, N = B * T,
              l = unit - 1;
    const fsdp_dtype dt = ctx->dt;
#define P(i) fsdp_unit_param(m, unit, params, (i), dt)
#define RUN(field) (!redo || !kept(s, field))
    gpt2_layer_acts *a = layer_acts(s, l);
    void *inp = block_input(s, l);
    if (RUN(ACT_LN1))
        FSDP_OP(ctx, layernorm_fwd, a->ln1, a->ln1_mean, a->ln1_rstd, inp, P(BLK_LN1W),
                P(BLK_LN1B), N, C);
    if (RUN(ACT_QKV))
        FSDP_OP(ctx, matmul_fwd, a->qkv, a->ln1, P(BLK_QKVW), P(BLK_QKVB), N, C, 3 * C);
    if (RUN(ACT_ATTY))
        FSDP_OP(ctx, attention_gqa_fwd, a->atty, a->att, a->qkv, s->base.pos, B, T, NH, NH,
                C / NH);
    if (RUN(ACT_RESIDUAL2)) {
        FSDP_OP(ctx, matmul_fwd, s->proj, a->atty, P(BLK_ATTPROJW), P(BLK_ATTPROJB), N, C, C);
        FSDP_OP(ctx, residual_fwd, a->residual2, inp, s->proj, (size_t)N * C);
    }
    if (RUN(ACT_LN2))
        FSDP_OP(ctx, layernorm_fwd, a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, P(BLK_LN2W),
                P(BLK_LN2B), N, C);
    if (RUN(ACT_FCH))
        FSDP_OP(ctx, matmul_fwd, a->fch, a->ln2, P(BLK_FCW), P(BLK_FCB), N, C, 4 * C);
    if (RUN(ACT_FCH_GELU))
        FSDP_OP(ctx, gelu_fwd, a->fch_gelu, a->fch, (size_t)N * 4 * C);
    if (RUN(ACT_RESIDUAL3)) {
        FSDP_OP(ctx, matmul_fwd, s->proj, a->fch_gelu, P(BLK_FCPROJW), P(BLK_FCPROJB), N, 4 * C,
                C);
        FSDP_OP(ctx, residual_fwd, a->residual3, a->residual2, s->proj, (size_t)N * C);
    }
#undef RUN
#undef P
    return fsdp_act_ops_status(ctx, m, redo ? "recompute" : "forward", unit);
}

/* Matmul and attention FLOPs of what unit_recompute reruns (2 per
 * multiply-add, as gpt2_flops_per_token counts them): BLOCK reruns a
 * block's forward up to the GELU (qkv 6C^2, attention projection 2C^2,
 * fc 8C^2 per token, and attention's 4CT), ELEMENTWISE only norms and
 * the GELU. */
static double gpt2_recompute_flops_per_token(const fsdp_model *m, int T, fsdp_recompute mode)
{
    const fsdp_gpt2_config *c = cfg_of(m);
    double C = c->n_embd;
    if (mode != FSDP_RECOMPUTE_BLOCK)
        return 0.0;
    return c->n_layer * (16.0 * C * C + 4.0 * C * T);
}

static fsdp_status gpt2_head_forward_backward(const fsdp_model *m, fsdp_op_ctx *ctx, void *state,
                                              const void *root_params, float *root_grads,
                                              float dloss, float *loss)
{
    FSDP_TRY(fsdp_act_check_state(m, state, root_grads != NULL, "head_forward_backward"));
    gpt2_state *s = state;
    const fsdp_gpt2_config *cfg = cfg_of(m);
    const int C = cfg->n_embd, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    const int N = s->base.B * s->base.T;
    const fsdp_dtype dt = ctx->dt;
    const void *wte = fsdp_unit_param(m, 0, root_params, ROOT_WTE, dt);
    const void *lnfw = fsdp_unit_param(m, 0, root_params, ROOT_LNFW, dt);
    void *last = layer_acts(s, cfg->n_layer - 1)->residual3;

    FSDP_OP(ctx, layernorm_fwd, s->lnf, s->lnf_mean, s->lnf_rstd, last, lnfw,
            fsdp_unit_param(m, 0, root_params, ROOT_LNFB, dt), N, C);
    FSDP_OP(ctx, matmul_fwd, s->base.logits, s->lnf, wte, NULL, N, C, Vp);
    FSDP_TRY(fsdp_act_state_loss(ctx, m, &s->base, V, Vp, dloss, root_grads != NULL, loss));
    if (!root_grads)
        return FSDP_STATUS_OK;

    /* Backward: logits = lnf @ wte^T, then the final LayerNorm; dres starts here. */
    FSDP_TRY(fsdp_act_zero(ctx, s->dC, (size_t)N * C));
    FSDP_OP(ctx, matmul_bwd, s->dC, fsdp_unit_grad(m, 0, root_grads, ROOT_WTE), NULL,
            s->base.dlogits,
            s->lnf, wte, N, C, Vp);
    FSDP_TRY(fsdp_act_zero(ctx, s->dres, (size_t)N * C));
    FSDP_OP(ctx, layernorm_bwd, s->dres, fsdp_unit_grad(m, 0, root_grads, ROOT_LNFW),
            fsdp_unit_grad(m, 0, root_grads, ROOT_LNFB), s->dC, last, lnfw, s->lnf_mean,
            s->lnf_rstd, N, C);
    return fsdp_act_ops_status(ctx, m, "head backward", 0);
}

static fsdp_status gpt2_unit_backward(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, int unit,
                                      const void *params, float *grads)
{
    FSDP_TRY(fsdp_act_check_backward(m, state, unit));
    gpt2_state *s = state;
    const fsdp_gpt2_config *cfg = cfg_of(m);
    const int C = cfg->n_embd, NH = cfg->n_head, B = s->base.B, T = s->base.T, N = B * T,
              l = unit - 1;
    const size_t NC = (size_t)N * C;
    const fsdp_dtype dt = ctx->dt;
#define P(i) fsdp_unit_param(m, unit, params, (i), dt)
#define G(i) fsdp_unit_grad(m, unit, grads, (i))
    gpt2_layer_acts *a = layer_acts(s, l);
    void *inp = block_input(s, l);
    /* s->dres holds d(residual3); it is also d(residual2) through the skip
     * connection, and the LayerNorm backward adds the branch's share. */
    float *dfch_gelu = s->d4C_a, *dfch = s->d4C_b, *dqkv = s->d4C_a;

    /* MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))) */
    FSDP_TRY(fsdp_act_zero(ctx, dfch_gelu, 4 * NC));
    FSDP_OP(ctx, matmul_bwd, dfch_gelu, G(BLK_FCPROJW), G(BLK_FCPROJB), s->dres, a->fch_gelu,
            P(BLK_FCPROJW), N, 4 * C, C);
    FSDP_TRY(fsdp_act_zero(ctx, dfch, 4 * NC));
    FSDP_OP(ctx, gelu_bwd, dfch, a->fch, dfch_gelu, 4 * NC);
    FSDP_TRY(fsdp_act_zero(ctx, s->dC, NC));
    FSDP_OP(ctx, matmul_bwd, s->dC, G(BLK_FCW), G(BLK_FCB), dfch, a->ln2, P(BLK_FCW), N, C,
            4 * C);
    FSDP_OP(ctx, layernorm_bwd, s->dres, G(BLK_LN2W), G(BLK_LN2B), s->dC, a->residual2,
            P(BLK_LN2W), a->ln2_mean, a->ln2_rstd, N, C);

    /* Attention: residual2 = inp + attproj(attention(qkv(ln1(inp)))) */
    FSDP_TRY(fsdp_act_zero(ctx, s->dC, NC));
    FSDP_OP(ctx, matmul_bwd, s->dC, G(BLK_ATTPROJW), G(BLK_ATTPROJB), s->dres, a->atty,
            P(BLK_ATTPROJW), N, C, C);
    FSDP_TRY(fsdp_act_zero(ctx, dqkv, 3 * NC));
    FSDP_TRY(fsdp_act_zero(ctx, s->datt, (size_t)B * NH * T * T));
    FSDP_OP(ctx, attention_gqa_bwd, dqkv, s->datt, s->dC, a->qkv, a->att, B, T, NH, NH, C / NH);
    FSDP_TRY(fsdp_act_zero(ctx, s->dC, NC));
    FSDP_OP(ctx, matmul_bwd, s->dC, G(BLK_QKVW), G(BLK_QKVB), dqkv, a->ln1, P(BLK_QKVW), N, C,
            3 * C);
    FSDP_OP(ctx, layernorm_bwd, s->dres, G(BLK_LN1W), G(BLK_LN1B), s->dC, inp, P(BLK_LN1W),
            a->ln1_mean, a->ln1_rstd, N, C);
#undef P
#undef G
    return fsdp_act_ops_status(ctx, m, "backward", unit);
}

static fsdp_status gpt2_root_backward(const fsdp_model *m, fsdp_op_ctx *ctx, void *state,
                                      const void *root_params, float *root_grads)
{
    FSDP_TRY(fsdp_act_check_state(m, state, true, "root_backward"));
    gpt2_state *s = state;
    const int C = cfg_of(m)->n_embd;
    FSDP_OP(ctx, embed_bwd, fsdp_unit_grad(m, 0, root_grads, ROOT_WTE),
            fsdp_unit_grad(m, 0, root_grads, ROOT_WPE), s->dres, s->base.tokens, s->base.pos,
            s->base.B, s->base.T, C);
    return fsdp_act_ops_status(ctx, m, "backward", 0);
}

static const fsdp_act_model_i gpt2_model_i = {
    /* .iface = */ {
        /* .state_init            = */ fsdp_act_state_init,
        /* .state_free            = */ fsdp_act_state_free,
        /* .state_tokens          = */ fsdp_act_state_tokens,
        /* .state_targets         = */ fsdp_act_state_targets,
        /* .state_logits          = */ fsdp_act_state_logits,
        /* .root_forward          = */ gpt2_root_forward,
        /* .unit_forward          = */ fsdp_act_unit_forward,
        /* .head_forward_backward = */ gpt2_head_forward_backward,
        /* .unit_backward         = */ gpt2_unit_backward,
        /* .root_backward         = */ gpt2_root_backward,
        /* .state_init_recompute  = */ fsdp_act_state_init_recompute,
        /* .unit_recompute        = */ fsdp_act_unit_recompute,
        /* .recompute_flops_per_token = */ gpt2_recompute_flops_per_token,
        /* .state_positions       = */ fsdp_act_state_positions,
        /* .state_len             = */ fsdp_act_state_len,
    },
    /* .state_alloc   = */ state_alloc,
    /* .layer_forward = */ block_forward,
};
