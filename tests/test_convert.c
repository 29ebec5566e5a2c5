/*
 * test_convert.c - model import/export and forward-only use of model files:
 * the safetensors layout against a reference file written independently
 * (tools/gen_safetensors_fixture.py: HF names, Conv1D transposes, unpadded
 * wte), llm.c and safetensors range reads, bit-exact round trips
 * checkpoint -> .bin -> checkpoint and checkpoint -> .safetensors ->
 * checkpoint from a real 3-device training run, a converted checkpoint
 * that resumes, hostile safetensors headers, llm.c files and checkpoints
 * rejected with messages naming the file and tensor, the tokenizer file,
 * eval's loss against the trainer's, fine-tuning from a file, and
 * deterministic sampling on any number of devices.
 *
 * Runs from the repository root (fixtures in tests/fixtures). Each test
 * works in its own mkdtemp directory under /tmp, removed at the end.
 */
#include <check.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt/modelfile.h"
#include "ckpt/safetensors.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "models/gpt2.h"
#include "train/infer.h"
#include "train/train.h"

/* A passing REQUIRE costs nothing (Check reports every passing ck_assert). */
#define REQUIRE(cond, ...)             \
    do {                               \
        if (!(cond))                   \
            ck_abort_msg(__VA_ARGS__); \
    } while (0)

#define FIXTURE_ST "tests/fixtures/tiny_gpt2.safetensors"
#define FIXTURE_BIN "tests/fixtures/tiny_gpt2.bin"
/* a byte-level GPT-2 small enough for training runs in a test */
#define BYTE_SPEC "custom:layers=2,heads=2,channels=32,vocab=256,context=16"

/* ---- helpers ---------------------------------------------------------------- */

static void make_tmpdir(char *buf, size_t n)
{
    snprintf(buf, n, "/tmp/fsdp_test_convert_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(buf));
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void rm_rf(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static char *path_in(const char *dir, const char *name)
{
    static char bufs[8][512];
    static int k;
    char *p = bufs[k++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    ck_assert_ptr_nonnull(b);
    REQUIRE(fread(b, 1, (size_t)len, f) == (size_t)len, "short read of %s", path);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void write_file(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "cannot create %s", path);
    REQUIRE(fwrite(b, 1, n, f) == n, "short write of %s", path);
    fclose(f);
}

#define FMT(name) fsdp_modelfile_format_find(name)

/* Metadata value of a parsed safetensors file, or NULL. */
static const char *st_meta(const fsdp_st_file *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_key[i], key))
            return f->meta_val[i];
    return NULL;
}

/* A model and its whole parameters in host memory. */
typedef struct loaded {
    fsdp_model m;
    float **units;
    char kind_dtype[16];
} loaded;

static void loaded_free(loaded *l)
{
    for (int u = 0; u < l->m.n_units; u++)
        free(l->units[u]);
    free(l->units);
    fsdp_model_free(&l->m);
}

/* Open any model file and read all of it through the range reader. */
static fsdp_status load(const char *path, loaded *l)
{
    memset(l, 0, sizeof *l);
    fsdp_modelfile *mf = NULL;
    FSDP_TRY(fsdp_modelfile_resolve(path, &l->m, &mf));
    ck_assert_ptr_nonnull(mf);
    snprintf(l->kind_dtype, sizeof l->kind_dtype, "%s", fsdp_modelfile_dtype_name(mf));
    fsdp_status st = FSDP_STATUS_OK;
    l->units = calloc((size_t)l->m.n_units, sizeof *l->units);
    ck_assert_ptr_nonnull(l->units);
    for (int u = 0; u < l->m.n_units && st == FSDP_STATUS_OK; u++) {
        l->units[u] = malloc(l->m.units[u].numel * sizeof(float));
        ck_assert_ptr_nonnull(l->units[u]);
        st = fsdp_modelfile_read_range(mf, u, 0, l->m.units[u].numel, l->units[u]);
    }
    fsdp_modelfile_close(mf);
    return st;
}

static void load_ok(const char *path, loaded *l)
{
    fsdp_status st = load(path, l);
    REQUIRE(st == FSDP_STATUS_OK, "loading %s: %s", path, fsdp_error_msg());
}

/* First differing element of two models' units, or -1. */
static long units_diff(const fsdp_model *m, float *const *a, float *const *b, int *unit)
{
    for (int u = 0; u < m->n_units; u++)
        for (size_t i = 0; i < m->units[u].numel; i++)
            if (memcmp(&a[u][i], &b[u][i], 4)) {
                *unit = u;
                return (long)i;
            }
    return -1;
}

static void require_same(const loaded *a, const loaded *b, const char *what)
{
    REQUIRE(!strcmp(a->m.name, b->m.name), "%s: model %s vs %s", what, a->m.name, b->m.name);
    int u = -1;
    long i = units_diff(&a->m, a->units, b->units, &u);
    REQUIRE(i < 0, "%s: unit %d element %ld differs: %.9g vs %.9g", what, u, i,
            i < 0 ? 0.0 : (double)a->units[u][i], i < 0 ? 0.0 : (double)b->units[u][i]);
}

/* Write a model of `spec` with parameters from the model's own RNG init. */
static void write_init_model(const char *path, const char *spec, uint64_t seed)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec(spec, &m), FSDP_STATUS_OK);
    float **units = calloc((size_t)m.n_units, sizeof *units);
    for (int u = 0; u < m.n_units; u++) {
        units[u] = malloc(m.units[u].numel * sizeof(float));
        fsdp_model_init_range(&m, u, 0, m.units[u].numel, seed, units[u]);
    }
    fsdp_status st = fsdp_modelfile_write(path, fsdp_modelfile_format_of(path), &m,
                                          (const float *const *)units, FSDP_DTYPE_F32);
    REQUIRE(st == FSDP_STATUS_OK, "writing %s: %s", path, fsdp_error_msg());
    for (int u = 0; u < m.n_units; u++)
        free(units[u]);
    free(units);
    fsdp_model_free(&m);
}

static void train_config(fsdp_train_config *c, const char *model, int devices, int steps)
{
    fsdp_train_config_default(c);
    c->eng.backend = FSDP_BACKEND_CPU;
    c->eng.n_ranks = devices;
    c->eng.batch = 2;
    c->eng.seq = 16;
    c->eng.deterministic = true;
    c->model = model;
    c->data = "synthetic";
    c->steps = steps;
    c->warmup = 1;
    c->eval_problems = 0;
    c->n_samples = 0;
    c->out = NULL;
}

static void train_ok(const fsdp_train_config *c, fsdp_train_result *r)
{
    fsdp_status st = fsdp_train_run(c, r);
    REQUIRE(st == FSDP_STATUS_OK, "training %s: %s", c->model, fsdp_error_msg());
}

/* Expect a failure with `want` status whose message holds every fragment. */
static void expect_error(fsdp_status st, fsdp_status want, const char *ctx, ...)
{
    REQUIRE(st == want, "%s: expected %s, got %s (%s)", ctx, fsdp_status_name(want),
            fsdp_status_name(st), fsdp_error_msg());
    va_list ap;
    va_start(ap, ctx);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        REQUIRE(strstr(fsdp_error_msg(), frag), "%s: message '%s' lacks '%s'", ctx,
                fsdp_error_msg(), frag);
    va_end(ap);
}

