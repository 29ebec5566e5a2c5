/*
 * llmc.c - import and export of llm.c's GPT-2 model files (gpt2_*.bin).
 *
 * Layout: int32[256] header {20240326, version (3 = fp32, 5 = bf16), maxT,
 * V, L, NH, C, Vp, 0...}, then every parameter in llm.c's order: whole
 * tensors stacked over layers (all L ln_1 weights, then all L ln_1 biases,
 * ...). fsdp keeps one flat buffer per unit (root, h.0, h.1, ...), so each
 * llm.c tensor is split into L slabs that go to different units. The slabs'
 * places come from the model's parameter specs, looked up by HF name
 * (fsdp_model_find_param), never from a hard-coded layout. Linear weights
 * are (OC, C) in both, so no transposes are needed.
 *
 * A file is validated before anything is allocated or read: magic, version,
 * every shape positive and within the GPT-2 model's bounds, and the exact
 * file size, computed in 64 bits with overflow checks, so a hostile header
 * can neither crash us nor make us allocate more than the file holds.
 * Writes go to "<path>.tmp.<pid>", are fsynced, renamed over path, and the
 * directory is fsynced: a crash leaves either the old file or the new one.
 * Integers and floats are little-endian, as in llm.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/llmc.h"
#include "core/fileio.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/log.h"

#define LLMC_MAGIC 20240326
#define LLMC_VERSION_F32 3
#define LLMC_VERSION_BF16 5
#define LLMC_HEADER_INTS 256
#define LLMC_HEADER_BYTES (LLMC_HEADER_INTS * 4)
#define LLMC_CHUNK 65536 /* elements converted per bf16 read/write */

/* ---- the llm.c parameter order ------------------------------------------ */

/* llm.c's tensors in file order; per_layer tensors are (L, rows, cols) and
 * map to "h.<l>.<name>". rows/cols are multiples of C or the named dims. */
typedef enum { DIM_ONE = 0, DIM_C, DIM_3C, DIM_4C, DIM_VP, DIM_MAXT } llmc_dim;

static const struct llmc_tensor {
    const char *name;
    bool per_layer;
    llmc_dim rows, cols;
} llmc_tensors[] = {
    {"wte.weight", false, DIM_VP, DIM_C},
    {"wpe.weight", false, DIM_MAXT, DIM_C},
    {"ln_1.weight", true, DIM_C, DIM_ONE},
    {"ln_1.bias", true, DIM_C, DIM_ONE},
    {"attn.c_attn.weight", true, DIM_3C, DIM_C},
    {"attn.c_attn.bias", true, DIM_3C, DIM_ONE},
    {"attn.c_proj.weight", true, DIM_C, DIM_C},
    {"attn.c_proj.bias", true, DIM_C, DIM_ONE},
    {"ln_2.weight", true, DIM_C, DIM_ONE},
    {"ln_2.bias", true, DIM_C, DIM_ONE},
    {"mlp.c_fc.weight", true, DIM_4C, DIM_C},
    {"mlp.c_fc.bias", true, DIM_4C, DIM_ONE},
    {"mlp.c_proj.weight", true, DIM_C, DIM_4C},
    {"mlp.c_proj.bias", true, DIM_C, DIM_ONE},
    {"ln_f.weight", false, DIM_C, DIM_ONE},
    {"ln_f.bias", false, DIM_C, DIM_ONE},
};
#define LLMC_N_TENSORS ((int)(sizeof llmc_tensors / sizeof llmc_tensors[0]))

static uint64_t dim_value(llmc_dim d, const fsdp_gpt2_config *c)
{
    switch (d) {
    case DIM_C: return (uint64_t)c->n_embd;
    case DIM_3C: return 3 * (uint64_t)c->n_embd;
    case DIM_4C: return 4 * (uint64_t)c->n_embd;
    case DIM_VP: return (uint64_t)c->padded_vocab_size;
    case DIM_MAXT: return (uint64_t)c->max_seq_len;
    case DIM_ONE:
    default: return 1;
    }
}

/* a*b and a+b into *out; false on 64-bit overflow. */
static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

