/*
 * llmc.c - llm.c's model files (gpt2_*.bin) as a weight format.
 *
 * Layout: int32[256] header {20240326, version (3 = fp32, 5 = bf16), then
 * the family's words (GPT-2: maxT, V, L, NH, C, Vp), zeros}, then every
 * parameter whole, in the family's file order (models/weights.h:
 * fsdp_llmc_mapping), each tensor in fsdp's own layout (no transposes).
 * Integers and floats are little-endian, as in llm.c. The file does not say
 * which family it holds: the families with an llm.c mapping are asked in
 * registry order, and the first whose header reading succeeds owns it.
 *
 * A file is validated before anything is read past its header: magic,
 * version, the family's header words (a model it can build), and the exact
 * file size for that model in overflow-checked 64-bit arithmetic, so a
 * hostile header can neither crash us nor make us allocate more than the
 * file holds. Writes go through core/fileio's atomic file.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/modelfile_internal.h"
#include "core/bf16.h"
#include "core/fileio.h"
#include "core/log.h"

#define LLMC_MAGIC 20240326
#define LLMC_VERSION_F32 3
#define LLMC_VERSION_BF16 5
#define LLMC_HEADER_INTS 256
#define LLMC_HEADER_BYTES (LLMC_HEADER_INTS * 4)
#define LLMC_CHUNK 65536 /* elements converted per bf16 write */

/* Bytes of the whole file for m in element size esz; false on overflow. */
static bool file_bytes(const fsdp_model *m, uint64_t esz, uint64_t *out)
{
    uint64_t bytes;
    if (__builtin_mul_overflow((uint64_t)m->numel, esz, &bytes) ||
        __builtin_add_overflow(bytes, (uint64_t)LLMC_HEADER_BYTES, &bytes))
        return false;
    *out = bytes;
    return true;
}

/* The family whose llm.c header words h[2..] read; its config into mf. */
static fsdp_status find_family(fsdp_modelfile *mf, const int32_t *h)
{
    char first[FSDP_ERROR_MSG_MAX] = "";
    for (int i = 0; i < fsdp_model_family_count(); i++) {
        const fsdp_model_family *f = fsdp_model_family_at(i);
        if (!f->llmc)
            continue;
        if (f->llmc->config(h + 2, LLMC_HEADER_INTS - 2, mf->config, sizeof mf->config) ==
            FSDP_STATUS_OK) {
            mf->family = f;
            return FSDP_STATUS_OK;
        }
        if (!first[0])
            snprintf(first, sizeof first, "%s", fsdp_error_msg());
    }
    return fsdp_error_set(FSDP_STATUS_FORMAT, "model file '%s': %s", mf->path,
                          first[0] ? first : "no model family reads llm.c files");
}

static fsdp_status llmc_open(fsdp_modelfile *mf, const char *path)
{
    FSDP_TRY(fsdp_modelfile_set_path(mf, path));
    /* O_NONBLOCK: a FIFO must not hang the open; it is refused below */
    mf->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (mf->fd < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open model file '%s': %s", path,
                              strerror(errno));
    struct stat sb;
    if (fstat(mf->fd, &sb) != 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot stat model file '%s': %s", path,
                              strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return fsdp_error_set(FSDP_STATUS_IO, "model file '%s' is not a regular file", path);
    uint64_t size = (uint64_t)sb.st_size;
    if (size < LLMC_HEADER_BYTES)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "model file '%s' is %" PRIu64 " bytes, shorter than the %d-byte "
                              "llm.c header; it is truncated or not an llm.c model file",
                              path, size, LLMC_HEADER_BYTES);
    int32_t h[LLMC_HEADER_INTS];
    FSDP_TRY(fsdp_pread_all(mf->fd, h, sizeof h, 0, "model file", path));
    if (h[0] != LLMC_MAGIC)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "model file '%s' has magic %d, expected %d; it is not an llm.c "
                              "model file (gpt2_*.bin)", path, (int)h[0], LLMC_MAGIC);
    if (h[1] != LLMC_VERSION_F32 && h[1] != LLMC_VERSION_BF16)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "model file '%s' has version %d; supported are %d (fp32) and %d "
                              "(bf16)", path, (int)h[1], LLMC_VERSION_F32, LLMC_VERSION_BF16);
    bool bf16 = h[1] == LLMC_VERSION_BF16;
    static const fsdp_file_dtype dtypes[2] = {FSDP_FILE_F32, FSDP_FILE_BF16};
    mf->impl = (void *)&dtypes[bf16]; /* the file's element type, for bind (static: no close) */
    mf->dtype_name = bf16 ? "bf16" : "fp32";
    FSDP_TRY(find_family(mf, h));
    fsdp_model m;
    FSDP_TRY(fsdp_modelfile_build("model file", path, mf->family, mf->config, &m));
    uint64_t expected = 0;
    bool ok = file_bytes(&m, bf16 ? 2 : 4, &expected);
    fsdp_model_free(&m);
    char held[FSDP_MODEL_NAME_MAX + 32];
    fsdp_modelfile_describe(mf, held, sizeof held);
    if (!ok)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "model file '%s': the size of its %s "
                              "overflows 64 bits; the header is corrupt", path, held);
    if (size < expected)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "model file '%s' is %" PRIu64 " bytes but its header (%s, %s) "
                              "needs %" PRIu64 " bytes; the file is truncated or corrupt",
                              path, size, mf->dtype_name, held, expected);
    if (size > expected)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "model file '%s' is %" PRIu64 " bytes, %" PRIu64 " more than its "
                              "header (%s, %s) needs (%" PRIu64 "): something follows the "
                              "parameters; the file is corrupt, or another format",
                              path, size, size - expected, mf->dtype_name, held, expected);
    return FSDP_STATUS_OK;
}