/* ---- a small safetensors builder for hostile files ---------------------------- */

typedef struct st_entry {
    char name[160];
    char dtype[16];
    char shape[96];          /* JSON text of the shape array */
    char offsets[96];        /* JSON text of data_offsets; "" = computed */
    char extra[96];          /* extra JSON members inside the entry ("" = none) */
    const unsigned char *data;
    size_t bytes;
} st_entry;

typedef struct st_doc {
    st_entry e[64];
    int n;
    char metadata[256];      /* JSON object text, or "" for none */
    size_t trailing;         /* extra zero bytes after the data */
} st_doc;

/* The fixture's tensors, in data order, pointing into buf. */
static void st_doc_from(st_doc *d, const char *path, unsigned char **buf)
{
    memset(d, 0, sizeof *d);
    size_t n;
    *buf = read_file(path, &n);
    fsdp_st_file f;
    REQUIRE(fsdp_st_open(path, &f) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    REQUIRE(f.n_tensors <= 64, "too many tensors");
    for (int i = 0; i < f.n_tensors; i++) {
        const fsdp_st_tensor *t = &f.tensors[i];
        st_entry *e = &d->e[d->n++];
        snprintf(e->name, sizeof e->name, "%s", t->name);
        snprintf(e->dtype, sizeof e->dtype, "%s", t->dtype_name);
        int k = snprintf(e->shape, sizeof e->shape, "[");
        for (int j = 0; j < t->ndim; j++)
            k += snprintf(e->shape + k, sizeof e->shape - (size_t)k, "%s%llu", j ? "," : "",
                          (unsigned long long)t->shape[j]);
        snprintf(e->shape + k, sizeof e->shape - (size_t)k, "]");
        e->data = *buf + f.data_offset + t->begin;
        e->bytes = t->end - t->begin;
    }
    size_t k = 0;
    for (int i = 0; i < f.n_meta; i++)
        k += (size_t)snprintf(d->metadata + k, sizeof d->metadata - k, "%s\"%s\":\"%s\"",
                              i ? "," : "{", f.meta_key[i], f.meta_val[i]);
    if (f.n_meta)
        snprintf(d->metadata + k, sizeof d->metadata - k, "}");
    fsdp_st_free(&f);
}

static st_entry *st_find(st_doc *d, const char *name)
{
    for (int i = 0; i < d->n; i++)
        if (!strcmp(d->e[i].name, name))
            return &d->e[i];
    ck_abort_msg("no tensor %s in the document", name);
    return NULL;
}

static void st_drop(st_doc *d, const char *name)
{
    st_entry *e = st_find(d, name);
    memmove(e, e + 1, (size_t)(d->e + d->n - e - 1) * sizeof *e);
    d->n--;
}

/* Serialise: 8-byte length, header, data in entry order. */
static unsigned char *st_build(const st_doc *d, size_t *n_out)
{
    size_t cap = 65536, n = 8;
    char *h = malloc(cap);
    ck_assert_ptr_nonnull(h);
    int k = snprintf(h, cap, "{");
    if (d->metadata[0])
        k += snprintf(h + k, cap - (size_t)k, "\"__metadata__\":%s", d->metadata);
    size_t at = 0, data = 0;
    for (int i = 0; i < d->n; i++) {
        const st_entry *e = &d->e[i];
        char offs[96];
        if (e->offsets[0])
            snprintf(offs, sizeof offs, "%s", e->offsets);
        else
            snprintf(offs, sizeof offs, "[%zu,%zu]", at, at + e->bytes);
        k += snprintf(h + k, cap - (size_t)k,
                      "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":%s%s%s}",
                      k > 1 ? "," : "", e->name, e->dtype, e->shape, offs, e->extra[0] ? "," : "",
                      e->extra);
        at += e->bytes;
    }
    k += snprintf(h + k, cap - (size_t)k, "}");
    REQUIRE((size_t)k < cap, "header too long");
    data = at + d->trailing;
    unsigned char *out = calloc(1, n + (size_t)k + data + 1);
    ck_assert_ptr_nonnull(out);
    uint64_t hl = (uint64_t)k;
    memcpy(out, &hl, 8);
    memcpy(out + 8, h, (size_t)k);
    size_t p = 8 + (size_t)k;
    for (int i = 0; i < d->n; i++) {
        if (d->e[i].data)
            memcpy(out + p, d->e[i].data, d->e[i].bytes);
        p += d->e[i].bytes;
    }
    free(h);
    *n_out = 8 + (size_t)k + data;
    return out;
}

/* Parse a built document and map it to a GPT-2 (what opening a file does). */
static fsdp_status st_check(const st_doc *d)
{
    size_t n;
    unsigned char *b = st_build(d, &n);
    fsdp_st_file f;
    fsdp_model m;
    fsdp_status st = fsdp_st_parse_buffer("hostile.safetensors", b, n, &f);
    if (st == FSDP_STATUS_OK) {
        st = fsdp_st_model(&f, &m);
        if (st == FSDP_STATUS_OK)
            fsdp_model_free(&m);
        fsdp_st_free(&f);
    }
    free(b);
    return st;
}

static fsdp_status st_check_raw(const void *b, size_t n)
{
    fsdp_st_file f;
    fsdp_status st = fsdp_st_parse_buffer("hostile.safetensors", b, n, &f);
    if (st == FSDP_STATUS_OK) {
        fsdp_model m;
        st = fsdp_st_model(&f, &m);
        if (st == FSDP_STATUS_OK)
            fsdp_model_free(&m);
        fsdp_st_free(&f);
    }
    return st;
}

/* Header text `json` as a whole file with `data` zero bytes after it. */
static fsdp_status st_check_header(const char *json, size_t data)
{
    size_t n = strlen(json);
    unsigned char *b = calloc(1, 8 + n + data + 1);
    uint64_t hl = n;
    memcpy(b, &hl, 8);
    memcpy(b + 8, json, n);
    fsdp_status st = st_check_raw(b, 8 + n + data);
    free(b);
    return st;
}

/* ---- layout: the reference file ------------------------------------------------- */

START_TEST(test_fixture_safetensors_equals_llmc)
{
    loaded a, b;
    load_ok(FIXTURE_ST, &a);
    load_ok(FIXTURE_BIN, &b);
    const fsdp_gpt2_config *c = fsdp_gpt2_config_of(&a.m);
    REQUIRE(c->n_layer == 2 && c->n_head == 2 && c->n_embd == 16 && c->vocab_size == 200 &&
                c->padded_vocab_size == 256 && c->max_seq_len == 8,
            "fixture config L=%d NH=%d C=%d V=%d Vp=%d T=%d", c->n_layer, c->n_head, c->n_embd,
            c->vocab_size, c->padded_vocab_size, c->max_seq_len);
    require_same(&a, &b, "safetensors vs llm.c fixture");
    /* the pad rows of wte are zero, the real rows are not */
    const float *wte = a.units[0];
    for (size_t i = 200 * 16; i < 256 * 16; i++)
        REQUIRE(wte[i] == 0.0f, "wte pad element %zu is %g", i, (double)wte[i]);
    int nonzero = 0;
    for (size_t i = 0; i < 200 * 16; i++)
        nonzero += wte[i] != 0.0f;
    REQUIRE(nonzero > 3000, "wte has only %d non-zero values", nonzero);
    loaded_free(&a);
    loaded_free(&b);
}
END_TEST

