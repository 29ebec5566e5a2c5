/*
 * llama.c - the Llama family on the op interface: the unit and parameter
 * layout (models/llama.h) and forward/backward per unit. Configs are in
 * llama_config.c, named shapes and the family entry in llama_family.c, the
 * weight-file names and Hugging Face config.json in llama_weights.c.
 *
 * The math is transformers' LlamaForCausalLM (Qwen2ForCausalLM with q/k/v
 * biases), expressed only through src/ops calls so the same code runs on
 * cpu, cuda and meta; the model never reads or writes buffer contents
 * itself. The fused layouts of the unit (q|k|v rows, gate|up rows, and the
 * q|k|v biases) make each projection one matmul: the fused qkv rows are
 * exactly what rope_fwd and attention_gqa_fwd read, and [gate | up] is
 * swiglu_fwd's input.
 *
 * With LoRA adapters (models/lora.h), each adapted projection adds its
 * branch with lora_fwd right after its base product (q, k, v as column
 * slices of the fused q|k|v output, gate and up of gate|up) and runs
 * lora_bwd beside its matmul_bwd on the same slice of the output's
 * gradient. A frozen parameter's gradient is NULL (fsdp_unit_grad), and
 * the op then skips that weight gradient. With frozen embeddings nothing
 * takes the first block's input gradient, so its backward stops at the
 * q|k|v weights' and adapters' gradients (no input-gradient GEMMs there).
 *
 * Token embeddings are the embed op with one all-zero position row: the
 * B*T tokens are passed as B*T sequences of length 1, so every token adds
 * row 0 of a (1, C) zero table (x + 0 = x exactly, in fp32 and in bf16),
 * and the backward (dwpe NULL) adds the rows in the same (b, t) order.
 *
 * Activations follow GPT-2's layout (gpt2.c): per layer what backward needs
 * (ln1 + rstd, qkv after rope, atty, att, residual2, ln2 + rstd, gate|up,
 * swiglu output, residual3). A recompute mode (models/model.h) keeps some
 * of them per layer and one shared copy of the rest, which unit_recompute
 * rebuilds before each layer's backward: block keeps residual3 (the next
 * layer's input), elementwise keeps qkv (rotated), atty, att, residual2,
 * gate|up and residual3 and reruns the RMSNorms and the SwiGLU.
 * Forward-only states keep one layer's set and reuse it for every layer;
 * training states add fp32 gradient scratch reused across layers. The rope
 * frequency table (hd/2 floats, from rope_table.h) and the zero position
 * row live in the state, allocated through the device like the rest.
 */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/act.h"
#include "models/llama.h"
#include "models/lora.h"
#include "models/registry.h"

/* ---- parameter layout ---------------------------------------------------- */

enum { ROOT_EMBED = 0, ROOT_NORM, ROOT_HEAD, ROOT_N_PARAMS };
enum {
    BLK_LN1 = 0,
    BLK_Q,    /* q, k, v: one (QS, C) matrix */
    BLK_K,
    BLK_V,
    BLK_O,
    BLK_LN2,
    BLK_GATE, /* gate, up: one (2 IC, C) matrix */
    BLK_UP,
    BLK_DOWN,
    BLK_QB,   /* q, k, v biases (qkv_bias only): one (QS,) vector */
    BLK_KB,
    BLK_VB,
    BLK_N_PARAMS
};

/* The linear layers LoRA may target, in lora_modules order. */
enum { LORA_Q = 0, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN };
/* Layers that read one input form a LoRA group of up to this many (q, k, v). */
#define LORA_MAX_GROUP 3
const fsdp_lora_module fsdp_llama_lora_modules[FSDP_LLAMA_N_LORA_MODULES] = {
    [LORA_Q] = {"self_attn.q_proj", BLK_Q},     [LORA_K] = {"self_attn.k_proj", BLK_K},
    [LORA_V] = {"self_attn.v_proj", BLK_V},     [LORA_O] = {"self_attn.o_proj", BLK_O},
    [LORA_GATE] = {"mlp.gate_proj", BLK_GATE}, [LORA_UP] = {"mlp.up_proj", BLK_UP},
    [LORA_DOWN] = {"mlp.down_proj", BLK_DOWN},
};

static void add_param(fsdp_unit_spec *u, const char *name, int64_t d0, int64_t d1,
                      fsdp_init_kind init, bool decay)
{
    float std = init == FSDP_INIT_NORMAL ? 0.02f : 0.0f; /* HF initializer_range */
    fsdp_unit_add_param(u, name, d0, d1, init, std, decay);
}

static const fsdp_act_model_i llama_model_i;

