/*
 * modelfile.c - GPT-2 weights from and to llm.c files, safetensors files
 * and checkpoint directories, read by unit range (see modelfile.h).
 *
 * llm.c and safetensors files are flat: bind turns each of the model's
 * parameters into an fsdp_tensor_src (byte offset, dtype, transpose) and a
 * range read is a few preads per parameter. Transposed tensors (HF Conv1D
 * weights) are read a band of fsdp rows at a time: for each stored row,
 * one pread of the band's columns, so a shard costs O(rows) reads, not one
 * per element. A checkpoint is read through ckpt.h's shard readers, which
 * check every block's checksum; the unit range is cut at the writing
 * world's shard boundaries, so a checkpoint written by N devices loads into
 * any number of ranks.
 *
 * The llm.c parameter order is restated here (llmc.c keeps its own copy
 * for whole-file reads): a range read needs each tensor's byte offset,
 * which llmc.h does not expose.
 */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt/llmc.h"
#include "ckpt/modelfile.h"
#include "ckpt/safetensors.h"
#include "core/fileio.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/log.h"
#include "ops/ops.h"

#define MF_BAND_NUMEL ((size_t)1 << 20) /* elements staged per transposed band */
#define MF_RAW_NUMEL ((size_t)1 << 16)  /* elements converted per direct read */

struct fsdp_modelfile {
    fsdp_modelfile_kind kind;
    char path[FSDP_CKPT_PATH_MAX];     /* the file or checkpoint actually read */
    fsdp_gpt2_config cfg;
    const char *dtype_name;
    int fd;                            /* llm.c, safetensors */
    fsdp_st_file st;                   /* safetensors header */
    fsdp_dtype llmc_dt;
    fsdp_ckpt_manifest man;            /* checkpoint */
    size_t *ck_shard;                  /* [n_units] shard numel per rank file */
    const fsdp_model *model;           /* bound model */
    fsdp_tensor_src *src;              /* [params] after bind (flat files) */
    int *unit_base;                    /* [n_units] index of the unit's first parameter */
};

const char *fsdp_modelfile_kind_name(fsdp_modelfile_kind k)
{
    static const char *const names[FSDP_MODELFILE_KIND_COUNT] = {"llm.c model file",
                                                                 "safetensors file", "checkpoint"};
    return (unsigned)k < FSDP_MODELFILE_KIND_COUNT ? names[k] : "?";
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

fsdp_modelfile_kind fsdp_modelfile_kind_of(const char *path)
{
    if (is_dir(path))
        return FSDP_MODELFILE_CKPT;
    if (ends_with(path, ".safetensors"))
        return FSDP_MODELFILE_SAFETENSORS;
    if (ends_with(path, ".bin"))
        return FSDP_MODELFILE_LLMC;
    return FSDP_MODELFILE_CKPT;
}

bool fsdp_modelfile_is_path(const char *spec)
{
    return spec && (ends_with(spec, ".bin") || ends_with(spec, ".safetensors") || is_dir(spec));
}

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

/* ---- open ------------------------------------------------------------------ */

/* A checkpoint path: one complete checkpoint, or a --ckpt-dir (its newest). */
static fsdp_status resolve_ckpt(const char *path, char *out, size_t n, uint64_t *step)
{
    char manifest[FSDP_CKPT_PATH_MAX + 16];
    struct stat sb;
    snprintf(manifest, sizeof manifest, "%s/manifest", path);
    if (!is_dir(path))
        return fsdp_error_set(FSDP_STATUS_IO, "'%s' is neither a .bin or .safetensors model file "
                              "nor a checkpoint directory", path);
    if (stat(manifest, &sb) == 0) {
        if (!fsdp_ckpt_is_complete(path))
            return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint '%s' is incomplete (no DONE "
                                  "marker: its save was interrupted); use an earlier one", path);
        if (snprintf(out, n, "%s", path) >= (int)n)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "path '%.64s...' is too long", path);
        *step = 0;
        return FSDP_STATUS_OK;
    }
    bool found = false;
    FSDP_TRY(fsdp_ckpt_latest(path, step, &found));
    if (!found)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "'%s' holds no complete checkpoint (a step_N "
                              "directory with a DONE marker) and is not one", path);
    return fsdp_ckpt_step_path(out, n, path, *step, "");
}

