/*
 * model.c - model-independent helpers over a model's unit list: building
 * it (for the families), parameter initialisation of any slice of a unit,
 * lookup by name, and teardown; and the recompute modes' names.
 *
 * Initialisation is a pure function of (seed, parameter name, element index
 * within the parameter) through the counter-based RNG of core/rng.h, so a
 * rank can initialise exactly its own shard of a unit, and every world size
 * gives the same initial model (docs/determinism.md, "Initialisation").
 *
 * Assumes a unit's parameters tile [0, unit numel) without gaps (every
 * model builder lays them out so, and fsdp_model_relayout keeps it so).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "models/model.h"
#include "models/weights.h"
#include "ops/nf4.h"

static const fsdp_name recompute_names[] = {
    {"none", FSDP_RECOMPUTE_NONE, "keep every block's activations from forward to backward"},
    {"block", FSDP_RECOMPUTE_BLOCK,
     "keep only each block's input; rerun the block's forward up to its MLP activation in its "
     "backward (about a fifth more FLOPs; one block's activations instead of every block's)"},
    {"elementwise", FSDP_RECOMPUTE_ELEMENTWISE,
     "keep the matmul and attention outputs; rerun the norms and the activation function "
     "(GELU/SwiGLU) in backward (little compute, less memory)"},
};
const fsdp_name_table fsdp_recompute_names = FSDP_NAME_TABLE(recompute_names);

fsdp_status fsdp_model_alloc_units(fsdp_model *m, const char *title, const void *cfg,
                                   size_t cfg_bytes, int n_layer, int n_root,
                                   int n_layer_params, const char *layer_prefix)
{
    memset(m, 0, sizeof *m);
    m->impl = malloc(cfg_bytes);
    m->units = calloc((size_t)n_layer + 1, sizeof *m->units);
    if (!m->impl || !m->units) {
        fsdp_model_free(m);
        return fsdp_error_set(FSDP_STATUS_OOM, "host allocation for a %d-layer %s failed",
                              n_layer, title);
    }
    memcpy(m->impl, cfg, cfg_bytes);
    m->n_units = n_layer + 1;
    for (int u = 0; u < m->n_units; u++) {
        fsdp_unit_spec *us = &m->units[u];
        if (u == 0)
            snprintf(us->name, sizeof us->name, "root");
        else
            snprintf(us->name, sizeof us->name, "%s.%d", layer_prefix, u - 1);
        us->params = calloc(u == 0 ? n_root : n_layer_params, sizeof *us->params);
        if (!us->params) {
            fsdp_model_free(m);
            return fsdp_error_set(FSDP_STATUS_OOM,
                                  "host allocation of %s parameter specs failed", title);
        }
    }
    return FSDP_STATUS_OK;
}

void fsdp_model_set_shape(fsdp_model *m, int vocab_size, int padded_vocab_size, int max_seq_len,
                          int n_layer, int n_head, int n_embd)
{
    m->vocab_size = vocab_size;
    m->padded_vocab_size = padded_vocab_size;
    m->max_seq_len = max_seq_len;
    m->n_layer = n_layer;
    m->n_head = n_head;
    m->n_embd = n_embd;
}

void fsdp_unit_add_param(fsdp_unit_spec *u, const char *name, int64_t d0, int64_t d1,
                         fsdp_init_kind init, float std, bool decay)
{
    fsdp_param_spec *p = &u->params[u->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = d1 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->numel = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    p->offset = u->numel;
    p->init = init;
    p->std = std;
    p->decay = decay;
    u->numel += p->numel;
    u->nf4_begin = u->numel;
    u->train_numel += p->numel;
}

fsdp_status fsdp_model_relayout(fsdp_model *m)
{
    m->train_numel = 0;
    for (int u = 0; u < m->n_units; u++) {
        fsdp_unit_spec *us = &m->units[u];
        for (int i = 0; i < us->n_params; i++) {
            const fsdp_param_spec *p = &us->params[i];
            if (p->nf4 && (!p->frozen || p->numel % FSDP_NF4_BLOCK))
                return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                      "%s of %s cannot be stored in NF4: %s", p->name, m->name,
                                      !p->frozen ? "it trains (only frozen weights are quantized)"
                                                 : "its size is not a multiple of 64 elements");
        }
        for (int i = 0; i + 1 < us->n_params; i++) {
            const fsdp_param_spec *p = &us->params[i], *q = &us->params[i + 1];
            if (p->fuse_next && p->frozen != q->frozen)
                return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                      "%s and %s are one fused tensor in %s: freeze both or "
                                      "neither (%s is %s, %s is not)",
                                      p->name, q->name, m->name, p->frozen ? p->name : q->name,
                                      "frozen", p->frozen ? q->name : p->name);
            if (p->fuse_next && p->nf4 != q->nf4)
                return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                      "%s and %s are one fused tensor in %s: quantize both or "
                                      "neither", p->name, q->name, m->name);
        }
        /* trainable first, then frozen dense, then frozen NF4 (group = frozen + nf4) */
        size_t off = 0;
        for (int group = 0; group < 3; group++) {
            if (group == 1)
                us->train_numel = off;
            if (group == 2)
                us->nf4_begin = off;
            for (int i = 0; i < us->n_params; i++) {
                fsdp_param_spec *p = &us->params[i];
                if ((int)p->frozen + (int)p->nf4 != group)
                    continue;
                p->offset = off;
                off += p->numel;
            }
        }
        us->numel = off;
        m->train_numel += us->train_numel;
    }
    return FSDP_STATUS_OK;
}

