/*
 * ckpt_model.c - an fsdp checkpoint directory as a weight format: the
 * model its manifest records (model_family, model_config) and its master
 * parameters, read by unit range through the shard readers of
 * shard_file.h, which check every block's checksum. The unit range is cut
 * at the writing world's shard boundaries, so a checkpoint written by N
 * devices loads into any number of ranks. Export writes a 1-device
 * checkpoint at step 0, carrying the tokenizer of the model's directory
 * (ckpt_tok.h).
 */
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt.h"
#include "ckpt/ckpt_base.h"
#include "ckpt/ckpt_tok.h"
#include "ckpt/modelfile_internal.h"
#include "core/log.h"
#include "models/lora.h"
#include "ops/nf4.h"
#include "ops/ops.h"

typedef struct ckpt_impl {
    fsdp_ckpt_manifest man;
    size_t *shard;                     /* [n_units] shard numel per rank file */
    /* A checkpoint with frozen parameters (a `base` line) reads them from its base: a model
     * file bound to the base model as built from the family and config, or, when the base
     * is a shape or spec, their initialiser (man.seed). */
    fsdp_modelfile *base_mf;
    fsdp_model base_model;
} ckpt_impl;

static bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool ckpt_claims(const char *path) { return is_dir(path); }

/* A checkpoint path: one complete checkpoint, or a --ckpt-dir (its newest). */
static fsdp_status resolve_ckpt(const char *path, char *out, size_t n)
{
    char manifest[FSDP_CKPT_PATH_MAX + 16];
    struct stat sb;
    snprintf(manifest, sizeof manifest, "%s/manifest", path);
    if (!is_dir(path))
        return fsdp_error_set(FSDP_STATUS_IO, "'%s' is neither a .bin or .safetensors model file "
                              "nor a Hugging Face or checkpoint directory", path);
    if (stat(manifest, &sb) == 0) {
        if (!fsdp_ckpt_is_complete(path))
            return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint '%s' is incomplete (no DONE "
                                  "marker: its save was interrupted); use an earlier one", path);
        if (snprintf(out, n, "%s", path) >= (int)n)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "path '%.64s...' is too long", path);
        return FSDP_STATUS_OK;
    }
    bool found = false;
    uint64_t step = 0;
    FSDP_TRY(fsdp_ckpt_latest(path, &step, &found));
    if (!found)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "'%s' holds no complete checkpoint (a step_N "
                              "directory with a DONE marker) and is not one, nor a Hugging Face "
                              "directory (config.json and model.safetensors)", path);
    return fsdp_ckpt_step_path(out, n, path, step, "");
}

static fsdp_status ckpt_open(fsdp_modelfile *mf, const char *path)
{
    FSDP_TRY(fsdp_modelfile_impl_alloc(mf, sizeof(ckpt_impl)));
    ckpt_impl *c = mf->impl;
    FSDP_TRY(resolve_ckpt(path, mf->path, sizeof mf->path));
    char manifest[FSDP_CKPT_PATH_MAX + 16];
    snprintf(manifest, sizeof manifest, "%s/manifest", mf->path);
    FSDP_TRY(fsdp_ckpt_manifest_read(manifest, &c->man));
    /* the reader has checked the family, its config and the unit lines */
    mf->family = fsdp_model_family_find(c->man.model_family);
    snprintf(mf->config, sizeof mf->config, "%s", c->man.model_config);
    mf->lora = c->man.lora;
    snprintf(mf->freeze, sizeof mf->freeze, "%s", c->man.freeze);
    mf->nf4_round_trip = c->man.nf4;
    snprintf(mf->base, sizeof mf->base, "%s", c->man.base);
    c->shard = calloc((size_t)c->man.n_units, sizeof *c->shard);
    if (!c->shard)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    for (int u = 0; u < c->man.n_units; u++)
        c->shard[u] = c->man.units[u].shard_numel;
    mf->dtype_name = "fp32";
    return FSDP_STATUS_OK;
}

static void ckpt_close(fsdp_modelfile *mf)
{
    ckpt_impl *c = mf->impl;
    if (!c)
        return;
    fsdp_ckpt_manifest_free(&c->man);
    free(c->shard);
    fsdp_modelfile_close(c->base_mf); /* bound to base_model: closed first */
    if (c->base_model.units)
        fsdp_model_free(&c->base_model);
    free(c);
    mf->impl = NULL;
}

/* Open rank r's shard file of the checkpoint, validated against the
 * manifest; first is scratch of n_units entries. */