static bool add_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* Elements of all parameters for cfg, with overflow checks. */
static bool llmc_numel(const fsdp_gpt2_config *c, uint64_t *out)
{
    uint64_t total = 0;
    for (int i = 0; i < LLMC_N_TENSORS; i++) {
        const struct llmc_tensor *t = &llmc_tensors[i];
        uint64_t n;
        if (!mul_ok(dim_value(t->rows, c), dim_value(t->cols, c), &n))
            return false;
        if (t->per_layer && !mul_ok(n, (uint64_t)c->n_layer, &n))
            return false;
        if (!add_ok(total, n, &total))
            return false;
    }
    *out = total;
    return true;
}

/* One contiguous piece of the file: numel elements that belong at
 * units[unit][offset ...]. */
typedef struct llmc_slab {
    int unit;
    size_t offset, numel;
} llmc_slab;

/* The file's slabs in file order (2 + 12 L + 2 of them), located through the
 * model's parameter specs. Caller frees *out. */
static fsdp_status llmc_plan(const fsdp_model *m, const fsdp_gpt2_config *c, llmc_slab **out,
                             int *n_out)
{
    int L = c->n_layer, n = 0;
    llmc_slab *plan = malloc(sizeof *plan * (size_t)(4 + 12 * L));
    if (!plan)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of memory planning a %d-layer model file", L);
    for (int i = 0; i < LLMC_N_TENSORS; i++) {
        const struct llmc_tensor *t = &llmc_tensors[i];
        uint64_t want = dim_value(t->rows, c) * dim_value(t->cols, c);
        for (int l = 0; l < (t->per_layer ? L : 1); l++) {
            char name[64];
            if (t->per_layer)
                snprintf(name, sizeof name, "h.%d.%s", l, t->name);
            else
                snprintf(name, sizeof name, "%s", t->name);
            int unit = -1;
            const fsdp_param_spec *p = fsdp_model_find_param(m, name, &unit);
            if (!p || p->numel != want) {
                free(plan);
                return fsdp_error_set(FSDP_STATUS_INTERNAL,
                                      "model '%s' %s parameter '%s' (%zu elements) that the "
                                      "llm.c layout needs with %llu elements",
                                      m->name, p ? "has a mis-sized" : "lacks the", name,
                                      p ? p->numel : (size_t)0, (unsigned long long)want);
            }
            plan[n++] = (llmc_slab){.unit = unit, .offset = p->offset, .numel = p->numel};
        }
    }
    *out = plan;
    *n_out = n;
    return FSDP_STATUS_OK;
}

/* ---- header -------------------------------------------------------------- */

/* Read and validate path's header against its size; fills cfg, dt and the
 * open file (positioned after the header) on success. */
static fsdp_status llmc_open(const char *path, fsdp_gpt2_config *cfg, fsdp_dtype *dt, FILE **out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open model file '%s': %s", path,
                              strerror(errno));
    fsdp_status st;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot stat model file '%s': %s", path,
                            strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = fsdp_error_set(FSDP_STATUS_IO, "model file '%s' is not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < LLMC_HEADER_BYTES) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "model file '%s' is %llu bytes, shorter than the %d-byte llm.c "
                            "header; it is truncated or not an llm.c model file",
                            path, (unsigned long long)size, LLMC_HEADER_BYTES);
        goto fail;
    }
    int32_t h[LLMC_HEADER_INTS];
    if (fread(h, 4, LLMC_HEADER_INTS, f) != LLMC_HEADER_INTS) {
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot read the header of model file '%s': %s",
                            path, ferror(f) ? strerror(errno) : "unexpected end of file");
        goto fail;
    }
    if (h[0] != LLMC_MAGIC) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "model file '%s' has magic %d, expected %d; it is not an llm.c "
                            "GPT-2 model file (gpt2_*.bin)",
                            path, (int)h[0], LLMC_MAGIC);
        goto fail;
    }
    if (h[1] != LLMC_VERSION_F32 && h[1] != LLMC_VERSION_BF16) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "model file '%s' has version %d; supported are %d (fp32) and %d "
                            "(bf16)",
                            path, (int)h[1], LLMC_VERSION_F32, LLMC_VERSION_BF16);
        goto fail;
    }
    fsdp_gpt2_config c = {
        .max_seq_len = h[2],
        .vocab_size = h[3],
        .n_layer = h[4],
        .n_head = h[5],
        .n_embd = h[6],
        .padded_vocab_size = h[7],
    };
    if (c.max_seq_len <= 0 || c.vocab_size <= 0 || c.n_layer <= 0 || c.n_head <= 0 ||
        c.n_embd <= 0 || c.padded_vocab_size < c.vocab_size) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "model file '%s' has impossible shapes maxT=%d V=%d L=%d NH=%d C=%d "
                            "Vp=%d (all must be positive and Vp >= V); the header is corrupt",
                            path, c.max_seq_len, c.vocab_size, c.n_layer, c.n_head, c.n_embd,
                            c.padded_vocab_size);
        goto fail;
    }
    if (fsdp_gpt2_config_validate(&c) != FSDP_STATUS_OK) {
        fsdp_error_prefix("model file '%s' describes a GPT-2 fsdp cannot build", path);
        st = FSDP_STATUS_FORMAT;
        goto fail;
    }
    fsdp_dtype d = h[1] == LLMC_VERSION_BF16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    uint64_t numel, expected;
    if (!llmc_numel(&c, &numel) || !mul_ok(numel, fsdp_dtype_size(d), &expected) ||
        !add_ok(expected, LLMC_HEADER_BYTES, &expected)) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "model file '%s': its shapes (L=%d C=%d Vp=%d maxT=%d) overflow a "
                            "64-bit size; the header is corrupt",
                            path, c.n_layer, c.n_embd, c.padded_vocab_size, c.max_seq_len);
        goto fail;
    }
    if (size != expected) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "model file '%s' is %llu bytes but its header (%s, maxT=%d V=%d "
                            "L=%d NH=%d C=%d Vp=%d) needs %llu bytes; the file is truncated or "
                            "corrupt",
                            path, (unsigned long long)size, fsdp_dtype_name(d), c.max_seq_len,
                            c.vocab_size, c.n_layer, c.n_head, c.n_embd, c.padded_vocab_size,
                            (unsigned long long)expected);
        goto fail;
    }
    *cfg = c;
    *dt = d;
    *out = f;
    return FSDP_STATUS_OK;