static fsdp_status open_ckpt(fsdp_modelfile *mf, const char *path)
{
    uint64_t step;
    FSDP_TRY(resolve_ckpt(path, mf->path, sizeof mf->path, &step));
    char manifest[FSDP_CKPT_PATH_MAX + 16];
    snprintf(manifest, sizeof manifest, "%s/manifest", mf->path);
    FSDP_TRY(fsdp_ckpt_manifest_read(manifest, &mf->man));
    if (!mf->man.has_gpt2)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint manifest '%s' holds model '%s', "
                              "which is not a GPT-2 (its 'gpt2' line is '-')", manifest,
                              mf->man.model_name);
    mf->cfg = mf->man.gpt2;
    if (mf->man.padded_vocab_size != mf->cfg.padded_vocab_size ||
        mf->man.vocab_size != mf->cfg.vocab_size || mf->man.max_seq_len != mf->cfg.max_seq_len)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint manifest '%s': vocab_size %d, "
                              "padded_vocab_size %d, max_seq_len %d disagree with its 'gpt2' "
                              "line (vocab=%d, context=%d)", manifest, mf->man.vocab_size,
                              mf->man.padded_vocab_size, mf->man.max_seq_len,
                              mf->cfg.vocab_size, mf->cfg.max_seq_len);
    mf->ck_shard = calloc((size_t)mf->man.n_units, sizeof *mf->ck_shard);
    if (!mf->ck_shard)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    for (int u = 0; u < mf->man.n_units; u++)
        mf->ck_shard[u] = mf->man.units[u].shard_numel;
    mf->dtype_name = "fp32";
    return FSDP_STATUS_OK;
}

static fsdp_status open_flat(fsdp_modelfile *mf, const char *path)
{
    if (snprintf(mf->path, sizeof mf->path, "%s", path) >= (int)sizeof mf->path)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "path '%.64s...' is too long", path);
    if (mf->kind == FSDP_MODELFILE_LLMC) {
        FSDP_TRY(fsdp_llmc_read_config(path, &mf->cfg, &mf->llmc_dt));
        mf->dtype_name = mf->llmc_dt == FSDP_DTYPE_BF16 ? "bf16" : "fp32";
    } else {
        FSDP_TRY(fsdp_st_open(path, &mf->st));
        FSDP_TRY(fsdp_st_gpt2_config(&mf->st, &mf->cfg));
        static const char *const names[] = {"fp32", "bf16", "fp16"};
        int first = -1;
        mf->dtype_name = NULL;
        for (int i = 0; i < mf->st.n_tensors; i++) {
            int d = (int)mf->st.tensors[i].dtype;
            if (d > FSDP_FILE_F16)
                continue; /* an ignored buffer */
            if (first < 0)
                first = d;
            mf->dtype_name = d == first && (!mf->dtype_name || mf->dtype_name == names[d])
                                 ? names[d]
                                 : "mixed";
        }
    }
    mf->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (mf->fd < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open '%s': %s", path, strerror(errno));
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
    mf->kind = fsdp_modelfile_kind_of(path);
    fsdp_status st = mf->kind == FSDP_MODELFILE_CKPT ? open_ckpt(mf, path) : open_flat(mf, path);
    if (st != FSDP_STATUS_OK) {
        fsdp_modelfile_close(mf);
        return st;
    }
    *out = mf;
    return FSDP_STATUS_OK;
}

void fsdp_modelfile_close(fsdp_modelfile *mf)
{
    if (!mf)
        return;
    if (mf->fd >= 0)
        close(mf->fd);
    fsdp_st_free(&mf->st);
    fsdp_ckpt_manifest_free(&mf->man);
    free(mf->ck_shard);
    free(mf->src);
    free(mf->unit_base);
    free(mf);
}

