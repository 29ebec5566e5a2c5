/*
 * test_ops_llama.c - the Llama-family cpu ops (RMSNorm, rotary embeddings
 * and their frequency tables, SwiGLU, grouped-query attention) against:
 *   - PyTorch/transformers golden values (tools/gen_llama_ops_golden.py ->
 *     tests/fixtures/llama_ops_golden.safetensors, read with fsdp's own
 *     safetensors parser): fp32 forward within 1e-5, gradients within 1e-4
 *     relative (see expect_rel);
 *   - central finite differences of the fp32 ops (losses summed in double);
 *   - their own contracts: bf16 storage (outputs are the fp32 results
 *     rounded once, gradients bit-identical where the saved inputs are),
 *     accumulating backward, GPT-2's attention reproduced bit for bit,
 *     GQA = MHA with replicated kv heads, packed documents = separate
 *     sequences, rank threads bit-identical.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "core/world.h"
#include "fixture_util.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#include "ops/rope_table.h"
#include "ops_util.h"
#include "testutil.h"

/* ---- helpers ---------------------------------------------------------------- */

/* This suite's test data: uniform in [-scale, scale), keyed by seed. */
static float *frand(size_t n, uint64_t seed, float scale)
{
    return frand_stream(n, seed, 11, scale);
}

/* The relative error the golden tests bound: every element satisfies
 * |got - want| <= rtol * (|want| + rms(want)), the rms keeping elements near
 * zero from demanding more than fp32 can give. */
static void expect_rel(const char *what, const float *got, const float *want, size_t n,
                       double rtol)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)want[i] * want[i];
    double rms = sqrt(ss / (double)(n ? n : 1));
    ck_assert_msg(rms > 0.0, "%s: reference is all zeros", what);
    double worst = 0.0;
    size_t worst_i = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]) / (fabs(want[i]) + rms);
        if (!(e <= worst)) /* NaN counts as worst */
            worst = isnan(e) ? INFINITY : e, worst_i = i;
    }
    ck_assert_msg(worst <= rtol, "%s[%zu]: got %.9g want %.9g (relative error %.3g > %.1g)",
                  what, worst_i, got[worst_i], want[worst_i], worst, rtol);
}

/* Bitwise equality of two fp32 arrays, naming the first difference. */
static void expect_bits(const char *what, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                      "%s[%zu]: %.9g differs from %.9g", what, i, got[i], want[i]);
}

/* bf16 output h equals the fp32 result f rounded once, element for element. */
static void expect_rounded(const char *what, const fsdp_bf16 *h, const float *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(h[i] == fsdp_f32_to_bf16(f[i]), "%s[%zu]: bf16 %#x, fp32 %.9g rounds to %#x",
                      what, i, h[i], f[i], fsdp_f32_to_bf16(f[i]));
}

/* Central differences of loss() at n_checks coordinates of x against g
 * (ops_util.h). */
static void fd_check(const char *what, loss_fn loss, void *st, float *x, const float *g, size_t n,
                     int n_checks, float eps)
{
    fd_check_spread(what, loss, st, x, g, n, n_checks, eps, 7);
}

/* ---- the golden file ----------------------------------------------------------- */

typedef struct gold {
    unsigned char *blob;
    fsdp_st_file st;
} gold;