START_TEST(test_range_reads_match_whole)
{
    /* any slice, across parameter boundaries, transposes and the padding
     * past a unit's numel, equals the same slice of a whole-unit read */
    const char *paths[2] = {FIXTURE_ST, FIXTURE_BIN};
    for (int p = 0; p < 2; p++) {
        loaded l;
        load_ok(paths[p], &l);
        fsdp_modelfile *mf = NULL;
        ck_assert_int_eq(fsdp_modelfile_open(&mf, paths[p]), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_modelfile_bind(mf, &l.m), FSDP_STATUS_OK);
        for (int u = 0; u < l.m.n_units; u++) {
            size_t numel = l.m.units[u].numel, span = numel + 700;
            float *buf = malloc(span * sizeof *buf);
            for (int k = 0; k < 40; k++) {
                size_t a = (size_t)(fsdp_rng_u64(7, (uint64_t)u, (uint64_t)k) % span);
                size_t b = a + (size_t)(fsdp_rng_u64(8, (uint64_t)u, (uint64_t)k) % (span - a + 1));
                memset(buf, 0x7f, span * sizeof *buf);
                fsdp_status st = fsdp_modelfile_read_range(mf, u, a, b, buf);
                REQUIRE(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
                for (size_t i = a; i < b; i++) {
                    float want = i < numel ? l.units[u][i] : 0.0f;
                    REQUIRE(!memcmp(&buf[i - a], &want, 4),
                            "%s unit %d range [%zu, %zu) element %zu: %g, want %g", paths[p], u, a,
                            b, i, (double)buf[i - a], (double)want);
                }
            }
            free(buf);
        }
        fsdp_modelfile_close(mf);
        loaded_free(&l);
    }
}
END_TEST

START_TEST(test_export_matches_reference_layout)
{
    char dir[64], *out;
    make_tmpdir(dir, sizeof dir);
    out = path_in(dir, "export.safetensors");
    loaded l;
    load_ok(FIXTURE_BIN, &l);
    ck_assert_int_eq(fsdp_modelfile_write(out, FMT("safetensors"), &l.m,
                                          (const float *const *)l.units, FSDP_DTYPE_F32),
                     FSDP_STATUS_OK);
    fsdp_st_file ref, got;
    ck_assert_int_eq(fsdp_st_open(FIXTURE_ST, &ref), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_st_open(out, &got), FSDP_STATUS_OK);
    size_t nr, ng;
    unsigned char *rb = read_file(FIXTURE_ST, &nr), *gb = read_file(out, &ng);
    int compared = 0;
    for (int i = 0; i < ref.n_tensors; i++) {
        const fsdp_st_tensor *r = &ref.tensors[i];
        if (strstr(r->name, "attn.bias") && !strstr(r->name, "c_attn"))
            continue; /* the mask buffer: not a parameter, not exported */
        const fsdp_st_tensor *g = NULL;
        for (int j = 0; j < got.n_tensors; j++)
            if (!strcmp(got.tensors[j].name, r->name))
                g = &got.tensors[j];
        REQUIRE(g, "the export lacks tensor %s", r->name);
        REQUIRE(!strcmp(g->dtype_name, "F32") && g->ndim == r->ndim, "%s: dtype %s ndim %d",
                r->name, g->dtype_name, g->ndim);
        for (int d = 0; d < r->ndim; d++)
            REQUIRE(g->shape[d] == r->shape[d], "%s: dim %d is %llu, reference %llu", r->name, d,
                    (unsigned long long)g->shape[d], (unsigned long long)r->shape[d]);
        REQUIRE(g->end - g->begin == r->end - r->begin &&
                    !memcmp(gb + got.data_offset + g->begin, rb + ref.data_offset + r->begin,
                            r->end - r->begin),
                "%s: data differs from the reference (transpose or offset wrong)", r->name);
        compared++;
    }
    REQUIRE(compared == 4 + 12 * 2 && got.n_tensors == compared,
            "compared %d tensors, the export has %d", compared, got.n_tensors);
    REQUIRE(st_meta(&got, "n_head") && !strcmp(st_meta(&got, "n_head"), "2"),
            "n_head metadata %s", st_meta(&got, "n_head"));
    /* HF shapes: Conv1D (in, out), wte unpadded */
    const fsdp_st_tensor *t = NULL;
    for (int j = 0; j < got.n_tensors; j++)
        if (!strcmp(got.tensors[j].name, "h.1.mlp.c_fc.weight"))
            t = &got.tensors[j];
    REQUIRE(t && t->shape[0] == 16 && t->shape[1] == 64, "c_fc.weight is not (C, 4C)");
    for (int j = 0; j < got.n_tensors; j++)
        if (!strcmp(got.tensors[j].name, "wte.weight"))
            t = &got.tensors[j];
    REQUIRE(t->shape[0] == 200 && t->shape[1] == 16, "wte.weight is not (V, C)");
    free(rb);
    free(gb);
    fsdp_st_free(&ref);
    fsdp_st_free(&got);
    loaded_free(&l);
    rm_rf(dir);
}
END_TEST

/* f32 -> f16 for the fixture's values (k / 1024, |k| <= 2000: exact). */
static uint16_t to_f16(float f)
{
    if (f == 0.0f)
        return signbit(f) ? 0x8000 : 0;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    ck_assert((man & 0x1fff) == 0 && exp >= 113 && exp <= 142);
    return (uint16_t)(sign | ((exp - 112) << 10) | (man >> 13));
}

START_TEST(test_safetensors_variants)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    loaded ref;
    load_ok(FIXTURE_BIN, &ref);
    unsigned char *buf;
    st_doc d;

    /* "transformer." prefixes (GPT2LMHeadModel) and a tied lm_head are accepted */
    st_doc_from(&d, FIXTURE_ST, &buf);
    for (int i = 0; i < d.n; i++) {
        char tmp[160];
        snprintf(tmp, sizeof tmp, "transformer.%s", d.e[i].name);
        memcpy(d.e[i].name, tmp, sizeof tmp);
    }
    st_entry wte = *st_find(&d, "transformer.wte.weight");
    snprintf(wte.name, sizeof wte.name, "lm_head.weight");
    d.e[d.n++] = wte;
    size_t n;
    unsigned char *b = st_build(&d, &n);
    write_file(path_in(dir, "prefix.safetensors"), b, n);
    free(b);
    free(buf);
    loaded l;
    load_ok(path_in(dir, "prefix.safetensors"), &l);
    require_same(&ref, &l, "transformer.-prefixed file");
    loaded_free(&l);

    /* F16 storage */
    st_doc_from(&d, FIXTURE_ST, &buf);
    uint16_t *halves[64] = {0};
    for (int i = 0; i < d.n; i++) {
        size_t k = d.e[i].bytes / 4;
        halves[i] = malloc(k * 2 + 2);
        for (size_t j = 0; j < k; j++) {
            float v;
            memcpy(&v, d.e[i].data + 4 * j, 4);
            halves[i][j] = to_f16(v);
        }
        d.e[i].data = (const unsigned char *)halves[i];
        d.e[i].bytes = k * 2;
        snprintf(d.e[i].dtype, sizeof d.e[i].dtype, "F16");
    }
    b = st_build(&d, &n);
    write_file(path_in(dir, "f16.safetensors"), b, n);
    free(b);
    load_ok(path_in(dir, "f16.safetensors"), &l);
    ck_assert_str_eq(l.kind_dtype, "fp16");
    require_same(&ref, &l, "F16 file");
    loaded_free(&l);
    for (int i = 0; i < 64; i++)
        free(halves[i]);
    free(buf);

    /* BF16 export: round to nearest even, read back exactly */
    ck_assert_int_eq(fsdp_modelfile_write(path_in(dir, "bf16.safetensors"), FMT("safetensors"),
                                          &ref.m, (const float *const *)ref.units,
                                          FSDP_DTYPE_BF16),
                     FSDP_STATUS_OK);
    load_ok(path_in(dir, "bf16.safetensors"), &l);
    ck_assert_str_eq(l.kind_dtype, "bf16");
    for (int u = 0; u < ref.m.n_units; u++)
        for (size_t i = 0; i < ref.m.units[u].numel; i++) {
            float want = fsdp_bf16_to_f32(fsdp_f32_to_bf16(ref.units[u][i]));
            REQUIRE(!memcmp(&want, &l.units[u][i], 4), "bf16 unit %d element %zu", u, i);
        }
    loaded_free(&l);

    /* no n_head metadata: heads = channels / 64 */
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("custom:layers=1,heads=4,channels=64,vocab=8,"
                                          "context=4", &m),
                     FSDP_STATUS_OK);
    float **units = calloc((size_t)m.n_units, sizeof *units);
    for (int u = 0; u < m.n_units; u++) {
        units[u] = malloc(m.units[u].numel * sizeof(float));
        fsdp_model_init_range(&m, u, 0, m.units[u].numel, 3, units[u]);
    }
    ck_assert_int_eq(fsdp_modelfile_write(path_in(dir, "c64.safetensors"), FMT("safetensors"),
                                          &m, (const float *const *)units, FSDP_DTYPE_F32),
                     FSDP_STATUS_OK);
    st_doc_from(&d, path_in(dir, "c64.safetensors"), &buf);
    fsdp_st_file f;
    fsdp_model got;
    b = st_build(&d, &n);
    ck_assert_int_eq(fsdp_st_parse_buffer("c64", b, n, &f), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_st_model(&f, &got), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_gpt2_config_of(&got)->n_head, 4); /* from the metadata fsdp writes */
    fsdp_model_free(&got);
    fsdp_st_free(&f);
    free(b);
    d.metadata[0] = '\0';
    b = st_build(&d, &n);
    ck_assert_int_eq(fsdp_st_parse_buffer("c64", b, n, &f), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_st_model(&f, &got), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_gpt2_config_of(&got)->n_head, 1);
    ck_assert_int_eq(fsdp_gpt2_config_of(&got)->n_embd, 64);
    fsdp_model_free(&got);
    fsdp_st_free(&f);
    free(b);
    free(buf);
    for (int u = 0; u < m.n_units; u++)
        free(units[u]);
    free(units);
    fsdp_model_free(&m);
    loaded_free(&ref);
    rm_rf(dir);
}
END_TEST

