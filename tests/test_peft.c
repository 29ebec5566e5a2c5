/*
 * test_peft.c - PEFT LoRA adapter directories (src/ckpt/peft.c): a written
 * directory reads back bit for bit (whole, by slices, from several threads;
 * F32, BF16 and F16 tensors), its adapter_config.json says what PEFT needs
 * (target_modules by last component or by path); and hostile directories
 * (no config, configs asking for what fsdp does not compute, wrong r,
 * missing, extra, mis-shaped, mistyped tensors, a truncated weights file)
 * each refused naming the file and the key or tensor; the writer never
 * replaces what is at its path and leaves nothing behind when it fails.
 *
 * The model is llama-tiny given adapters by hand (give_adapters), as
 * models/lora.h's fsdp_model_add_lora lays them out: <module>.lora_A.weight
 * (r, C) and <module>.lora_B.weight (OC, r) after the unit's base
 * parameters, every base parameter frozen, relaid out. Runs from the
 * repository root; each test in a directory of its own.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/peft.h"
#include "core/bf16.h"
#include "core/fileio.h"
#include "hfdir_util.h"
#include "model_files_util.h"
#include "models/registry.h"
#include "testutil.h"

#define R 4


/* ---- a model with adapters ------------------------------------------------------- */

/* Give m adapters of rank r on every linear weight whose module's last
 * component is in `targets` (a comma list) and, when `only_unit` >= 0, in
 * that unit only; freeze the base and relayout. */
static void give_adapters(fsdp_model *m, const char *targets, int r, int only_unit)
{
    for (int u = 0; u < m->n_units; u++) {
        fsdp_unit_spec *us = &m->units[u];
        int n0 = us->n_params;
        us->params = realloc(us->params, (size_t)(3 * n0) * sizeof *us->params);
        for (int i = 0; i < n0; i++) {
            fsdp_param_spec *p = &us->params[i];
            p->frozen = true;
            char mod[64], last[64];
            if (p->ndim != 2 || strlen(p->name) < 8 ||
                strcmp(p->name + strlen(p->name) - 7, ".weight") || (only_unit >= 0 &&
                                                                      u != only_unit))
                continue;
            snprintf(mod, sizeof mod, "%.*s", (int)strlen(p->name) - 7, p->name);
            const char *dot = strrchr(mod, '.');
            snprintf(last, sizeof last, ",%s,", dot ? dot + 1 : mod);
            char list[300];
            snprintf(list, sizeof list, ",%s,", targets);
            if (!strstr(list, last))
                continue;
            char name[64];
            int64_t oc = p->shape[0], c = p->shape[1];
            snprintf(name, sizeof name, "%s.lora_A.weight", mod);
            fsdp_unit_add_param(us, name, r, c, FSDP_INIT_UNIFORM, 0.1f, true);
            snprintf(name, sizeof name, "%s.lora_B.weight", mod);
            fsdp_unit_add_param(us, name, oc, r, FSDP_INIT_ZEROS, 0.0f, true);
        }
    }
    ck_assert_int_eq(fsdp_model_relayout(m), FSDP_STATUS_OK);
    m->lora = (fsdp_lora_config){.r = r, .alpha = 8.0};
    snprintf(m->lora.targets, sizeof m->lora.targets, "%s", targets);
}

typedef struct lora_model {
    fsdp_model m;
    float **units; /* [n_units] the trainable elements [0, train_numel), fp32 */
} lora_model;

/* llama-tiny with adapters; adapter element k of parameter p holds a value
 * with a full mantissa (so a lost bit shows), or one BF16 and F16 hold
 * exactly when `exact16`. */
static void lora_model_init(lora_model *lm, const char *targets, int only_unit, bool exact16)
{
    ck_assert_int_eq(fsdp_model_from_spec("llama-tiny", &lm->m), FSDP_STATUS_OK);
    give_adapters(&lm->m, targets, R, only_unit);
    lm->units = calloc((size_t)lm->m.n_units, sizeof *lm->units);
    for (int u = 0; u < lm->m.n_units; u++) {
        const fsdp_unit_spec *us = &lm->m.units[u];
        lm->units[u] = calloc(us->train_numel + 1, sizeof(float));
        for (int i = 0; i < us->n_params; i++) {
            const fsdp_param_spec *p = &us->params[i];
            for (size_t k = 0; !p->frozen && k < p->numel; k++) {
                int q = (int)((k * 37 + (size_t)i * 11 + (size_t)u * 5) % 251) - 125;
                lm->units[u][p->offset + k] = exact16 ? (float)q / 64.0f
                                                      : (float)q / 3.0f + 1e-7f * (float)k;
            }
        }
    }
}

static void lora_model_free(lora_model *lm)
{
    for (int u = 0; u < lm->m.n_units; u++)
        free(lm->units[u]);
    free(lm->units);
    fsdp_model_free(&lm->m);
}