/* The golden file (fixture_util.h finds it). */
static void gold_load(gold *g)
{
    char path[600];
    size_t size = 0;
    g->blob = fixture_read("llama_ops_golden.safetensors", "tools/gen_llama_ops_golden.py", &size,
                           path, sizeof path);
    ck_assert_msg(fsdp_st_parse_buffer(path, g->blob, size, &g->st) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
}

static void gold_free(gold *g)
{
    fsdp_st_free(&g->st);
    free(g->blob);
}

static const fsdp_st_tensor *gold_find(const gold *g, const char *name)
{
    for (int i = 0; i < g->st.n_tensors; i++)
        if (!strcmp(g->st.tensors[i].name, name))
            return &g->st.tensors[i];
    return NULL;
}

/* A malloc'd copy of tensor "<pre>/<field>" of dtype F32 or I32 with numel
 * elements. */
static void *gold_get(const gold *g, const char *pre, const char *field, const char *dtype,
                      size_t numel)
{
    char name[128];
    snprintf(name, sizeof name, "%s/%s", pre, field);
    const fsdp_st_tensor *t = gold_find(g, name);
    ck_assert_msg(t, "fixture has no tensor '%s'; regenerate it", name);
    ck_assert_msg(!strcmp(t->dtype_name, dtype), "%s is %s, not %s", name, t->dtype_name, dtype);
    ck_assert_msg(t->numel == numel, "%s: %llu elements, expected %zu", name,
                  (unsigned long long)t->numel, numel);
    void *p = malloc(t->numel * 4 + 4);
    ck_assert_ptr_nonnull(p);
    memcpy(p, g->blob + g->st.data_offset + t->begin, t->numel * 4);
    return p;
}

#define GF(g, pre, field, n) ((float *)gold_get((g), (pre), (field), "F32", (n)))
#define GI(g, pre, field, n) ((int *)gold_get((g), (pre), (field), "I32", (n)))

/* ---- rope tables ------------------------------------------------------------------ */

START_TEST(test_rope_table_matches_transformers)
{
    gold g;
    gold_load(&g);
    static const char *const type_names[] = {"default", "linear", "llama3"};
    int n_tables = 0, n_freqs = 0, n_exact = 0;
    for (int i = 0; i < g.st.n_tensors; i++) {
        const char *nm = g.st.tensors[i].name;
        size_t len = strlen(nm);
        if (strncmp(nm, "rope_table/", 11) || len < 16 || strcmp(nm + len - 5, "/spec"))
            continue;
        char pre[96];
        snprintf(pre, sizeof pre, "%.*s", (int)(len - 5), nm);
        float *spec = GF(&g, pre, "spec", 6);
        int *type = GI(&g, pre, "type", 1);
        const int hd = (int)spec[5];
        float *want = GF(&g, pre, "inv_freq", (size_t)hd / 2);
        ck_assert(type[0] >= 0 && type[0] < 3);
        fsdp_rope_spec rs = {.theta = spec[0], .factor = spec[1], .low_freq_factor = spec[2],
                             .high_freq_factor = spec[3], .original_max_pos = (int)spec[4]};
        ck_assert_int_eq(fsdp_rope_type_parse(type_names[type[0]], &rs.type), FSDP_STATUS_OK);
        float *got = fbuf((size_t)hd / 2);
        ck_assert_msg(fsdp_rope_inv_freq(&rs, hd, got) == FSDP_STATUS_OK, "%s: %s", pre,
                      fsdp_error_msg());
        /* within one ulp everywhere (torch's vectorised pow is sometimes one
         * ulp off the correctly rounded power), mostly identical */
        for (int k = 0; k < hd / 2; k++) {
            int32_t a, b;
            memcpy(&a, &got[k], 4);
            memcpy(&b, &want[k], 4);
            ck_assert_msg(abs(a - b) <= 1, "%s inv_freq[%d]: %.9g, transformers %.9g", pre, k,
                          got[k], want[k]);
            n_exact += a == b;
        }
        n_freqs += hd / 2;
        n_tables++;
        free(spec), free(type), free(want), free(got);
    }
    ck_assert_int_eq(n_tables, 6);
    ck_assert_msg(n_exact * 50 >= n_freqs * 49, "only %d of %d frequencies bit-identical",
                  n_exact, n_freqs);
    gold_free(&g);
}
END_TEST

START_TEST(test_rope_table_errors)
{
    float f[8];
    fsdp_rope_type t;
    ck_assert_int_eq(fsdp_rope_type_parse("yarn", &t), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "'yarn'") && strstr(fsdp_error_msg(), "llama3"));
    ck_assert_int_eq(fsdp_rope_type_parse("llama3", &t), FSDP_STATUS_OK);
    ck_assert_int_eq(t, FSDP_ROPE_LLAMA3);
    ck_assert_str_eq(fsdp_rope_type_name(FSDP_ROPE_LINEAR), "linear");
    fsdp_rope_spec ok = {.type = FSDP_ROPE_LLAMA3, .theta = 5e5, .factor = 8, .low_freq_factor = 1,
                         .high_freq_factor = 4, .original_max_pos = 8192};
    ck_assert_int_eq(fsdp_rope_inv_freq(&ok, 16, f), FSDP_STATUS_OK);
    ck_assert(f[0] == 1.0f); /* theta^0, a short wavelength: unscaled */
    ck_assert_int_eq(fsdp_rope_inv_freq(&ok, 15, f), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "head_dim 15"));
    fsdp_rope_spec bad = ok;
    bad.theta = 0;
    ck_assert_int_eq(fsdp_rope_inv_freq(&bad, 16, f), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "rope_theta"));
    bad = ok, bad.high_freq_factor = 1;
    ck_assert_int_eq(fsdp_rope_inv_freq(&bad, 16, f), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "high_freq_factor"));
    bad = ok, bad.original_max_pos = 0;
    ck_assert_int_eq(fsdp_rope_inv_freq(&bad, 16, f), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "original_max_position_embeddings"));
    bad = ok, bad.type = FSDP_ROPE_LINEAR, bad.factor = -2;
    ck_assert_int_eq(fsdp_rope_inv_freq(&bad, 16, f), FSDP_STATUS_INVALID_ARG);
    ck_assert(strstr(fsdp_error_msg(), "factor"));
}
END_TEST

/* ---- the ops on fixed cases --------------------------------------------------------- */

enum { OP_RMSNORM, OP_SWIGLU, OP_ROPE, OP_ATTN, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"rmsnorm", "swiglu", "rope", "attention_gqa"};

/* One op on fixed shapes: its input x (and RMSNorm's weight w), output,
 * and a random cotangent R for the loss sum(out * R). */
typedef struct opcase {
    env e;
    int kind;
    int N, C, IC, B, T, NH, NKV, hd, QS;
    float eps;
    size_t n_x, n_out, n_att;
    float *x, *w, *out, *R, *rstd, *att, *inv;
    int *pos;
} opcase;

