/*
 * test_llmc.c - llm.c model files (the "llmc" weight format with GPT-2's
 * llm.c mapping): fp32 and bf16 round trips through the unit layout, the
 * exact file layout (header and llm.c's tensor order, checked against an
 * independent reference), atomic writes, and rejection of corrupt or
 * mismatched files with messages that name the file.
 *
 * Each fixture has a directory of its own in the suite's scratch directory
 * (testutil.h), removed even when a test fails.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/modelfile.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/rng.h"
#include "file_util.h"
#include "model_rig.h"
#include "models/gpt2.h"
#include "testutil.h"

#define SMALL_SPEC "custom:layers=3,heads=2,channels=16,vocab=100,context=8"

/* The format under test, through the generic weight-file API. */
static fsdp_status llmc_write(const char *path, const fsdp_model *m, const float *const *units,
                              fsdp_dtype dt)
{
    return fsdp_modelfile_write(path, fsdp_modelfile_format_find("llmc"), m, units, dt);
}

/* What opening the file says it holds: the config and "fp32" or "bf16". */
static fsdp_status llmc_read_config(const char *path, char *config, size_t n, char *dtype)
{
    fsdp_modelfile *mf = NULL;
    FSDP_TRY(fsdp_modelfile_open(&mf, path));
    ck_assert_str_eq(fsdp_modelfile_family(mf)->name, "gpt2");
    ck_assert_ptr_eq(fsdp_modelfile_format_get(mf), fsdp_modelfile_format_find("llmc"));
    snprintf(config, n, "%s", fsdp_modelfile_config(mf));
    snprintf(dtype, 8, "%s", fsdp_modelfile_dtype_name(mf));
    fsdp_modelfile_close(mf);
    return FSDP_STATUS_OK;
}

/* Every unit of model m from the file, through the range reader. */
static fsdp_status llmc_read(const char *path, const fsdp_model *m, float *const *units)
{
    fsdp_modelfile *mf = NULL;
    FSDP_TRY(fsdp_modelfile_open(&mf, path));
    fsdp_status st = fsdp_modelfile_bind(mf, m);
    for (int u = 0; u < m->n_units && st == FSDP_STATUS_OK; u++)
        st = fsdp_modelfile_read_range(mf, u, 0, m->units[u].numel, units[u]);
    fsdp_modelfile_close(mf);
    return st;
}

typedef struct fixture {
    char dir[128]; /* of its own, in the scratch directory */
    char path[160];
    fsdp_model m;
    float **units; /* random values, one buffer per unit */
} fixture;

static void fixture_init(fixture *fx, const char *spec, uint64_t seed)
{
    fsdp_test_mkdir(fx->dir, sizeof fx->dir, "llmc");
    snprintf(fx->path, sizeof fx->path, "%s/model.bin", fx->dir);
    ck_assert_int_eq(fsdp_model_from_spec(spec, &fx->m), FSDP_STATUS_OK);
    fx->units = units_alloc(&fx->m);
    /* every element distinct and random, so a misplaced slab shows */
    for (int u = 0; u < fx->m.n_units; u++)
        for (size_t i = 0; i < fx->m.units[u].numel; i++)
            fx->units[u][i] = fsdp_rng_normal(seed, (uint64_t)u, i);
}

/* Free the fixture's buffers (its files go with the scratch directory). */
static void fixture_free(fixture *fx)
{
    units_free(&fx->m, fx->units);
    fsdp_model_free(&fx->m);
}

/* The fixture's parameters written to its path in dtype dt (must succeed). */
static void fixture_write(const fixture *fx, fsdp_dtype dt)
{
    ck_assert_int_eq(llmc_write(fx->path, &fx->m, (const float *const *)fx->units, dt),
                     FSDP_STATUS_OK);
}

/* The fp32 values of the whole model in llm.c's file order, built here from
 * the llm.c layout description (not from llmc.c's table). */