/* ---- round trips through a real training checkpoint ------------------------------ */

/* Train BYTE_SPEC on 3 devices for 3 steps with checkpoints in dir/ckpt;
 * returns the final parameters. */
static void trained_checkpoint(const char *dir, fsdp_train_result *res)
{
    fsdp_train_config c;
    train_config(&c, BYTE_SPEC, 3, 3);
    c.ckpt_dir = path_in(dir, "ckpt");
    c.keep_params = true;
    train_ok(&c, res);
}

START_TEST(test_roundtrip_ckpt_bin_ckpt)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    fsdp_train_result res;
    trained_checkpoint(dir, &res);
    loaded a, b, c;
    load_ok(path_in(dir, "ckpt"), &a); /* the newest checkpoint of the dir */
    int u = -1;
    long i = units_diff(&a.m, a.units, res.params, &u);
    REQUIRE(i < 0, "checkpoint unit %d element %ld differs from the trained parameters", u, i);
    ck_assert_int_eq(fsdp_modelfile_write(path_in(dir, "m.bin"), FMT("llmc"), &a.m,
                                          (const float *const *)a.units, FSDP_DTYPE_F32),
                     FSDP_STATUS_OK);
    load_ok(path_in(dir, "m.bin"), &b);
    require_same(&a, &b, "checkpoint -> .bin");
    ck_assert_int_eq(fsdp_modelfile_write(path_in(dir, "back"), FMT("ckpt"), &b.m,
                                          (const float *const *)b.units, FSDP_DTYPE_F32),
                     FSDP_STATUS_OK);
    load_ok(path_in(dir, "back"), &c);
    require_same(&a, &c, "checkpoint -> .bin -> checkpoint");
    /* bf16 llm.c export: version 5, rounded */
    ck_assert_int_eq(fsdp_modelfile_write(path_in(dir, "m16.bin"), FMT("llmc"), &a.m,
                                          (const float *const *)a.units, FSDP_DTYPE_BF16),
                     FSDP_STATUS_OK);
    loaded_free(&c);
    load_ok(path_in(dir, "m16.bin"), &c);
    ck_assert_str_eq(c.kind_dtype, "bf16");
    for (int k = 0; k < a.m.n_units; k++)
        for (size_t e = 0; e < a.m.units[k].numel; e++) {
            float want = fsdp_bf16_to_f32(fsdp_f32_to_bf16(a.units[k][e]));
            REQUIRE(!memcmp(&want, &c.units[k][e], 4), "bf16 .bin unit %d element %zu", k, e);
        }
    /* a checkpoint directory is never overwritten */
    fsdp_status st = fsdp_modelfile_write(path_in(dir, "back"), FMT("ckpt"), &b.m,
                                          (const float *const *)b.units, FSDP_DTYPE_F32);
    expect_error(st, FSDP_STATUS_INVALID_ARG, "writing into a checkpoint dir", "already holds",
                 NULL);
    loaded_free(&a);
    loaded_free(&b);
    loaded_free(&c);
    fsdp_train_result_free(&res);
    rm_rf(dir);
}
END_TEST

START_TEST(test_roundtrip_ckpt_safetensors_ckpt)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    fsdp_train_result res;
    trained_checkpoint(dir, &res);
    char step[512];
    ck_assert_int_eq(fsdp_ckpt_step_path(step, sizeof step, path_in(dir, "ckpt"), 3, ""),
                     FSDP_STATUS_OK);
    loaded a, b, c;
    load_ok(step, &a); /* one checkpoint named directly */
    ck_assert_int_eq(fsdp_modelfile_write(path_in(dir, "m.safetensors"),
                                          FMT("safetensors"), &a.m,
                                          (const float *const *)a.units, FSDP_DTYPE_F32),
                     FSDP_STATUS_OK);
    load_ok(path_in(dir, "m.safetensors"), &b);
    require_same(&a, &b, "checkpoint -> .safetensors");
    ck_assert_int_eq(fsdp_modelfile_write(path_in(dir, "back"), FMT("ckpt"), &b.m,
                                          (const float *const *)b.units, FSDP_DTYPE_F32),
                     FSDP_STATUS_OK);
    load_ok(path_in(dir, "back"), &c);
    require_same(&a, &c, "checkpoint -> .safetensors -> checkpoint");
    int u = -1;
    REQUIRE(units_diff(&a.m, c.units, res.params, &u) < 0, "round trip lost the trained values");
    loaded_free(&a);
    loaded_free(&b);
    loaded_free(&c);
    fsdp_train_result_free(&res);
    rm_rf(dir);
}
END_TEST