/* Two packed documents per row (lengths 3 and T-3), then one of length T. */
static int *packed_pos(int B, int T)
{
    int *p = calloc((size_t)B * T, sizeof *p);
    ck_assert_ptr_nonnull(p);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            p[b * T + t] = b % 2 == 0 ? (t < 3 ? t : t - 3) : t;
    return p;
}

/* Derived sizes and output buffers for the shape fields already set. */
static void opcase_sizes(opcase *c)
{
    switch (c->kind) {
    case OP_RMSNORM:
        c->n_x = c->n_out = (size_t)c->N * c->C;
        c->rstd = fbuf((size_t)c->N);
        break;
    case OP_SWIGLU: c->n_x = (size_t)c->N * 2 * c->IC, c->n_out = (size_t)c->N * c->IC; break;
    default:
        c->QS = (c->NH + 2 * c->NKV) * c->hd;
        c->n_x = (size_t)c->B * c->T * c->QS;
        c->n_out = c->kind == OP_ROPE ? c->n_x : (size_t)c->B * c->T * c->NH * c->hd;
        c->n_att = (size_t)c->B * c->NH * c->T * c->T;
        c->att = fbuf(c->n_att);
    }
    c->out = fbuf(c->n_out);
}

/* Fixed small shapes with random data (packed positions for rope and
 * attention). */
static void opcase_init(opcase *c, int kind, fsdp_dtype dt, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    env_init(&c->e, dt);
    c->kind = kind, c->eps = 1e-5f;
    if (kind == OP_RMSNORM) {
        c->N = 5, c->C = 19;
        c->w = frand((size_t)c->C, seed + 1, 0.3f);
        for (int i = 0; i < c->C; i++)
            c->w[i] += 1.0f;
    } else if (kind == OP_SWIGLU) {
        c->N = 4, c->IC = 11;
    } else {
        c->B = 2, c->T = 6, c->NH = 4, c->NKV = 2, c->hd = kind == OP_ROPE ? 8 : 5;
        c->pos = packed_pos(c->B, c->T);
        if (kind == OP_ROPE) {
            fsdp_rope_spec rs = {.type = FSDP_ROPE_DEFAULT, .theta = 10000.0};
            c->inv = fbuf((size_t)c->hd / 2);
            ck_assert_int_eq(fsdp_rope_inv_freq(&rs, c->hd, c->inv), FSDP_STATUS_OK);
        }
    }
    opcase_sizes(c);
    c->x = frand(c->n_x, seed, kind == OP_SWIGLU ? 3.0f : 1.5f);
    c->R = frand(c->n_out, seed + 2, 1.0f);
}

static void opcase_fini(opcase *c)
{
    env_fini(&c->e);
    free(c->x), free(c->w), free(c->out), free(c->R), free(c->rstd), free(c->att), free(c->inv);
    free(c->pos);
}

/* Forward from c->x (and w) into c->out (and rstd/att). x, w, out are fp32
 * or bf16 per the context (the caller converts). */
static void opcase_fwd(opcase *c, const void *x, const void *w, void *out)
{
    fsdp_op_ctx *ctx = &c->e.ctx;
    switch (c->kind) {
    case OP_RMSNORM: FSDP_OP(ctx, rmsnorm_fwd, out, c->rstd, x, w, c->eps, c->N, c->C); break;
    case OP_SWIGLU: FSDP_OP(ctx, swiglu_fwd, out, x, c->N, c->IC); break;
    case OP_ROPE:
        memcpy(out, x, c->n_x * fsdp_dtype_size(ctx->dt));
        FSDP_OP(ctx, rope_fwd, out, c->inv, c->pos, c->B, c->T, c->NH + c->NKV, c->hd, c->QS);
        break;
    case OP_ATTN:
        FSDP_OP(ctx, attention_gqa_fwd, out, c->att, x, c->pos, c->B, c->T, c->NH, c->NKV,
                c->hd);
        break;
    }
}

/* Backward for cotangent dout into dx (and dw), accumulating. */
static void opcase_bwd(opcase *c, const void *x, const void *w, const float *dout, float *dx,
                       float *dw)
{
    fsdp_op_ctx *ctx = &c->e.ctx;
    switch (c->kind) {
    case OP_RMSNORM: FSDP_OP(ctx, rmsnorm_bwd, dx, dw, dout, x, w, c->rstd, c->N, c->C); break;
    case OP_SWIGLU: FSDP_OP(ctx, swiglu_bwd, dx, x, dout, c->N, c->IC); break;
    case OP_ROPE: {
        /* rope_bwd replaces: rotate a copy of dout, then accumulate */
        float *t = fcopy(dout, c->n_x);
        FSDP_OP(ctx, rope_bwd, t, c->inv, c->pos, c->B, c->T, c->NH + c->NKV, c->hd, c->QS);
        for (size_t i = 0; i < c->n_x; i++)
            dx[i] += t[i];
        free(t);
        break;
    }
    case OP_ATTN: {
        float *datt = fbuf(c->n_att);
        FSDP_OP(ctx, attention_gqa_bwd, dx, datt, dout, x, c->att, c->B, c->T, c->NH, c->NKV,
                c->hd);
        free(datt);
        break;
    }
    }
}

static double opcase_loss(void *st)
{
    opcase *c = st;
    opcase_fwd(c, c->x, c->w, c->out);
    return dot_d(c->out, c->R, c->n_out);
}