static float *reference_order(const fixture *fx, size_t *n_out)
{
    static const char *const per_layer[] = {
        "ln_1.weight",     "ln_1.bias",         "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",       "ln_2.bias",
        "mlp.c_fc.weight", "mlp.c_fc.bias",     "mlp.c_proj.weight",  "mlp.c_proj.bias",
    };
    const fsdp_gpt2_config *c = fsdp_gpt2_config_of(&fx->m);
    float *out = malloc(fx->m.numel * sizeof *out);
    size_t n = 0;
    char name[64];
    for (int k = -2; k < 14; k++) { /* -2 wte, -1 wpe, 0..11 blocks, 12..13 ln_f */
        int n_l = k >= 0 && k < 12 ? c->n_layer : 1;
        for (int l = 0; l < n_l; l++) {
            if (k == -2)
                snprintf(name, sizeof name, "wte.weight");
            else if (k == -1)
                snprintf(name, sizeof name, "wpe.weight");
            else if (k < 12)
                snprintf(name, sizeof name, "h.%d.%s", l, per_layer[k]);
            else
                snprintf(name, sizeof name, "ln_f.%s", k == 12 ? "weight" : "bias");
            int u;
            const fsdp_param_spec *p = fsdp_model_find_param(&fx->m, name, &u);
            ck_assert_msg(p != NULL, "no parameter %s", name);
            memcpy(out + n, fx->units[u] + p->offset, p->numel * sizeof *out);
            n += p->numel;
        }
    }
    ck_assert_uint_eq(n, fx->m.numel);
    /* and the sizes llm.c computes */
    size_t C = (size_t)c->n_embd, L = (size_t)c->n_layer;
    ck_assert_uint_eq(n, (size_t)c->padded_vocab_size * C + (size_t)c->max_seq_len * C +
                             L * (12 * C * C + 13 * C) + 2 * C);
    *n_out = n;
    return out;
}

static void check_header(const uint8_t *file, int version, const fsdp_gpt2_config *c)
{
    int32_t h[256];
    memcpy(h, file, sizeof h);
    ck_assert_int_eq(h[0], 20240326);
    ck_assert_int_eq(h[1], version);
    ck_assert_int_eq(h[2], c->max_seq_len);
    ck_assert_int_eq(h[3], c->vocab_size);
    ck_assert_int_eq(h[4], c->n_layer);
    ck_assert_int_eq(h[5], c->n_head);
    ck_assert_int_eq(h[6], c->n_embd);
    ck_assert_int_eq(h[7], c->padded_vocab_size);
    for (int i = 8; i < 256; i++)
        REQUIRE(h[i] == 0, "header[%d] = %d, want 0", i, h[i]);
}

/* ---- round trips ----------------------------------------------------------- */

static void roundtrip_f32(const char *spec)
{
    fixture fx;
    fixture_init(&fx, spec, 1);
    fixture_write(&fx, FSDP_DTYPE_F32);
    ck_assert_int_eq(count_entries(fx.dir), 1); /* no temporary left behind */

    size_t n_file, n_ref;
    uint8_t *file = (uint8_t *)slurp_n(fx.path, &n_file);
    float *ref = reference_order(&fx, &n_ref);
    ck_assert_uint_eq(n_file, 1024 + 4 * n_ref);
    check_header(file, 3, fsdp_gpt2_config_of(&fx.m));
    ck_assert_int_eq(memcmp(file + 1024, ref, 4 * n_ref), 0);

    char cfg[FSDP_MODEL_CONFIG_MAX], dt[8];
    ck_assert_int_eq(llmc_read_config(fx.path, cfg, sizeof cfg, dt), FSDP_STATUS_OK);
    ck_assert_str_eq(dt, "fp32");
    ck_assert_str_eq(cfg, fx.m.config);

    float **back = units_alloc(&fx.m);
    ck_assert_int_eq(llmc_read(fx.path, &fx.m, back), FSDP_STATUS_OK);
    for (int u = 0; u < fx.m.n_units; u++)
        ck_assert_int_eq(memcmp(back[u], fx.units[u], fx.m.units[u].numel * 4), 0);
    units_free(&fx.m, back);
    free(ref);
    free(file);
    fixture_free(&fx);
}

START_TEST(test_roundtrip_f32_small) { roundtrip_f32(SMALL_SPEC); }
END_TEST

START_TEST(test_roundtrip_f32_tiny) { roundtrip_f32("tiny"); }
END_TEST

