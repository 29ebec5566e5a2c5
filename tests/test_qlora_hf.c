/*
 * test_qlora_hf.c - Hugging Face bnb-4bit directories in fsdp (ckpt/bnb4.c,
 * ckpt/modelfile_nf4.c), on tools/gen_bnb4_fixture.py's tiny Llama: bf16/
 * and nf4/, the directory transformers + bitsandbytes save_pretrained wrote
 * of it.
 *
 * - reading: nf4/ opens (dtype "nf4+bf16"), its layer-0 weights read back
 *   as bitsandbytes' flat dequantize_4bit in fp32 (golden.safetensors), bit
 *   for bit, the rest as bf16/ holds them;
 * - read_nf4: every unit's NF4 group, read from nf4/ (the stored codes and
 *   absmax) and from bf16/ (quantized on the fly, its double quantization
 *   cached per tensor), is the same bytes, in whole and in odd ranges;
 * - end to end: `--model nf4/ --lora 4 --lora-targets all-linear` trains
 *   bit for bit as `--model bf16/ ... --quantize nf4`, on 1 and 2 devices
 *   (step losses and gradient norms); `fsdp eval --model nf4/`
 *   gives the loss of an fp32 directory of the weights dequantized by
 *   ops/nf4.c's reference (which test_bnb4 holds against bitsandbytes);
 * - writing (`fsdp convert bf16/ OUT --to hf --quantize nf4`, ckpt/bnb4_write.c):
 *   OUT's model.safetensors is nf4/'s byte for byte and its config.json holds
 *   transformers' quantization_config text for text; OUT reads back as nf4/
 *   (bf16 and fp32 storage); written in files of 30 KB it is nf4_sharded/
 *   (transformers' save_pretrained(max_shard_size="30KB"), a weight's six
 *   tensors split over two files) byte for byte, files and index, and
 *   nf4_sharded/ reads, evaluates and trains as nf4/; a QLoRA checkpoint is
 *   merged, then quantized;
 *   the quant_state's offset is printed as Python's repr; --quantize with
 *   another OUT format, or another value, is refused (exit 2);
 * - hostile copies of nf4/ (fp4, 8-bit, no double quantization, gptq; a
 *   quant_state that lies about shape, blocksize or quant_type; wrong block
 *   counts; codes too short; a missing nested_absmax or nested_quant_map)
 *   are FORMAT errors naming the tensor (or config.json's key).
 *
 * Runs from the repository root.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/bnb4.h"
#include "ckpt/modelfile.h"
#include "ckpt/safetensors.h"
#include "models/weights.h"
#include "models/lora.h"
#include "ops/nf4.h"
#include "testutil.h"
#include "train/adapt.h"
#include "train/plan.h"
#include "train_util.h"

#define BF16_DIR "tests/fixtures/bnb4/bf16"
#define NF4_DIR "tests/fixtures/bnb4/nf4"
#define NF4_SHARDED_DIR "tests/fixtures/bnb4/nf4_sharded"
#define GOLDEN "tests/fixtures/bnb4/golden.safetensors"

/* Every unit of the model at `dir`, read whole (fp32). */
static float **read_units(const char *dir, fsdp_model *m, const char *want_dtype)
{
    fsdp_modelfile *mf = NULL;
    ck_assert_msg(fsdp_modelfile_resolve(dir, m, &mf) == FSDP_STATUS_OK, "%s: %s", dir,
                  fsdp_error_msg());
    if (want_dtype)
        ck_assert_str_eq(fsdp_modelfile_dtype_name(mf), want_dtype);
    float **u = calloc((size_t)m->n_units, sizeof *u);
    for (int i = 0; i < m->n_units; i++) {
        u[i] = malloc(m->units[i].numel * sizeof **u);
        ck_assert_int_eq(fsdp_modelfile_read_range(mf, i, 0, m->units[i].numel, u[i]),
                         FSDP_STATUS_OK);
    }
    fsdp_modelfile_close(mf);
    return u;
}

static void free_units(float **u, fsdp_model *m)
{
    for (int i = 0; i < m->n_units; i++)
        free(u[i]);
    free(u);
    fsdp_model_free(m);
}