/* A case of the golden file: shapes, inputs and the cotangent from the
 * file (the fp32 context the golden tests use). */
static void opcase_golden(opcase *c, const gold *g, const char *pre, int kind)
{
    memset(c, 0, sizeof *c);
    env_init(&c->e, FSDP_DTYPE_F32);
    c->kind = kind;
    const int two = kind == OP_RMSNORM || kind == OP_SWIGLU;
    int *s = GI(g, pre, "shape", two ? 2 : 5);
    if (kind == OP_RMSNORM) {
        float *eps = GF(g, pre, "eps", 1);
        c->N = s[0], c->C = s[1], c->eps = eps[0];
        c->w = GF(g, pre, "w", c->C);
        free(eps);
    } else if (kind == OP_SWIGLU) {
        c->N = s[0], c->IC = s[1];
    } else {
        c->B = s[0], c->T = s[1], c->NH = s[2], c->NKV = s[3], c->hd = s[4];
        if (kind == OP_ROPE)
            c->inv = GF(g, pre, "inv_freq", (size_t)c->hd / 2);
        char name[96];
        snprintf(name, sizeof name, "%s/pos", pre);
        if (gold_find(g, name))
            c->pos = GI(g, pre, "pos", (size_t)c->B * c->T);
    }
    free(s);
    opcase_sizes(c);
    c->x = GF(g, pre, "inp", c->n_x);
    c->R = GF(g, pre, "dout", c->n_out);
}

/* ---- golden values -------------------------------------------------------------- */

static const struct {
    const char *pre;
    int kind;
} golden_cases[] = {
    {"rmsnorm", OP_RMSNORM},  {"rmsnorm_eps", OP_RMSNORM}, /* inputs so small eps matters */
    {"rope", OP_ROPE},        {"rope_pos", OP_ROPE},       /* llama3 frequencies; packed */
    {"swiglu", OP_SWIGLU},    {"attn_gqa", OP_ATTN},        {"attn_mqa", OP_ATTN},
    {"attn_mha", OP_ATTN},    {"attn_packed", OP_ATTN},
};
#define N_GOLDEN ((int)(sizeof golden_cases / sizeof *golden_cases))

/* fp32 forward within 1e-5, gradients within 1e-4 of transformers/autograd. */
START_TEST(test_golden)
{
    const char *pre = golden_cases[_i].pre;
    gold g;
    gold_load(&g);
    opcase c;
    opcase_golden(&c, &g, pre, golden_cases[_i].kind);
    float *want = GF(&g, pre, "out", c.n_out), *want_dx = GF(&g, pre, "dinp", c.n_x);
    float *dx = fbuf(c.n_x), *dw = c.w ? fbuf((size_t)c.C) : NULL;
    opcase_fwd(&c, c.x, c.w, c.out);
    opcase_bwd(&c, c.x, c.w, c.R, dx, dw);
    char what[64];
    snprintf(what, sizeof what, "%s out", pre);
    expect_rel(what, c.out, want, c.n_out, 1e-5);
    snprintf(what, sizeof what, "%s dinp", pre);
    expect_rel(what, dx, want_dx, c.n_x, 1e-4);
    if (c.kind == OP_RMSNORM) {
        float *rstd = GF(&g, pre, "rstd", c.N), *want_dw = GF(&g, pre, "dw", c.C);
        expect_rel("rmsnorm rstd", c.rstd, rstd, (size_t)c.N, 1e-5);
        expect_rel("rmsnorm dw", dw, want_dw, (size_t)c.C, 1e-4);
        free(rstd), free(want_dw);
    }
    if (c.kind == OP_ATTN) {
        float *att = GF(&g, pre, "att", c.n_att);
        expect_rel("attention att", c.att, att, c.n_att, 1e-5);
        for (size_t i = 0; i < c.n_att; i++) /* masked: exactly 0, as HF's softmax of -inf */
            ck_assert_msg(att[i] != 0.0f || c.att[i] == 0.0f, "att[%zu] = %g outside the mask",
                          i, c.att[i]);
        free(att);
    }
    if (c.kind == OP_ROPE)
        for (size_t r = 0; r < (size_t)c.B * c.T; r++) { /* v is not touched */
            size_t v0 = r * c.QS + (size_t)(c.NH + c.NKV) * c.hd;
            expect_bits("rope v", c.out + v0, c.x + v0, (size_t)c.NKV * c.hd);
            expect_bits("rope dv", dx + v0, c.R + v0, (size_t)c.NKV * c.hd);
        }
    free(want), free(want_dx), free(dx), free(dw);
    opcase_fini(&c);
    gold_free(&g);
}
END_TEST

/* ---- finite differences, bf16 storage ------------------------------------------- */

START_TEST(test_grad_fd)
{
    opcase c;
    opcase_init(&c, _i, FSDP_DTYPE_F32, 300 + 10 * (uint64_t)_i);
    float *dx = fbuf(c.n_x), *dw = c.w ? fbuf((size_t)c.C) : NULL;
    opcase_fwd(&c, c.x, c.w, c.out);
    opcase_bwd(&c, c.x, c.w, c.R, dx, dw);
    fd_check(op_names[_i], opcase_loss, &c, c.x, dx, c.n_x, 24, 1e-2f);
    if (dw)
        fd_check("rmsnorm dw", opcase_loss, &c, c.w, dw, (size_t)c.C, 8, 1e-2f);
    free(dx), free(dw);
    opcase_fini(&c);
}
END_TEST