const fsdp_gpt2_config *fsdp_modelfile_config(const fsdp_modelfile *mf) { return &mf->cfg; }
fsdp_modelfile_kind fsdp_modelfile_kind_get(const fsdp_modelfile *mf) { return mf->kind; }
const char *fsdp_modelfile_path(const fsdp_modelfile *mf) { return mf->path; }
const char *fsdp_modelfile_dtype_name(const fsdp_modelfile *mf)
{
    return mf->dtype_name ? mf->dtype_name : "fp32";
}
uint64_t fsdp_modelfile_step(const fsdp_modelfile *mf)
{
    return mf->kind == FSDP_MODELFILE_CKPT ? mf->man.step : 0;
}

/* ---- bind ------------------------------------------------------------------ */

/* llm.c's tensors in file order (as llmc.c); per-layer ones are stacked
 * over the L blocks as "h.<l>.<suffix>". */
static const struct {
    const char *suffix;
    bool per_layer;
} llmc_order[] = {
    {"wte.weight", false},         {"wpe.weight", false},       {"ln_1.weight", true},
    {"ln_1.bias", true},           {"attn.c_attn.weight", true}, {"attn.c_attn.bias", true},
    {"attn.c_proj.weight", true},  {"attn.c_proj.bias", true},  {"ln_2.weight", true},
    {"ln_2.bias", true},           {"mlp.c_fc.weight", true},   {"mlp.c_fc.bias", true},
    {"mlp.c_proj.weight", true},   {"mlp.c_proj.bias", true},   {"ln_f.weight", false},
    {"ln_f.bias", false},
};

static fsdp_status locate_llmc(fsdp_modelfile *mf, const fsdp_model *m)
{
    const int L = mf->cfg.n_layer;
    const uint64_t esz = mf->llmc_dt == FSDP_DTYPE_BF16 ? 2 : 4;
    const fsdp_file_dtype fdt = mf->llmc_dt == FSDP_DTYPE_BF16 ? FSDP_FILE_BF16 : FSDP_FILE_F32;
    uint64_t at = 256 * 4; /* after the header */
    for (size_t t = 0; t < sizeof llmc_order / sizeof llmc_order[0]; t++) {
        uint64_t per = 0;
        for (int l = 0; l < (llmc_order[t].per_layer ? L : 1); l++) {
            char name[64];
            if (llmc_order[t].per_layer)
                snprintf(name, sizeof name, "h.%d.%s", l, llmc_order[t].suffix);
            else
                snprintf(name, sizeof name, "%s", llmc_order[t].suffix);
            int unit = -1;
            const fsdp_param_spec *p = fsdp_model_find_param(m, name, &unit);
            if (!p)
                return fsdp_error_set(FSDP_STATUS_INTERNAL, "model '%s' lacks parameter '%s' of "
                                      "the llm.c layout", m->name, name);
            int k = mf->unit_base[unit] + (int)(p - m->units[unit].params);
            mf->src[k] = (fsdp_tensor_src){
                .offset = at + (uint64_t)l * p->numel * esz,
                .dtype = fdt,
                .file_numel = p->numel,
                .rows = (uint64_t)p->shape[0],
                .cols = p->ndim == 2 ? (uint64_t)p->shape[1] : 1,
            };
            per = p->numel;
        }
        at += per * esz * (uint64_t)(llmc_order[t].per_layer ? L : 1);
    }
    struct stat sb;
    if (fstat(mf->fd, &sb) != 0 || (uint64_t)sb.st_size != at)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "model file '%s' changed size while open (it "
                              "should be %" PRIu64 " bytes)", mf->path, at);
    return FSDP_STATUS_OK;
}

/* Open rank r's shard file of the checkpoint, validated against the
 * manifest; first is scratch of n_units entries. */