START_TEST(test_converted_ckpt_resumes)
{
    /* a checkpoint written from a model file resumes like training from
     * the file: same losses, bit for bit */
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    write_init_model(path_in(dir, "m.safetensors"), BYTE_SPEC, 99);
    loaded l;
    load_ok(path_in(dir, "m.safetensors"), &l);
    ck_assert_int_eq(fsdp_modelfile_write(path_in(dir, "ck"), FMT("ckpt"), &l.m,
                                          (const float *const *)l.units, FSDP_DTYPE_F32),
                     FSDP_STATUS_OK);
    fsdp_train_config c;
    fsdp_train_result r1, r2;
    /* the converted checkpoint records a 1-device run of batch 8, seq 16 (the
     * model's context) and seed 1337; resuming needs the same global batch */
    train_config(&c, path_in(dir, "m.safetensors"), 2, 2);
    c.eng.batch = 4;
    train_ok(&c, &r1);
    train_config(&c, BYTE_SPEC, 1, 2);
    c.eng.batch = 8;
    c.ckpt_dir = path_in(dir, "ck");
    c.resume = true;
    train_ok(&c, &r2);
    ck_assert_int_eq(r2.first_step, 0);
    for (int s = 0; s < 2; s++)
        REQUIRE(!memcmp(&r1.losses[s], &r2.losses[s], 4), "step %d: %.9g from the file, %.9g "
                "resumed from the converted checkpoint", s, (double)r1.losses[s],
                (double)r2.losses[s]);
    fsdp_train_result_free(&r1);
    fsdp_train_result_free(&r2);
    loaded_free(&l);
    rm_rf(dir);
}
END_TEST

/* ---- hostile files ------------------------------------------------------------------ */