/* The same op in fp32 and bf16 on the same (bf16-representable) values:
 * bf16 outputs are the fp32 results rounded once; gradients are
 * bit-identical where the backward reads only the inputs (RMSNorm, SwiGLU,
 * whose bf16 path is the scalar loop and fp32 path the vectorised one, and
 * rope), within bf16 tolerance where it reads a rounded activation (the
 * attention softmax). */
START_TEST(test_bf16_storage)
{
    opcase f, h;
    opcase_init(&f, _i, FSDP_DTYPE_F32, 500);
    opcase_init(&h, _i, FSDP_DTYPE_BF16, 500);
    fsdp_bf16 *xh = to_bf16(f.x, f.n_x), *wh = f.w ? to_bf16(f.w, (size_t)f.C) : NULL;
    fsdp_bf16 *outh = calloc(f.n_out, sizeof *outh);
    ck_assert_ptr_nonnull(outh);
    opcase_fwd(&f, f.x, f.w, f.out);
    opcase_fwd(&h, xh, wh, outh);
    expect_rounded("bf16 out", outh, f.out, f.n_out);
    if (f.kind == OP_RMSNORM)
        expect_bits("bf16 rstd", h.rstd, f.rstd, (size_t)f.N);
    if (f.kind == OP_ATTN)
        for (size_t i = 0; i < f.n_att; i++)
            ck_assert(((fsdp_bf16 *)h.att)[i] == fsdp_f32_to_bf16(f.att[i]));
    float *dxf = fbuf(f.n_x), *dxh = fbuf(f.n_x);
    float *dwf = f.w ? fbuf((size_t)f.C) : NULL, *dwh = f.w ? fbuf((size_t)f.C) : NULL;
    opcase_bwd(&f, f.x, f.w, f.R, dxf, dwf);
    opcase_bwd(&h, xh, wh, f.R, dxh, dwh);
    if (f.kind == OP_ATTN) {
        double mx = 0.0;
        for (size_t i = 0; i < f.n_x; i++)
            mx = fmax(mx, fabs(dxf[i]));
        for (size_t i = 0; i < f.n_x; i++)
            ck_assert_msg(fabs(dxh[i] - dxf[i]) <= 1e-2 * mx, "bf16 dqkv[%zu]: %g vs %g", i,
                          dxh[i], dxf[i]);
    } else {
        expect_bits("bf16 dinp", dxh, dxf, f.n_x);
        if (dwf)
            expect_bits("bf16 dw", dwh, dwf, (size_t)f.C);
    }
    free(xh), free(wh), free(outh), free(dxf), free(dxh), free(dwf), free(dwh);
    opcase_fini(&f);
    opcase_fini(&h);
}
END_TEST

/* ---- contracts ---------------------------------------------------------------------- */

/* Backward ops add to what the gradient buffers hold. RMSNorm and SwiGLU
 * add their result once per element (exact); attention's GEMMs accumulate
 * in blocks (close). */
START_TEST(test_backward_accumulates)
{
    opcase c;
    opcase_init(&c, _i, FSDP_DTYPE_F32, 700);
    opcase_fwd(&c, c.x, c.w, c.out);
    float *fresh = fbuf(c.n_x), *dw_fresh = c.w ? fbuf((size_t)c.C) : NULL;
    opcase_bwd(&c, c.x, c.w, c.R, fresh, dw_fresh);
    float *acc = frand(c.n_x, 701, 2.0f), *want = fcopy(acc, c.n_x);
    float *dw_acc = c.w ? frand((size_t)c.C, 702, 2.0f) : NULL;
    float *dw_want = c.w ? fcopy(dw_acc, (size_t)c.C) : NULL;
    for (size_t i = 0; i < c.n_x; i++)
        want[i] += fresh[i];
    for (int i = 0; dw_want && i < c.C; i++)
        dw_want[i] += dw_fresh[i];
    opcase_bwd(&c, c.x, c.w, c.R, acc, dw_acc);
    if (c.kind == OP_ATTN) {
        expect_rel("accumulated dqkv", acc, want, c.n_x, 1e-6);
    } else {
        expect_bits("accumulated dinp", acc, want, c.n_x);
        if (dw_acc)
            expect_bits("accumulated dw", dw_acc, dw_want, (size_t)c.C);
    }
    free(fresh), free(dw_fresh), free(acc), free(want), free(dw_acc), free(dw_want);
    opcase_fini(&c);
}
END_TEST

/* NKV == NH, hd = C / NH, no positions: GPT-2's attention slots, bit for
 * bit (on the cpu they are wrappers over attention_gqa: this checks the
 * mapping of C and NH; on cuda the two kernels are separate). */
