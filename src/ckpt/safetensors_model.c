/*
 * safetensors_model.c - safetensors files as a weight format: which model
 * a file holds, where each parameter is, and export (safetensors.h).
 *
 * Everything about names is the family's mapping (models/weights.h): the
 * family reads its config from the tensors, and the tensors are then held
 * against the model built from it, one by one, so a file is either exactly
 * that model's parameters (plus tensors the family skips) or a FORMAT
 * error naming the first tensor that is not.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/bnb4.h"
#include "ckpt/safetensors.h"
#include "core/bf16.h"
#include "core/fileio.h"
#include "core/log.h"

#define ST_CHUNK 65536 /* elements converted per write */

static void fmt_shape(char *buf, size_t n, int ndim, const uint64_t *d)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRIu64, i ? ", " : "", d[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

static int n_params(const fsdp_model *m)
{
    int n = 0;
    for (int u = 0; u < m->n_units; u++)
        n += m->units[u].n_params;
    return n;
}

/* ---- which model ---------------------------------------------------------------- */

/* The first family whose mapping reads a config from f. */
static fsdp_status find_config(const fsdp_st_file *f, const fsdp_model_family **family,
                               char *config, size_t size)
{
    fsdp_file_tensor *t = calloc((size_t)f->n_tensors + 1, sizeof *t);
    if (!t)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", f->path);
    for (int i = 0; i < f->n_tensors; i++)
        t[i] = (fsdp_file_tensor){f->tensors[i].name, f->tensors[i].ndim, f->tensors[i].shape};
    fsdp_file_tensors ft = {.n = f->n_tensors, .t = t, .n_meta = f->n_meta,
                            .meta_key = (const char *const *)f->meta_key,
                            .meta_val = (const char *const *)f->meta_val};
    char first[FSDP_ERROR_MSG_MAX] = "";
    fsdp_status st = FSDP_STATUS_FORMAT;
    for (int i = 0; i < fsdp_model_family_count() && st != FSDP_STATUS_OK; i++) {
        const fsdp_model_family *fam = fsdp_model_family_at(i);
        if (!fam->safetensors)
            continue;
        st = fam->safetensors->config(&ft, config, size);
        if (st == FSDP_STATUS_OK)
            *family = fam;
        else if (!first[0])
            snprintf(first, sizeof first, "%s", fsdp_error_msg());
    }
    free(t);
    if (st != FSDP_STATUS_OK)
        return fsdp_st_error(f->path, "%s",
                             first[0] ? first : "no model family reads safetensors files");
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_st_locate(const fsdp_st_file *files, int n_files, const char *label,
                           const char *prefix, const fsdp_model *m, fsdp_tensor_src *src)
{
    return fsdp_st_locate_bnb4(files, n_files, label, prefix, m, NULL, src);
}

/* Where parameter idx of unit `unit` (p) lives: tensor t of file fi (f), or
 * the bnb-4bit weight qt (role: its index in the bnb4 set) that t's name
 * stands for; FORMAT if its shape or dtype does not fit p. */
static fsdp_status place_tensor(const fsdp_st_file *f, int fi, const fsdp_st_tensor *t,
                                const fsdp_model *m, const fsdp_safetensors_mapping *map,
                                int unit, int idx, const fsdp_param_spec *p,
                                const fsdp_bnb4_tensor *qt, int role, fsdp_tensor_src *out)
{
    fsdp_weight_tensor want;
    map->tensor(m, unit, idx, &want);
    int ndim = qt ? qt->ndim : t->ndim;
    const uint64_t *shape = qt ? qt->shape : t->shape;
    bool same = ndim == want.ndim && !(qt && want.transposed);
    for (int d = 0; same && d < want.ndim; d++)
        same = shape[d] == want.shape[d];
    if (!same) {
        char a[128], b[96];
        fmt_shape(a, sizeof a, ndim, shape);
        fmt_shape(b, sizeof b, want.ndim, want.shape);
        return fsdp_st_error(f->path, "tensor '%.80s' has shape %s%s, but model '%s' "
                             "needs %s", t->name, a, qt ? " (its quant_state's)" : "",
                             m->name, b);
    }
    if (qt) {
        *out = (fsdp_tensor_src){
            .file_numel = qt->numel,
            .rows = (uint64_t)p->shape[0],
            .cols = p->ndim == 2 ? (uint64_t)p->shape[1] : 1,
            .part = qt->codes_part,
            .nf4 = role + 1,
        };
        return FSDP_STATUS_OK;
    }
    if (t->dtype == FSDP_FILE_OTHER)
        return fsdp_st_error(f->path, "tensor '%.80s' is %s; fsdp imports F32, BF16 and "
                             "F16 weights", t->name, t->dtype_name);
    FSDP_ASSERT(want.stored_numel == t->numel && t->numel <= p->numel &&
                (!want.transposed || t->numel == p->numel));
    *out = (fsdp_tensor_src){
        .offset = f->data_offset + t->begin,
        .dtype = t->dtype,
        .file_numel = t->numel,
        .transposed = want.transposed,
        .rows = (uint64_t)p->shape[0],
        .cols = p->ndim == 2 ? (uint64_t)p->shape[1] : 1,
        .part = fi,
    };
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_st_locate_bnb4(const fsdp_st_file *files, int n_files, const char *label,
                                const char *prefix, const fsdp_model *m,
                                const struct fsdp_bnb4 *q, fsdp_tensor_src *src)
{
    const fsdp_safetensors_mapping *map = m->family ? m->family->safetensors : NULL;
    if (!map)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s: model '%s' has no safetensors names",
                              label, m->name);
    int n = n_params(m);
    int *base = calloc((size_t)m->n_units + 1, sizeof *base);
    /* per parameter: the file and tensor that hold it */
    const fsdp_st_tensor **from = calloc((size_t)n + 1, sizeof *from);
    int *from_file = calloc((size_t)n + 1, sizeof *from_file);
    fsdp_status st = FSDP_STATUS_OK;
    if (!base || !from || !from_file) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading %s", label);
        goto done;
    }
    for (int u = 1; u <= m->n_units; u++)
        base[u] = base[u - 1] + m->units[u - 1].n_params;
    for (int fi = 0; fi < n_files && st == FSDP_STATUS_OK; fi++) {
        const fsdp_st_file *f = &files[fi];
        for (int i = 0; i < f->n_tensors && st == FSDP_STATUS_OK; i++) {
            const fsdp_st_tensor *t = &f->tensors[i];
            int role = q ? fsdp_bnb4_role(q, t->name) : -1;
            if (role == -2)
                continue; /* a quantized weight's absmax, maps or state: bnb4.c checked it */
            const fsdp_bnb4_tensor *qt = role >= 0 ? &q->t[role] : NULL;
            char pname[FSDP_WEIGHT_NAME_MAX];
            fsdp_weight_match what = map->match(t->name, pname, sizeof pname);
            if (what == FSDP_WEIGHT_IGNORED)
                continue;
            if (what != FSDP_WEIGHT_PARAM) {
                st = fsdp_st_error(f->path, "tensor '%.80s' is not a %s parameter (expected %s)",
                                   t->name, m->family->title, map->examples);
                break;
            }
            int unit = -1;
            const fsdp_param_spec *p = fsdp_model_find_param(m, pname, &unit);
            if (!p) {
                st = fsdp_st_error(f->path, "tensor '%.80s' (parameter '%s') is not part of "
                                   "model '%s'", t->name, pname, m->name);
                break;
            }
            int idx = (int)(p - m->units[unit].params), k = base[unit] + idx;
            if (from[k]) {
                st = fsdp_st_error(f->path, "tensors '%.80s'%s%s and '%.80s' are both "
                                   "parameter '%s'", from[k]->name,
                                   from_file[k] != fi ? " of " : "",
                                   from_file[k] != fi ? files[from_file[k]].path : "", t->name,
                                   p->name);
                break;
            }
            from[k] = t;
            from_file[k] = fi;
            st = place_tensor(f, fi, t, m, map, unit, idx, p, qt, role, &src[k]);
        }
    }
    for (int u = 0; u < m->n_units && st == FSDP_STATUS_OK; u++)
        for (int i = 0; i < m->units[u].n_params && st == FSDP_STATUS_OK; i++)
            if (!from[base[u] + i]) {
                fsdp_weight_tensor want;
                map->tensor(m, u, i, &want);
                st = fsdp_error_set(FSDP_STATUS_FORMAT, "%s: tensor '%s%s' (parameter '%s') is "
                                    "missing", label, prefix ? prefix : "", want.name,
                                    m->units[u].params[i].name);
            }
done:
    free(from_file);
    free(from);
    free(base);
    return st;
}

/* The file's model and, optionally, where its parameters are (*src, owned). */
static fsdp_status model_of(const fsdp_st_file *f, fsdp_model *m, fsdp_tensor_src **src)
{
    const fsdp_model_family *fam = NULL;
    char config[FSDP_MODEL_CONFIG_MAX];
    memset(m, 0, sizeof *m);
    FSDP_TRY(find_config(f, &fam, config, sizeof config));
    FSDP_TRY(fsdp_modelfile_build("safetensors file", f->path, fam, config, m));
    fsdp_tensor_src *s = calloc((size_t)n_params(m) + 1, sizeof *s);
    char label[FSDP_CKPT_PATH_MAX + 32];
    snprintf(label, sizeof label, "safetensors file '%s'", f->path);
    fsdp_status st = s ? fsdp_st_locate(f, 1, label, NULL, m, s)
                       : fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'",
                                        f->path);
    if (st != FSDP_STATUS_OK || !src)
        free(s);
    if (st != FSDP_STATUS_OK)
        fsdp_model_free(m);
    else if (src)
        *src = s;
    return st;
}

