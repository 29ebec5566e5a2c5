/*
 * modelfile_nf4.c - NF4 shards of a model's frozen linear weights, read
 * from any weight file (modelfile.h's fsdp_modelfile_read_nf4).
 *
 * A bnb-4bit directory (bnb4.h) gives a weight's stored codes and the fp32
 * absmax of the range's blocks, reading only those blocks' bytes. A file of
 * floats gives a parameter quantized as bitsandbytes would quantize it
 * (ops/nf4.h): the 4-bit codes of a range need only its blocks, but the
 * double quantization's offset is the mean of the whole tensor's absmax,
 * so the first call for a tensor reads and quantizes it whole and caches
 * its double-quantization state (absmax codes, nested absmax, offset: 1/64
 * of a byte per element and then some) under that tensor's once-guard;
 * every call then reads and quantizes its own range only.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/bnb4.h"
#include "ckpt/modelfile_internal.h"
#include "ops/nf4.h"

/* One tensor's double quantization, computed once. */
typedef struct nf4_state {
    pthread_mutex_t lock; /* the once-guard: held while computing */
    bool done;
    uint8_t *qabsmax;     /* [blocks] */
    float *nested;        /* [nested blocks] */
    float offset;
} nf4_state;

struct fsdp_nf4_cache {
    int n;                /* the bound model's parameters, in unit order (mf->src's) */
    nf4_state *s;
};

bool fsdp_modelfile_is_nf4(const fsdp_modelfile *mf) { return mf->bnb4 && mf->bnb4->n > 0; }

/* mf->nf4_cache_free: release the cache and clear it. */
static void cache_free(fsdp_modelfile *mf)
{
    struct fsdp_nf4_cache *c = mf->nf4_cache;
    if (!c)
        return;
    for (int i = 0; i < c->n; i++) {
        pthread_mutex_destroy(&c->s[i].lock);
        free(c->s[i].qabsmax);
        free(c->s[i].nested);
    }
    free(c->s);
    free(c);
    mf->nf4_cache = NULL;
    mf->nf4_cache_free = NULL;
}

/* The index (mf->src order) of the bound model's parameter named `name` in
 * unit `unit`, and it; -1 if the bound model has none. */
static int base_param(const fsdp_modelfile *mf, int unit, const char *name,
                      const fsdp_param_spec **q)
{
    const fsdp_unit_spec *bs = &mf->model->units[unit];
    for (int k = 0; k < bs->n_params; k++)
        if (!strcmp(bs->params[k].name, name)) {
            *q = &bs->params[k];
            return mf->unit_base[unit] + k;
        }
    return -1;
}

fsdp_status fsdp_modelfile_mark_nf4(const fsdp_modelfile *mf, fsdp_model *m)
{
    if (!fsdp_modelfile_is_nf4(mf))
        return FSDP_STATUS_OK;
    for (int u = 0; u < m->n_units && u < mf->model->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++) {
            fsdp_param_spec *p = &m->units[u].params[i];
            const fsdp_param_spec *q;
            int k = base_param(mf, u, p->name, &q);
            if (k < 0 || !mf->src[k].nf4)
                continue;
            const char *what = mf->bnb4->t[mf->src[k].nf4 - 1].name;
            if (!p->frozen)
                return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "'%s': weight '%s' is stored in 4 "
                                      "bits and cannot train; freeze it (--freeze or --lora "
                                      "targets covering it)", mf->path, what);
            if (p->numel % FSDP_NF4_BLOCK)
                return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "'%s': weight '%s' has %zu "
                                      "elements, not whole blocks of %d; fsdp keeps NF4 weights "
                                      "of whole blocks only", mf->path, what, p->numel,
                                      FSDP_NF4_BLOCK);
            p->nf4 = true;
        }
    return FSDP_STATUS_OK;
}

/* The cache for mf's bound model, made on first use (under a process-wide lock). */
static fsdp_status cache_get(const fsdp_modelfile *mf, struct fsdp_nf4_cache **out)
{
    static pthread_mutex_t make = PTHREAD_MUTEX_INITIALIZER;
    fsdp_modelfile *w = (fsdp_modelfile *)mf; /* the cache is the file's, shared by readers */
    fsdp_status st = FSDP_STATUS_OK;
    pthread_mutex_lock(&make);
    if (!w->nf4_cache) {
        int n = mf->unit_base[mf->model->n_units];
        struct fsdp_nf4_cache *c = calloc(1, sizeof *c);
        if (c && !(c->s = calloc((size_t)n + 1, sizeof *c->s))) {
            free(c);
            c = NULL;
        }
        if (!c)
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", mf->path);
        for (int i = 0; c && i < n; i++, c->n++)
            pthread_mutex_init(&c->s[i].lock, NULL);
        w->nf4_cache = c;
        w->nf4_cache_free = c ? cache_free : NULL;
    }
    *out = w->nf4_cache;
    pthread_mutex_unlock(&make);
    return st;
}