START_TEST(test_attention_gqa_is_gpt2_attention)
{
    const fsdp_dtype dt = _i ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    const int B = 2, T = 13, C = 48, NH = 4;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    const size_t es = fsdp_dtype_size(dt);
    env e;
    env_init(&e, dt);
    float *qf = frand(nq, 900, 1.5f), *dout = frand(no, 901, 1.0f);
    fsdp_bf16 *qh = to_bf16(qf, nq);
    const void *qkv = dt == FSDP_DTYPE_BF16 ? (const void *)qh : (const void *)qf;
    void *o1 = calloc(no, es), *o2 = calloc(no, es), *a1 = calloc(na, es), *a2 = calloc(na, es);
    float *d1 = frand(nq, 902, 1.0f), *d2 = fcopy(d1, nq), *datt = fbuf(na);
    ck_assert(o1 && o2 && a1 && a2);
    FSDP_OP(&e.ctx, attention_fwd, o1, a1, qkv, B, T, C, NH);
    FSDP_OP(&e.ctx, attention_gqa_fwd, o2, a2, qkv, NULL, B, T, NH, NH, C / NH);
    ck_assert_mem_eq(o1, o2, no * es);
    ck_assert_mem_eq(a1, a2, na * es);
    FSDP_OP(&e.ctx, attention_bwd, d1, datt, dout, qkv, a1, B, T, C, NH);
    FSDP_OP(&e.ctx, attention_gqa_bwd, d2, datt, dout, qkv, a2, B, T, NH, NH, C / NH);
    expect_bits("gpt2 dqkv", d2, d1, nq);
    env_fini(&e);
    free(qf), free(dout), free(qh), free(o1), free(o2), free(a1), free(a2), free(d1), free(d2);
    free(datt);
}
END_TEST

/* GQA equals MHA on the same q with each kv head copied to its query
 * heads; a kv head's gradient is the sum of its copies'. */
START_TEST(test_attention_gqa_is_replicated_mha)
{
    const int B = 2, T = 9, NH = 6, NKV = 2, hd = 8, rep = NH / NKV;
    const int QS = (NH + 2 * NKV) * hd, MS = 3 * NH * hd;
    const size_t no = (size_t)B * T * NH * hd, na = (size_t)B * NH * T * T;
    env e;
    env_init(&e, FSDP_DTYPE_F32);
    float *g = frand((size_t)B * T * QS, 950, 1.5f), *m = fbuf((size_t)B * T * MS);
    for (int r = 0; r < B * T; r++)
        for (int h = 0; h < NH; h++) {
            const float *src = g + (size_t)r * QS;
            float *dst = m + (size_t)r * MS;
            memcpy(dst + h * hd, src + h * hd, hd * sizeof(float));
            memcpy(dst + (NH + h) * hd, src + (NH + h / rep) * hd, hd * sizeof(float));
            memcpy(dst + (2 * NH + h) * hd, src + (NH + NKV + h / rep) * hd, hd * sizeof(float));
        }
    float *og = fbuf(no), *om = fbuf(no), *ag = fbuf(na), *am = fbuf(na), *datt = fbuf(na);
    float *dout = frand(no, 951, 1.0f), *dg = fbuf((size_t)B * T * QS);
    float *dm = fbuf((size_t)B * T * MS);
    FSDP_OP(&e.ctx, attention_gqa_fwd, og, ag, g, NULL, B, T, NH, NKV, hd);
    FSDP_OP(&e.ctx, attention_gqa_fwd, om, am, m, NULL, B, T, NH, NH, hd);
    expect_rel("gqa vs mha out", og, om, no, 1e-6);
    expect_rel("gqa vs mha att", ag, am, na, 1e-6);
    FSDP_OP(&e.ctx, attention_gqa_bwd, dg, datt, dout, g, ag, B, T, NH, NKV, hd);
    FSDP_OP(&e.ctx, attention_gqa_bwd, dm, datt, dout, m, am, B, T, NH, NH, hd);
    float *want = fbuf((size_t)B * T * QS);
    for (int r = 0; r < B * T; r++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < hd; i++) {
                const float *src = dm + (size_t)r * MS;
                float *dst = want + (size_t)r * QS;
                dst[h * hd + i] = src[h * hd + i];
                dst[(NH + h / rep) * hd + i] += src[(NH + h) * hd + i];
                dst[(NH + NKV + h / rep) * hd + i] += src[(2 * NH + h) * hd + i];
            }
    expect_rel("gqa vs mha dqkv", dg, want, (size_t)B * T * QS, 1e-5);
    env_fini(&e);
    free(g), free(m), free(og), free(om), free(ag), free(am), free(datt), free(dout), free(dg);
    free(dm), free(want);
}
END_TEST

/* Two documents packed in one row (positions restart at 0) give what the
 * two documents give as separate sequences: rope bit for bit, attention
 * and its gradient within rounding (its GEMMs sum over other lengths).
 * Lengths 4 + 6, and 70 + 90: the second document starts inside the
 * second block of the causal products and spans three (attention_gqa.c). */