fsdp_status fsdp_st_model(const fsdp_st_file *f, fsdp_model *m) { return model_of(f, m, NULL); }

/* ---- the format ------------------------------------------------------------------ */

static fsdp_status st_open(fsdp_modelfile *mf, const char *path)
{
    FSDP_TRY(fsdp_modelfile_set_path(mf, path));
    FSDP_TRY(fsdp_modelfile_impl_alloc(mf, sizeof(fsdp_st_file)));
    fsdp_st_file *f = mf->impl;
    FSDP_TRY(fsdp_st_open(path, f));
    fsdp_model m;
    fsdp_tensor_src *src = NULL;
    FSDP_TRY(model_of(f, &m, &src));
    /* how the parameters are stored */
    static const char *const names[] = {"fp32", "bf16", "fp16"};
    int n = n_params(&m);
    mf->dtype_name = n ? names[src[0].dtype] : "fp32";
    for (int k = 1; k < n; k++)
        if (src[k].dtype != src[0].dtype)
            mf->dtype_name = "mixed";
    mf->family = m.family;
    snprintf(mf->config, sizeof mf->config, "%s", m.config);
    free(src);
    fsdp_model_free(&m);
    mf->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (mf->fd < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(mf->fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != f->file_bytes)
        return fsdp_error_set(FSDP_STATUS_IO, "safetensors file '%s' changed while it was "
                              "opened", path);
    return FSDP_STATUS_OK;
}

static fsdp_status st_bind(fsdp_modelfile *mf, const fsdp_model *m)
{
    FSDP_TRY(fsdp_flat_prepare(mf, m));
    char label[FSDP_CKPT_PATH_MAX + 32];
    snprintf(label, sizeof label, "safetensors file '%s'", mf->path);
    return fsdp_st_locate(mf->impl, 1, label, NULL, m, mf->src);
}

static void st_close(fsdp_modelfile *mf)
{
    fsdp_st_free(mf->impl);
    free(mf->impl);
    mf->impl = NULL;
}

/* Writes n fp32 values as dt into f, converting through buf (ST_CHUNK). */
static bool put_values(FILE *f, const float *x, size_t n, fsdp_dtype dt, uint16_t *buf)
{
    if (dt == FSDP_DTYPE_F32)
        return fwrite(x, 4, n, f) == n;
    while (n > 0) {
        size_t k = n < ST_CHUNK ? n : ST_CHUNK;
        for (size_t i = 0; i < k; i++)
            buf[i] = fsdp_f32_to_bf16(x[i]);
        if (fwrite(buf, 2, k, f) != k)
            return false;
        x += k;
        n -= k;
    }
    return true;
}

uint64_t fsdp_st_out_bytes(const fsdp_model *m, const fsdp_st_out *o, fsdp_dtype dt)
{
    fsdp_weight_tensor t;
    m->family->safetensors->tensor(m, o->unit, o->param, &t);
    return t.stored_numel * fsdp_dtype_size(dt);
}

/* The header: metadata, then the tensors in the order given (their data
 * follows in the same order). *max_rows: the most rows of a transposed
 * parameter, for the writer's staging row. */
static fsdp_status st_header(const fsdp_model *m, const fsdp_st_out *out, int n_out,
                             const char *dname, size_t esz, char (*key)[64], char (*val)[64],
                             int n_meta, fsdp_sbuf *h, size_t *max_rows)
{
    const fsdp_safetensors_mapping *map = m->family->safetensors;
    fsdp_sbuf_printf(h, "{\"__metadata__\":{");
    for (int i = 0; i < n_meta; i++)
        fsdp_sbuf_printf(h, "%s\"%s\":\"%s\"", i ? "," : "", key[i], val[i]);
    fsdp_sbuf_printf(h, "}");
    uint64_t at = 0;
    *max_rows = 1;
    for (int k = 0; k < n_out; k++) {
        const fsdp_param_spec *p = &m->units[out[k].unit].params[out[k].param];
        fsdp_weight_tensor t;
        map->tensor(m, out[k].unit, out[k].param, &t);
        if (t.transposed && (size_t)p->shape[0] > *max_rows)
            *max_rows = (size_t)p->shape[0];
        fsdp_sbuf_printf(h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", out[k].name, dname);
        for (int d = 0; d < t.ndim; d++)
            fsdp_sbuf_printf(h, "%s%" PRIu64, d ? "," : "", t.shape[d]);
        fsdp_sbuf_printf(h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", at,
                         at + t.stored_numel * esz);
        at += t.stored_numel * esz;
    }
    fsdp_sbuf_printf(h, "}");
    while (!h->oom && h->n % 8) /* pad with spaces so the data section is 8-aligned */
        fsdp_sbuf_printf(h, " ");
    return h->oom ? fsdp_error_set(FSDP_STATUS_OOM, "out of host memory") : FSDP_STATUS_OK;
}

fsdp_status fsdp_st_write_tensors(const char *path, const fsdp_model *m,
                                  const float *const *units, fsdp_dtype dt,
                                  const fsdp_st_out *out, int n_out, char (*key)[64],
                                  char (*val)[64], int n_meta)
{
    const fsdp_safetensors_mapping *map = m->family->safetensors;
    if (!map)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s models have no safetensors names; "
                              "write '%s' as another format", m->family->title, path);
    if (dt != FSDP_DTYPE_F32 && dt != FSDP_DTYPE_BF16)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "safetensors export writes F32 or BF16, not dtype %d", (int)dt);
    size_t esz = fsdp_dtype_size(dt), max_rows;
    const char *dname = dt == FSDP_DTYPE_F32 ? "F32" : "BF16";
    fsdp_sbuf h = {0};
    fsdp_status st = st_header(m, out, n_out, dname, esz, key, val, n_meta, &h, &max_rows);
    fsdp_atomic_file af = {0};
    uint16_t *buf = malloc(ST_CHUNK * sizeof *buf);
    float *row = malloc(max_rows * sizeof *row);
    if (st != FSDP_STATUS_OK || !buf || !row) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing '%s'", path);
        goto fail;
    }
    FSDP_CHECK(fsdp_atomic_open(&af, path, "safetensors file"));
    FILE *f = af.f;
    uint64_t hn = h.n;
    bool ok = fwrite(&hn, 8, 1, f) == 1 && fwrite(h.p, 1, h.n, f) == h.n;
    for (int k = 0; ok && k < n_out; k++) {
        int u = out[k].unit, i = out[k].param;
        const fsdp_param_spec *p = &m->units[u].params[i];
        const float *x = units[u] + p->offset;
        fsdp_weight_tensor t;
        map->tensor(m, u, i, &t);
        if (!t.transposed) {
            ok = put_values(f, x, (size_t)t.stored_numel, dt, buf);
            continue;
        }
        /* fsdp (R, K) -> file (K, R): one file row at a time */
        size_t R = (size_t)p->shape[0], K = (size_t)p->shape[1];
        for (size_t c = 0; ok && c < K; c++) {
            for (size_t r = 0; r < R; r++)
                row[r] = x[r * K + c];
            ok = put_values(f, row, R, dt, buf);
        }
    }
    FSDP_CHECK(fsdp_atomic_commit(&af, ok));