fail:
    fclose(f);
    return st;
}

fsdp_status fsdp_llmc_read_config(const char *path, fsdp_gpt2_config *cfg, fsdp_dtype *file_dt)
{
    if (!path || !cfg)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "fsdp_llmc_read_config: NULL argument");
    FILE *f;
    fsdp_dtype dt;
    FSDP_TRY(llmc_open(path, cfg, &dt, &f));
    fclose(f);
    if (file_dt)
        *file_dt = dt;
    return FSDP_STATUS_OK;
}

static bool config_equal(const fsdp_gpt2_config *a, const fsdp_gpt2_config *b)
{
    return a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
           a->vocab_size == b->vocab_size && a->padded_vocab_size == b->padded_vocab_size &&
           a->max_seq_len == b->max_seq_len;
}

/* The model's GPT-2 config, or INVALID_ARG if it is not a GPT-2. */
static fsdp_status model_config(const fsdp_model *m, const char *path,
                                const fsdp_gpt2_config **out)
{
    *out = m ? fsdp_gpt2_config_of(m) : NULL;
    if (!*out)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "model file '%s': llm.c files hold GPT-2 models only, and model "
                              "'%s' is not one",
                              path, m ? m->name : "(null)");
    return FSDP_STATUS_OK;
}

/* ---- read ---------------------------------------------------------------- */

