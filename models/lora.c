/*
 * lora.c - LoRA adapters and frozen parameters on a built model (contract
 * in lora.h).
 *
 * Adapters are ordinary parameters appended to the unit that owns the
 * targeted weight (indices after the family's own, so the family's indices
 * keep their meaning); fsdp_model_relayout then puts them first in the
 * unit's flat buffer, since they are its only trainable parameters. The
 * family finds them per (unit, linear layer) through fsdp_lora_find, a
 * table kept in m->lora_impl. A's init is the counter RNG keyed by the
 * parameter's name (models/model.c), so every rank and world size draws
 * the same adapters with nothing more here.
 *
 * Assumes the family lists its block linear layers (family.h's
 * lora_modules) and that units 1 .. n_units - 1 are its blocks.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/family.h"
#include "models/lora.h"

#define ALL_LINEAR "all-linear"

/* m->lora_impl: for every (unit, linear layer), A's and B's indices (-1: none). */
typedef struct lora_table {
    int n_units, n_modules;
    int idx[]; /* (n_units, n_modules, 2) */
} lora_table;

double fsdp_lora_scale(const fsdp_lora_config *c)
{
    return c->rslora ? c->alpha / sqrt((double)c->r) : c->alpha / c->r;
}

/* Copies the next item of the comma list *p into buf (n bytes) and moves *p
 * past it; false at the end of the list. Items longer than buf are cut
 * (callers' buffers hold any item of a list that fits their record). */
static bool next_item(const char **p, char *buf, size_t n)
{
    if (!*p)
        return false;
    const char *comma = strchr(*p, ',');
    size_t len = comma ? (size_t)(comma - *p) : strlen(*p);
    snprintf(buf, n, "%.*s", (int)len, *p);
    *p = comma ? comma + 1 : NULL;
    return true;
}

fsdp_status fsdp_lora_config_check(const fsdp_lora_config *c)
{
    if (!c)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "LoRA: no configuration given");
    if (c->r < 1 || c->r > 4096)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "LoRA rank r=%d is out of range; use 1..4096 (--lora R)", c->r);
    if (!(c->alpha > 0.0) || !isfinite(c->alpha))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "LoRA alpha %g is invalid; use a finite alpha > 0 (--lora-alpha)",
                              c->alpha);
    if (!memchr(c->targets, '\0', sizeof c->targets))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "LoRA targets are longer than %zu characters; list fewer modules "
                              "(--lora-targets)", sizeof c->targets - 1);
    if (!c->targets[0])
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "LoRA targets are empty; name modules (--lora-targets "
                              "q_proj,v_proj) or use " ALL_LINEAR);
    const char *p = c->targets;
    char item[sizeof c->targets];
    int n = 0;
    bool all = false;
    while (next_item(&p, item, sizeof item)) {
        n++;
        if (!item[0] || item[0] == '.' || item[strlen(item) - 1] == '.')
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "LoRA targets '%s': entry %d is '%s'; use a comma list of "
                                  "module names such as q_proj,v_proj",
                                  c->targets, n, item);
        for (const char *q = item; *q; q++)
            if (!isalnum((unsigned char)*q) && *q != '_' && *q != '.' && *q != '-')
                return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                      "LoRA target '%s' has the character '%c'; module names "
                                      "hold letters, digits, '_', '-' and '.'",
                                      item, *q);
        all |= !strcmp(item, ALL_LINEAR);
    }
    if (all && n > 1)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "LoRA targets '%s': " ALL_LINEAR " stands alone (it already "
                              "names every linear layer but the LM head)",
                              c->targets);
    return FSDP_STATUS_OK;
}

/* Module path of a weight: its name without ".weight" into buf. */
static void module_path(const char *weight, char *buf, size_t n)
{
    size_t len = strlen(weight), suffix = strlen(".weight");
    if (len > suffix && !strcmp(weight + len - suffix, ".weight"))
        len -= suffix;
    snprintf(buf, n, "%.*s", (int)len, weight);
}

/* PEFT's target_modules rule: the path equals the target or ends in
 * "." + target; all-linear matches every module offered. */