/* Fill dst[0 .. n) with elements [first, first + n) of parameter p. */
static void init_param_slice(const fsdp_param_spec *p, size_t first, size_t n, uint64_t seed,
                             float *dst)
{
    switch (p->init) {
    case FSDP_INIT_ZEROS:
        memset(dst, 0, n * sizeof *dst);
        break;
    case FSDP_INIT_ONES:
        for (size_t i = 0; i < n; i++)
            dst[i] = 1.0f;
        break;
    case FSDP_INIT_UNIFORM: {
        uint64_t stream = fsdp_rng_hash_str(p->name);
        for (size_t i = 0; i < n; i++)
            dst[i] = p->std * (2.0f * fsdp_rng_uniform(seed, stream, first + i) - 1.0f);
        break;
    }
    case FSDP_INIT_NORMAL:
    default: {
        fsdp_rng_normal_fill(seed, fsdp_rng_hash_str(p->name), first, n, p->std, dst);
        break;
    }
    }
}

void fsdp_model_init_range(const fsdp_model *m, int unit, size_t begin, size_t end, uint64_t seed,
                           float *dst)
{
    FSDP_ASSERT(m && unit >= 0 && unit < m->n_units && begin <= end);
    const fsdp_unit_spec *u = &m->units[unit];
    for (int i = 0; i < u->n_params; i++) {
        const fsdp_param_spec *p = &u->params[i];
        size_t lo, hi;
        if (fsdp_param_overlap(p, begin, end, &lo, &hi))
            init_param_slice(p, lo - p->offset, hi - lo, seed, dst + (lo - begin));
    }
    /* Padding past the unit's parameters (shards are padded to a multiple
     * of world x alignment). */
    if (end > u->numel) {
        size_t lo = begin > u->numel ? begin : u->numel;
        memset(dst + (lo - begin), 0, (end - lo) * sizeof *dst);
    }
}

const fsdp_param_spec *fsdp_model_find_param(const fsdp_model *m, const char *name, int *unit)
{
    if (!m || !name)
        return NULL;
    for (int u = 0; u < m->n_units; u++) {
        for (int i = 0; i < m->units[u].n_params; i++) {
            if (strcmp(m->units[u].params[i].name, name) == 0) {
                if (unit)
                    *unit = u;
                return &m->units[u].params[i];
            }
        }
    }
    return NULL;
}

const void *fsdp_unit_param(const fsdp_model *m, int unit, const void *params, int i,
                            fsdp_dtype dt)
{
    if (i >= m->units[unit].n_params)
        return NULL;
    return (const char *)params + m->units[unit].params[i].offset * fsdp_dtype_size(dt);
}

float *fsdp_unit_grad(const fsdp_model *m, int unit, float *grads, int i)
{
    if (!grads || i >= m->units[unit].n_params || m->units[unit].params[i].frozen)
        return NULL;
    return grads + m->units[unit].params[i].offset;
}

void fsdp_model_free(fsdp_model *m)
{
    if (!m)
        return;
    if (m->units) {
        for (int u = 0; u < m->n_units; u++)
            free(m->units[u].params);
        free(m->units);
    }
    free(m->impl); /* model builders allocate impl with malloc, self-contained */
    free(m->lora_impl);
    memset(m, 0, sizeof *m);
}

void fsdp_weight_tensor_of_param(const fsdp_param_spec *p, fsdp_weight_tensor *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", p->name);
    out->ndim = p->ndim;
    for (int d = 0; d < p->ndim; d++)
        out->shape[d] = (uint64_t)p->shape[d];
    out->stored_numel = p->numel;
}

int fsdp_weight_layer_of(const char *s, const char *prefix, const char **rest)
{
    size_t k = strlen(prefix);
    if (strncmp(s, prefix, k))
        return -1;
    s += k;
    int l = 0, digits = 0;
    while (*s >= '0' && *s <= '9' && digits < 5) {
        l = l * 10 + (*s++ - '0');
        digits++;
    }
    if (digits == 0 || digits > 4 || (digits > 1 && s[-digits] == '0') || l >= 4096 || *s != '.')
        return -1;
    *rest = s + 1;
    return l;
}
