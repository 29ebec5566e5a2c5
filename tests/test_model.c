/*
 * test_model.c - the GPT-2 family (models/gpt2*.c, models/model.c): configs
 * and their strict parsing, parameter layout, deterministic init, and the forward/backward against a
 * PyTorch golden file (tools/gen_golden.py -> tests/fixtures/gpt2_*_golden.bin).
 *
 * The golden tests drive the model only through its fsdp_model_i table, the
 * way the engine does, on one cpu rank in fp32: logits, loss and every
 * parameter gradient must match PyTorch (float64) to 1e-4 relative error
 * (max |a - b| / max |b| per tensor), and so must the losses of 10 AdamW
 * steps driven by fsdp_adamw_ref. Meta tests run the same schedule on fake
 * pointers and compare the activation accounting with the cpu backend's.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "case_util.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "fixture_util.h"
#include "model_rig.h"
#include "models/gpt2.h"
#include "models/registry.h"
#include "ops/optim_kernels.h"
#include "testutil.h"

/* The GPT-2 config a spec names, built through the registry. */
static void parse_spec(const char *spec, fsdp_gpt2_config *c)
{
    fsdp_model m;
    fsdp_status st = fsdp_model_from_spec(spec, &m);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s: %s", spec, fsdp_error_msg());
    ck_assert_ptr_nonnull(fsdp_gpt2_config_of(&m));
    *c = *fsdp_gpt2_config_of(&m);
    fsdp_model_free(&m);
}

/* The GPT-2 of spec, built by fsdp_gpt2_init from its parsed config. */
static void gpt2_model(fsdp_model *m, const char *spec)
{
    fsdp_gpt2_config c;
    parse_spec(spec, &c);
    ck_assert_int_eq(fsdp_gpt2_init(m, &c), FSDP_STATUS_OK);
}

/* ---- golden file --------------------------------------------------------- */

typedef struct golden_rec {
    char name[96];
    int kind; /* 0 float32, 1 int32 */
    size_t numel;
    void *data;
} golden_rec;

typedef struct golden {
    int n;
    golden_rec *recs;
    unsigned char *blob;
} golden;

static void golden_load(golden *g, const char *name)
{
    memset(g, 0, sizeof *g);
    char path[600];
    size_t n = 0;
    g->blob = fixture_read(name, "tools/gen_golden.py", &n, path, sizeof path);
    const long size = (long)n;
    ck_assert_msg(size >= 16 && !memcmp(g->blob, "FSDPGOLD", 8), "%s: bad magic", name);
    int32_t version, count;
    memcpy(&version, g->blob + 8, 4);
    memcpy(&count, g->blob + 12, 4);
    ck_assert_int_eq(version, 1);
    g->recs = calloc((size_t)count, sizeof *g->recs);
    size_t off = 16;
    for (int i = 0; i < count; i++) {
        golden_rec *r = &g->recs[i];
        uint16_t nlen;
        ck_assert((long)(off + 2) <= size);
        memcpy(&nlen, g->blob + off, 2);
        off += 2;
        ck_assert(nlen < sizeof r->name && (long)(off + nlen + 5) <= size);
        memcpy(r->name, g->blob + off, nlen);
        off += nlen;
        r->kind = g->blob[off++];
        uint32_t numel;
        memcpy(&numel, g->blob + off, 4);
        off += 4;
        r->numel = numel;
        ck_assert((long)(off + 4 * (size_t)numel) <= size);
        r->data = g->blob + off; /* 4-byte elements; read with memcpy-safe access below */
        off += 4 * (size_t)numel;
    }
    ck_assert_int_eq((long)off, size);
    g->n = count;
}

static void golden_free(golden *g)
{
    free(g->recs);
    free(g->blob);
}

/* Copy of a record's elements into aligned memory the caller frees. */
static void *golden_get(const golden *g, const char *name, int kind, size_t numel)
{
    for (int i = 0; i < g->n; i++) {
        if (!strcmp(g->recs[i].name, name)) {
            ck_assert_msg(g->recs[i].kind == kind, "%s: kind %d", name, g->recs[i].kind);
            ck_assert_msg(g->recs[i].numel == numel, "%s: %zu elements, expected %zu", name,
                          g->recs[i].numel, numel);
            void *p = malloc(4 * numel + 4);
            memcpy(p, g->recs[i].data, 4 * numel);
            return p;
        }
    }
    ck_abort_msg("fixture has no record '%s'", name);
    return NULL;
}

/* ---- a one-rank rig driving the model through its interface -------------- */

