/*
 * modelfile_flat.c - reading flat weight files (llm.c, safetensors: one
 * tensor per parameter at a byte offset) by unit range, and the element
 * types they hold.
 *
 * A format's bind turns each of the model's parameters into an
 * fsdp_tensor_src (byte offset, dtype, stored elements, transpose); a range
 * read is then a few preads per parameter. Transposed tensors (HF Conv1D
 * weights) are read a band of fsdp rows at a time: for each stored row, one
 * pread of the band's columns, so a shard costs O(rows) reads, not one per
 * element.
 */
#include <stdlib.h>
#include <string.h>

#include "ckpt/bnb4.h"
#include "ckpt/modelfile_internal.h"
#include "core/bf16.h"

#define MF_BAND_NUMEL ((size_t)1 << 20) /* elements staged per transposed band */
#define MF_RAW_NUMEL ((size_t)1 << 16)  /* elements converted per direct read */

int fsdp_file_dtype_size(fsdp_file_dtype dt)
{
    return dt == FSDP_FILE_F32 ? 4 : dt == FSDP_FILE_BF16 || dt == FSDP_FILE_F16 ? 2 : 0;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13); /* inf / nan */
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void fsdp_file_dtype_to_f32(fsdp_file_dtype dt, const void *src, size_t n, float *dst)
{
    const uint16_t *h = src;
    switch (dt) {
    case FSDP_FILE_F32: memcpy(dst, src, n * 4); break;
    case FSDP_FILE_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = fsdp_bf16_to_f32(h[i]);
        break;
    case FSDP_FILE_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = f16_to_f32(h[i]);
        break;
    default: FSDP_ASSERT(!"unconvertible dtype");
    }
}

fsdp_status fsdp_flat_prepare(fsdp_modelfile *mf, const fsdp_model *m)
{
    free(mf->src);
    free(mf->unit_base);
    mf->src = NULL;
    mf->unit_base = calloc((size_t)m->n_units + 1, sizeof *mf->unit_base);
    if (!mf->unit_base)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    int n = 0;
    for (int u = 0; u < m->n_units; u++) {
        mf->unit_base[u] = n;
        n += m->units[u].n_params;
    }
    mf->unit_base[m->n_units] = n;
    mf->src = calloc((size_t)n + 1, sizeof *mf->src);
    if (!mf->src)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    return FSDP_STATUS_OK;
}

/* n bytes at `off` of the file holding tensor s. */
static fsdp_status mf_pread(const fsdp_modelfile *mf, const fsdp_tensor_src *s, void *buf,
                            size_t n, uint64_t off)
{
    return fsdp_modelfile_pread(mf, s->part, buf, n, off);
}

/* n elements at element index `first` of the stored tensor, as fp32. raw
 * holds MF_RAW_NUMEL 16-bit values. */
static fsdp_status read_elems(const fsdp_modelfile *mf, const fsdp_tensor_src *s, uint64_t first,
                              size_t n, float *dst, uint16_t *raw)
{
    uint64_t esz = (uint64_t)fsdp_file_dtype_size(s->dtype);
    if (s->dtype == FSDP_FILE_F32)
        return mf_pread(mf, s, dst, n * 4, s->offset + first * 4);
    while (n > 0) {
        size_t k = n < MF_RAW_NUMEL ? n : MF_RAW_NUMEL;
        FSDP_TRY(mf_pread(mf, s, raw, k * esz, s->offset + first * esz));
        fsdp_file_dtype_to_f32(s->dtype, raw, k, dst);
        dst += k;
        first += k;
        n -= k;
    }
    return FSDP_STATUS_OK;
}

/* Elements [a, b) of one parameter (fsdp's row-major layout). */
static fsdp_status read_param(const fsdp_modelfile *mf, const fsdp_tensor_src *s, size_t a,
                              size_t b, float *dst, uint16_t *raw, float **band)
{
    if (s->nf4) /* a bnb-4bit directory's weight: dequantized */
        return fsdp_bnb4_read(mf, &mf->bnb4->t[s->nf4 - 1], a, b, dst);
    if (!s->transposed) {
        size_t stored = b < s->file_numel ? b : (size_t)s->file_numel;
        if (a < stored)
            FSDP_TRY(read_elems(mf, s, a, stored - a, dst, raw));
        if (stored < b) {
            size_t z0 = a > stored ? a : stored;
            memset(dst + (z0 - a), 0, (b - z0) * sizeof *dst);
        }
        return FSDP_STATUS_OK;
    }
    /* fsdp (K, R) row-major; the file holds (R, K): ours[o * R + i] = file[i * K + o] */
    size_t K = (size_t)s->rows, R = (size_t)s->cols;
    size_t o_first = a / R, o_last = (b - 1) / R;
    size_t band_rows = MF_BAND_NUMEL / R ? MF_BAND_NUMEL / R : 1;
    if (!*band && !(*band = malloc(band_rows * R * sizeof **band)))
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", mf->path);
    float *tmp = *band;
    for (size_t o0 = o_first; o0 <= o_last; o0 += band_rows) {
        size_t nr = o_last + 1 - o0 < band_rows ? o_last + 1 - o0 : band_rows;
        for (size_t i = 0; i < R; i++)
            FSDP_TRY(read_elems(mf, s, (uint64_t)i * K + o0, nr, tmp + i * nr, raw));
        for (size_t o = o0; o < o0 + nr; o++) {
            size_t e0 = o * R > a ? o * R : a, e1 = (o + 1) * R < b ? (o + 1) * R : b;
            for (size_t e = e0; e < e1; e++)
                dst[e - a] = tmp[(e - o * R) * nr + (o - o0)];
        }
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_flat_read_range(const fsdp_modelfile *mf, int unit, size_t begin, size_t hi,
                                 float *dst)
{
    const fsdp_unit_spec *us = &mf->model->units[unit];
    uint16_t *raw = malloc(MF_RAW_NUMEL * sizeof *raw);
    float *band = NULL;
    if (!raw)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", mf->path);
    fsdp_status st = FSDP_STATUS_OK;
    for (int i = 0; i < us->n_params && st == FSDP_STATUS_OK; i++) {
        const fsdp_param_spec *p = &us->params[i];
        size_t a = begin > p->offset ? begin : p->offset;
        size_t b = hi < p->offset + p->numel ? hi : p->offset + p->numel;
        if (a >= b)
            continue;
        st = read_param(mf, &mf->src[mf->unit_base[unit] + i], a - p->offset, b - p->offset,
                        dst + (a - begin), raw, &band);
    }
    free(band);
    free(raw);
    return st;
}
