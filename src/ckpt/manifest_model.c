/*
 * manifest_model.c - the model part of a checkpoint manifest (manifest.h):
 * recording a model (family, config, units, parameters), rebuilding the
 * recorded model through the registry, and holding a manifest against a
 * model, field by field, with messages that name the manifest line and the
 * --model that fits.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/manifest.h"
#include "core/error.h"
#include "models/lora.h"

void fsdp_ckpt_manifest_set_model(fsdp_ckpt_manifest *m, const fsdp_model *model)
{
    snprintf(m->model_name, sizeof m->model_name, "%s", model->name);
    snprintf(m->model_family, sizeof m->model_family, "%s",
             model->family ? model->family->name : "");
    snprintf(m->model_config, sizeof m->model_config, "%s", model->config);
    m->model_line = 0;
    m->lora = model->lora;
    snprintf(m->freeze, sizeof m->freeze, "%s", model->freeze);
    m->nf4 = model->nf4;
}

/* The trainable parameters of a unit (the ones a checkpoint stores), in index order. */
static int n_trainable(const fsdp_unit_spec *us)
{
    int n = 0;
    for (int i = 0; i < us->n_params; i++)
        n += !us->params[i].frozen;
    return n;
}

fsdp_status fsdp_ckpt_manifest_set_units(fsdp_ckpt_manifest *m, const fsdp_model *model,
                                         const size_t *padded_numel, const size_t *shard_numel)
{
    fsdp_ckpt_unit *units = calloc((size_t)model->n_units, sizeof *units);
    if (!units)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a checkpoint manifest");
    for (int u = 0; u < model->n_units; u++) {
        const fsdp_unit_spec *us = &model->units[u];
        fsdp_ckpt_unit *cu = &units[u];
        snprintf(cu->name, sizeof cu->name, "%s", us->name);
        cu->numel = us->train_numel; /* frozen parameters come from the base */
        cu->padded_numel = padded_numel[u];
        cu->shard_numel = shard_numel[u];
        cu->n_params = n_trainable(us);
        cu->params = calloc((size_t)us->n_params + 1, sizeof *cu->params);
        if (!cu->params) {
            for (int k = 0; k < u; k++)
                free(units[k].params);
            free(units);
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a checkpoint manifest");
        }
        for (int i = 0, k = 0; i < us->n_params; i++) {
            const fsdp_param_spec *ps = &us->params[i];
            if (ps->frozen)
                continue;
            fsdp_ckpt_param *cp = &cu->params[k++];
            snprintf(cp->name, sizeof cp->name, "%s", ps->name);
            cp->ndim = ps->ndim;
            memcpy(cp->shape, ps->shape, sizeof cp->shape);
            cp->numel = ps->numel;
            cp->offset = ps->offset;
            /* one shard's layout (engine/shardmap.h); a sharded writer sets its own */
            cp->shard_rows = ps->ndim > 0 ? (size_t)ps->shape[0] : 1;
            cp->shard_at = ps->offset;
        }
    }
    if (m->units)
        for (int u = 0; u < m->n_units; u++)
            free(m->units[u].params);
    free(m->units);
    m->units = units;
    m->n_units = model->n_units;
    return FSDP_STATUS_OK;
}

/* "LoRA adapters r=R alpha=A targets=T" (", rslora"), or "no LoRA adapters". */
static void describe_lora(const fsdp_lora_config *c, char *buf, size_t n)
{
    if (!c->r)
        snprintf(buf, n, "no LoRA adapters");
    else
        snprintf(buf, n, "LoRA adapters r=%d alpha=%g targets=%s%s", c->r, c->alpha, c->targets,
                 c->rslora ? ", rslora" : "");
}

/* The train options that give a model c's adapters. */
static void lora_flags(const fsdp_lora_config *c, char *buf, size_t n)
{
    if (!c->r)
        snprintf(buf, n, "without --lora");
    else
        snprintf(buf, n, "--lora %d --lora-alpha %g --lora-targets '%s'%s", c->r, c->alpha,
                 c->targets, c->rslora ? " --rslora" : "");
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (k < n)
        snprintf(buf + k, n - k, ")");
}