/* The rig is model_rig.h's (rig_init_gpt2: it builds and holds the model). */

/* The fixture's values of p under `what` ("param" or "grad"): wte's only
 * for its V real rows, the rest whole; *n: how many. The caller frees. */
static float *golden_param(const golden *g, const char *what, const fsdp_param_spec *p, int V,
                           size_t *n)
{
    char key[96];
    snprintf(key, sizeof key, "%s/%s", what, p->name);
    *n = !strcmp(p->name, "wte.weight") ? (size_t)V * p->shape[1] : p->numel;
    return golden_get(g, key, 0, *n);
}

/* Load the fixture's weights; wte's padding rows get a value that would
 * show up in the loss if padding columns leaked into it. */
static void rig_load_golden(rig *r, const golden *g, int V)
{
    for (int u = 0; u < r->m->n_units; u++) {
        const fsdp_unit_spec *us = &r->m->units[u];
        for (int i = 0; i < us->n_params; i++) {
            const fsdp_param_spec *p = &us->params[i];
            size_t n;
            float *v = golden_param(g, "param", p, V, &n);
            rig_put(r, u, p->offset, v, n);
            free(v);
            if (n < p->numel) { /* wte's padding rows */
                size_t pad = p->numel - n;
                float *junk = malloc((pad + 1) * sizeof *junk);
                for (size_t k = 0; k < pad; k++)
                    junk[k] = 3.0f + 0.001f * (float)(k % 97);
                rig_put(r, u, p->offset + n, junk, pad);
                free(junk);
            }
        }
    }
}

static double max_rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= num)) /* also catches NaN */
            num = d;
        if (fabs((double)b[i]) > den)
            den = fabs((double)b[i]);
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

typedef struct golden_case {
    golden g;
    fsdp_gpt2_config cfg;
    int B, T, steps;
    int *tokens, *targets;
    float hp[5]; /* lr, b1, b2, eps, wd */
} golden_case;

static void golden_case_load(golden_case *gc, const char *file)
{
    golden_load(&gc->g, file);
    int *c = golden_get(&gc->g, "config", 1, 8);
    char spec[160];
    snprintf(spec, sizeof spec, "custom:layers=%d,heads=%d,channels=%d,vocab=%d,context=%d", c[0],
             c[1], c[2], c[3], c[4]);
    parse_spec(spec, &gc->cfg);
    gc->B = c[5];
    gc->T = c[6];
    gc->steps = c[7];
    free(c);
    size_t N = (size_t)gc->B * gc->T;
    gc->tokens = golden_get(&gc->g, "tokens", 1, N);
    gc->targets = golden_get(&gc->g, "targets", 1, N);
    float *hp = golden_get(&gc->g, "adamw", 0, 5);
    memcpy(gc->hp, hp, sizeof gc->hp);
    free(hp);
}

static void golden_case_free(golden_case *gc)
{
    free(gc->tokens);
    free(gc->targets);
    golden_free(&gc->g);
}

/* The golden case in `file` and a cpu rig in dt for its batch, holding
 * the case's weights; free both with golden_rig_free. */
static void golden_rig_init(golden_case *gc, rig *r, const char *file, fsdp_dtype dt)
{
    golden_case_load(gc, file);
    rig_init_gpt2(r, FSDP_BACKEND_CPU, &gc->cfg, dt, gc->B, gc->T, true);
    rig_load_golden(r, &gc->g, gc->cfg.vocab_size);
}

static void golden_rig_free(golden_case *gc, rig *r)
{
    rig_free(r);
    golden_case_free(gc);
}