START_TEST(test_hostile_safetensors_framing)
{
    size_t n;
    unsigned char *good = read_file(FIXTURE_ST, &n);
    unsigned char *b = malloc(n + 64);
    uint64_t hl;
    memcpy(&hl, good, 8);
    ck_assert_int_eq(st_check_raw(good, n), FSDP_STATUS_OK);

    expect_error(st_check_raw(good, 4), FSDP_STATUS_FORMAT, "4 bytes", "hostile.safetensors",
                 "shorter than the 8-byte", NULL);
    memcpy(b, good, n);
    uint64_t huge = (uint64_t)1 << 40;
    memcpy(b, &huge, 8);
    expect_error(st_check_raw(b, n), FSDP_STATUS_FORMAT, "huge length", "header length", NULL);
    uint64_t past = n;
    memcpy(b, &past, 8);
    expect_error(st_check_raw(b, n), FSDP_STATUS_FORMAT, "length past the end", "header length",
                 NULL);
    /* truncated data: the last tensor runs past the end */
    expect_error(st_check_raw(good, n - 100), FSDP_STATUS_FORMAT, "truncated", "truncated", NULL);
    /* trailing bytes */
    memcpy(b, good, n);
    memset(b + n, 0, 16);
    expect_error(st_check_raw(b, n + 16), FSDP_STATUS_FORMAT, "trailing", "data bytes", NULL);
    /* header bytes flipped into garbage */
    for (size_t i = 8; i < 8 + hl; i += 7) {
        memcpy(b, good, n);
        b[i] ^= 0x5a;
        fsdp_status st = st_check_raw(b, n);
        REQUIRE(st == FSDP_STATUS_FORMAT || st == FSDP_STATUS_OK,
                "flipped header byte %zu: %s (%s)", i, fsdp_status_name(st), fsdp_error_msg());
        if (st != FSDP_STATUS_OK)
            REQUIRE(strstr(fsdp_error_msg(), "hostile.safetensors"), "flipped byte %zu: '%s'", i,
                    fsdp_error_msg());
    }
    free(b);
    free(good);

    /* JSON that is not a safetensors header */
    expect_error(st_check_header("[1,2]", 0), FSDP_STATUS_FORMAT, "array", "'{'", NULL);
    expect_error(st_check_header("{\"a\":1,}", 0), FSDP_STATUS_FORMAT, "trailing comma",
                 "not valid JSON", NULL);
    expect_error(st_check_header("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4),
                 FSDP_STATUS_FORMAT, "unterminated", "not valid JSON", NULL);
    char deep[1200];
    int k = snprintf(deep, sizeof deep, "{\"a\":");
    for (int i = 0; i < 400; i++)
        deep[k++] = '[';
    for (int i = 0; i < 400; i++)
        deep[k++] = ']';
    snprintf(deep + k, sizeof deep - (size_t)k, "}");
    expect_error(st_check_header(deep, 0), FSDP_STATUS_FORMAT, "deep nesting", "not valid JSON",
                 NULL);
    expect_error(st_check_header("{\"__metadata__\":{\"n_head\":2}}", 0), FSDP_STATUS_FORMAT,
                 "metadata number", "must be strings", NULL);
    expect_error(st_check_header("{\"__metadata__\":{\"n_head\":\"two\"}}", 0),
                 FSDP_STATUS_FORMAT, "metadata n_head", "n_head", NULL);
    expect_error(st_check_header("{\"\\u0001w\":{\"dtype\":\"F32\",\"shape\":[1],"
                                 "\"data_offsets\":[0,4]}}", 4),
                 FSDP_STATUS_FORMAT, "control character name", "control characters", NULL);
}
END_TEST

START_TEST(test_hostile_safetensors_tensors)
{
    unsigned char *buf;
    st_doc d;
    const char *T = "h.0.attn.c_attn.weight";
#define CASE(what, mutate, ...)                                                       \
    do {                                                                              \
        st_doc_from(&d, FIXTURE_ST, &buf);                                            \
        ck_assert_int_eq(st_check(&d), FSDP_STATUS_OK);                               \
        mutate;                                                                       \
        expect_error(st_check(&d), FSDP_STATUS_FORMAT, what, "hostile.safetensors",   \
                     __VA_ARGS__, NULL);                                              \
        free(buf);                                                                    \
    } while (0)
    CASE("unknown dtype", snprintf(st_find(&d, T)->dtype, 16, "F33"), T, "unknown dtype");
    CASE("fractional dim", snprintf(st_find(&d, T)->shape, 96, "[16,48.5]"), T, "shape dimension");
    CASE("negative dim", snprintf(st_find(&d, T)->shape, 96, "[-16,48]"), T, "shape dimension");
    CASE("too many dims", snprintf(st_find(&d, T)->shape, 96, "[1,1,1,1,1,1,1,1,16,48]"), T,
         "at most 8");
    CASE("shape vs bytes", snprintf(st_find(&d, T)->shape, 96, "[16,49]"), T, "bytes");
    CASE("offsets reversed", snprintf(st_find(&d, T)->offsets, 96, "[100,4]"), T, "data_offsets");
    CASE("offsets not a pair", snprintf(st_find(&d, T)->offsets, 96, "[0]"), T, "data_offsets");
    CASE("offset past 2^53", snprintf(st_find(&d, T)->offsets, 96, "[1e300,1e300]"), T,
         "data_offsets");
    CASE("offset past the end", snprintf(st_find(&d, T)->offsets, 96, "[%llu,%llu]",
                                         1ull << 40, (1ull << 40) + 3072), T, "ends at byte");
    CASE("overlap", snprintf(st_find(&d, T)->offsets, 96, "[0,3072]"), "must not overlap");
    CASE("unknown field", snprintf(st_find(&d, T)->extra, 96, "\"foo\":1"), T, "unknown field");
    CASE("duplicate field", snprintf(st_find(&d, T)->extra, 96, "\"dtype\":\"F32\""), T, "twice");
    CASE("duplicate tensor", d.e[d.n++] = *st_find(&d, T), T, "appears twice");
    CASE("not a GPT-2 name", snprintf(st_find(&d, T)->name, 160, "h.0.attn.c_attn.weightx"),
         "h.0.attn.c_attn.weightx", "not a GPT-2 parameter");
    CASE("leading zero layer", snprintf(st_find(&d, T)->name, 160, "h.00.attn.c_attn.weight"),
         "h.00.attn.c_attn.weight", "not a GPT-2 parameter");
    CASE("transposed Conv1D", snprintf(st_find(&d, T)->shape, 96, "[48,16]"), T, "[48, 16]",
         "[16, 48]");
    static const unsigned char f64[16 * 8];
    CASE("F64 parameter", (snprintf(st_find(&d, "ln_f.bias")->dtype, 16, "F64"),
                           st_find(&d, "ln_f.bias")->data = f64,
                           st_find(&d, "ln_f.bias")->bytes = sizeof f64),
         "ln_f.bias", "imports F32, BF16 and F16");
    CASE("missing parameter", st_drop(&d, "h.1.mlp.c_proj.bias"), "h.1.mlp.c_proj.bias",
         "missing");
    CASE("missing wte", st_drop(&d, "wte.weight"), "wte.weight", "missing");
    CASE("same parameter twice", (d.e[d.n] = *st_find(&d, "ln_f.bias"),
                                  snprintf(d.e[d.n].name, 160, "transformer.ln_f.bias"), d.n++),
         "ln_f.bias", "both");
    CASE("no heads", d.metadata[0] = '\0', "number of attention heads", "n_head");
    CASE("heads do not divide", snprintf(d.metadata, 256, "{\"n_head\":\"3\"}"),
         "fsdp cannot build", "divisible");
#undef CASE
}
END_TEST

START_TEST(test_hostile_model_files)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    fsdp_modelfile *mf = NULL;
    size_t n;
    /* llm.c file truncated */
    unsigned char *b = read_file(FIXTURE_BIN, &n);
    write_file(path_in(dir, "cut.bin"), b, n - 8);
    expect_error(fsdp_modelfile_open(&mf, path_in(dir, "cut.bin")), FSDP_STATUS_FORMAT,
                 "truncated .bin", "cut.bin", "truncated", NULL);
    free(b);
    /* a safetensors file on disk is validated the same way */
    b = read_file(FIXTURE_ST, &n);
    write_file(path_in(dir, "cut.safetensors"), b, n / 2);
    expect_error(fsdp_modelfile_open(&mf, path_in(dir, "cut.safetensors")), FSDP_STATUS_FORMAT,
                 "truncated .safetensors", "cut.safetensors", NULL);
    free(b);
    ck_assert_ptr_null(mf);
    /* not a model at all */
    expect_error(fsdp_modelfile_open(&mf, path_in(dir, "nothing")), FSDP_STATUS_IO, "missing",
                 "nothing", NULL);
    /* a FIFO with no writer is refused at once, never waited on (issue 15 item 11) */
    static const char *const fifos[] = {"fifo.bin", "fifo.safetensors"};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(mkfifo(path_in(dir, fifos[i]), 0600), 0);
        expect_error(fsdp_modelfile_open(&mf, path_in(dir, fifos[i])), FSDP_STATUS_IO, fifos[i],
                     "not a regular file", NULL);
    }
    mkdir(path_in(dir, "fifo_ckpt"), 0755);
    ck_assert_int_eq(mkfifo(path_in(dir, "fifo_ckpt/manifest"), 0600), 0);
    write_file(path_in(dir, "fifo_ckpt/DONE"), "done\n", 5);
    expect_error(fsdp_modelfile_open(&mf, path_in(dir, "fifo_ckpt")), FSDP_STATUS_FORMAT,
                 "fifo manifest", "not a regular file", NULL);
    /* checkpoints: none complete, incomplete, a rank file missing or corrupted */
    loaded l;
    load_ok(FIXTURE_BIN, &l);
    ck_assert_int_eq(fsdp_modelfile_write(path_in(dir, "ck"), FMT("ckpt"), &l.m,
                                          (const float *const *)l.units, FSDP_DTYPE_F32),
                     FSDP_STATUS_OK);
    mkdir(path_in(dir, "empty"), 0755);
    expect_error(fsdp_modelfile_open(&mf, path_in(dir, "empty")), FSDP_STATUS_FORMAT,
                 "empty ckpt dir", "no complete checkpoint", NULL);
    char step[512], p[600];
    ck_assert_int_eq(fsdp_ckpt_step_path(step, sizeof step, path_in(dir, "ck"), 0, ""),
                     FSDP_STATUS_OK);
    snprintf(p, sizeof p, "%s/DONE", step);
    ck_assert_int_eq(unlink(p), 0);
    expect_error(fsdp_modelfile_open(&mf, step), FSDP_STATUS_FORMAT, "no DONE", "incomplete",
                 NULL);
    write_file(p, "done\n", 5);
    ck_assert_int_eq(fsdp_modelfile_open(&mf, step), FSDP_STATUS_OK);
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_build(fsdp_modelfile_family(mf), fsdp_modelfile_config(mf), &m),
                     FSDP_STATUS_OK);
    /* the last unit's payload ends the file: master, Adam m, Adam v */
    size_t s2 = (m.units[2].numel + 1023) / 1024 * 1024;
    snprintf(p, sizeof p, "%s/rank_00000.bin", step);
    b = read_file(p, &n);
    b[n - 3 * 4 * s2 + 40] ^= 1; /* a master byte: its block checksum catches it */
    write_file(p, b, n);
    fsdp_status st = fsdp_modelfile_bind(mf, &m);
    float *all = malloc(m.units[2].numel * sizeof *all);
    if (st == FSDP_STATUS_OK)
        st = fsdp_modelfile_read_range(mf, 2, 0, m.units[2].numel, all);
    expect_error(st, FSDP_STATUS_FORMAT, "corrupted shard", "rank_00000.bin", "checksum", NULL);
    unlink(p);
    expect_error(fsdp_modelfile_bind(mf, &m), FSDP_STATUS_FORMAT, "missing shard",
                 "rank_00000.bin", NULL);
    fsdp_modelfile_close(mf);
    /* a model of another shape is refused before reading */
    ck_assert_int_eq(fsdp_modelfile_open(&mf, FIXTURE_ST), FSDP_STATUS_OK);
    fsdp_model other;
    ck_assert_int_eq(fsdp_model_from_spec(BYTE_SPEC, &other), FSDP_STATUS_OK);
    expect_error(fsdp_modelfile_bind(mf, &other), FSDP_STATUS_INVALID_ARG, "other model",
                 "tiny_gpt2.safetensors", NULL);
    fsdp_modelfile_close(mf);
    free(all);
    free(b);
    fsdp_model_free(&m);
    fsdp_model_free(&other);
    loaded_free(&l);
    rm_rf(dir);
}
END_TEST