START_TEST(test_packed_equals_separate)
{
    const int L1 = _i ? 70 : 4, L2 = _i ? 90 : 6, T = L1 + L2;
    const int NH = 4, NKV = 2, hd = 8, QS = (NH + 2 * NKV) * hd, OS = NH * hd;
    int *pos = malloc((size_t)T * sizeof *pos);
    for (int t = 0; t < T; t++)
        pos[t] = t < L1 ? t : t - L1;
    env e;
    env_init(&e, FSDP_DTYPE_F32);
    fsdp_rope_spec rs = {.type = FSDP_ROPE_DEFAULT, .theta = 10000.0};
    float inv[4];
    ck_assert_int_eq(fsdp_rope_inv_freq(&rs, hd, inv), FSDP_STATUS_OK);
    float *x = frand((size_t)T * QS, 980, 1.5f), *y = fcopy(x, (size_t)T * QS);
    FSDP_OP(&e.ctx, rope_fwd, x, inv, pos, 1, T, NH + NKV, hd, QS);
    FSDP_OP(&e.ctx, rope_fwd, y, inv, NULL, 1, L1, NH + NKV, hd, QS);
    FSDP_OP(&e.ctx, rope_fwd, y + (size_t)L1 * QS, inv, NULL, 1, L2, NH + NKV, hd, QS);
    expect_bits("packed rope", x, y, (size_t)T * QS);

    float *o = fbuf((size_t)T * OS), *a = fbuf((size_t)NH * T * T);
    float *o1 = fbuf((size_t)L1 * OS), *o2 = fbuf((size_t)L2 * OS);
    float *a1 = fbuf((size_t)NH * L1 * L1), *a2 = fbuf((size_t)NH * L2 * L2);
    FSDP_OP(&e.ctx, attention_gqa_fwd, o, a, x, pos, 1, T, NH, NKV, hd);
    FSDP_OP(&e.ctx, attention_gqa_fwd, o1, a1, x, NULL, 1, L1, NH, NKV, hd);
    FSDP_OP(&e.ctx, attention_gqa_fwd, o2, a2, x + (size_t)L1 * QS, NULL, 1, L2, NH, NKV, hd);
    expect_rel("packed out doc 1", o, o1, (size_t)L1 * OS, 1e-6);
    expect_rel("packed out doc 2", o + (size_t)L1 * OS, o2, (size_t)L2 * OS, 1e-6);
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < T; j++) {
                float got = a[((size_t)h * T + t) * T + j], want = 0.0f;
                if (t < L1 && j < L1)
                    want = a1[((size_t)h * L1 + t) * L1 + j];
                else if (t >= L1 && j >= L1)
                    want = a2[((size_t)h * L2 + t - L1) * L2 + j - L1];
                ck_assert_msg(fabsf(got - want) <= 1e-6f, "att[%d][%d][%d] %g vs %g", h, t, j,
                              got, want);
                if (want == 0.0f)
                    ck_assert(got == 0.0f);
            }

    /* Backward: the packed row's dqkv is the two documents' side by side. */
    float *dout = frand((size_t)T * OS, 981, 1.0f), *datt = fbuf((size_t)NH * T * T);
    float *dx = fbuf((size_t)T * QS), *dsep = fbuf((size_t)T * QS);
    FSDP_OP(&e.ctx, attention_gqa_bwd, dx, datt, dout, x, a, 1, T, NH, NKV, hd);
    FSDP_OP(&e.ctx, attention_gqa_bwd, dsep, datt, dout, x, a1, 1, L1, NH, NKV, hd);
    FSDP_OP(&e.ctx, attention_gqa_bwd, dsep + (size_t)L1 * QS, datt, dout + (size_t)L1 * OS,
            x + (size_t)L1 * QS, a2, 1, L2, NH, NKV, hd);
    expect_rel("packed dqkv", dx, dsep, (size_t)T * QS, 1e-5);
    env_fini(&e);
    free(pos), free(x), free(y), free(o), free(a), free(o1), free(o2), free(a1), free(a2);
    free(dout), free(datt), free(dx), free(dsep);
}
END_TEST

/* rope_bwd undoes rope_fwd (the rotation is orthogonal); no position
 * array is the same as positions 0..T-1 in every row. */
START_TEST(test_rope_inverse_and_default_positions)
{
    const int B = 3, T = 7, NH = 5, hd = 12, stride = 80; /* room after the heads */
    const size_t n = (size_t)B * T * stride;
    env e;
    env_init(&e, FSDP_DTYPE_F32);
    fsdp_rope_spec rs = {.type = FSDP_ROPE_LLAMA3, .theta = 5e5, .factor = 8,
                         .low_freq_factor = 1, .high_freq_factor = 4, .original_max_pos = 64};
    float inv[6];
    ck_assert_int_eq(fsdp_rope_inv_freq(&rs, hd, inv), FSDP_STATUS_OK);
    int pos[21];
    for (int i = 0; i < B * T; i++)
        pos[i] = i % T;
    float *x0 = frand(n, 990, 2.0f), *x = fcopy(x0, n), *y = fcopy(x0, n);
    FSDP_OP(&e.ctx, rope_fwd, x, inv, NULL, B, T, NH, hd, stride);
    FSDP_OP(&e.ctx, rope_fwd, y, inv, pos, B, T, NH, hd, stride);
    expect_bits("rope pos NULL vs 0..T-1", x, y, n);
    ck_assert(memcmp(x, x0, n * sizeof(float)) != 0);
    FSDP_OP(&e.ctx, rope_bwd, x, inv, NULL, B, T, NH, hd, stride);
    expect_rel("rope_bwd(rope_fwd(x))", x, x0, n, 1e-6);
    for (size_t r = 0; r < (size_t)B * T; r++) /* channels after the heads: untouched */
        expect_bits("rope tail", x + r * stride + NH * hd, x0 + r * stride + NH * hd,
                    (size_t)stride - NH * hd);
    env_fini(&e);
    free(x0), free(x), free(y);
}
END_TEST