fsdp_status fsdp_llama_init(fsdp_model *m, const fsdp_llama_config *cfg)
{
    if (!m)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "fsdp_llama_init: model is NULL");
    memset(m, 0, sizeof *m);
    FSDP_TRY(fsdp_llama_config_validate(cfg));
    const int L = cfg->n_layer, C = cfg->n_embd, hd = cfg->head_dim, IC = cfg->n_inter;
    const int64_t QH = (int64_t)cfg->n_head * hd, KVH = (int64_t)cfg->n_kv_head * hd;
    FSDP_TRY(fsdp_model_alloc_units(m, "Llama", cfg, sizeof *cfg, L, ROOT_N_PARAMS, BLK_N_PARAMS,
                                    "layers"));
    m->iface = &llama_model_i.iface;
    m->family = &fsdp_llama_family;
    fsdp_llama_config_format(cfg, m->config, sizeof m->config);
    fsdp_model_spec_of(m, m->name, sizeof m->name);
    fsdp_model_set_shape(m, cfg->vocab_size, cfg->padded_vocab_size, cfg->max_seq_len,
                         cfg->n_layer, cfg->n_head, cfg->n_embd);

    fsdp_unit_spec *root = &m->units[0];
    add_param(root, "model.embed_tokens.weight", cfg->padded_vocab_size, C, FSDP_INIT_NORMAL,
              true);
    add_param(root, "model.norm.weight", C, 0, FSDP_INIT_ONES, false);
    if (!cfg->tied)
        add_param(root, "lm_head.weight", cfg->padded_vocab_size, C, FSDP_INIT_NORMAL, true);
    m->numel = root->numel;

    for (int l = 0; l < L; l++) {
        fsdp_unit_spec *u = &m->units[1 + l];
        char name[64];
#define BLK_PARAM(suffix, d0, d1, init, decay)                                           \
    do {                                                                                 \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);                    \
        add_param(u, name, d0, d1, init, decay);                                         \
    } while (0)
        BLK_PARAM("input_layernorm.weight", C, 0, FSDP_INIT_ONES, false);
        BLK_PARAM("self_attn.q_proj.weight", QH, C, FSDP_INIT_NORMAL, true);
        BLK_PARAM("self_attn.k_proj.weight", KVH, C, FSDP_INIT_NORMAL, true);
        BLK_PARAM("self_attn.v_proj.weight", KVH, C, FSDP_INIT_NORMAL, true);
        BLK_PARAM("self_attn.o_proj.weight", C, QH, FSDP_INIT_NORMAL, true);
        BLK_PARAM("post_attention_layernorm.weight", C, 0, FSDP_INIT_ONES, false);
        BLK_PARAM("mlp.gate_proj.weight", IC, C, FSDP_INIT_NORMAL, true);
        BLK_PARAM("mlp.up_proj.weight", IC, C, FSDP_INIT_NORMAL, true);
        BLK_PARAM("mlp.down_proj.weight", C, IC, FSDP_INIT_NORMAL, true);
        if (cfg->qkv_bias) {
            BLK_PARAM("self_attn.q_proj.bias", QH, 0, FSDP_INIT_ZEROS, false);
            BLK_PARAM("self_attn.k_proj.bias", KVH, 0, FSDP_INIT_ZEROS, false);
            BLK_PARAM("self_attn.v_proj.bias", KVH, 0, FSDP_INIT_ZEROS, false);
            u->params[BLK_QB].fuse_next = u->params[BLK_KB].fuse_next = true;
        }
#undef BLK_PARAM
        /* read as one tensor each: q|k|v, gate|up (and the q|k|v biases) */
        u->params[BLK_Q].fuse_next = u->params[BLK_K].fuse_next = true;
        u->params[BLK_GATE].fuse_next = true;
        m->numel += u->numel;
    }
    return FSDP_STATUS_OK;
}

const fsdp_llama_config *fsdp_llama_config_of(const fsdp_model *m)
{
    return m && m->iface == &llama_model_i.iface ? (const fsdp_llama_config *)m->impl : NULL;
}

/* ---- activations --------------------------------------------------------- */

/* Saved activations of one decoder layer; shapes per micro-batch (B, T),
 * QS = (NH + 2 NKV) hd, AH = NH hd. */
typedef struct llama_layer_acts {
    void *ln1;             /* (B,T,C) dt */
    float *ln1_rstd;       /* (B,T) */
    void *qkv;             /* (B,T,QS) dt, q and k rotated */
    void *atty;            /* (B,T,AH) dt */
    void *att;             /* (B,NH,T,T) dt, softmax */
    void *residual2;       /* (B,T,C) dt */
    void *ln2;             /* (B,T,C) dt */
    float *ln2_rstd;       /* (B,T) */
    void *gu;              /* (B,T,2IC) dt: [gate | up] */
    void *swi;             /* (B,T,IC) dt: silu(gate) * up */
    void *residual3;       /* (B,T,C) dt: the layer's output */
    /* LoRA (models with adapters only): u = x A^T of each adapted layer */
    void *lora_u;          /* (n, B,T,r) dt: q, k, v, o, gate, up's, n of them (lora_slot) */
    void *lora_ud;         /* (B,T,r) dt: down's */
} llama_layer_acts;

/* The fields of llama_layer_acts in allocation order, with their width per
 * token and the recompute modes that keep them per layer (models/model.h;
 * gpt2.c has the same table). A field a mode does not keep is one buffer
 * shared by every layer, written by each layer's forward and rebuilt by
 * unit_recompute before its backward. Outputs of one op (a norm and its
 * rstd, attention's output and softmax) share a keep set. RoPE rotates qkv
 * in place and attention's backward reads only the rotated qkv, so keeping
 * the rotated qkv costs no byte more than keeping the matmul's output:
 * elementwise keeps it and never reruns RoPE. Forward-only states keep
 * nothing per layer. */
enum {
    ACT_LN1 = 0, ACT_LN1_RSTD, ACT_QKV, ACT_ATTY, ACT_ATT, ACT_RESIDUAL2, ACT_LN2, ACT_LN2_RSTD,
    ACT_GU, ACT_SWI, ACT_RESIDUAL3, ACT_N_FIELDS
};

/* Width of a field per token. */
typedef enum act_width {
    W_C = 0, /* C in dt */
    W_QS,    /* (NH + 2 NKV) hd in dt */
    W_AH,    /* NH hd in dt */
    W_ATT,   /* NH T in dt: the softmax */
    W_2IC,   /* 2 IC in dt */
    W_IC,    /* IC in dt */
    W_STAT,  /* one fp32: a norm's rstd */
    W_LORA_U, /* r per adapted layer but down, in dt */
    W_LORA_R, /* r in dt */
} act_width;