fail:
    fsdp_atomic_abort(&af);
    free(row);
    free(buf);
    free(h.p);
    return st;
}

/* A single file: every parameter in model order under the mapping's names,
 * with the family's metadata (which a directory's config.json would
 * otherwise hold). */
static fsdp_status st_write(const char *path, const fsdp_model *m, const float *const *units,
                            const fsdp_modelfile_write_opts *o)
{
    const fsdp_safetensors_mapping *map = m->family->safetensors;
    if (!map)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s models have no safetensors names; "
                              "write '%s' as another format", m->family->title, path);
    int n = n_params(m), k = 0;
    fsdp_st_out *out = calloc((size_t)n + 1, sizeof *out);
    if (!out)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing '%s'", path);
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++, k++) {
            fsdp_weight_tensor t;
            map->tensor(m, u, i, &t);
            out[k] = (fsdp_st_out){.unit = u, .param = i};
            snprintf(out[k].name, sizeof out[k].name, "%s", t.name);
        }
    char key[16][64], val[16][64];
    int n_meta = map->metadata(m, key, val, 16);
    fsdp_status st = fsdp_st_write_tensors(path, m, units, o->dtype, out, n, key, val, n_meta);
    free(out);
    if (st == FSDP_STATUS_OK)
        FSDP_INFO(FSDP_SUB_CKPT, "wrote '%s' (%s, %zu parameters) from model '%s'", path,
                  fsdp_dtype_name(o->dtype), m->numel, m->name);
    return st;
}

const fsdp_modelfile_format fsdp_format_safetensors = {
    /* .short_name = */ "safetensors",
    /* .name       = */ "safetensors file",
    /* .help       = */ "FILE.safetensors (Hugging Face)",
    /* .suffix     = */ ".safetensors",
    /* .bf16       = */ true,
    /* .ships_tokenizer = */ false,
    /* .note       = */ NULL,
    /* .claims     = */ NULL, /* by the suffix */
    /* .open       = */ st_open,
    /* .bind       = */ st_bind,
    /* .read_range = */ NULL, /* the flat reader */
    /* .close      = */ st_close,
    /* .write      = */ st_write,
};
