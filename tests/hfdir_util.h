/*
 * hfdir_util.h - what the Hugging Face directory suites (test_hfdir.c,
 * test_hfdir_hostile.c) share: models whose values every dtype holds
 * exactly, writing them as directories, file comparisons, and directories
 * built by hand (any dtype per tensor, any file, any name), the raw
 * material of the hostile cases. Static functions: each suite compiles the
 * ones it uses.
 */
#ifndef FSDP_TESTS_HFDIR_UTIL_H
#define FSDP_TESTS_HFDIR_UTIL_H

#include <sys/stat.h>

#include "ckpt/hfdir.h"
#include "core/bf16.h"
#include "core/fileio.h"
#include "model_files_util.h"

#define HF_FIXTURE "tests/fixtures/hf_gpt2"
/* vocab 300: wte has 84 zero pad rows fsdp keeps and the file does not */
#define SPEC "gpt2:layers=2,heads=2,channels=32,vocab=300,context=16"

/* ---- models with values every dtype holds exactly ------------------------------- */

/* k/128 with |k| < 256: exact in F32, BF16 and F16, different between
 * neighbours (a missed transpose or offset shows). Pad rows stay 0. */
UTIL void quantized(const char *spec, loaded *l)
{
    memset(l, 0, sizeof *l);
    ck_assert_int_eq(fsdp_model_from_spec(spec, &l->m), FSDP_STATUS_OK);
    l->units = calloc((size_t)l->m.n_units, sizeof *l->units);
    for (int u = 0; u < l->m.n_units; u++) {
        size_t n = l->m.units[u].numel;
        l->units[u] = malloc(n * sizeof(float));
        fsdp_model_init_range(&l->m, u, 0, n, 7, l->units[u]);
        for (size_t i = 0; i < n; i++)
            l->units[u][i] = (float)((int)(l->units[u][i] * 4096.0f) % 255) / 128.0f;
    }
    const fsdp_param_spec *wte = fsdp_model_find_param(&l->m, "wte.weight", NULL);
    size_t C = (size_t)wte->shape[1];
    for (size_t i = (size_t)l->m.vocab_size * C; i < wte->numel; i++)
        l->units[0][wte->offset + i] = 0.0f;
}

UTIL fsdp_status write_hf(const char *path, const loaded *l, fsdp_dtype dt, uint64_t shard,
                            const char *companions, const char *tokenizer)
{
    fsdp_modelfile_write_opts o = {.dtype = dt, .shard_bytes = shard, .companions = companions,
                                   .tokenizer = tokenizer};
    return fsdp_modelfile_write_with(path, FMT("hf"), &l->m, (const float *const *)l->units, &o);
}

UTIL void write_hf_ok(const char *path, const loaded *l, fsdp_dtype dt, uint64_t shard)
{
    fsdp_status st = write_hf(path, l, dt, shard, NULL, NULL);
    REQUIRE(st == FSDP_STATUS_OK, "writing %s: %s", path, fsdp_error_msg());
}

UTIL bool exists(const char *p)
{
    struct stat sb;
    return lstat(p, &sb) == 0;
}

UTIL bool same_file(const char *a, const char *b)
{
    size_t na, nb;
    unsigned char *x = read_file(a, &na), *y = read_file(b, &nb);
    bool same = na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

/* ---- hand-built directories: mixed dtypes and hostile ones ------------------------------ */

typedef struct tdesc {
    char name[96];
    char dtype[8];
    int ndim;
    uint64_t shape[2];
    unsigned char *data;
    size_t bytes;
    int file;
} tdesc;

typedef struct tdir {
    tdesc t[40];
    int n, n_files;
    char config[2048];
} tdir;

UTIL uint16_t f32_to_f16(float f) /* exact for the quantized values */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    if (exp == 0)
        return (uint16_t)sign;
    int e = (int)exp - 127 + 15;
    if (e <= 0) /* subnormal in f16 */
        return (uint16_t)(sign | ((man | 0x800000) >> (14 - e)));
    return (uint16_t)(sign | ((uint32_t)e << 10) | (man >> 13));
}

/* The model's tensors as an HF file holds them, in `n_files` files (tensor
 * k in file k % n_files), tensor k stored as dtypes[k % n_dtypes]. */
