/*
 * test_lora.c - LoRA adapters and frozen parameters on the model side
 * (models/lora.c, the families' forward and backward), driven through the
 * model interface on one cpu rank (tests/model_rig.h), without the engine:
 *   - gradients of the loss with respect to adapter entries and to the
 *     embeddings (whose gradient flows back through every LoRA branch's
 *     input gradient) against central finite differences, fp32, on a GQA
 *     untied Llama and a Qwen2-style one (q/k/v biases, tied head);
 *   - with B = 0 (as initialised) the logits equal the base model's bit for
 *     bit, fp32 and bf16;
 *   - frozen parameters get no gradient written and trainable ones the same
 *     bits as in a run without freezing (Llama, Qwen2, GPT-2, LoRA);
 *   - recompute none, block and elementwise give the same bits;
 *   - target matching as PEFT matches target_modules, the adapters' specs,
 *     refusals (a target matching nothing, the GPT-2 family, bad configs),
 *     --freeze globs and the fused-tensor refusal, FLOPs per token.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model_rig.h"
#include "models/family.h"
#include "models/lora.h"
#include "models/registry.h"
#include "testutil.h"

#define B_ 2
#define T_ 8
#define SEED 1234

/* A GQA Llama with an untied head, and a Qwen2-style one (q/k/v biases,
 * tied head, one kv head): the registry's small shapes. */
static const char *const shapes[] = {"llama-tiny", "qwen2-tiny"};

static void build(fsdp_model *m, const char *spec)
{
    ck_assert_msg(fsdp_model_from_spec(spec, m) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
}

static fsdp_lora_config lora_config(const char *targets, int r, double alpha)
{
    fsdp_lora_config c = {.r = r, .alpha = alpha};
    snprintf(c.targets, sizeof c.targets, "%s", targets);
    return c;
}

static void build_lora(fsdp_model *m, const char *spec, const char *targets, int r,
                       double alpha)
{
    build(m, spec);
    fsdp_lora_config c = lora_config(targets, r, alpha);
    ck_assert_msg(fsdp_model_add_lora(m, &c) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
}

static void batch(int *tokens, int *targets)
{
    for (int i = 0; i < B_ * T_; i++) {
        tokens[i] = (i * 37 + 11) % 250;
        targets[i] = (i * 53 + 7) % 250;
    }
}

/* Every LoRA B set to small non-zero values (B starts at zero, which would
 * leave A's gradient zero). */
static void set_lora_b(const fsdp_model *m, float **units)
{
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++) {
            const fsdp_param_spec *p = &m->units[u].params[i];
            if (!strstr(p->name, ".lora_B."))
                continue;
            for (size_t e = 0; e < p->numel; e++)
                units[u][p->offset + e] = 0.05f * sinf(0.7f * (float)e + (float)(i + u));
        }
}

static int count_adapters(const fsdp_model *m)
{
    int n = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++)
            n += fsdp_lora_is_adapter(m->units[u].params[i].name);
    return n;
}

/* ---- gradients against finite differences --------------------------------------- */

/* Every block matrix (adapters too) scaled up 4x: from std 0.02 the
 * attention is almost uniform and the adapters' gradients too small for an
 * fp32 finite difference to say much. */
static void sharpen(const fsdp_model *m, float **units)
{
    for (int u = 1; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++) {
            const fsdp_param_spec *p = &m->units[u].params[i];
            for (size_t e = 0; p->ndim == 2 && e < p->numel; e++)
                units[u][p->offset + e] *= 4.0f;
        }
}

/* The loss with element e of parameter p (unit u) set to v. */
static float loss_at(rig *r, int u, const fsdp_param_spec *p, size_t e, float v, const int *tok,
                     const int *tgt)
{
    rig_put(r, u, p->offset + e, &v, 1);
    return rig_step(r, tok, tgt, false, 1.0f);
}

/* For every adapter (and the embeddings) of a model with adapters on every
 * linear layer, the entry with the largest gradient against the central
 * difference of the fp32 loss. The embeddings are made trainable: their
 * gradient is what every LoRA branch's input gradient feeds. */