static void write_ok(const char *dir, const lora_model *lm, const char *base)
{
    fsdp_status st = fsdp_peft_write(dir, &lm->m, (const float *const *)lm->units, base);
    REQUIRE(st == FSDP_STATUS_OK, "writing %s: %s", dir, fsdp_error_msg());
}

static void open_bind_ok(const char *dir, const lora_model *lm, fsdp_peft_dir *d)
{
    fsdp_status st = fsdp_peft_open(dir, d);
    REQUIRE(st == FSDP_STATUS_OK, "opening %s: %s", dir, fsdp_error_msg());
    st = fsdp_peft_bind(d, &lm->m);
    REQUIRE(st == FSDP_STATUS_OK, "binding %s: %s", dir, fsdp_error_msg());
}

/* Every adapter of lm read back whole from d equals lm's, bit for bit. */
static int expect_same_adapters(const fsdp_peft_dir *d, const lora_model *lm)
{
    int n = 0;
    for (int u = 0; u < lm->m.n_units; u++)
        for (int i = 0; i < lm->m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &lm->m.units[u].params[i];
            if (p->frozen)
                continue;
            float *got = malloc(p->numel * sizeof *got);
            ck_assert_int_eq(fsdp_peft_read(d, u, i, 0, p->numel, got), FSDP_STATUS_OK);
            ck_assert_msg(!memcmp(got, lm->units[u] + p->offset, p->numel * sizeof *got),
                          "%s differs after the round trip", p->name);
            free(got);
            n++;
        }
    return n;
}

/* ---- round trips ------------------------------------------------------------------ */

START_TEST(test_roundtrip)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "rt");
    lora_model lm;
    lora_model_init(&lm, "q_proj,v_proj,down_proj", -1, false);
    lm.m.lora.alpha = 16.0;
    lm.m.lora.rslora = true;
    char out[256];
    pathf(out, sizeof out, "%s/adapter", dir);
    write_ok(out, &lm, "tests/fixtures/llama \"gqa\"");
    /* the config as PEFT reads it */
    char *cfg = (char *)read_file(path_in(out, FSDP_PEFT_CONFIG), NULL);
    static const char *const want[] = {
        "\"peft_type\": \"LORA\"", "\"r\": 4,", "\"lora_alpha\": 16,", "\"use_rslora\": true",
        "\"task_type\": \"CAUSAL_LM\"", "\"bias\": \"none\"", "\"lora_dropout\": 0.0",
        "\"fan_in_fan_out\": false", "\"inference_mode\": true",
        "\"base_model_name_or_path\": \"tests/fixtures/llama \\\"gqa\\\"\"",
        "\"target_modules\": [\n    \"down_proj\",\n    \"q_proj\",\n    \"v_proj\"\n  ]"};
    for (size_t k = 0; k < FSDP_TEST_LEN(want); k++)
        ck_assert_msg(strstr(cfg, want[k]), "adapter_config.json lacks %s:\n%s", want[k], cfg);
    free(cfg);
    fsdp_peft_dir d;
    open_bind_ok(out, &lm, &d);
    ck_assert_int_eq(d.lora.r, R);
    ck_assert(d.lora.alpha == 16.0 && d.lora.rslora);
    ck_assert_str_eq(d.lora.targets, "down_proj,q_proj,v_proj");
    ck_assert_str_eq(d.base, "tests/fixtures/llama \"gqa\"");
    ck_assert_int_eq(d.st.n_tensors, 2 * 3 * lm.m.n_layer);
    ck_assert_str_eq(d.st.tensors[0].name,
                     "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
    ck_assert_int_eq(expect_same_adapters(&d, &lm), 2 * 3 * lm.m.n_layer);
    /* a slice, as a rank reads its shard; a base parameter or a range past the end is refused */
    int unit;
    const fsdp_param_spec *p =
        fsdp_model_find_param(&lm.m, "model.layers.1.self_attn.v_proj.lora_B.weight", &unit);
    int idx = (int)(p - lm.m.units[unit].params);
    float slice[5];
    ck_assert_int_eq(fsdp_peft_read(&d, unit, idx, 7, 5, slice), FSDP_STATUS_OK);
    ck_assert(!memcmp(slice, lm.units[unit] + p->offset + 7, sizeof slice));
    expect_error(fsdp_peft_read(&d, unit, idx, p->numel - 2, 5, slice), FSDP_STATUS_INVALID_ARG,
                 "past the end", "v_proj.lora_B.weight", "past its end", NULL);
    expect_error(fsdp_peft_read(&d, unit, 1, 0, 1, slice), FSDP_STATUS_INVALID_ARG, "base",
                 "not an adapter", NULL);
    fsdp_peft_close(&d);
    /* written again from what was read: the same bytes */
    char again[256];
    pathf(again, sizeof again, "%s/again", dir);
    write_ok(again, &lm, "tests/fixtures/llama \"gqa\"");
    size_t na, nb;
    unsigned char *a = read_file(path_in(out, FSDP_PEFT_WEIGHTS), &na);
    unsigned char *b = read_file(path_in(again, FSDP_PEFT_WEIGHTS), &nb);
    ck_assert(na == nb && !memcmp(a, b, na));
    ck_assert_int_eq((int)(na - 8 - (size_t)((uint64_t *)a)[0]) % 4, 0);
    ck_assert_int_eq((int)(((uint64_t *)a)[0] % 8), 0); /* header padded as PEFT's writer */
    free(a);
    free(b);
    lora_model_free(&lm);
}
END_TEST