static bool target_matches(const char *path, const char *target)
{
    if (!strcmp(target, ALL_LINEAR))
        return true;
    size_t lp = strlen(path), lt = strlen(target);
    return !strcmp(path, target) ||
           (lp > lt && path[lp - lt - 1] == '.' && !strcmp(path + lp - lt, target));
}

/* INVALID_ARG for a target matching none of f's linear layers in m. */
static fsdp_status no_match(const fsdp_model *m, const char *target)
{
    const fsdp_model_family *f = m->family;
    char names[256] = "", example[96] = "";
    size_t used = 0;
    for (int k = 0; k < f->n_lora_modules && used < sizeof names; k++) {
        const char *name = f->lora_modules[k].name, *dot = strrchr(name, '.');
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", k ? ", " : "",
                                 dot ? dot + 1 : name);
    }
    if (m->n_units > 1 && f->n_lora_modules > 0)
        module_path(m->units[1].params[f->lora_modules[0].param].name, example, sizeof example);
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                          "LoRA target '%s' matches no linear layer of %s '%s'; its linear "
                          "layers are %s (or their paths, e.g. %s), or " ALL_LINEAR
                          " for every one but the LM head",
                          target, f->title, m->name, names, example);
}

/* Whether layer k of block unit u is a target of c (marking in `hit`
 * which targets matched). */
static bool targeted(const fsdp_model *m, int u, int k, const char *targets, bool *hit)
{
    char path[64], item[256];
    module_path(m->units[u].params[m->family->lora_modules[k].param].name, path, sizeof path);
    const char *p = targets;
    bool any = false;
    for (int t = 0; next_item(&p, item, sizeof item); t++)
        if (target_matches(path, item))
            any = hit[t] = true;
    return any;
}

/* A's and B's specs for weight w (OC, C), appended to unit us (its
 * params array has room; the names fit, as fsdp_model_add_lora checked). */
static void add_adapters(fsdp_unit_spec *us, const fsdp_param_spec *w, int r)
{
    char path[64], name[80];
    module_path(w->name, path, sizeof path);
    const int64_t OC = w->shape[0], C = w->shape[1];
    snprintf(name, sizeof name, "%s.lora_A.weight", path);
    fsdp_unit_add_param(us, name, r, C, FSDP_INIT_UNIFORM, (float)(1.0 / sqrt((double)C)), true);
    snprintf(name, sizeof name, "%s.lora_B.weight", path);
    fsdp_unit_add_param(us, name, OC, r, FSDP_INIT_ZEROS, 0.0f, true);
}

/* INVALID_ARG when the adapter names of weight w would not fit a parameter
 * name. */