fsdp_status fsdp_llmc_read(const char *path, const fsdp_model *m, float *const *units)
{
    if (!path || !units)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "fsdp_llmc_read: NULL argument");
    const fsdp_gpt2_config *mc;
    FSDP_TRY(model_config(m, path, &mc));
    fsdp_gpt2_config fc;
    fsdp_dtype dt;
    FILE *f = NULL;
    FSDP_TRY(llmc_open(path, &fc, &dt, &f));
    fsdp_status st = FSDP_STATUS_OK;
    llmc_slab *plan = NULL;
    uint16_t *buf = NULL;
    if (!config_equal(&fc, mc)) {
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                            "model file '%s' holds L=%d NH=%d C=%d V=%d Vp=%d maxT=%d but the "
                            "model was built as L=%d NH=%d C=%d V=%d Vp=%d maxT=%d; build the "
                            "model from the file's config (fsdp_llmc_read_config)",
                            path, fc.n_layer, fc.n_head, fc.n_embd, fc.vocab_size,
                            fc.padded_vocab_size, fc.max_seq_len, mc->n_layer, mc->n_head,
                            mc->n_embd, mc->vocab_size, mc->padded_vocab_size, mc->max_seq_len);
        goto fail;
    }
    int n_slabs;
    FSDP_CHECK(llmc_plan(m, &fc, &plan, &n_slabs));
    if (dt == FSDP_DTYPE_BF16 && !(buf = malloc(LLMC_CHUNK * sizeof *buf))) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of memory reading model file '%s'", path);
        goto fail;
    }
    for (int s = 0; s < n_slabs; s++) {
        float *dst = units[plan[s].unit] + plan[s].offset;
        size_t left = plan[s].numel;
        while (left > 0) {
            size_t n = dt == FSDP_DTYPE_F32 ? left : (left < LLMC_CHUNK ? left : LLMC_CHUNK);
            size_t got = dt == FSDP_DTYPE_F32 ? fread(dst, 4, n, f) : fread(buf, 2, n, f);
            if (got != n) {
                st = fsdp_error_set(FSDP_STATUS_IO,
                                    "reading model file '%s' failed at byte %ld: %s (did the "
                                    "file change while loading?)",
                                    path, ftell(f),
                                    ferror(f) ? strerror(errno) : "unexpected end of file");
                goto fail;
            }
            if (dt == FSDP_DTYPE_BF16)
                for (size_t i = 0; i < n; i++)
                    dst[i] = fsdp_bf16_to_f32(buf[i]);
            dst += n;
            left -= n;
        }
    }
    FSDP_INFO(FSDP_SUB_CKPT, "loaded '%s' (%s, %zu parameters) into model '%s'", path,
              fsdp_dtype_name(dt), m->numel, m->name);
fail:
    free(buf);
    free(plan);
    fclose(f);
    return st;
}

/* ---- write --------------------------------------------------------------- */

fsdp_status fsdp_llmc_write(const char *path, const fsdp_model *m, const float *const *units,
                            fsdp_dtype dt)
{
    if (!path || !units)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "fsdp_llmc_write: NULL argument");
    if (dt != FSDP_DTYPE_F32 && dt != FSDP_DTYPE_BF16)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "llm.c model files hold fp32 or bf16, not dtype %d", (int)dt);
    const fsdp_gpt2_config *c;
    FSDP_TRY(model_config(m, path, &c));
    fsdp_status st = FSDP_STATUS_OK;
    llmc_slab *plan = NULL;
    uint16_t *buf = NULL;
    fsdp_atomic_file af = {0};
    int n_slabs;
    FSDP_CHECK(llmc_plan(m, c, &plan, &n_slabs));
    if (dt == FSDP_DTYPE_BF16 && !(buf = malloc(LLMC_CHUNK * sizeof *buf))) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of memory writing model file '%s'", path);
        goto fail;
    }
    FSDP_CHECK(fsdp_atomic_open(&af, path, "model file"));
    FILE *f = af.f;
    int32_t h[LLMC_HEADER_INTS] = {0};
    h[0] = LLMC_MAGIC;
    h[1] = dt == FSDP_DTYPE_BF16 ? LLMC_VERSION_BF16 : LLMC_VERSION_F32;
    h[2] = c->max_seq_len;
    h[3] = c->vocab_size;
    h[4] = c->n_layer;
    h[5] = c->n_head;
    h[6] = c->n_embd;
    h[7] = c->padded_vocab_size;
    bool ok = fwrite(h, 4, LLMC_HEADER_INTS, f) == LLMC_HEADER_INTS;
    for (int s = 0; ok && s < n_slabs; s++) {
        const float *src = units[plan[s].unit] + plan[s].offset;
        size_t left = plan[s].numel;
        if (dt == FSDP_DTYPE_F32) {
            ok = fwrite(src, 4, left, f) == left;
            continue;
        }
        while (ok && left > 0) {
            size_t n = left < LLMC_CHUNK ? left : LLMC_CHUNK;
            for (size_t i = 0; i < n; i++)
                buf[i] = fsdp_f32_to_bf16(src[i]);
            ok = fwrite(buf, 2, n, f) == n;
            src += n;
            left -= n;
        }
    }
    FSDP_CHECK(fsdp_atomic_commit(&af, ok));
    FSDP_INFO(FSDP_SUB_CKPT, "wrote '%s' (%s, %zu parameters) from model '%s'", path,
              fsdp_dtype_name(dt), m->numel, m->name);
fail:
    fsdp_atomic_abort(&af);
    free(buf);
    free(plan);
    return st;
}
