/*
 * model_files_util.h - what the model-file suites (test_convert.c,
 * test_safetensors.c, test_compat.c) share: temporary directories, whole-file I/O, a
 * model read whole through the weight-format table, the fixtures, a tiny
 * training configuration and error expectations. Static functions: each
 * suite compiles the ones it uses.
 */
#ifndef FSDP_TESTS_MODEL_FILES_UTIL_H
#define FSDP_TESTS_MODEL_FILES_UTIL_H

#include <check.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/modelfile.h"
#include "core/bf16.h"
#include "core/error.h"
#include "model_rig.h"
#include "testutil.h"
#include "train/infer.h"
#include "train/train.h"
#include "train_util.h"

#define UTIL static __attribute__((unused))

#define FIXTURE_ST "tests/fixtures/tiny_gpt2.safetensors"
#define FIXTURE_BIN "tests/fixtures/tiny_gpt2.bin"
/* a byte-level GPT-2 small enough for training runs in a test */
#define BYTE_SPEC "custom:layers=2,heads=2,channels=32,vocab=256,context=16"


/* "dir/name" in one of 8 rotating buffers: for immediate use */
UTIL char *path_in(const char *dir, const char *name)
{
    static char bufs[8][512];
    static int k;
    char *p = bufs[k++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

/* The whole file, NUL-terminated (text files can be used as strings). */
UTIL unsigned char *read_file(const char *path, size_t *n)
{
    return (unsigned char *)fsdp_test_read_file(path, n);
}

UTIL void write_file(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "cannot create %s", path);
    REQUIRE(fwrite(b, 1, n, f) == n, "short write of %s", path);
    fclose(f);
}

#define FMT(name) fsdp_modelfile_format_find(name)

/* A model and its whole parameters in host memory. */
typedef struct loaded {
    fsdp_model m;
    float **units;
    char kind_dtype[16];
} loaded;

UTIL void loaded_free(loaded *l)
{
    for (int u = 0; u < l->m.n_units; u++)
        free(l->units[u]);
    free(l->units);
    fsdp_model_free(&l->m);
}

/* Open any model file and read all of it through the range reader. */
UTIL fsdp_status load(const char *path, loaded *l)
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

UTIL void load_ok(const char *path, loaded *l)
{
    fsdp_status st = load(path, l);
    REQUIRE(st == FSDP_STATUS_OK, "loading %s: %s", path, fsdp_error_msg());
}

/* First differing element of two models' units, or -1. */
UTIL long units_diff(const fsdp_model *m, float *const *a, float *const *b, int *unit)
{
    for (int u = 0; u < m->n_units; u++)
        for (size_t i = 0; i < m->units[u].numel; i++)
            if (memcmp(&a[u][i], &b[u][i], 4)) {
                *unit = u;
                return (long)i;
            }
    return -1;
}

UTIL void require_same(const loaded *a, const loaded *b, const char *what)
{
    REQUIRE(!strcmp(a->m.name, b->m.name), "%s: model %s vs %s", what, a->m.name, b->m.name);
    int u = -1;
    long i = units_diff(&a->m, a->units, b->units, &u);
    REQUIRE(i < 0, "%s: unit %d element %ld differs: %.9g vs %.9g", what, u, i,
            i < 0 ? 0.0 : (double)a->units[u][i], i < 0 ? 0.0 : (double)b->units[u][i]);
}

/* Write a model of `spec` with parameters from the model's own RNG init. */
UTIL void write_init_model(const char *path, const char *spec, uint64_t seed)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec(spec, &m), FSDP_STATUS_OK);
    float **units = units_init(&m, seed);
    fsdp_status st = fsdp_modelfile_write(path, fsdp_modelfile_format_of(path), &m,
                                          (const float *const *)units, FSDP_DTYPE_F32);
    REQUIRE(st == FSDP_STATUS_OK, "writing %s: %s", path, fsdp_error_msg());
    units_free(&m, units);
    fsdp_model_free(&m);
}

/* l's parameters written to path in weight format fmt (a name in the
 * format table) and dtype dt; the write must succeed. */
UTIL void write_loaded(const char *path, const char *fmt, const loaded *l, fsdp_dtype dt)
{
    fsdp_status st =
        fsdp_modelfile_write(path, FMT(fmt), &l->m, (const float *const *)l->units, dt);
    REQUIRE(st == FSDP_STATUS_OK, "writing %s as %s: %s", path, fmt, fsdp_error_msg());
}

/* src exported to path in format fmt as bf16 reads back as bf16 (into
 * *out, which the caller frees) holding every value rounded to nearest
 * even, bit for bit; a failure names `what` and the element. */
UTIL void expect_bf16_export(const char *path, const char *fmt, const loaded *src, loaded *out,
                             const char *what)
{
    write_loaded(path, fmt, src, FSDP_DTYPE_BF16);
    load_ok(path, out);
    ck_assert_str_eq(out->kind_dtype, "bf16");
    for (int u = 0; u < src->m.n_units; u++)
        for (size_t i = 0; i < src->m.units[u].numel; i++) {
            float want = fsdp_bf16_to_f32(fsdp_f32_to_bf16(src->units[u][i]));
            REQUIRE(!memcmp(&want, &out->units[u][i], 4), "%s unit %d element %zu", what, u, i);
        }
}

/* Inference on the cpu from the model file at path on `devices` ranks,
 * batches of 2 sequences of 16 tokens. */
UTIL void infer_config_cpu(fsdp_infer_config *ic, const char *path, int devices)
{
    fsdp_infer_config_default(ic);
    ic->backend = FSDP_BACKEND_CPU;
    ic->model_path = path;
    ic->n_ranks = devices;
    ic->batch = 2;
    ic->seq = 16;
}

UTIL void train_config(fsdp_train_config *c, const char *model, int devices, int steps)
{
    train_config_cpu(c, model, devices);
    c->eng.batch = 2;
    c->eng.deterministic = true;
    c->steps = steps;
    c->warmup = 1;
    c->n_samples = 0;
}

/* Expect a failure with `want` status whose message holds every fragment. */
UTIL void expect_error(fsdp_status st, fsdp_status want, const char *ctx, ...)
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

#endif /* FSDP_TESTS_MODEL_FILES_UTIL_H */
