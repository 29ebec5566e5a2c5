/*
 * test_bnb4.c - bitsandbytes' NF4 with double quantization on the host
 * (src/ops/nf4.c) against bitsandbytes itself: the golden files of
 * tools/gen_bnb4_fixture.py (tests/fixtures/bnb4), bit for bit.
 *
 * - the code tables equal bitsandbytes' own (nf4_code, dynamic_map);
 * - a probe vector (midpoint ties, exact codes, a zero block, a constant
 *   block, 300 random blocks at growing scales, a short last block: two
 *   nested blocks; a seed where bitsandbytes' binned absmax search and an
 *   exact nearest-entry one disagree) quantizes to bitsandbytes' codes,
 *   absmax, absmax codes, nested absmax and offset;
 * - every quantized weight of layer 0 of the bnb-4bit directory that
 *   transformers wrote (nf4/model.safetensors: codes, absmax codes, nested
 *   absmax, offset from the quant_state JSON) dequantizes to
 *   dequantize_4bit's fp32 values, and quantizing the bf16 directory's
 *   weight gives the stored codes and absmax codes back.
 *
 * Runs from the repository root (fixture_util.h finds the fixtures).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "core/bf16.h"
#include "fixture_util.h"
#include "ops/nf4.h"
#include "testutil.h"

#define REGEN "tools/gen_bnb4_fixture.py"

/* ---- tensors of a fixture file ------------------------------------------------------ */

typedef struct st_fixture {
    fsdp_st_file f;
    FILE *fp;
} st_fixture;

static void fixture_open(st_fixture *s, const char *rel)
{
    char path[512];
    fixture_path(path, sizeof path, rel, REGEN);
    ck_assert_int_eq(fsdp_st_open(path, &s->f), FSDP_STATUS_OK);
    s->fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(s->fp);
}

static void fixture_close(st_fixture *s)
{
    fclose(s->fp);
    fsdp_st_free(&s->f);
}

static const fsdp_st_tensor *fixture_tensor(const st_fixture *s, const char *name)
{
    for (int i = 0; i < s->f.n_tensors; i++)
        if (strcmp(s->f.tensors[i].name, name) == 0)
            return &s->f.tensors[i];
    ck_abort_msg("fixture %s has no tensor '%s'; rerun " REGEN, s->f.path, name);
    return NULL;
}

/* Tensor `name`'s raw bytes (malloc'd), checked to be of dtype `dtype`; its
 * element count in *numel. */
static void *fixture_bytes(const st_fixture *s, const char *name, const char *dtype,
                           size_t *numel)
{
    const fsdp_st_tensor *t = fixture_tensor(s, name);
    ck_assert_msg(strcmp(t->dtype_name, dtype) == 0, "%s: %s, not %s", name, t->dtype_name,
                  dtype);
    size_t n = t->end - t->begin;
    void *buf = malloc(n ? n : 1);
    ck_assert(fseek(s->fp, (long)(s->f.data_offset + t->begin), SEEK_SET) == 0);
    ck_assert_uint_eq(fread(buf, 1, n, s->fp), n);
    if (numel)
        *numel = t->numel;
    return buf;
}

/* Tensor `name` as fp32 (F32 read as is, BF16 widened). */
static float *fixture_f32(const st_fixture *s, const char *name, size_t *numel)
{
    const fsdp_st_tensor *t = fixture_tensor(s, name);
    if (strcmp(t->dtype_name, "BF16") != 0)
        return fixture_bytes(s, name, "F32", numel);
    size_t n;
    uint16_t *h = fixture_bytes(s, name, "BF16", &n);
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = fsdp_bf16_to_f32((fsdp_bf16)h[i]);
    free(h);
    if (numel)
        *numel = n;
    return x;
}

static void expect_same_bits(const void *got, const void *want, size_t bytes, const char *what)
{
    const uint8_t *g = got, *w = want;
    for (size_t i = 0; i < bytes; i++)
        ck_assert_msg(g[i] == w[i], "%s: byte %zu is %u, bitsandbytes has %u",
                      what, i, g[i], w[i]);
}

/* ---- the quantizer --------------------------------------------------------------- */

START_TEST(test_tables)
{
    st_fixture g;
    fixture_open(&g, "bnb4/golden.safetensors");
    size_t n;
    float *code = fixture_f32(&g, "nf4_code", &n);
    ck_assert_uint_eq(n, 16);
    expect_same_bits(fsdp_nf4_code, code, sizeof fsdp_nf4_code, "fsdp_nf4_code");
    float *dyn = fixture_f32(&g, "dynamic_map", &n);
    ck_assert_uint_eq(n, 256);
    expect_same_bits(fsdp_nf4_dynamic_map, dyn, sizeof fsdp_nf4_dynamic_map,
                     "fsdp_nf4_dynamic_map");
    free(code);
    free(dyn);
    fixture_close(&g);
}
END_TEST