/* target_modules names modules by path when a name would cover more. */
START_TEST(test_partial_targets)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "partial");
    lora_model lm;
    lora_model_init(&lm, "q_proj,o_proj", 1, false); /* unit 1 = layer 0 only */
    char out[256];
    pathf(out, sizeof out, "%s/adapter", dir);
    write_ok(out, &lm, NULL);
    char *cfg = (char *)read_file(path_in(out, FSDP_PEFT_CONFIG), NULL);
    ck_assert_msg(strstr(cfg, "\"target_modules\": [\n    \"model.layers.0.self_attn.o_proj\",\n"
                              "    \"model.layers.0.self_attn.q_proj\"\n  ]"), "%s", cfg);
    ck_assert_msg(strstr(cfg, "\"base_model_name_or_path\": null"), "%s", cfg);
    free(cfg);
    fsdp_peft_dir d;
    open_bind_ok(out, &lm, &d);
    ck_assert_str_eq(d.lora.targets,
                     "model.layers.0.self_attn.o_proj,model.layers.0.self_attn.q_proj");
    ck_assert_str_eq(d.base, "");
    ck_assert_int_eq(expect_same_adapters(&d, &lm), 4);
    fsdp_peft_close(&d);
    lora_model_free(&lm);
}
END_TEST

/* ---- directories built by hand ------------------------------------------------------ */

typedef struct htensor {
    char name[128];
    char dtype[8];
    uint64_t shape[2];
    float *x;           /* values, row-major */
} htensor;

typedef struct hdir {
    char config[2048];
    htensor t[64];
    int n;
} hdir;

/* What fsdp_peft_write would write for lm, as editable parts: a PEFT
 * config with r = R, alpha 8, and every adapter in F32. */
static void hdir_from(hdir *h, const lora_model *lm)
{
    memset(h, 0, sizeof *h);
    snprintf(h->config, sizeof h->config,
             "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": 8, \"lora_dropout\": 0.0, "
             "\"bias\": \"none\", \"use_dora\": false, \"fan_in_fan_out\": false, "
             "\"modules_to_save\": null, \"rank_pattern\": {}, \"alpha_pattern\": {}, "
             "\"layers_to_transform\": null, \"layers_pattern\": null, \"use_rslora\": false, "
             "\"target_modules\": [\"q_proj\", \"v_proj\"], \"task_type\": \"CAUSAL_LM\", "
             "\"base_model_name_or_path\": \"base\", \"some_future_key\": [1, 2]}", R);
    for (int u = 0; u < lm->m.n_units; u++)
        for (int i = 0; i < lm->m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &lm->m.units[u].params[i];
            if (p->frozen)
                continue;
            htensor *t = &h->t[h->n++];
            snprintf(t->name, sizeof t->name, FSDP_PEFT_PREFIX "%s", p->name);
            snprintf(t->dtype, sizeof t->dtype, "F32");
            t->shape[0] = (uint64_t)p->shape[0];
            t->shape[1] = (uint64_t)p->shape[1];
            t->x = malloc(p->numel * sizeof *t->x);
            memcpy(t->x, lm->units[u] + p->offset, p->numel * sizeof *t->x);
        }
}

static void hdir_free(hdir *h)
{
    for (int i = 0; i < h->n; i++)
        free(h->t[i].x);
}

static htensor *hfind(hdir *h, const char *name)
{
    for (int i = 0; i < h->n; i++)
        if (strstr(h->t[i].name, name))
            return &h->t[i];
    ck_abort_msg("no tensor %s", name);
    return NULL;
}

/* t with `rows` rows (its data grown with zeros or cut, so that writing
 * it reads only what it holds). */
static void hresize(htensor *t, uint64_t rows)
{
    size_t had = (size_t)(t->shape[0] * t->shape[1]), n = (size_t)(rows * t->shape[1]);
    t->x = realloc(t->x, n * sizeof *t->x);
    ck_assert_ptr_nonnull(t->x);
    if (n > had)
        memset(t->x + had, 0, (n - had) * sizeof *t->x);
    t->shape[0] = rows;
}

