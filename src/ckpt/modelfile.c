/*
 * modelfile.c - the table of weight formats and what every format shares:
 * detection by form, open/bind/read/write dispatch, the range read's
 * bounds and padding, and fsdp_modelfile_resolve, the one place a --model
 * value becomes a model (modelfile.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/bnb4.h"
#include "ckpt/modelfile_internal.h"
#include "core/error.h"
#include "models/lora.h"

/* Detection order: the first format that claims a path reads it. */
static const fsdp_modelfile_format *const formats[] = {
    &fsdp_format_llmc,
    &fsdp_format_safetensors,
    &fsdp_format_hfdir,        /* before ckpt: both claim directories */
    &fsdp_format_ckpt,
    &fsdp_format_peft,         /* written only: claims nothing */
};
#define N_FORMATS ((int)(sizeof formats / sizeof formats[0]))

int fsdp_modelfile_format_count(void) { return N_FORMATS; }

const fsdp_modelfile_format *fsdp_modelfile_format_at(int i)
{
    return i >= 0 && i < N_FORMATS ? formats[i] : NULL;
}

const fsdp_modelfile_format *fsdp_modelfile_format_find(const char *name)
{
    for (int i = 0; name && i < N_FORMATS; i++)
        if (!strcmp(formats[i]->short_name, name))
            return formats[i];
    return NULL;
}

const char *fsdp_modelfile_format_name(const fsdp_modelfile_format *f)
{
    return f ? f->name : "?";
}

const char *fsdp_modelfile_format_short_name(const fsdp_modelfile_format *f)
{
    return f ? f->short_name : "?";
}

