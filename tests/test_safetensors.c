/*
 * test_safetensors.c - Hugging Face safetensors files through the
 * "safetensors" weight format and GPT-2's HF mapping: the layout against a
 * reference file written independently (tools/gen_safetensors_fixture.py:
 * HF names, Conv1D transposes, unpadded wte), equal to the llm.c fixture,
 * range reads against whole reads, export in HF's layout, dtype variants
 * (F16, BF16, "transformer." names, buffers that are skipped, heads from
 * the metadata or channels / 64), and hostile headers and tensors refused
 * with messages naming the file and the tensor.
 *
 * Runs from the repository root (fixtures in tests/fixtures). Each test
 * works in a directory of its own in the suite's scratch directory
 * (testutil.h), removed even when a test fails.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ckpt/modelfile.h"
#include "ckpt/safetensors.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/rng.h"
#include "model_files_util.h"
#include "model_rig.h"
#include "models/gpt2.h"
#include "testutil.h"

/* Metadata value of a parsed safetensors file, or NULL. */
static const char *st_meta(const fsdp_st_file *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_key[i], key))
            return f->meta_val[i];
    return NULL;
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
    char dir[128], *out;
    fsdp_test_mkdir(dir, sizeof dir, "files");
    out = path_in(dir, "export.safetensors");
    loaded l;
    load_ok(FIXTURE_BIN, &l);
    write_loaded(out, "safetensors", &l, FSDP_DTYPE_F32);
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
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
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
    expect_bf16_export(path_in(dir, "bf16.safetensors"), "safetensors", &ref, &l, "bf16");
    loaded_free(&l);

    /* no n_head metadata: heads = channels / 64 */
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("custom:layers=1,heads=4,channels=64,vocab=8,"
                                          "context=4", &m),
                     FSDP_STATUS_OK);
    float **units = units_init(&m, 3);
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
    units_free(&m, units);
    fsdp_model_free(&m);
    loaded_free(&ref);
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

/* Peak resident memory of this process so far, in bytes. */
static size_t max_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss * 1024;
}

/* Write a safetensors file whose header is `open`, then `item` repeated
 * until the header has about `bytes` bytes (comma-separated), then
 * `close`: made in pieces, never held whole. Returns the header's size. */
static uint64_t write_big_header(const char *path, const char *open, const char *item,
                                 const char *close, size_t bytes)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "cannot create %s", path);
    size_t ni = strlen(item) + 1, n = (bytes - strlen(open) - strlen(close)) / ni;
    uint64_t len = strlen(open) + n * ni - 1 + strlen(close);
    char chunk[1 << 16];
    size_t per = sizeof chunk / ni, k = 0;
    fwrite(&len, 8, 1, f);
    fputs(open, f);
    for (size_t i = 0; i < n; i += per) {
        size_t m = n - i < per ? n - i : per;
        k = 0;
        for (size_t j = 0; j < m; j++)
            k += (size_t)snprintf(chunk + k, sizeof chunk - k, "%s%s", i + j ? "," : "", item);
        REQUIRE(fwrite(chunk, 1, k, f) == k, "short write of %s", path);
    }
    fputs(close, f);
    fclose(f);
    return len;
}

/* Issue 15 item 13: a header of tens of MiB made of empty arrays (or of
 * tiny members) is refused with memory of about the header's own size,
 * not the tens of times a JSON tree of it costs. */
START_TEST(test_hostile_header_memory)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    const size_t MB32 = (size_t)32 << 20;
    struct {
        const char *name, *open, *item, *close, *msg;
    } cases[] = {
        {"arrays.safetensors", "{\"a\":[", "[]", "]}", "4096"},
        {"members.safetensors", "{", "\"t\":[]", "}", "not an object"},
        {"meta.safetensors", "{\"__metadata__\":{", "\"k\":[]", "}}", "must be strings"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = path_in(dir, cases[i].name);
        uint64_t hn = write_big_header(p, cases[i].open, cases[i].item, cases[i].close, MB32);
        size_t before = max_rss();
        fsdp_st_file f;
        expect_error(fsdp_st_open(p, &f), FSDP_STATUS_FORMAT, cases[i].name, cases[i].name,
                     cases[i].msg, NULL);
        size_t grew = max_rss() > before ? max_rss() - before : 0;
        /* the header itself is read into memory once; under a sanitizer
         * its shadow memory (and ASan's quarantine) comes on top, so the
         * peak is only held to that without one */
        REQUIRE(grew < 2 * hn || FSDP_TEST_ASAN || FSDP_TEST_TSAN, "%s: parsing a %llu-byte "
                "header raised the peak RSS by %zu bytes", cases[i].name,
                (unsigned long long)hn, grew);
        unlink(p);
    }
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"layout", 120, .tmpdir = true,
         FSDP_TESTS(test_fixture_safetensors_equals_llmc, test_range_reads_match_whole,
                    test_export_matches_reference_layout, test_safetensors_variants)},
        {"hostile", 120, .tmpdir = true,
         FSDP_TESTS(test_hostile_safetensors_framing, test_hostile_safetensors_tensors,
                    test_hostile_header_memory)},
    };
    return fsdp_test_main("safetensors", tcases, FSDP_TEST_LEN(tcases));
}