/* Write h as the new directory dir (config NULL: none). */
static void hdir_write(const hdir *h, const char *dir)
{
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    if (h->config[0])
        write_file(path_in(dir, FSDP_PEFT_CONFIG), h->config, strlen(h->config));
    fsdp_sbuf hd = {0};
    fsdp_sbuf_printf(&hd, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t at = 0;
    for (int i = 0; i < h->n; i++) {
        const htensor *t = &h->t[i];
        uint64_t bytes = t->shape[0] * t->shape[1] * (strcmp(t->dtype, "F32") ? 2 : 4);
        fsdp_sbuf_printf(&hd, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%llu,%llu],"
                         "\"data_offsets\":[%llu,%llu]}", t->name, t->dtype,
                         (unsigned long long)t->shape[0], (unsigned long long)t->shape[1],
                         (unsigned long long)at, (unsigned long long)(at + bytes));
        at += bytes;
    }
    fsdp_sbuf_printf(&hd, "}");
    FILE *f = fopen(path_in(dir, FSDP_PEFT_WEIGHTS), "wb");
    uint64_t hn = hd.n;
    fwrite(&hn, 8, 1, f);
    fwrite(hd.p, 1, hd.n, f);
    for (int i = 0; i < h->n; i++) {
        const htensor *t = &h->t[i];
        size_t n = (size_t)(t->shape[0] * t->shape[1]);
        for (size_t k = 0; k < n; k++) {
            uint16_t v = !strcmp(t->dtype, "BF16") ? fsdp_f32_to_bf16(t->x[k])
                                                   : f32_to_f16(t->x[k]);
            if (!strcmp(t->dtype, "F32"))
                fwrite(&t->x[k], 4, 1, f);
            else
                fwrite(&v, 2, 1, f);
        }
    }
    fclose(f);
    free(hd.p);
}

START_TEST(test_mixed_dtypes)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "dtypes");
    lora_model lm;
    lora_model_init(&lm, "q_proj,v_proj", -1, true);
    hdir h;
    hdir_from(&h, &lm);
    for (int i = 0; i < h.n; i++)
        snprintf(h.t[i].dtype, sizeof h.t[i].dtype, "%s", i % 3 == 0 ? "BF16"
                                                          : i % 3 == 1 ? "F16" : "F32");
    char p[256];
    pathf(p, sizeof p, "%s/mixed", dir);
    hdir_write(&h, p);
    fsdp_peft_dir d;
    open_bind_ok(p, &lm, &d);
    ck_assert_str_eq(d.lora.targets, "q_proj,v_proj");
    ck_assert_str_eq(d.base, "base");
    ck_assert_int_eq(expect_same_adapters(&d, &lm), 4 * lm.m.n_layer);
    fsdp_peft_close(&d);
    hdir_free(&h);
    lora_model_free(&lm);
}
END_TEST

/* Opening (and binding to m) the directory h makes fails with `want`,
 * naming every fragment. */
static void expect_hostile(const hdir *h, const char *dir, const char *name, const lora_model *lm,
                           fsdp_status want, const char *f1, const char *f2, const char *f3)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    hdir_write(h, p);
    fsdp_peft_dir d;
    fsdp_status st = fsdp_peft_open(p, &d);
    if (st == FSDP_STATUS_OK) {
        st = fsdp_peft_bind(&d, &lm->m);
        fsdp_peft_close(&d);
    }
    expect_error(st, want, name, f1, f2, f3, NULL);
}

START_TEST(test_hostile)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "hostile");
    lora_model lm;
    lora_model_init(&lm, "q_proj,v_proj", -1, false);
    const char *QA = "model.layers.1.self_attn.q_proj.lora_A.weight";
    const char *VB = "model.layers.0.self_attn.v_proj.lora_B.weight";
    hdir h;
    const fsdp_status F = FSDP_STATUS_FORMAT, U = FSDP_STATUS_UNSUPPORTED;
#define CASE(name, mutate, want, f1, f2, f3)                  \
    do {                                                      \
        hdir_from(&h, &lm);                                   \
        mutate;                                               \
        expect_hostile(&h, dir, name, &lm, want, f1, f2, f3); \
        hdir_free(&h);                                        \
    } while (0)