static fsdp_status open_rank_reader(const fsdp_modelfile *mf, int r, size_t *first,
                                    fsdp_ckpt_reader **out)
{
    const ckpt_impl *c = mf->impl;
    const fsdp_ckpt_manifest *man = &c->man;
    char p[FSDP_CKPT_PATH_MAX];
    FSDP_TRY(fsdp_ckpt_rank_path(p, sizeof p, mf->path, r));
    for (int u = 0; u < man->n_units; u++)
        first[u] = fsdp_ckpt_shard_first(man, u, r);
    fsdp_ckpt_shard_info info = {
        .run_id = man->run_id, .step = man->step, .adam_t = man->adam_t, .rank = r,
        .world_size = man->world_size, .n_units = man->n_units,
        .shard_numel = c->shard, .first = first,
    };
    return fsdp_ckpt_reader_open(out, p, &info);
}

/* The base of a checkpoint with frozen parameters, opened and bound (a model file), or
 * checked to be the shape its frozen parameters were drawn for (a spec): its hash must be
 * the one the manifest records. */
static fsdp_status open_base(fsdp_modelfile *mf)
{
    ckpt_impl *c = mf->impl;
    const fsdp_ckpt_manifest *man = &c->man;
    uint64_t hash;
    struct stat sb;
    bool file = stat(man->base, &sb) == 0;
    if (!file && !fsdp_model_is_spec(man->base))
        return fsdp_error_set(FSDP_STATUS_IO, "checkpoint '%s' holds only the trained part of "
                              "its model: its frozen parameters come from the base '%s', which "
                              "is not there", mf->path, man->base);
    FSDP_TRY(fsdp_ckpt_base_hash(man->base, man->model_config, man->seed, &hash));
    if (hash != man->base_hash)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint '%s' was trained on the base '%s' "
                              "(hash %016" PRIx64 "), but '%s' now holds another model (hash "
                              "%016" PRIx64 ")", mf->path, man->base, man->base_hash, man->base,
                              hash);
    if (!file)
        return FSDP_STATUS_OK; /* the seed draws them: fsdp_model_init_range */
    FSDP_TRY(fsdp_modelfile_open(&c->base_mf, man->base));
    FSDP_TRY(fsdp_model_build(mf->family, man->model_config, &c->base_model));
    return fsdp_modelfile_bind(c->base_mf, &c->base_model);
}

/* The manifest matches m, and every rank file opens and matches it. */
static fsdp_status ckpt_bind(fsdp_modelfile *mf, const fsdp_model *m)
{
    const ckpt_impl *c = mf->impl;
    char manifest[FSDP_CKPT_PATH_MAX + 16];
    snprintf(manifest, sizeof manifest, "%s/manifest", mf->path);
    FSDP_TRY(fsdp_ckpt_manifest_check_model(&c->man, manifest, m));
    if (c->man.base[0] && !c->base_mf && !c->base_model.units)
        FSDP_TRY(open_base(mf));
    size_t *first = calloc((size_t)c->man.n_units, sizeof *first);
    if (!first)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    fsdp_status st = FSDP_STATUS_OK;
    /* every rank file (a replicated checkpoint's are whole copies; a hybrid
     * one's are the first node's) */
    int n_files = c->man.replicated ? c->man.world_size : fsdp_ckpt_n_shards(&c->man);
    for (int r = 0; r < n_files && st == FSDP_STATUS_OK; r++) {
        fsdp_ckpt_reader *rd = NULL;
        st = open_rank_reader(mf, r, first, &rd);
        fsdp_ckpt_reader_close(rd);
    }
    free(first);
    return st;
}

/* Elements [begin, end) of unit `unit`'s trainable parameters, from the rank files. */
static fsdp_status read_trained(const fsdp_modelfile *mf, int unit, size_t begin, size_t end,
                                float *dst)
{
    const fsdp_ckpt_manifest *man = &((const ckpt_impl *)mf->impl)->man;
    const fsdp_ckpt_unit *cu = &man->units[unit];
    int n_files = fsdp_ckpt_n_shards(man);
    size_t *first = calloc((size_t)man->n_units, sizeof *first);
    if (!first)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    fsdp_status st = FSDP_STATUS_OK;
    for (int r = 0; r < n_files && st == FSDP_STATUS_OK; r++) {
        fsdp_ckpt_reader *rd = NULL;
        for (int i = 0; i < cu->n_params && st == FSDP_STATUS_OK; i++) {
            size_t flat, at, n = fsdp_ckpt_param_run(man, unit, &cu->params[i], r, &flat, &at);
            size_t a = begin > flat ? begin : flat, b = end < flat + n ? end : flat + n;
            if (!n || a >= b)
                continue;
            if (!rd)
                st = open_rank_reader(mf, r, first, &rd);
            if (st == FSDP_STATUS_OK)
                st = fsdp_ckpt_reader_read(rd, unit, FSDP_CKPT_MASTER, at + (a - flat), b - a,
                                           dst + (a - begin));
        }
        fsdp_ckpt_reader_close(rd);
    }
    free(first);
    return st;
}