/* ---- tokenizer ------------------------------------------------------------------------ */

/* 256 byte tokens, then "ab", "abc", "the" (version 2, eot = 258). */
static unsigned char *make_tokenizer(size_t *n)
{
    unsigned char *b = calloc(1, 1024 + 256 * 2 + 3 + 4 + 4);
    uint32_t h[4] = {20240328, 2, 259, 258};
    memcpy(b, h, sizeof h);
    size_t at = 1024;
    for (int i = 0; i < 256; i++) {
        b[at++] = 1;
        b[at++] = (unsigned char)i;
    }
    const char *extra[3] = {"ab", "abc", "the"};
    for (int i = 0; i < 3; i++) {
        b[at++] = (unsigned char)strlen(extra[i]);
        memcpy(b + at, extra[i], strlen(extra[i]));
        at += strlen(extra[i]);
    }
    *n = at;
    return b;
}

START_TEST(test_tokenizer)
{
    size_t n;
    unsigned char *b = make_tokenizer(&n);
    fsdp_tokenizer *t = NULL;
    ck_assert_int_eq(fsdp_tokenizer_parse(&t, "tok.bin", b, n), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_tokenizer_vocab(t), 259);
    ck_assert_int_eq(fsdp_tokenizer_eot(t), 258);
    size_t len;
    const uint8_t *s = fsdp_tokenizer_decode(t, 257, &len);
    ck_assert(s && len == 3 && !memcmp(s, "abc", 3));
    ck_assert_ptr_null(fsdp_tokenizer_decode(t, 259, &len));
    int *ids, k;
    ck_assert_int_eq(fsdp_tokenizer_encode(t, "abcab the x", &ids, &k), FSDP_STATUS_OK);
    int want[] = {257, 256, ' ', 258, ' ', 'x'};
    ck_assert_int_eq(k, 6);
    for (int i = 0; i < k; i++)
        ck_assert_int_eq(ids[i], want[i]);
    free(ids);
    fsdp_tokenizer_free(t);

    unsigned char *c = malloc(n + 8);
#define BAD(what, mutate, len_, frag)                                                   \
    do {                                                                                \
        memcpy(c, b, n);                                                                \
        mutate;                                                                         \
        expect_error(fsdp_tokenizer_parse(&t, "tok.bin", c, len_), FSDP_STATUS_FORMAT,  \
                     what, "tok.bin", frag, NULL);                                      \
        ck_assert_ptr_null(t);                                                          \
    } while (0)
    uint32_t v;
    BAD("short", (void)0, 100, "shorter");
    BAD("magic", (v = 20240327, memcpy(c, &v, 4)), n, "magic");
    BAD("version", (v = 3, memcpy(c + 4, &v, 4)), n, "version");
    BAD("vocab 0", (v = 0, memcpy(c + 8, &v, 4)), n, "declares 0");
    BAD("vocab huge", (v = 1u << 30, memcpy(c + 8, &v, 4)), n, "declares");
    BAD("eot", (v = 259, memcpy(c + 12, &v, 4)), n, "end-of-text");
    BAD("truncated", (void)0, n - 2, "token 258");
    BAD("empty token", c[1024 + 2 * 5] = 0, n, "token 5");
    BAD("long token", c[1024 + 2 * 255] = 200, n, "token 255");
    BAD("trailing", (c[n] = 1, c[n + 1] = 'z'), n + 2, "after its 259 tokens");
#undef BAD
    free(c);
    free(b);
}
END_TEST

/* ---- eval, fine-tuning, sampling -------------------------------------------------------- */

START_TEST(test_eval_equals_train_loss)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    const char *model = path_in(dir, "m.bin");
    write_init_model(model, BYTE_SPEC, 5);
    /* the trainer's first step: micro-batches 0..3 (2 devices x accum 2) */
    fsdp_train_config c;
    fsdp_train_result r;
    train_config(&c, model, 2, 1);
    c.eng.grad_accum = 2;
    train_ok(&c, &r);
    for (int N = 1; N <= 3; N++) {
        fsdp_infer_config ic;
        fsdp_infer_config_default(&ic);
        ic.backend = FSDP_BACKEND_CPU;
        ic.model_path = model;
        ic.n_ranks = N;
        ic.batch = 2;
        ic.seq = 16;
        float mean = 0, losses[4];
        fsdp_status st = fsdp_infer_eval(&ic, "synthetic", c.eng.seed, 4, &mean, losses);
        REQUIRE(st == FSDP_STATUS_OK, "eval on %d devices: %s", N, fsdp_error_msg());
        REQUIRE(!memcmp(&mean, &r.losses[0], 4), "eval on %d devices: %.9g, trainer %.9g", N,
                (double)mean, (double)r.losses[0]);
        REQUIRE(losses[0] != losses[1], "batches 0 and 1 give the same loss");
    }
    fsdp_train_result_free(&r);
    rm_rf(dir);
}
END_TEST

START_TEST(test_train_from_file_equals_same_init)
{
    /* weights written from the RNG init of seed S, loaded by every rank from
     * the file, train exactly like a run initialised from seed S */
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    const char *files[2] = {path_in(dir, "m.bin"), path_in(dir, "m.safetensors")};
    fsdp_train_config c;
    fsdp_train_result ref, r;
    train_config(&c, BYTE_SPEC, 4, 2);
    train_ok(&c, &ref);
    for (int f = 0; f < 2; f++) {
        write_init_model(files[f], BYTE_SPEC, c.eng.seed);
        fsdp_train_config cf;
        train_config(&cf, files[f], 4, 2);
        train_ok(&cf, &r);
        for (int s = 0; s < 2; s++)
            REQUIRE(!memcmp(&r.losses[s], &ref.losses[s], 4), "%s step %d: %.9g vs %.9g",
                    files[f], s, (double)r.losses[s], (double)ref.losses[s]);
        fsdp_train_result_free(&r);
    }
    fsdp_train_result_free(&ref);
    rm_rf(dir);
}
END_TEST