static fsdp_status open_rank_reader(const fsdp_modelfile *mf, int r, size_t *first,
                                    fsdp_ckpt_reader **out)
{
    const fsdp_ckpt_manifest *man = &mf->man;
    char p[FSDP_CKPT_PATH_MAX];
    FSDP_TRY(fsdp_ckpt_rank_path(p, sizeof p, mf->path, r));
    for (int u = 0; u < man->n_units; u++)
        first[u] = fsdp_ckpt_shard_first(man, u, r);
    fsdp_ckpt_shard_info info = {
        .run_id = man->run_id, .step = man->step, .adam_t = man->adam_t, .rank = r,
        .world_size = man->world_size, .n_units = man->n_units,
        .shard_numel = mf->ck_shard, .first = first,
    };
    return fsdp_ckpt_reader_open(out, p, &info);
}

/* Every rank file of the checkpoint opens and matches its manifest. */
static fsdp_status check_ckpt_files(fsdp_modelfile *mf)
{
    const fsdp_ckpt_manifest *man = &mf->man;
    size_t *first = calloc((size_t)man->n_units, sizeof *first);
    if (!first)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    fsdp_status st = FSDP_STATUS_OK;
    for (int r = 0; r < man->world_size && st == FSDP_STATUS_OK; r++) {
        fsdp_ckpt_reader *rd = NULL;
        st = open_rank_reader(mf, r, first, &rd);
        fsdp_ckpt_reader_close(rd);
    }
    free(first);
    return st;
}

fsdp_status fsdp_modelfile_bind(fsdp_modelfile *mf, const fsdp_model *m)
{
    const fsdp_gpt2_config *mc = m ? fsdp_gpt2_config_of(m) : NULL;
    if (!mc || memcmp(mc, &mf->cfg, sizeof *mc))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s '%s' does not hold model '%s'; build "
                              "the model from the file's config (fsdp_modelfile_config)",
                              fsdp_modelfile_kind_name(mf->kind), mf->path,
                              m ? m->name : "(null)");
    free(mf->src);
    free(mf->unit_base);
    mf->src = NULL;
    mf->model = NULL;
    mf->unit_base = calloc((size_t)m->n_units + 1, sizeof *mf->unit_base);
    if (!mf->unit_base)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    int n = 0;
    for (int u = 0; u < m->n_units; u++) {
        mf->unit_base[u] = n;
        n += m->units[u].n_params;
    }
    if (mf->kind == FSDP_MODELFILE_CKPT) {
        char manifest[FSDP_CKPT_PATH_MAX + 16];
        snprintf(manifest, sizeof manifest, "%s/manifest", mf->path);
        FSDP_TRY(fsdp_ckpt_manifest_check_model(&mf->man, manifest, m));
        FSDP_TRY(check_ckpt_files(mf));
    } else {
        mf->src = calloc((size_t)n + 1, sizeof *mf->src);
        if (!mf->src)
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
        if (mf->kind == FSDP_MODELFILE_LLMC)
            FSDP_TRY(locate_llmc(mf, m));
        else
            FSDP_TRY(fsdp_st_gpt2_locate(&mf->st, m, mf->src));
    }
    mf->model = m;
    return FSDP_STATUS_OK;
}

/* ---- read ------------------------------------------------------------------ */

static fsdp_status mf_pread(const fsdp_modelfile *mf, void *buf, size_t n, uint64_t off)
{
    return fsdp_pread_all(mf->fd, buf, n, off, "model file", mf->path);
}

/* n elements at element index `first` of the stored tensor, as fp32. raw
 * holds MF_RAW_NUMEL 16-bit values. */