#define CFG(from, to) replace(h.config, sizeof h.config, from, to)
    /* the directory and its config */
    CASE("no_config", h.config[0] = '\0', FSDP_STATUS_IO, "not a PEFT adapter directory",
         "no_config/adapter_config.json", NULL);
    CASE("not_json", CFG("\"r\": 4,", "\"r\": 4"), F, "adapter_config.json", "not valid JSON",
         NULL);
    CASE("array", snprintf(h.config, sizeof h.config, "[]"), F, "adapter_config.json",
         "not an object", NULL);
    CASE("prefix_tuning", CFG("\"LORA\"", "\"PREFIX_TUNING\""), U, "adapter_config.json",
         "\"peft_type\" is \"PREFIX_TUNING\"", "LoRA adapters only");
    CASE("dropout", CFG("\"lora_dropout\": 0.0", "\"lora_dropout\": 0.05"), U,
         "dropout/adapter_config.json", "\"lora_dropout\" is 0.05", "without dropout");
    CASE("dora", CFG("\"use_dora\": false", "\"use_dora\": true"), U, "dora/adapter_config.json",
         "\"use_dora\" is set", "DoRA");
    CASE("bias", CFG("\"bias\": \"none\"", "\"bias\": \"lora_only\""), U,
         "bias/adapter_config.json", "\"bias\" is \"lora_only\"", "\"bias\": \"none\"");
    CASE("regex", CFG("[\"q_proj\", \"v_proj\"]", "\".*\\\\.(q|v)_proj\""), U,
         "regex/adapter_config.json", "\"target_modules\" is the string \".*\\.(q|v)_proj\"",
         "regular expression");
    CASE("no_targets", CFG("[\"q_proj\", \"v_proj\"]", "null"), U, "adapter_config.json",
         "\"target_modules\" is missing or null", NULL);
    CASE("fan_in_fan_out", CFG("\"fan_in_fan_out\": false", "\"fan_in_fan_out\": true"), U,
         "adapter_config.json", "\"fan_in_fan_out\" is set", NULL);
    CASE("modules_to_save", CFG("\"modules_to_save\": null", "\"modules_to_save\": [\"lm_head\"]"),
         U, "adapter_config.json", "\"modules_to_save\" is set", NULL);
    CASE("rank_pattern", CFG("\"rank_pattern\": {}", "\"rank_pattern\": {\"q_proj\": 8}"), U,
         "adapter_config.json", "\"rank_pattern\" is set", NULL);
    CASE("layers", CFG("\"layers_to_transform\": null", "\"layers_to_transform\": [0]"), U,
         "adapter_config.json", "\"layers_to_transform\" is set", NULL);
    CASE("r_fraction", CFG("\"r\": 4", "\"r\": 4.5"), F, "adapter_config.json", "\"r\" must be",
         NULL);
    CASE("alpha", CFG("\"lora_alpha\": 8", "\"lora_alpha\": -1"), F, "adapter_config.json",
         "\"lora_alpha\" must be a positive number", NULL);
    CASE("long_paths", {
        char list[1024] = "[";
        for (int k = 0; k < 5; k++) /* only layer 0's, too long to keep: kept as names */
            strcat(list, k ? ", \"model.layers.0.self_attn.q_proj\", "
                           "\"model.layers.0.self_attn.v_proj\""
                           : "\"model.layers.0.self_attn.q_proj\", "
                             "\"model.layers.0.self_attn.v_proj\"");
        strcat(list, "]");
        CFG("[\"q_proj\", \"v_proj\"]", list);
        hfind(&h, QA)->name[0] = 'x';
    }, F, "long_paths/adapter_model.safetensors", "q_proj.lora_A.weight' is missing",
         "target_modules q_proj,v_proj, from a list of paths too long to keep");
    /* the weights against the model */
    CASE("wrong_r", {
        for (int i = 0; i < h.n; i++)
            h.t[i].shape[strstr(h.t[i].name, "lora_A") ? 0 : 1] = 2;
    }, F, "wrong_r/adapter_model.safetensors", "lora_A.weight' has shape [2, 32]",
         "adapter_config.json says r = 4");
    CASE("missing", hfind(&h, QA)->name[0] = 'x', F, "missing/adapter_model.safetensors",
         "tensor 'base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight' is missing",
         "target_modules q_proj,v_proj");
    CASE("extra", {
        htensor *t = &h.t[h.n++];
        *t = *hfind(&h, QA);
        t->x = malloc(t->shape[0] * t->shape[1] * sizeof *t->x);
        memset(t->x, 0, t->shape[0] * t->shape[1] * sizeof *t->x);
        replace(t->name, sizeof t->name, "q_proj", "k_proj");
    }, F, "extra/adapter_model.safetensors",
         "tensor 'base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight' is not one of "
         "the model's adapters", "target_modules q_proj,v_proj");
    CASE("shape", hresize(hfind(&h, VB), 48), F, "shape/adapter_model.safetensors",
         "tensor 'base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight' has shape "
         "[48, 4]", "the model's adapter is [32, 4]");
    CASE("dtype", snprintf(hfind(&h, VB)->dtype, 8, "I16"), F, "dtype/adapter_model.safetensors",
         "v_proj.lora_B.weight' has dtype I16", "F32, BF16 or F16");
    hdir_from(&h, &lm);
    char cut[256], w[300];
    pathf(cut, sizeof cut, "%s/cut", dir);
    hdir_write(&h, cut);
    pathf(w, sizeof w, "%s/" FSDP_PEFT_WEIGHTS, cut);
    struct stat sb;
    ck_assert_int_eq(stat(w, &sb), 0);
    ck_assert_int_eq(truncate(w, sb.st_size - 200), 0); /* the last tensor: 32 x 4 F32 */
    fsdp_peft_dir d;
    expect_error(fsdp_peft_open(cut, &d), F, "truncated", "cut/adapter_model",
                 "tensor 'base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight' is cut "
                 "off", "truncated", NULL);
    hdir_free(&h);
    /* a model without adapters, or built with another r */
    hdir_from(&h, &lm);
    char other[256];
    pathf(other, sizeof other, "%s/other_r", dir);
    hdir_write(&h, other);
    lm.m.lora.r = 8;
    ck_assert_int_eq(fsdp_peft_open(other, &d), FSDP_STATUS_OK);
    expect_error(fsdp_peft_bind(&d, &lm.m), FSDP_STATUS_INVALID_ARG, "model r", "has r 4",
                 "r 8", NULL);
    lm.m.lora.r = 0;
    expect_error(fsdp_peft_bind(&d, &lm.m), FSDP_STATUS_INVALID_ARG, "no adapters",
                 "the model has no LoRA adapters", "target_modules q_proj,v_proj", NULL);
    fsdp_peft_close(&d);
    lm.m.lora.r = R;
    hdir_free(&h);