static fsdp_status llmc_bind(fsdp_modelfile *mf, const fsdp_model *m)
{
    FSDP_TRY(fsdp_flat_prepare(mf, m));
    int n = mf->unit_base[m->n_units];
    int *order = malloc(((size_t)n + 1) * sizeof *order);
    int *unit_of = malloc(((size_t)n + 1) * sizeof *unit_of);
    if (!order || !unit_of) {
        free(order);
        free(unit_of);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    }
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++)
            unit_of[mf->unit_base[u] + i] = u;
    m->family->llmc->order(m, order);
    fsdp_file_dtype dt = *(const fsdp_file_dtype *)mf->impl;
    uint64_t esz = (uint64_t)fsdp_file_dtype_size(dt), at = LLMC_HEADER_BYTES;
    fsdp_status st = FSDP_STATUS_OK;
    for (int k = 0; k < n && st == FSDP_STATUS_OK; k++) {
        int idx = order[k];
        fsdp_tensor_src *s = idx >= 0 && idx < n ? &mf->src[idx] : NULL;
        if (!s || s->rows) { /* rows stays 0 until the parameter is placed */
            st = fsdp_error_set(FSDP_STATUS_INTERNAL, "the %s llm.c order lists parameter %d "
                                "twice or out of range", m->family->title, idx);
            break;
        }
        const fsdp_param_spec *p =
            &m->units[unit_of[idx]].params[idx - mf->unit_base[unit_of[idx]]];
        *s = (fsdp_tensor_src){
            .offset = at,
            .dtype = dt,
            .file_numel = p->numel,
            .rows = (uint64_t)p->shape[0],
            .cols = p->ndim == 2 ? (uint64_t)p->shape[1] : 1,
        };
        at += (uint64_t)p->numel * esz;
    }
    free(order);
    free(unit_of);
    FSDP_TRY(st);
    struct stat sb;
    if (fstat(mf->fd, &sb) != 0 || (uint64_t)sb.st_size != at)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "model file '%s' changed size while open (it "
                              "should be %" PRIu64 " bytes)", mf->path, at);
    return FSDP_STATUS_OK;
}

static fsdp_status llmc_write(const char *path, const fsdp_model *m, const float *const *units,
                              const fsdp_modelfile_write_opts *o)
{
    fsdp_dtype dt = o->dtype;
    if (!m->family->llmc)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "llm.c model files hold no %s models; "
                              "write '%s' as .safetensors or a checkpoint", m->family->title,
                              path);
    if (dt != FSDP_DTYPE_F32 && dt != FSDP_DTYPE_BF16)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "llm.c model files hold fp32 or bf16, not dtype %d", (int)dt);
    int n = 0;
    for (int u = 0; u < m->n_units; u++)
        n += m->units[u].n_params;
    int *order = malloc(((size_t)n + 1) * sizeof *order);
    const float **at = malloc(((size_t)n + 1) * sizeof *at);
    size_t *numel = malloc(((size_t)n + 1) * sizeof *numel);
    uint16_t *buf = malloc(LLMC_CHUNK * sizeof *buf);
    fsdp_atomic_file af = {0};
    fsdp_status st = FSDP_STATUS_OK;
    if (!order || !at || !numel || !buf) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of memory writing model file '%s'", path);
        goto fail;
    }
    for (int u = 0, k = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++, k++) {
            at[k] = units[u] + m->units[u].params[i].offset;
            numel[k] = m->units[u].params[i].numel;
        }
    m->family->llmc->order(m, order);
    FSDP_CHECK(fsdp_atomic_open(&af, path, "model file"));
    FILE *f = af.f;
    int32_t h[LLMC_HEADER_INTS] = {0};
    h[0] = LLMC_MAGIC;
    h[1] = dt == FSDP_DTYPE_BF16 ? LLMC_VERSION_BF16 : LLMC_VERSION_F32;
    m->family->llmc->header(m, h + 2, LLMC_HEADER_INTS - 2);
    bool ok = fwrite(h, 4, LLMC_HEADER_INTS, f) == LLMC_HEADER_INTS;
    for (int k = 0; ok && k < n; k++) {
        const float *src = at[order[k]];
        size_t left = numel[order[k]];
        if (dt == FSDP_DTYPE_F32) {
            ok = fwrite(src, 4, left, f) == left;
            continue;
        }
        while (ok && left > 0) {
            size_t c = left < LLMC_CHUNK ? left : LLMC_CHUNK;
            for (size_t i = 0; i < c; i++)
                buf[i] = fsdp_f32_to_bf16(src[i]);
            ok = fwrite(buf, 2, c, f) == c;
            src += c;
            left -= c;
        }
    }
    FSDP_CHECK(fsdp_atomic_commit(&af, ok));
    FSDP_INFO(FSDP_SUB_CKPT, "wrote '%s' (%s, %zu parameters) from model '%s'", path,
              fsdp_dtype_name(dt), m->numel, m->name);
fail:
    fsdp_atomic_abort(&af);
    free(buf);
    free(numel);
    free(at);
    free(order);
    return st;
}

const fsdp_modelfile_format fsdp_format_llmc = {
    /* .short_name = */ "llmc",
    /* .name       = */ "llm.c model file",
    /* .help       = */ "FILE.bin (llm.c)",
    /* .suffix     = */ ".bin",
    /* .bf16       = */ true,
    /* .ships_tokenizer = */ false,
    /* .note       = */ NULL,
    /* .claims     = */ NULL, /* by the suffix */
    /* .open       = */ llmc_open,
    /* .bind       = */ llmc_bind,
    /* .read_range = */ NULL, /* the flat reader */
    /* .close      = */ NULL,
    /* .write      = */ llmc_write,
};