static void check_golden_forward_backward(const char *file)
{
    golden_case gc;
    rig r;
    golden_rig_init(&gc, &r, file, FSDP_DTYPE_F32);
    const int V = gc.cfg.vocab_size, Vp = gc.cfg.padded_vocab_size;
    const size_t N = (size_t)gc.B * gc.T;

    /* Forward only first: logits are valid then. */
    float loss = rig_step(&r, gc.tokens, gc.targets, false, 1.0f);
    const float *logits = r.m->iface->state_logits(r.state);
    float *want = golden_get(&gc.g, "logits", 0, N * V);
    float *got = malloc(N * V * sizeof *got);
    for (size_t i = 0; i < N; i++)
        memcpy(got + i * V, logits + i * Vp, (size_t)V * sizeof *got);
    double e = max_rel_err(got, want, N * V);
    printf("%s: logits rel err %.2e\n", file, e);
    ck_assert_msg(e <= 1e-4, "%s: logits rel err %g", file, e);
    free(got);
    free(want);
    float *want_loss = golden_get(&gc.g, "loss", 0, 1);
    ck_assert_msg(fabsf(loss - *want_loss) <= 1e-4f * fabsf(*want_loss), "loss %f vs %f", loss,
                  *want_loss);

    /* Forward + backward: the same loss, then every gradient. */
    rig_zero_grads(&r);
    float loss2 = rig_step(&r, gc.tokens, gc.targets, true, 1.0f);
    ck_assert_msg(loss2 == loss, "training loss %.9g != forward-only loss %.9g", loss2, loss);
    double worst = 0;
    const char *worst_name = "";
    for (int u = 0; u < r.m->n_units; u++) {
        const fsdp_unit_spec *us = &r.m->units[u];
        for (int i = 0; i < us->n_params; i++) {
            const fsdp_param_spec *p = &us->params[i];
            size_t n;
            float *wg = golden_param(&gc.g, "grad", p, V, &n);
            const float *gg = r.grads[u] + p->offset;
            double pe = max_rel_err(gg, wg, n);
            ck_assert_msg(pe <= 1e-4, "%s: gradient of %s rel err %g", file, p->name, pe);
            if (pe > worst) {
                worst = pe;
                worst_name = p->name;
            }
            for (size_t k = n; k < p->numel; k++) /* padding rows of wte get nothing */
                ck_assert_msg(gg[k] == 0.0f, "d wte padding element %zu = %g", k, gg[k]);
            free(wg);
        }
    }
    printf("%s: loss %.6f, worst gradient rel err %.2e (%s)\n", file, loss, worst, worst_name);
    free(want_loss);
    golden_rig_free(&gc, &r);
}

START_TEST(test_golden_tiny)
{
    check_golden_forward_backward("gpt2_tiny_golden.bin");
}
END_TEST

START_TEST(test_golden_padded_vocab)
{
    check_golden_forward_backward("gpt2_pad_golden.bin");
}
END_TEST

/* 10 AdamW steps on the same batch; decay on the parameters marked decay. */
static void check_golden_adamw(const char *file)
{
    golden_case gc;
    rig r;
    golden_rig_init(&gc, &r, file, FSDP_DTYPE_F32);
    float *want = golden_get(&gc.g, "step_losses", 0, (size_t)gc.steps);
    float **m = units_alloc(r.m), **v = units_alloc(r.m); /* AdamW's moments */
    const float lr = gc.hp[0], b1 = gc.hp[1], b2 = gc.hp[2], eps = gc.hp[3], wd = gc.hp[4];
    for (int t = 1; t <= gc.steps; t++) {
        rig_zero_grads(&r);
        float loss = rig_step(&r, gc.tokens, gc.targets, true, 1.0f);
        double rel = fabs((double)loss - want[t - 1]) / fabs((double)want[t - 1]);
        printf("%s: step %d loss %.6f (torch %.6f, rel err %.1e)\n", file, t, loss, want[t - 1],
               rel);
        ck_assert_msg(rel <= 1e-4, "step %d: loss %.7f vs torch %.7f", t, loss, want[t - 1]);
        const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
        for (int u = 0; u < r.m->n_units; u++) {
            const fsdp_unit_spec *us = &r.m->units[u];
            for (int i = 0; i < us->n_params; i++) {
                const fsdp_param_spec *p = &us->params[i];
                size_t o = p->offset;
                fsdp_adamw_ref((float *)r.params[u] + o, r.grads[u] + o, m[u] + o, v[u] + o,
                               p->numel, lr, b1, b2, eps, p->decay ? wd : 0.0f, bc1, bc2, 1.0f,
                               NULL, FSDP_DTYPE_F32);
            }
        }
    }
    ck_assert_msg(want[gc.steps - 1] < want[0] - 0.1f, "the golden loss should fall");
    units_free(r.m, m);
    units_free(r.m, v);
    free(want);
    golden_rig_free(&gc, &r);
}

START_TEST(test_golden_adamw_steps)
{
    check_golden_adamw("gpt2_tiny_golden.bin");
    check_golden_adamw("gpt2_pad_golden.bin");
}
END_TEST

/* Two micro-batches with dloss = 1/2 accumulate to the gradient of one
 * with dloss = 1 (the engine's gradient accumulation contract). */