/* Base parameter p of unit `unit` (whole), from the base's file or, a shape's, the seed. */
static fsdp_status base_param(const fsdp_modelfile *mf, int unit, const fsdp_param_spec *p,
                              float *w)
{
    const ckpt_impl *c = mf->impl;
    if (!c->base_mf) {
        fsdp_model_init_range(mf->model, unit, p->offset, p->offset + p->numel, c->man.seed, w);
        return FSDP_STATUS_OK;
    }
    return fsdp_modelfile_read_by_name(c->base_mf, mf->model, unit, p->offset,
                                       p->offset + p->numel, w);
}

/* A checkpoint of a run whose frozen linear weights were NF4 (`quantize nf4`): elements
 * [a, end) of them replaced by their NF4 round trip (the values the run trained against),
 * each parameter quantized whole as the run's init did (train/adapt.c's choice of weights:
 * the block units' linear layers). A bnb-4bit base reads dequantized already. */
static fsdp_status nf4_round_trip(const fsdp_modelfile *mf, int unit, size_t a, size_t end,
                                  float *dst)
{
    const ckpt_impl *c = mf->impl;
    const fsdp_model *m = mf->model;
    if (!c->man.nf4 || (c->base_mf && fsdp_modelfile_is_nf4(c->base_mf)))
        return FSDP_STATUS_OK;
    for (int i = 0; i < m->units[unit].n_params; i++) {
        const fsdp_param_spec *p = &m->units[unit].params[i];
        size_t lo, hi, n = p->numel;
        if (!p->frozen || !fsdp_lora_is_linear_weight(m, unit, i) ||
            !fsdp_param_overlap(p, a, end, &lo, &hi))
            continue;
        float *w = malloc((n + fsdp_nf4_blocks(n)) * sizeof *w);
        uint8_t *q = malloc(n / 2 + 1);
        fsdp_status st = w && q ? base_param(mf, unit, p, w) : FSDP_STATUS_OOM;
        if (st == FSDP_STATUS_OK && !fsdp_nf4_quantize_tensor(w, n, q, w + n))
            st = FSDP_STATUS_OOM;
        if (st == FSDP_STATUS_OOM)
            fsdp_error_set(st, "out of host memory reading %s of '%s'", p->name, mf->path);
        if (st == FSDP_STATUS_OK) {
            fsdp_nf4_dequant_ref(q, w + n, n, w);
            memcpy(dst + (lo - a), w + (lo - p->offset), (hi - lo) * sizeof *w);
        }
        free(w);
        free(q);
        FSDP_TRY(st);
    }
    return FSDP_STATUS_OK;
}

/* The trainable parameters (the first numel elements the manifest lists) from the rank
 * files; frozen ones, after them, from the base. */
static fsdp_status ckpt_read_range(const fsdp_modelfile *mf, int unit, size_t begin, size_t end,
                                   float *dst)
{
    const ckpt_impl *c = mf->impl;
    size_t tn = c->man.units[unit].numel, cut = end < tn ? end : tn;
    if (begin < cut)
        FSDP_TRY(read_trained(mf, unit, begin, cut, dst));
    if (end <= tn)
        return FSDP_STATUS_OK;
    size_t a = begin > tn ? begin : tn;
    if (!c->base_mf) { /* a shape's: the seed drew them */
        fsdp_model_init_range(mf->model, unit, a, end, c->man.seed, dst + (a - begin));
    } else {
        memset(dst + (a - begin), 0, (end - a) * sizeof *dst);
        FSDP_TRY(fsdp_modelfile_read_by_name(c->base_mf, mf->model, unit, a, end,
                                             dst + (a - begin)));
    }
    return nf4_round_trip(mf, unit, a, end, dst + (a - begin));
}