START_TEST(test_finite_differences)
{
    fsdp_model m;
    build_lora(&m, shapes[_i], "all-linear", 4, 8.0);
    const fsdp_param_spec *emb = fsdp_model_find_param(&m, "model.embed_tokens.weight", NULL);
    ((fsdp_param_spec *)emb)->frozen = false;
    ck_assert_int_eq(fsdp_model_relayout(&m), FSDP_STATUS_OK);
    float **units = units_init(&m, SEED);
    set_lora_b(&m, units);
    sharpen(&m, units);
    rig r;
    rig_init(&r, FSDP_BACKEND_CPU, &m, FSDP_DTYPE_F32, B_, T_, true);
    rig_put_units(&r, units);
    rig_zero_grads(&r);
    int tok[B_ * T_], tgt[B_ * T_];
    batch(tok, tgt);
    rig_step(&r, tok, tgt, true, 1.0f);
    int checked = 0;
    for (int u = 0; u < m.n_units; u++)
        for (int i = 0; i < m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &m.units[u].params[i];
            if (p->frozen)
                continue;
            const float *g = r.grads[u] + p->offset;
            size_t e = 0;
            for (size_t k = 1; k < p->numel; k++)
                if (fabsf(g[k]) > fabsf(g[e]))
                    e = k;
            const float v = units[u][p->offset + e], h = u ? 2e-3f : 1e-4f;
            float lp = loss_at(&r, u, p, e, v + h, tok, tgt);
            float lm = loss_at(&r, u, p, e, v - h, tok, tgt);
            rig_put(&r, u, p->offset + e, &v, 1);
            double fd = ((double)lp - lm) / (2.0 * h);
            ck_assert_msg(fabsf(g[e]) > 1e-3f, "%s: largest gradient %g", p->name, g[e]);
            ck_assert_msg(fabs(fd - g[e]) <= 0.01 * fabs(g[e]) + 3e-4,
                          "%s[%zu]: gradient %.6g, finite difference %.6g", p->name, e, g[e], fd);
            checked++;
        }
    ck_assert_int_eq(checked, count_adapters(&m) + 1);
    rig_free(&r);
    units_free(&m, units);
    fsdp_model_free(&m);
}
END_TEST

/* ---- B = 0: the base model's logits, bit for bit --------------------------------- */

/* Logits of spec's model (with adapters on `targets` when given) in dt. */
static float *logits_of(const char *spec, const char *targets, fsdp_dtype dt)
{
    fsdp_model m;
    if (targets)
        build_lora(&m, spec, targets, 8, 16.0);
    else
        build(&m, spec);
    float **units = units_init(&m, SEED);
    rig r;
    rig_init(&r, FSDP_BACKEND_CPU, &m, dt, B_, T_, false);
    rig_put_units(&r, units);
    int tok[B_ * T_], tgt[B_ * T_];
    batch(tok, tgt);
    rig_step(&r, tok, tgt, false, 1.0f);
    const size_t bytes = (size_t)B_ * T_ * m.padded_vocab_size * fsdp_dtype_size(dt);
    float *out = malloc(bytes);
    ck_assert_ptr_nonnull(out);
    memcpy(out, m.iface->state_logits(r.state), bytes);
    rig_free(&r);
    units_free(&m, units);
    fsdp_model_free(&m);
    return out;
}

START_TEST(test_zero_b_is_base)
{
    fsdp_model m;
    build(&m, shapes[_i]);
    const size_t n = (size_t)B_ * T_ * m.padded_vocab_size;
    fsdp_model_free(&m);
    for (int prec = 0; prec < 2; prec++) {
        fsdp_dtype dt = prec ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
        float *base = logits_of(shapes[_i], NULL, dt);
        float *lora = logits_of(shapes[_i], "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
                                            "down_proj", dt);
        ck_assert_msg(!memcmp(base, lora, n * fsdp_dtype_size(dt)),
                      "%s %s: logits with B = 0 differ from the base model's", shapes[_i],
                      prec ? "bf16" : "fp32");
        free(base);
        free(lora);
    }
}
END_TEST

/* ---- frozen parameters: no gradient, the others unchanged ------------------------ */

typedef struct freeze_case {
    const char *spec, *freeze; /* freeze NULL: LoRA on every linear layer instead */
} freeze_case;

static const freeze_case freeze_cases[] = {
    {"llama-tiny", "model.embed_tokens.weight,model.layers.0.mlp.*,model.layers.1.self_attn.*"},
    {"qwen2-tiny", "model.layers.*.input_layernorm.weight,model.layers.1.*"},
    {"qwen2-tiny", "model.embed_tokens.weight"}, /* tied: the head's weight gradient too */
    {"gpt2:layers=2,heads=2,channels=32,vocab=256,context=16", "h.0.*,wpe.weight"},
    {"llama-tiny", NULL},
};