#undef CFG
#undef CASE
    lora_model_free(&lm);
}
END_TEST

/* ---- the PEFT-written fixtures (tools/gen_lora_golden.py) --------------------------- */

static const char *const lora_fixtures[][2] = {{"lora_gqa", "llama_gqa"},
                                               {"lora_qwen2", "llama_qwen2"}};

/* adapter_init as PEFT 0.21 saved it (its many keys, all-linear as 14 module
 * paths) opens, binds to its base model given those adapters, and reads
 * the stored F32 values bit for bit. */
START_TEST(test_peft_fixtures)
{
    char adir[128], base[128];
    snprintf(adir, sizeof adir, "tests/fixtures/%s/adapter_init", lora_fixtures[_i][0]);
    snprintf(base, sizeof base, "tests/fixtures/%s", lora_fixtures[_i][1]);
    fsdp_peft_dir d;
    fsdp_status st = fsdp_peft_open(adir, &d);
    REQUIRE(st == FSDP_STATUS_OK, "opening %s: %s", adir, fsdp_error_msg());
    ck_assert_int_eq(d.lora.r, 4);
    ck_assert(d.lora.alpha == 8.0 && d.lora.rslora == (_i == 1));
    ck_assert_str_eq(d.base, base);
    ck_assert_str_eq(d.lora.targets, _i == 0 ? "down_proj,q_proj,v_proj"
                                             : "down_proj,gate_proj,k_proj,o_proj,q_proj,"
                                               "up_proj,v_proj");
    ck_assert(d.targets_by_last == (_i == 1));
    lora_model lm = {0};
    fsdp_modelfile *mf = NULL;
    ck_assert_int_eq(fsdp_modelfile_resolve(base, &lm.m, &mf), FSDP_STATUS_OK);
    fsdp_modelfile_close(mf);
    give_adapters(&lm.m, d.lora.targets, 4, -1);
    lm.m.lora.rslora = d.lora.rslora;
    st = fsdp_peft_bind(&d, &lm.m);
    REQUIRE(st == FSDP_STATUS_OK, "binding %s: %s", adir, fsdp_error_msg());
    size_t n;
    unsigned char *file = read_file(path_in(adir, FSDP_PEFT_WEIGHTS), &n);
    int seen = 0;
    for (int u = 0; u < lm.m.n_units; u++)
        for (int i = 0; i < lm.m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &lm.m.units[u].params[i];
            if (p->frozen)
                continue;
            const fsdp_st_tensor *t = &d.st.tensors[d.tensor_of[d.unit_base[u] + i]];
            ck_assert_str_eq(t->dtype_name, "F32");
            float *got = malloc(p->numel * sizeof *got);
            ck_assert_int_eq(fsdp_peft_read(&d, u, i, 0, p->numel, got), FSDP_STATUS_OK);
            ck_assert(!memcmp(got, file + d.st.data_offset + t->begin, p->numel * 4));
            free(got);
            seen++;
        }
    ck_assert_int_eq(seen, _i == 0 ? 12 : 28);
    free(file);
    fsdp_peft_close(&d);
    fsdp_model_free(&lm.m);
}
END_TEST

