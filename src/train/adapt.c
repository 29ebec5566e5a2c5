/*
 * adapt.c - LoRA adapters and frozen parameters applied to a run's model,
 * and its initialisation from the base's file (adapt.h).
 */
#include <stdlib.h>
#include <string.h>

#include "models/family.h"
#include "models/lora.h"
#include "ops/nf4.h"
#include "models/registry.h"
#include "train/adapt.h"

fsdp_status fsdp_adapt_apply(fsdp_adapt *a, fsdp_model *m, fsdp_modelfile *mf,
                             const fsdp_lora_config *lora, const char *freeze,
                             const char *adapter, uint64_t seed)
{
    memset(a, 0, sizeof *a);
    a->seed = seed;
    a->peft.fd = -1;
    a->mf = mf; /* unadapted too: fsdp_adapt_quantize asks it whether it stores NF4 */
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

static const fsdp_name quant_names[] = {
    {"none", FSDP_QUANT_NONE, "frozen weights in the compute dtype (--precision)"},
    {"nf4", FSDP_QUANT_NF4,
     "frozen linear weights in 4-bit NF4 with double quantization, as bitsandbytes stores them "
     "(0.28x the bytes of bf16 in shards and gathers; dequantized after each gather)"},
};
const fsdp_name_table fsdp_quant_names = FSDP_NAME_TABLE(quant_names);

fsdp_status fsdp_adapt_quantize(fsdp_adapt *a, fsdp_model *m, fsdp_quant q)
{
    bool from_file = a->mf && fsdp_modelfile_is_nf4(a->mf);
    if (q == FSDP_QUANT_NONE && !from_file)
        return FSDP_STATUS_OK;
    if (!a->active)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s: NF4 weights do not train; train LoRA adapters on them "
                              "(--lora R) or freeze them (--freeze PATTERN)",
                              from_file ? "the model's linear weights are stored in 4 bits"
                                        : "--quantize nf4");
    if (from_file) {
        FSDP_TRY(fsdp_modelfile_mark_nf4(a->mf, m));
    } else {
        const fsdp_model_family *f = m->family;
        if (!f->n_lora_modules)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "--quantize nf4: %s names no linear layers to quantize",
                                  f->title);
        for (int u = 0; u < m->n_units; u++)
            for (int i = 0; i < m->units[u].n_params; i++)
                if (fsdp_lora_is_linear_weight(m, u, i))
                    m->units[u].params[i].nf4 = m->units[u].params[i].frozen;
    }
    m->nf4 = true;
    return fsdp_model_relayout(m);
}

fsdp_status fsdp_adapt_shape(const char *model, const fsdp_lora_config *lora,
                             const char *freeze, fsdp_quant q, fsdp_model *m)
{
    fsdp_modelfile *mf = NULL;
    memset(m, 0, sizeof *m);
    FSDP_TRY(fsdp_modelfile_resolve(model, m, &mf));
    fsdp_adapt a;
    fsdp_status st = fsdp_adapt_apply(&a, m, mf, lora, freeze, NULL, 0);
    if (st == FSDP_STATUS_OK)
        st = fsdp_adapt_quantize(&a, m, q);
    fsdp_adapt_free(&a);
    fsdp_modelfile_close(mf); /* bound to m: closed first */
    if (st != FSDP_STATUS_OK)
        fsdp_model_free(m);
    return st;
}

/* Blocks [lo, hi) of NF4 parameter p (unit coordinates, whole blocks) from
 * its initialiser: the whole parameter drawn and quantized, as the double
 * quantization needs every block's absmax. */
static fsdp_status seed_nf4(const fsdp_adapt *a, const fsdp_model *m, int unit,
                            const fsdp_param_spec *p, size_t lo, size_t hi, uint8_t *codes,
                            float *absmax)
{
    float *w = malloc((p->numel + fsdp_nf4_blocks(p->numel)) * sizeof *w);
    uint8_t *q = malloc(p->numel / 2 + 1);
    float *am = w ? w + p->numel : NULL;
    size_t first = lo - p->offset;
    bool ok = w && q;
    if (ok) {
        fsdp_model_init_range(m, unit, p->offset, p->offset + p->numel, a->seed, w);
        ok = fsdp_nf4_quantize_tensor(w, p->numel, q, am);
    }
    if (ok) {
        memcpy(codes, q + first / 2, (hi - lo) / 2);
        memcpy(absmax, am + first / FSDP_NF4_BLOCK, (hi - lo) / FSDP_NF4_BLOCK * sizeof *absmax);
    }
    free(w);
    free(q);
    return ok ? FSDP_STATUS_OK
              : fsdp_error_set(FSDP_STATUS_OOM, "out of host memory quantizing %s", p->name);
}

fsdp_status fsdp_adapt_init_nf4_fn(void *arg, const fsdp_model *m, int unit, size_t begin,
                                   size_t end, uint8_t *codes, float *absmax)
{
    const fsdp_adapt *a = arg;
    if (a->mf)
        return fsdp_modelfile_read_nf4(a->mf, m, unit, begin, end, codes, absmax);
    memset(codes, 0x77, (end - begin) / 2); /* padding: code 7 is 0.0 */
    memset(absmax, 0, (end - begin) / FSDP_NF4_BLOCK * sizeof *absmax);
    const fsdp_unit_spec *us = &m->units[unit];
    for (int i = 0; i < us->n_params; i++) {
        const fsdp_param_spec *p = &us->params[i];
        size_t lo, hi;
        if (p->nf4 && fsdp_param_overlap(p, begin, end, &lo, &hi))
            FSDP_TRY(seed_nf4(a, m, unit, p, lo, hi, codes + (lo - begin) / 2,
                              absmax + (lo - begin) / FSDP_NF4_BLOCK));
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