/* One training step's gradients of m (seeded values; LoRA B's non-zero),
 * every gradient element past the trainable ones preset to a NaN pattern
 * that must survive. */
static float **grads_of(const fsdp_model *m)
{
    float **units = units_init(m, SEED);
    set_lora_b(m, units);
    rig r;
    rig_init(&r, FSDP_BACKEND_CPU, m, FSDP_DTYPE_F32, B_, T_, true);
    rig_put_units(&r, units);
    rig_zero_grads(&r);
    for (int u = 0; u < m->n_units; u++) { /* on the stream, after rig_zero_grads' zeros */
        const fsdp_unit_spec *us = &m->units[u];
        ck_assert_int_eq(fsdp_device_memset(&r.dev, r.grads[u] + us->train_numel, 0xff,
                                            (us->numel - us->train_numel) * sizeof(float), NULL),
                         FSDP_STATUS_OK);
    }
    int tok[B_ * T_], tgt[B_ * T_];
    batch(tok, tgt);
    rig_step(&r, tok, tgt, true, 1.0f);
    float **g = units_alloc(m);
    for (int u = 0; u < m->n_units; u++) {
        const fsdp_unit_spec *us = &m->units[u];
        memcpy(g[u], r.grads[u], us->numel * sizeof(float));
        for (size_t e = us->train_numel; e < us->numel; e++) {
            uint32_t bits;
            memcpy(&bits, &g[u][e], sizeof bits);
            ck_assert_msg(bits == 0xffffffffu, "unit %s: frozen gradient element %zu written",
                          us->name, e);
        }
    }
    rig_free(&r);
    units_free(m, units);
    return g;
}

START_TEST(test_frozen_no_gradient)
{
    const freeze_case *fc = &freeze_cases[_i];
    fsdp_model full, part;
    if (fc->freeze) {
        build(&full, fc->spec);
        build(&part, fc->spec);
        ck_assert_msg(fsdp_model_freeze(&part, fc->freeze) == FSDP_STATUS_OK, "%s",
                      fsdp_error_msg());
    } else {
        build_lora(&full, fc->spec, "all-linear", 4, 8.0);
        build_lora(&part, fc->spec, "all-linear", 4, 8.0);
        for (int u = 0; u < full.n_units; u++)
            for (int i = 0; i < full.units[u].n_params; i++)
                full.units[u].params[i].frozen = false; /* the same model, all training */
        ck_assert_int_eq(fsdp_model_relayout(&full), FSDP_STATUS_OK);
    }
    ck_assert(part.train_numel > 0 && part.train_numel < part.numel);
    float **gf = grads_of(&full), **gp = grads_of(&part);
    size_t trained = 0;
    for (int u = 0; u < part.n_units; u++)
        for (int i = 0; i < part.units[u].n_params; i++) {
            const fsdp_param_spec *p = &part.units[u].params[i], *q = &full.units[u].params[i];
            ck_assert_str_eq(p->name, q->name);
            ck_assert_ptr_eq(fsdp_unit_grad(&part, u, gp[u], i), p->frozen ? NULL
                                                                           : gp[u] + p->offset);
            if (p->frozen)
                continue;
            trained += p->numel;
            ck_assert_msg(!memcmp(gp[u] + p->offset, gf[u] + q->offset, p->numel * 4),
                          "%s: %s's gradient differs from the unfrozen run's", fc->spec, p->name);
        }
    ck_assert_uint_eq(trained, part.train_numel);
    units_free(&full, gf);
    units_free(&part, gp);
    fsdp_model_free(&full);
    fsdp_model_free(&part);
}
END_TEST

/* ---- recompute: the same bits in every mode -------------------------------------- */

/* The gradients of one step on a state of `mode` (unit_recompute before
 * each layer's backward unless none), and its loss in *loss. */