START_TEST(test_grad_accumulation_and_dloss)
{
    golden_case gc;
    rig r;
    golden_rig_init(&gc, &r, "gpt2_tiny_golden.bin", FSDP_DTYPE_F32);
    rig_zero_grads(&r);
    rig_step(&r, gc.tokens, gc.targets, true, 1.0f);
    float **full = calloc((size_t)r.m->n_units, sizeof *full);
    for (int u = 0; u < r.m->n_units; u++) {
        full[u] = malloc(r.m->units[u].numel * sizeof(float));
        memcpy(full[u], r.grads[u], r.m->units[u].numel * sizeof(float));
    }
    rig_zero_grads(&r);
    rig_step(&r, gc.tokens, gc.targets, true, 0.5f);
    rig_step(&r, gc.tokens, gc.targets, true, 0.5f);
    for (int u = 0; u < r.m->n_units; u++) {
        double e = max_rel_err(r.grads[u], full[u], r.m->units[u].numel);
        ck_assert_msg(e <= 1e-6, "unit %d: accumulated gradient rel err %g", u, e);
        free(full[u]);
    }
    free(full);
    golden_rig_free(&gc, &r);
}
END_TEST

/* bf16 storage: the same model within bf16 accuracy, through the separate
 * fp32 dlogits buffer. */
START_TEST(test_golden_bf16_close)
{
    golden_case gc;
    rig r;
    golden_rig_init(&gc, &r, "gpt2_tiny_golden.bin", FSDP_DTYPE_BF16);
    rig_zero_grads(&r);
    float loss = rig_step(&r, gc.tokens, gc.targets, true, 1.0f);
    float *want_loss = golden_get(&gc.g, "loss", 0, 1);
    ck_assert_msg(fabsf(loss - *want_loss) <= 2e-2f * *want_loss, "bf16 loss %f vs %f", loss,
                  *want_loss);
    const fsdp_param_spec *p = fsdp_model_find_param(r.m, "h.1.mlp.c_fc.weight", NULL);
    float *wg = golden_get(&gc.g, "grad/h.1.mlp.c_fc.weight", 0, p->numel);
    double e = max_rel_err(r.grads[2] + p->offset, wg, p->numel);
    printf("bf16: loss %.4f (fp64 %.4f), c_fc grad rel err %.2e\n", loss, *want_loss, e);
    ck_assert_msg(e <= 0.1, "bf16 gradient rel err %g", e);
    free(wg);
    free(want_loss);
    golden_rig_free(&gc, &r);
}
END_TEST

/* ---- configs and layout -------------------------------------------------- */

START_TEST(test_config_presets)
{
    fsdp_gpt2_config c;
    parse_spec("gpt2", &c);
    ck_assert_int_eq(c.n_layer, 12);
    ck_assert_int_eq(c.n_head, 12);
    ck_assert_int_eq(c.n_embd, 768);
    ck_assert_int_eq(c.vocab_size, 50257);
    ck_assert_int_eq(c.padded_vocab_size, 50304);
    ck_assert_int_eq(c.max_seq_len, 1024);
    const struct {
        const char *n;
        int L, H, C;
    } big[] = {
        {"gpt2-medium", 24, 16, 1024},
        {"gpt2-large", 36, 20, 1280},
        {"gpt2-xl", 48, 25, 1600},
    };
    for (int i = 0; i < 3; i++) {
        parse_spec(big[i].n, &c);
        ck_assert_int_eq(c.n_layer, big[i].L);
        ck_assert_int_eq(c.n_head, big[i].H);
        ck_assert_int_eq(c.n_embd, big[i].C);
        ck_assert_int_eq(c.padded_vocab_size, 50304);
    }
    parse_spec("tiny", &c);
    ck_assert_int_eq(c.vocab_size, 256);
    ck_assert_int_eq(c.padded_vocab_size, 256);
    fsdp_gpt2_config small;
    parse_spec("small", &small);
    ck_assert_int_eq(small.vocab_size, 256);

    /* custom: given keys override small's; "gpt2:" is the same grammar */
    parse_spec("custom:layers=3,vocab=1000", &c);
    ck_assert_int_eq(c.n_layer, 3);
    ck_assert_int_eq(c.vocab_size, 1000);
    ck_assert_int_eq(c.padded_vocab_size, 1024);
    ck_assert_int_eq(c.n_embd, small.n_embd);
    ck_assert_int_eq(c.n_head, small.n_head);
    ck_assert_int_eq(c.max_seq_len, small.max_seq_len);
    fsdp_gpt2_config same;
    parse_spec("gpt2:vocab=1000,layers=3", &same);
    ck_assert(!memcmp(&same, &c, sizeof c));
    const char *spec = "custom:layers=1,heads=2,channels=16,vocab=129,context=8";
    parse_spec(spec, &c);
    ck_assert_int_eq(c.padded_vocab_size, 256);

    /* a model carries its family and canonical config; its name rebuilds it */
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec(spec, &m), FSDP_STATUS_OK);
    ck_assert_ptr_eq(m.family, &fsdp_gpt2_family);
    ck_assert_str_eq(m.config, "layers=1,heads=2,channels=16,vocab=129,context=8");
    ck_assert_str_eq(m.name, "gpt2:layers=1,heads=2,channels=16,vocab=129,context=8");
    fsdp_gpt2_config back;
    parse_spec(m.name, &back);
    ck_assert(!memcmp(&back, &c, sizeof c));
    ck_assert(!memcmp(fsdp_gpt2_config_of(&m), &c, sizeof c));
    fsdp_model_free(&m);
    /* a custom spec that equals a named shape is named so */
    ck_assert_int_eq(fsdp_model_from_spec("custom:channels=128", &m), FSDP_STATUS_OK);
    ck_assert_str_eq(m.name, "small");
    fsdp_model_free(&m);
}
END_TEST