const char *fsdp_modelfile_format_names(char *buf, size_t n, const char *sep)
{
    size_t at = 0;
    if (n)
        buf[0] = '\0';
    for (int i = 0; i < N_FORMATS && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s", i ? sep : "", formats[i]->short_name);
    return buf;
}

static bool has_suffix(const char *path, const char *suffix)
{
    size_t n = strlen(path), k = strlen(suffix);
    return n >= k && !strcmp(path + n - k, suffix);
}

const fsdp_modelfile_format *fsdp_modelfile_format_by_suffix(const char *path)
{
    for (int i = 0; path && i < N_FORMATS; i++)
        if (formats[i]->suffix && has_suffix(path, formats[i]->suffix))
            return formats[i];
    return NULL;
}

bool fsdp_modelfile_format_is_dir(const fsdp_modelfile_format *f) { return !f->suffix; }

bool fsdp_modelfile_format_writes_bf16(const fsdp_modelfile_format *f) { return f->bf16; }

bool fsdp_modelfile_format_ships_tokenizer(const fsdp_modelfile_format *f)
{
    return f->ships_tokenizer;
}

const char *fsdp_modelfile_format_note(const fsdp_modelfile_format *f) { return f->note; }

static const fsdp_modelfile_format *claimant(const char *path)
{
    for (int i = 0; path && i < N_FORMATS; i++)
        if (!formats[i]->open)
            continue;
        else if (formats[i]->claims ? formats[i]->claims(path)
                               : formats[i]->suffix && has_suffix(path, formats[i]->suffix))
            return formats[i];
    return NULL;
}

const fsdp_modelfile_format *fsdp_modelfile_format_of(const char *path)
{
    const fsdp_modelfile_format *f = claimant(path);
    return f ? f : &fsdp_format_ckpt;
}

size_t fsdp_modelfile_help(char *buf, size_t n)
{
    size_t k = 0;
    int n_read = 0, seen = 0;
    for (int i = 0; i < N_FORMATS; i++)
        n_read += formats[i]->open != NULL;
    for (int i = 0; i < N_FORMATS; i++) {
        if (!formats[i]->open)
            continue;
        k += (size_t)snprintf(buf + (k < n ? k : n), k < n ? n - k : 0, "%s%s",
                              seen == 0 ? "" : seen + 1 == n_read ? " or " : ", ",
                              formats[i]->help);
        seen++;
    }
    if (n)
        buf[k < n ? k : n - 1] = '\0';
    return k < n ? k : n - 1;
}

size_t fsdp_modelfile_value_help(char *buf, size_t n)
{
    size_t k = fsdp_model_spec_help(buf, n);
    k += (size_t)snprintf(buf + k, n > k ? n - k : 0, ", or a model file: ");
    return k < n ? k + fsdp_modelfile_help(buf + k, n - k) : (n ? n - 1 : 0);
}

const char *fsdp_modelfile_base(const fsdp_modelfile *mf) { return mf->base[0] ? mf->base : NULL; }

/* ---- open, bind, read ------------------------------------------------------------ */

fsdp_status fsdp_modelfile_set_path(fsdp_modelfile *mf, const char *path)
{
    if (snprintf(mf->path, sizeof mf->path, "%s", path) >= (int)sizeof mf->path)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "path '%.64s...' is too long", path);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_modelfile_impl_alloc(fsdp_modelfile *mf, size_t bytes)
{
    mf->impl = calloc(1, bytes);
    if (!mf->impl)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_modelfile_open(fsdp_modelfile **out, const char *path)
{
    *out = NULL;
    if (!path || !*path)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "no model file given");
    fsdp_modelfile *mf = calloc(1, sizeof *mf);
    if (!mf)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    mf->fd = -1;
    mf->format = fsdp_modelfile_format_of(path);
    fsdp_status st = mf->format->open(mf, path);
    if (st == FSDP_STATUS_OK && (!mf->family || !mf->config[0]))
        st = fsdp_error_set(FSDP_STATUS_INTERNAL, "%s '%s': opened without a model family",
                            mf->format->name, path);
    return FSDP_OUT_OR_FREE(st, out, mf, fsdp_modelfile_close);
}

void fsdp_modelfile_close(fsdp_modelfile *mf)
{
    if (!mf)
        return;
    if (mf->format && mf->format->close)
        mf->format->close(mf);
    if (mf->fd >= 0)
        close(mf->fd);
    for (int i = 0; i < mf->n_parts; i++) {
        if (mf->part_fd[i] >= 0)
            close(mf->part_fd[i]);
        free(mf->part_path[i]);
    }
    free(mf->part_fd);
    free(mf->part_path);
    free(mf->src);
    free(mf->unit_base);
    fsdp_bnb4_free(mf->bnb4);
    if (mf->nf4_cache_free)
        mf->nf4_cache_free(mf);
    free(mf);
}

const fsdp_model_family *fsdp_modelfile_family(const fsdp_modelfile *mf) { return mf->family; }
const char *fsdp_modelfile_config(const fsdp_modelfile *mf) { return mf->config; }
const fsdp_modelfile_format *fsdp_modelfile_format_get(const fsdp_modelfile *mf)
{
    return mf->format;
}
const char *fsdp_modelfile_path(const fsdp_modelfile *mf) { return mf->path; }
const char *fsdp_modelfile_companions(const fsdp_modelfile *mf)
{
    return mf->format->ships_tokenizer ? mf->path : NULL;
}
const char *fsdp_modelfile_dtype_name(const fsdp_modelfile *mf) { return mf->dtype_name; }

void fsdp_modelfile_describe(const fsdp_modelfile *mf, char *buf, size_t n)
{
    snprintf(buf, n, "%s '%s'", mf->family ? mf->family->title : "?", mf->config);
}

fsdp_status fsdp_modelfile_build(const char *what, const char *path,
                                 const fsdp_model_family *f, const char *config, fsdp_model *m)
{
    if (fsdp_model_build(f, config, m) == FSDP_STATUS_OK)
        return FSDP_STATUS_OK;
    fsdp_error_prefix("%s '%s' describes a model fsdp cannot build", what, path);
    return FSDP_STATUS_FORMAT;
}

fsdp_status fsdp_modelfile_bind(fsdp_modelfile *mf, const fsdp_model *m)
{
    if (!m || m->family != mf->family || strcmp(m->config, mf->config)) {
        char held[FSDP_MODEL_NAME_MAX + 32];
        fsdp_modelfile_describe(mf, held, sizeof held);
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s '%s' holds %s, not model '%s'; build "
                              "the model from the file (fsdp_modelfile_resolve)",
                              mf->format->name, mf->path, held, m ? m->name : "(null)");
    }
    mf->model = NULL;
    if (mf->nf4_cache_free) /* cached per parameter of the model bound before */
        mf->nf4_cache_free(mf);
    FSDP_TRY(mf->format->bind(mf, m));
    mf->model = m;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_modelfile_read_range(const fsdp_modelfile *mf, int unit, size_t begin,
                                      size_t end, float *dst)
{
    const fsdp_model *m = mf->model;
    if (!m || unit < 0 || unit >= m->n_units || end < begin)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "reading '%s': %s", mf->path,
                              m ? "bad unit or range" : "the file is not bound to a model");
    size_t numel = m->units[unit].numel, hi = end < numel ? end : numel;
    if (hi < end) {
        size_t z0 = begin > hi ? begin : hi;
        memset(dst + (z0 - begin), 0, (end - z0) * sizeof *dst);
    }
    if (begin >= hi)
        return FSDP_STATUS_OK;
    if (mf->format->read_range)
        return mf->format->read_range(mf, unit, begin, hi, dst);
    return fsdp_flat_read_range(mf, unit, begin, hi, dst);
}