static float **grads_recompute(const fsdp_model *m, fsdp_recompute mode, float *loss)
{
    const struct fsdp_model_i *mi = m->iface;
    float **units = units_init(m, SEED);
    set_lora_b(m, units);
    rig r;
    rig_init(&r, FSDP_BACKEND_CPU, m, FSDP_DTYPE_F32, B_, T_, true);
    mi->state_free(m, &r.ctx, r.state);
    ck_assert_msg(mi->state_init_recompute(m, &r.ctx, B_, T_, mode, &r.state) == FSDP_STATUS_OK,
                  "%s", fsdp_error_msg());
    rig_put_units(&r, units);
    rig_zero_grads(&r);
    int tok[B_ * T_], tgt[B_ * T_];
    batch(tok, tgt);
    ck_assert_int_eq(fsdp_device_memcpy(&r.dev, mi->state_tokens(r.state), tok, sizeof tok, NULL),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_memcpy(&r.dev, mi->state_targets(r.state), tgt, sizeof tgt,
                                        NULL),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(mi->root_forward(m, &r.ctx, r.state, r.params[0]), FSDP_STATUS_OK);
    for (int u = 1; u < m->n_units; u++)
        ck_assert_int_eq(mi->unit_forward(m, &r.ctx, r.state, u, r.params[u]), FSDP_STATUS_OK);
    ck_assert_int_eq(mi->head_forward_backward(m, &r.ctx, r.state, r.params[0], r.grads[0], 1.0f,
                                               loss),
                     FSDP_STATUS_OK);
    for (int u = m->n_units - 1; u >= 1; u--) {
        if (mode != FSDP_RECOMPUTE_NONE)
            ck_assert_int_eq(mi->unit_recompute(m, &r.ctx, r.state, u, r.params[u]),
                             FSDP_STATUS_OK);
        ck_assert_int_eq(mi->unit_backward(m, &r.ctx, r.state, u, r.params[u], r.grads[u]),
                         FSDP_STATUS_OK);
    }
    ck_assert_int_eq(mi->root_backward(m, &r.ctx, r.state, r.params[0], r.grads[0]),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&r.dev, r.ctx.stream), FSDP_STATUS_OK);
    float **g = units_alloc(m);
    for (int u = 0; u < m->n_units; u++)
        memcpy(g[u], r.grads[u], m->units[u].train_numel * sizeof(float));
    rig_free(&r);
    units_free(m, units);
    return g;
}

START_TEST(test_recompute_identical)
{
    fsdp_model m;
    build_lora(&m, shapes[_i], "all-linear", 4, 8.0);
    float loss0, loss;
    float **g0 = grads_recompute(&m, FSDP_RECOMPUTE_NONE, &loss0);
    for (int mode = FSDP_RECOMPUTE_BLOCK; mode < FSDP_RECOMPUTE_COUNT; mode++) {
        float **g = grads_recompute(&m, (fsdp_recompute)mode, &loss);
        ck_assert_msg(loss == loss0, "mode %d: loss %.9g, none %.9g", mode, loss, loss0);
        for (int u = 0; u < m.n_units; u++)
            ck_assert_msg(!memcmp(g[u], g0[u], m.units[u].train_numel * sizeof(float)),
                          "%s recompute mode %d: adapter gradients of unit %s differ from none",
                          shapes[_i], mode, m.units[u].name);
        units_free(&m, g);
    }
    ck_assert(m.units[1].train_numel > 0);
    units_free(&m, g0);
    fsdp_model_free(&m);
}
END_TEST

/* ---- targets, specs and refusals -------------------------------------------------- */

/* The model's adapted linear layers as "<unit>:<module>" flags: which of
 * the family's lora_modules have adapters in each block. */
static void adapted(const fsdp_model *m, char *out, size_t n)
{
    size_t used = 0;
    out[0] = '\0';
    for (int u = 1; u < m->n_units; u++)
        for (int k = 0; k < m->family->n_lora_modules; k++) {
            int a, b;
            if (fsdp_lora_find(m, u, k, &a, &b))
                used += (size_t)snprintf(out + used, n - used, "%s%d:%d", used ? "," : "", u, k);
        }
}