/* ---- the writer's output in PEFT ---------------------------------------------------- */

/* Tensor `name` (F32) of the open safetensors file f into dst[0..n). */
static void st_read_f32(const fsdp_st_file *f, const char *name, float *dst, size_t n)
{
    for (int i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name)) {
            ck_assert(f->tensors[i].dtype == FSDP_FILE_F32 && f->tensors[i].numel == n);
            FILE *fp = fopen(f->path, "rb");
            ck_assert(fp && fseek(fp, (long)(f->data_offset + f->tensors[i].begin), 0) == 0);
            ck_assert_uint_eq(fread(dst, 4, n, fp), n);
            fclose(fp);
            return;
        }
    ck_abort_msg("%s lacks %s", f->path, name);
}

/* The final adapters of tests/fixtures/lora_gqa, written by fsdp_peft_write
 * on llama_gqa with those adapters, load in PEFT (PeftModel.from_pretrained
 * on the base fixture) with the same values and scale. Needs python3 with
 * torch, transformers and peft; without them the PEFT half is skipped
 * (said on stdout) and the directory is only read back by fsdp. */
START_TEST(test_export_loads_in_peft)
{
    char dir[128], out[256], msg[8192];
    fsdp_test_mkdir(dir, sizeof dir, "export");
    pathf(out, sizeof out, "%s/adapter", dir);
    lora_model lm = {0};
    fsdp_modelfile *mf = NULL;
    ck_assert_int_eq(fsdp_modelfile_resolve("tests/fixtures/llama_gqa", &lm.m, &mf),
                     FSDP_STATUS_OK);
    fsdp_modelfile_close(mf);
    give_adapters(&lm.m, "q_proj,v_proj,down_proj", 4, -1);
    fsdp_st_file g;
    ck_assert_int_eq(fsdp_st_open("tests/fixtures/lora_gqa/golden.safetensors", &g),
                     FSDP_STATUS_OK);
    lm.units = calloc((size_t)lm.m.n_units, sizeof *lm.units);
    for (int u = 0; u < lm.m.n_units; u++) {
        lm.units[u] = calloc(lm.m.units[u].train_numel + 1, sizeof(float));
        for (int i = 0; i < lm.m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &lm.m.units[u].params[i];
            char name[160];
            snprintf(name, sizeof name, "final/" FSDP_PEFT_PREFIX "%s", p->name);
            if (!p->frozen)
                st_read_f32(&g, name, lm.units[u] + p->offset, p->numel);
        }
    }
    fsdp_st_free(&g);
    write_ok(out, &lm, "tests/fixtures/llama_gqa");
    fsdp_peft_dir d;
    open_bind_ok(out, &lm, &d);
    ck_assert_int_eq(expect_same_adapters(&d, &lm), 12);
    fsdp_peft_close(&d);
    static const char script[] =
        "import sys\n"
        "try:\n"
        "    import torch\n"
        "    from peft import PeftModel\n"
        "    from safetensors.torch import load_file\n"
        "    from transformers import AutoModelForCausalLM\n"
        "except ImportError as e:\n"
        "    print('no peft:', e)\n"
        "    sys.exit(0)\n"
        "base = AutoModelForCausalLM.from_pretrained('tests/fixtures/llama_gqa')\n"
        "m = PeftModel.from_pretrained(base, sys.argv[1])\n"
        "g = load_file('tests/fixtures/lora_gqa/golden.safetensors')\n"
        "n = 0\n"
        "for k, p in m.named_parameters():\n"
        "    if 'lora_' in k:\n"
        "        assert torch.equal(p.detach(), g['final/' + k.replace('.default', '')]), k\n"
        "        n += 1\n"
        "s = m.base_model.model.model.layers[1].mlp.down_proj.scaling['default']\n"
        "print('peft loaded', n, 'adapters, scale', s)\n";
    char py[300];
    pathf(py, sizeof py, "%s/load.py", dir);
    write_file(py, script, strlen(script));
    int rc = fsdp_test_sh(msg, sizeof msg, "python3 %s %s 2>&1", py, out);
    if (rc == 0 && strstr(msg, "no peft:"))
        printf("test_export_loads_in_peft: PEFT half skipped (%s)\n", msg);
    else
        ck_assert_msg(rc == 0 && strstr(msg, "peft loaded 12 adapters, scale 2.0"),
                      "PEFT could not load %s (rc %d):\n%s", out, rc, msg);
    lora_model_free(&lm);
}
END_TEST

/* ---- reads from several threads ----------------------------------------------------- */

struct reader {
    const fsdp_peft_dir *d;
    const lora_model *lm;
    int part, n_parts;
    int bad;
};