START_TEST(test_read_dequantized)
{
    fsdp_model m, b;
    float **q = read_units(NF4_DIR, &m, "nf4+bf16"), **f = read_units(BF16_DIR, &b, "bf16");
    size_t len = 0;
    char *buf = fsdp_test_read_file(GOLDEN, &len);
    fsdp_st_file g;
    ck_assert_int_eq(fsdp_st_parse_buffer(GOLDEN, buf, len, &g), FSDP_STATUS_OK);
    int n_golden = 0, n_same = 0;
    for (int u = 0; u < m.n_units; u++)
        for (int i = 0; i < m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &m.units[u].params[i];
            fsdp_weight_tensor wt;
            m.family->safetensors->tensor(&m, u, i, &wt);
            const char *name = wt.name;
            bool linear = strstr(p->name, "_proj") != NULL;
            const float *want = f[u] + p->offset;
            for (int k = 0; k < g.n_tensors; k++)
                if (!strcmp(g.tensors[k].name, name)) {
                    ck_assert_uint_eq(g.tensors[k].numel, p->numel);
                    want = (const float *)(buf + g.data_offset + g.tensors[k].begin);
                    n_golden++;
                }
            if (want == f[u] + p->offset && linear)
                continue; /* a layer-1 weight: not in the golden file */
            ck_assert_msg(!memcmp(q[u] + p->offset, want, p->numel * sizeof *want),
                          "%s read from %s differs from %s", p->name, NF4_DIR,
                          linear ? "dequantize_4bit's fp32" : "the bf16 directory");
            n_same++;
        }
    ck_assert_int_eq(n_golden, 7);
    ck_assert_int_gt(n_same, 7);
    fsdp_st_free(&g);
    free(buf);
    free_units(q, &m);
    free_units(f, &b);
}
END_TEST

/* `dir`'s model with LoRA on all linear layers and their weights in NF4 (a
 * float dir: --quantize nf4; a bnb-4bit dir: as stored). */