START_TEST(test_roundtrip_bf16)
{
    fixture fx;
    fixture_init(&fx, SMALL_SPEC, 2);
    /* ties and edge values: round to nearest even, not truncation */
    int u0;
    const fsdp_param_spec *p = fsdp_model_find_param(&fx.m, "h.1.ln_2.bias", &u0);
    ck_assert_ptr_nonnull(p);
    float *v = fx.units[u0] + p->offset;
    v[0] = 1.0f + 0x1p-8f;             /* tie between 1 and 1+2^-7: even is 1 */
    v[1] = 1.0f + 3 * 0x1p-8f;         /* tie: even is 1+2^-6 */
    v[2] = 1.0f + 0x1p-8f + 0x1p-20f;  /* just above the tie: rounds up */
    v[3] = -0.0f;
    fixture_write(&fx, FSDP_DTYPE_BF16);
    size_t n_file, n_ref;
    uint8_t *file = (uint8_t *)slurp_n(fx.path, &n_file);
    float *ref = reference_order(&fx, &n_ref);
    ck_assert_uint_eq(n_file, 1024 + 2 * n_ref);
    check_header(file, 5, fsdp_gpt2_config_of(&fx.m));
    for (size_t i = 0; i < n_ref; i++) {
        uint16_t h;
        memcpy(&h, file + 1024 + 2 * i, 2);
        REQUIRE(h == fsdp_f32_to_bf16(ref[i]), "element %zu: bf16 0x%04x, want 0x%04x", i, h,
                fsdp_f32_to_bf16(ref[i]));
    }
    char cfg[FSDP_MODEL_CONFIG_MAX], dt[8];
    ck_assert_int_eq(llmc_read_config(fx.path, cfg, sizeof cfg, dt), FSDP_STATUS_OK);
    ck_assert_str_eq(dt, "bf16");

    float **back = units_alloc(&fx.m);
    ck_assert_int_eq(llmc_read(fx.path, &fx.m, back), FSDP_STATUS_OK);
    for (int u = 0; u < fx.m.n_units; u++)
        for (size_t i = 0; i < fx.m.units[u].numel; i++) {
            float want = fsdp_bf16_to_f32(fsdp_f32_to_bf16(fx.units[u][i]));
            REQUIRE(memcmp(&back[u][i], &want, 4) == 0, "unit %d element %zu: %g, want %g", u,
                    i, back[u][i], want);
        }
    float *b = back[u0] + p->offset;
    ck_assert_float_eq(b[0], 1.0f);
    ck_assert_float_eq(b[1], 1.0f + 0x1p-6f);
    ck_assert_float_eq(b[2], 1.0f + 0x1p-7f);
    ck_assert(b[3] == 0.0f && signbit(b[3]));
    units_free(&fx.m, back);
    free(ref);
    free(file);
    fixture_free(&fx);
}
END_TEST

START_TEST(test_write_atomic)
{
    fixture fx;
    fixture_init(&fx, SMALL_SPEC, 3);
    const float *const *units = (const float *const *)fx.units;
    ck_assert_int_eq(llmc_write(fx.path, &fx.m, units, FSDP_DTYPE_BF16), FSDP_STATUS_OK);
    /* overwrite in place: the new file replaces the old one whole */
    ck_assert_int_eq(llmc_write(fx.path, &fx.m, units, FSDP_DTYPE_F32), FSDP_STATUS_OK);
    ck_assert_int_eq(count_entries(fx.dir), 1);
    char cfg[FSDP_MODEL_CONFIG_MAX], dt[8];
    ck_assert_int_eq(llmc_read_config(fx.path, cfg, sizeof cfg, dt), FSDP_STATUS_OK);
    ck_assert_str_eq(dt, "fp32");
    /* a directory that does not exist: IO naming the path, nothing created */
    char bad[192];
    snprintf(bad, sizeof bad, "%s/missing/model.bin", fx.dir);
    ck_assert_int_eq(llmc_write(bad, &fx.m, units, FSDP_DTYPE_F32), FSDP_STATUS_IO);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), bad));
    ck_assert_int_eq(count_entries(fx.dir), 1);
    ck_assert_int_eq(llmc_write(fx.path, &fx.m, units, FSDP_DTYPE_COUNT),
                     FSDP_STATUS_INVALID_ARG);
    fixture_free(&fx);
}
END_TEST