static fsdp_status check_adapter_name(const fsdp_model *m, const fsdp_param_spec *w)
{
    char path[64];
    module_path(w->name, path, sizeof path);
    const size_t room = sizeof w->name - 1, len = strlen(path) + strlen(".lora_A.weight");
    if (len > room)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s '%s': the adapter names of '%s' are %zu characters, more "
                              "than the %zu a parameter name holds",
                              m->family->title, m->name, path, len, room);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_model_add_lora(fsdp_model *m, const fsdp_lora_config *c)
{
    FSDP_TRY(fsdp_lora_config_check(c));
    const fsdp_model_family *f = m->family;
    if (!f || !f->lora_modules)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "LoRA is supported for the llama family, not for %s '%s'; "
                              "fine-tune part of it with --freeze instead",
                              f ? f->title : "model", m->name);
    if (m->lora.r > 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s '%s' already has LoRA adapters",
                              f->title, m->name);
    const int K = f->n_lora_modules, U = m->n_units;
    bool hit[sizeof c->targets] = {false};
    lora_table *tab = malloc(sizeof *tab + (size_t)U * K * 2 * sizeof(int));
    if (!tab)
        return fsdp_error_set(FSDP_STATUS_OOM, "host allocation of a LoRA table failed");
    tab->n_units = U;
    tab->n_modules = K;
    /* Decide every target first and grow the parameter arrays, so a
     * refusal or an allocation failure leaves m as it was. */
    for (int k = 0; k < K; k++)
        tab->idx[k * 2] = 0; /* the root: never a target */
    for (int u = 1; u < U; u++)
        for (int k = 0; k < K; k++) {
            bool on = targeted(m, u, k, c->targets, hit);
            tab->idx[(u * K + k) * 2] = on; /* a flag until the adapters exist */
            const fsdp_param_spec *w = &m->units[u].params[f->lora_modules[k].param];
            fsdp_status st = on ? check_adapter_name(m, w) : FSDP_STATUS_OK;
            if (st != FSDP_STATUS_OK) {
                free(tab);
                return st;
            }
        }
    const char *p = c->targets;
    char item[sizeof c->targets];
    for (int t = 0; next_item(&p, item, sizeof item); t++)
        if (!hit[t]) {
            free(tab);
            return no_match(m, item);
        }
    for (int u = 1; u < U; u++) {
        int n = 0;
        for (int k = 0; k < K; k++)
            n += tab->idx[(u * K + k) * 2];
        fsdp_param_spec *grown =
            realloc(m->units[u].params, (size_t)(m->units[u].n_params + 2 * n) * sizeof *grown);
        if (!grown) {
            free(tab);
            return fsdp_error_set(FSDP_STATUS_OOM, "host allocation of LoRA parameter specs "
                                                   "failed");
        }
        m->units[u].params = grown;
    }
    for (int u = 0; u < U; u++) {
        fsdp_unit_spec *us = &m->units[u];
        for (int i = 0; i < us->n_params; i++)
            us->params[i].frozen = true;
        for (int k = 0; k < K; k++) {
            int *ab = &tab->idx[(u * K + k) * 2];
            bool on = ab[0];
            ab[0] = ab[1] = -1;
            if (!on)
                continue;
            add_adapters(us, &us->params[f->lora_modules[k].param], c->r);
            ab[0] = us->n_params - 2;
            ab[1] = us->n_params - 1;
        }
    }
    FSDP_ASSERT(fsdp_model_relayout(m) == FSDP_STATUS_OK); /* fused pairs all frozen */
    m->numel = 0;
    for (int u = 0; u < U; u++)
        m->numel += m->units[u].numel;
    m->lora = *c;
    free(m->lora_impl);
    m->lora_impl = tab;
    return FSDP_STATUS_OK;
}

bool fsdp_lora_find(const fsdp_model *m, int unit, int module, int *a, int *b)
{
    const lora_table *tab = m->lora_impl;
    if (!tab || unit < 0 || unit >= tab->n_units || module < 0 || module >= tab->n_modules)
        return false;
    const int *ab = &tab->idx[(unit * tab->n_modules + module) * 2];
    if (ab[0] < 0)
        return false;
    *a = ab[0];
    *b = ab[1];
    return true;
}

/* '*' matches any run of characters, dots included; everything else itself. */
static bool glob_match(const char *pat, const char *s)
{
    const char *star = NULL, *resume = NULL;
    while (*s) {
        if (*pat == '*') {
            star = pat++;
            resume = s;
        } else if (*pat == *s) {
            pat++;
            s++;
        } else if (star) {
            pat = star + 1;
            s = ++resume;
        } else {
            return false;
        }
    }
    while (*pat == '*')
        pat++;
    return !*pat;
}

/* Every parameter's frozen flag back from `saved` (one per parameter, unit
 * by unit) and the layout with it. */
static void restore_frozen(fsdp_model *m, const bool *saved)
{
    size_t i = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int k = 0; k < m->units[u].n_params; k++)
            m->units[u].params[k].frozen = saved[i++];
    FSDP_ASSERT(fsdp_model_relayout(m) == FSDP_STATUS_OK);
}