START_TEST(test_config_errors)
{
    static const text_case bad[] = {
        {"gpt3", "unknown model 'gpt3'"},
        {"", "no model given"},
        {"custom:layers=0", "layers=0 is out of range"},
        {"custom:heads=-2", "heads=-2 is out of range"},
        {"custom:channels=abc", "needs an integer"},
        {"custom:channels=100,heads=3", "not divisible"},
        {"custom:depth=4", "unknown key 'depth'"},
        {"custom:layers", "not key=value"},
        {"custom:layers=4x", "needs an integer"},
        {"custom:layers=+4", "needs an integer"},
        {"custom:layers= 4", "needs an integer"},
        {"custom:vocab=99999999999", "out of range"},
        {"custom:context=", "needs an integer"},
        /* issue 15: a strict custom: */
        {"custom:", "is empty"},
        {"custom", "needs a config"},
        {"gpt2:", "is empty"},
        {"custom:layers=2,,heads=4", "empty entry"},
        {"custom:layers=2,", "empty entry"},
        {"custom:,layers=2", "empty entry"},
        {"custom:layers=2,layers=3", "'layers' is given twice"},
        {"custom:heads=4,channels=32,heads=4", "'heads' is given twice"},
        {"mamba:layers=2", "unknown model"},
    };
    expect_specs_rejected(bad, FSDP_TEST_LEN(bad));
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec(NULL, &m), FSDP_STATUS_INVALID_ARG);

    fsdp_gpt2_config v = {2, 4, 32, 256, 200, 64}; /* padded vocab not 256 rounded up */
    ck_assert_int_eq(fsdp_gpt2_config_validate(&v), FSDP_STATUS_INVALID_ARG);
    ck_assert_int_eq(fsdp_gpt2_init(&m, &v), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_null(m.units);
}
END_TEST