/* ---- rejection --------------------------------------------------------------- */

/* What the rejection tests start from: a fixture of SMALL_SPEC written in
 * fp32, the bytes of its file, a path for damaged copies next to it, and
 * buffers to read into. */
typedef struct reject_rig {
    fixture fx;
    uint8_t *good; /* (n,) the file as written */
    size_t n;
    char bad[192];
    float **back;
} reject_rig;

static void reject_rig_init(reject_rig *r, uint64_t seed)
{
    fixture_init(&r->fx, SMALL_SPEC, seed);
    fixture_write(&r->fx, FSDP_DTYPE_F32);
    r->good = (uint8_t *)slurp_n(r->fx.path, &r->n);
    snprintf(r->bad, sizeof r->bad, "%s/bad.bin", r->fx.dir);
    r->back = units_alloc(&r->fx.m);
}

static void reject_rig_free(reject_rig *r)
{
    units_free(&r->fx.m, r->back);
    free(r->good);
    fixture_free(&r->fx);
}

/* Both entry points must reject r->bad with `want` and a message naming it. */
static void expect_reject(const reject_rig *r, fsdp_status want, const char *needle)
{
    const char *path = r->bad;
    const fsdp_model *m = &r->fx.m;
    float **units = r->back;
    char cfg[FSDP_MODEL_CONFIG_MAX], dt[8];
    fsdp_status st = llmc_read_config(path, cfg, sizeof cfg, dt);
    ck_assert_msg(st == want, "read_config: %s, want %s (%s)", fsdp_status_name(st),
                  fsdp_status_name(want), fsdp_error_msg());
    ck_assert_msg(strstr(fsdp_error_msg(), path), "message '%s' lacks the path",
                  fsdp_error_msg());
    if (needle)
        ck_assert_msg(strstr(fsdp_error_msg(), needle), "message '%s' lacks '%s'",
                      fsdp_error_msg(), needle);
    st = llmc_read(path, m, units);
    ck_assert_msg(st == want, "read: %s, want %s (%s)", fsdp_status_name(st),
                  fsdp_status_name(want), fsdp_error_msg());
    ck_assert_msg(strstr(fsdp_error_msg(), path), "message '%s' lacks the path",
                  fsdp_error_msg());
}

/* At r->bad, a copy of the good file with header word `word` set to v (none
 * if word < 0), cut short by `cut` bytes. */
static void write_variant(const reject_rig *r, int word, int32_t v, size_t cut)
{
    uint8_t *b = malloc(r->n);
    memcpy(b, r->good, r->n);
    if (word >= 0)
        memcpy(b + 4 * word, &v, 4);
    spit(r->bad, b, r->n - cut);
    free(b);
}

START_TEST(test_reject_corrupt)
{
    reject_rig rig;
    reject_rig_init(&rig, 4);
    char size_now[32];
    write_variant(&rig, -1, 0, 1); /* truncated by one byte */
    snprintf(size_now, sizeof size_now, "%zu bytes", rig.n - 1);
    expect_reject(&rig, FSDP_STATUS_FORMAT, size_now);
    write_variant(&rig, -1, 0, rig.n - 100); /* shorter than the header */
    expect_reject(&rig, FSDP_STATUS_FORMAT, "header");

    /* one header word changed; the message must hold needle (if any) */
    static const struct {
        int word;
        int32_t v;
        const char *needle;
    } words[] = {
        {0, 20240520, "20240520"}, /* a token shard's magic */
        {1, 4, "version 4"},
        {6, 32, "needs"},          /* C: consistent shapes, wrong size */
        {2, 9, "needs"},           /* maxT */
        {4, 1 << 30, NULL},        /* absurd L */
        {6, 0x7fffffff, NULL},     /* absurd C */
        {7, 0x7fffff80, NULL},     /* absurd Vp */
        {5, 3, "divisible"},       /* C=16 not divisible by NH=3 */
        {5, 0, NULL},              /* NH = 0 */
        {4, -2, NULL},             /* negative L */
        {3, 129, "Vp"},            /* V > Vp = 128 */
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(words); i++) {
        write_variant(&rig, words[i].word, words[i].v, 0);
        expect_reject(&rig, FSDP_STATUS_FORMAT, words[i].needle);
    }

    snprintf(rig.bad, sizeof rig.bad, "%s/none.bin", rig.fx.dir);
    expect_reject(&rig, FSDP_STATUS_IO, NULL);

    /* the untouched file still loads */
    ck_assert_int_eq(llmc_read(rig.fx.path, &rig.fx.m, rig.back), FSDP_STATUS_OK);
    reject_rig_free(&rig);
}
END_TEST