/* The first entry of directory `dir` that a checkpoint directory does not
 * hold (its LOCK, step_* directories and their leftovers), into name;
 * false when there is none or dir cannot be listed. */
static bool foreign_entry(const char *dir, char *name, size_t n)
{
    DIR *d = opendir(dir);
    if (!d)
        return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));) {
        const char *s = e->d_name;
        found = strcmp(s, ".") && strcmp(s, "..") && strcmp(s, "LOCK") && strncmp(s, "step_", 5);
        if (found)
            snprintf(name, n, "%s", s);
    }
    closedir(d);
    return found;
}

/* A 1-device checkpoint of the model at step 0 (optimizer state zero). */
static fsdp_status ckpt_write(const char *dir, const fsdp_model *m, const float *const *units,
                              const fsdp_modelfile_write_opts *o)
{
    fsdp_dtype dt = o->dtype;
    if (dt != FSDP_DTYPE_F32)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "checkpoints hold fp32 parameters; "
                              "drop --dtype %s", fsdp_dtype_name(dt));
    bool found = false;
    uint64_t step = 0;
    FSDP_TRY(fsdp_ckpt_latest(dir, &step, &found));
    if (found || fsdp_ckpt_is_complete(dir))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "'%s' already holds a checkpoint; write "
                              "the converted one to a new or empty directory", dir);
    char other[256];
    if (foreign_entry(dir, other, sizeof other))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "'%s' exists and is not empty (it holds "
                              "'%s'); write the checkpoint to a new or empty directory", dir,
                              other);
    /* one writer at a time, as a training run (ckpt_dir.h) */
    fsdp_ckpt_lock lock;
    FSDP_TRY(fsdp_ckpt_dir_lock(&lock, dir));
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
    /* what a 1-device engine pads each unit to (engine/shardmap.h) */
    for (int u = 0; u < U; u++)
        padded[u] = (m->units[u].numel + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK * FSDP_NORM_BLOCK;
    man.version = FSDP_CKPT_VERSION;
    man.run_id = fsdp_ckpt_new_run_id();
    man.seed = 1337;
    man.world_size = 1;
    snprintf(man.shard, sizeof man.shard, "full");
    man.batch = 8;
    man.seq = m->max_seq_len < 64 ? m->max_seq_len : 64;
    man.grad_accum = 1;
    snprintf(man.compute_dtype, sizeof man.compute_dtype, "fp32");
    fsdp_ckpt_manifest_set_model(&man, m);
    FSDP_CHECK(fsdp_ckpt_manifest_set_units(&man, m, padded, padded));
    /* the tokenizer of the model's directory, or --tokenizer's, carried along */
    char tok[FSDP_CKPT_PATH_MAX + 32];
    struct stat sb;
    const char *tok_json = o->tokenizer;
    if (!tok_json && o->companions &&
        snprintf(tok, sizeof tok, "%s/" FSDP_CKPT_TOK_JSON, o->companions) < (int)sizeof tok &&
        stat(tok, &sb) == 0 && S_ISREG(sb.st_mode))
        tok_json = tok;
    if (tok_json)
        FSDP_CHECK(fsdp_ckpt_tok_load(&man, tok_json, o->companions));
    FSDP_CHECK(fsdp_ckpt_begin(dir, 0));
    char tmp[FSDP_CKPT_PATH_MAX], p[FSDP_CKPT_PATH_MAX + 16];
    FSDP_CHECK(fsdp_ckpt_step_path(tmp, sizeof tmp, dir, 0, ".tmp"));
    FSDP_CHECK(fsdp_ckpt_tok_write(tmp, &man));
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
    fsdp_ckpt_dir_unlock(&lock);
    fsdp_ckpt_manifest_free(&man);
    free(padded);
    free(zero);
    free(block);
    free(zeros);
    return st;
}

const fsdp_modelfile_format fsdp_format_ckpt = {
    /* .short_name = */ "ckpt",
    /* .name       = */ "checkpoint",
    /* .help       = */ "a checkpoint directory",
    /* .suffix     = */ NULL, /* a directory */
    /* .bf16       = */ false, /* the master parameters are fp32 */
    /* .ships_tokenizer = */ false,
    /* .note       = */ "step 0, 1 device",
    /* .claims     = */ ckpt_claims,
    /* .open       = */ ckpt_open,
    /* .bind       = */ ckpt_bind,
    /* .read_range = */ ckpt_read_range,
    /* .close      = */ ckpt_close,
    /* .write      = */ ckpt_write,
};