START_TEST(test_targets)
{
    static const text_case cases[] = {
        {"q_proj", "1:0,2:0"},
        {"self_attn.q_proj", "1:0,2:0"},
        {"model.layers.1.self_attn.v_proj", "2:2"},
        {"v_proj,down_proj", "1:2,1:6,2:2,2:6"},
        {"all-linear", "1:0,1:1,1:2,1:3,1:4,1:5,1:6,2:0,2:1,2:2,2:3,2:4,2:5,2:6"},
    };
    for (size_t t = 0; t < FSDP_TEST_LEN(cases); t++) {
        fsdp_model m;
        build_lora(&m, "llama-tiny", cases[t].in, 4, 8.0);
        char got[256];
        adapted(&m, got, sizeof got);
        ck_assert_msg(!strcmp(got, cases[t].want), "'%s': adapted %s, want %s", cases[t].in, got,
                      cases[t].want);
        /* every base parameter frozen; adapters trainable, first in their unit */
        size_t adapters = 0;
        for (int u = 0; u < m.n_units; u++)
            for (int i = 0; i < m.units[u].n_params; i++) {
                const fsdp_param_spec *p = &m.units[u].params[i];
                bool ad = fsdp_lora_is_adapter(p->name);
                ck_assert_msg(p->frozen == !ad, "%s frozen=%d", p->name, p->frozen);
                if (ad) {
                    ck_assert(p->decay && p->offset + p->numel <= m.units[u].train_numel);
                    adapters += p->numel;
                }
            }
        ck_assert_uint_eq(adapters, m.train_numel);
        ck_assert_str_eq(m.lora.targets, cases[t].in);
        fsdp_model_free(&m);
    }
    /* the adapters of q_proj in layer 0: shapes, init, names */
    fsdp_model m;
    build_lora(&m, "llama-tiny", "q_proj", 8, 16.0);
    int ua, ub;
    const fsdp_param_spec *A =
        fsdp_model_find_param(&m, "model.layers.0.self_attn.q_proj.lora_A.weight", &ua);
    const fsdp_param_spec *Bp =
        fsdp_model_find_param(&m, "model.layers.0.self_attn.q_proj.lora_B.weight", &ub);
    ck_assert(A && Bp && ua == 1 && ub == 1);
    ck_assert(A->shape[0] == 8 && A->shape[1] == 32 && Bp->shape[0] == 64 && Bp->shape[1] == 8);
    ck_assert(A->init == FSDP_INIT_UNIFORM && Bp->init == FSDP_INIT_ZEROS);
    ck_assert_float_eq_tol(A->std, 1.0f / sqrtf(32.0f), 1e-7f);
    float **units = units_init(&m, SEED);
    float amax = 0.0f;
    for (size_t e = 0; e < A->numel; e++)
        amax = fmaxf(amax, fabsf(units[1][A->offset + e]));
    ck_assert(amax > 0.5f * A->std && amax <= A->std);
    for (size_t e = 0; e < Bp->numel; e++)
        ck_assert(units[1][Bp->offset + e] == 0.0f);
    units_free(&m, units);
    ck_assert_double_eq(fsdp_lora_scale(&m.lora), 2.0);
    m.lora.rslora = true;
    ck_assert_double_eq_tol(fsdp_lora_scale(&m.lora), 16.0 / sqrt(8.0), 1e-12);
    fsdp_model_free(&m);
}
END_TEST

START_TEST(test_refusals)
{
    static const text_case bad_targets[] = {
        {"q_proj,nope", "LoRA target 'nope' matches no linear layer"},
        {"lm_head", "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"},
        {"proj", "'proj' matches no"},
        {"model.layers.9.self_attn.q_proj", "model.layers.0.self_attn.q_proj"},
        {"q_proj,,v_proj", "entry 2 is ''"},
        {"all-linear,q_proj", "all-linear stands alone"},
        {"q_proj;v_proj", "the character ';'"},
        {"", "LoRA targets are empty"},
    };
    for (size_t t = 0; t < FSDP_TEST_LEN(bad_targets); t++) {
        fsdp_model m;
        build(&m, "llama-tiny");
        const size_t numel = m.numel;
        fsdp_lora_config c = lora_config(bad_targets[t].in, 4, 8.0);
        ck_assert_int_eq(fsdp_model_add_lora(&m, &c), FSDP_STATUS_INVALID_ARG);
        ck_assert_msg(strstr(fsdp_error_msg(), bad_targets[t].want), "'%s': '%s' lacks '%s'",
                      bad_targets[t].in, fsdp_error_msg(), bad_targets[t].want);
        ck_assert(m.numel == numel && m.train_numel == numel && m.lora.r == 0); /* untouched */
        fsdp_model_free(&m);
    }
    fsdp_lora_config c = lora_config("q_proj", 0, 8.0);
    ck_assert_int_eq(fsdp_lora_config_check(&c), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "r=0 is out of range"));
    c.r = 4;
    c.alpha = NAN;
    ck_assert_int_eq(fsdp_lora_config_check(&c), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "--lora-alpha"));
    c.alpha = 8.0;
    ck_assert_int_eq(fsdp_lora_config_check(&c), FSDP_STATUS_OK);

    fsdp_model g;
    build(&g, "gpt2:layers=2,heads=2,channels=32,vocab=256,context=16");
    ck_assert_int_eq(fsdp_model_add_lora(&g, &c), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "LoRA is supported for the llama family"));
    fsdp_model_free(&g);

    fsdp_model m;
    build_lora(&m, "llama-tiny", "q_proj", 4, 8.0);
    ck_assert_int_eq(fsdp_model_add_lora(&m, &c), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "already has LoRA adapters"));
    fsdp_model_free(&m);
}
END_TEST