static void open_qlora(const char *dir, fsdp_model *m, fsdp_modelfile **mf, fsdp_adapt *ad)
{
    fsdp_lora_config lc = {.r = 4, .alpha = 8, .targets = "all-linear"};
    ck_assert_int_eq(fsdp_modelfile_resolve(dir, m, mf), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_modelfile_is_nf4(*mf), !strcmp(dir, NF4_DIR));
    ck_assert_msg(fsdp_adapt_apply(ad, m, *mf, &lc, NULL, NULL, 1) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
    ck_assert_msg(fsdp_adapt_quantize(ad, m, *mf == NULL || fsdp_modelfile_is_nf4(*mf)
                                                 ? FSDP_QUANT_NONE : FSDP_QUANT_NF4) ==
                      FSDP_STATUS_OK, "%s", fsdp_error_msg());
}

START_TEST(test_read_nf4_same_bytes)
{
    fsdp_model mq, mf;
    fsdp_modelfile *fq, *ff;
    fsdp_adapt aq, af;
    open_qlora(NF4_DIR, &mq, &fq, &aq);
    open_qlora(BF16_DIR, &mf, &ff, &af);
    int n_units = 0;
    for (int u = 0; u < mq.n_units; u++) {
        const fsdp_unit_spec *us = &mq.units[u];
        ck_assert_uint_eq(us->nf4_begin, mf.units[u].nf4_begin);
        size_t n = us->numel - us->nf4_begin;
        if (!n)
            continue;
        n_units++;
        /* whole, then ranges that cut tensors and nested blocks: 3 blocks, 517, the rest */
        size_t cuts[] = {0, 3 * 64, 520 * 64, n};
        for (int whole = 1; whole >= 0; whole--)
            for (int c = 0; c < (whole ? 1 : 3); c++) {
                size_t a = us->nf4_begin + (whole ? 0 : cuts[c]);
                size_t b = us->nf4_begin + (whole ? n : cuts[c + 1] < n ? cuts[c + 1] : n);
                if (a >= b)
                    continue;
                uint8_t *c1 = malloc((b - a) / 2), *c2 = malloc((b - a) / 2);
                float *a1 = malloc((b - a) / 16), *a2 = malloc((b - a) / 16);
                ck_assert_int_eq(fsdp_modelfile_read_nf4(fq, &mq, u, a, b, c1, a1),
                                 FSDP_STATUS_OK);
                ck_assert_int_eq(fsdp_modelfile_read_nf4(ff, &mf, u, a, b, c2, a2),
                                 FSDP_STATUS_OK);
                ck_assert_msg(!memcmp(c1, c2, (b - a) / 2), "unit %d [%zu, %zu): codes", u, a,
                              b);
                ck_assert_msg(!memcmp(a1, a2, (b - a) / 16), "unit %d [%zu, %zu): absmax", u,
                              a, b);
                free(c1), free(c2), free(a1), free(a2);
            }
    }
    ck_assert_int_eq(n_units, 2);
    for (int k = 0; k < 2; k++) {
        fsdp_modelfile_close(k ? ff : fq);
        fsdp_adapt_free(k ? &af : &aq);
        fsdp_model_free(k ? &mf : &mq);
    }
}
END_TEST

/* A token shard (llm.c's uint16 format) of 512 ids below the fixture's vocabulary of 96. */
static const char *tokens(void)
{
    static char path[512];
    if (path[0])
        return path;
    fsdp_test_path(path, sizeof path, "tokens.bin");
    int32_t h[256] = {20240520, 1, 512};
    uint16_t t[512];
    for (int i = 0; i < 512; i++)
        t[i] = (uint16_t)((i * 37 + i / 7 + 5) % 96);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert(fwrite(h, sizeof h, 1, f) == 1 && fwrite(t, sizeof t, 1, f) == 1);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

static void qlora_config(fsdp_train_config *c, const char *dir, int devices)
{
    train_config_cpu(c, dir, devices);
    c->data = tokens();
    c->lora = (fsdp_lora_config){.r = 4, .alpha = 8, .targets = "all-linear"};
    c->steps = 3;
    c->eng.batch = 2 / devices;
    c->eng.grad_accum = 1;
    c->eng.deterministic = true;
    c->n_samples = 0;
    c->keep_params = true;
}

START_TEST(test_train_as_quantize)
{
    int devices = 1 + _i;
    fsdp_train_config c;
    fsdp_train_result q, f;
    qlora_config(&c, NF4_DIR, devices);
    run_ok_as(&c, &q, "the bnb-4bit directory");
    qlora_config(&c, BF16_DIR, devices);
    c.quantize = FSDP_QUANT_NF4;
    run_ok_as(&c, &f, "the bf16 directory with --quantize nf4");
    for (int s = 0; s < 3; s++)
        ck_assert_msg(q.losses[s] == f.losses[s] && q.grad_norms[s] == f.grad_norms[s] &&
                          isfinite(q.losses[s]) && q.grad_norms[s] > 0,
                      "%d device(s), step %d: loss %.9g, gradient norm %.9g from nf4/; %.9g, "
                      "%.9g from bf16/ --quantize nf4", devices, s + 1, q.losses[s],
                      q.grad_norms[s], f.losses[s], f.grad_norms[s]);
    ck_assert_int_eq(q.n_units, f.n_units);
    fsdp_train_result_free(&q);
    fsdp_train_result_free(&f);
    /* without adapters or frozen weights the NF4 base would train: refused */
    qlora_config(&c, NF4_DIR, devices);
    c.lora.r = 0;
    fsdp_status st = fsdp_train_run(&c, &q);
    ck_assert_int_eq(st, FSDP_STATUS_INVALID_ARG);
    ck_assert_msg(strstr(fsdp_error_msg(), "stored in 4 bits") &&
                      strstr(fsdp_error_msg(), "--lora"), "%s", fsdp_error_msg());
    fsdp_error_clear();
}
END_TEST

/* `fsdp plan` of the bnb-4bit directory plans the run train makes of it: its linear weights
 * NF4 without --quantize (the plan had counted them dense, in the compute dtype: 44% more
 * parameter bytes on a Qwen2 walk-through), to the byte on each device; and a plan without
 * adapters is refused, as the run is. */
START_TEST(test_plan_as_train)
{
    fsdp_train_config c;
    fsdp_train_result r;
    qlora_config(&c, NF4_DIR, 2);
    c.keep_params = false;
    run_ok_as(&c, &r, "the bnb-4bit directory");
    fsdp_plan p;
    ck_assert_msg(fsdp_plan_run(&c, c.steps, &p) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_int_eq(p.n_ranks, r.n_ranks);
    ck_assert_msg(p.nf4_numel > 0, "the plan stores no weight in NF4");
    for (int k = 0; k < p.n_ranks; k++)
        for (int m = 0; m < FSDP_MEM_KIND_COUNT; m++)
            ck_assert_msg(p.ranks[k].mem.peak_kind_bytes[m] == r.stats[k].mem.peak_kind_bytes[m],
                          "device %d, %s at the peak: plan %zu, run %zu", k,
                          fsdp_mem_kind_name((fsdp_mem_kind)m), p.ranks[k].mem.peak_kind_bytes[m],
                          r.stats[k].mem.peak_kind_bytes[m]);
    fsdp_plan_free(&p);
    fsdp_train_result_free(&r);
    c.lora.r = 0;
    ck_assert_int_eq(fsdp_plan_run(&c, c.steps, &p), FSDP_STATUS_INVALID_ARG);
    ck_assert_msg(strstr(fsdp_error_msg(), "stored in 4 bits"), "%s", fsdp_error_msg());
    fsdp_error_clear();
}
END_TEST

/* `fsdp eval`'s mean loss of `model`. */
static double eval_loss(const char *model)
{
    char out[4096];
    int rc = fsdp_test_cli(out, sizeof out, "eval --model %s --data %s --seq 16 "
                           "--batch 1 --devices 2 --backend cpu", model, tokens());
    const char *at = strstr(out, "mean loss ");
    ck_assert_msg(rc == 0 && at, "eval of %s failed:\n%s", model, out);
    return strtod(at + 10, NULL);
}

START_TEST(test_eval_dequantized)
{
    /* bf16/'s weights, every linear one quantized and dequantized by ops/nf4.c, as fp32 */
    fsdp_model m;
    float **u = read_units(BF16_DIR, &m, NULL);
    for (int k = 1; k < m.n_units; k++)
        for (int i = 0; i < m.units[k].n_params; i++) {
            const fsdp_param_spec *p = &m.units[k].params[i];
            if (!strstr(p->name, "_proj"))
                continue;
            size_t n = p->numel, nb = fsdp_nf4_blocks(n);
            uint8_t *codes = malloc(n / 2), *qa = malloc(nb);
            float *am = malloc(nb * sizeof *am), *nested = malloc(nb * sizeof *nested), off;
            fsdp_nf4_quantize(u[k] + p->offset, n, codes, am);
            fsdp_nf4_double_quant(am, nb, qa, nested, &off);
            fsdp_nf4_absmax(qa, nested, off, 0, nb, am);
            fsdp_nf4_dequant_ref(codes, am, n, u[k] + p->offset);
            free(codes), free(qa), free(am), free(nested);
        }
    char dir[512];
    fsdp_test_path(dir, sizeof dir, "deq");
    ck_assert_int_eq(fsdp_modelfile_write(dir, fsdp_modelfile_format_find("hf"), &m,
                                          (const float *const *)u, FSDP_DTYPE_F32),
                     FSDP_STATUS_OK);
    free_units(u, &m);
    double want = eval_loss(dir), got = eval_loss(NF4_DIR);
    ck_assert_msg(got == want && isfinite(got), "eval of %s: loss %.9g; of its dequantized fp32 "
                  "weights %.9g", NF4_DIR, got, want);
}
END_TEST

/* ---- hostile directories ------------------------------------------------------------ */

/* Every occurrence of a in buf[0..n) replaced by b (same length). */
static int replace_all(char *buf, size_t n, const char *a, const char *b)
{
    size_t k = strlen(a);
    int count = 0;
    ck_assert_uint_eq(k, strlen(b));
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(buf + i, a, k)) {
            memcpy(buf + i, b, k);
            count++;
        }
    return count;
}

typedef struct hostile {
    const char *file;          /* "config.json" or "model.safetensors" */
    const char *a, *b, *c;     /* a -> b (and b -> a when swap: through c) */
    const char *want1, *want2; /* in the message */
} hostile;

static const hostile hostiles[] = {
    {"config.json", "\"bnb_4bit_quant_type\": \"nf4\"", "\"bnb_4bit_quant_type\": \"fp4\"",
     NULL, "bnb_4bit_quant_type is \"fp4\"", "nf4"},
    {"config.json", "\"load_in_8bit\": false", "\"load_in_8bit\": true ", NULL, "8-bit",
     "load_in_8bit"},
    {"config.json", "\"bnb_4bit_use_double_quant\": true", "\"bnb_4bit_use_double_quant\": 0   ",
     NULL, "bnb_4bit_use_double_quant is not true", "double quantization"},
    {"config.json", "\"quant_method\": \"bitsandbytes\"", "\"quant_method\": \"gptq\"        ",
     NULL, "quant_method \"gptq\"", "config.json"},
    /* the quant_state JSON lies: o_proj's and q_proj's shape, the blocksize, fp4 */
    {"model.safetensors", "\"shape\": [64, 64]", "\"shape\": [64, 32]", NULL,
     "layers.0.self_attn.o_proj.weight' holds 2048 code bytes", "needs 1024"},
    {"model.safetensors", "\"blocksize\": 64", "\"blocksize\": 32", NULL,
     "quant_state.bitsandbytes__nf4': blocksize is not 64", "down_proj"},
    {"model.safetensors", "{\"quant_type\": \"nf4\"", "{\"quant_type\": \"fp4\"", NULL,
     "quant_type is \"fp4\"", "quant_state.bitsandbytes__nf4"},
    /* k_proj's absmax codes (32) and o_proj's (64) swapped: wrong block counts */
    {"model.safetensors", "k_proj.weight.absmax", "o_proj.weight.absmax", "x_proj.weight.absmax",
     "k_proj.weight.absmax' holds 64 absmax codes", "needs 32"},
    /* k_proj's codes (1024 bytes) and o_proj's (2048) swapped: o_proj's truncated */
    {"model.safetensors", "k_proj.weight\"", "o_proj.weight\"", "x_proj.weight\"",
     "k_proj.weight' holds 2048 code bytes", "needs 1024"},
    {"model.safetensors", "q_proj.weight.nested_absmax", "q_proj.weight.nested_absmaX", NULL,
     "layers.0.self_attn.q_proj.weight.nested_absmax' is missing", "quant_state"},
    {"model.safetensors", "v_proj.weight.nested_quant_map", "v_proj.weight.quant_map_nested",
     NULL, "v_proj.weight.nested_quant_map' is missing", "safetensors file"},
};

START_TEST(test_hostile)
{
    const hostile *h = &hostiles[_i];
    char dir[512], path[600];
    fsdp_test_mkdir(dir, sizeof dir, "bad");
    static const char *const files[] = {"config.json", "model.safetensors"};
    for (int f = 0; f < 2; f++) {
        size_t n = 0;
        char src[256];
        pathf(src, sizeof src, "%s/%s", NF4_DIR, files[f]);
        char *buf = fsdp_test_read_file(src, &n);
        if (!strcmp(files[f], h->file)) {
            if (h->c) { /* swap a and b */
                ck_assert_int_gt(replace_all(buf, n, h->a, h->c), 0);
                ck_assert_int_gt(replace_all(buf, n, h->b, h->a), 0);
                replace_all(buf, n, h->c, h->b);
            } else {
                ck_assert_int_gt(replace_all(buf, n, h->a, h->b), 0);
            }
        }
        pathf(path, sizeof path, "%s/%s", dir, files[f]);
        FILE *fp = fopen(path, "wb");
        ck_assert(fp && fwrite(buf, 1, n, fp) == n && fclose(fp) == 0);
        free(buf);
    }
    fsdp_model m;
    fsdp_modelfile *mf = NULL;
    fsdp_error_clear();
    fsdp_status st = fsdp_modelfile_resolve(dir, &m, &mf);
    ck_assert_msg(st == FSDP_STATUS_FORMAT, "case %d: %s (%s)", _i, fsdp_status_name(st),
                  fsdp_error_msg());
    ck_assert_msg(strstr(fsdp_error_msg(), h->want1) && strstr(fsdp_error_msg(), h->want2),
                  "case %d: message '%s' lacks '%s' or '%s'", _i, fsdp_error_msg(), h->want1,
                  h->want2);
}
END_TEST

/* ---- writing: fsdp convert --to hf --quantize nf4 (ckpt/bnb4_write.c) ------------------ */

/* `fsdp convert BF16_DIR <out> --to hf --quantize nf4 <extra>` into a fresh path. */
static void convert_nf4(char *out, size_t n, const char *name, const char *extra)
{
    char msg[4096];
    fsdp_test_path(out, n, name);
    int rc = fsdp_test_cli(msg, sizeof msg, "convert %s %s --to hf --quantize nf4 %s", BF16_DIR,
                           out, extra);
    bool quiet = strstr(extra, "--quiet") != NULL;
    ck_assert_msg(rc == 0 && (quiet ? !msg[0] : strstr(msg, "NF4 (bnb-4bit)") != NULL),
                  "convert to %s: rc %d\n%s", out, rc, msg);
}

/* Files a and b hold the same bytes; the message names the first that differs. */
static void same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *x = fsdp_test_read_file(a, &na), *y = fsdp_test_read_file(b, &nb);
    size_t k = 0;
    while (k < na && k < nb && x[k] == y[k])
        k++;
    ck_assert_msg(na == nb && k == na, "%s (%zu bytes) and %s (%zu bytes) differ from byte %zu",
                  a, na, b, nb, k);
    free(x);
    free(y);
}

/* The quantization_config object of config.json `path` (a malloc'd copy). */
static char *quantization_config(const char *path)
{
    char *text = fsdp_test_read_file(path, NULL);
    char *at = strstr(text, "\"quantization_config\": {"), *end = at ? strchr(at, '}') : NULL;
    ck_assert_msg(end, "%s has no quantization_config", path);
    char *qc = strndup(at, (size_t)(end - at + 1));
    free(text);
    return qc;
}

/* The model at dir (stored as want_dtype) reads back as nf4/, every unit bit for bit. */
static void reads_as_nf4(const char *dir, const char *want_dtype)
{
    fsdp_model m, n;
    float **x = read_units(dir, &m, want_dtype), **y = read_units(NF4_DIR, &n, "nf4+bf16");
    ck_assert_int_eq(m.n_units, n.n_units);
    for (int u = 0; u < m.n_units; u++)
        ck_assert_msg(!memcmp(x[u], y[u], m.units[u].numel * sizeof **x), "%s: unit %d", dir,
                      u);
    free_units(x, &m);
    free_units(y, &n);
}

START_TEST(test_write_as_transformers)
{
    char out[512], a[640], b[640];
    convert_nf4(out, sizeof out, "nf4", "--quiet");
    /* model.safetensors as transformers + bitsandbytes wrote it: header order, every
     * tensor's bytes (codes, absmax codes, maps, nested absmax, quant_state JSON); the
     * generation config copied along */
    static const char *const files[] = {"model.safetensors", "generation_config.json"};
    for (int f = 0; f < 2; f++) {
        pathf(a, sizeof a, "%s/%s", out, files[f]);
        pathf(b, sizeof b, "%s/%s", NF4_DIR, files[f]);
        same_file(a, b);
    }
    /* config.json: transformers' quantization_config, text for text (the rest is the
     * family's config writer's, which transformers reads but does not write so) */
    pathf(a, sizeof a, "%s/config.json", out);
    pathf(b, sizeof b, "%s/config.json", NF4_DIR);
    char *qa = quantization_config(a), *qb = quantization_config(b);
    ck_assert_str_eq(qa, qb);
    free(qa);
    free(qb);
    /* read back: the same weights, dequantized, as the directory transformers wrote */
    reads_as_nf4(out, "nf4+bf16");
}
END_TEST

START_TEST(test_write_fp32)
{
    /* stored in fp32: the quant_state and config say float32, the rest is F32; the
     * fixture's weights are bf16 values, so the codes and what reads back are nf4/'s */
    char out[512], p[640];
    convert_nf4(out, sizeof out, "nf4_f32", "--dtype fp32");
    pathf(p, sizeof p, "%s/config.json", out);
    char *qc = quantization_config(p);
    ck_assert_msg(strstr(qc, "\"bnb_4bit_compute_dtype\": \"float32\""), "%s", qc);
    free(qc);
    pathf(p, sizeof p, "%s/model.safetensors", out);
    size_t len = 0;
    char *buf = fsdp_test_read_file(p, &len);
    fsdp_st_file f;
    ck_assert_int_eq(fsdp_st_parse_buffer(p, buf, len, &f), FSDP_STATUS_OK);
    int n_state = 0, n_f32 = 0;
    for (int k = 0; k < f.n_tensors; k++) {
        const fsdp_st_tensor *t = &f.tensors[k];
        const char *data = buf + f.data_offset + t->begin;
        if (strstr(t->name, FSDP_BNB4_STATE_SUFFIX))
            n_state += !!memmem(data, t->end - t->begin, "\"dtype\": \"float32\"", 18);
        n_f32 += !strcmp(t->dtype_name, "F32");
        ck_assert_msg(strcmp(t->dtype_name, "BF16"), "%s is BF16", t->name);
    }
    ck_assert_int_eq(n_state, 14);
    ck_assert_int_eq(n_f32, 14 * 3 + 7); /* 3 maps per weight; embeddings, head, 5 norms */
    fsdp_st_free(&f);
    free(buf);
    reads_as_nf4(out, "nf4+fp32");
}
END_TEST

START_TEST(test_write_sharded)
{
    /* files of at most 30 KB: nf4_sharded/, as transformers wrote it, byte for byte */
    char out[512], a[640], b[640];
    convert_nf4(out, sizeof out, "nf4_sharded", "--shard-size 30KB");
    static const char *const files[] = {"model-00001-of-00003.safetensors",
                                        "model-00002-of-00003.safetensors",
                                        "model-00003-of-00003.safetensors",
                                        "model.safetensors.index.json"};
    for (int f = 0; f < 4; f++) {
        pathf(a, sizeof a, "%s/%s", out, files[f]);
        pathf(b, sizeof b, "%s/%s", NF4_SHARDED_DIR, files[f]);
        same_file(a, b);
    }
    /* where a weight's six tensors lie in two files: its codes, and its quant_state */
    char *index = fsdp_test_read_file(b, NULL);
    int n_split = 0;
    const char *w = "\"model.layers.";
    for (const char *at = strstr(index, w); at; at = strstr(at + 1, w)) {
        char key[160], file[64], state_file[64], state_key[200];
        if (sscanf(at, "\"%159[^\"]\": \"%63[^\"]\"", key, file) != 2 ||
            !strstr(key, "_proj.weight") || strstr(key, "_proj.weight."))
            continue;
        pathf(state_key, sizeof state_key, "\"%s" FSDP_BNB4_STATE_SUFFIX "\": \"", key);
        const char *st = strstr(index, state_key);
        ck_assert_msg(st && sscanf(st + strlen(state_key), "%63[^\"]", state_file) == 1, "%s",
                      key);
        n_split += strcmp(file, state_file) != 0;
    }
    ck_assert_msg(n_split >= 1, "no weight split over two files:\n%s", index);
    free(index);
    /* transformers' sharded directory reads, evaluates and trains as its one file */
    reads_as_nf4(NF4_SHARDED_DIR, "nf4+bf16");
    double got = eval_loss(NF4_SHARDED_DIR), want = eval_loss(NF4_DIR);
    ck_assert_msg(got == want, "eval: %.9g sharded, %.9g one file", got, want);
    fsdp_train_config c;
    fsdp_train_result r1, r2;
    qlora_config(&c, NF4_SHARDED_DIR, 1);
    run_ok_as(&c, &r1, "the sharded bnb-4bit directory");
    qlora_config(&c, NF4_DIR, 1);
    run_ok_as(&c, &r2, "the bnb-4bit directory");
    for (int k = 0; k < 3; k++)
        ck_assert_msg(r1.losses[k] == r2.losses[k] && r1.grad_norms[k] == r2.grad_norms[k],
                      "step %d: loss %.9g sharded, %.9g one file", k + 1, r1.losses[k],
                      r2.losses[k]);
    fsdp_train_result_free(&r1);
    fsdp_train_result_free(&r2);
}
END_TEST

START_TEST(test_write_lora_merged)
{
    /* a QLoRA checkpoint: its adapters merged into the weights (as --to hf does), then
     * quantized: the same bytes as writing the merged model in bf16 and quantizing that */
    char ck[512], direct[512], merged[512], again[512], msg[4096], a[640], b[640];
    fsdp_test_path(ck, sizeof ck, "ck");
    fsdp_train_config c;
    fsdp_train_result r;
    qlora_config(&c, BF16_DIR, 1);
    c.quantize = FSDP_QUANT_NF4;
    c.ckpt_dir = ck;
    run_ok_as(&c, &r, "a QLoRA run that checkpoints");
    fsdp_train_result_free(&r);
    fsdp_test_path(direct, sizeof direct, "direct");
    fsdp_test_path(merged, sizeof merged, "merged");
    fsdp_test_path(again, sizeof again, "again");
    int rc = fsdp_test_cli(msg, sizeof msg, "convert %s %s --to hf --quantize nf4", ck, direct);
    ck_assert_msg(rc == 0 && strstr(msg, "LoRA adapters merged") && strstr(msg, "NF4"), "%s",
                  msg);
    rc = fsdp_test_cli(msg, sizeof msg, "convert %s %s --to hf --dtype bf16 --quiet", ck, merged);
    ck_assert_msg(rc == 0, "%s", msg);
    rc = fsdp_test_cli(msg, sizeof msg, "convert %s %s --to hf --quantize nf4 --quiet", merged,
                       again);
    ck_assert_msg(rc == 0, "%s", msg);
    pathf(a, sizeof a, "%s/model.safetensors", direct);
    pathf(b, sizeof b, "%s/model.safetensors", again);
    same_file(a, b);
}
END_TEST

START_TEST(test_write_state_json)
{
    /* nested_offset as Python's repr(float(numpy.float32(v))) prints it */
    static const struct {
        float offset;
        const char *repr;
    } cases[] = {
        {0.12599945068359375f, "0.12599945068359375"}, {1e-5f, "9.999999747378752e-06"},
        {0.0f, "0.0"}, {123.0f, "123.0"}, {2.5e-7f, "2.499999993688107e-07"},
        {1e-4f, "9.999999747378752e-05"}, {3e-4f, "0.0003000000142492354"},
        {1.0f / 3, "0.3333333432674408"}, {0.5f, "0.5"}, {65504.0f, "65504.0"},
        {1125899906842624.0f, "1125899906842624.0"},
        {18014398509481984.0f, "1.8014398509481984e+16"}, {9.5367431640625e-07f,
                                                           "9.5367431640625e-07"},
        {-0.75f, "-0.75"},
    };
    const uint64_t shape[2] = {64, 128};
    for (size_t k = 0; k < FSDP_TEST_LEN(cases); k++) {
        char got[256], want[256];
        size_t n = fsdp_bnb4_state_json(got, sizeof got, shape, 2, "bfloat16", cases[k].offset);
        pathf(want, sizeof want, "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": "
              "\"bfloat16\", \"shape\": [64, 128], \"nested_blocksize\": 256, \"nested_dtype\": "
              "\"float32\", \"nested_offset\": %s}", cases[k].repr);
        ck_assert_str_eq(got, want);
        ck_assert_uint_eq(n, strlen(want));
    }
    char small[32];
    ck_assert_uint_eq(fsdp_bnb4_state_json(small, sizeof small, shape, 2, "bfloat16", 0.5f) <
                          sizeof small, false);
}
END_TEST

START_TEST(test_write_refused)
{
    char out[512], args[1024];
    fsdp_test_path(out, sizeof out, "refused");
    const struct {
        const char *to, *want;
    } cases[] = {
        {"--to ckpt", "--quantize nf4 writes a bnb-4bit Hugging Face directory (--to hf), and OUT"},
        {"--to peft", "is a PEFT"},
        {"--to llmc", "is a llm.c"},
        {"--to safetensors", "is a safetensors file"},
    };
    for (size_t k = 0; k < FSDP_TEST_LEN(cases); k++) {
        char msg[4096];
        pathf(args, sizeof args, "convert %s %s %s --quantize nf4", BF16_DIR, out, cases[k].to);
        int rc = fsdp_test_cli(msg, sizeof msg, "%s", args);
        ck_assert_msg(rc == 2 && strstr(msg, cases[k].want), "%s: rc %d\n%s", args, rc, msg);
    }
    const fsdp_test_cli_case cli[] = {
        {"convert " BF16_DIR " /nonexistent/x --to hf --quantize fp4", 2,
         "--quantize: unknown value 'fp4' (expected nf4)"},
        {"convert " BF16_DIR " /nonexistent/x --to hf --quantize none", 2,
         "'none' is not accepted here (expected nf4)"},
    };
    fsdp_test_cli_cases(cli, FSDP_TEST_LEN(cli));
    ck_assert_int_ne(access(out, F_OK), 0); /* nothing written */
    /* a weight that is not finite cannot be quantized: named, nothing written */
    fsdp_model m;
    float **u = read_units(BF16_DIR, &m, NULL);
    int unit = 1, i = 0;
    while (!fsdp_lora_is_linear_weight(&m, unit, i))
        i++;
    u[unit][m.units[unit].params[i].offset + 100] = NAN;
    char nan_dir[512], msg[4096];
    fsdp_test_path(nan_dir, sizeof nan_dir, "nan");
    ck_assert_int_eq(fsdp_modelfile_write(nan_dir, fsdp_modelfile_format_find("hf"), &m,
                                          (const float *const *)u, FSDP_DTYPE_F32),
                     FSDP_STATUS_OK);
    free_units(u, &m);
    int rc = fsdp_test_cli(msg, sizeof msg, "convert %s %s --to hf --quantize nf4", nan_dir,
                           out);
    ck_assert_msg(rc == 2 && strstr(msg, "model.layers.0.") && strstr(msg, "element 100") &&
                      strstr(msg, "finite"), "rc %d\n%s", rc, msg);
    ck_assert_int_ne(access(out, F_OK), 0);
    /* GPT-2 names no block linear layers (and stores its Conv1D weights transposed) */
    char gpt2[512];
    fsdp_test_path(gpt2, sizeof gpt2, "gpt2.safetensors");
    write_nan_tiny_model(gpt2, 0, 0); /* a NaN in the embeddings, which stay floats */
    rc = fsdp_test_cli(msg, sizeof msg, "convert %s %s --to hf --quantize nf4", gpt2, out);
    ck_assert_msg(rc == 2 && strstr(msg, "nothing to store in NF4") &&
                      strstr(msg, "Llama-family"), "rc %d\n%s", rc, msg);
    ck_assert_int_ne(access(out, F_OK), 0);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"read", 30, FSDP_TESTS(test_read_dequantized, test_read_nf4_same_bytes)},
        {"train", 60, .tmpdir = true,
         FSDP_TESTS(FSDP_TEST_LOOP(test_train_as_quantize, 2), test_eval_dequantized,
                    test_plan_as_train)},
        {"write", 60, .tmpdir = true,
         FSDP_TESTS(test_write_as_transformers, test_write_fp32, test_write_sharded,
                    test_write_lora_merged, test_write_state_json, test_write_refused)},
        {"hostile", 10, .tmpdir = true,
         FSDP_TESTS(FSDP_TEST_LOOP(test_hostile, (int)FSDP_TEST_LEN(hostiles)))},
    };
    return fsdp_test_main("qlora_hf", tcases, FSDP_TEST_LEN(tcases));
}