START_TEST(test_reject_hostile_headers)
{
    /* Random header words in and around every plausible range: each read
     * fails with FORMAT (the size cannot match) and never crashes or
     * allocates what the header asks for. */
    reject_rig rig;
    reject_rig_init(&rig, 5);
    for (uint64_t i = 0; i < 300; i++) {
        int32_t h[8];
        memcpy(h, rig.good, sizeof h);
        for (int w = 2; w < 8; w++) {
            uint64_t r = fsdp_rng_u64(77, (uint64_t)w, i);
            switch (r % 4) {
            case 0: break;                                         /* keep */
            case 1: h[w] = (int32_t)(r >> 32); break;              /* anything */
            case 2: h[w] = (int32_t)((r >> 32) % 1024); break;     /* small */
            default: h[w] = (int32_t)1 << (int)((r >> 32) % 31); break; /* power of 2 */
            }
        }
        if (!memcmp(h, rig.good, sizeof h))
            continue;
        uint8_t *b = malloc(rig.n);
        memcpy(b, rig.good, rig.n);
        memcpy(b, h, sizeof h);
        spit(rig.bad, b, rig.n);
        free(b);
        char cfg[FSDP_MODEL_CONFIG_MAX], dt[8];
        fsdp_status st = llmc_read_config(rig.bad, cfg, sizeof cfg, dt);
        if (st == FSDP_STATUS_OK) { /* only a header that describes this exact size */
            ck_assert_int_eq(llmc_read(rig.bad, &rig.fx.m, rig.back) == FSDP_STATUS_OK,
                             strcmp(cfg, rig.fx.m.config) == 0);
            continue;
        }
        REQUIRE(st == FSDP_STATUS_FORMAT, "case %llu: %s (%s)", (unsigned long long)i,
                fsdp_status_name(st), fsdp_error_msg());
        REQUIRE(strstr(fsdp_error_msg(), rig.bad), "case %llu: message '%s' lacks the path",
                (unsigned long long)i, fsdp_error_msg());
    }
    reject_rig_free(&rig);
}
END_TEST

START_TEST(test_reject_config_mismatch)
{
    fixture fx;
    fixture_init(&fx, SMALL_SPEC, 6);
    fixture_write(&fx, FSDP_DTYPE_F32);
    const char *others[] = {
        "custom:layers=2,heads=2,channels=16,vocab=100,context=8",  /* L */
        "custom:layers=3,heads=4,channels=16,vocab=100,context=8",  /* NH only: same size */
        "custom:layers=3,heads=2,channels=16,vocab=101,context=8",  /* V only: same size */
        "custom:layers=3,heads=2,channels=16,vocab=100,context=16", /* maxT */
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        fsdp_model m2;
        ck_assert_int_eq(fsdp_model_from_spec(others[i], &m2), FSDP_STATUS_OK);
        float **u2 = units_alloc(&m2);
        ck_assert_int_eq(llmc_read(fx.path, &m2, u2), FSDP_STATUS_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), fx.path));
        ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "holds GPT-2 'layers=3,heads=2"));
        units_free(&m2, u2);
        fsdp_model_free(&m2);
    }
    fixture_free(&fx);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"roundtrip", 60, .tmpdir = true,
         FSDP_TESTS(test_roundtrip_f32_small, test_roundtrip_f32_tiny, test_roundtrip_bf16,
                    test_write_atomic)},
        {"reject", 60, .tmpdir = true,
         FSDP_TESTS(test_reject_corrupt, test_reject_hostile_headers, test_reject_config_mismatch)},
    };
    return fsdp_test_main("llmc", tcases, FSDP_TEST_LEN(tcases));
}