START_TEST(test_param_specs_gpt2_124m)
{
    fsdp_model m;
    gpt2_model(&m, "gpt2");
    /* llm.c's figure for GPT-2 124M with the padded vocabulary */
    ck_assert_uint_eq(m.numel, 124475904);
    ck_assert_int_eq(m.n_units, 13);
    ck_assert_int_eq(m.vocab_size, 50257);
    ck_assert_int_eq(m.padded_vocab_size, 50304);
    ck_assert_int_eq(m.max_seq_len, 1024);
    ck_assert_str_eq(m.units[0].name, "root");
    ck_assert_str_eq(m.units[12].name, "h.11");
    size_t total = 0;
    for (int u = 0; u < m.n_units; u++) {
        const fsdp_unit_spec *us = &m.units[u];
        ck_assert_int_eq(us->n_params, u == 0 ? 4 : 12);
        size_t off = 0;
        for (int i = 0; i < us->n_params; i++) {
            const fsdp_param_spec *p = &us->params[i];
            ck_assert_uint_eq(p->offset, off); /* contiguous, in listed order */
            size_t n = 1;
            for (int d = 0; d < p->ndim; d++)
                n *= (size_t)p->shape[d];
            ck_assert_uint_eq(p->numel, n);
            off += p->numel;
            int unit = -1;
            ck_assert_ptr_eq(fsdp_model_find_param(&m, p->name, &unit), p);
            ck_assert_int_eq(unit, u);
            bool is_matrix = p->ndim == 2;
            bool is_wpe = !strcmp(p->name, "wpe.weight");
            ck_assert_int_eq(p->decay, is_matrix && !is_wpe);
        }
        ck_assert_uint_eq(us->numel, off);
        total += off;
    }
    ck_assert_uint_eq(total, m.numel);
    /* root: 50304*768 + 1024*768 + 2*768; block: 12*C^2 + 13*C */
    ck_assert_uint_eq(m.units[0].numel, 50304u * 768 + 1024u * 768 + 2 * 768);
    ck_assert_uint_eq(m.units[5].numel, 12u * 768 * 768 + 13 * 768);

    int unit = -1;
    const fsdp_param_spec *p = fsdp_model_find_param(&m, "h.3.attn.c_attn.weight", &unit);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(unit, 4);
    ck_assert_int_eq(p->shape[0], 3 * 768);
    ck_assert_int_eq(p->shape[1], 768);
    ck_assert_int_eq(p->init, FSDP_INIT_NORMAL);
    ck_assert_float_eq_tol(p->std, 0.02f, 1e-7f);
    p = fsdp_model_find_param(&m, "h.7.mlp.c_proj.weight", NULL);
    ck_assert_int_eq(p->shape[0], 768);
    ck_assert_int_eq(p->shape[1], 3072);
    ck_assert_float_eq_tol(p->std, 0.02f / sqrtf(24.0f), 1e-7f);
    p = fsdp_model_find_param(&m, "h.0.attn.c_proj.weight", NULL);
    ck_assert_float_eq_tol(p->std, 0.02f / sqrtf(24.0f), 1e-7f);
    ck_assert_int_eq(fsdp_model_find_param(&m, "h.0.ln_1.weight", NULL)->init, FSDP_INIT_ONES);
    ck_assert_int_eq(fsdp_model_find_param(&m, "ln_f.bias", NULL)->init, FSDP_INIT_ZEROS);
    ck_assert_int_eq(fsdp_model_find_param(&m, "wte.weight", NULL)->shape[0], 50304);
    ck_assert_ptr_null(fsdp_model_find_param(&m, "h.12.ln_1.weight", NULL));
    ck_assert_ptr_null(fsdp_model_find_param(&m, "lm_head.weight", NULL));
    fsdp_model_free(&m);
    ck_assert_ptr_null(m.units);
}
END_TEST

/* ---- init ---------------------------------------------------------------- */

START_TEST(test_init_range_slices_match_whole)
{
    fsdp_model m;
    gpt2_model(&m, "tiny");
    for (int u = 0; u < m.n_units; u++) {
        size_t n = m.units[u].numel, padded = n + 777;
        float *whole = malloc(padded * sizeof *whole);
        float *parts = malloc(padded * sizeof *parts);
        fsdp_model_init_range(&m, u, 0, padded, 42, whole);
        /* uneven slices that cut through parameters and into the padding */
        size_t cuts[] = {1, 13, 1000, 1024, 4097};
        size_t pos = 0;
        for (int k = 0; pos < padded; k++) {
            size_t len = cuts[k % 5];
            size_t end = pos + len < padded ? pos + len : padded;
            fsdp_model_init_range(&m, u, pos, end, 42, parts + pos);
            pos = end;
        }
        ck_assert(!memcmp(whole, parts, padded * sizeof *whole));
        for (size_t i = n; i < padded; i++)
            ck_assert(whole[i] == 0.0f);
        /* another seed gives other values for the random parameters */
        fsdp_model_init_range(&m, u, 0, padded, 43, parts);
        ck_assert(memcmp(whole, parts, n * sizeof *whole) != 0);
        /* the key is (seed, parameter name, element index within the parameter) */
        for (int i = 0; i < m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &m.units[u].params[i];
            if (p->init != FSDP_INIT_NORMAL)
                continue;
            for (size_t k = 0; k < p->numel; k += 37) {
                float want = p->std * fsdp_rng_normal(42, fsdp_rng_hash_str(p->name), k);
                ck_assert(whole[p->offset + k] == want);
            }
        }
        free(whole);
        free(parts);
    }
    fsdp_model_free(&m);
}
END_TEST

