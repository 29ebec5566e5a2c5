/*
 * modelfile_nf4.c - NF4 shards of a model's frozen linear weights, read
 * from any weight file (modelfile.h's fsdp_modelfile_read_nf4).
 *
 * A file of floats gives a parameter quantized as bitsandbytes would
 * quantize it (ops/nf4.h): the 4-bit codes of a range need only its
 * blocks, but the double quantization's offset is the mean of the whole
 * tensor's absmax, so each call reads and quantizes the whole parameter and
 * keeps the range's codes and fp32 absmax.
 */
#include <stdlib.h>
#include <string.h>

#include "ckpt/modelfile_internal.h"
#include "ops/nf4.h"

bool fsdp_modelfile_is_nf4(const fsdp_modelfile *mf)
{
    (void)mf;
    return false; /* no format stores NF4 yet */
}

fsdp_status fsdp_modelfile_mark_nf4(const fsdp_modelfile *mf, fsdp_model *m)
{
    (void)m;
    if (!fsdp_modelfile_is_nf4(mf))
        return FSDP_STATUS_OK;
    return fsdp_error_set(FSDP_STATUS_INTERNAL, "'%s': NF4 tensors are not read yet", mf->path);
}

/* Blocks [lo, hi) (unit coordinates, whole blocks) of NF4 parameter p of m,
 * read whole from mf by name and quantized. */
static fsdp_status quantize_param(const fsdp_modelfile *mf, const fsdp_model *m, int unit,
                                  const fsdp_param_spec *p, size_t lo, size_t hi, uint8_t *codes,
                                  float *absmax)
{
    size_t n = p->numel, nb = fsdp_nf4_blocks(n);
    float *w = malloc(n * sizeof *w), *am = malloc(nb * sizeof *am);
    float *nested = malloc(fsdp_nf4_nested_blocks(nb) * sizeof *nested);
    uint8_t *q = malloc(n / 2 + nb);
    fsdp_status st = FSDP_STATUS_OK;
    if (!w || !am || !nested || !q)
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory quantizing %s of '%s'", p->name,
                            mf->path);
    if (st == FSDP_STATUS_OK)
        st = fsdp_modelfile_read_by_name(mf, m, unit, p->offset, p->offset + n, w);
    if (st == FSDP_STATUS_OK) {
        float offset;
        size_t first = lo - p->offset;
        fsdp_nf4_quantize(w, n, q, am);
        fsdp_nf4_double_quant(am, nb, q + n / 2, nested, &offset);
        memcpy(codes, q + first / 2, (hi - lo) / 2);
        fsdp_nf4_absmax(q + n / 2, nested, offset, first / FSDP_NF4_BLOCK,
                        (hi - lo) / FSDP_NF4_BLOCK, absmax);
    }
    free(w);
    free(am);
    free(nested);
    free(q);
    return st;
}

fsdp_status fsdp_modelfile_read_nf4(const fsdp_modelfile *mf, const fsdp_model *m, int unit,
                                    size_t begin, size_t end, uint8_t *codes, float *absmax)
{
    const fsdp_unit_spec *us = unit >= 0 && unit < m->n_units ? &m->units[unit] : NULL;
    if (!us || begin < us->nf4_begin || (begin - us->nf4_begin) % FSDP_NF4_BLOCK ||
        (end - begin) % FSDP_NF4_BLOCK)
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "reading NF4 from '%s': a range of unit %d "
                              "not in whole blocks of its NF4 group", mf->path, unit);
    memset(codes, 0x77, (end - begin) / 2); /* padding: code 7 is 0.0 */
    memset(absmax, 0, (end - begin) / FSDP_NF4_BLOCK * sizeof *absmax);
    for (int i = 0; i < us->n_params; i++) {
        const fsdp_param_spec *p = &us->params[i];
        size_t lo, hi;
        if (p->nf4 && fsdp_param_overlap(p, begin, end, &lo, &hi))
            FSDP_TRY(quantize_param(mf, m, unit, p, lo, hi, codes + (lo - begin) / 2,
                                    absmax + (lo - begin) / FSDP_NF4_BLOCK));
    }
    return FSDP_STATUS_OK;
}