#define ACT_FIELD(f, name, width, keep) {name, offsetof(llama_layer_acts, f), width, keep}
static const fsdp_act_field act_fields[ACT_N_FIELDS] = {
    ACT_FIELD(ln1, "ln1", W_C, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(ln1_rstd, "ln1_rstd", W_STAT, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(qkv, "qkv", W_QS, FSDP_ACT_KEEP_NONE_ELEMENTWISE),
    ACT_FIELD(atty, "atty", W_AH, FSDP_ACT_KEEP_NONE_ELEMENTWISE),
    ACT_FIELD(att, "att", W_ATT, FSDP_ACT_KEEP_NONE_ELEMENTWISE),
    ACT_FIELD(residual2, "residual2", W_C, FSDP_ACT_KEEP_NONE_ELEMENTWISE),
    ACT_FIELD(ln2, "ln2", W_C, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(ln2_rstd, "ln2_rstd", W_STAT, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(gu, "gate_up", W_2IC, FSDP_ACT_KEEP_NONE_ELEMENTWISE),
    ACT_FIELD(swi, "swiglu", W_IC, FSDP_ACT_KEEP_NONE_ONLY),
    ACT_FIELD(residual3, "residual3", W_C, FSDP_ACT_KEEP_ALL),
};

/* A model with adapters keeps u = x A^T per adapted layer as the matmul
 * output it belongs to is kept: the u of q, k, v, o, gate and up go with
 * qkv, residual2 and gate_up (kept per layer by none and elementwise,
 * rebuilt by block's unit_recompute: the LoRA op reruns with its base
 * product), down's with residual3 (every mode keeps it; the down product is
 * never rerun). Allocated after the fields above, so a model without
 * adapters allocates exactly what it did. */
enum { LORA_ACT_U = 0, LORA_ACT_UD, LORA_ACT_N_FIELDS };
static const fsdp_act_field lora_act_fields[LORA_ACT_N_FIELDS] = {
    ACT_FIELD(lora_u, "lora_u", W_LORA_U, FSDP_ACT_KEEP_NONE_ELEMENTWISE),
    ACT_FIELD(lora_ud, "lora_u_down", W_LORA_R, FSDP_ACT_KEEP_ALL),
};
#undef ACT_FIELD

typedef struct llama_state {
    fsdp_act_state base;      /* B, T, mode, layers, tokens, targets, logits, losses, dlogits */

    int *targets;             /* (B*T) int32, < 0: no loss */
    void *zero_pos;           /* (1,C) dt, zeros: the embed op's position row */
    float *inv_freq;          /* (hd/2) rope frequencies */
    void *encoded;            /* (B,T,C) dt: embeddings, input of layer 0 */
    void *proj;               /* (B,T,C) dt scratch: a projection before its residual add */
    void *lnf;                /* (B,T,C) dt */
    float *lnf_rstd;          /* (B,T) */

    /* training only (fp32) */
    float *dres;              /* (B,T,C) gradient of the residual stream */
    float *dC;                /* (B,T,C) scratch: dln1, dln2, dlnf */
    float *dwide;             /* (B,T,max(QS,2IC)) scratch: dgu, then dqkv */
    float *dmid;              /* (B,T,max(IC,AH)) scratch: dswi, then datty */
    float *datt;              /* (B,NH,T,T) scratch for attention backward */

    /* LoRA (models with adapters only) */
    int lora_slot[FSDP_LLAMA_N_LORA_MODULES]; /* a layer's place in lora_u, -1: none */
    int lora_n;               /* layers in lora_u (adapted in some block; down apart) */
    float lora_scale;         /* alpha / r (rslora: alpha / sqrt(r)) */
    float *lora_dv;           /* (B,T,3r) fp32 scratch of lora_bwd (training): a group's dv */
    void *lora_apack;         /* (3r,C) dt: a group's A's side by side (lora_pack) */
    float *lora_dapack;       /* (3r,C) fp32: their gradients (training) */
} llama_state;

static const fsdp_llama_config *cfg_of(const fsdp_model *m)
{
    return (const fsdp_llama_config *)m->impl;
}

static size_t field_bytes(const fsdp_model *m, const void *state, int width, size_t dts);

static const fsdp_act_layout act_layout = {act_fields, ACT_N_FIELDS, sizeof(llama_layer_acts),
                                           field_bytes};

/* Whether each layer has its own copy of field f (else one shared copy). */
static bool kept(const llama_state *s, int f)
{
    return fsdp_act_kept(&act_layout, f, s->base.training, s->base.mode);
}

/* The rope table, computed on the host and copied to the device (the copy
 * finishes before the host buffer goes). */
static fsdp_status upload_inv_freq(fsdp_op_ctx *ctx, const fsdp_llama_config *cfg, float *dst)
{
    const int half = cfg->head_dim / 2;
    float *host = malloc((size_t)half * sizeof *host);
    if (!host)
        return fsdp_error_set(FSDP_STATUS_OOM, "host allocation of a rope table failed");
    fsdp_status st = fsdp_rope_inv_freq(&cfg->rope, cfg->head_dim, host);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_memcpy(ctx->dev, dst, host, (size_t)half * sizeof *host, ctx->stream);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_stream_sync(ctx->dev, ctx->stream);
    free(host);
    return st;
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Bytes of a saved activation of `width` (act_width) for s's micro-batch. */
static size_t field_bytes(const fsdp_model *m, const void *state, int width, size_t dts)
{
    const fsdp_llama_config *cfg = cfg_of(m);
    const llama_state *s = state;
    const size_t N = (size_t)s->base.B * s->base.T, hd = (size_t)cfg->head_dim;
    switch ((act_width)width) {
    case W_C: return N * (size_t)cfg->n_embd * dts;
    case W_QS: return N * (size_t)(cfg->n_head + 2 * cfg->n_kv_head) * hd * dts;
    case W_AH: return N * (size_t)cfg->n_head * hd * dts;
    case W_ATT: return N * (size_t)cfg->n_head * (size_t)s->base.T * dts;
    case W_2IC: return N * 2 * (size_t)cfg->n_inter * dts;
    case W_IC: return N * (size_t)cfg->n_inter * dts;
    case W_STAT: return N * sizeof(float);
    case W_LORA_U: return N * (size_t)m->lora.r * (size_t)s->lora_n * dts;
    case W_LORA_R: return N * (size_t)m->lora.r * dts;
    }
    FSDP_ASSERT(!"unknown activation width");
    return 0;
}

/* Which of the family's linear layers have adapters in some block: down
 * apart, their places in lora_u (lora_slot, lora_n); and whether down has. */
static bool lora_slots(const fsdp_model *m, llama_state *s)
{
    bool down = false;
    s->lora_n = 0;
    for (int k = 0; k < FSDP_LLAMA_N_LORA_MODULES; k++) {
        bool any = false;
        int ia, ib;
        for (int u = 1; u < m->n_units && !any; u++)
            any = fsdp_lora_find(m, u, k, &ia, &ib);
        s->lora_slot[k] = any && k != LORA_DOWN ? s->lora_n++ : -1;
        down |= any && k == LORA_DOWN;
    }
    return down;
}

/* The LoRA buffers of a state (nothing without adapters): u per layer as
 * lora_act_fields says, and lora_bwd's dv scratch once. */
static fsdp_status lora_state_alloc(const fsdp_model *m, fsdp_op_ctx *ctx, llama_state *s,
                                    bool training)
{
    if (m->lora.r <= 0)
        return FSDP_STATUS_OK;
    s->lora_scale = (float)fsdp_lora_scale(&m->lora);
    const bool down = lora_slots(m, s);
    const int first = s->lora_n > 0 ? LORA_ACT_U : LORA_ACT_UD;
    const int n = (s->lora_n > 0) + down;
    const fsdp_act_layout lay = {lora_act_fields + first, n, sizeof(llama_layer_acts),
                                 field_bytes};
    if (n > 0)
        FSDP_TRY(fsdp_act_layers_alloc(m, ctx, &s->base.act, &lay, s, s->base.layers, training,
                                       s->base.mode));
    const size_t pack = (size_t)LORA_MAX_GROUP * m->lora.r * cfg_of(m)->n_embd;
    FSDP_TRY(fsdp_act_alloc(ctx, &s->base.act, pack * fsdp_dtype_size(ctx->dt), "lora A pack",
                            -1, &s->lora_apack));
    if (!training)
        return FSDP_STATUS_OK;
    const size_t N = (size_t)s->base.B * s->base.T;
    FSDP_TRY(fsdp_act_alloc(ctx, &s->base.act, pack * sizeof(float), "lora dA pack", -1,
                            (void **)&s->lora_dapack));
    return fsdp_act_alloc(ctx, &s->base.act,
                          N * (size_t)m->lora.r * LORA_MAX_GROUP * sizeof(float),
                          "lora dv scratch", -1, &s->lora_dv);
}

static fsdp_status state_alloc(const fsdp_model *m, fsdp_op_ctx *ctx, int B, int T,
                               bool training, fsdp_recompute mode, void **state)
{
    const fsdp_llama_config *cfg = cfg_of(m);
    const int L = cfg->n_layer, C = cfg->n_embd, NH = cfg->n_head, Vp = cfg->padded_vocab_size;
    const size_t QS = (size_t)(NH + 2 * cfg->n_kv_head) * cfg->head_dim;
    const size_t AH = (size_t)NH * cfg->head_dim, IC = (size_t)cfg->n_inter;
    *state = NULL;
    const double rows = (double)B * T; /* ops index attention rows and widths in int */
    const bool fits = rows * NH * T <= (double)INT_MAX &&
                      rows * max_sz(QS, 2 * IC) <= (double)INT_MAX;
    FSDP_TRY(fsdp_act_check_batch(m, B, T, fits, mode));

    const size_t N = (size_t)B * T, dts = fsdp_dtype_size(ctx->dt), f4 = sizeof(float);
    const size_t natt = (size_t)B * NH * T * T;
    void *p;
    FSDP_TRY(fsdp_act_state_new(m, sizeof(llama_state), sizeof(llama_layer_acts), B, T,
                                training, mode, (ACT_N_FIELDS + LORA_ACT_N_FIELDS) * L + 23,
                                &p));
    llama_state *s = p;
    fsdp_act_set *a = &s->base.act;
    fsdp_status st = FSDP_STATUS_OK;
    FSDP_CHECK(fsdp_act_state_alloc_io(ctx, &s->base));
    FSDP_CHECK(fsdp_act_alloc(ctx, a, (size_t)C * dts, "zero position row", -1, &s->zero_pos));
    FSDP_CHECK(fsdp_device_memset(ctx->dev, s->zero_pos, 0, (size_t)C * dts, ctx->stream));
    FSDP_CHECK(fsdp_act_alloc(ctx, a, (size_t)cfg->head_dim / 2 * f4, "rope frequencies", -1,
                              &s->inv_freq));
    FSDP_CHECK(upload_inv_freq(ctx, cfg, s->inv_freq));
    FSDP_CHECK(fsdp_act_alloc(ctx, a, N * C * dts, "encoded", -1, &s->encoded));
    FSDP_CHECK(fsdp_act_alloc(ctx, a, N * C * dts, "proj", -1, &s->proj));
    FSDP_CHECK(fsdp_act_layers_alloc(m, ctx, a, &act_layout, s, s->base.layers, training,
                                     s->base.mode));
    FSDP_CHECK(lora_state_alloc(m, ctx, s, training));
    FSDP_CHECK(fsdp_act_alloc(ctx, a, N * C * dts, "lnf", -1, &s->lnf));
    FSDP_CHECK(fsdp_act_alloc(ctx, a, N * f4, "lnf_rstd", -1, &s->lnf_rstd));
    FSDP_CHECK(fsdp_act_state_alloc_head(ctx, &s->base, Vp));
    if (training) {
        FSDP_CHECK(fsdp_act_alloc(ctx, a, N * C * f4, "dresidual", -1, &s->dres));
        FSDP_CHECK(fsdp_act_alloc(ctx, a, N * C * f4, "dC scratch", -1, &s->dC));
        FSDP_CHECK(fsdp_act_alloc(ctx, a, N * max_sz(QS, 2 * IC) * f4, "dqkv/dgate_up scratch",
                                  -1, &s->dwide));
        FSDP_CHECK(fsdp_act_alloc(ctx, a, N * max_sz(IC, AH) * f4, "datty/dswiglu scratch", -1,
                                  &s->dmid));
        FSDP_CHECK(fsdp_act_alloc(ctx, a, natt * f4, "datt scratch", -1, &s->datt));
    }
    *state = s;
    return FSDP_STATUS_OK;

fail:
    return fsdp_act_state_fail(m, ctx, s, st);
}

/* ---- forward / backward -------------------------------------------------- */

/* The LM head's weight: lm_head, or the embeddings when tied. */
static int head_index(const fsdp_model *m) { return cfg_of(m)->tied ? ROOT_EMBED : ROOT_HEAD; }

static llama_layer_acts *layer_acts(llama_state *s, int l)
{
    return (llama_layer_acts *)s->base.layers + l;
}

/* Input of layer l: the embeddings or the previous layer's output. */
static void *layer_input(llama_state *s, int l)
{
    return l == 0 ? s->encoded : layer_acts(s, l - 1)->residual3;
}

/* Layer l's u = x A^T of adapted layer k (lora_act_fields). */
static void *lora_u(const fsdp_model *m, llama_state *s, int l, int k, size_t dts)
{
    llama_layer_acts *a = layer_acts(s, l);
    if (k == LORA_DOWN)
        return a->lora_ud;
    return (char *)a->lora_u + (size_t)s->lora_slot[k] * s->base.B * s->base.T * m->lora.r * dts;
}

/* One linear layer's slice of its output for its LoRA branch: columns
 * [col, col + oc). */
typedef struct lora_cols {
    int col, oc;
} lora_cols;

/* Whether block `unit`'s layers k0 .. k0 + n - 1 (which read one input)
 * run their LoRA branches as one group: every one adapted and their u's
 * side by side in lora_u (consecutive slots: one (N, n r) buffer). Else
 * each runs alone. */
static bool lora_grouped(const fsdp_model *m, const llama_state *s, int unit, int k0, int n)
{
    int a, b;
    for (int i = 0; i < n; i++)
        if (!fsdp_lora_find(m, unit, k0 + i, &a, &b) ||
            s->lora_slot[k0 + i] != s->lora_slot[k0] + i)
            return false;
    return n > 1;
}

/* Layer l's u of layer k0 + i: a column slice of the group's (N, n r)
 * buffer, or its own (N, r). */
static void *lora_u_of(const fsdp_model *m, llama_state *s, int l, int k0, int i, bool group,
                       size_t dts)
{
    if (group)
        return (char *)lora_u(m, s, l, k0, dts) + (size_t)i * m->lora.r * dts;
    return lora_u(m, s, l, k0 + i, dts);
}

/* Copies the group's n parameters of kind `which` (0: A, in dt from
 * params; 1: A's gradient, fp32, from grads) into (n r, C) `pack`, or back
 * from it (back), on the compute stream. */
static fsdp_status lora_pack(const fsdp_model *m, fsdp_op_ctx *ctx, int unit, const void *params,
                             float *grads, int k0, int n, int which, void *pack, bool back)
{
    const size_t es = which ? sizeof(float) : fsdp_dtype_size(ctx->dt);
    int ia, ib;
    for (int i = 0; i < n && fsdp_lora_find(m, unit, k0 + i, &ia, &ib); i++) {
        const size_t bytes = m->units[unit].params[ia].numel * es;
        void *p = which ? (void *)fsdp_unit_grad(m, unit, grads, ia)
                        : (void *)fsdp_unit_param(m, unit, params, ia, ctx->dt);
        char *q = (char *)pack + (size_t)i * bytes;
        FSDP_TRY(fsdp_device_memcpy(ctx->dev, back ? p : q, back ? q : p, bytes, ctx->stream));
    }
    return FSDP_STATUS_OK;
}

/* The LoRA branches of block `unit`'s layers k0 .. k0 + n - 1, which read
 * inp (N, C), right after their base product wrote out (rows ld apart):
 * layer k0 + i's slice cols[i]. A group forms its u's in one product, its
 * A's copied side by side into lora_apack; a layer without adapters adds
 * nothing. */
static fsdp_status lora_forward(const fsdp_model *m, fsdp_op_ctx *ctx, llama_state *s, int unit,
                                const void *params, int k0, int n, void *out, int ld,
                                const lora_cols *cols, const void *inp, int C)
{
    const size_t dts = fsdp_dtype_size(ctx->dt);
    const int r = m->lora.r, N = s->base.B * s->base.T, l = unit - 1;
    const bool group = lora_grouped(m, s, unit, k0, n);
    const int ld_u = group ? n * r : r;
    int ia, ib;
    if (group) {
        FSDP_TRY(lora_pack(m, ctx, unit, params, NULL, k0, n, 0, s->lora_apack, false));
        FSDP_OP(ctx, lora_fwd, NULL, 0, lora_u(m, s, l, k0, dts), ld_u, inp, s->lora_apack, NULL,
                s->lora_scale, N, C, ld_u, 0);
    }
    for (int i = 0; i < n; i++)
        if (fsdp_lora_find(m, unit, k0 + i, &ia, &ib))
            FSDP_OP(ctx, lora_fwd, (char *)out + (size_t)cols[i].col * dts, ld,
                    lora_u_of(m, s, l, k0, i, group, dts), ld_u, inp,
                    group ? NULL : fsdp_unit_param(m, unit, params, ia, ctx->dt),
                    fsdp_unit_param(m, unit, params, ib, ctx->dt), s->lora_scale, N, C, r,
                    cols[i].oc);
    return FSDP_STATUS_OK;
}

/* Their backward with the same slices of the output's gradient dout:
 * accumulates the adapters' gradients and adds into dinp (N, C; NULL: not
 * needed). A group's dA and dinp are one product each from its dv's, on
 * its A's and their gradients copied side by side (and the gradients
 * copied back). */
static fsdp_status lora_backward(const fsdp_model *m, fsdp_op_ctx *ctx, llama_state *s, int unit,
                                 const void *params, float *grads, int k0, int n, float *dinp,
                                 const float *dout, int ld, const lora_cols *cols,
                                 const void *inp, int C)
{
    const size_t dts = fsdp_dtype_size(ctx->dt);
    const int r = m->lora.r, N = s->base.B * s->base.T, l = unit - 1;
    const bool group = lora_grouped(m, s, unit, k0, n);
    const int ld_u = group ? n * r : r;
    int ia, ib;
    for (int i = 0; i < n; i++)
        if (fsdp_lora_find(m, unit, k0 + i, &ia, &ib))
            FSDP_OP(ctx, lora_bwd, group ? NULL : dinp,
                    group ? NULL : fsdp_unit_grad(m, unit, grads, ia),
                    fsdp_unit_grad(m, unit, grads, ib), s->lora_dv + (group ? i * r : 0), ld_u,
                    dout + cols[i].col, ld, inp, lora_u_of(m, s, l, k0, i, group, dts),
                    fsdp_unit_param(m, unit, params, ia, ctx->dt),
                    fsdp_unit_param(m, unit, params, ib, ctx->dt), s->lora_scale, N, C, r,
                    cols[i].oc);
    if (!group)
        return FSDP_STATUS_OK;
    FSDP_TRY(lora_pack(m, ctx, unit, params, grads, k0, n, 0, s->lora_apack, false));
    FSDP_TRY(lora_pack(m, ctx, unit, params, grads, k0, n, 1, s->lora_dapack, false));
    FSDP_OP(ctx, lora_bwd, dinp, s->lora_dapack, NULL, s->lora_dv, ld_u, NULL, 0, inp, NULL,
            s->lora_apack, NULL, s->lora_scale, N, C, ld_u, 0);
    return lora_pack(m, ctx, unit, params, grads, k0, n, 1, s->lora_dapack, true);
}

/* The q|k|v biases (NULL without them: the unit may hold adapters at their
 * indices). */
static const void *qkv_bias(const fsdp_model *m, int unit, const void *params, fsdp_dtype dt)
{
    return cfg_of(m)->qkv_bias ? fsdp_unit_param(m, unit, params, BLK_QB, dt) : NULL;
}

static fsdp_status llama_root_forward(const fsdp_model *m, fsdp_op_ctx *ctx, void *state,
                                      const void *root_params)
{
    FSDP_TRY(fsdp_act_check_state(m, state, false, "root_forward"));
    llama_state *s = state;
    FSDP_OP(ctx, embed_fwd, s->encoded, s->base.tokens, NULL,
            fsdp_unit_param(m, 0, root_params, ROOT_EMBED, ctx->dt), s->zero_pos,
            s->base.B * s->base.T, 1, cfg_of(m)->n_embd);
    return fsdp_act_ops_status(ctx, m, "forward", 0);
}

/* Layer `unit`'s forward ops. redo=false: all of them (unit_forward);
 * redo=true: only those whose outputs the state does not keep per layer
 * (unit_recompute). The calls are the same on the same inputs either way,
 * so recomputed activations are bit-identical to the forward's. An op
 * reruns only if its output is dropped, so every mode's act_fields must
 * let a rerun op read only kept or rerun outputs (the layer input is kept
 * by every mode: the previous layer's residual3 or the embeddings). RoPE
 * belongs to the qkv matmul: it rotates that output in place. */
static fsdp_status layer_forward(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, int unit,
                                 const void *params, bool redo)
{
    llama_state *s = state;
    const fsdp_llama_config *cfg = cfg_of(m);
    const int C = cfg->n_embd, NH = cfg->n_head, NKV = cfg->n_kv_head, hd = cfg->head_dim;
    const int IC = cfg->n_inter, QS = (NH + 2 * NKV) * hd, AH = NH * hd;
    const int B = s->base.B, T = s->base.T, N = B * T, l = unit - 1;
    const float eps = (float)cfg->norm_eps;
    const fsdp_dtype dt = ctx->dt;
#define P(i) fsdp_unit_param(m, unit, params, (i), dt)
#define RUN(field) (!redo || !kept(s, field))
#define LORA(k, n, out, ld, cols, x, in) \
    FSDP_TRY(lora_forward(m, ctx, s, unit, params, k, n, out, ld, cols, x, in))
    const int KVH = NKV * hd;
    const lora_cols qkv_cols[] = {{0, AH}, {AH, KVH}, {AH + KVH, KVH}}, c_cols[] = {{0, C}};
    const lora_cols gu_cols[] = {{0, IC}, {IC, IC}};
    llama_layer_acts *a = layer_acts(s, l);
    void *inp = layer_input(s, l);
    if (RUN(ACT_LN1))
        FSDP_OP(ctx, rmsnorm_fwd, a->ln1, a->ln1_rstd, inp, P(BLK_LN1), eps, N, C);
    if (RUN(ACT_QKV)) {
        FSDP_OP(ctx, matmul_fwd, a->qkv, a->ln1, P(BLK_Q), qkv_bias(m, unit, params, dt), N, C,
                QS);
        LORA(LORA_Q, 3, a->qkv, QS, qkv_cols, a->ln1, C);
        FSDP_OP(ctx, rope_fwd, a->qkv, s->inv_freq, s->base.pos, B, T, NH + NKV, hd, QS);
    }
    if (RUN(ACT_ATTY))
        FSDP_OP(ctx, attention_gqa_fwd, a->atty, a->att, a->qkv, s->base.pos, B, T, NH, NKV,
                hd);
    if (RUN(ACT_RESIDUAL2)) {
        FSDP_OP(ctx, matmul_fwd, s->proj, a->atty, P(BLK_O), NULL, N, AH, C);
        LORA(LORA_O, 1, s->proj, C, c_cols, a->atty, AH);
        FSDP_OP(ctx, residual_fwd, a->residual2, inp, s->proj, (size_t)N * C);
    }
    if (RUN(ACT_LN2))
        FSDP_OP(ctx, rmsnorm_fwd, a->ln2, a->ln2_rstd, a->residual2, P(BLK_LN2), eps, N, C);
    if (RUN(ACT_GU)) {
        FSDP_OP(ctx, matmul_fwd, a->gu, a->ln2, P(BLK_GATE), NULL, N, C, 2 * IC);
        LORA(LORA_GATE, 2, a->gu, 2 * IC, gu_cols, a->ln2, C);
    }
    if (RUN(ACT_SWI))
        FSDP_OP(ctx, swiglu_fwd, a->swi, a->gu, N, IC);
    if (RUN(ACT_RESIDUAL3)) {
        FSDP_OP(ctx, matmul_fwd, s->proj, a->swi, P(BLK_DOWN), NULL, N, IC, C);
        LORA(LORA_DOWN, 1, s->proj, C, c_cols, a->swi, IC);
        FSDP_OP(ctx, residual_fwd, a->residual3, a->residual2, s->proj, (size_t)N * C);
    }
#undef LORA
#undef RUN
#undef P
    return fsdp_act_ops_status(ctx, m, redo ? "recompute" : "forward", unit);
}

/* Matmul and attention FLOPs of what unit_recompute reruns (2 per
 * multiply-add, as llama_flops_per_token counts them): BLOCK reruns a
 * layer's forward up to the SwiGLU (qkv 2 C QS, o 2 AH C, gate|up 4 C IC
 * per token, and attention's 4 AH T, and the LoRA branches of those
 * layers: 2 per adapter parameter), ELEMENTWISE only norms and the SwiGLU. */
static double llama_recompute_flops_per_token(const fsdp_model *m, int T, fsdp_recompute mode)
{
    const fsdp_llama_config *c = cfg_of(m);
    if (mode != FSDP_RECOMPUTE_BLOCK)
        return 0.0;
    const double C = c->n_embd, AH = (double)c->n_head * c->head_dim;
    const double QS = (double)(c->n_head + 2 * c->n_kv_head) * c->head_dim;
    double lora = 0.0;
    for (int u = 1; u < m->n_units; u++)
        for (int k = 0; k < LORA_DOWN; k++) {
            int ia, ib;
            if (fsdp_lora_find(m, u, k, &ia, &ib))
                lora += 2.0 * (double)(m->units[u].params[ia].numel + m->units[u].params[ib].numel);
        }
    return c->n_layer * (2.0 * C * QS + 2.0 * AH * C + 4.0 * C * c->n_inter + 4.0 * AH * T) +
           lora;
}

static fsdp_status llama_head_forward_backward(const fsdp_model *m, fsdp_op_ctx *ctx,
                                               void *state, const void *root_params,
                                               float *root_grads, float dloss, float *loss)
{
    FSDP_TRY(fsdp_act_check_state(m, state, root_grads != NULL, "head_forward_backward"));
    llama_state *s = state;
    const fsdp_llama_config *cfg = cfg_of(m);
    const int C = cfg->n_embd, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    const int N = s->base.B * s->base.T;
    const fsdp_dtype dt = ctx->dt;
    const void *head = fsdp_unit_param(m, 0, root_params, head_index(m), dt);
    const void *normw = fsdp_unit_param(m, 0, root_params, ROOT_NORM, dt);
    void *last = layer_acts(s, cfg->n_layer - 1)->residual3;

    FSDP_OP(ctx, rmsnorm_fwd, s->lnf, s->lnf_rstd, last, normw, (float)cfg->norm_eps, N, C);
    FSDP_OP(ctx, matmul_fwd, s->base.logits, s->lnf, head, NULL, N, C, Vp);
    FSDP_TRY(fsdp_act_state_loss(ctx, m, &s->base, V, Vp, dloss, root_grads != NULL, loss));
    if (!root_grads)
        return FSDP_STATUS_OK;

    /* Backward: logits = lnf @ head^T, then the final RMSNorm; dres starts here. */
    FSDP_TRY(fsdp_act_zero(ctx, s->dC, (size_t)N * C));
    FSDP_OP(ctx, matmul_bwd, s->dC, fsdp_unit_grad(m, 0, root_grads, head_index(m)), NULL,
            s->base.dlogits,
            s->lnf, head, N, C, Vp);
    FSDP_TRY(fsdp_act_zero(ctx, s->dres, (size_t)N * C));
    FSDP_OP(ctx, rmsnorm_bwd, s->dres, fsdp_unit_grad(m, 0, root_grads, ROOT_NORM), s->dC, last,
            normw, s->lnf_rstd, N, C);
    return fsdp_act_ops_status(ctx, m, "head backward", 0);
}

/* Whether block `unit`'s backward must add its input's gradient into dres:
 * always but for the first block when the embeddings do not train (LoRA,
 * --freeze), where d(input) would reach only embed_bwd with no gradient to
 * take. Skipping it changes no gradient that is kept. */
static bool input_grad_needed(const fsdp_model *m, int unit)
{
    return unit > 1 || !m->units[0].params[ROOT_EMBED].frozen;
}

static fsdp_status llama_unit_backward(const fsdp_model *m, fsdp_op_ctx *ctx, void *state,
                                       int unit, const void *params, float *grads)
{
    FSDP_TRY(fsdp_act_check_backward(m, state, unit));
    llama_state *s = state;
    const fsdp_llama_config *cfg = cfg_of(m);
    const int C = cfg->n_embd, NH = cfg->n_head, NKV = cfg->n_kv_head, hd = cfg->head_dim;
    const int IC = cfg->n_inter, QS = (NH + 2 * NKV) * hd, AH = NH * hd;
    const int B = s->base.B, T = s->base.T, N = B * T, l = unit - 1;
    const fsdp_dtype dt = ctx->dt;
#define P(i) fsdp_unit_param(m, unit, params, (i), dt)
#define G(i) fsdp_unit_grad(m, unit, grads, (i))
#define LORA(k, n, dx, dy, ld, cols, x, in) \
    FSDP_TRY(lora_backward(m, ctx, s, unit, params, grads, k, n, dx, dy, ld, cols, x, in))
    const int KVH = NKV * hd;
    const lora_cols qkv_cols[] = {{0, AH}, {AH, KVH}, {AH + KVH, KVH}}, c_cols[] = {{0, C}};
    const lora_cols gu_cols[] = {{0, IC}, {IC, IC}};
    llama_layer_acts *a = layer_acts(s, l);
    void *inp = layer_input(s, l);
    /* s->dres holds d(residual3); it is also d(residual2) through the skip
     * connection, and each RMSNorm backward adds its branch's share. */
    float *dswi = s->dmid, *dgu = s->dwide, *datty = s->dmid, *dqkv = s->dwide;

    /* MLP: residual3 = residual2 + down(swiglu(gate_up(ln2(residual2)))) */
    FSDP_TRY(fsdp_act_zero(ctx, dswi, (size_t)N * IC));
    FSDP_OP(ctx, matmul_bwd, dswi, G(BLK_DOWN), NULL, s->dres, a->swi, P(BLK_DOWN), N, IC, C);
    LORA(LORA_DOWN, 1, dswi, s->dres, C, c_cols, a->swi, IC);
    FSDP_TRY(fsdp_act_zero(ctx, dgu, (size_t)N * 2 * IC));
    FSDP_OP(ctx, swiglu_bwd, dgu, a->gu, dswi, N, IC);
    FSDP_TRY(fsdp_act_zero(ctx, s->dC, (size_t)N * C));
    FSDP_OP(ctx, matmul_bwd, s->dC, G(BLK_GATE), NULL, dgu, a->ln2, P(BLK_GATE), N, C, 2 * IC);
    LORA(LORA_GATE, 2, s->dC, dgu, 2 * IC, gu_cols, a->ln2, C);
    FSDP_OP(ctx, rmsnorm_bwd, s->dres, G(BLK_LN2), s->dC, a->residual2, P(BLK_LN2), a->ln2_rstd,
            N, C);

    /* Attention: residual2 = inp + o(attention(rope(qkv(ln1(inp))))) */
    FSDP_TRY(fsdp_act_zero(ctx, datty, (size_t)N * AH));
    FSDP_OP(ctx, matmul_bwd, datty, G(BLK_O), NULL, s->dres, a->atty, P(BLK_O), N, AH, C);
    LORA(LORA_O, 1, datty, s->dres, C, c_cols, a->atty, AH);
    FSDP_TRY(fsdp_act_zero(ctx, dqkv, (size_t)N * QS));
    FSDP_OP(ctx, attention_gqa_bwd, dqkv, s->datt, datty, a->qkv, a->att, B, T, NH, NKV, hd);
    FSDP_OP(ctx, rope_bwd, dqkv, s->inv_freq, s->base.pos, B, T, NH + NKV, hd, QS);
    /* d(ln1) only where something takes it: the layer's input gradient or ln1's weight */
    float *dinp = input_grad_needed(m, unit) ? s->dres : NULL;
    float *dqkvb = cfg->qkv_bias ? G(BLK_QB) : NULL;
    float *dln1 = dinp || G(BLK_LN1) ? s->dC : NULL;
    if (dln1)
        FSDP_TRY(fsdp_act_zero(ctx, dln1, (size_t)N * C));
    if (dln1 || G(BLK_Q) || dqkvb)
        FSDP_OP(ctx, matmul_bwd, dln1, G(BLK_Q), dqkvb, dqkv, a->ln1, P(BLK_Q), N, C, QS);
    LORA(LORA_Q, 3, dln1, dqkv, QS, qkv_cols, a->ln1, C);
    if (dln1)
        FSDP_OP(ctx, rmsnorm_bwd, dinp, G(BLK_LN1), dln1, inp, P(BLK_LN1), a->ln1_rstd, N, C);
#undef LORA
#undef P
#undef G
    return fsdp_act_ops_status(ctx, m, "backward", unit);
}

static fsdp_status llama_root_backward(const fsdp_model *m, fsdp_op_ctx *ctx, void *state,
                                       const void *root_params, float *root_grads)
{
    FSDP_TRY(fsdp_act_check_state(m, state, true, "root_backward"));
    llama_state *s = state;
    float *dembed = fsdp_unit_grad(m, 0, root_grads, ROOT_EMBED);
    if (dembed) /* else dres is not complete: input_grad_needed */
        FSDP_OP(ctx, embed_bwd, dembed, NULL, s->dres, s->base.tokens, NULL,
                s->base.B * s->base.T, 1, cfg_of(m)->n_embd);
    return fsdp_act_ops_status(ctx, m, "backward", 0);
}

static const fsdp_act_model_i llama_model_i = {
    /* .iface = */ {
        /* .state_init            = */ fsdp_act_state_init,
        /* .state_free            = */ fsdp_act_state_free,
        /* .state_tokens          = */ fsdp_act_state_tokens,
        /* .state_targets         = */ fsdp_act_state_targets,
        /* .state_logits          = */ fsdp_act_state_logits,
        /* .root_forward          = */ llama_root_forward,
        /* .unit_forward          = */ fsdp_act_unit_forward,
        /* .head_forward_backward = */ llama_head_forward_backward,
        /* .unit_backward         = */ llama_unit_backward,
        /* .root_backward         = */ llama_root_backward,
        /* .state_init_recompute  = */ fsdp_act_state_init_recompute,
        /* .unit_recompute        = */ fsdp_act_unit_recompute,
        /* .recompute_flops_per_token = */ llama_recompute_flops_per_token,
        /* .state_positions       = */ fsdp_act_state_positions,
        /* .state_len             = */ fsdp_act_state_len,
    },
    /* .state_alloc   = */ state_alloc,
    /* .layer_forward = */ layer_forward,
};