/* Each thread reads its share of every adapter, as a rank its shard. */
static void *read_part(void *arg)
{
    struct reader *r = arg;
    for (int u = 0; u < r->lm->m.n_units; u++)
        for (int i = 0; i < r->lm->m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &r->lm->m.units[u].params[i];
            if (p->frozen)
                continue;
            size_t per = (p->numel + (size_t)r->n_parts - 1) / (size_t)r->n_parts;
            size_t a = per * (size_t)r->part, b = a + per < p->numel ? a + per : p->numel;
            if (a >= b)
                continue;
            float *got = malloc((b - a) * sizeof *got);
            if (fsdp_peft_read(r->d, u, i, a, b - a, got) != FSDP_STATUS_OK ||
                memcmp(got, r->lm->units[u] + p->offset + a, (b - a) * sizeof *got))
                r->bad++;
            free(got);
        }
    return NULL;
}

START_TEST(test_threads)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "threads");
    lora_model lm;
    lora_model_init(&lm, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", -1, true);
    hdir h;
    hdir_from(&h, &lm);
    for (int i = 0; i < h.n; i++) /* conversions too */
        snprintf(h.t[i].dtype, sizeof h.t[i].dtype, "%s", i % 2 ? "BF16" : "F32");
    replace(h.config, sizeof h.config, "[\"q_proj\", \"v_proj\"]", "\"all-linear\"");
    char all[256];
    pathf(all, sizeof all, "%s/all", dir);
    hdir_write(&h, all);
    fsdp_peft_dir d;
    open_bind_ok(all, &lm, &d);
    ck_assert_str_eq(d.lora.targets, "all-linear");
    enum { N = 4 };
    pthread_t th[N];
    struct reader rd[N];
    for (int k = 0; k < N; k++) {
        rd[k] = (struct reader){.d = &d, .lm = &lm, .part = k, .n_parts = N};
        ck_assert_int_eq(pthread_create(&th[k], NULL, read_part, &rd[k]), 0);
    }
    for (int k = 0; k < N; k++) {
        pthread_join(th[k], NULL);
        ck_assert_msg(rd[k].bad == 0, "thread %d read %d slices wrong", k, rd[k].bad);
    }
    fsdp_peft_close(&d);
    hdir_free(&h);
    lora_model_free(&lm);
}
END_TEST

/* ---- the writer's refusals ------------------------------------------------------------ */

START_TEST(test_writer_refuses)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "writer");
    lora_model lm;
    lora_model_init(&lm, "q_proj", -1, false);
    const float *const *units = (const float *const *)lm.units;
    char file[256], full[256];
    pathf(file, sizeof file, "%s/file", dir);
    pathf(full, sizeof full, "%s/full", dir);
    write_file(file, "keep", 4);
    expect_error(fsdp_peft_write(file, &lm.m, units, NULL), FSDP_STATUS_IO, "file",
                 "not a directory", "never replaces", NULL);
    size_t n;
    unsigned char *b = read_file(file, &n);
    REQUIRE(n == 4 && !memcmp(b, "keep", 4), "the file at OUT was changed");
    free(b);
    mkdir(full, 0755);
    write_file(path_in(full, "x"), "x", 1);
    expect_error(fsdp_peft_write(full, &lm.m, units, NULL), FSDP_STATUS_INVALID_ARG, "non-empty",
                 "not empty", "adapter directory", NULL);
    /* a model without adapters */
    fsdp_model plain;
    ck_assert_int_eq(fsdp_model_from_spec("llama-tiny", &plain), FSDP_STATUS_OK);
    expect_error(fsdp_peft_write(path_in(dir, "none"), &plain, units, NULL),
                 FSDP_STATUS_INVALID_ARG, "no adapters", "has no LoRA adapters", NULL);
    ck_assert(!exists(path_in(dir, "none")));
    fsdp_model_free(&plain);
    /* nothing left behind by a write that fails half-way (its parent is read-only) */
    char ro[160];
    snprintf(ro, sizeof ro, "%s/ro", dir);
    mkdir(ro, 0555);
    if (access(ro, W_OK) != 0) { /* root writes anywhere: nothing to check then */
        expect_error(fsdp_peft_write(path_in(ro, "a"), &lm.m, units, NULL), FSDP_STATUS_IO,
                     "read-only", "cannot create", NULL);
        ck_assert(!exists(path_in(ro, "a")));
    }
    lora_model_free(&lm);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"peft", 60, .tmpdir = true,
         FSDP_TESTS(test_roundtrip, test_partial_targets, test_mixed_dtypes, test_hostile,
                    FSDP_TEST_LOOP(test_peft_fixtures, 2), test_threads, test_writer_refuses)},
        {"python", 120, .tmpdir = true, FSDP_TESTS(test_export_loads_in_peft)},
    };
    return fsdp_test_main("peft", tcases, FSDP_TEST_LEN(tcases));
}
