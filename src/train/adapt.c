/*
 * adapt.c - LoRA adapters and frozen parameters applied to a run's model,
 * and its initialisation from the base's file (adapt.h).
 */
#include <string.h>

#include "models/lora.h"
#include "models/registry.h"
#include "train/adapt.h"

fsdp_status fsdp_adapt_apply(fsdp_adapt *a, fsdp_model *m, fsdp_modelfile *mf,
                             const fsdp_lora_config *lora, const char *freeze, uint64_t seed)
{
    memset(a, 0, sizeof *a);
    a->seed = seed;
    if (!fsdp_adapt_wanted(lora, freeze))
        return FSDP_STATUS_OK;
    a->active = true;
    if (mf) {
        FSDP_TRY(fsdp_model_build(m->family, m->config, &a->base));
        FSDP_TRY(fsdp_modelfile_bind(mf, &a->base));
        a->mf = mf;
    }
    if (lora && lora->r > 0)
        FSDP_TRY(fsdp_model_add_lora(m, lora));
    if (freeze && freeze[0])
        FSDP_TRY(fsdp_model_freeze(m, freeze));
    return FSDP_STATUS_OK;
}

/* Base parameter `name` of unit u in the base model, or NULL. */
static const fsdp_param_spec *base_param(const fsdp_model *base, int u, const char *name)
{
    const fsdp_unit_spec *us = &base->units[u];
    for (int i = 0; i < us->n_params; i++)
        if (!strcmp(us->params[i].name, name))
            return &us->params[i];
    return NULL;
}

fsdp_status fsdp_adapt_init_fn(void *arg, const fsdp_model *m, int unit, size_t begin,
                               size_t end, float *dst)
{
    const fsdp_adapt *a = arg;
    if (!a->mf) { /* everything from its initialiser, keyed by name: the layout does not matter */
        fsdp_model_init_range(m, unit, begin, end, a->seed, dst);
        return FSDP_STATUS_OK;
    }
    memset(dst, 0, (end - begin) * sizeof *dst); /* padding, and what no parameter covers */
    const fsdp_unit_spec *us = &m->units[unit];
    for (int i = 0; i < us->n_params; i++) {
        const fsdp_param_spec *p = &us->params[i];
        size_t lo, hi;
        if (!fsdp_param_overlap(p, begin, end, &lo, &hi))
            continue;
        const fsdp_param_spec *q = base_param(&a->base, unit, p->name);
        if (!q) { /* an adapter: its initialiser */
            fsdp_model_init_range(m, unit, lo, hi, a->seed, dst + (lo - begin));
            continue;
        }
        size_t first = lo - p->offset;
        FSDP_TRY(fsdp_modelfile_read_range(a->mf, unit, q->offset + first,
                                           q->offset + first + (hi - lo), dst + (lo - begin)));
    }
    return FSDP_STATUS_OK;
}

void fsdp_adapt_free(fsdp_adapt *a)
{
    if (a->active && a->mf)
        fsdp_model_free(&a->base);
    memset(a, 0, sizeof *a);
}