fsdp_status fsdp_model_freeze(fsdp_model *m, const char *patterns)
{
    if (!patterns || !*patterns)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--freeze needs patterns, e.g. model.layers.*.mlp.*");
    size_t have = strlen(m->freeze), len = strlen(patterns);
    if (have + (have ? 1 : 0) + len >= sizeof m->freeze)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "--freeze patterns are longer than %zu characters; use '*' globs "
                              "to say it shorter",
                              sizeof m->freeze - 1);
    size_t n_params = 0;
    for (int u = 0; u < m->n_units; u++)
        n_params += (size_t)m->units[u].n_params;
    bool *saved = malloc(n_params ? n_params : 1);
    if (!saved)
        return fsdp_error_set(FSDP_STATUS_OOM, "host allocation for --freeze failed");
    size_t i = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int k = 0; k < m->units[u].n_params; k++)
            saved[i++] = m->units[u].params[k].frozen;

    fsdp_status st = FSDP_STATUS_OK;
    const char *p = patterns;
    char pat[sizeof m->freeze];
    while (st == FSDP_STATUS_OK && next_item(&p, pat, sizeof pat)) {
        bool any = false;
        for (int u = 0; u < m->n_units; u++)
            for (int k = 0; k < m->units[u].n_params; k++)
                if (pat[0] && glob_match(pat, m->units[u].params[k].name))
                    any = m->units[u].params[k].frozen = true;
        if (!any)
            st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                "--freeze pattern '%s' matches no parameter of %s '%s'; use "
                                "Hugging Face tensor names with '*' globs, e.g. "
                                "model.layers.*.mlp.*",
                                pat, m->family ? m->family->title : "model", m->name);
    }
    if (st == FSDP_STATUS_OK)
        st = fsdp_model_relayout(m);
    if (st == FSDP_STATUS_OK && m->train_numel == 0)
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                            "--freeze '%s' freezes every parameter of %s '%s': nothing would "
                            "train; freeze less",
                            patterns, m->family ? m->family->title : "model", m->name);
    if (st != FSDP_STATUS_OK) {
        restore_frozen(m, saved);
        free(saved);
        return st;
    }
    free(saved);
    snprintf(m->freeze + have, sizeof m->freeze - have, "%s%s", have ? "," : "", patterns);
    return FSDP_STATUS_OK;
}

bool fsdp_lora_is_linear_weight(const fsdp_model *m, int unit, int i)
{
    const fsdp_model_family *f = m->family;
    if (unit < 1 || unit >= m->n_units) /* the block units */
        return false;
    for (int k = 0; k < f->n_lora_modules; k++)
        if (f->lora_modules[k].param == i)
            return true;
    return false;
}

bool fsdp_lora_is_adapter(const char *name)
{
    static const char *const suffixes[] = {".lora_A.weight", ".lora_B.weight"};
    size_t len = name ? strlen(name) : 0;
    for (int i = 0; i < 2; i++) {
        size_t ls = strlen(suffixes[i]);
        if (len > ls && !strcmp(name + len - ls, suffixes[i]))
            return true;
    }
    return false;
}

void fsdp_lora_merge(const fsdp_model *m, const float *const *units, const fsdp_model *base,
                     float *const *out)
{
    for (int u = 0; u < base->n_units; u++) /* every base parameter, by name */
        for (int i = 0; i < base->units[u].n_params; i++) {
            const fsdp_param_spec *q = &base->units[u].params[i];
            int mu;
            const fsdp_param_spec *p = fsdp_model_find_param(m, q->name, &mu);
            memcpy(out[u] + q->offset, units[mu] + p->offset, q->numel * sizeof(float));
        }
    const fsdp_model_family *f = m->family;
    double scale = fsdp_lora_scale(&m->lora);
    for (int u = 1; m->lora.r && f && u < m->n_units; u++)
        for (int k = 0; k < f->n_lora_modules; k++) {
            int ia, ib;
            if (!fsdp_lora_find(m, u, k, &ia, &ib))
                continue;
            const fsdp_param_spec *w = &base->units[u].params[f->lora_modules[k].param];
            const fsdp_param_spec *pa = &m->units[u].params[ia], *pb = &m->units[u].params[ib];
            int64_t oc = w->shape[0], c = w->shape[1], r = pa->shape[0];
            float *W = out[u] + w->offset;
            const float *A = units[u] + pa->offset, *B = units[u] + pb->offset;
            for (int64_t o = 0; o < oc; o++)
                for (int64_t j = 0; j < c; j++) {
                    double acc = 0.0;
                    for (int64_t q = 0; q < r; q++)
                        acc += (double)B[o * r + q] * (double)A[q * c + j];
                    W[o * c + j] = (float)((double)W[o * c + j] + scale * acc);
                }
        }
}