static fsdp_status read_elems(const fsdp_modelfile *mf, const fsdp_tensor_src *s, uint64_t first,
                              size_t n, float *dst, uint16_t *raw)
{
    uint64_t esz = (uint64_t)fsdp_file_dtype_size(s->dtype);
    if (s->dtype == FSDP_FILE_F32)
        return mf_pread(mf, dst, n * 4, s->offset + first * 4);
    while (n > 0) {
        size_t k = n < MF_RAW_NUMEL ? n : MF_RAW_NUMEL;
        FSDP_TRY(mf_pread(mf, raw, k * esz, s->offset + first * esz));
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

static fsdp_status read_ckpt_range(const fsdp_modelfile *mf, int unit, size_t begin, size_t end,
                                   float *dst)
{
    const fsdp_ckpt_manifest *man = &mf->man;
    size_t S = man->units[unit].shard_numel;
    int n_files = man->replicated ? 1 : man->world_size;
    size_t *first = calloc((size_t)man->n_units, sizeof *first);
    if (!first)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    fsdp_status st = FSDP_STATUS_OK;
    for (int r = 0; r < n_files && st == FSDP_STATUS_OK; r++) {
        size_t lo = man->replicated ? 0 : (size_t)r * S, hi = lo + S;
        size_t a = begin > lo ? begin : lo, b = end < hi ? end : hi;
        if (a >= b)
            continue;
        fsdp_ckpt_reader *rd = NULL;
        st = open_rank_reader(mf, r, first, &rd);
        if (st == FSDP_STATUS_OK)
            st = fsdp_ckpt_reader_read(rd, unit, FSDP_CKPT_MASTER, a - lo, b - a,
                                       dst + (a - begin));
        fsdp_ckpt_reader_close(rd);
    }
    free(first);
    return st;
}

fsdp_status fsdp_modelfile_read_range(const fsdp_modelfile *mf, int unit, size_t begin,
                                      size_t end, float *dst)
{
    const fsdp_model *m = mf->model;
    if (!m || unit < 0 || unit >= m->n_units || end < begin)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "reading '%s': %s", mf->path,
                              m ? "bad unit or range" : "the file is not bound to a model");
    const fsdp_unit_spec *us = &m->units[unit];
    size_t numel = us->numel, hi = end < numel ? end : numel;
    if (hi < end) {
        size_t z0 = begin > hi ? begin : hi;
        memset(dst + (z0 - begin), 0, (end - z0) * sizeof *dst);
    }
    if (begin >= hi)
        return FSDP_STATUS_OK;
    if (mf->kind == FSDP_MODELFILE_CKPT)
        return read_ckpt_range(mf, unit, begin, hi, dst);
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

fsdp_status fsdp_modelfile_init_fn(void *arg, const fsdp_model *m, int unit, size_t begin,
                                   size_t end, float *dst)
{
    const fsdp_modelfile *mf = arg;
    if (m != mf->model)
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "'%s' is bound to another model", mf->path);
    return fsdp_modelfile_read_range(mf, unit, begin, end, dst);
}

/* ---- write ------------------------------------------------------------------ */

/* A 1-device checkpoint of the model at step 0 (Adam moments zero). */
static fsdp_status write_ckpt(const char *dir, const fsdp_model *m, const float *const *units)
{
    const fsdp_gpt2_config *c = fsdp_gpt2_config_of(m);
    bool found = false;
    uint64_t step = 0;
    FSDP_TRY(fsdp_ckpt_latest(dir, &step, &found));
    if (found || fsdp_ckpt_is_complete(dir))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "'%s' already holds a checkpoint; write "
                              "the converted one to a new or empty directory", dir);
    int U = m->n_units;
    size_t *padded = calloc((size_t)U, sizeof *padded), *zero = calloc((size_t)U, sizeof *zero);
    float *block = malloc(FSDP_CKPT_BLOCK_NUMEL * sizeof *block);
    float *zeros = calloc(FSDP_CKPT_BLOCK_NUMEL, sizeof *zeros);
    fsdp_ckpt_manifest man = {0};
    fsdp_ckpt_writer *w = NULL;
    fsdp_status st = FSDP_STATUS_OK;
    if (!padded || !zero || !block || !zeros) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing checkpoint '%s'", dir);
        goto fail;
    }
    /* what a 1-device engine pads each unit to (fsdp/shardmap.h) */
    for (int u = 0; u < U; u++)
        padded[u] = (m->units[u].numel + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK * FSDP_NORM_BLOCK;
    man.version = FSDP_CKPT_VERSION;
    man.run_id = fsdp_ckpt_new_run_id();
    man.seed = 1337;
    man.world_size = 1;
    snprintf(man.shard, sizeof man.shard, "full");
    man.batch = 8;
    man.seq = c->max_seq_len < 64 ? c->max_seq_len : 64;
    man.grad_accum = 1;
    snprintf(man.compute_dtype, sizeof man.compute_dtype, "fp32");
    snprintf(man.model_name, sizeof man.model_name, "%s", m->name);
    snprintf(man.model_spec, sizeof man.model_spec, "%s", m->name);
    man.has_gpt2 = true;
    man.gpt2 = *c;
    man.vocab_size = c->vocab_size;
    man.padded_vocab_size = c->padded_vocab_size;
    man.max_seq_len = c->max_seq_len;
    FSDP_CHECK(fsdp_ckpt_manifest_set_units(&man, m, padded, padded));
    FSDP_CHECK(fsdp_ckpt_begin(dir, 0));
    char tmp[FSDP_CKPT_PATH_MAX], p[FSDP_CKPT_PATH_MAX + 16];
    FSDP_CHECK(fsdp_ckpt_step_path(tmp, sizeof tmp, dir, 0, ".tmp"));
    snprintf(p, sizeof p, "%s/manifest", tmp);
    FSDP_CHECK(fsdp_ckpt_manifest_write(p, &man));
    FSDP_CHECK(fsdp_ckpt_rank_path(p, sizeof p, tmp, 0));
    fsdp_ckpt_shard_info info = {.run_id = man.run_id, .rank = 0, .world_size = 1, .n_units = U,
                                 .shard_numel = padded, .first = zero};
    FSDP_CHECK(fsdp_ckpt_writer_open(&w, p, &info));
    for (int u = 0; u < U; u++) {
        size_t numel = m->units[u].numel;
        for (size_t b = 0; b * FSDP_CKPT_BLOCK_NUMEL < padded[u]; b++) {
            size_t lo = b * FSDP_CKPT_BLOCK_NUMEL;
            size_t len = padded[u] - lo < FSDP_CKPT_BLOCK_NUMEL ? padded[u] - lo
                                                                : FSDP_CKPT_BLOCK_NUMEL;
            size_t real = lo >= numel ? 0 : numel - lo < len ? numel - lo : len;
            memcpy(block, units[u] + lo, real * sizeof *block);
            memset(block + real, 0, (len - real) * sizeof *block);
            FSDP_CHECK(fsdp_ckpt_writer_put(w, u, FSDP_CKPT_MASTER, b, block));
            FSDP_CHECK(fsdp_ckpt_writer_put(w, u, FSDP_CKPT_ADAM_M, b, zeros));
            FSDP_CHECK(fsdp_ckpt_writer_put(w, u, FSDP_CKPT_ADAM_V, b, zeros));
        }
    }
    st = fsdp_ckpt_writer_close(w);
    w = NULL;
    FSDP_CHECK(st);
    FSDP_CHECK(fsdp_ckpt_commit(dir, 0, 0));
    FSDP_INFO(FSDP_SUB_CKPT, "wrote checkpoint '%s' (step 0, 1 device) from model '%s'", dir,
              m->name);
fail:
    if (w)
        fsdp_ckpt_writer_abort(w);
    fsdp_ckpt_manifest_free(&man);
    free(padded);
    free(zero);
    free(block);
    free(zeros);
    return st;
}

fsdp_status fsdp_modelfile_write(const char *path, fsdp_modelfile_kind kind,
                                 const fsdp_model *m, const float *const *units, fsdp_dtype dt)
{
    if (!path || !m || !units || !fsdp_gpt2_config_of(m))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "writing a model file needs a path and a "
                              "GPT-2 model's units");
    switch (kind) {
    case FSDP_MODELFILE_LLMC: return fsdp_llmc_write(path, m, units, dt);
    case FSDP_MODELFILE_SAFETENSORS: return fsdp_st_write(path, m, units, dt);
    case FSDP_MODELFILE_CKPT:
        if (dt != FSDP_DTYPE_F32)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "checkpoints hold fp32 parameters; "
                                  "drop --dtype %s", fsdp_dtype_name(dt));
        return write_ckpt(path, m, units);
    default:
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown model file kind %d", (int)kind);
    }
}