START_TEST(test_freeze_globs)
{
    fsdp_model m;
    build(&m, "qwen2-tiny");
    const size_t numel = m.numel;
    ck_assert_int_eq(fsdp_model_freeze(&m, "model.layers.*.mlp.*"), FSDP_STATUS_OK);
    for (int u = 0; u < m.n_units; u++)
        for (int i = 0; i < m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &m.units[u].params[i];
            ck_assert_msg(p->frozen == (strstr(p->name, ".mlp.") != NULL), "%s", p->name);
        }
    ck_assert(m.train_numel < numel && m.numel == numel);
    ck_assert_str_eq(m.freeze, "model.layers.*.mlp.*");
    /* the fused q|k|v (and its biases) freeze together or not at all */
    ck_assert_int_eq(fsdp_model_freeze(&m, "*.q_proj.weight"), FSDP_STATUS_INVALID_ARG);
    ck_assert_msg(strstr(fsdp_error_msg(), "model.layers.0.self_attn.q_proj.weight and "
                                           "model.layers.0.self_attn.k_proj.weight are one fused"),
                  "%s", fsdp_error_msg());
    ck_assert_int_eq(fsdp_model_freeze(&m, "*.self_attn.?_proj.bias"), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "'*.self_attn.?_proj.bias' matches no parameter"));
    const size_t train = m.train_numel;
    ck_assert_int_eq(fsdp_model_freeze(&m, "*"), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "nothing would train"));
    ck_assert(m.train_numel == train); /* refused: nothing changed */
    ck_assert_str_eq(m.freeze, "model.layers.*.mlp.*");
    ck_assert_int_eq(fsdp_model_freeze(&m, "*.q_proj.*,*.k_proj.*,*.v_proj.*"), FSDP_STATUS_OK);
    ck_assert(fsdp_model_find_param(&m, "model.layers.1.self_attn.v_proj.bias", NULL)->frozen);
    ck_assert(!fsdp_model_find_param(&m, "model.layers.1.self_attn.o_proj.weight", NULL)->frozen);
    ck_assert_str_eq(m.freeze, "model.layers.*.mlp.*,*.q_proj.*,*.k_proj.*,*.v_proj.*");
    fsdp_model_free(&m);
}
END_TEST

/* 6 FLOPs per trainable parameter and token, 4 per frozen one (no weight
 * gradient), the untied embedding table none, attention as before. */
START_TEST(test_flops)
{
    fsdp_model base, m;
    build(&base, "llama-tiny");
    build_lora(&m, "llama-tiny", "q_proj,down_proj", 4, 8.0);
    const int T = 32;
    const double emb = 256.0 * 32, adapters = (double)m.train_numel;
    const double base_matmul = (double)base.numel - emb;
    const double attn = base.family->flops_per_token(&base, T) - 6.0 * base_matmul;
    ck_assert(attn > 0.0);
    const double got = m.family->flops_per_token(&m, T), want = 6.0 * adapters +
                                                                4.0 * base_matmul + attn;
    ck_assert_msg(fabs(got - want) <= 1e-12 * want, "%.17g vs %.17g", got, want);
    /* block recompute reruns q's branch (2 FLOPs per adapter parameter), not down's */
    const double r_base = base.iface->recompute_flops_per_token(&base, T, FSDP_RECOMPUTE_BLOCK);
    const double r_lora = m.iface->recompute_flops_per_token(&m, T, FSDP_RECOMPUTE_BLOCK);
    ck_assert_double_eq(r_lora - r_base, 2.0 * 2 * (4.0 * 32 + 64 * 4.0));
    fsdp_model_free(&base);
    fsdp_model_free(&m);
}
END_TEST

int main(void)
{
    const int n_freeze = (int)FSDP_TEST_LEN(freeze_cases);
    const fsdp_test_tcase tcases[] = {
        {"model", 60,
         FSDP_TESTS(FSDP_TEST_LOOP(test_finite_differences, 2),
                    FSDP_TEST_LOOP(test_zero_b_is_base, 2),
                    FSDP_TEST_LOOP(test_frozen_no_gradient, n_freeze),
                    FSDP_TEST_LOOP(test_recompute_identical, 2))},
        {"api", 30, FSDP_TESTS(test_targets, test_refusals, test_freeze_globs, test_flops)},
    };
    return fsdp_test_main("lora", tcases, FSDP_TEST_LEN(tcases));
}