fsdp_status fsdp_modelfile_read_by_name(const fsdp_modelfile *mf, const fsdp_model *m, int unit,
                                        size_t begin, size_t end, float *dst)
{
    const fsdp_model *base = mf->model;
    if (!base || unit < 0 || unit >= base->n_units || unit >= m->n_units)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "reading '%s': %s", mf->path,
                              base ? "bad unit" : "the file is not bound to a model");
    const fsdp_unit_spec *us = &m->units[unit], *bs = &base->units[unit];
    for (int i = 0; i < us->n_params; i++) {
        const fsdp_param_spec *p = &us->params[i];
        size_t lo, hi;
        if (!fsdp_param_overlap(p, begin, end, &lo, &hi))
            continue;
        const fsdp_param_spec *q = NULL;
        for (int k = 0; k < bs->n_params && !q; k++)
            if (!strcmp(bs->params[k].name, p->name))
                q = &bs->params[k];
        if (!q)
            continue; /* not the base's: the caller's */
        size_t first = q->offset + (lo - p->offset);
        FSDP_TRY(fsdp_modelfile_read_range(mf, unit, first, first + (hi - lo), dst + (lo - begin)));
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_modelfile_init_fn(void *arg, const fsdp_model *m, int unit, size_t begin,
                                   size_t end, float *dst)
{
    const fsdp_modelfile *mf = arg;
    if (m != mf->model)
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "'%s' is bound to another model", mf->path);
    return fsdp_modelfile_read_range(mf, unit, begin, end, dst);
}

/* ---- write -------------------------------------------------------------------- */

fsdp_status fsdp_modelfile_write_with(const char *path, const fsdp_modelfile_format *format,
                                      const fsdp_model *m, const float *const *units,
                                      const fsdp_modelfile_write_opts *opts)
{
    if (!path || !format || !m || !m->family || !units || !opts)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "writing a model file needs a path, a "
                              "format, a model's units and options");
    if (opts->copied && opts->copied_size)
        opts->copied[0] = '\0';
    return format->write(path, m, units, opts);
}

fsdp_status fsdp_modelfile_write(const char *path, const fsdp_modelfile_format *format,
                                 const fsdp_model *m, const float *const *units, fsdp_dtype dt)
{
    fsdp_modelfile_write_opts o = {.dtype = dt};
    return fsdp_modelfile_write_with(path, format, m, units, &o);
}

/* ---- --model values ----------------------------------------------------------- */

fsdp_status fsdp_modelfile_resolve(const char *value, fsdp_model *m, fsdp_modelfile **file)
{
    memset(m, 0, sizeof *m);
    if (file)
        *file = NULL;
    if (!value || !*value || fsdp_model_is_spec(value))
        return fsdp_model_from_spec(value, m);
    if (!claimant(value)) {
        char help[1024];
        fsdp_modelfile_value_help(help, sizeof help);
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown model '%s' (no such model name, "
                              "spec or file); use %s", value, help);
    }
    fsdp_modelfile *mf = NULL;
    FSDP_TRY(fsdp_modelfile_open(&mf, value));
    fsdp_status st = fsdp_modelfile_build(mf->format->name, mf->path, mf->family, mf->config, m);
    if (st == FSDP_STATUS_OK && mf->lora.r)
        st = fsdp_model_add_lora(m, &mf->lora);
    if (st == FSDP_STATUS_OK && mf->freeze[0])
        st = fsdp_model_freeze(m, mf->freeze);
    m->nf4 = mf->nf4_round_trip;
    if (st == FSDP_STATUS_OK && file)
        st = fsdp_modelfile_bind(mf, m);
    if (st != FSDP_STATUS_OK || !file) {
        fsdp_modelfile_close(mf);
        if (st != FSDP_STATUS_OK)
            fsdp_model_free(m);
        return st;
    }
    *file = mf;
    return FSDP_STATUS_OK;
}