START_TEST(test_sample_deterministic)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    /* a briefly trained byte-level model, so greedy decoding is not flat */
    fsdp_train_config c;
    fsdp_train_result r;
    train_config(&c, BYTE_SPEC, 2, 4);
    c.ckpt_dir = path_in(dir, "ck");
    c.lr = 1e-2f;
    train_ok(&c, &r);
    fsdp_train_result_free(&r);
    const char *text = "123+456=";
    int prompt[32], n_prompt = (int)strlen(text);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (unsigned char)text[i];
    enum { NT = 24 };
    int out[4][NT];
    fsdp_infer_config ic;
    fsdp_infer_config_default(&ic);
    ic.backend = FSDP_BACKEND_CPU;
    ic.model_path = path_in(dir, "ck");
    fsdp_sample_config sc = {.prompt = prompt, .n_prompt = n_prompt, .n_tokens = NT};
    /* greedy on 1 device, twice, and on 3 devices */
    int ranks[4] = {1, 1, 3, 2};
    for (int k = 0; k < 3; k++) {
        ic.n_ranks = ranks[k];
        memset(out[k], 0xff, sizeof out[k]);
        REQUIRE(fsdp_infer_sample(&ic, &sc, out[k]) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
        for (int i = 0; i < NT; i++)
            REQUIRE(out[k][i] >= 0 && out[k][i] < 256, "token %d is %d", i, out[k][i]);
        REQUIRE(!memcmp(out[k], out[0], sizeof out[0]), "greedy run %d (%d devices) differs", k,
                ranks[k]);
    }
    /* the context window slides: a prompt longer than --seq still works */
    ic.seq = 8;
    ic.n_ranks = 1;
    REQUIRE(fsdp_infer_sample(&ic, &sc, out[3]) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ic.seq = 0;
    /* temperature: the same seed gives the same tokens on any device count */
    sc.temperature = 1.0f;
    sc.seed = 11;
    ic.n_ranks = 1;
    REQUIRE(fsdp_infer_sample(&ic, &sc, out[1]) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ic.n_ranks = 2;
    REQUIRE(fsdp_infer_sample(&ic, &sc, out[2]) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    REQUIRE(!memcmp(out[1], out[2], sizeof out[1]), "temperature sampling differs by devices");
    /* out-of-vocabulary prompts are refused */
    prompt[0] = 300;
    expect_error(fsdp_infer_sample(&ic, &sc, out[1]), FSDP_STATUS_INVALID_ARG, "bad prompt",
                 "vocabulary", NULL);
    rm_rf(dir);
}
END_TEST

/* ---- the commands ------------------------------------------------------------------------ */

#ifndef FSDP_BIN
#define FSDP_BIN "build/fsdp"
#endif

/* Run `fsdp args`; returns the exit code and the output (stdout+stderr). */
static int run_cmd(char *out, size_t n, const char *fmt, ...)
{
    char args[2048], cmd[2300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", FSDP_BIN, args);
    FILE *p = popen(cmd, "r");
    REQUIRE(p, "cannot run %s", cmd);
    size_t k = fread(out, 1, n - 1, p);
    out[k] = '\0';
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

START_TEST(test_commands)
{
    if (access(FSDP_BIN, X_OK) != 0) {
        printf("SKIP: %s not built\n", FSDP_BIN);
        return;
    }
    char dir[64], out[8192];
    make_tmpdir(dir, sizeof dir);
    int rc = run_cmd(out, sizeof out, "convert %s %s", FIXTURE_ST, path_in(dir, "a.bin"));
    REQUIRE(rc == 0 && strstr(out, "converted"), "convert: rc %d: %s", rc, out);
    size_t na, nb;
    unsigned char *a = read_file(path_in(dir, "a.bin"), &na), *b = read_file(FIXTURE_BIN, &nb);
    REQUIRE(na == nb && !memcmp(a, b, na), "fsdp convert .safetensors -> .bin differs from the "
            "reference .bin");
    free(a);
    free(b);
    rc = run_cmd(out, sizeof out, "convert %s %s --dtype bf16", FIXTURE_BIN, path_in(dir, "ck"));
    REQUIRE(rc == 2 && strstr(out, "fp32"), "bf16 checkpoint: rc %d: %s", rc, out);
    rc = run_cmd(out, sizeof out, "convert tests/fixtures/no_such.bin %s", path_in(dir, "x.bin"));
    REQUIRE(rc == 1 && strstr(out, "no_such.bin"), "missing input: rc %d: %s", rc, out);
    rc = run_cmd(out, sizeof out, "convert %s", FIXTURE_BIN);
    REQUIRE(rc == 2, "one positional: rc %d", rc);

    write_init_model(path_in(dir, "m.bin"), BYTE_SPEC, 1);
    rc = run_cmd(out, sizeof out, "eval --model %s --data synthetic --batch 2 --seq 16 --steps 3 "
                 "--devices 2 --backend cpu", path_in(dir, "m.bin"));
    REQUIRE(rc == 0 && !strncmp(out, "mean loss ", 10), "eval: rc %d: %s", rc, out);
    float loss = strtof(out + 10, NULL);
    REQUIRE(loss > 4.0f && loss < 7.0f, "an untrained byte model should be near ln 256: %s",
            out);
    rc = run_cmd(out, sizeof out, "eval --model %s --backend cpu", path_in(dir, "m.bin"));
    REQUIRE(rc == 2 && strstr(out, "--data"), "eval without data: rc %d: %s", rc, out);
    char s1[8192], s2[8192];
    rc = run_cmd(s1, sizeof s1, "sample --model %s --prompt 'ab' --tokens 8 --backend cpu",
                 path_in(dir, "m.bin"));
    REQUIRE(rc == 0 && !strncmp(s1, "ab", 2), "sample: rc %d: %s", rc, s1);
    rc = run_cmd(s2, sizeof s2, "sample --model %s --prompt 'ab' --tokens 8 --devices 3 "
                 "--backend cpu", path_in(dir, "m.bin"));
    REQUIRE(rc == 0 && !strcmp(s1, s2), "sample on 3 devices differs: '%s' vs '%s'", s1, s2);
    rc = run_cmd(out, sizeof out, "sample --model %s --prompt 'hello' --backend cpu", FIXTURE_BIN);
    REQUIRE(rc == 2 && strstr(out, "token ids"), "text prompt, vocab 200: rc %d: %s", rc, out);
    rc = run_cmd(out, sizeof out, "sample --model %s --prompt '5,17' --tokens 4 --backend cpu",
                 FIXTURE_BIN);
    int ids[6], k = sscanf(out, "%d %d %d %d %d %d", &ids[0], &ids[1], &ids[2], &ids[3], &ids[4],
                           &ids[5]);
    REQUIRE(rc == 0 && k == 6 && ids[0] == 5 && ids[1] == 17, "token ids: rc %d: %s", rc, out);
    rc = run_cmd(out, sizeof out, "train --model %s --steps 1 --devices 2 --batch 2 --seq 16 "
                 "--eval 0 --backend cpu --quiet", path_in(dir, "m.bin"));
    REQUIRE(rc == 0 && strstr(out, "final loss"), "train --model FILE: rc %d: %s", rc, out);
    rm_rf(dir);
}
END_TEST

static Suite *convert_suite(void)
{
    Suite *s = suite_create("convert");
    TCase *tc = tcase_create("files");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fixture_safetensors_equals_llmc);
    tcase_add_test(tc, test_range_reads_match_whole);
    tcase_add_test(tc, test_export_matches_reference_layout);
    tcase_add_test(tc, test_safetensors_variants);
    tcase_add_test(tc, test_roundtrip_ckpt_bin_ckpt);
    tcase_add_test(tc, test_roundtrip_ckpt_safetensors_ckpt);
    tcase_add_test(tc, test_converted_ckpt_resumes);
    tcase_add_test(tc, test_hostile_safetensors_framing);
    tcase_add_test(tc, test_hostile_safetensors_tensors);
    tcase_add_test(tc, test_hostile_model_files);
    tcase_add_test(tc, test_tokenizer);
    suite_add_tcase(s, tc);
    tc = tcase_create("infer");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_eval_equals_train_loss);
    tcase_add_test(tc, test_train_from_file_equals_same_init);
    tcase_add_test(tc, test_sample_deterministic);
    tcase_add_test(tc, test_commands);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(convert_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