START_TEST(test_init_statistics)
{
    fsdp_gpt2_config c;
    parse_spec("small", &c);
    fsdp_model m;
    ck_assert_int_eq(fsdp_gpt2_init(&m, &c), FSDP_STATUS_OK);
    for (int u = 0; u < 2; u++) {
        float *w = malloc(m.units[u].numel * sizeof *w);
        fsdp_model_init_range(&m, u, 0, m.units[u].numel, 7, w);
        for (int i = 0; i < m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &m.units[u].params[i];
            const float *x = w + p->offset;
            double s = 0, s2 = 0;
            for (size_t k = 0; k < p->numel; k++) {
                s += x[k];
                s2 += (double)x[k] * x[k];
            }
            double mean = s / (double)p->numel;
            double sd = sqrt(s2 / (double)p->numel - mean * mean);
            if (p->init == FSDP_INIT_NORMAL) {
                ck_assert_msg(fabs(sd / p->std - 1.0) < 0.05, "%s: std %g, want %g", p->name, sd,
                              p->std);
                ck_assert_msg(fabs(mean) < 0.05 * p->std, "%s: mean %g", p->name, mean);
            } else {
                float want = p->init == FSDP_INIT_ONES ? 1.0f : 0.0f;
                for (size_t k = 0; k < p->numel; k++)
                    ck_assert(x[k] == want);
            }
        }
        free(w);
    }
    /* the two residual projections are scaled by 1/sqrt(2L) */
    ck_assert_float_eq_tol(fsdp_model_find_param(&m, "h.0.mlp.c_proj.weight", NULL)->std,
                           0.02f / sqrtf(2.0f * (float)c.n_layer), 1e-7f);
    fsdp_model_free(&m);
}
END_TEST

/* ---- states -------------------------------------------------------------- */

/* Forward-only states (sampling/eval) give the training state's logits, and
 * logits at a position do not depend on later tokens. */
START_TEST(test_forward_only_and_causal)
{
    golden_case gc;
    golden_case_load(&gc, "gpt2_tiny_golden.bin");
    const int Vp = gc.cfg.padded_vocab_size, T = gc.T;
    rig tr, fw;
    rig_init_gpt2(&tr, FSDP_BACKEND_CPU, &gc.cfg, FSDP_DTYPE_F32, 1, T, true);
    rig_init_gpt2(&fw, FSDP_BACKEND_CPU, &gc.cfg, FSDP_DTYPE_F32, 1, T, false);
    ck_assert_uint_lt(fw.dev.mem.kind_bytes[FSDP_MEM_ACT], tr.dev.mem.kind_bytes[FSDP_MEM_ACT]);
    rig_load_golden(&tr, &gc.g, gc.cfg.vocab_size);
    rig_load_golden(&fw, &gc.g, gc.cfg.vocab_size);
    float l1 = rig_step(&tr, gc.tokens, gc.targets, false, 1.0f);
    float l2 = rig_step(&fw, gc.tokens, gc.targets, false, 1.0f);
    ck_assert(l1 == l2);
    size_t bytes = (size_t)T * Vp * sizeof(float);
    float *a = malloc(bytes);
    memcpy(a, tr.m->iface->state_logits(tr.state), bytes);
    ck_assert(!memcmp(a, fw.m->iface->state_logits(fw.state), bytes));

    /* change the tokens after position k: logits up to k stay bit-identical */
    const int k = T / 2;
    int *tok = malloc((size_t)T * sizeof *tok);
    memcpy(tok, gc.tokens, (size_t)T * sizeof *tok);
    for (int t = k + 1; t < T; t++)
        tok[t] = (tok[t] + 17) % gc.cfg.vocab_size;
    rig_step(&fw, tok, gc.targets, false, 1.0f);
    const float *b = fw.m->iface->state_logits(fw.state);
    ck_assert(!memcmp(a, b, (size_t)(k + 1) * Vp * sizeof(float)));
    ck_assert(memcmp(a + (size_t)(k + 1) * Vp, b + (size_t)(k + 1) * Vp,
                     (size_t)(T - k - 1) * Vp * sizeof(float)) != 0);

    /* backward on a forward-only state is a clear error */
    fsdp_error_clear();
    ck_assert_int_eq(fw.m->iface->unit_backward(fw.m, &fw.ctx, fw.state, 1, fw.params[1], NULL),
                     FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "training"));
    ck_assert_int_eq(fw.m->iface->unit_forward(fw.m, &fw.ctx, fw.state, 0, fw.params[0]),
                     FSDP_STATUS_INVALID_ARG);
    void *st = NULL;
    ck_assert_int_eq(fw.m->iface->state_init(fw.m, &fw.ctx, 1, gc.cfg.max_seq_len + 1, false, &st),
                     FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_null(st);
    free(tok);
    free(a);
    rig_free(&tr);
    rig_free(&fw);
    golden_case_free(&gc);
}
END_TEST