/* Units and parameters of m against model; `hint` ends every message. */
static fsdp_status compare_units(const fsdp_ckpt_manifest *m, const char *path,
                                 const fsdp_model *model, const char *hint)
{
    if (m->n_units != model->n_units)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint manifest '%s' line %d: %d units, but model '%s' has "
                              "%d%s", path, m->n_units ? m->units[0].line : 0, m->n_units,
                              model->name, model->n_units, hint);
    for (int u = 0; u < m->n_units; u++) {
        const fsdp_ckpt_unit *cu = &m->units[u];
        const fsdp_unit_spec *us = &model->units[u];
        int n_train = n_trainable(us);
        if (strcmp(cu->name, us->name) || cu->numel != us->train_numel || cu->n_params != n_train)
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "checkpoint manifest '%s' line %d: unit %d is '%s' (%zu "
                                  "elements, %d parameters), but model '%s' has '%s' (%zu, %d)%s",
                                  path, cu->line, u, cu->name, cu->numel, cu->n_params,
                                  model->name, us->name, us->train_numel, n_train, hint);
        for (int i = 0, j = 0; i < cu->n_params; i++, j++) {
            const fsdp_ckpt_param *p = &cu->params[i];
            while (us->params[j].frozen) /* n_train of them: j stays in range */
                j++;
            const fsdp_param_spec *q = &us->params[j];
            bool same = !strcmp(p->name, q->name) && p->ndim == q->ndim &&
                        p->offset == q->offset && p->numel == q->numel;
            for (int d = 0; same && d < p->ndim; d++)
                same = p->shape[d] == q->shape[d];
            if (!same) {
                char a[96], b[96];
                fmt_shape(a, sizeof a, p->ndim, p->shape);
                fmt_shape(b, sizeof b, q->ndim, q->shape);
                return fsdp_error_set(FSDP_STATUS_FORMAT,
                                      "checkpoint manifest '%s' line %d: parameter '%s' %s at "
                                      "offset %zu does not match model '%s''s '%s' %s at offset "
                                      "%zu%s",
                                      path, p->line, p->name, a, p->offset, model->name, q->name,
                                      b, q->offset, hint);
            }
        }
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_manifest_model(const fsdp_ckpt_manifest *m, const char *path,
                                     fsdp_model *out)
{
    memset(out, 0, sizeof *out);
    const fsdp_model_family *f = fsdp_model_family_find(m->model_family);
    if (!f) {
        char known[256];
        size_t k = 0;
        known[0] = '\0';
        for (int i = 0; i < fsdp_model_family_count() && k < sizeof known; i++)
            k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "",
                                  fsdp_model_family_at(i)->name);
        return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint manifest '%s' line %d: model "
                              "family '%s' is not in this build (it has %s)", path,
                              m->model_line, m->model_family, known);
    }
    if (fsdp_model_build(f, m->model_config, out) != FSDP_STATUS_OK) {
        fsdp_error_prefix("checkpoint manifest '%s' line %d: the model it records does not "
                          "build", path, m->model_line);
        return FSDP_STATUS_FORMAT;
    }
    fsdp_status ast = FSDP_STATUS_OK;
    if (m->lora.r)
        ast = fsdp_model_add_lora(out, &m->lora);
    if (ast == FSDP_STATUS_OK && m->freeze[0])
        ast = fsdp_model_freeze(out, m->freeze);
    out->nf4 = m->nf4; /* its frozen linear weights read as their NF4 round trip (ckpt_model.c) */
    if (ast != FSDP_STATUS_OK) {
        fsdp_model_free(out);
        fsdp_error_prefix("checkpoint manifest '%s': its lora/freeze lines do not apply to its "
                          "model", path);
        return FSDP_STATUS_FORMAT;
    }
    char hint[128];
    snprintf(hint, sizeof hint, "; the unit lines contradict the model recorded on line %d",
             m->model_line);
    fsdp_status st = compare_units(m, path, out, hint);
    if (st != FSDP_STATUS_OK)
        fsdp_model_free(out);
    return st;
}

fsdp_status fsdp_ckpt_manifest_check_model(const fsdp_ckpt_manifest *m, const char *path,
                                           const fsdp_model *model)
{
    /* the --model that rebuilds the checkpoint's model: its name if that
     * still names it, else the full spec */
    char spec[FSDP_MODEL_NAME_MAX], hint[2 * FSDP_MODEL_NAME_MAX + 96];
    snprintf(spec, sizeof spec, "%s:%s", m->model_family, m->model_config);
    fsdp_model named;
    if (fsdp_model_from_spec(m->model_name, &named) == FSDP_STATUS_OK) {
        if (named.family && !strcmp(named.family->name, m->model_family) &&
            !strcmp(named.config, m->model_config))
            snprintf(spec, sizeof spec, "%s", m->model_name);
        fsdp_model_free(&named);
    }
    fsdp_error_clear();
    snprintf(hint, sizeof hint, "; the checkpoint was written for model '%s' (%s): resume with "
             "--model '%s'", m->model_name, m->model_family, spec);
    const fsdp_lora_config *a = &m->lora, *b = &model->lora;
    if (a->r != b->r || (a->r && (a->alpha != b->alpha || a->rslora != b->rslora ||
                                  strcmp(a->targets, b->targets)))) {
        char was[320], now[320], flags[320];
        describe_lora(a, was, sizeof was);
        describe_lora(b, now, sizeof now);
        lora_flags(a, flags, sizeof flags);
        return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint '%s' holds %s, but this run's "
                              "model has %s: resume with the checkpoint's LoRA settings (%s)",
                              path, was, now, flags);
    }
    if (strcmp(m->freeze, model->freeze))
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint '%s' was trained with --freeze '%s', but this run "
                              "freezes '%s': resume with the same --freeze",
                              path, m->freeze, model->freeze);
    if (m->nf4 != model->nf4)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint '%s' was trained on a base %s, but this run's is %s: "
                              "resume with the same --quantize (the frozen weights' values "
                              "differ)", path, m->nf4 ? "in NF4 (--quantize nf4)" : "in floats",
                              model->nf4 ? "in NF4" : "in floats (--quantize none)");
    FSDP_TRY(compare_units(m, path, model, hint));
    if (!model->family || strcmp(m->model_family, model->family->name) ||
        strcmp(m->model_config, model->config))
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint manifest '%s' line %d: it holds %s model '%s', but "
                              "this run's model '%s' is %s '%s' (same shapes, another config)%s",
                              path, m->model_line, m->model_family, m->model_config, model->name,
                              model->family ? model->family->name : "?", model->config, hint);
    return FSDP_STATUS_OK;
}
