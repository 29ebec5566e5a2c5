/*
 * adapt.c - LoRA adapters and frozen parameters applied to a run's model,
 * and its initialisation from the base's file (adapt.h).
 */
#include <string.h>

#include "models/lora.h"
#include "models/registry.h"
#include "train/adapt.h"

fsdp_status fsdp_adapt_apply(fsdp_adapt *a, fsdp_model *m, fsdp_modelfile *mf,
                             const fsdp_lora_config *lora, const char *freeze,
                             const char *adapter, uint64_t seed)
{
    memset(a, 0, sizeof *a);
    a->seed = seed;
    a->peft.fd = -1;
    if (!fsdp_adapt_wanted(lora, freeze, adapter))
        return FSDP_STATUS_OK;
    a->active = true;
    if (adapter && adapter[0]) {
        if (lora && lora->r > 0)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "--adapter '%s' brings its own LoRA settings "
                                  "(adapter_config.json): leave out --lora and its options",
                                  adapter);
        FSDP_TRY(fsdp_peft_open(adapter, &a->peft));
        a->has_peft = true;
        lora = &a->peft.lora;
    }
    if (mf) {
        FSDP_TRY(fsdp_model_build(m->family, m->config, &a->base));
        FSDP_TRY(fsdp_modelfile_bind(mf, &a->base));
        a->mf = mf;
    }
    if (lora && lora->r > 0)
        FSDP_TRY(fsdp_model_add_lora(m, lora));
    if (freeze && freeze[0])
        FSDP_TRY(fsdp_model_freeze(m, freeze));
    if (a->has_peft)
        FSDP_TRY(fsdp_peft_bind(&a->peft, m));
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_adapt_init_fn(void *arg, const fsdp_model *m, int unit, size_t begin,
                               size_t end, float *dst)
{
    const fsdp_adapt *a = arg;
    if (!a->mf && !a->has_peft) { /* everything from its initialiser, keyed by name */
        fsdp_model_init_range(m, unit, begin, end, a->seed, dst);
        return FSDP_STATUS_OK;
    }
    memset(dst, 0, (end - begin) * sizeof *dst); /* padding, and what no parameter covers */
    if (a->mf) /* the base's parameters, from its file by name */
        FSDP_TRY(fsdp_modelfile_read_by_name(a->mf, m, unit, begin, end, dst));
    const fsdp_unit_spec *us = &m->units[unit];
    for (int i = 0; i < us->n_params; i++) { /* the rest: adapters, or a seed's base */
        const fsdp_param_spec *p = &us->params[i];
        size_t lo, hi;
        bool adapter = fsdp_lora_is_adapter(p->name);
        if ((a->mf && !adapter) || !fsdp_param_overlap(p, begin, end, &lo, &hi))
            continue;
        if (adapter && a->has_peft)
            FSDP_TRY(fsdp_peft_read(&a->peft, unit, i, lo - p->offset, hi - lo,
                                    dst + (lo - begin)));
        else
            fsdp_model_init_range(m, unit, lo, hi, a->seed, dst + (lo - begin));
    }
    return FSDP_STATUS_OK;
}

void fsdp_adapt_free(fsdp_adapt *a)
{
    if (a->has_peft)
        fsdp_peft_close(&a->peft);
    if (a->base.units) /* built, whether or not binding the file to it succeeded */
        fsdp_model_free(&a->base);
    memset(a, 0, sizeof *a);
}