/* Activation bytes the design promises for (B, T) (gpt2.c's header). */
static size_t expected_act_bytes(const fsdp_gpt2_config *c, int B, int T, fsdp_dtype dt,
                                 bool training)
{
    const size_t N = (size_t)B * T, C = (size_t)c->n_embd, d = fsdp_dtype_size(dt);
    const size_t att = (size_t)B * c->n_head * T * T;
    const size_t slots = training ? (size_t)c->n_layer : 1;
    size_t per_layer = 16 * N * C * d + att * d + 4 * N * sizeof(float);
    size_t bytes = slots * per_layer;
    bytes += 2 * N * sizeof(int) + 3 * N * C * d + 2 * N * 4 + N * c->padded_vocab_size * d +
             N * 4;
    if (training) {
        bytes += 10 * N * C * 4 + att * 4;
        if (dt != FSDP_DTYPE_F32)
            bytes += N * c->padded_vocab_size * 4;
    }
    return bytes;
}

START_TEST(test_meta_gpt2_124m_step)
{
    fsdp_gpt2_config c;
    parse_spec("gpt2", &c);
    const int B = 1, T = 64;
    rig r;
    rig_init_gpt2(&r, FSDP_BACKEND_META, &c, FSDP_DTYPE_BF16, B, T, true);
    ck_assert_uint_eq(r.dev.mem.kind_bytes[FSDP_MEM_ACT],
                      expected_act_bytes(&c, B, T, FSDP_DTYPE_BF16, true));
    ck_assert_uint_eq(r.dev.mem.kind_bytes[FSDP_MEM_GATHER], 124475904u * 2);
    int *tok = calloc((size_t)B * T, sizeof *tok);
    rig_zero_grads(&r);
    float loss = rig_step(&r, tok, tok, true, 1.0f); /* fake pointers: nothing may be touched */
    ck_assert(loss == 0.0f);
    free(tok);
    rig_free(&r);
}
END_TEST

START_TEST(test_meta_accounting_equals_cpu)
{
    fsdp_gpt2_config c;
    parse_spec("tiny", &c);
    for (int dti = 0; dti < 2; dti++) {
        for (int training = 0; training < 2; training++) {
            fsdp_dtype dt = dti ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
            rig cpu, meta;
            rig_init_gpt2(&cpu, FSDP_BACKEND_CPU, &c, dt, 2, 32, training);
            rig_init_gpt2(&meta, FSDP_BACKEND_META, &c, dt, 2, 32, training);
            ck_assert_uint_eq(cpu.dev.mem.kind_bytes[FSDP_MEM_ACT],
                              meta.dev.mem.kind_bytes[FSDP_MEM_ACT]);
            ck_assert_uint_eq(cpu.dev.mem.kind_bytes[FSDP_MEM_ACT],
                              expected_act_bytes(&c, 2, 32, dt, training));
            ck_assert_uint_eq(cpu.dev.mem.n_allocs, meta.dev.mem.n_allocs);
            ck_assert_uint_eq(cpu.dev.host.in_use_bytes, meta.dev.host.in_use_bytes);
            ck_assert_uint_eq(cpu.dev.mem.peak_bytes, meta.dev.mem.peak_bytes);
            rig_free(&cpu);
            rig_free(&meta);
        }
    }
}
END_TEST

START_TEST(test_state_oom_is_clean)
{
    fsdp_gpt2_config c;
    parse_spec("gpt2", &c);
    fsdp_device d;
    fsdp_op_ctx ctx;
    fsdp_model m;
    ck_assert_int_eq(fsdp_device_init(&d, FSDP_BACKEND_META, NULL, 0, 0, (size_t)64 << 20),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ops_init(&ctx, &d, FSDP_DTYPE_F32), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_gpt2_init(&m, &c), FSDP_STATUS_OK);
    void *st = NULL;
    ck_assert_int_eq(m.iface->state_init(&m, &ctx, 8, 1024, true, &st), FSDP_STATUS_OOM);
    ck_assert_ptr_null(st);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "activations"));
    ck_assert_uint_eq(d.mem.in_use_bytes, 0); /* everything allocated so far was released */
    ck_assert_uint_eq(d.host.in_use_bytes, 0);
    fsdp_model_free(&m);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&d);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"gpt2", 120,
         FSDP_TESTS(test_config_presets, test_config_errors, test_param_specs_gpt2_124m,
                    test_init_range_slices_match_whole, test_init_statistics, test_golden_tiny,
                    test_golden_padded_vocab, test_golden_adamw_steps,
                    test_grad_accumulation_and_dloss, test_golden_bf16_close,
                    test_forward_only_and_causal, test_meta_gpt2_124m_step,
                    test_meta_accounting_equals_cpu, test_state_oom_is_clean)},
    };
    return fsdp_test_main("model", tcases, FSDP_TEST_LEN(tcases));
}