UTIL void tdir_from(tdir *d, const loaded *l, int n_files, const char *const *dtypes,
                      int n_dtypes)
{
    memset(d, 0, sizeof *d);
    d->n_files = n_files;
    const fsdp_safetensors_mapping *map = l->m.family->safetensors;
    fsdp_sbuf cfg = {0};
    ck_assert_int_eq(map->hf_config_write(&l->m, "float32", &cfg), FSDP_STATUS_OK);
    snprintf(d->config, sizeof d->config, "%s", cfg.p);
    free(cfg.p);
    for (int u = 0; u < l->m.n_units; u++)
        for (int i = 0; i < l->m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &l->m.units[u].params[i];
            fsdp_weight_tensor w;
            map->tensor(&l->m, u, i, &w);
            tdesc *t = &d->t[d->n];
            snprintf(t->name, sizeof t->name, "%s%s", map->hf_prefix, w.name);
            snprintf(t->dtype, sizeof t->dtype, "%s", dtypes[d->n % n_dtypes]);
            t->ndim = w.ndim;
            for (int k = 0; k < w.ndim; k++)
                t->shape[k] = w.shape[k];
            t->file = d->n % n_files;
            int esz = !strcmp(t->dtype, "F32") ? 4 : 2;
            t->bytes = (size_t)w.stored_numel * (size_t)esz;
            t->data = malloc(t->bytes + 1);
            const float *x = l->units[u] + p->offset;
            size_t R = (size_t)p->shape[0], K = p->ndim == 2 ? (size_t)p->shape[1] : 1;
            for (size_t e = 0; e < w.stored_numel; e++) {
                /* file element e: fsdp's (e % R, e / R) when transposed */
                float v = w.transposed ? x[(e % R) * K + e / R] : x[e];
                uint16_t h = !strcmp(t->dtype, "BF16") ? fsdp_f32_to_bf16(v) : f32_to_f16(v);
                memcpy(t->data + e * (size_t)esz, esz == 4 ? (void *)&v : (void *)&h,
                       (size_t)esz);
            }
            d->n++;
        }
}

UTIL void tdir_free(tdir *d)
{
    for (int i = 0; i < d->n; i++)
        free(d->t[i].data);
}

UTIL tdesc *tfind(tdir *d, const char *name)
{
    for (int i = 0; i < d->n; i++)
        if (!strcmp(d->t[i].name, name))
            return &d->t[i];
    ck_abort_msg("no tensor %s", name);
    return NULL;
}

UTIL void tdrop(tdir *d, const char *name)
{
    tdesc *t = tfind(d, name);
    free(t->data);
    *t = d->t[--d->n];
}

UTIL void file_name(char *buf, size_t n, const tdir *d, int k)
{
    if (d->n_files == 1)
        snprintf(buf, n, "model.safetensors");
    else
        snprintf(buf, n, "model-%05d-of-%05d.safetensors", k + 1, d->n_files);
}

/* Write d into the new directory dir: config.json, the files and (with
 * more than one) an index placing each tensor where d says. */
UTIL void tdir_write(const tdir *d, const char *dir)
{
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    char p[512], fname[64];
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_file(p, d->config, strlen(d->config));
    fsdp_sbuf idx = {0};
    fsdp_sbuf_printf(&idx, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int f = 0; f < d->n_files; f++) {
        fsdp_sbuf h = {0};
        uint64_t at = 0;
        fsdp_sbuf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
        for (int i = 0; i < d->n; i++) {
            const tdesc *t = &d->t[i];
            if (t->file != f)
                continue;
            fsdp_sbuf_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, t->dtype);
            for (int k = 0; k < t->ndim; k++)
                fsdp_sbuf_printf(&h, "%s%llu", k ? "," : "", (unsigned long long)t->shape[k]);
            fsdp_sbuf_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
                             (unsigned long long)(at + t->bytes));
            at += t->bytes;
        }
        fsdp_sbuf_printf(&h, "}");
        file_name(fname, sizeof fname, d, f);
        snprintf(p, sizeof p, "%s/%s", dir, fname);
        FILE *out = fopen(p, "wb");
        uint64_t hn = h.n;
        fwrite(&hn, 8, 1, out);
        fwrite(h.p, 1, h.n, out);
        for (int i = 0; i < d->n; i++)
            if (d->t[i].file == f)
                fwrite(d->t[i].data, 1, d->t[i].bytes, out);
        fclose(out);
        free(h.p);
    }
    for (int i = 0; i < d->n; i++) {
        file_name(fname, sizeof fname, d, d->t[i].file);
        fsdp_sbuf_printf(&idx, "%s\"%s\": \"%s\"", i ? ", " : "", d->t[i].name, fname);
    }
    fsdp_sbuf_printf(&idx, "}}\n");
    if (d->n_files > 1) {
        snprintf(p, sizeof p, "%s/" FSDP_HF_INDEX, dir);
        write_file(p, idx.p, idx.n);
    }
    free(idx.p);
}

/* Replace the first `from` in s (of capacity n) by `to`. */
UTIL void replace(char *s, size_t n, const char *from, const char *to)
{
    char *at = strstr(s, from);
    ck_assert_msg(at != NULL, "'%s' not in '%s'", from, s);
    size_t lf = strlen(from), lt = strlen(to), rest = strlen(at + lf);
    ck_assert(strlen(s) - lf + lt < n);
    memmove(at + lt, at + lf, rest + 1);
    memcpy(at, to, lt);
}

#endif /* FSDP_TESTS_HFDIR_UTIL_H */