/* Tensor k's (parameter q of unit `unit`) double quantization, computed
 * once: the whole tensor read and quantized. */
static fsdp_status state_get(const fsdp_modelfile *mf, int unit, int k, const fsdp_param_spec *q,
                             const nf4_state **out)
{
    struct fsdp_nf4_cache *c;
    FSDP_TRY(cache_get(mf, &c));
    nf4_state *s = &c->s[k];
    fsdp_status st = FSDP_STATUS_OK;
    pthread_mutex_lock(&s->lock);
    if (!s->done) {
        size_t n = q->numel, nb = fsdp_nf4_blocks(n);
        float *w = malloc(n * sizeof *w), *am = malloc(nb * sizeof *am);
        uint8_t *codes = malloc(n / 2 + 1);
        s->qabsmax = malloc(nb);
        s->nested = malloc(fsdp_nf4_nested_blocks(nb) * sizeof *s->nested);
        if (!w || !am || !codes || !s->qabsmax || !s->nested)
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory quantizing %s of '%s'",
                                q->name, mf->path);
        if (st == FSDP_STATUS_OK)
            st = fsdp_modelfile_read_range(mf, unit, q->offset, q->offset + n, w);
        if (st == FSDP_STATUS_OK) {
            fsdp_nf4_quantize(w, n, codes, am);
            fsdp_nf4_double_quant(am, nb, s->qabsmax, s->nested, &s->offset);
            s->done = true;
        } else {
            free(s->qabsmax);
            free(s->nested);
            s->qabsmax = NULL;
            s->nested = NULL;
        }
        free(w);
        free(am);
        free(codes);
    }
    pthread_mutex_unlock(&s->lock);
    *out = s;
    return st;
}

/* Blocks [lo, hi) (unit coordinates of m, whole blocks) of NF4 parameter p
 * of m, from a file of floats: the range read and quantized, its absmax
 * from the tensor's cached double quantization. */
static fsdp_status quantize_range(const fsdp_modelfile *mf, int unit, int k,
                                  const fsdp_param_spec *p, const fsdp_param_spec *q, size_t lo,
                                  size_t hi, uint8_t *codes, float *absmax)
{
    const nf4_state *s;
    FSDP_TRY(state_get(mf, unit, k, q, &s));
    size_t first = lo - p->offset, n = hi - lo;
    float *w = malloc(n * sizeof *w + fsdp_nf4_blocks(n) * sizeof *w);
    if (!w)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory quantizing %s of '%s'",
                              p->name, mf->path);
    fsdp_status st = fsdp_modelfile_read_range(mf, unit, q->offset + first, q->offset + first + n,
                                               w);
    if (st == FSDP_STATUS_OK) {
        fsdp_nf4_quantize(w, n, codes, w + n);
        fsdp_nf4_absmax(s->qabsmax, s->nested, s->offset, first / FSDP_NF4_BLOCK,
                        n / FSDP_NF4_BLOCK, absmax);
    }
    free(w);
    return st;
}

fsdp_status fsdp_modelfile_read_nf4(const fsdp_modelfile *mf, const fsdp_model *m, int unit,
                                    size_t begin, size_t end, uint8_t *codes, float *absmax)
{
    const fsdp_unit_spec *us = unit >= 0 && unit < m->n_units ? &m->units[unit] : NULL;
    if (!us || !mf->model || unit >= mf->model->n_units || begin < us->nf4_begin ||
        (begin - us->nf4_begin) % FSDP_NF4_BLOCK || (end - begin) % FSDP_NF4_BLOCK)
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "reading NF4 from '%s': a range of unit %d "
                              "not in whole blocks of its NF4 group", mf->path, unit);
    memset(codes, 0x77, (end - begin) / 2); /* padding: code 7 is 0.0 */
    memset(absmax, 0, (end - begin) / FSDP_NF4_BLOCK * sizeof *absmax);
    for (int i = 0; i < us->n_params; i++) {
        const fsdp_param_spec *p = &us->params[i], *q;
        size_t lo, hi;
        if (!p->nf4 || !fsdp_param_overlap(p, begin, end, &lo, &hi))
            continue;
        int k = base_param(mf, unit, p->name, &q);
        if (k < 0 || q->numel != p->numel)
            return fsdp_error_set(FSDP_STATUS_INTERNAL, "reading NF4 from '%s': it has no "
                                  "parameter '%s' of %zu elements", mf->path, p->name, p->numel);
        uint8_t *c = codes + (lo - begin) / 2;
        float *a = absmax + (lo - begin) / FSDP_NF4_BLOCK;
        if (mf->src[k].nf4)
            FSDP_TRY(fsdp_bnb4_read_blocks(mf, &mf->bnb4->t[mf->src[k].nf4 - 1],
                                           (lo - p->offset) / FSDP_NF4_BLOCK,
                                           (hi - lo) / FSDP_NF4_BLOCK, c, a));
        else
            FSDP_TRY(quantize_range(mf, unit, k, p, q, lo, hi, c, a));
    }
    return FSDP_STATUS_OK;
}