START_TEST(test_quantize_probe)
{
    st_fixture g;
    fixture_open(&g, "bnb4/golden.safetensors");
    size_t n, n_codes, nb, n_nested;
    float *x = fixture_f32(&g, "x", &n);
    uint8_t *want_codes = fixture_bytes(&g, "x.codes", "U8", &n_codes);
    float *want_absmax = fixture_f32(&g, "x.absmax", &nb);
    uint8_t *want_q = fixture_bytes(&g, "x.qabsmax", "U8", NULL);
    float *want_nested = fixture_f32(&g, "x.nested", &n_nested);
    float *want_offset = fixture_f32(&g, "x.offset", NULL);
    ck_assert_uint_eq(n_codes, (n + 1) / 2);
    ck_assert_uint_eq(nb, fsdp_nf4_blocks(n));
    ck_assert_uint_eq(n_nested, fsdp_nf4_nested_blocks(nb));
    ck_assert_uint_ge(n_nested, 2);
    ck_assert_uint_ne(n % FSDP_NF4_BLOCK, 0); /* a short last block */

    uint8_t *codes = malloc(n_codes), *q = malloc(nb);
    float *absmax = malloc(nb * sizeof *absmax), *nested = malloc(n_nested * sizeof *nested);
    float offset;
    fsdp_nf4_quantize(x, n, codes, absmax);
    expect_same_bits(codes, want_codes, n_codes, "the codes");
    expect_same_bits(absmax, want_absmax, nb * sizeof *absmax, "the absmax");
    fsdp_nf4_double_quant(absmax, nb, q, nested, &offset);
    expect_same_bits(&offset, want_offset, sizeof offset, "the offset");
    expect_same_bits(nested, want_nested, n_nested * sizeof *nested, "the nested absmax");
    expect_same_bits(q, want_q, nb, "the absmax codes");
    free(x), free(want_codes), free(want_absmax), free(want_q), free(want_nested);
    free(want_offset), free(codes), free(q), free(absmax), free(nested);
    fixture_close(&g);
}
END_TEST

/* ---- layer 0 of the bnb-4bit directory ------------------------------------------------ */

static const char *const layer0[] = {
    "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
};

/* The quant_state JSON's nested_offset (the test reads it by hand: the
 * library's parser is what it checks elsewhere). */
static float quant_state_offset(const st_fixture *s, const char *weight)
{
    char name[256];
    snprintf(name, sizeof name, "%s.quant_state.bitsandbytes__nf4", weight);
    size_t n;
    char *json = fixture_bytes(s, name, "U8", &n);
    json = realloc(json, n + 1);
    json[n] = '\0';
    const char *p = strstr(json, "\"nested_offset\":");
    ck_assert_ptr_nonnull(p);
    float off = strtof(p + strlen("\"nested_offset\":"), NULL);
    free(json);
    return off;
}

START_TEST(test_dequant_weights)
{
    st_fixture g, d, b;
    fixture_open(&g, "bnb4/golden.safetensors");
    fixture_open(&d, "bnb4/nf4/model.safetensors");
    fixture_open(&b, "bnb4/bf16/model.safetensors");
    for (size_t k = 0; k < sizeof layer0 / sizeof *layer0; k++) {
        const char *w = layer0[k];
        char name[256];
        size_t n, n_codes, nb, n_nested;
        float *want = fixture_f32(&g, w, &n);
        uint8_t *codes = fixture_bytes(&d, w, "U8", &n_codes);
        snprintf(name, sizeof name, "%s.absmax", w);
        uint8_t *q = fixture_bytes(&d, name, "U8", &nb);
        snprintf(name, sizeof name, "%s.nested_absmax", w);
        float *nested = fixture_f32(&d, name, &n_nested);
        float offset = quant_state_offset(&d, w);
        ck_assert_uint_eq(n_codes, n / 2);
        ck_assert_uint_eq(nb, fsdp_nf4_blocks(n));
        ck_assert_uint_eq(n_nested, fsdp_nf4_nested_blocks(nb));

        float *absmax = malloc(nb * sizeof *absmax), *x = malloc(n * sizeof *x);
        fsdp_nf4_absmax(q, nested, offset, 0, nb, absmax);
        fsdp_nf4_dequant_ref(codes, absmax, n, x);
        expect_same_bits(x, want, n * sizeof *x, "the dequantized weight");
        /* a range that starts past the first block dequantizes the same */
        fsdp_nf4_absmax(q, nested, offset, 3, nb - 3, absmax);
        fsdp_nf4_dequant_ref(codes + 3 * FSDP_NF4_BLOCK / 2, absmax, n - 3 * FSDP_NF4_BLOCK, x);
        expect_same_bits(x, want + 3 * FSDP_NF4_BLOCK, (n - 3 * FSDP_NF4_BLOCK) * sizeof *x,
                         "the dequantized weight from block 3");

        /* quantizing the bf16 weight gives what transformers stored */
        float *src = fixture_f32(&b, w, NULL);
        uint8_t *my_codes = malloc(n_codes), *my_q = malloc(nb);
        float *my_nested = malloc(n_nested * sizeof *my_nested), my_offset;
        fsdp_nf4_quantize(src, n, my_codes, absmax);
        fsdp_nf4_double_quant(absmax, nb, my_q, my_nested, &my_offset);
        expect_same_bits(my_codes, codes, n_codes, "the codes of the bf16 weight");
        expect_same_bits(my_q, q, nb, "the absmax codes of the bf16 weight");
        expect_same_bits(my_nested, nested, n_nested * sizeof *nested,
                         "the nested absmax of the bf16 weight");
        ck_assert_msg(my_offset == offset, "%s: offset %.9g, not %.9g", w, my_offset, offset);
        free(want), free(codes), free(q), free(nested), free(absmax), free(x), free(src);
        free(my_codes), free(my_q), free(my_nested);
    }
    fixture_close(&g);
    fixture_close(&d);
    fixture_close(&b);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"nf4", 30, FSDP_TESTS(test_tables, test_quantize_probe, test_dequant_weights)},
    };
    return fsdp_test_main("bnb4", tcases, FSDP_TEST_LEN(tcases));
}