/* Empty shapes are no-ops: outputs and gradients keep their contents. */
START_TEST(test_empty_shapes)
{
    env e;
    env_init(&e, FSDP_DTYPE_F32);
    float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8}, keep[8], inv[2] = {1, 0.5f};
    memcpy(keep, buf, sizeof buf);
    FSDP_OP(&e.ctx, rmsnorm_fwd, buf, buf, buf, buf, 1e-5f, 0, 4);
    FSDP_OP(&e.ctx, rmsnorm_bwd, buf, buf, buf, buf, buf, buf, 4, 0);
    FSDP_OP(&e.ctx, swiglu_fwd, buf, buf, 0, 4);
    FSDP_OP(&e.ctx, swiglu_bwd, buf, buf, buf, 4, 0);
    FSDP_OP(&e.ctx, rope_fwd, buf, inv, NULL, 0, 2, 1, 4, 4);
    FSDP_OP(&e.ctx, rope_bwd, buf, inv, NULL, 2, 1, 0, 4, 4);
    FSDP_OP(&e.ctx, attention_gqa_fwd, buf, buf, buf, NULL, 0, 2, 2, 1, 2);
    FSDP_OP(&e.ctx, attention_gqa_bwd, buf, buf, buf, buf, buf, 1, 0, 2, 1, 2);
    ck_assert_mem_eq(buf, keep, sizeof buf);
    env_fini(&e);
}
END_TEST

/* Four rank threads, each with its own context, run every op three times:
 * the same bits as a lone run (no shared state between contexts). */
#define CR_RANKS 4
typedef struct cr_shared {
    float *out[OP_COUNT][CR_RANKS + 1], *dx[OP_COUNT][CR_RANKS + 1];
} cr_shared;

static fsdp_status cr_rank(fsdp_world *w, int rank, void *arg)
{
    cr_shared *s = arg;
    for (int k = 0; k < OP_COUNT; k++) {
        opcase c;
        opcase_init(&c, k, FSDP_DTYPE_F32, 1100 + (uint64_t)k); /* same seed on every rank */
        float *dw = c.w ? fbuf((size_t)c.C) : NULL;
        for (int rep = 0; rep < 3; rep++) {
            memset(s->dx[k][rank], 0, c.n_x * sizeof(float));
            opcase_fwd(&c, c.x, c.w, s->out[k][rank]);
            opcase_bwd(&c, c.x, c.w, c.R, s->dx[k][rank], dw);
        }
        free(dw);
        opcase_fini(&c);
    }
    return FSDP_STATUS_OK;
}

START_TEST(test_concurrent_ranks_bit_identical)
{
    cr_shared s;
    for (int k = 0; k < OP_COUNT; k++)
        for (int r = 0; r <= CR_RANKS; r++)
            s.out[k][r] = fbuf(1024), s.dx[k][r] = fbuf(1024);
    ck_assert_int_eq(cr_rank(NULL, CR_RANKS, &s), FSDP_STATUS_OK); /* lone run */
    fsdp_world *world;
    ck_assert_int_eq(fsdp_world_init(&world, CR_RANKS), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_world_launch(world, cr_rank, &s), FSDP_STATUS_OK);
    fsdp_world_free(world);
    for (int k = 0; k < OP_COUNT; k++) {
        for (int r = 0; r < CR_RANKS; r++) {
            ck_assert_mem_eq(s.out[k][r], s.out[k][CR_RANKS], 1024 * sizeof(float));
            ck_assert_mem_eq(s.dx[k][r], s.dx[k][CR_RANKS], 1024 * sizeof(float));
        }
        for (int r = 0; r <= CR_RANKS; r++)
            free(s.out[k][r]), free(s.dx[k][r]);
    }
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"golden", 60,
         FSDP_TESTS(test_rope_table_matches_transformers, test_rope_table_errors,
                    FSDP_TEST_LOOP(test_golden, N_GOLDEN))},
        {"contracts", 60,
         FSDP_TESTS(FSDP_TEST_LOOP(test_grad_fd, OP_COUNT),
                    FSDP_TEST_LOOP(test_bf16_storage, OP_COUNT),
                    FSDP_TEST_LOOP(test_backward_accumulates, OP_COUNT),
                    FSDP_TEST_LOOP(test_attention_gqa_is_gpt2_attention, 2),
                    test_attention_gqa_is_replicated_mha,
                    FSDP_TEST_LOOP(test_packed_equals_separate, 2),
                    test_rope_inverse_and_default_positions, test_empty_shapes,
                    test_concurrent_ranks_bit_identical)},
    };
    return fsdp_test_main("ops_llama", tcases, FSDP_TEST_LEN(tcases));
}
